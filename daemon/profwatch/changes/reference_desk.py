"""The coordinator's reference captures (I/O shell around ``daemon/profwatch/core/changes/reference.py``): one
:class:`~profwatch.core.changes.reference.JobReference` per job, judged about once a second; it arms a reference
through the capture shell's ``arm``, learns its outcome when it leaves flight, hands the newest analysed reference to
the analyses of later captures and to ``status``, and keeps that reference out of retention.

Nothing is stored beyond the captures themselves (reason ``reference`` in the state store): :meth:`ReferenceDesk.start`
rebuilds each job's newest analysed reference from them. Runs on the coordinator's main thread.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import structlog

from profwatch.adapters.zmq.control import ControlError
from profwatch.arming.port import ArmPort
from profwatch.core.arming.policy import capture_coverage
from profwatch.core.capture import lifecycle as lc
from profwatch.core.capture.planner import CaptureRequest
from profwatch.core.changes.reference import (
    REFERENCE_REASON,
    JobReference,
    ReferenceInfo,
    decide_reference,
    episodes_holding,
)
from profwatch.core.fleet.registry import every_rank_left

if TYPE_CHECKING:
    from profwatch.adapters.store.state import StateStore
    from profwatch.captures.ports import DetectorsPort
    from profwatch.config import Settings
    from profwatch.core.arming.policy import ArmHistory, ArmingPolicy
    from profwatch.core.arming.targeting import JobTopology
    from profwatch.core.fleet.registry import JobState

log = structlog.get_logger("profwatch.captures.reference")
RUN_EVERY_S = 1.0
"""How often (seconds) each job's reference is judged."""
SILENT_S = 30.0
"""A job none of whose ranks was heard for this long is not steady (it may have ended)."""
ANALYSED = frozenset({lc.S.ANALYSED, lc.S.ENRICHED})


def reference_info(cap: lc.Capture) -> ReferenceInfo:
    """The :class:`ReferenceInfo` of an analysed reference capture."""
    return ReferenceInfo(cap.capture_id, cap.generation, cap.created_unix_s, cap.prof_dir, cap.batch_id,
                         cap.step_time_s, cap.world_size)


class ReferenceDesk:
    """Reference captures of every job (see the module doc).

    Args:
        settings: the configuration tree (``[reference]``, ``[arming]``).
        store: the state store (read at start).
        jobs: the registry's job map (read only).
        detectors: the detectors' view (baseline step time).
        arm: the capture shell's ``arm`` (:class:`~profwatch.arming.port.ArmPort`).
        slot_busy: whether a capture holds the job's config slot.
        open_episodes: when each open episode of the job opened (unix s; those younger than ``[reference]
            episode_yield_s`` hold the reference: ``core/changes/reference.py: episodes_holding``).
        history: the job's arm history (its bytes of the hour count the reference's estimate).
        topology: the job's layout (the reference covers the ranks a job-wide capture takes).
        policy: the arming policy in force (its mode; a callable: it is swapped at runtime).
        find: a capture in flight by id (None when no longer in flight).
    """

    def __init__(self, *, settings: Settings, store: StateStore, jobs: Mapping[str, JobState],
                 detectors: DetectorsPort, arm: ArmPort, slot_busy: Callable[[str], bool],
                 open_episodes: Callable[[str], Iterable[float]], history: Callable[[str], ArmHistory],
                 topology: Callable[[str], JobTopology | None], policy: Callable[[], ArmingPolicy],
                 find: Callable[[str], lc.Capture | None] = lambda cid: None) -> None:
        self.s, self.store, self.jobs, self.detectors = settings, store, jobs, detectors
        self._arm, self._slot_busy, self._open, self._history = arm, slot_busy, open_episodes, history
        self._topology, self._policy, self._find = topology, policy, find
        self.refs: dict[str, JobReference] = {}
        self.last: dict[str, tuple[str, float | None]] = {}  # job -> the last decision (reason, until)
        self._next_run: dict[str, float] = {}

    def ref(self, job_id: str) -> JobReference:
        r = self.refs.get(job_id)
        if r is None:
            r = self.refs[job_id] = JobReference()
        return r

    def start(self) -> None:
        """Rebuild each job's newest analysed reference and its reference in flight from the stored captures."""
        for cap in self.store.captures(states=[*ANALYSED, *lc.ACTIVE]):
            if cap.reason != REFERENCE_REASON:
                continue
            r = self.ref(cap.job_id)
            if cap.state in ANALYSED:
                r.ended(cap.capture_id, cap.state.value, reference_info(cap))
            elif cap.state in lc.IN_FLIGHT:
                r.armed(cap.capture_id, cap.created_unix_s)

    # -- time ---------------------------------------------------------------------------------------------------------
    def tick(self, now: float) -> None:
        """About once a second per job: judge its steadiness and arm its reference when the rules allow."""
        rs = self.s.reference
        if not rs.enabled:
            return
        for job_id, job in list(self.jobs.items()):
            if now < self._next_run.get(job_id, 0.0):
                continue
            self._next_run[job_id] = now + RUN_EVERY_S
            r = self.ref(job_id)
            baseline = self.detectors.baseline_step_time_s(job_id)
            n_open = episodes_holding(self._open(job_id), now, rs.episode_yield_s)
            recent = (job.median_step_time_s(sampled=True) if not n_open and baseline is not None
                      and now - job.last_heard_unix_s() <= SILENT_S else None)  # the median only when it decides
            r.observe(now, open_episodes=n_open, baseline_step_s=baseline, recent_step_s=recent,
                      tolerance=rs.step_time_tolerance)
            arming = self._policy().settings
            hist = self._history(job_id)
            held = hist.state(now, capture_in_flight=False).bytes_last_hour

            decide = functools.partial(decide_reference, rs, r, now, generation=job.generation,
                                       act_mode=arming.mode == "act", slot_busy=self._slot_busy(job_id),
                                       bytes_last_hour=held, byte_cap=arming.max_capture_bytes_per_hour,
                                       job_ended=job.ended_unix_s is not None or every_rank_left(job))
            d = decide(estimated_bytes=0)  # the cheap checks first: the ranks to cover are planned only when everything else passes
            if d.take:
                target, rank_list, estimate = capture_coverage(
                    (), self._topology(job_id), arming, active=rs.active_steps,
                    bytes_per_rank_step=hist.bytes_per_rank_step, world_size=job.world_size)
                d = decide(estimated_bytes=estimate)
            self.last[job_id] = (d.reason, d.until_unix_s)
            if not d.take:
                continue
            req = CaptureRequest(job_id=job_id, reason=REFERENCE_REASON, warmup=arming.warmup,
                                 active=rs.active_steps, rank_list=list(rank_list) if rank_list is not None else None,
                                 targeting=({**target.to_json(), "estimated_bytes": estimate}
                                            if target is not None and target.rank_list is not None else None))
            try:
                res = self._arm(job_id, req, now)
                refused = (res.refused.code, res.refused.message) if res.refused is not None else None
            except ControlError as exc:
                refused = (exc.code, exc.message)
            if refused is not None:
                code, message = refused
                r.armed("", now)  # counts as a try: the retry wait applies
                r.ended("", "failed", None)
                self.last[job_id] = (f"{code}: {message}", now + rs.retry_after_s)
                log.info("reference_not_armed", job_id=job_id, code=code, message=message)
                continue
            r.armed(res.capture_id, now)
            log.info("reference_armed", job_id=job_id, capture_id=res.capture_id, start_step=res.start_step)

    def new_generation(self, job_id: str) -> None:
        self.ref(job_id).new_generation()

    def forget(self, job_ids: Iterable[str]) -> None:
        for j in job_ids:
            self.refs.pop(j, None)
            self.last.pop(j, None)
            self._next_run.pop(j, None)

    # -- captures -----------------------------------------------------------------------------------------------------
    def capture_ended(self, cap: lc.Capture) -> None:
        """A reference capture left flight: analysed with a batch, it becomes the job's reference."""
        if cap.reason != REFERENCE_REASON:
            return
        ok = cap.state in ANALYSED and cap.batch_id is not None
        self.ref(cap.job_id).ended(cap.capture_id, cap.state.value, reference_info(cap) if ok else None)

    def for_analysis(self, cap: lc.Capture, now: float) -> dict[str, Any] | None:
        """What the analysis of ``cap`` compares with (``BatchAnalyser.analyse``'s ``context["reference"]``): the
        job's newest reference (the one being analysed, else the newest analysed) and, as
        ``telemetry_baseline_step_s``, the telemetry's step time when that reference was planned (the job was
        steady then: ``core/changes/comparison.py`` notes a reference whose own steps differ from it); None for a
        reference itself, or when the job has none. Not ``cap``'s own step time at its arm: after a job-wide
        slowdown that is the slowed level (the detector re-learns at each report), and every verdict of a
        slowdown said "the reference may not show the healthy job" of a healthy reference."""
        if cap.reason == REFERENCE_REASON:
            return None
        r = self.refs.get(cap.job_id)
        if r is None:
            return None
        info = r.latest
        pending = self._find(r.in_flight) if r.in_flight else None
        if pending is not None and pending.state is lc.S.ANALYSING and pending.batch_id:
            info = reference_info(pending)  # its window is over, its analysis runs: the analyser waits for it
        if info is None:
            return None
        return {**info.to_json(now), "telemetry_baseline_step_s": info.step_time_s}

    def protected(self) -> set[str]:
        """Batch ids retention must keep: the newest analysed reference of each job."""
        return {r.latest.batch_id for r in self.refs.values() if r.latest is not None and r.latest.batch_id}

    def view(self, job_id: str | None, now: float) -> list[dict[str, Any]]:
        """For ``status``: per job, its reference (``latest``, null when none), the one in flight, whether it is
        steady and since when, and the last decision (``waiting``: its reason; ``until_unix_s``)."""
        out = []
        for j, r in sorted(self.refs.items()):
            if job_id not in (None, j):
                continue
            reason, until = self.last.get(j, ("", None))
            out.append({"job_id": j, "enabled": self.s.reference.enabled,
                        "latest": r.latest.to_json(now) if r.latest is not None else None,
                        "in_flight": r.in_flight, "steady_since_unix_s": r.steady_since_unix_s,
                        "waiting": reason, "until_unix_s": until, "last_outcome": r.last_outcome})
        return out
