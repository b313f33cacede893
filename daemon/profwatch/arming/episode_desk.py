"""The coordinator's episodes (I/O shell around ``daemon/profwatch/core/arming/episodes.py``): one
:class:`~profwatch.core.arming.episodes.JobEpisodes` per job, fed with the detectors' reports, run on every report and
about once a second; it arms through the capture shell's ``arm``, publishes the episode events and the arm
decisions, and keeps every episode in the state store (open ones survive a restart).

Runs on the coordinator's main thread, like the capture shell that owns it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import structlog

from profwatch.adapters.zmq.control import ControlError
from profwatch.arming.port import ArmPort, refusal_text
from profwatch.core.alerts.event_types import TYPE_ARM_DECISION, TYPE_SUSPECT_RANKS
from profwatch.core.arming.episodes import Episode, JobEpisodes
from profwatch.core.arming.policy import ArmHistory, ArmingPolicy, capture_request, withdrawal_lead
from profwatch.core.capture import lifecycle as lc

if TYPE_CHECKING:
    from profwatch.adapters.store.state import StateStore
    from profwatch.captures.ports import DetectorsPort, Emit
    from profwatch.config import Settings
    from profwatch.core.arming.targeting import JobTopology
    from profwatch.core.detection.types import Anomaly
    from profwatch.core.fleet.host_load import LoadExplanation
    from profwatch.core.fleet.registry import JobState

log = structlog.get_logger("profwatch.captures.episodes")
MAX_LOAD_TOLD = 4096
"""Episodes remembered as told ``explained_by_host_load`` (all jobs; the oldest forgotten first)."""
RUN_EVERY_S = 1.0
"""How often (seconds) each job's episodes are judged and its queue run between reports."""


def waited_ranks(cap: lc.Capture, waited_for: Any) -> tuple[int, ...]:
    """The ranks a targeted capture's verdict says its ranks waited for (``waited_for`` of the verdict,
    ``profwatch.core.verdict.subset.wait_outside``): its ``named`` rank when the data named one, else every rank of
    the job the capture did not hold. ``()`` when the verdict has no such block or the capture held every rank.
    What the verdict says is checked against the capture: only ranks of ``0..world_size-1`` outside its
    ``rank_list`` count."""
    if not isinstance(waited_for, Mapping) or cap.rank_list is None:
        return ()
    held = set(cap.rank_list)
    outside = [r for r in range(cap.world_size) if r not in held]
    named = waited_for.get("named")
    if isinstance(named, list):
        picked = [r for r in named if isinstance(r, int) and not isinstance(r, bool) and 0 <= r < cap.world_size
                  and r not in held]
        if picked:
            return tuple(sorted(set(picked)))
    return tuple(outside)


class EpisodeDesk:
    """Episodes and the capture queue of every job (see the module doc).

    Args:
        settings: the configuration tree (``[arming]``, ``[capture]``).
        store: the state store (``save_episode``, ``episodes``).
        jobs: the registry's job map (read only).
        detectors: the detectors' view (stalled ranks, step time, ranks still named).
        emit: publish one CloudEvent.
        arm: the capture shell's ``arm`` (:class:`~profwatch.arming.port.ArmPort`; act mode opens the capture, a
            dry run plans it in observe mode).
        in_flight: whether the job has a capture holding its config slot.
        topology: the job's layout for targeted captures.
        policy: the arming policy in force (a callable: it is swapped at runtime).
        withdraw: the capture shell's ``withdraw(job_id, capture_id, why, now)``: cancel a capture whose episode's
            excursion came back before its window (``JobEpisodes.withdraw_returned``); whether it could.
        host_load: ``host_load(job_id, episode, now)``: the host-load evidence of a job-wide episode over the job's
            nodes (``core/fleet/host_load.py`` ``explain_job_change``; None: no data), see ``JobEpisodes.next_arm``.
    """

    def __init__(self, *, settings: Settings, store: StateStore, jobs: Mapping[str, JobState],
                 detectors: DetectorsPort, emit: Emit, arm: ArmPort, in_flight: Callable[[str], bool],
                 topology: Callable[[str], JobTopology | None], policy: Callable[[], ArmingPolicy],
                 withdraw: Callable[[str, str, str, float], bool] = lambda job_id, cid, why, now: False,
                 host_load: Callable[[str, Episode, float], LoadExplanation | None] = lambda job_id, ep, now: None,
                 ) -> None:
        self.s, self.store, self.jobs, self.detectors, self.emit = settings, store, jobs, detectors, emit
        self._host_load = host_load
        self._load_told: dict[str, None] = {}  # episodes whose host-load explanation was published (bounded)
        self._withdraw = withdraw
        self._arm, self._in_flight, self._topology, self._policy = arm, in_flight, topology, policy
        self.books: dict[str, JobEpisodes] = {}
        self._next_run: dict[str, float] = {}
        self._would = 0

    def book(self, job_id: str) -> JobEpisodes:
        """The job's episodes and arm budget (created on first use)."""
        b = self.books.get(job_id)
        if b is None:
            b = self.books[job_id] = JobEpisodes(job_id, self._policy().settings)
        return b

    def start(self) -> None:
        """Load the stored episodes of the jobs the registry knows (open ones resume, the latest closed are
        listed), then resume the flight of each of their captures still in flight from its stored record (its
        window's start and ranks: ``JobEpisodes.resume_flight``), those of the job's current generation only. A row
        that does not parse is logged and skipped."""
        for row in self.store.episodes(job_ids=list(self.jobs)):
            try:
                ep = Episode.from_json(row)
            except (KeyError, TypeError, ValueError, ArithmeticError) as exc:  # Infinity in a rank: OverflowError
                log.warning("episode_row_unreadable", error=repr(exc))
                continue
            self.book(ep.job_id).restore([ep])
            if ep.closed_unix_s is None:
                log.info("episode_resumed", job_id=ep.job_id, episode_id=ep.episode_id, kind=ep.kind)
        for job_id, b in self.books.items():
            job = self.jobs.get(job_id)
            for cap in self.store.captures(job_id, states=lc.IN_FLIGHT):
                # one of an older generation (an analysing one finishes: CaptureShell.supersede_generation) lost its
                # flight with its run (JobEpisodes.new_run): it sees nothing of the current one
                if job is None or cap.generation == job.generation:
                    b.resume_flight(cap.capture_id, start_step=cap.start_step, covered=cap.rank_list)

    # -- reports and time ---------------------------------------------------------------------------------------------
    def on_anomaly(self, an: Anomaly, now: float) -> None:
        """Fold one detector report into its episode, run the job's queue, and publish what was decided for it."""
        if self.jobs.get(an.job_id) is None:
            return
        b = self.book(an.job_id)
        ep, events = b.observe(an, now)
        self._publish(an.job_id, events)
        armed = self._run(an.job_id, now)
        if ep is None or ep.episode_id in armed:
            if ep is None:
                self.emit(TYPE_ARM_DECISION, an.job_id, {"anomaly": an.kind, "step": an.step, "action": "suppress",
                                                         "reason": "transient_not_capturable"})
            return
        if ep.in_flight is not None:  # a capture in flight covers it (its window follows the onset)
            self.emit(TYPE_ARM_DECISION, an.job_id, {"anomaly": an.kind, "step": an.step, "action": "suppress",
                                                     "reason": "covered_by_capture", "episode_id": ep.episode_id,
                                                     "capture_id": ep.in_flight})
            return
        data: dict[str, Any] = {
            "anomaly": an.kind, "step": an.step, "action": "suppress", "reason": ep.waiting,
            "episode_id": ep.episode_id, "until_unix_s": ep.waiting_until_unix_s, "behind": ep.waiting_behind or None,
            "queued": ep.closed_unix_s is None and not ep.rotation}
        if ep.waiting == "explained_by_host_load":
            data["host_load"] = b.load_evidence.get(ep.episode_id)
        self.emit(TYPE_ARM_DECISION, an.job_id, data)

    def tick(self, now: float) -> None:
        """About once a second per job with open episodes: close the quiet ones, arm what the budget allows."""
        for job_id, b in list(self.books.items()):
            if b.open and now >= self._next_run.get(job_id, 0.0) and self.jobs.get(job_id) is not None:
                self._run(job_id, now)

    def close_job(self, job_id: str, now: float, reason: str) -> None:
        """The job ended (``reason``): close its open episodes."""
        b = self.books.get(job_id)
        if b is not None:
            self._publish(job_id, b.close_all(now, reason))

    def new_generation(self, job_id: str, now: float) -> ArmHistory:
        """The job started a new generation: close its open episodes and return its fresh arm budget."""
        b = self.book(job_id)
        self._publish(job_id, b.new_run(now, "new_generation"))
        return b.history

    def forget(self, job_ids: Iterable[str]) -> None:
        """Expired jobs: drop their books from memory (the store keeps their episodes)."""
        for j in job_ids:
            self.books.pop(j, None)
            self._next_run.pop(j, None)

    def _run(self, job_id: str, now: float) -> set[str]:
        """Judge the job's episodes, then arm from the queue until it yields nothing; returns the episodes armed."""
        self._next_run[job_id] = now + RUN_EVERY_S
        b, job = self.book(job_id), self.jobs[job_id]
        self._publish(job_id, b.advance(now, furthest_step=job.furthest_step(),
                                        step_time_s=self.detectors.baseline_step_time_s(job_id),
                                        ongoing=self.detectors.ongoing(job_id),
                                        unit_steps=self.detectors.unit_steps(job_id)))
        furthest = job.furthest_step()
        reach = withdrawal_lead(furthest, self.detectors.baseline_step_time_s(job_id), job.median_step_time_s(),
                                self.s.capture)
        for _, _, events in b.withdraw_returned(
                now, furthest_step=furthest, reach_steps=reach,
                returned=lambda first: self.detectors.excursion_returned(job_id, first),
                confirm=lambda cid, why: self._withdraw(job_id, cid, why, now)):
            self._publish(job_id, events)
        armed: set[str] = set()
        policy = self._policy()
        for _ in range(len(b.open) + 1):  # each pass arms one episode or stops: bounded even with no gap
            picked = b.next_arm(policy, now, capture_in_flight=self._in_flight(job_id),
                                stalled_ranks=self.detectors.stalled_ranks(job_id), topology=self._topology(job_id),
                                host_load=(lambda ep: self._host_load(job_id, ep, now))
                                if policy.settings.host_load_explains else None)
            if picked is None:
                break
            ep, d = picked
            data: dict[str, Any] = {"anomaly": ep.kind, "step": ep.last_step, "action": d.action, "reason": d.reason,
                                    "episode_id": ep.episode_id, "waited_s": round(now - ep.opened_unix_s, 3),
                                    "estimated_bytes": d.estimated_bytes,
                                    "targeting": d.target.to_json() if d.target is not None else None}
            if not ep.ranks:  # a job-wide arm says what its hosts' load did (evidence; it decides only when on)
                load = self._host_load(job_id, ep, now)
                data["host_load"] = load.to_json() if load is not None else None
            failed: str | None = None
            try:
                req = capture_request(ep.anomaly(), d, furthest_step=max(0, job.furthest_step()),
                                      step_time_s=self.detectors.baseline_step_time_s(job_id), capture=self.s.capture)
                res = self._arm(job_id, req, now, dry_run=d.action == "would_arm")
                if res.refused is not None:
                    failed = refusal_text(res.refused)
                else:
                    data["start_step"] = res.start_step
                    if d.action == "arm":
                        cid, status = res.capture_id, None
                    else:  # observe mode: counted as an arm, so the gap, caps and cooldown apply as in act mode
                        self._would += 1
                        cid, status = f"would-{job_id}-{int(now)}-{self._would}", "would_arm"
                        b.history.record(d, now, cid)
                    data["capture_id"] = cid if d.action == "arm" else None
                    data["covers"] = [e.episode_id for e in b.armed(ep.episode_id, cid, now, covered=res.rank_list,
                                                                     status=status, start_step=res.start_step,
                                                                     step_time_s=res.step_time_s)]
                    armed.update(data["covers"])
            except ControlError as exc:
                failed = f"{exc.code}: {exc.message}"
            except (KeyError, TypeError, ValueError) as exc:  # planner errors are shown, never hidden
                failed = f"plan_failed: {exc}"
            if failed is not None:
                b.arm_failed(ep.episode_id, now, failed)
                data.update(action="suppress", reason=failed)
            self.emit(TYPE_ARM_DECISION, job_id, data)
        self._tell_load_explained(job_id, b)
        self._save(b)
        return armed

    def _tell_load_explained(self, job_id: str, b: JobEpisodes) -> None:
        """One non-paging ``arm_decision`` (suppress, ``explained_by_host_load``, with the host-load evidence) for
        each episode that began to wait as explained by its hosts' load."""
        for ep in b.open.values():
            if ep.waiting != "explained_by_host_load":
                self._load_told.pop(ep.episode_id, None)  # told again if it is explained again later
                continue
            if ep.episode_id in self._load_told:
                continue
            self._load_told[ep.episode_id] = None
            while len(self._load_told) > MAX_LOAD_TOLD:
                self._load_told.pop(next(iter(self._load_told)))
            self.emit(TYPE_ARM_DECISION, job_id, {
                "anomaly": ep.kind, "step": ep.last_step, "action": "suppress", "reason": "explained_by_host_load",
                "episode_id": ep.episode_id, "magnitude": round(ep.magnitude, 4),
                "host_load": b.load_evidence.get(ep.episode_id), "explained_count": b.load_explained})

    # -- captures ---------------------------------------------------------------------------------------------------
    def capture_ended(self, cap: lc.Capture, events: Iterable[lc.Event], now: float) -> None:
        """A capture left the states that hold the job's config slot: hand its verdict (status, the ranks it
        names, most suspect first, and the ranks a targeted capture waited for: :func:`waited_ranks`) or the state
        it ended in to the job's episodes; publish a rotation or a follow-up asked."""
        b = self.books.get(cap.job_id)
        if b is None or lc.is_withdrawn(cap):  # a withdrawal is the book's own (withdraw_returned)
            return
        status, named, waited = cap.state.value, tuple[int, ...](), tuple[int, ...]()
        for ev in events:
            if ev.type == TYPE_SUSPECT_RANKS:
                status = str(ev.data.get("status") or status)
                named = tuple(int(s["rank"]) for s in ev.data.get("suspects") or ()
                              if isinstance(s, Mapping) and isinstance(s.get("rank"), int))
                waited = waited_ranks(cap, ev.data.get("waited_for"))
        self._publish(cap.job_id, b.capture_ended(cap.capture_id, now, status, named, waited))
        self._next_run[cap.job_id] = 0.0  # the slot is free: the next tick runs the queue

    # -- output -----------------------------------------------------------------------------------------------------
    def _publish(self, job_id: str, events: Iterable[lc.Event]) -> None:
        for ev in events:
            self.emit(ev.type, job_id, dict(ev.data), event_id=ev.event_id)
        b = self.books.get(job_id)
        if b is not None:
            self._save(b)

    def _save(self, b: JobEpisodes) -> None:
        for ep in b.take_dirty():
            self.store.save_episode(ep.episode_id, ep.job_id, ep.closed_unix_s is None, ep.updated_unix_s,
                                    ep.to_json())

    def view(self, job_id: str | None, now: float) -> list[dict[str, Any]]:
        """For ``status``: per job, its open episodes in queue order, then the last closed ones (JSON)."""
        return [v for j, b in sorted(self.books.items()) if job_id in (None, j) for v in b.view(now)]
