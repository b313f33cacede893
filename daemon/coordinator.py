"""Coordinator daemon (composition root): telemetry ingest, registry, detection, arming, capture tracking,
control socket, event/alert stream and state store.

Sockets: ingest ROUTER (node DEALERs connect), control ROUTER (CLI REQ clients), PUB (subscribers).
One thread owns the sockets and the SQLite connection (the main loop). File system work (config writes on shared
storage, rank-dir scans) and analyses run on worker threads and hand results back through a queue (FC-15).
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import structlog
import zmq

from daemon.adapters import control
from daemon.adapters.alert_sinks import AlertSinks
from daemon.adapters.metrics import DaemonMetrics
from daemon.adapters.publish import EventPublisher
from daemon.adapters.sd_notify import SdNotifier
from daemon.adapters.state import StateStore
from daemon.capture_manager import CaptureManager
from daemon.config import Settings
from daemon.core.alerts import TYPE_JOB_ENDED, make_cloudevent
from daemon.core.anomaly import Anomaly, JobDetector
from daemon.core.job_end import JobEndTracker
from daemon.core.messages import MessageRejected, parse_node_message
from daemon.core.registry import Registry, RegistryError
from daemon.logsetup import OncePerKind
from rankhook import wire

log = structlog.get_logger("profwatch.coordinator")

ALERT_TYPES = {
    "io.profwatch.suspect_ranks.v1",
    "io.profwatch.batch_incomplete.v1",
    "io.profwatch.analysis_failed.v1",
    "io.profwatch.path_refused.v1",
}


class Coordinator:
    """The coordinator. ``run()`` blocks until ``stop()``; everything persistent is in ``settings.coordinator.state_db``.

    Raises:
        zmq.ZMQError: an endpoint cannot be bound (address in use).
        sqlite3.DatabaseError: the state database is not usable.
        SinkConfigError: an alert sink's Authorization or TLS file is unusable.
    """

    def __init__(self, settings: Settings, metrics: DaemonMetrics | None = None,
                 notifier: SdNotifier | None = None) -> None:
        self.settings = settings
        cs = settings.coordinator
        self.metrics = metrics or DaemonMetrics("coordinator")
        self.notifier = notifier or SdNotifier({})
        self._stop = threading.Event()
        # alert sinks: every emitted event goes to them; standing Alertmanager alerts are rebuilt from the store
        self.sinks = AlertSinks.from_settings(settings.alertmanager, settings.webhook, os.environ, self.metrics)
        try:
            self.state = StateStore(cs.state_db)
            self.sinks.restore(self.state.iter_events(self.sinks.restore_types))
        except Exception:
            self.sinks.close()
            raise
        self._job_end = JobEndTracker(cs.job_end_after_s)
        self._next_observe = 0.0
        self._ctx = zmq.Context()
        self.registry = Registry(window_steps=cs.window_steps)
        self.detectors: dict[str, JobDetector] = {}
        self._known_nodes: set[str] = set()  # nodes seen since this process started (others must re-register)
        self._once = OncePerKind()
        self.counters = {"received": 0, "rejected": 0, "batches": 0, "lost_batches": 0, "events": 0}
        self.results: queue.Queue[Callable[[], None]] = queue.Queue()
        self._restore_registry()
        self.ingest = self._ctx.socket(zmq.ROUTER)
        self.ingest.setsockopt(zmq.LINGER, 0)
        self.ingest.setsockopt(zmq.MAXMSGSIZE, wire.MAX_BATCH_BYTES)
        self.ingest.setsockopt(zmq.RCVHWM, 200)  # batches (up to 1000 reports each): bounds queued memory
        # a restarted node daemon reconnects with the same identity before the old connection is torn down:
        # hand the identity over to it instead of ignoring the new peer (FC-21)
        self.ingest.setsockopt(zmq.ROUTER_HANDOVER, 1)
        self.ingest.bind(cs.ingest_bind)
        self.control_sock = control.bind_control(self._ctx, cs.control_bind)
        self.pub = EventPublisher(self._ctx, cs.pub_bind)
        self.captures = CaptureManager(self)
        log.info("coordinator_started", ingest=cs.ingest_bind, control=cs.control_bind, pub=cs.pub_bind,
                 state_db=str(cs.state_db), jobs=len(self.registry.jobs))

    # -- persistence --------------------------------------------------------------------------------------------
    def _restore_registry(self) -> None:
        from daemon.core.registry import JobState, RankState
        from daemon.core.step_window import StepWindow

        jobs, ranks, _nodes = self.state.load_registry()
        import json

        for j in jobs:
            self.registry.jobs[j["job_id"]] = JobState(
                job_id=j["job_id"], world_size=j["world_size"], profiler_config_path=j["profiler_config_path"],
                prof_root=j["prof_root"], backend=j["backend"] or "", first_seen_unix_s=j["first_seen_unix_s"] or 0.0,
                started_unix_s=j["started_unix_s"] or 0.0, versions=json.loads(j["versions"] or "{}"),
            )
        for r in ranks:
            job = self.registry.jobs.get(r["job_id"])
            if job is None:
                continue
            job.ranks[r["rank"]] = RankState(
                rank=r["rank"], hostname=r["hostname"] or "", node_id=r["node_id"] or "", pid=r["pid"] or 0,
                local_rank=r["local_rank"] if r["local_rank"] is not None else -1, backend=r["backend"] or "",
                last_step=r["last_step"] if r["last_step"] is not None else -1,
                last_step_time_s=r["last_step_time_s"] or 0.0, seen_unix_s=r["seen_unix_s"] or 0.0,
                left=bool(r["left"]), window=StepWindow(self.registry.window_steps),
            )

    def _flush_registry(self) -> None:
        import json

        jobs, ranks, nodes = [], [], []
        for job in self.registry.jobs.values():
            jobs.append({
                "job_id": job.job_id, "world_size": job.world_size, "backend": job.backend,
                "profiler_config_path": job.profiler_config_path, "prof_root": job.prof_root,
                "first_seen_unix_s": job.first_seen_unix_s, "started_unix_s": job.started_unix_s,
                "versions": json.dumps(job.versions),
            })
            for r in job.ranks.values():
                ranks.append((job.job_id, r.rank, r.hostname, r.node_id, r.pid, r.local_rank, r.backend, r.last_step,
                              r.last_step_time_s, r.seen_unix_s, int(r.left)))
        for n in self.registry.nodes.values():
            nodes.append((n.node_id, n.hostname, n.pid, n.last_seen_unix_s, json.dumps(n.counters)))
        self.state.save_registry(jobs, ranks, nodes)

    # -- events -------------------------------------------------------------------------------------------------
    def emit(self, type_: str, job_id: str | None, data: dict[str, Any], event_id: str | None = None) -> dict[str, Any] | None:
        """Store and publish one CloudEvent; alerts are deduplicated by ``event_id``. Returns the event or None
        when it was a duplicate."""
        ev = make_cloudevent(type_, job_id or "_", data, source=self.settings.coordinator.event_source,
                             now_unix_s=time.time(), event_id=event_id)
        is_alert = type_ in ALERT_TYPES
        if not self.state.add_event(ev, is_alert):
            return None
        self.pub.publish(ev, is_alert)
        self.metrics.observe_event(ev)
        self.counters["events"] += 1
        self.sinks.submit(ev, is_alert, time.time())
        log.info("event_published", type=type_, job_id=job_id, event_id=ev["id"])
        return ev

    # -- main loop ----------------------------------------------------------------------------------------------
    def stop(self) -> None:
        self._stop.set()

    def run(self) -> None:
        """Serve until stopped; always closes sockets, workers and the state store."""
        cs = self.settings.coordinator
        poller = zmq.Poller()
        poller.register(self.ingest, zmq.POLLIN)
        poller.register(self.control_sock, zmq.POLLIN)
        next_tick = next_flush = 0.0
        self.captures.start()
        self.notifier.ready("serving")
        try:
            while not self._stop.is_set():
                self.notifier.watchdog(time.monotonic())  # only while this loop turns (systemd WatchdogSec)
                events = dict(poller.poll(int(cs.tick_interval_s * 1000 / 2)))
                if self.ingest in events:
                    self._drain_ingest()
                if self.control_sock in events:
                    self._drain_control()
                self._drain_results()
                now = time.time()
                if now >= next_tick:
                    next_tick = now + cs.tick_interval_s
                    self._tick(now)
                if now >= next_flush:
                    next_flush = now + cs.registry_flush_s
                    try:
                        self._flush_registry()
                    except Exception as exc:  # noqa: BLE001 - a failed flush is retried at the next period
                        if self._once.first(f"flush:{type(exc).__name__}"):
                            log.exception("registry_flush_failed", error=repr(exc))
        finally:
            self.close()

    def _drain_results(self) -> None:
        while True:
            try:
                fn = self.results.get_nowait()
            except queue.Empty:
                return
            try:
                fn()
            except Exception as exc:  # noqa: BLE001 - a failing handler must not kill the loop
                log.exception("result_handler_failed", error=repr(exc))

    def _tick(self, now: float) -> None:
        self.metrics.queue_depth.labels("results").set(self.results.qsize())
        try:
            for det in list(self.detectors.values()):
                for an in det.tick(now):
                    self._on_anomaly(an, now)
            self.captures.tick(now)
            self._tick_jobs_and_sinks(now)
        except Exception as exc:  # noqa: BLE001
            if self._once.first(f"tick:{type(exc).__name__}"):
                log.exception("tick_failed", error=repr(exc))

    def _tick_jobs_and_sinks(self, now: float) -> None:
        """Job ends (no rank reported for ``job_end_after_s``: ``job_ended`` event), alert re-sends, gauges."""
        cs = self.settings.coordinator
        self.sinks.tick(now)
        if now >= self._next_observe:  # once a second: O(ranks)
            self._next_observe = now + 1.0
            last = {j.job_id: max((r.seen_unix_s for r in j.ranks.values()), default=0.0)
                    for j in self.registry.jobs.values()}
            for end in self._job_end.check(last, now):
                self.emit(TYPE_JOB_ENDED, end.job_id, end.to_json(), event_id=end.event_id())
            snap = self.registry.snapshot(now, cs.node_timeout_s)
            active = {j for j, t in last.items() if now - t < cs.job_end_after_s}
            self.metrics.observe_state(snap["jobs"], snap["nodes"], active, self.state.capture_state_summary(), now)

    def _reject(self, exc: MessageRejected | RegistryError, node_id: str = "") -> None:
        self.counters["rejected"] += 1
        self.metrics.rejected.labels(exc.reason).inc()
        if self._once.first(exc.reason):
            log.warning("message_rejected", reason=exc.reason, detail=str(exc), node_id=node_id,
                        note="logged once per reason; see profwatch_rejected_total")

    def _drain_ingest(self) -> None:
        # at most 100 batches (~100k reports) per pass, so control requests and SIGTERM are never starved
        for _ in range(100):
            try:
                frames = self.ingest.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if len(frames) != 2:
                self._reject(MessageRejected("bad_framing", f"{len(frames)} frames"))
                continue
            ident, data = frames
            node_id = ident.decode(errors="replace")
            try:
                env, msgs, bad = parse_node_message(data)
            except MessageRejected as exc:
                self._reject(exc, node_id)
                continue
            except Exception as exc:  # noqa: BLE001 - whatever a peer sends, the loop keeps serving
                self._reject(MessageRejected("bad_message", repr(exc)[:200]), node_id)
                continue
            for b in bad:
                self._reject(b, node_id)
            now = time.time()
            if env.node_id != node_id:
                self._reject(MessageRejected("bad_node_id", f"{env.node_id!r} sent by {node_id!r}"), node_id)
                continue
            if node_id not in self._known_nodes:
                self._known_nodes.add(node_id)
                if env.kind != "node_batch" or not any(m.kind == "hello" for m in msgs):
                    self._send_node(ident, wire.NodeCommand(cmd="register", command_id=f"reg-{int(now)}"))
            if env.kind == "node_heartbeat":
                self.registry.heartbeat(env, now)
            elif env.kind == "node_ack":
                self.captures.on_node_ack(env, now)
            elif env.kind == "node_batch":
                node, _new = self.registry.touch_node(env.node_id, env.hostname, now)
                lost = self.registry.note_batch_seq(node, env.seq)
                if lost:
                    self.counters["lost_batches"] += lost
                self.counters["batches"] += 1
                self._ingest_messages(msgs, node_id, now)

    def _ingest_messages(self, msgs: list[Any], node_id: str, now: float) -> None:
        reg = self.registry
        self.counters["received"] += len(msgs)
        self.metrics.messages_in.labels("rank_message").inc(len(msgs))
        detectors = self.detectors
        for m in msgs:
            kind = m.kind
            try:
                if kind == "step":
                    job, _rank, _restarted = reg.step(m, now)
                    if job is None:
                        self._reject(MessageRejected("unknown_job", f"step for job {m.job_id} before any hello"), node_id)
                        continue
                    det = detectors.get(m.job_id) or self._detector_for(job.job_id, job.world_size)
                    anomalies = det.observe(m)
                    if anomalies:
                        for an in anomalies:
                            self._on_anomaly(an, now)
                elif kind == "hello":
                    known = m.job_id in reg.jobs
                    job = reg.hello(m, node_id, now)
                    if not known:
                        log.info("job_registered", job_id=m.job_id, world_size=m.world_size, backend=m.backend)
                    self.captures.on_hello(job, m, now)
                    if m.job_id not in self.detectors:
                        self._detector_for(job.job_id, job.world_size)
                elif kind == "capture":
                    self.captures.on_capture_event(m, node_id, now)
                elif kind == "bye":
                    reg.bye(m, now)
                    left_det = self.detectors.get(m.job_id)
                    if left_det is not None:
                        left_det.mark_left(m.rank)
            except RegistryError as exc:
                self._reject(exc, node_id)
            except Exception as exc:  # noqa: BLE001 - one bad handler run must not stop ingest for everyone
                self.counters["internal_errors"] = self.counters.get("internal_errors", 0) + 1
                if self._once.first(f"internal:{kind}:{type(exc).__name__}"):
                    log.exception("message_handler_failed", kind=kind, job_id=getattr(m, "job_id", None))

    def _detector_for(self, job_id: str, world_size: int) -> JobDetector:
        det = JobDetector(job_id, world_size, self.settings.detection)
        self.detectors[job_id] = det
        return det

    def _on_anomaly(self, an: Anomaly, now: float) -> None:
        data = {"kind": an.kind, "step": an.step, "ranks": list(an.ranks), "magnitude": an.magnitude, "detail": an.detail}
        self.emit("io.profwatch.anomaly.v1", an.job_id, data)
        self.captures.on_anomaly(an, now)

    def _send_node(self, ident: bytes, cmd: wire.NodeCommand) -> None:
        try:
            self.ingest.send_multipart([ident, wire.encode(cmd)], zmq.NOBLOCK)
        except zmq.ZMQError as exc:
            log.warning("node_command_failed", node_id=ident.decode(errors="replace"), error=str(exc))

    def send_node_command(self, node_id: str, cmd: wire.NodeCommand) -> None:
        """Send a command to one node daemon (by its identity)."""
        self._send_node(node_id.encode(), cmd)

    # -- control ------------------------------------------------------------------------------------------------
    def _drain_control(self) -> None:
        for _ in range(100):
            try:
                envelope, req = control.recv_request(self.control_sock)
            except zmq.Again:
                return
            except Exception as exc:  # noqa: BLE001 - a malformed request never stops the coordinator
                self._reject(MessageRejected("bad_control_request", repr(exc)[:200]))
                continue
            if isinstance(req, control.ControlError):
                control.send_reply(self.control_sock, envelope, error=req)
                continue
            handler = getattr(self, f"_cmd_{req['cmd']}", None)
            if handler is None:
                control.send_reply(self.control_sock, envelope,
                                   error=control.ControlError("unknown_command", f"unknown command {req['cmd']!r}"))
                continue
            try:
                result = handler(**req.get("args", {}))
                control.send_reply(self.control_sock, envelope, result=result)
            except control.ControlError as exc:
                control.send_reply(self.control_sock, envelope, error=exc)
            except (TypeError, ValueError, OverflowError) as exc:
                control.send_reply(self.control_sock, envelope, error=control.ControlError("bad_request", str(exc)))
            except Exception as exc:  # noqa: BLE001
                log.exception("control_command_failed", cmd=req["cmd"])
                control.send_reply(self.control_sock, envelope, error=control.ControlError("internal", repr(exc)))

    def _cmd_ping(self) -> dict[str, Any]:
        return {"pong": True, "ts_unix_s": time.time()}

    @staticmethod
    def _job_arg(job_id: Any) -> str | None:
        if job_id is not None and not isinstance(job_id, str):
            raise control.ControlError("bad_request", f"job_id must be a string, got {type(job_id).__name__}")
        return job_id

    def _cmd_status(self, job_id: str | None = None) -> dict[str, Any]:
        job_id = self._job_arg(job_id)
        snap = self.registry.snapshot(time.time(), self.settings.coordinator.node_timeout_s)
        if job_id is not None:
            snap["jobs"] = [j for j in snap["jobs"] if j["job_id"] == job_id]
        snap["counters"] = dict(self.counters)
        snap["captures"] = self.captures.summary(job_id)
        return snap

    def _cmd_events(self, job_id: str | None = None, since_seq: int = 0, limit: int = 100,
                    alerts_only: bool = True) -> list[dict[str, Any]]:
        job_id = self._job_arg(job_id)
        since, lim = int(since_seq), int(limit)
        if not (0 <= since < 2**62 and 1 <= lim <= 10_000):
            raise control.ControlError("bad_request", "since_seq must be in [0, 2**62) and limit in [1, 10000]")
        return [{"seq": s, "event": e} for s, e in
                self.state.events(job_id=job_id, alerts_only=bool(alerts_only), since_seq=since, limit=lim)]

    def _cmd_arm(self, **args: Any) -> dict[str, Any]:
        return self.captures.arm_from_control(args, time.time())

    def _cmd_captures(self, job_id: str | None = None) -> list[dict[str, Any]]:
        return self.state.captures(self._job_arg(job_id))

    def _cmd_set_thresholds(self, detection: dict[str, Any] | None = None, arming: dict[str, Any] | None = None) -> dict[str, Any]:
        """Runtime tuning without restart: merge into the current settings, validate, apply to every detector."""
        from pydantic import ValidationError

        try:
            if detection:
                new_det = self.settings.detection.model_validate(self.settings.detection.model_dump() | detection)
                self.settings.detection = new_det
                for det in self.detectors.values():
                    det.update_settings(new_det)
            if arming:
                new_arm = self.settings.arming.model_validate(self.settings.arming.model_dump() | arming)
                self.settings.arming = new_arm
                self.captures.update_arming(new_arm)
        except ValidationError as exc:
            raise control.ControlError("bad_request", str(exc)) from None
        return {"detection": self.settings.detection.model_dump(), "arming": self.settings.arming.model_dump()}

    def _cmd_dump_telemetry(self, job_id: str) -> str:
        """The job's step windows as ``profwatch replay`` JSONL. Windows keep no timestamps (8 bytes per step):
        each step's ``ts_unix_s`` is rebuilt backwards from the rank's last report time and the step times after it."""
        from daemon.commands.replay import dump_jsonl

        job = self.registry.jobs.get(self._job_arg(job_id) or "")
        if job is None:
            raise control.ControlError("not_found", f"unknown job {job_id!r}")
        rows = []
        for r in job.ranks.values():
            if r.window is None:
                continue
            ts = r.last_ts_unix_s
            items = r.window.items()
            for step, t in reversed(items):
                rows.append({"job_id": job_id, "rank": r.rank, "step": step, "step_time_s": round(float(t), 6),
                             "ts_unix_s": round(ts, 6)})
                ts -= float(t)
        rows.sort(key=lambda d: (d["step"], d["rank"]))
        return dump_jsonl(rows, world_size=job.world_size)

    # -- shutdown -----------------------------------------------------------------------------------------------
    def close(self) -> None:
        if self._ctx.closed:
            return
        self._stop.set()
        self.notifier.stopping()
        try:
            self.captures.close()
            self.sinks.close()
        finally:
            try:
                self._flush_registry()
            except Exception as exc:  # noqa: BLE001
                log.warning("registry_flush_failed", error=repr(exc))
            self.state.close()
            self.ingest.close(0)
            self.control_sock.close(0)
            self.pub.close()
            self._ctx.term()
            log.info("coordinator_stopped", **self.counters)
