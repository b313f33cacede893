"""The coordinator's control commands (built by the composition root ``daemon/profwatch/coordinator.py``): the
``profwatch`` CLI's requests on the control socket, each checked against its role (``daemon/profwatch/core/access.py``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import structlog
import zmq

from profwatch.adapters.clock import SteadyClock
from profwatch.adapters.zmq import control
from profwatch.arming.port import arm_reply
from profwatch.core.access import AccessDenied, authorize
from profwatch.core.capture.planner import CaptureRequest, manual_default_active
from profwatch.core.capture.report import describe
from profwatch.core.fleet.telemetry import dump_jsonl, window_records
from profwatch.core.messages import MessageRejected

if TYPE_CHECKING:
    from profwatch.adapters.store.state import StateStore
    from profwatch.adapters.zmq.server_sockets import ServerSockets
    from profwatch.captures.shell import CaptureShell
    from profwatch.config import Settings
    from profwatch.core.detection.job_detector import JobDetector
    from profwatch.core.fleet.registry import Registry, RegistryError

log = structlog.get_logger("profwatch.coordinator")


class ControlCommands:
    """Serves the control socket: :meth:`drain` answers the waiting requests, one ``_cmd_<name>`` per command.

    A request is ``{"cmd": <name>, "args": {...}}`` (``daemon/profwatch/adapters/zmq/control.py``); the reply is
    ``{"ok": true, "result": <the command's reply>}`` or ``{"ok": false, "error": {"code", "message"}}``. Every
    command's docstring gives its ``Args`` (the keys of ``args``, all optional unless said) and its ``Reply`` (the
    ``result``); codes common to all: ``bad_request`` (wrong type or range), ``denied`` (the connection's key was
    revoked or lacks the command's role, ``core/access.py``), ``unknown_command``, ``internal``.

    Args:
        sockets: the coordinator's sockets (its control ROUTER, used only from the main loop, and the roles a
            request's frame carries: ``ServerSockets.grants``, by CURVE key or loopback).
        settings: the configuration tree (``set_thresholds`` replaces its detection and arming sections).
        registry, captures, state, detectors: what the commands read or act on (the coordinator's own objects).
        counters: the coordinator's message counters (shown by ``status``).
        bounds: the coordinator's current sizes and memory bound for ``status`` (jobs, ranks, nodes,
            detector_ranks, state_bound_mib).
        reject, refuse_peer: count a malformed request / a refused peer (the coordinator's counters and logs).
    """

    def __init__(self, *, sockets: ServerSockets, settings: Settings, registry: Registry, captures: CaptureShell,
                 state: StateStore, detectors: dict[str, JobDetector], counters: dict[str, int], bounds: Callable[[], dict[str, int]],
                 reject: Callable[[MessageRejected | RegistryError], None],
                 refuse_peer: Callable[[str, str, str], None], clock: SteadyClock | None = None) -> None:
        self.clock = clock or SteadyClock()  # the coordinator's: every time compared with its deadlines
        self.sockets, self.control_sock, self.settings = sockets, sockets.control, settings
        self.registry, self.captures, self.state, self.detectors = registry, captures, state, detectors
        self.counters, self.bounds, self._reject, self._refuse_peer = counters, bounds, reject, refuse_peer

    def drain(self) -> None:
        """Answer up to 100 waiting requests (never blocks; a malformed one is counted and answered)."""
        for _ in range(100):
            try:
                envelope, req, frame = control.recv_request(self.control_sock)
            except zmq.Again:
                return
            except Exception as exc:  # noqa: BLE001 - a malformed request never stops the coordinator
                self._reject(MessageRejected("bad_control_request", repr(exc)[:200]))
                continue
            if isinstance(req, control.ControlError):
                control.send_reply(self.control_sock, envelope, error=req)
                continue
            if not self.sockets.admitted(frame, "control"):
                from profwatch.adapters.zmq.curve import user_id

                self._refuse_peer("key_revoked", "control request on a connection whose key was removed or changed",
                                  f"key:{user_id(frame) or '-'}")
                control.send_reply(self.control_sock, envelope, error=control.ControlError(
                    "denied", "this connection's key was removed from the coordinator's key ring or changed (revoked)"))
                continue
            try:
                authorize(req["cmd"], self.sockets.grants(frame))
            except AccessDenied as exc:
                from profwatch.adapters.zmq.curve import user_id

                self._refuse_peer(f"control_{exc.code}", exc.message, f"key:{user_id(frame) or '-'}")
                control.send_reply(self.control_sock, envelope, error=control.ControlError(exc.code, exc.message))
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
        """Is the coordinator answering (a liveness probe; role ``read``).

        Args: none.
        Reply: ``{"pong": true, "ts_unix_s": <coordinator wall clock, s>}``.
        """
        return {"pong": True, "ts_unix_s": self.clock.wall()}

    @staticmethod
    def _job_arg(job_id: Any) -> str | None:
        if job_id is not None and not isinstance(job_id, str):
            raise control.ControlError("bad_request", f"job_id must be a string, got {type(job_id).__name__}")
        return job_id

    def _cmd_status(self, job_id: str | None = None) -> dict[str, Any]:
        """The fleet as the coordinator sees it (``profwatch status``).

        Args:
            job_id: only this job's rows (a string); null: every job.
        Reply: the registry's snapshot (``core/fleet/registry_state.py::snapshot``): ``jobs`` (per job: ``job_id``,
            ``world_size``, ``generation``, ``restart_count``, ``furthest_step``, ``median_step_time_s``, paths,
            ``warnings`` and ``ranks``, one object per rank) and ``nodes``; plus ``counters`` (message counters),
            ``ingest_bind``, ``captures`` (the last 20, ``core/capture/report.py::describe`` each), ``episodes``,
            ``references`` (the episode and reference desks' views), per serving job ``serving`` (its units and how
            many are still learning: ``core/detection/job_detector.py::JobDetector.serving_view``), ``state_store`` (pending writes, failures,
            drops, last error) and ``bounds`` (jobs, ranks, nodes, detector_ranks, state_bound_mib).
        """
        job_id = self._job_arg(job_id)
        snap = self.registry.snapshot(self.clock(), self.settings.coordinator.node_timeout_s, job_id)
        snap["counters"] = dict(self.counters)
        snap["ingest_bind"] = self.settings.coordinator.ingest_bind  # where nodes must dial (status names it)
        snap["captures"] = self.captures.summary(job_id, self.clock())
        snap["episodes"] = self.captures.episodes.view(job_id, self.clock())
        snap["references"] = self.captures.references.view(job_id, self.clock())
        snap["state_store"] = self.state.status()
        snap["bounds"] = self.bounds()
        for job in snap["jobs"]:  # what a serving job's units are judged on yet (none: training, or no detector)
            det = self.detectors.get(job["job_id"])
            view = det.serving_view() if det is not None else None
            if view is not None:
                job["serving"] = view
        return snap

    @staticmethod
    def _flag_arg(name: str, value: Any) -> bool:
        """A JSON boolean, nothing else: the string "false" is truthy in Python and must not read as true."""
        if not isinstance(value, bool):
            raise control.ControlError("bad_request", f"{name} must be true or false, got {type(value).__name__}")
        return value

    def _cmd_events(self, job_id: str | None = None, since_seq: int = 0, limit: int = 100,
                    alerts_only: bool = True) -> list[dict[str, Any]]:
        """Stored events, oldest first (``profwatch alerts``).

        Args:
            job_id: only this job's events (a string); null: every job.
            since_seq: events with a store sequence number above it, in [0, 2**62) (default 0).
            limit: at most this many, in [1, 10000] (default 100).
            alerts_only: only alerts (true, default) or every event type (false); a JSON boolean.
        Reply: ``[{"seq": <int>, "event": <the event as published, docs/alerts.md>}, ...]``; with ``since_seq`` 0
            also the events published while the state store failed, ``{"seq": 0, "event": ..., "stored": false}``.
        """
        job_id = self._job_arg(job_id)
        alerts_only = self._flag_arg("alerts_only", alerts_only)
        since, lim = int(since_seq), int(limit)
        if not (0 <= since < 2**62 and 1 <= lim <= 10_000):
            raise control.ControlError("bad_request", "since_seq must be in [0, 2**62) and limit in [1, 10000]")
        rows: list[dict[str, Any]] = [{"seq": s, "event": e} for s, e in
                                      self.state.events(job_id=job_id, alerts_only=alerts_only, since_seq=since,
                                                        limit=lim)]
        if since == 0:  # published while the store failed, not stored yet (seq 0: no place in the store's order)
            rows += [{"seq": 0, "event": e, "stored": False}
                     for e in self.state.pending_events(job_id=job_id, alerts_only=alerts_only)[-lim:]]
        return rows

    def _cmd_arm(self, job_id: Any = None, reason: Any = None, warmup: Any = None, active: Any = None,
                 rank_list: Any = None, start_step: Any = None, in_steps: Any = None,
                 dry_run: Any = False) -> dict[str, Any]:
        """Arm a capture now (``profwatch arm``; ``core/capture/planner.py`` plans it, ``captures/shell.py`` starts it).

        Args:
            job_id: the job (a string, required).
            reason: a label kept with the capture (default ``"manual"``).
            warmup, active: the capture window's step counts (default ``[capture] manual_warmup`` / ``manual_active``,
                active at least ``[arming] active``: ``core/capture/planner.py: manual_default_active``).
            rank_list: the ranks to profile (list of ints); null or empty: every rank.
            start_step: the absolute first step; in_steps: or this many steps after the furthest one (default: the
                planner's lead, enough for every rank to read the config in time).
            dry_run: plan and check only, start nothing (a JSON boolean, default false).
        Reply: the plan: ``capture_id``, ``job_id``, ``reason``, ``start_step``, ``warmup``, ``active``, ``rank_list``,
            ``prof_dir``, ``profiler_config_path``, ``window_deadline_unix_s``, ``config`` (the profiler_config.json
            written), ``writer``, ``nodes``, ``dry_run``, ``base_step``, ``step_spread``, ``furthest_step``,
            ``step_time_s``, ``world_size``, ``warnings`` (when any); after a real arm merged with the capture's
            ``describe`` view (state, deadline, acknowledgements); a dry run that would be refused adds ``refused``
            (``code``, ``message``, ``blocking_capture``, ``blocking_state``, ``blocking_deadline_unix_s``).
            Errors: ``not_found`` (unknown job), ``refused`` (paths, ranks or nodes not ready), ``conflict`` (a
            capture in flight, named), ``bad_request`` (cannot plan, e.g. no step time measured yet).
        """
        if not isinstance(job_id, str):
            raise control.ControlError("bad_request", "job_id (a string) is required")
        if active is None:
            cap = self.settings.capture
            active = manual_default_active(cap.manual_active, self.settings.arming.active, cap.max_active)
        try:
            req = CaptureRequest(job_id=job_id, reason=str(reason or "manual"), warmup=warmup, active=active,
                                 rank_list=list(rank_list) if rank_list else None, start_step=start_step,
                                 in_steps=in_steps)
        except ValueError as exc:  # pydantic: wrong types
            raise control.ControlError("bad_request", str(exc)) from None
        return arm_reply(self.captures.arm(job_id, req, self.clock(), dry_run=self._flag_arg("dry_run", dry_run)))

    def _cmd_cancel(self, job_id: Any = None, capture_id: Any = None) -> list[dict[str, Any]]:
        """Cancel a capture (``profwatch cancel``): its profiler_config.json is written back idle.

        Args:
            job_id: the job (a string, required).
            capture_id: this capture (a string); null: every capture of the job in flight.
        Reply: one ``describe`` view per cancelled capture (``core/capture/report.py``), each with ``idle_config``
            (true when the idle config is being written). Errors: ``not_found`` (no such capture, none in flight),
            ``conflict`` (its state cannot be cancelled).
        """
        if not isinstance(job_id, str) or not (capture_id is None or isinstance(capture_id, str)):
            raise control.ControlError("bad_request", "job_id (a string) is required; capture_id is a string")
        return self.captures.cancel(job_id, capture_id, self.clock())

    def _cmd_capture(self, capture_id: Any = None) -> dict[str, Any]:
        """One capture, live or stored (``profwatch arm --wait`` polls it).

        Args:
            capture_id: the capture (a string, required).
        Reply: its ``describe`` view (``core/capture/report.py``: state, deadline, acknowledged / completed ranks,
            node writes, batch, analysis status, outcome, notes) plus ``unacknowledged``: up to 64 ranks that have
            not picked the config up, each with its likely cause. Errors: ``not_found``.
        """
        if not isinstance(capture_id, str):
            raise control.ControlError("bad_request", "capture_id (a string) is required")
        return self.captures.capture_view(capture_id, self.clock())

    def _cmd_captures(self, job_id: str | None = None) -> list[dict[str, Any]]:
        """The stored captures, newest first, at most 1000.

        Args:
            job_id: only this job's captures (a string); null: every job.
        Reply: ``describe`` views (``core/capture/report.py``); one still waiting in the state store's retry queue
            carries ``"stored": false``.
        """
        now = self.clock()
        out = []
        for cap, stored in self.state.captures_with_pending(self._job_arg(job_id), newest=1000):
            view = describe(cap, now)
            if not stored:
                view["stored"] = False  # waiting in the state store's retry queue
            out.append(view)
        return out

    def _cmd_set_thresholds(self, detection: dict[str, Any] | None = None, arming: dict[str, Any] | None = None) -> dict[str, Any]:
        """Runtime tuning without restart: merge into the current settings, validate, apply to every detector.

        Args:
            detection: keys of ``[detection]`` to change (docs/configuration.md), merged into the current ones.
            arming: keys of ``[arming]`` to change, merged likewise. A nested section is replaced whole.
        Reply: ``{"detection": {...}, "arming": {...}}``, both sections as now in force (every key). Errors:
            ``bad_request`` with pydantic's message when the merged section is invalid (nothing is changed then).
        """
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
        """The job's step windows as ``profwatch replay`` JSONL (``profwatch telemetry``).

        Args:
            job_id: the job (a string, required).
        Reply: one string of JSON lines, one step record per rank and step in the window (with ``world_size``),
            ordered by step then rank (``daemon/profwatch/core/fleet/telemetry.py::dump_jsonl``). Errors:
            ``not_found``.
        """
        job = self.registry.jobs.get(self._job_arg(job_id) or "")
        if job is None:
            raise control.ControlError("not_found", f"unknown job {job_id!r}")
        rows = []
        for r in job.ranks.values():
            if r.window is not None:
                rows += window_records(job.job_id, r.rank, r.window.items_with_work(), r.last_ts_unix_s,
                                       {"mode": r.mode, "role": r.role, "pid": r.pid or None, "node": r.node_id},
                                       r.window.stage_rows(), r.window.cpu_rows())
        rows.sort(key=lambda d: (d["step"], d["rank"]))
        return dump_jsonl(rows, world_size=job.world_size)
