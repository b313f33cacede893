"""What the capture shell checks before it arms a job and at each hello (``daemon/profwatch/captures/shell.py``): the
paths a hello names (allowed roots, the rules of the rank's torch_npu version), whether the covered ranks have a
capture backend, whether the nodes that write the config are up. Refusals raise ``ControlError`` (the same for a dry
run and a real arm); what only may go wrong is a warning. Decisions in ``core/arming/admission.py`` (the arm
rules), ``core/arming/availability.py`` and ``core/capture/torch_npu_paths.py``; I/O (``os.path.islink``, events)
here. The shell owns one :class:`ArmChecks`, built with explicit arguments."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from profwatch.adapters.fs.paths import PathRefused, check_inside
from profwatch.adapters.zmq.control import ControlError
from profwatch.core.alerts.event_types import TYPE_CAPTURE_UNAVAILABLE, TYPE_PATH_REFUSED
from profwatch.core.arming import admission
from profwatch.core.arming.availability import explain
from profwatch.core.capture.planner import CaptureRequest
from profwatch.core.capture.torch_npu_paths import check_config_path
from rankhook import wire

if TYPE_CHECKING:
    from profwatch.captures.ports import Emit
    from profwatch.config import CoordinatorSettings
    from profwatch.core.fleet.registry import JobState, NodeState


class ArmChecks:
    """The checks of the capture shell (see the module doc).

    Args:
        coordinator: the ``[coordinator]`` settings (``config_writer``, ``allowed_prof_roots``,
            ``allowed_config_roots``, ``node_timeout_s``).
        nodes: the registry's node map (read only: a node's last heartbeat).
        emit: publish an event (``path_refused``, ``capture_unavailable``: once per job and cause).
    """

    def __init__(self, *, coordinator: CoordinatorSettings, nodes: Mapping[str, NodeState], emit: Emit) -> None:
        self.cs, self.nodes, self.emit = coordinator, nodes, emit
        self._refused_jobs: set[str] = set()  # jobs whose hello paths were alerted as refused
        self._unavailable_seen: set[tuple[str, str]] = set()  # (job, backend_error) alerted as capture_unavailable

    def _is_link(self, path: str | None) -> bool:
        """The coordinator writes the config itself and its path is a symbolic link (torch_npu checks the path)."""
        return bool(path) and self.cs.config_writer == "coordinator" and os.path.islink(path or "")

    def check_armable(self, job: JobState, req: CaptureRequest, now: float) -> None:
        """Raise ``ControlError("refused", why)`` when ``job`` cannot take the arm ``req`` now
        (``core/arming/admission.py: arm_refusal``)."""
        why = admission.arm_refusal(job, req.rank_list, self.nodes, now, config_writer=self.cs.config_writer,
                                    node_timeout_s=self.cs.node_timeout_s,
                                    config_path_is_link=self._is_link(job.profiler_config_path))
        if why is not None:
            raise ControlError("refused", why)

    def arm_warnings(self, job: JobState, covered: set[int]) -> list[str]:
        """What may go wrong with an arm of ``covered`` that is not refused (shown by the arm and its dry run)."""
        return admission.arm_warnings(job, covered, config_path_is_link=self._is_link(job.profiler_config_path))

    def on_hello(self, job: JobState, msg: wire.RankHello, now: float) -> None:
        """Check the paths a hello names; refuse and report anything outside the allowed roots or passing through a
        symlink below its root (``daemon/profwatch/adapters/fs/paths.py``: what is checked here is what is used later)."""
        cs = self.cs
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
        verdict = check_config_path(path, version, self._is_link(path))
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
        error where no capture can reach it (``core/arming/availability.py``)."""
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
            # one alert per job and error, raised at the first rank's hello: it cannot know the ranks still to come
            # (a new user read "rank 0" as "only rank 0"); the arm's dry run lists every rank with the cause
            "detail": f"rank {msg.rank} on {msg.hostname}, the first rank to say so (the dry run `profwatch arm "
                      f"--job {msg.job_id} --dry-run` lists every rank that cannot be captured): {cause}. Fix: {fix}"},
            event_id=f"capture_unavailable-{msg.job_id}-{digest}")
