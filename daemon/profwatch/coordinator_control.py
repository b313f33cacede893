"""The coordinator's control commands (built by the composition root ``daemon/profwatch/coordinator.py``): the
``profwatch`` CLI's requests on the control socket, each checked against its role (``daemon/profwatch/core/access.py``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import structlog
import zmq

from profwatch.adapters.zmq import control
from profwatch.core.access import AccessDenied, authorize
from profwatch.core.capture.planner import CaptureRequest
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
                 refuse_peer: Callable[[str, str, str], None]) -> None:
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
        snap["ingest_bind"] = self.settings.coordinator.ingest_bind  # where nodes must dial (status names it)
        snap["captures"] = self.captures.summary(job_id, time.time())
        snap["episodes"] = self.captures.episodes.view(job_id, time.time())
        snap["references"] = self.captures.references.view(job_id, time.time())
        snap["state_store"] = self.state.status()
        snap["bounds"] = self.bounds()
        return snap

    @staticmethod
    def _flag_arg(name: str, value: Any) -> bool:
        """A JSON boolean, nothing else: the string "false" is truthy in Python and must not read as true."""
        if not isinstance(value, bool):
            raise control.ControlError("bad_request", f"{name} must be true or false, got {type(value).__name__}")
        return value

    def _cmd_events(self, job_id: str | None = None, since_seq: int = 0, limit: int = 100,
                    alerts_only: bool = True) -> list[dict[str, Any]]:
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
        if not isinstance(job_id, str):
            raise control.ControlError("bad_request", "job_id (a string) is required")
        try:
            req = CaptureRequest(job_id=job_id, reason=str(reason or "manual"), warmup=warmup, active=active,
                                 rank_list=list(rank_list) if rank_list else None, start_step=start_step,
                                 in_steps=in_steps)
        except ValueError as exc:  # pydantic: wrong types
            raise control.ControlError("bad_request", str(exc)) from None
        return self.captures.arm(job_id, req, time.time(), dry_run=self._flag_arg("dry_run", dry_run))

    def _cmd_cancel(self, job_id: Any = None, capture_id: Any = None) -> list[dict[str, Any]]:
        if not isinstance(job_id, str) or not (capture_id is None or isinstance(capture_id, str)):
            raise control.ControlError("bad_request", "job_id (a string) is required; capture_id is a string")
        return self.captures.cancel(job_id, capture_id, time.time())

    def _cmd_capture(self, capture_id: Any = None) -> dict[str, Any]:
        if not isinstance(capture_id, str):
            raise control.ControlError("bad_request", "capture_id (a string) is required")
        return self.captures.capture_view(capture_id, time.time())

    def _cmd_captures(self, job_id: str | None = None) -> list[dict[str, Any]]:
        now = time.time()
        out = []
        for cap, stored in self.state.captures_with_pending(self._job_arg(job_id), newest=1000):
            view = describe(cap, now)
            if not stored:
                view["stored"] = False  # waiting in the state store's retry queue
            out.append(view)
        return out

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
        """The job's step windows as ``profwatch replay`` JSONL (``daemon/profwatch/core/fleet/telemetry.py``)."""
        job = self.registry.jobs.get(self._job_arg(job_id) or "")
        if job is None:
            raise control.ControlError("not_found", f"unknown job {job_id!r}")
        rows = []
        for r in job.ranks.values():
            if r.window is not None:
                rows += window_records(job.job_id, r.rank, r.window.items_with_work(), r.last_ts_unix_s,
                                       {"mode": r.mode, "role": r.role, "pid": r.pid or None, "node": r.node_id},
                                       r.window.stage_rows())
        rows.sort(key=lambda d: (d["step"], d["rank"]))
        return dump_jsonl(rows, world_size=job.world_size)
