"""What the capture shell checks before it arms a job and at each hello (``daemon/profwatch/captures/shell.py``): the
paths a hello names (allowed roots, the rules of the rank's torch_npu version), whether the covered ranks have a
capture backend, whether the nodes that write the config are up. Refusals raise ``ControlError`` (the same for a dry
run and a real arm); what only may go wrong is a warning. Decisions in ``core/capture/availability.py`` and
``core/capture/torch_npu_paths.py``; I/O (``os.path.islink``, events) here. A mixin:
:class:`profwatch.captures.shell.CaptureShell` provides the attributes below."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from profwatch.adapters.fs.paths import PathRefused, check_inside
from profwatch.adapters.zmq.control import ControlError
from profwatch.core.alerts.event_types import TYPE_CAPTURE_UNAVAILABLE, TYPE_PATH_REFUSED
from profwatch.core.capture.availability import Unavailable, explain, unavailable
from profwatch.core.capture.planner import CaptureRequest
from profwatch.core.capture.torch_npu_paths import PathVerdict, check_config_path
from rankhook import wire

if TYPE_CHECKING:
    from profwatch.captures.ports import Emit
    from profwatch.config import Settings
    from profwatch.core.fleet.registry import JobState, NodeState


class ArmChecks:
    """The checks of the capture shell (see the module doc)."""

    s: Settings
    nodes: Mapping[str, NodeState]
    emit: Emit
    _refused_jobs: set[str]
    _unavailable_seen: set[tuple[str, str]]

    def arm_warnings(self, job: JobState, covered: set[int]) -> list[str]:
        """What may go wrong with an arm of ``covered`` that is not refused (shown by the arm and its dry run)."""
        partial = self._unavailable(job, covered)
        path = self._torch_npu_path(job, covered)
        return ([partial.detail()] if partial is not None else []) + (
            [f"profiler_config_path {job.profiler_config_path!r}: {path.detail()}"] if path is not None else [])

    def _torch_npu_path(self, job: JobState, covered: set[int]) -> PathVerdict | None:
        """torch_npu's verdict on the job's config path for the covered ranks' versions: the raising one first."""
        path = job.profiler_config_path
        versions = {r.torch_npu for r in job.ranks.values() if r.torch_npu and not r.left and r.rank in covered}
        if not path or not versions:
            return None
        link = self.s.coordinator.config_writer == "coordinator" and os.path.islink(path)
        verdicts = [v for v in (check_config_path(path, ver, link) for ver in sorted(versions)) if v is not None]
        return min(verdicts, key=lambda v: v.severity != "raise", default=None)

    @staticmethod
    def _unavailable(job: JobState, covered: set[int]) -> Unavailable | None:
        return unavailable((r.rank, r.hostname, r.backend, r.backend_error, job.profiler_config_path)
                           for r in job.ranks.values() if not r.left and r.rank in covered)

    def _check_armable(self, job: JobState, req: CaptureRequest, now: float) -> None:
        if not job.profiler_config_path:
            raise ControlError("refused", f"job {job.job_id} announced no usable profiler_config_path")
        if not job.prof_root:
            raise ControlError("refused", f"job {job.job_id} announced no usable prof_root")
        live = [r for r in job.ranks.values() if not r.left]
        if not live:
            raise ControlError("refused", f"job {job.job_id} has no live ranks (all {len(job.ranks)} left)")
        if len(live) < job.world_size:
            left = sorted(r.rank for r in job.ranks.values() if r.left)
            raise ControlError("refused", f"only {len(live)}/{job.world_size} ranks are live"
                               + (f" (left: {left})" if left else " (the others have not started yet)")
                               + "; torch_npu ignores configs written before every rank started")
        covered = set(req.rank_list) if req.rank_list else {r.rank for r in live}
        gone = self._unavailable(job, covered)
        if gone is not None and gone.fatal:
            raise ControlError("refused", gone.detail())
        path_verdict = self._torch_npu_path(job, covered)
        if path_verdict is not None and path_verdict.severity == "raise":
            raise ControlError("refused", f"profiler_config_path {job.profiler_config_path!r}: "
                                          f"{path_verdict.detail()}")
        if self.s.coordinator.config_writer == "node":
            timeout = self.s.coordinator.node_timeout_s
            for node_id in sorted({r.node_id for r in live if r.rank in covered and r.node_id}):
                node = self.nodes.get(node_id)
                if node is None or now - node.last_seen_unix_s > timeout:
                    heard = f"last heard {now - node.last_seen_unix_s:.0f} s ago" if node is not None else "never heard"
                    raise ControlError("refused", f"node {node_id} is down ({heard}): it writes the config for its "
                                                  "ranks (config_writer = \"node\"); start its node daemon first")

    def on_hello(self, job: JobState, msg: wire.RankHello, now: float) -> None:
        """Check the paths a hello names; refuse and report anything outside the allowed roots or passing through a
        symlink below its root (``daemon/profwatch/adapters/fs/paths.py``: what is checked here is what is used later)."""
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
        if msg.backend == "none" and msg.backend_error:
            self._capture_unavailable(msg)
        self._check_torch_npu_path(job, msg)
        if problems and msg.job_id not in self._refused_jobs:
            self._refused_jobs.add(msg.job_id)
            self.emit(TYPE_PATH_REFUSED, msg.job_id,
                      {"rank": msg.rank, "hostname": msg.hostname, "problems": problems},
                      event_id=f"path_refused-{msg.job_id}-{int(now)}")

    def _check_torch_npu_path(self, job: JobState, msg: wire.RankHello) -> None:
        """The hello's config path under the torch_npu version the rank reports: where that version raises, one
        ``path_refused`` alert (reason ``torch_npu_refuses_path``) per job, version and path; where it only warns, a
        warning in ``status`` (``core/capture/torch_npu_paths.py``)."""
        version = msg.versions.get("torch_npu", "")
        path = job.profiler_config_path
        if not version or not path or path != msg.profiler_config_path:
            return
        link = self.s.coordinator.config_writer == "coordinator" and os.path.islink(path)
        verdict = check_config_path(path, version, link)
        if verdict is None:
            job.warnings.pop("torch_npu_path", None)
            return
        if verdict.severity == "warn":
            job.warnings["torch_npu_path"] = f"profiler_config_path {path!r}: {verdict.detail()}"
            return
        job.warnings.pop("torch_npu_path", None)
        key = (msg.job_id, f"{version}\0{path}")
        if key in self._unavailable_seen:
            return
        self._unavailable_seen.add(key)
        digest = hashlib.sha256(key[1].encode("utf-8", "backslashreplace")).hexdigest()[:16]
        self.emit(TYPE_PATH_REFUSED, msg.job_id, {
            "rank": msg.rank, "hostname": msg.hostname, "reason": "torch_npu_refuses_path", "torch_npu": version,
            "profiler_config_path": path, "problems": list(verdict.problems),
            "detail": f"profiler_config_path {path!r}: {verdict.detail()}"},
            event_id=f"torch_npu_path-{msg.job_id}-{digest}")

    def _capture_unavailable(self, msg: wire.RankHello) -> None:
        """A rank could not open the capture backend it asked for: one ``capture_unavailable`` alert per job and
        error where no capture can reach it (``core/capture/availability.py``)."""
        cause, fix, fatal = explain(msg.backend_error, msg.profiler_config_path, msg.hostname)
        key = (msg.job_id, msg.backend_error)
        if not fatal or key in self._unavailable_seen:
            return
        if len(self._unavailable_seen) >= 10_000:
            self._unavailable_seen.clear()
        self._unavailable_seen.add(key)
        digest = hashlib.sha256(msg.backend_error.encode("utf-8", "backslashreplace")).hexdigest()[:16]
        self.emit(TYPE_CAPTURE_UNAVAILABLE, msg.job_id, {
            "rank": msg.rank, "hostname": msg.hostname, "profiler_config_path": msg.profiler_config_path,
            "error": msg.backend_error, "cause": cause, "fix": fix,
            "detail": f"rank {msg.rank} on {msg.hostname}: {cause}. Fix: {fix}"},
            event_id=f"capture_unavailable-{msg.job_id}-{digest}")
