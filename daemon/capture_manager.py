"""Capture lifecycle in the coordinator (orchestration): anomaly -> arming decision -> plan -> config write ->
acknowledgement -> watch prof_dir -> batch complete -> analysis -> alert. Every step is persisted in the state
store, so a coordinator restarted in the middle of a capture resumes tracking it and publishes its alert once.

States: ``planned`` -> ``written`` -> ``collecting`` -> ``analysing`` -> ``analysed`` | ``incomplete`` |
``failed`` (``refused`` for arms that could not be written).
Runs on the coordinator's main thread; file system work and analyses go to worker pools and come back through
``coordinator.results`` (a queue of callables).
"""

from __future__ import annotations

import itertools
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from daemon.adapters import control
from daemon.adapters.paths import PathRefused, check_inside
from daemon.core.arming import ArmingPolicy, ArmingSettings, JobArmState
from daemon.core.capture import CaptureRequest, JobProgress, plan_capture
from rankhook import wire

if TYPE_CHECKING:
    from daemon.coordinator import Coordinator
    from daemon.core.anomaly import Anomaly
    from daemon.core.registry import JobState

log = structlog.get_logger("profwatch.captures")

ACTIVE = ("planned", "written", "collecting", "analysing")
IN_FLIGHT = ("planned", "written", "collecting", "analysing")


class CaptureManager:
    """Owns capture tracking for one coordinator."""

    def __init__(self, coord: Coordinator) -> None:
        self.c = coord
        self.s = coord.settings
        self.policy = ArmingPolicy(self.s.arming)
        self.fs_pool = ThreadPoolExecutor(1, thread_name_prefix="profwatch-fs")
        self.analysis_pool = ThreadPoolExecutor(self.s.coordinator.analysis_workers, thread_name_prefix="profwatch-analysis")
        from daemon.adapters.msprof_runner import make_limiter

        self._limiter = make_limiter(self.s.analysis.msprof)
        self._writer: Any = None
        self._watcher: Any = None
        self._cmd_ids = itertools.count(1)
        self._pending_acks: dict[str, dict[str, Any]] = {}  # command_id -> {capture_id, node_id}
        self._scanning: set[str] = set()
        self._next_scan: dict[str, float] = {}
        self._refused_jobs: set[str] = set()
        self._acks: dict[str, dict[int, dict[str, Any]]] = {}  # capture_id -> rank -> {event: ts}
        from daemon.adapters.rank_dir_fs import RankDirReader

        self._reader = RankDirReader()  # reused across scans (DB checks are cached); used on the fs thread only

    # -- lifecycle ----------------------------------------------------------------------------------------------
    def start(self) -> None:
        from daemon.adapters.config_writer import ConfigWriter

        self._writer = ConfigWriter()
        try:
            from daemon.adapters.prof_watch import ProfWatcher

            self._watcher = ProfWatcher(self._on_wake, settings=self.s.watch)
            self._watcher.start()
        except Exception as exc:  # noqa: BLE001 - fall back to the periodic reconciliation scan alone
            log.warning("watcher_unavailable", error=repr(exc))
            self._watcher = None
        for cap in self.c.state.captures(states=ACTIVE):
            prof_dir = cap["plan"].get("prof_dir")
            log.info("capture_resumed", capture_id=cap["capture_id"], state=cap["state"], prof_dir=prof_dir)
            if cap["state"] == "analysing":  # interrupted mid-analysis: scan and analyse again
                self.c.state.upsert_capture(cap["capture_id"], cap["job_id"], "collecting", time.time())
            if prof_dir and self._watcher is not None:
                self._watch(prof_dir)

    def close(self) -> None:
        from daemon.adapters.msprof_runner import cancel_running, resume_runs

        if self._watcher is not None:
            self._watcher.close()
        # a running msprof-analyze is killed, not awaited: the capture stays "analysing" and is redone on restart
        cancel_running()
        try:
            self.fs_pool.shutdown(wait=True, cancel_futures=True)
            self.analysis_pool.shutdown(wait=True, cancel_futures=True)
        finally:
            resume_runs()

    def update_arming(self, settings: ArmingSettings) -> None:
        self.policy = ArmingPolicy(settings)

    def _watch(self, prof_dir: str) -> None:
        try:
            Path(prof_dir).mkdir(parents=True, exist_ok=True)
        except OSError:
            pass
        try:
            self._watcher.watch(prof_dir)
        except Exception as exc:  # noqa: BLE001
            log.warning("watch_failed", prof_dir=prof_dir, error=repr(exc))

    def _on_wake(self, path: str) -> None:
        """Called from the watcher thread: only schedules a scan on the main loop (events never decide)."""
        self.c.results.put(lambda: self._wake_main(path))

    def _wake_main(self, path: str) -> None:
        for cap in self.c.state.captures(states=("written", "collecting")):
            prof_dir = cap["plan"].get("prof_dir", "")
            if prof_dir and (path.startswith(prof_dir) or prof_dir.startswith(path)):
                self._schedule_scan(cap, time.time())

    # -- paths and jobs -----------------------------------------------------------------------------------------
    def on_hello(self, job: JobState, msg: wire.RankHello, now: float) -> None:
        """Check the paths a hello names; refuse and report anything outside the allowed roots."""
        cs = self.s.coordinator
        problems = []
        if msg.prof_root:
            try:
                check_inside(msg.prof_root, cs.allowed_prof_roots)
            except PathRefused as exc:
                problems.append(str(exc))
                job.prof_root = None
        if msg.profiler_config_path and cs.config_writer == "coordinator":
            try:
                check_inside(msg.profiler_config_path, cs.allowed_config_roots)
            except PathRefused as exc:
                problems.append(str(exc))
                job.profiler_config_path = None
        if problems and msg.job_id not in self._refused_jobs:
            self._refused_jobs.add(msg.job_id)
            self.c.emit("io.profwatch.path_refused.v1", msg.job_id,
                        {"rank": msg.rank, "hostname": msg.hostname, "problems": problems},
                        event_id=f"path_refused-{msg.job_id}-{int(now)}")

    def _job_arm_state(self, job_id: str, now: float) -> JobArmState:
        caps = self.c.state.captures(job_id)
        hour = [c for c in caps if c["created_unix_s"] >= now - 3600 and c["state"] != "refused"]
        return JobArmState(
            capture_in_flight=any(c["state"] in IN_FLIGHT for c in caps),
            last_arm_unix_s=max((c["created_unix_s"] for c in caps if c["state"] != "refused"), default=None),
            captures_last_hour=len(hour),
            bytes_last_hour=sum(int(c["detail"].get("total_bytes", 0)) for c in hour),
            stalled_ranks=det.stalled_ranks if (det := self.c.detectors.get(job_id)) is not None else frozenset(),
        )

    # -- arming -------------------------------------------------------------------------------------------------
    def on_anomaly(self, an: Anomaly, now: float) -> None:
        job = self.c.registry.jobs.get(an.job_id)
        if job is None:
            return
        decision = self.policy.decide(an, self._job_arm_state(an.job_id, now), now)
        data = {"anomaly": an.kind, "step": an.step, "action": decision.action, "reason": decision.reason}
        if decision.action != "arm":
            self.c.emit("io.profwatch.arm_decision.v1", an.job_id, data)
            return
        req = CaptureRequest(job_id=an.job_id, reason=decision.capture_reason or an.kind, warmup=decision.warmup,
                             active=decision.active, rank_list=decision.rank_list)
        try:
            plan = self.arm(job, req, now)
            data["capture_id"] = plan["capture_id"]
        except control.ControlError as exc:
            data["action"] = "suppress"
            data["reason"] = f"{exc.code}: {exc.message}"
        self.c.emit("io.profwatch.arm_decision.v1", an.job_id, data)

    def arm_from_control(self, args: dict[str, Any], now: float) -> dict[str, Any]:
        job_id = args.get("job_id")
        if not isinstance(job_id, str):
            raise control.ControlError("bad_request", "job_id (a string) is required")
        job = self.c.registry.jobs.get(job_id)
        if job is None:
            raise control.ControlError("not_found", f"unknown job {job_id!r} (no rank has said hello)")
        rank_list = args.get("rank_list")
        req = CaptureRequest(job_id=job.job_id, reason=str(args.get("reason") or "manual"), warmup=args.get("warmup"),
                             active=args.get("active"), rank_list=list(rank_list) if rank_list else None,
                             start_step=args.get("start_step"), in_steps=args.get("in_steps"))
        return self.arm(job, req, now, dry_run=bool(args.get("dry_run")))

    def arm(self, job: JobState, req: CaptureRequest, now: float, dry_run: bool = False) -> dict[str, Any]:
        """Plan and write one capture. Raises ``ControlError`` (``refused``/``conflict``) with the reason."""
        if not job.profiler_config_path:
            raise control.ControlError("refused", f"job {job.job_id} announced no usable profiler_config_path")
        if not job.prof_root:
            raise control.ControlError("refused", f"job {job.job_id} announced no usable prof_root")
        live = [r for r in job.ranks.values() if not r.left]
        if not live:
            raise control.ControlError("refused", f"job {job.job_id} has no live ranks (all {len(job.ranks)} left)")
        if len(live) < job.world_size:
            left = sorted(r.rank for r in job.ranks.values() if r.left)
            raise control.ControlError(
                "refused", f"only {len(live)}/{job.world_size} ranks are live"
                + (f" (left: {left})" if left else " (the others have not started yet)")
                + "; torch_npu ignores configs written before every rank started")
        if not dry_run and any(c["state"] in IN_FLIGHT for c in self.c.state.captures(job.job_id)):
            raise control.ControlError("conflict", "a capture of this job is in flight (torch_npu keeps one pending slot)")
        step_time = job.median_step_time_s() or 1.0
        progress = JobProgress(job_id=job.job_id, world_size=job.world_size, furthest_step=max(0, job.furthest_step()),
                               step_time_s=step_time, prof_root=job.prof_root, now_unix_s=now)
        try:
            plan = plan_capture(req, progress, self.s.capture)
        except ValueError as exc:
            raise control.ControlError("bad_request", str(exc)) from None
        config = plan.config.render()
        out = {
            "capture_id": plan.capture_id, "job_id": job.job_id, "reason": plan.reason, "start_step": plan.start_step,
            "warmup": plan.warmup, "active": plan.active, "rank_list": plan.rank_list, "prof_dir": str(plan.prof_dir),
            "profiler_config_path": job.profiler_config_path, "deadline_unix_s": plan.deadline_unix_s,
            "config": config, "writer": self.s.coordinator.config_writer, "dry_run": dry_run,
            "furthest_step": progress.furthest_step, "step_time_s": step_time, "world_size": job.world_size,
        }
        if dry_run:
            return out
        self.c.state.upsert_capture(plan.capture_id, job.job_id, "planned", now, reason=plan.reason, plan=out)
        self.c.metrics.captures.labels("planned").inc()
        det = self.c.detectors.get(job.job_id)
        if det is not None:
            det.exclude_steps(plan.start_step, plan.start_step + plan.warmup + plan.active - 1, f"capture {plan.capture_id}")
        if self.s.coordinator.config_writer == "coordinator":
            not_before = job.started_unix_s
            self.fs_pool.submit(self._write_shared, plan.capture_id, job.job_id, job.profiler_config_path, config,
                                not_before)
        else:
            nodes = sorted({r.node_id for r in job.ranks.values() if r.node_id})
            for node_id in nodes:
                cid = f"w-{plan.capture_id}-{next(self._cmd_ids)}"
                self._pending_acks[cid] = {"capture_id": plan.capture_id, "node_id": node_id, "job_id": job.job_id}
                self.c.send_node_command(node_id, wire.NodeCommand(
                    cmd="write_config", command_id=cid,
                    args={"profiler_config_path": job.profiler_config_path, "config": config,
                          "not_before_unix_s": job.started_unix_s}))
            out["nodes"] = nodes
        self._watch(str(plan.prof_dir)) if self._watcher is not None else None
        return out

    def _write_shared(self, capture_id: str, job_id: str, config_dir: str, config: dict[str, Any], not_before: float) -> None:
        """Worker thread: write the shared config, then report back to the main loop."""
        try:
            res = self._writer.write(config_dir, config, not_before_unix_s=not_before,
                                     allowed_roots=self.s.coordinator.allowed_config_roots)
            result = {"path": str(res.path), "mtime_s": res.mtime_s}
            self.c.results.put(lambda: self._on_written(capture_id, job_id, True, result))
        except Exception as exc:  # noqa: BLE001
            err = str(exc)
            self.c.results.put(lambda: self._on_written(capture_id, job_id, False, {"error": err}))

    def on_node_ack(self, ack: wire.NodeAck, now: float) -> None:
        pend = self._pending_acks.pop(ack.command_id, None)
        if pend is None:
            return
        detail = {f"node_{ack.node_id}": {"ok": ack.ok, "detail": ack.detail, **ack.result}}
        self.c.state.upsert_capture(pend["capture_id"], pend["job_id"], self.c.state.get_capture(pend["capture_id"])["state"],
                                    now, detail=detail)
        still = [p for p in self._pending_acks.values() if p["capture_id"] == pend["capture_id"]]
        if not ack.ok:
            self._on_written(pend["capture_id"], pend["job_id"], False, {"error": f"node {ack.node_id}: {ack.detail}"})
        elif not still:
            self._on_written(pend["capture_id"], pend["job_id"], True, {"nodes_acknowledged": True})

    def _on_written(self, capture_id: str, job_id: str, ok: bool, result: dict[str, Any]) -> None:
        now = time.time()
        cap = self.c.state.get_capture(capture_id)
        if cap is None or cap["state"] not in ("planned",):
            return
        if not ok:
            self.c.state.upsert_capture(capture_id, job_id, "refused", now, detail=result)
            self.c.metrics.captures.labels("refused").inc()
            self.c.emit("io.profwatch.arm.v1", job_id, {"capture_id": capture_id, "status": "failed", **result})
            return
        self.c.state.upsert_capture(capture_id, job_id, "written", now, detail={"written": result, "written_unix_s": now})
        self.c.metrics.captures.labels("written").inc()
        self.c.emit("io.profwatch.arm.v1", job_id, {"capture_id": capture_id, "status": "written", **cap["plan"], **result},
                    event_id=f"arm-{capture_id}")

    # -- acknowledgements and completion ------------------------------------------------------------------------
    def on_capture_event(self, ev: wire.CaptureEvent, node_id: str, now: float) -> None:
        # late events (a rank's "completed" after the scan already saw the batch) still count for the record
        caps = self.c.state.captures(ev.job_id, states=("written", "collecting", "analysing", "analysed"))
        cap = next((c for c in caps if ev.capture_id and c["capture_id"] == ev.capture_id), None)
        if cap is None:
            cap = next((c for c in caps if ev.start_step is not None and c["plan"].get("start_step") == ev.start_step), None)
        if cap is None and caps and ev.event in ("started", "completed"):
            cap = caps[-1]
        if cap is None:
            return
        acks = self._acks.setdefault(cap["capture_id"], {}).setdefault(ev.rank, {})
        acks[ev.event] = now
        total = cap["detail"].get("total_bytes", 0) + (ev.total_bytes or 0 if ev.event == "completed" else 0)
        state = "collecting" if cap["state"] == "written" and ev.event in ("started", "completed") else cap["state"]
        self.c.state.upsert_capture(cap["capture_id"], ev.job_id, state, now, detail={"total_bytes": total})
        if ev.event == "arm_rejected":
            self.c.emit("io.profwatch.capture.v1", ev.job_id, {"capture_id": cap["capture_id"], "rank": ev.rank,
                                                               "event": ev.event, "detail": ev.detail})
        expected = set(cap["plan"].get("rank_list") or range(cap["plan"].get("world_size", 0)))
        done = {r for r, a in self._acks[cap["capture_id"]].items() if "completed" in a}
        if ev.event == "completed" and state in ("written", "collecting"):
            self._schedule_scan(cap, now)
        if ev.event == "arm_seen" or ev.event == "started":
            seen = {r for r, a in self._acks[cap["capture_id"]].items() if a}
            if expected and seen >= expected and not cap["detail"].get("acknowledged"):
                self.c.state.upsert_capture(cap["capture_id"], ev.job_id, state, now, detail={"acknowledged": now})
                self.c.emit("io.profwatch.capture.v1", ev.job_id, {"capture_id": cap["capture_id"], "event": "acknowledged",
                                                                   "ranks": sorted(seen)})
        if expected and done >= expected:
            self.c.emit("io.profwatch.capture.v1", ev.job_id, {"capture_id": cap["capture_id"], "event": "all_ranks_completed"},
                        event_id=f"captured-{cap['capture_id']}")

    def tick(self, now: float) -> None:
        for cap in self.c.state.captures(states=("written", "collecting")):
            self._check_acks(cap, now)
            if now >= self._next_scan.get(cap["capture_id"], 0.0):
                self._schedule_scan(cap, now)
            deadline = cap["plan"].get("deadline_unix_s")
            if deadline and now > deadline + self._parse_allowance(cap) and cap["capture_id"] not in self._scanning:
                self._schedule_scan(cap, now, final=True)

    def _check_acks(self, cap: dict[str, Any], now: float) -> None:
        """Report, once, the expected ranks that did not acknowledge the arm within ``ack_timeout_s`` (FC-08)."""
        d = cap["detail"]
        written = d.get("written_unix_s")
        if not written or d.get("acknowledged") or d.get("ack_missing_reported"):
            return
        if now < written + self.s.coordinator.ack_timeout_s:
            return
        expected = set(cap["plan"].get("rank_list") or range(cap["plan"].get("world_size", 0)))
        seen = {r for r, a in self._acks.get(cap["capture_id"], {}).items() if a}
        missing = sorted(expected - seen)
        self.c.state.upsert_capture(cap["capture_id"], cap["job_id"], cap["state"], now,
                                    detail={"ack_missing_reported": now, "ack_missing": missing})
        if missing:
            self.c.emit("io.profwatch.capture.v1", cap["job_id"],
                        {"capture_id": cap["capture_id"], "event": "ack_missing", "ranks": missing,
                         "detail": "these ranks did not confirm the arm (no hook event, no dp log line); another "
                                   "process may own the node's dynamic_profile monitor (FC-08) or they stopped"},
                        event_id=f"ack_missing-{cap['capture_id']}")

    def _parse_allowance(self, cap: dict[str, Any]) -> float:
        return float(self.s.watch.parse_allowance_s)

    def _schedule_scan(self, cap: dict[str, Any], now: float, final: bool = False) -> None:
        cid = cap["capture_id"]
        if cid in self._scanning:
            return
        self._scanning.add(cid)
        self._next_scan[cid] = now + float(self.s.watch.reconcile_interval_s)
        self.fs_pool.submit(self._scan, cap, final)

    def _scan(self, cap: dict[str, Any], final: bool) -> None:
        from daemon.adapters.rank_dir_fs import scan_tree
        from daemon.core.completeness import CaptureHint

        cid = cap["capture_id"]
        try:
            plan = cap["plan"]
            hint = CaptureHint(world_size=plan.get("world_size"),
                               rank_list=tuple(plan["rank_list"]) if plan.get("rank_list") else None,
                               steps=int(plan.get("warmup", 0)) + int(plan.get("active", 0)),
                               step_time_s=plan.get("step_time_s"), armed_unix_s=cap["created_unix_s"],
                               deadline_unix_s=plan.get("deadline_unix_s"))
            batches = scan_tree(Path(plan["prof_dir"]), world_size=plan.get("world_size"), settings=self.s.watch,
                                hints={cid: hint}, reader=self._reader)
            self.c.results.put(lambda: self._on_scan(cap, batches, final))
        except Exception as exc:  # noqa: BLE001
            err = repr(exc)
            self.c.results.put(lambda: self._on_scan_error(cap, err))

    def _on_scan_error(self, cap: dict[str, Any], err: str) -> None:
        self._scanning.discard(cap["capture_id"])
        log.warning("scan_failed", capture_id=cap["capture_id"], error=err)

    def _on_scan(self, cap: dict[str, Any], batches: list[Any], final: bool) -> None:
        cid = cap["capture_id"]
        self._scanning.discard(cid)
        now = time.time()
        cur = self.c.state.get_capture(cid)
        if cur is None or cur["state"] not in ("written", "collecting"):
            return
        # The prof_dir is this capture's own folder: batches stamped with our capture id first; unstamped rank dirs
        # there (e.g. an older torch_npu without metadata) are ours too; a batch stamped with another id is not.
        mine = [b for b in batches if b.capture_id == cid] or [b for b in batches if b.capture_id is None]
        batch = next((b for b in mine if b.status == "complete"), mine[0] if mine else None)
        if batch is not None and batch.status == "complete":
            self.c.state.upsert_capture(cid, cap["job_id"], "analysing", now, detail={"batch_id": batch.batch_id})
            self.c.state.save_batch(batch.batch_id, cid, cap["job_id"], "complete", now, batch.to_json())
            self.c.emit("io.profwatch.batch.v1", cap["job_id"], {"capture_id": cid, "batch": batch.to_json(),
                                                                 "event": "batch_complete"},
                        event_id=f"batch_complete-{cid}")
            self.analysis_pool.submit(self._analyse, cur, batch)
            return
        deadline = cap["plan"].get("deadline_unix_s") or 0
        if final or (deadline and now > deadline + self._parse_allowance(cap)):
            data = {"capture_id": cid, "reason": cap["reason"], "prof_dir": cap["plan"].get("prof_dir"),
                    "batch": batch.to_json() if batch is not None else None,
                    "missing_ranks": list(batch.missing_ranks) if batch is not None else
                    list(cap["plan"].get("rank_list") or range(cap["plan"].get("world_size", 0))),
                    "problems": [p.to_json() for p in batch.problems] if batch is not None else
                    [{"rank": None, "path": cap["plan"].get("prof_dir"), "reason": "no rank dir appeared"}],
                    "note": "data kept; nothing deleted"}
            self.c.state.upsert_capture(cid, cap["job_id"], "incomplete", now, detail={"incomplete": data["problems"]})
            self.c.metrics.captures.labels("incomplete").inc()
            self.c.emit("io.profwatch.batch_incomplete.v1", cap["job_id"], data, event_id=f"batch_incomplete-{cid}")
            self._unwatch(cap)

    def _unwatch(self, cap: dict[str, Any]) -> None:
        if self._watcher is not None and cap["plan"].get("prof_dir"):
            try:
                self._watcher.unwatch(cap["plan"]["prof_dir"])
            except Exception:  # noqa: BLE001
                pass

    def _analyse(self, cap: dict[str, Any], batch: Any) -> None:
        from daemon.analysis import analyze_batch

        cid = cap["capture_id"]
        t0 = time.time()
        job = self.c.registry.jobs.get(cap["job_id"])
        hostnames = {r.rank: r.hostname for r in job.ranks.values()} if job else {}
        try:
            work = Path(self.s.coordinator.work_dir) / cap["job_id"] / cid
            result = analyze_batch(batch, work_dir=work, settings=self.s.analysis, hostnames=hostnames or None,
                                   capture_reason=cap["reason"], job_id=cap["job_id"], limiter=self._limiter)
            res_json = result.to_json()
            self.c.results.put(lambda: self._on_analysed(cap, batch, res_json, time.time() - t0))
        except Exception as exc:  # noqa: BLE001 - a failing analysis is an alert, never a crash
            err = repr(exc)
            log.exception("analysis_failed", capture_id=cid)
            self.c.results.put(lambda: self._on_analysis_failed(cap, batch, err))

    def _on_analysed(self, cap: dict[str, Any], batch: Any, res: dict[str, Any], duration_s: float) -> None:
        now = time.time()
        cid = cap["capture_id"]
        self.c.state.save_batch(batch.batch_id, cid, cap["job_id"], "analysed", now, res)
        plan = cap["plan"]
        armed = list(range(int(plan.get("start_step", 0)) + int(plan.get("warmup", 0)),
                           int(plan.get("start_step", 0)) + int(plan.get("warmup", 0)) + int(plan.get("active", 0))))
        captured = list(getattr(batch, "steps", []) or [])
        data = {"batch_id": batch.batch_id, "capture_id": cid, "capture_reason": cap["reason"],
                "analysis_duration_s": round(duration_s, 3), "armed_steps": armed, "captured_steps": captured, **res}
        if captured and armed and not set(captured) & set(armed):
            # step counters are per process (restarts, set_step): say so rather than silently trusting the data
            data.setdefault("notes", [])
            data["notes"] = [*data["notes"], f"captured steps {captured} are not the armed window {armed}: "
                                             "a rank restarted its step counter, or the dirs are not this capture's"]
        self.c.emit("io.profwatch.suspect_ranks.v1", cap["job_id"], data, event_id=f"suspects-{cid}")
        self.c.state.upsert_capture(cid, cap["job_id"], "analysed", now, detail={"analysis_status": res.get("status")})
        self.c.metrics.captures.labels("analysed").inc()
        self._unwatch(cap)
        w = self.s.watch
        if w.retention_max_bytes is not None or w.retention_max_age_s is not None:
            analysed = [c for c in self.c.state.captures(states=("analysed",))]
            self.fs_pool.submit(self._retention, analysed)

    def _retention(self, analysed: list[dict[str, Any]]) -> None:
        """Worker thread: apply the byte/age cap to analysed batches only (never to anything not yet analysed)."""
        from daemon.adapters.rank_dir_fs import TreeUnavailable, scan_tree
        from daemon.adapters.retention import enforce_retention

        batches, ids = [], set()
        for cap in analysed:
            bid = cap["detail"].get("batch_id")
            prof_dir = cap["plan"].get("prof_dir")
            if not bid or not prof_dir:
                continue
            try:
                found = scan_tree(Path(prof_dir), world_size=cap["plan"].get("world_size"), settings=self.s.watch,
                                  reader=self._reader)
            except (TreeUnavailable, OSError):
                continue  # unknown is not deleted, and not deletable either
            for b in found:
                if b.batch_id == bid:
                    batches.append(b)
                    ids.add(bid)
        removed = enforce_retention(batches, analysed=ids, max_bytes=self.s.watch.retention_max_bytes,
                                    max_age_s=self.s.watch.retention_max_age_s, now_unix_s=time.time())
        if removed:
            done = [asdict(r) if hasattr(r, "__dataclass_fields__") else str(r) for r in removed]
            self.c.results.put(lambda: self._on_retired(done))

    def _on_retired(self, removed: list[Any]) -> None:
        for r in removed:
            log.info("batch_retired", batch=r)

    def _on_analysis_failed(self, cap: dict[str, Any], batch: Any, err: str) -> None:
        now = time.time()
        cid = cap["capture_id"]
        self.c.state.upsert_capture(cid, cap["job_id"], "failed", now, detail={"error": err})
        self.c.emit("io.profwatch.analysis_failed.v1", cap["job_id"],
                    {"capture_id": cid, "batch_id": batch.batch_id, "error": err, "note": "data kept"},
                    event_id=f"analysis_failed-{cid}")

    def summary(self, job_id: str | None) -> list[dict[str, Any]]:
        return [{"capture_id": c["capture_id"], "job_id": c["job_id"], "state": c["state"], "reason": c["reason"],
                 "start_step": c["plan"].get("start_step"), "prof_dir": c["plan"].get("prof_dir")}
                for c in self.c.state.captures(job_id)[-20:]]
