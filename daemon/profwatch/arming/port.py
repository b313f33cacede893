"""The arm port: what one arm of the capture shell (``daemon/profwatch/captures/shell.py``: ``CaptureShell.arm``)
returns, typed, and the narrow callable the episode and reference desks arm through.

:class:`ArmResult` is the plan the arm made (or would make, for a dry run), what it covers and who writes it, and
either the capture it opened or why it was refused (:class:`ArmRefusal`: a capture holds the job's config slot).
The ``arm`` control command's JSON reply is built from it by :func:`arm_reply` (``profwatch arm``; README.md).
Refusals that are not about the slot (unknown job, paths, ranks or nodes not ready, nothing to plan on) are
raised by the arm as ``ControlError`` before a plan exists.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from profwatch.adapters.zmq.control import ControlError
from profwatch.core.capture.report import describe

if TYPE_CHECKING:
    from profwatch.core.capture.lifecycle import Capture
    from profwatch.core.capture.planner import CapturePlan, CaptureRequest


@dataclass(frozen=True, slots=True)
class ArmRefusal:
    """Why an arm is refused although it could be planned: ``code`` (``conflict``), ``message`` (names the capture
    in flight and when it ends), that capture's id, state and deadline (unix seconds, None when it has none)."""

    code: str
    message: str
    blocking_capture: str
    blocking_state: str
    blocking_deadline_unix_s: float | None

    def to_json(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "blocking_capture": self.blocking_capture,
                "blocking_state": self.blocking_state, "blocking_deadline_unix_s": self.blocking_deadline_unix_s}


@dataclass(frozen=True, slots=True)
class ArmResult:
    """One arm of a job, as planned.

    Attributes:
        plan: the capture plan (start step, window, covered ranks, the rendered config).
        job_id, world_size: the job and its world size at arm time.
        profiler_config_path: the config file the job announced (None when it announced none).
        writer: who writes the config (``coordinator`` or ``node``); ``nodes``: the node daemons that write it
            (``node`` writer only, sorted).
        furthest_step, step_time_s: the job's progress the plan was placed on (seconds per step).
        dry_run: nothing was written or recorded.
        at_unix_s: when the arm was made (the reply's times left are counted from it).
        warnings: what may go wrong without refusing the arm (backends, links, ranks gone).
        refused: set when a capture holds the job's config slot (a real arm then opened nothing).
        capture: the capture the arm opened (a real arm that was not refused), else None.
    """

    plan: CapturePlan
    job_id: str
    world_size: int
    profiler_config_path: str | None
    writer: str
    nodes: tuple[str, ...]
    furthest_step: int
    step_time_s: float | None
    dry_run: bool
    at_unix_s: float
    warnings: tuple[str, ...] = ()
    refused: ArmRefusal | None = None
    capture: Capture | None = None

    @property
    def capture_id(self) -> str:
        return self.plan.capture_id

    @property
    def start_step(self) -> int:
        return self.plan.start_step

    @property
    def rank_list(self) -> tuple[int, ...] | None:
        """The covered ranks of a targeted capture; None when it covers the whole job."""
        return tuple(self.plan.rank_list) if self.plan.rank_list is not None else None

    def to_json(self) -> dict[str, Any]:
        """The ``arm`` control command's reply: the plan's keys (``capture_id`` ... ``world_size``), ``warnings``
        when there are any, then ``refused`` (:meth:`ArmRefusal.to_json`) or, for an opened capture, its ``status``
        view (``profwatch.core.capture.report.describe``)."""
        p = self.plan
        out: dict[str, Any] = {
            "capture_id": p.capture_id, "job_id": self.job_id, "reason": p.reason, "start_step": p.start_step,
            "warmup": p.warmup, "active": p.active, "rank_list": p.rank_list, "prof_dir": p.prof_dir,
            "profiler_config_path": self.profiler_config_path, "window_deadline_unix_s": p.deadline_unix_s,
            "config": p.config.render(), "writer": self.writer, "nodes": list(self.nodes), "dry_run": self.dry_run,
            "base_step": p.base_step, "step_spread": p.step_spread, "furthest_step": self.furthest_step,
            "step_time_s": self.step_time_s, "world_size": self.world_size}
        if self.warnings:
            out["warnings"] = list(self.warnings)
        if self.refused is not None:
            return {**out, "refused": self.refused.to_json()}
        if self.capture is not None:
            return {**out, **describe(self.capture, self.at_unix_s)}
        return out


def arm_reply(result: ArmResult) -> dict[str, Any]:
    """The ``arm`` control command's JSON reply (:meth:`ArmResult.to_json`). A refused real arm is the command's
    error: raises ``ControlError`` with the refusal's code and message; a dry run's reply carries ``refused``."""
    if result.refused is not None and not result.dry_run:
        raise ControlError(result.refused.code, result.refused.message)
    return result.to_json()


class ArmPort(Protocol):
    """The capture shell's arm, as the episode and reference desks see it (``CaptureShell.arm``).

    ``(job_id, request, now, dry_run=False) -> ArmResult``: plans the request against the job's progress at
    ``now`` (unix seconds) and, unless ``dry_run`` or refused (:attr:`ArmResult.refused`), opens the capture.
    Raises ``ControlError`` (``not_found``, ``refused``, ``bad_request``) when there is nothing to plan on.
    """

    def __call__(self, job_id: str, req: CaptureRequest, now: float, dry_run: bool = False) -> ArmResult: ...


def refusal_text(refused: ArmRefusal) -> str:
    """``code: message``, the words an arm decision and an episode carry for a refused arm."""
    return f"{refused.code}: {refused.message}"

