"""Anomaly episodes of one job and the order in which they are captured (pure; time passed in, seconds).

An anomaly is an episode: opened by the first report of a finding, updated while it lasts (magnitude, ranks,
stage), closed when it ends. Every open episode that wants a capture waits in one queue per job, ordered by value;
the :class:`~profwatch.core.arming.policy.ArmingPolicy` decides each in that order and the first that passes is armed.
An episode that could not be captured stays in the queue while it lasts: it is never dropped.

One open episode per (job, kind, scope): the record, its key and the queue order are
``daemon/profwatch/core/arming/episode_record.py``. New kinds (``structural_imbalance``, ``drift``, ...) are
handled by the same rules. ``step_spike`` is an event, never an episode (it was over before
any capture could start).
"""

from __future__ import annotations

import hashlib
import math
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from profwatch.core.alerts.event_types import (
    TYPE_CULPRIT_ROTATES,
    TYPE_EPISODE_CLOSED,
    TYPE_EPISODE_OPENED,
    TYPE_EPISODE_UPDATED,
    TYPE_LEVEL_LEARNED,
)
from profwatch.core.arming.episode_record import (
    CAPTURED,
    VERDICTS,
    Episode,
    EpisodeCapture,
    episode_key,
    value_key,
)
from profwatch.core.arming.policy import (
    HOUR_S,
    JOB_HOLDS,
    ArmDecision,
    ArmHistory,
    ArmingPolicy,
    withdrawable,
)
from profwatch.core.arming.settings import ArmingSettings
from profwatch.core.arming.targeting import JobTopology
from profwatch.core.capture.lifecycle import Event
from profwatch.core.detection.types import Anomaly
from profwatch.core.fleet.host_load import LoadExplanation

__all__ = ["Episode", "EpisodeCapture", "JobEpisodes", "episode_key", "value_key"]  # the record's names too

NOT_EPISODES = frozenset({"step_spike"})
"""Kinds that are events only: a transient was over before any capture could start."""
STANDING_KINDS = frozenset({"periodic_spike", "structural_imbalance", "drift", "slow_from_start"})
"""Kinds their detector reports once per level: the episode stays open until its job ends or starts a new
generation (quiet steps do not close it)."""
MAX_OPEN = 64
"""Open episodes per job (memory bound); a new one beyond it closes the least recently updated (``evicted``)."""
MAX_CLOSED = 16
"""Closed episodes kept per job (``status`` shows them; the store keeps them all)."""
MAX_CAPTURES = 16
"""Captures remembered per episode."""
MAX_TOPS = 8
"""Top ranks remembered per episode key across episodes (rotation across episodes)."""
MAX_TRAIL = 16
"""Ranks remembered per ranked key in its trail of named ranks (the most recently named)."""
NAMED_GAP_S = 120.0
"""A rank a key's episodes named again after this long without naming it (s) starts a new stretch of the trail: a
rotation's hold is twice its longest *unbroken* hot period (the detector names a slow rank at every tick, so a
gap this long is a rank that healed; from first to last naming, two one-minute hot periods 50 minutes apart held a
real straggler on that key for 6120 s)."""
PERSIST_S = 300.0
PERSIST_STEPS = 60
"""An episode opened on a key whose culprit rotates is a slow rank of its own once it lasted this long (seconds and
steps, both) and twice the longest episode of the rotation (a persistent change: >= 5 minutes and >= 60 steps)."""
LOAD_KINDS = frozenset({"step_regression", "drift"})
"""Job-wide kinds a host-load move can explain (``explained_by_host_load``, :meth:`JobEpisodes.next_arm`): a job
slower because its hosts' CPUs are shared is not a change in the job (``daemon/profwatch/core/fleet/host_load.py``)."""
MAX_LOAD_EVIDENCE = 64
"""Host-load evidence kept per job (the newest episodes')."""
EXPLAINED_GROWTH = 0.5
"""A job-wide ``step_regression`` that opens while a known slow rank holds (an open ranked episode whose ranks the
job's latest verdict named, alone) is that rank's finding, not a change of its own, while the job step time it
reached, divided by the growth of the ranks' own excess since that verdict, stays less than this much above the job
step time at the verdict (relative): in a synchronous job every step waits for the slow rank, so each move of the
host's load re-opened a job-wide change naming the same rank again (a 3x rank under load wandering x0.9-1.3 took 4
captures an hour, all naming it). Host load on a shared box moves a job by +-10-45 %; a whole job 2x slower on top of
the slow rank (+100 %) is captured as its own. The same bound holds for a level found normal: within the hour of a
verdict of a capture of every rank that found nobody (``no_suspect``), a job-wide change that reaches less than this
much above the job step time of that capture's window, by a move of less than this much from its own reference, is host
load's (load moves alone took 3-5 captures an hour, each finding nobody, in the 4-rank load simulation)."""


@dataclass(frozen=True, slots=True)
class _Ended:
    """A capture that ended: its window's first step, the ranks it covered (None: all), when it was armed, how it
    ended and the ranks its verdict named."""

    capture_id: str
    start: int | None
    covered: frozenset[int] | None
    armed_unix_s: float
    status: str
    named: tuple[int, ...]


def _onset(anomaly: Anomaly) -> int:
    """The first step of a report's evidence: ``detail.first_step`` (a change point), else the first step of the
    window it judged (``detail.window_steps``: a rank outlier fires once a rank outlied in enough of its last
    steps), else its step."""
    d = anomaly.detail or {}
    first = d.get("first_step")
    if isinstance(first, int) and not isinstance(first, bool):
        return first
    window = d.get("window_steps")
    if isinstance(window, int) and not isinstance(window, bool) and window > 0:
        return anomaly.step - window + 1
    return anomaly.step


def _saw(status: str, named: tuple[int, ...], ranks: tuple[int, ...]) -> bool:
    """Whether a capture that ended with ``status`` naming ``named`` shows what an episode naming ``ranks`` (empty: job-wide) reports, so it counts
    as that episode's capture (:meth:`JobEpisodes._covered_at_open`): an outcome without a verdict that still
    captured (``simulated``, ``would_arm``: replay), or a verdict other than ``no_suspect`` that, for ranks, names
    one of them. A cancelled capture analysed nothing; a verdict naming other ranks (or nobody: ``partial``) did not
    find these: counted, a persistent straggler waited as ``captured_unchanged`` for good."""
    if status in ("simulated", "would_arm"):
        return True
    if status not in VERDICTS or status == "no_suspect":
        return False
    return not ranks or bool(set(ranks) & set(named))


def _rank_part(magnitude: float, detail: Mapping[str, Any], r: int) -> tuple[float, dict[str, Any]]:
    """Rank ``r``'s own size and detail in a report (or episode) of ``magnitude`` and ``detail`` naming it:
    its ``detail.excess`` when given and above 0, else ``magnitude`` (the report's one figure, its own when it named
    ``r`` alone); the detail with each per-rank map (``excess``, ``outlying_steps``, ``stage``: keys rank numbers)
    kept to ``r``. A part of an episode split by rank (:meth:`JobEpisodes._persistent_ranks`) carries this, never
    the figure of another rank's later report (a rank 1 at +50 % read "+19 %", rank 0's). Pure."""
    raw = detail.get("excess")
    excess = raw.get(r, raw.get(str(r))) if isinstance(raw, Mapping) else None
    mag = float(excess) if isinstance(excess, (int, float)) and not isinstance(excess, bool) and excess > 0 \
        else magnitude
    names = {r, str(r)}
    own = {k: ({rk: v for rk, v in v.items() if rk in names} if isinstance(v, Mapping) and v
               and all(isinstance(rk, int) or (isinstance(rk, str) and rk.isdigit()) for rk in v) else v)
           for k, v in detail.items()}
    return mag, own


def _found_no_suspect(status: str | None) -> bool:
    """Whether the outcome ``status`` of a capture whose verdict named no rank is a verdict (``no_suspect``, or a
    ``partial`` one naming no rank): it found no suspect, so it names no top rank for the rotation rule, whatever
    rank the detector named when it was armed (a false arm on a healthy rank 0 found nobody; counting the detector's
    rank 0 as its top made the real rank 1's capture, which named rank 1, a rotation 0 -> 1, ``culprit_rotates``, on
    the live serving pair). An outcome without a verdict (``simulated``/``would_arm``: replay; a cancelled or failed
    capture; None: in flight) is not one: there the detector's rank stands in for the verdict's. Callers ask only
    for a capture with no named rank (a verdict naming one has that rank as its top)."""
    return status is not None and status in VERDICTS


def _capture_tops(ep: Episode) -> list[tuple[int, str]]:
    """The top rank of each capture of ``ep`` with its capture id, oldest first: the verdict's first named rank,
    else, for a capture without a verdict (:func:`_found_no_suspect`: a verdict that named nobody has no top), the
    one rank the capture took that no earlier capture of it took or named (a report naming a new rank is
    why it was captured again; ``profwatch replay`` has no verdicts), else none for that capture. A capture armed
    for another episode that covered this one counts too: an MoE hot expert's first appearance is often captured
    as the job-wide step-time rise it causes, which covers the rank's episode; not counting it let a rotation take
    a third capture (``bench/bench_corpus.py``, class ``moe``; docs/detection.md)."""
    seen: set[int] = set()
    out: list[tuple[int, str]] = []
    for c in ep.captures:
        fresh = [r for r in c.ranks if r not in seen]
        top = c.named[0] if c.named else (fresh[0] if len(fresh) == 1 and not _found_no_suspect(c.status)
                                          else None)
        seen.update(c.ranks)
        seen.update(c.named)
        if top is not None:
            out.append((top, c.capture_id))
    return out


def _nobody_behind(ep: Episode) -> EpisodeCapture | None:
    """The capture of ``ep`` whose verdict found no suspect (``no_suspect``) when it is the episode's latest verdict
    and no capture of it is in flight, else None."""
    if ep.in_flight is not None:
        return None
    done = [c for c in ep.captures if c.status is not None and c.status in CAPTURED and c.status != "would_arm"]
    if not done:
        return None
    last = max(done, key=lambda c: c.armed_unix_s)
    return last if last.status == "no_suspect" else None


def _grown_past(ep: Episode, cap: EpisodeCapture, growth: float) -> bool:
    """Whether the :attr:`~Episode.level` of ``ep`` grew by ``growth`` (relative, ``[arming] recapture_growth``) over
    the level capture ``cap`` saw (:attr:`EpisodeCapture.level`; a capture stored without one counts as level 0, as
    :meth:`Episode.unchanged_since_capture` does)."""
    return ep.level >= (cap.level or 0.0) + growth


def _found_nobody(ep: Episode, growth: float) -> str | None:
    """The id of the capture whose verdict found no suspect (:func:`_nobody_behind`) when the episode's level has not
    grown by ``growth`` over the level that capture saw (:func:`_grown_past`), else None. A level grown since is a
    change the capture did not see: learning it as the job's new normal left a 3x job-wide slowdown that came while
    a +30 % load level was being captured never captured (the e2e demo's ``reference`` scenario beside two CPU
    hogs); such an episode is captured again instead, as new (:meth:`JobEpisodes._cooldown_since`)."""
    cap = _nobody_behind(ep)
    return cap.capture_id if cap is not None and not _grown_past(ep, cap, growth) else None


class JobEpisodes:
    """The episodes of one job and its arm budget (:class:`~profwatch.core.arming.policy.ArmHistory`).

    Args:
        job_id: the job.
        settings: ``[arming]`` (cooldown, gap, caps, ``episode_quiet_steps``, ``rotation_captures``).
        history: the job's arm history (a fresh one when None).

    Notes:
        Open: the first report of a key opens an episode (``episode_opened``); later reports of the key update it
        (``episode_updated``: magnitude, ranks, step). A report naming a rank that no capture of the episode
        covered or named marks it ``new_ranks``: it is captured again as a new episode would be (no cooldown).

        Close (:meth:`advance`): an episode holds while reports come, while its detector still names its ranks
        (``ongoing``: e.g. the rank-outlier detector's ranks that have not cleared), or, for a job-wide finding
        with a known step time before it, while the job step time stays above half the change
        (``step_time_s >= reference_s * (1 + magnitude / 2)``). It closes (``episode_closed``) once the job went
        ``episode_quiet_steps`` steps past the last step it held, never while its own capture is in flight; kinds of
        :data:`STANDING_KINDS` close only with :meth:`close_all` (job end, new generation).

        New change: a ``step_regression`` report of at least ``recapture_growth``, with its onset after the last
        report, on a job-wide episode already captured (a capture of it in flight too, unless that capture's window
        starts after the onset: it records the new level, :meth:`_new_change`) is a new change point (the detector
        re-learns at each fire): the old episode closes and the report opens a new one, captured as new (never held
        by the old one's cooldown; behind the capture in flight); a smaller one updates it (a capture in flight
        whose window starts after its onset then saw its level: :meth:`_seen_by_flight`). New normal: a job-wide
        ``step_regression`` episode whose latest capture found no suspect (``no_suspect``), whose level did not grow
        by ``recapture_growth`` over the level that capture saw (:func:`_found_nobody`: grown, it is captured again,
        without that capture's cooldown: :meth:`_cooldown_since`) and that held its level for
        ``episode_quiet_steps`` after the verdict, or that a new change point reaches, is closed with one
        ``level_learned`` event (old and new level, the capture) and reason ``level_learned``; else a new change
        closes it with reason ``new_change``. One that a level found normal explains (``explained_by_level``, below)
        is not: it was never captured itself, so it stays open (explained) until the verdict's hour is over and is
        then captured once (learned as the first was, should that capture find nobody too); closed on the other
        capture's verdict after ``episode_quiet_steps`` instead, a job-wide slowdown of up to +50 % was never
        captured nor compared with the reference.

        Explained: a job-wide ``step_regression`` never captured that a known slow rank explains (an open ranked
        episode holding every rank the job's latest verdict named; the job's level, its ranks' own growth taken out,
        under :data:`EXPLAINED_GROWTH` above the level at that verdict; without ranked episodes, the latest verdict
        of a capture of every rank; either for an hour after that verdict: :meth:`_explaining`) is not captured; it waits
        as ``explained_by_ranks`` until the rule no longer holds (:meth:`_explain`). So is one that a level found
        normal explains (the latest verdict, within the hour, of a capture of every rank that found nobody; the level
        reached and the move from the episode's reference each under :data:`EXPLAINED_GROWTH`): it waits as
        ``explained_by_level``.

        Budget (:meth:`next_arm`): the open episodes that want a capture (none of their own in flight, not
        rotating) are decided in :func:`value_key` order; the first that passes is armed. An episode captured
        already is not captured again while it lasts unchanged (``captured_unchanged``); once its level grew by
        ``recapture_growth`` since its last capture it is captured again after its cooldown, and at once when it
        names new ranks. An episode held by its
        own reason (cooldown, not armable) lets the next one go; a hold of the job (:data:`JOB_HOLDS`: capture in
        flight, min gap, hourly or byte cap) holds every episode after it too, which then wait "behind" it, but for
        the min gap, which holds no episode it would not hold itself (a new named-rank one after a job-wide arm:
        :func:`~profwatch.core.arming.policy.gap_holds`). Each
        waiting episode keeps its reason and, where time ends it, until when (``status`` shows both). Nothing is
        dropped: an episode waits while it is open. A capture covers every waiting episode whose ranks it covers
        (all ranks: every episode), so one capture serves a job-wide finding and the slow rank behind it.

        Verdicts (:meth:`capture_ended`): ``no_suspect`` releases the arm from the hourly cap (the next episode is
        not held by a capture that found nothing); an outcome outside :data:`CAPTURED` (failed, expired,
        incomplete) leaves the episode wanting a capture. When the last ``rotation_captures`` verdicts of the
        episode's own captures named a different top rank each time, each no longer slow at the next capture
        (:meth:`_moved`), the culprit rotates: ``culprit_rotates`` is
        published once and the episode is not captured again. The same holds across the episodes of one key
        (:meth:`_rotation_across`): the rotation's captures then leave the hourly cap, and later episodes of the key
        wait until they persist (:meth:`_persists`). A capture counts for an episode that opens after it when its
        window started inside the report's evidence (``first_step``, else the rank outlier's ``window_steps``) and
        it covered the ranks: in flight, or ended lately, and its outcome showed them (:func:`_saw`: a verdict
        naming one of the ranks; a capture cancelled or whose verdict names other ranks or nobody leaves the episode
        wanting its own, also when it ends after the episode opened). And a rotation is recognised from
        the ranks named (:meth:`_rotation_named`): once a key's episodes took ``rotation_captures`` captures within
        the hour, a move of the ranks they name is a rotation at once, so a rotation takes at most
        ``rotation_captures`` captures even when no verdict names a top rank. A ``partial`` verdict of the episode's own targeted
        capture whose ranks waited for ranks it did not hold (``waited``) asks for one follow-up: the episode wants a
        capture again at once (no cooldown: the waited-for ranks are new to it), through the job's budget (gap,
        hourly and byte caps), covering those ranks (:attr:`Episode.follow_ranks`,
        :func:`~profwatch.core.arming.targeting.plan_follow_up`); a follow-up's own ``partial`` asks for none (one
        per capture that was not itself a follow-up), nor does a fixed ``[arming] rank_list`` (it would capture the
        same ranks again) nor an episode whose culprit rotates (it is not captured again). A follow-up larger than the
        byte cap itself is dropped in :meth:`next_arm`.

        Memory: at most :data:`MAX_OPEN` open and :data:`MAX_CLOSED` closed episodes, :data:`MAX_CAPTURES` captures
        each.
    """

    def __init__(self, job_id: str, settings: ArmingSettings, history: ArmHistory | None = None) -> None:
        self.job_id = job_id
        self.settings = settings
        self.history = history or ArmHistory()
        self.open: dict[str, Episode] = {}
        self.closed: deque[Episode] = deque(maxlen=MAX_CLOSED)
        self._dirty: dict[str, Episode] = {}
        self._flight: dict[str, tuple[int | None, frozenset[int] | None, float]] = {}  # -> (start, covered, armed)
        self._ended: deque[_Ended] = deque(maxlen=MAX_TOPS)  # captures that ended lately, newest last
        # ranked key -> rank -> (first, last) named in its current stretch, and the job's step at the first
        self._trail: dict[str, dict[int, tuple[float, float, int]]] = {}
        self._key_captures: dict[str, list[tuple[str, float]]] = {}  # ranked key -> its episodes' (capture, armed)
        # key -> (top rank, episode, capture, armed, the ranks its verdict named)
        self._tops: dict[str, deque[tuple[int, str, str, float, tuple[int, ...]]]] = {}
        self.rotating: dict[str, tuple[tuple[int, ...], float]] = {}  # key -> (the rotation's ranks, longest s)
        self._named_since: dict[str, dict[int, tuple[float, int]]] = {}  # rotating episode -> rank -> (since, step)
        self._named_span: dict[str, float] = {}  # rotating episode -> longest a rank of it stayed named (s)
        self._rank_sizes: dict[str, dict[int, tuple[float, dict[str, Any]]]] = {}  # open ranked episode -> rank ->
        # (magnitude, detail) of the latest report naming it, read by :func:`_rank_part` at a split (the report's
        # own objects, shared by its ranks: O(1) each; at most MAX_TRAIL ranks each)
        self._step_s: float | None = None  # the job step time the last advance was given (s)
        self._confirmed: dict[str, tuple[float, float]] = {}  # open ranked episode -> (job step s, its level) at
        # the latest verdict that named its ranks
        self._last_named: tuple[int, ...] = ()  # the ranks the job's latest verdict named (empty: none, no_suspect)
        self._verdict: tuple[str, tuple[int, ...], float, float] | None = None  # the latest verdict, when it was
        # of a capture of every rank naming ranks or finding nobody: (capture, named (empty: no_suspect), job step s
        # of its window, unix s)
        self._verdict_at = -math.inf  # when the latest verdict came (unix s; restore keeps the latest)
        self._run_since = -math.inf  # when the job's current generation began (unix s; new_run): a capture armed
        # before it (an analysing one finishes after a restart of its job) gives the new run no verdict
        self.withdrawn = 0
        """Captures withdrawn because their excursion came back before the window (:meth:`withdraw_returned`)."""
        self.load_explained = 0
        """Job-wide episodes that waited as ``explained_by_host_load`` (each counted once per wait; :meth:`next_arm`)."""
        self.load_evidence: dict[str, dict[str, Any]] = {}
        """Episode id -> its latest host-load evidence (``LoadExplanation.to_json``; at most :data:`MAX_LOAD_EVIDENCE`)."""

    # -- bookkeeping ------------------------------------------------------------------------------------------------
    def _touch(self, ep: Episode) -> None:
        self._dirty[ep.episode_id] = ep

    def take_dirty(self) -> list[Episode]:
        """Episodes changed since the last call (the shell saves them)."""
        out = list(self._dirty.values())
        self._dirty.clear()
        return out

    def restore(self, episodes: Iterable[Episode]) -> None:
        """Seed from the state store after a restart (oldest first): open ones resume, closed ones are listed; what
        explains a job-wide change (:meth:`_explaining`) comes back from them (:meth:`_restore_verdict`)."""
        for ep in episodes:
            if ep.closed_unix_s is None:
                self.open[ep.key] = ep
                if ep.confirmed is not None:
                    self._confirmed[ep.episode_id] = ep.confirmed
            else:
                self.closed.append(ep)
            self._restore_verdict(ep)

    def _restore_verdict(self, ep: Episode) -> None:
        """The job's latest verdict (what it named; for a capture of every rank naming ranks, the reference of
        :meth:`_explaining`) from the stored captures of ``ep``, when later than any restored before; an episode
        closed by a new generation (:meth:`new_run`) forgets the verdicts before it, as the run did. Without it a
        restart forgot the known slow rank, and a job-wide change it explained was captured again as new."""
        if ep.close_reason == "new_generation":
            self._run_since = max(self._run_since, ep.closed_unix_s or 0.0)
            if (ep.closed_unix_s or 0.0) >= self._verdict_at:
                self._last_named, self._verdict, self._verdict_at = (), None, ep.closed_unix_s or 0.0
        for c in ep.captures:
            at = c.verdict_unix_s
            if at is None or c.status not in VERDICTS or at < self._verdict_at or c.armed_unix_s < self._run_since:
                continue
            self._verdict_at = at
            self._last_named = c.named if c.status != "no_suspect" else ()
            self._verdict = ((c.capture_id, self._last_named, c.job_step_s, at)
                             if c.whole and (self._last_named or c.status == "no_suspect")
                             and c.job_step_s is not None else None)

    def find(self, episode_id: str) -> Episode | None:
        return next((e for e in (*self.open.values(), *self.closed) if e.episode_id == episode_id), None)

    def _event(self, type_: str, ep: Episode, suffix: str, **data: Any) -> Event:
        return Event(type_, {**ep.summary(), **data}, event_id=f"{type_.split('.')[2]}-{ep.episode_id}{suffix}")

    # -- reports ------------------------------------------------------------------------------------------------------
    def observe(self, anomaly: Anomaly, now_unix_s: float) -> tuple[Episode | None, list[Event]]:
        """Fold one detector report into its episode; return the episode (None for :data:`NOT_EPISODES`) and the
        events (``episode_opened`` or ``episode_updated``)."""
        if anomaly.kind in NOT_EPISODES:
            return None, []
        key = episode_key(anomaly)
        ep = self.open.get(key)
        ranks = tuple(sorted(set(anomaly.ranks)))
        detail = dict(anomaly.detail or {})
        out: list[Event] = []
        onset = _onset(anomaly)
        sizes = {r: (anomaly.magnitude, detail) for r in ranks[:MAX_TRAIL]}
        if ep is not None and self._new_change(ep, anomaly, onset):
            # a new change point of at least recapture_growth on a job-wide level already captured: a change of its
            # own (e.g. a straggler on top of a host-load level), never an update held by that episode's cooldown
            found = _found_nobody(ep, self.settings.recapture_growth)
            if found is not None:  # its capture found nobody behind the level it leaves: that level is normal
                base = detail.get("baseline_s")
                now_level = float(base) if isinstance(base, (int, float)) and base > 0 else None
                out += self._learn(ep, now_unix_s, anomaly.step, now_level, found)
            else:
                out.append(self._close(ep, now_unix_s, "new_change"))
            ep = None
        if ep is None:
            if len(self.open) >= MAX_OPEN:
                oldest = min(self.open.values(), key=lambda e: e.updated_unix_s)
                out.append(self._close(oldest, now_unix_s, "evicted"))
            digest = hashlib.sha256(f"{self.job_id}\0{key}\0{now_unix_s!r}\0{anomaly.step}".encode()).hexdigest()
            base = detail.get("baseline_s")
            ep = Episode(f"ep-{digest[:12]}", self.job_id, anomaly.kind, key.split("/", 1)[1], now_unix_s,
                         anomaly.step, now_unix_s, anomaly.step, anomaly.step, anomaly.magnitude, anomaly.magnitude,
                         ranks, detail, float(base) if isinstance(base, (int, float)) and base > 0 else None)
            rot = self.rotating.get(key)
            if rot is not None and ranks:  # the culprit of this key rotates across episodes: one more of them
                ep.rotation, ep.rotating_member = rot[0], True
            self.open[key] = ep
            self._keep_sizes(ep, sizes)
            self._touch(ep)
            out.append(self._event(TYPE_EPISODE_OPENED, ep, "", detail=detail))
            out += self._covered_at_open(ep, onset, now_unix_s)
            out += self._named(ep, ranks, now_unix_s, anomaly.step)
            return ep, [*out, *self._explain(ep, now_unix_s)]
        fresh = sorted(set(ranks) - ep.seen_ranks)
        ep.magnitude = anomaly.magnitude
        ep.peak_magnitude = max(ep.peak_magnitude, anomaly.magnitude)
        ep.last_step = max(ep.last_step, anomaly.step)
        ep.last_ongoing_step = max(ep.last_ongoing_step, anomaly.step)
        ep.updated_unix_s = now_unix_s
        ep.reports += 1
        ep.detail = detail
        ep.ranks = tuple(sorted(set(ep.ranks) | set(ranks)))
        self._keep_sizes(ep, sizes)
        if fresh and ep.captures:
            ep.new_ranks = True
        self._seen_by_flight(ep, onset)
        self._touch(ep)
        out.append(self._event(TYPE_EPISODE_UPDATED, ep, f"-{ep.reports}", reason="reported", new_ranks=fresh,
                               detail=detail))
        return ep, [*out, *self._named(ep, ranks, now_unix_s, anomaly.step), *self._explain(ep, now_unix_s)]

    def _window_after(self, capture_id: str, onset: int) -> bool:
        """Whether in-flight ``capture_id``'s window starts after ``onset`` (a step), so that it records what began
        there; unknown (no window start given, or a capture armed before a restart whose stored record gave none:
        :meth:`resume_flight`): not known to, False."""
        flight = self._flight.get(capture_id)
        return flight is not None and flight[0] is not None and flight[0] > onset

    def _new_change(self, ep: Episode, anomaly: Anomaly, onset: int) -> bool:
        """Whether ``anomaly`` (its evidence from step ``onset``) is a new change point on open episode ``ep`` rather
        than an update of it: a job-wide ``step_regression`` of at least ``recapture_growth`` on a job-wide episode
        already captured, with its onset after the episode's last report and, while a capture of the episode is in
        flight, not before that capture's window (:meth:`_window_after`: a window that starts after the onset
        records the new level, the report is then an update the capture sees). Folded into the in-flight capture's
        episode, a 3x slowdown that came while a +30 % load level was being captured was learned as the job's new
        normal on that capture's ``no_suspect`` and never captured."""
        if (ep.ranks or anomaly.ranks or anomaly.kind != "step_regression" or not ep.captures
                or anomaly.magnitude < self.settings.recapture_growth or onset <= ep.last_step):
            return False
        flying = ep.in_flight
        return flying is None or not self._window_after(flying, onset)

    def _seen_by_flight(self, ep: Episode, onset: int) -> None:
        """After a report (evidence from step ``onset``) updated ``ep``: each capture of it in flight whose window
        starts after the onset (:meth:`_window_after`) records the level the report gives, so that level is the one
        it saw (:attr:`EpisodeCapture.level`; :func:`_found_nobody` learns a level only when no larger than that by
        ``recapture_growth``)."""
        for c in ep.captures:
            if c.status is None and self._window_after(c.capture_id, onset):
                c.level = ep.level

    def _covered_at_open(self, ep: Episode, onset: int, now_unix_s: float) -> list[Event]:
        """A capture whose window started after ``onset`` (the first step of the new episode's evidence) and covered
        its ranks saw it: a capture still in flight, else one that ended lately whose outcome shows it (:func:`_saw`:
        a verdict naming one of the episode's ranks, or any verdict but ``no_suspect`` for a job-wide episode; a
        replayed capture, which has no verdict; never a cancelled one) (a hot MoE expert's first appearance is often captured as the job-wide rise it causes before
        the rank outlier detector, whose window was paused by that capture, names the rank: that capture is the
        rotation's first). Returns ``culprit_rotates`` when that capture completes a rotation across episodes."""
        for cid, (start, covered, armed) in self._flight.items():
            if start is not None and start > onset and (covered is None or (ep.ranks and set(ep.ranks) <= covered)):
                self._add_capture(ep, EpisodeCapture(cid, armed, ep.ranks, False, level=ep.level))
                return []
        for done in reversed(self._ended):
            if (done.start is not None and onset < done.start <= ep.opened_step and _saw(done.status, done.named, ep.ranks)
                    and (done.covered is None or (ep.ranks and set(ep.ranks) <= done.covered))):
                cap = EpisodeCapture(done.capture_id, done.armed_unix_s, ep.ranks, False, done.status, done.named,
                                     level=ep.level)
                self._add_capture(ep, cap)
                return self._rotation_across(ep, [cap], now_unix_s)
        return []

    def _named(self, ep: Episode, ranks: tuple[int, ...], now_unix_s: float, step: int) -> list[Event]:
        """Record the ranks an episode of a ranked key names now (a report, or its detector still naming them, at
        the job's ``step``) in the key's trail, then recognise a rotation from the names (:meth:`_rotation_named`)."""
        if not ep.ranks:
            return []
        trail = self._trail.setdefault(ep.key, {})
        for r in ranks:  # a rank named again after a healthy gap starts a new stretch: the hold is a hot period's
            last = trail.get(r)
            if last is not None and now_unix_s - last[1] <= NAMED_GAP_S:
                trail[r] = (last[0], now_unix_s, last[2])
            else:
                trail[r] = (now_unix_s, now_unix_s, step)
        if len(trail) > MAX_TRAIL:
            for r in sorted(trail, key=lambda r: trail[r][1])[:len(trail) - MAX_TRAIL]:
                del trail[r]
        if len(self._trail) > MAX_OPEN:  # keys of closed episodes go first (memory bound)
            stale = [k for k in self._trail if k not in self.open and k != ep.key]
            for k in stale[:len(self._trail) - MAX_OPEN]:
                del self._trail[k]
        return self._rotation_named(ep, now_unix_s)

    def advance(self, now_unix_s: float, *, furthest_step: int | None, step_time_s: float | None = None,
                ongoing: Mapping[str, frozenset[int]] | None = None,
                unit_steps: Mapping[int, int] | None = None) -> list[Event]:
        """Judge which episodes still hold at the job's ``furthest_step``; close those quiet for
        ``episode_quiet_steps`` (rules in the class Notes). ``ongoing``: per kind, the ranks its detector still
        names (kinds absent: no such sign); ``step_time_s``: the job step time now (None: unknown);
        ``unit_steps``: per rank, the furthest step of its unit when the job is split into units with unrelated
        step counters (serving replicas; None: one unit): an episode naming ranks is then judged on its ranks'
        own counter (the furthest of them), never on another replica's."""
        if step_time_s is not None and step_time_s > 0:
            self._step_s = step_time_s
        if furthest_step is None:
            return []
        job_furthest = furthest_step
        out: list[Event] = []
        for ep in list(self.open.values()):
            if ep.kind in STANDING_KINDS:
                continue
            out += self._explain(ep, now_unix_s)
            furthest_step = job_furthest
            if unit_steps is not None and ep.ranks:
                own = [s for r in ep.ranks if (s := unit_steps.get(r)) is not None]
                if own:
                    furthest_step = max(own)
            held = False
            named = (ongoing or {}).get(ep.kind)
            if ep.rotation and not ep.rotating_member and named is not None:
                out += self._persistent_ranks(ep, named, now_unix_s, furthest_step)
            if ep.ranks and named is not None:
                still = tuple(r for r in ep.ranks if r in named)
                if still:
                    held = True
                    if still != ep.ranks:
                        ep.ranks = still
                        self._touch(ep)
                        out.append(self._event(TYPE_EPISODE_UPDATED, ep, f"-{ep.reports}-r{','.join(map(str, still))}",
                                               reason="ranks_cleared"))
                    out += self._named(ep, still, now_unix_s, furthest_step)
            elif not ep.ranks and ep.reference_s is not None and step_time_s is not None:
                held = step_time_s >= ep.reference_s * (1.0 + ep.magnitude / 2.0)
                found = _found_nobody(ep, self.settings.recapture_growth) if held else None
                if found is not None and ep.kind == "step_regression":
                    if ep.settle_step is None:
                        ep.settle_step = furthest_step
                        self._touch(ep)
                    elif furthest_step - ep.settle_step >= self.settings.episode_quiet_steps:
                        out += self._learn(ep, now_unix_s, furthest_step, step_time_s, found)
                        continue
                elif ep.settle_step is not None:
                    ep.settle_step = None  # not at its level (or captured again): the clock starts over
                    self._touch(ep)
            if ep.rotating_member and ep.rotation and self._persists(ep, now_unix_s, furthest_step, held):
                ep.rotation, ep.rotating_member = (), False
                self._touch(ep)
                out.append(self._event(
                    TYPE_EPISODE_UPDATED, ep, "-persistent", reason="persistent",
                    text=f"ranks {', '.join(map(str, ep.ranks[:16]))} stayed slow for "
                         f"{now_unix_s - ep.opened_unix_s:.0f} s ({furthest_step - ep.opened_step} steps), longer "
                         "than the rotating culprit stays anywhere: a slow rank of its own, captured as new"))
            if held and furthest_step > ep.last_ongoing_step:
                if furthest_step - ep.last_ongoing_step >= max(1, self.settings.episode_quiet_steps // 4):
                    self._touch(ep)  # stored now and then, not every second: a restart may close it a bit early
                ep.last_ongoing_step = furthest_step
            quiet = furthest_step - max(ep.last_ongoing_step, ep.last_step)
            if quiet >= self.settings.episode_quiet_steps and ep.in_flight is None:
                out.append(self._close(ep, now_unix_s, "quiet"))
        return out

    def _persistent_ranks(self, ep: Episode, named: frozenset[int], now_unix_s: float,
                          furthest_step: int) -> list[Event]:
        """In an episode whose culprit rotates, a rank its detector has named without a break for
        :data:`PERSIST_S` seconds and :data:`PERSIST_STEPS` steps, and twice as long as any rank of the rotation
        stayed named, is a slow rank of its own: it opens its own episode (scope ``<scope>+ranks:<r>``, reason
        ``persistent``), captured as new; it holds while the detector names the rank."""
        since = self._named_since.setdefault(ep.episode_id, {})
        longest = self._named_span.get(ep.episode_id, 0.0)
        for r in [r for r in since if r not in named]:
            longest = max(longest, now_unix_s - since.pop(r)[0])
        self._named_span[ep.episode_id] = longest
        out: list[Event] = []
        for r in sorted(named.intersection(ep.ranks)):
            t0, s0 = since.setdefault(r, (now_unix_s, furthest_step))
            scope = f"{ep.scope}+ranks:{r}"
            key = f"{ep.kind}/{scope}"
            if (key in self.open or now_unix_s - t0 < max(PERSIST_S, 2.0 * longest)
                    or furthest_step - s0 < PERSIST_STEPS or len(self.open) >= MAX_OPEN):
                continue
            mag, detail = _rank_part(*self._rank_sizes.get(ep.episode_id, {}).get(r, (ep.magnitude, ep.detail)), r)
            digest = hashlib.sha256(f"{self.job_id}\0{key}\0{now_unix_s!r}\0{furthest_step}".encode()).hexdigest()
            new = Episode(f"ep-{digest[:12]}", self.job_id, ep.kind, scope, now_unix_s, s0, now_unix_s,
                          furthest_step, furthest_step, mag, mag, (r,), detail)
            self._rank_sizes[new.episode_id] = {r: (mag, detail)}
            self.open[key] = new
            self._touch(new)
            out.append(self._event(
                TYPE_EPISODE_OPENED, new, "", reason="persistent", rotating_episode=ep.episode_id,
                text=f"rank {r} has stayed slow for {now_unix_s - t0:.0f} s ({furthest_step - s0} steps) while the "
                     f"culprit of {ep.key} rotates: a slow rank of its own, captured as new"))
        return out

    def _keep_sizes(self, ep: Episode, sizes: Mapping[int, tuple[float, dict[str, Any]]]) -> None:
        """Remember, per rank, the magnitude and detail of the latest report naming it folded into ranked episode
        ``ep`` (:func:`_rank_part` reads the rank's own part of them at a split; the newest :data:`MAX_TRAIL`
        ranks)."""
        if not sizes:
            return
        kept = self._rank_sizes.setdefault(ep.episode_id, {})
        for r, part in sizes.items():
            kept.pop(r, None)
            kept[r] = part
        for r in list(kept)[:max(0, len(kept) - MAX_TRAIL)]:
            del kept[r]

    def _persists(self, ep: Episode, now_unix_s: float, furthest_step: int, held: bool = False) -> bool:
        """Whether an episode opened on a rotating key lasted long enough to be a slow rank of its own
        (:data:`PERSIST_S`, :data:`PERSIST_STEPS`, twice the longest episode of the rotation), counted from the
        episode's opening or, when its one rank is the only rank the key's episodes named since the rank's stretch
        in the key's trail began (gaps under :data:`NAMED_GAP_S`), from that stretch's start: a detector reports one
        slow rank as many short episodes (each closes quiet between reports) and none of them alone lasted 300 s (a
        live serving pair's real +30 % rank, named 14 s after its onset, was held as a rotation member for 5 min in
        9 episodes). A rank that shares the stretch with others (a hot spot moving among them) counts from its
        episode. Still slow: ``held`` (its detector names it now) or a report within a quarter of
        ``episode_quiet_steps`` (a job stepping faster than that per pass of the coordinator never met the second
        alone)."""
        longest = self.rotating.get(ep.key, ((), 0.0))[1]
        since_s, since_step = ep.opened_unix_s, ep.opened_step
        trail = self._trail.get(ep.key, {})
        if len(ep.ranks) == 1 and ep.ranks[0] in trail:
            r = ep.ranks[0]
            first, _, first_step = trail[r]
            if all(last < first for o, (_, last, _) in trail.items() if o != r):
                since_s = min(since_s, first)
                since_step = min(since_step, first_step)
        age = now_unix_s - since_s
        return (age >= max(PERSIST_S, 2.0 * longest) and furthest_step - since_step >= PERSIST_STEPS
                and (held or ep.last_ongoing_step >= furthest_step - max(1, self.settings.episode_quiet_steps // 4)))

    def _learn(self, ep: Episode, now_unix_s: float, step: int, level_s: float | None,
               capture_id: str) -> list[Event]:
        """Close a job-wide episode whose capture ``capture_id`` found no suspect and that stayed at its level
        (``level_s``, seconds per step; None unknown): the job's new normal, one ``level_learned`` event (old and new
        level, the capture), then ``episode_closed`` with reason ``level_learned``."""
        old = ep.reference_s
        change = level_s / old - 1.0 if old and level_s else ep.level
        new = f"{level_s:.4g} s" if level_s else "its new level"
        ev = self._event(
            TYPE_LEVEL_LEARNED, ep, "-learned", old_level_s=old, new_level_s=level_s, change=round(change, 6),
            capture_id=capture_id, step=step,
            text=f"the job has run at {new} per step ({change:+.0%} since {old:.4g} s) since step {ep.opened_step}; "
                 f"capture {capture_id} found no suspect rank: this is the job's new normal, later changes are judged "
                 "against it" if old else
                 f"the job stayed at its new level since step {ep.opened_step}; capture {capture_id} found no suspect "
                 "rank: this is the job's new normal, later changes are judged against it")
        return [ev, self._close(ep, now_unix_s, "level_learned")]

    def new_run(self, now_unix_s: float, reason: str) -> list[Event]:
        """The job started a new generation (a restart, a resize, a new run under its id): close every open episode
        and start a fresh budget (the old run's arms never hold the new run's; the bytes-per-step estimate stays).
        The old run's verdicts are forgotten, and so is one that comes later for a capture armed before now
        (:meth:`_of_earlier_run`: an analysing capture finishes after its job restarted)."""
        fresh = ArmHistory()
        fresh.bytes_per_rank_step = self.history.bytes_per_rank_step
        self.history = fresh
        self._flight.clear()
        self._ended.clear()
        self._trail.clear()
        self._key_captures.clear()
        self._tops.clear()
        self.rotating.clear()
        self._named_since.clear()
        self._named_span.clear()
        self._rank_sizes.clear()
        self._confirmed.clear()
        self._last_named = ()
        self._verdict = None
        self._verdict_at = self._run_since = now_unix_s
        return self.close_all(now_unix_s, reason)

    def close_all(self, now_unix_s: float, reason: str) -> list[Event]:
        """Close every open episode (the job ended, or started a new generation: ``reason``)."""
        return [self._close(ep, now_unix_s, reason) for ep in list(self.open.values())]

    def _close(self, ep: Episode, now_unix_s: float, reason: str, **extra: Any) -> Event:
        self.open.pop(ep.key, None)
        self._named_since.pop(ep.episode_id, None)
        self._named_span.pop(ep.episode_id, None)
        self._rank_sizes.pop(ep.episode_id, None)
        self._confirmed.pop(ep.episode_id, None)
        ep.closed_unix_s, ep.close_reason = now_unix_s, reason
        self.closed.append(ep)
        self._touch(ep)
        captured = any(c.status is None or c.status in CAPTURED for c in ep.captures)
        return self._event(TYPE_EPISODE_CLOSED, ep, "", reason=reason, captured=captured,
                           waited_for=None if captured else (ep.waiting or None),
                           captures=[{"capture_id": c.capture_id, "status": c.status} for c in ep.captures[-8:]],
                           duration_s=round(now_unix_s - ep.opened_unix_s, 3), **extra)

    # -- the capture queue ------------------------------------------------------------------------------------------
    def queue(self) -> list[Episode]:
        """Open episodes that want a capture, most valuable first (:func:`value_key`)."""
        return sorted((e for e in self.open.values() if e.in_flight is None), key=value_key)

    def next_arm(self, policy: ArmingPolicy, now_unix_s: float, *, capture_in_flight: bool,
                 stalled_ranks: frozenset[int] = frozenset(),
                 topology: JobTopology | None = None,
                 host_load: Callable[[Episode], LoadExplanation | None] | None = None,
                 ) -> tuple[Episode, ArmDecision] | None:
        """The episode to arm now with its decision (``arm`` or ``would_arm``), or None; every episode decided on
        the way records what it waits for (``waiting``, ``waiting_until_unix_s``, ``waiting_behind``).

        ``host_load``: the host-load evidence of a job-wide episode (``core/fleet/host_load.py``
        ``explain_job_change`` over the job's nodes; None: no data). A job-wide :data:`LOAD_KINDS` episode it
        explains waits as ``explained_by_host_load`` (holds nobody; judged again at each run, so it is captured once
        the load no longer explains it); its evidence is kept in :attr:`load_evidence`."""
        self.settings = policy.settings  # the policy's limits are the ones in force (runtime-tunable)
        held_by: tuple[str, float | None, str] | None = None
        for ep in self.queue():
            if ep.explained_by:  # a known slow rank's finding, or a level found normal (_explain): holds nobody
                v = self._verdict
                normal = v is not None and v[0] == ep.explained_by and not v[1]
                self._wait(ep, "explained_by_level" if normal else "explained_by_ranks", None, "")
                continue
            if self._explained_by_host_load(ep, host_load):
                continue
            if ep.not_before_unix_s > now_unix_s:
                self._wait(ep, ep.waiting or "retry", ep.not_before_unix_s, "")
                continue
            repeat = self._repeat(ep, now_unix_s)
            d = self.history.decide(policy, ep.anomaly(), now_unix_s, capture_in_flight=capture_in_flight,
                                    stalled_ranks=stalled_ranks, topology=topology,
                                    episode_captured_unix_s=self._cooldown_since(ep), rotating=bool(ep.rotation),
                                    episode_unchanged=ep.unchanged_since_capture(self.settings.recapture_growth),
                                    follow_ranks=ep.follow_ranks, repeat=repeat)
            if ep.follow_ranks and d.action == "suppress" and d.reason == "larger_than_byte_cap":
                # a follow-up that can never fit the hourly byte cap would hold the episode for good: dropped, the
                # episode is decided as before it was asked (its cooldown and unchanged rules again)
                ep.follow_ranks, ep.new_ranks = (), False
                self._touch(ep)
                d = self.history.decide(policy, ep.anomaly(), now_unix_s, capture_in_flight=capture_in_flight,
                                        stalled_ranks=stalled_ranks, topology=topology,
                                        episode_captured_unix_s=self._cooldown_since(ep), rotating=bool(ep.rotation),
                                        episode_unchanged=ep.unchanged_since_capture(self.settings.recapture_growth),
                                        repeat=repeat)
            own = d.action == "suppress" and d.reason not in JOB_HOLDS
            if held_by is not None and not (held_by[0] == "min_arm_gap" and d.action != "suppress"):
                if own:
                    self._wait(ep, d.reason, self._until(d, ep, now_unix_s), "")
                else:
                    self._wait(ep, held_by[0], held_by[1], held_by[2])
                continue
            if d.action != "suppress":
                return ep, d
            until = self._until(d, ep, now_unix_s)
            self._wait(ep, d.reason, until, "")
            if not own:
                held_by = (d.reason, until, ep.episode_id)
        return None

    def _explained_by_host_load(self, ep: Episode,
                                host_load: Callable[[Episode], LoadExplanation | None] | None) -> bool:
        """Whether a job-wide episode waits as ``explained_by_host_load`` now (see :meth:`next_arm`); counts each
        episode once in :attr:`load_explained` and keeps the latest evidence in :attr:`load_evidence`."""
        if host_load is None or ep.ranks or ep.kind not in LOAD_KINDS:
            return False
        ev = host_load(ep)
        if ev is None:
            return False
        self.load_evidence[ep.episode_id] = ev.to_json()
        while len(self.load_evidence) > MAX_LOAD_EVIDENCE:
            self.load_evidence.pop(next(iter(self.load_evidence)))
        if not ev.explained:
            return False
        if ep.waiting != "explained_by_host_load":
            self.load_explained += 1
        self._wait(ep, "explained_by_host_load", None, "")
        return True

    def _cooldown_since(self, ep: Episode) -> float | None:
        """When the ``cooldown_s`` of ``ep`` runs from: its last capture (:attr:`Episode.captured_unix_s`), else
        None (captured as new, no cooldown) when that capture's verdict found no suspect and the episode's level grew
        by ``recapture_growth`` over the level it saw (:func:`_nobody_behind`, :func:`_grown_past`): the growth is a
        change nobody captured, as a new change point is (:meth:`_new_change`), never held by that capture's
        cooldown."""
        cap = _nobody_behind(ep)
        if cap is not None and _grown_past(ep, cap, self.settings.recapture_growth):
            return None
        return ep.captured_unix_s

    def _until(self, d: ArmDecision, ep: Episode, now_unix_s: float) -> float | None:
        return self.history.hold_until(d.reason, now_unix_s, self.settings,
                                       episode_captured_unix_s=self._cooldown_since(ep), estimated_bytes=d.estimated_bytes,
                                       named_new=bool(ep.ranks) and not d.repeat)

    def _repeat(self, ep: Episode, now_unix_s: float) -> bool:
        """Whether an arm for ``ep`` would be a repeat (:attr:`~profwatch.core.arming.policy.JobArmState.repeat`):
        it was captured before, its culprit rotates, it is a ``structural_imbalance``, or it is job-wide and an
        episode of its key (a drift's or a load's job-wide finding that closed and opened again) had its own
        capture armed within the hour. A repeat never holds a new named-rank episode behind the hourly cap
        (:data:`~profwatch.core.arming.policy.NAMED_RESERVE`)."""
        if ep.is_repeat or ep.rotation or ep.rotating_member or ep.kind == "structural_imbalance":
            return True
        if ep.ranks:
            return False
        since = now_unix_s - HOUR_S
        return any(e is not ep and e.key == ep.key and any(c.own and c.armed_unix_s > since for c in e.captures)
                   for e in (*self.closed, *self.open.values()))

    def _wait(self, ep: Episode, reason: str, until: float | None, behind: str) -> None:
        if (ep.waiting, ep.waiting_until_unix_s, ep.waiting_behind) != (reason, until, behind):
            ep.waiting, ep.waiting_until_unix_s, ep.waiting_behind = reason, until, behind
            self._touch(ep)

    def arm_failed(self, episode_id: str, now_unix_s: float, reason: str) -> None:
        """The arm of ``episode_id`` could not be planned or written (``reason``): it waits ``min_arm_gap_s`` (at
        least 10 s) before the next try, and stays in the queue."""
        ep = self.find(episode_id)
        if ep is not None and ep.closed_unix_s is None:
            ep.not_before_unix_s = now_unix_s + max(self.settings.min_arm_gap_s, 10.0)
            self._wait(ep, reason, ep.not_before_unix_s, "")

    def armed(self, episode_id: str, capture_id: str, now_unix_s: float, *, covered: tuple[int, ...] | None,
              status: str | None = None, start_step: int | None = None,
              step_time_s: float | None = None) -> list[Episode]:
        """Record that ``capture_id`` was armed for ``episode_id`` (``status`` ``would_arm`` in observe mode: it
        is counted as captured at once) and covers every other open episode that wants a capture and whose ranks
        lie in ``covered`` (None: every rank; a job-wide episode only then); while it is in flight, an episode that
        opens with its onset before ``start_step`` and its ranks covered is covered by it too. Returns the episodes
        it covers. Recording the arm in :attr:`history` is the caller's (the arm path does it for every arm); an arm
        that was a repeat (:meth:`_repeat`) is marked so there (the live arm path records it before this call
        without knowing: the named-rank reserve of the hourly cap would never apply). ``step_time_s``: the job step
        time (s) the window was planned on (the planner's), else None: the one the last :meth:`advance` was given;
        kept as :attr:`EpisodeCapture.job_step_s`, the level its verdict is judged at (:meth:`capture_ended`)."""
        ep = self.find(episode_id)
        if ep is None:
            return []
        if status is None:
            self._flight[capture_id] = (start_step, frozenset(covered) if covered is not None else None, now_unix_s)
        out = [ep]
        follow = bool(ep.follow_ranks)
        repeat = self._repeat(ep, now_unix_s)  # what next_arm decided it as (before this capture counts)
        if repeat or ep.ranks:
            self.history.mark_arm(capture_id, repeat=repeat, named=bool(ep.ranks))
        window_s = step_time_s if step_time_s is not None and 0 < step_time_s < math.inf else self._step_s
        self._add_capture(ep, EpisodeCapture(capture_id, now_unix_s, ep.ranks, True, status, level=ep.level,
                                             follow_up=follow, whole=covered is None, job_step_s=window_s,
                                             repeat=repeat))
        ep.follow_ranks = ()
        for other in self.open.values():
            if other is ep or other.in_flight is not None or other.is_repeat or other.rotation:
                continue
            if covered is None or (other.ranks and set(other.ranks) <= set(covered)):
                self._add_capture(other, EpisodeCapture(capture_id, now_unix_s, other.ranks, False, status,
                                                        level=other.level, whole=covered is None,
                                                        job_step_s=window_s))
                out.append(other)
        return out

    def resume_flight(self, capture_id: str, *, start_step: int, covered: tuple[int, ...] | None) -> bool:
        """After a restart (:meth:`restore`), a capture of the job's episodes still in flight resumes its flight
        from its stored record (``core/capture/record.py: Capture``: ``start_step``, its window's first step, and
        ``rank_list``, ``covered``; None: every rank), as :meth:`armed` kept it, so its window start is known again:
        a report whose onset precedes it is one the capture sees (:meth:`_window_after`: :meth:`_seen_by_flight`,
        :meth:`_new_change`, :meth:`_covered_at_open`), and :meth:`withdraw_returned` can withdraw it. Its arm time is
        its stored :attr:`EpisodeCapture.armed_unix_s`. Returns whether it resumed: False when no episode holds it in
        flight (a manual arm, an observe-mode would-arm, one already ended) or its flight is known."""
        armed = [c.armed_unix_s for e in (*self.open.values(), *self.closed) for c in e.captures
                 if c.capture_id == capture_id and c.status is None]
        if not armed or capture_id in self._flight:
            return False
        self._flight[capture_id] = (start_step, frozenset(covered) if covered is not None else None, min(armed))
        return True

    def arm_marks(self, capture_id: str) -> tuple[bool, bool]:
        """Whether ``capture_id`` was armed for an episode as a repeat, and for one naming ranks (:meth:`armed`; its
        :attr:`EpisodeCapture.ranks`): a restart counts the hour's arms again from the store and marks these in
        :attr:`history` (:meth:`~profwatch.core.arming.policy.ArmHistory.mark_arm`). ``(False, False)``: no
        episode armed it (a manual arm)."""
        own = [c for e in (*self.open.values(), *self.closed) for c in e.captures
               if c.own and c.capture_id == capture_id]
        return any(c.repeat for c in own), any(c.ranks for c in own)

    def _add_capture(self, ep: Episode, cap: EpisodeCapture) -> None:
        ep.captures = [*ep.captures, cap][-MAX_CAPTURES:]
        if ep.ranks:
            caps = self._key_captures.setdefault(ep.key, [])
            if all(cid != cap.capture_id for cid, _ in caps):
                caps[:] = [*caps, (cap.capture_id, cap.armed_unix_s)][-MAX_CAPTURES:]
            if len(self._key_captures) > MAX_OPEN:  # keys of closed episodes go first (memory bound)
                stale = [k for k in self._key_captures if k not in self.open and k != ep.key]
                for k in stale[:len(self._key_captures) - MAX_OPEN]:
                    del self._key_captures[k]
        ep.new_ranks = False
        ep.not_before_unix_s = 0.0
        self._wait(ep, "capture_in_flight" if cap.status is None else "", None, "")
        self._touch(ep)

    def capture_ended(self, capture_id: str, now_unix_s: float, status: str,
                      named: tuple[int, ...] = (), waited: tuple[int, ...] = ()) -> list[Event]:
        """A capture ended with ``status`` (a verdict status, or the state it ended in) naming ``named`` (most
        suspect first); ``waited``: the ranks a ``partial`` targeted capture's ranks waited for and it did not hold
        (one named rank, or every uncaptured one). Releases the hourly slot of a ``no_suspect`` capture; returns
        ``culprit_rotates`` events and, for a follow-up asked (class Notes), ``episode_updated`` with reason
        ``follow_up``."""
        if status == "no_suspect":
            self.history.release(capture_id)
        flight = self._flight.pop(capture_id, None)
        window_s = self._window_step_s(capture_id)
        self._confirm(capture_id, status, tuple(named), now_unix_s, whole=self._whole(capture_id, flight),
                      window_s=window_s)
        if flight is not None:
            self._ended.append(_Ended(capture_id, flight[0], flight[1], flight[2], status, tuple(named)))
        out: list[Event] = []
        for ep in (*self.open.values(), *self.closed):
            hit = [c for c in ep.captures if c.capture_id == capture_id]
            if not hit:
                continue
            self._stamp(hit, status, tuple(named), now_unix_s, window_s)
            if ep.ranks and not _saw(status, tuple(named), ep.ranks) and not any(c.own for c in hit):
                # another episode's capture that covered this one's ranks while in flight did not show them
                # (cancelled, or its verdict named other ranks): it is not this episode's capture
                ep.captures = [c for c in ep.captures if c.capture_id != capture_id]
                caps = self._key_captures.get(ep.key)
                if caps is not None:
                    caps[:] = [c for c in caps if c[0] != capture_id]
                if ep.waiting == "capture_in_flight":
                    ep.waiting = ""
                self._touch(ep)
                continue
            if ep.waiting == "capture_in_flight":
                ep.waiting = ""
            self._touch(ep)
            n = self.settings.rotation_captures
            out += self._rotation_across(ep, hit, now_unix_s)
            ranked = _capture_tops(ep)
            armed = {c.capture_id: c.armed_unix_s for c in ep.captures}
            verdict_named = {c.capture_id: c.named for c in ep.captures}
            if (not ep.rotation and ep.closed_unix_s is None
                    and self._moved(ep.key, [(t, armed[cid], verdict_named[cid]) for t, cid in ranked[-n:]], n)):
                ep.rotation = tuple(t for t, _ in ranked[-n:])
                times = [armed[cid] for _, cid in ranked[-n:]]
                # each rank of the rotation stayed named at least until the next one was captured: a later rank
                # must outlast that twice to be a slow rank of its own (hot periods of 6 minutes were each taken
                # for a persistent rank once 5 minutes had passed)
                self._named_span[ep.episode_id] = max(self._named_span.get(ep.episode_id, 0.0),
                                                      *(b - a for a, b in zip(times, times[1:], strict=False)))
                for _, cid in ranked[-n:]:
                    self.history.release(cid)  # a rotation's captures never hold a slow rank's
                text = ", ".join(str(r) for r in ep.rotation)
                out.append(self._event(
                    TYPE_CULPRIT_ROTATES, ep, "", rotation=list(ep.rotation),
                    capture_ids=[cid for _, cid in ranked[-n:]],
                    detail=f"culprit rotates: ranks {text} in the last {n} captures: load imbalance, e.g. MoE "
                           "routing; not captured again as a slow rank (a rank that stays slow is captured as an "
                           "episode of its own once it persists)"))
            if (status == "partial" and waited and ep.closed_unix_s is None and not ep.rotation
                    and self.settings.rank_list is None
                    and any(c.own and not c.follow_up for c in hit)):
                ep.follow_ranks = tuple(sorted(set(waited)))
                ep.new_ranks = True
                shown = ", ".join(str(r) for r in ep.follow_ranks[:16]) + (", ..." if len(ep.follow_ranks) > 16 else "")
                out.append(self._event(
                    TYPE_EPISODE_UPDATED, ep, f"-follow-{capture_id}", reason="follow_up", capture_id=capture_id,
                    follow_ranks=list(ep.follow_ranks[:64]), follow_count=len(ep.follow_ranks),
                    text=f"capture {capture_id}'s ranks waited for ranks it did not hold: a follow-up capture of "
                           f"ranks {shown} is queued (through the job's capture budget)"))
        return out

    def _whole(self, capture_id: str, flight: tuple[int | None, frozenset[int] | None, float] | None) -> bool:
        """Whether ``capture_id`` captured every rank: its flight says, else (armed before a restart, its flight not
        resumed: :meth:`resume_flight`) the stored captures of the episodes it covered (:attr:`EpisodeCapture.whole`)."""
        if flight is not None:
            return flight[1] is None
        return any(c.whole for ep in (*self.open.values(), *self.closed) for c in ep.captures
                   if c.capture_id == capture_id)

    def _of_earlier_run(self, capture_id: str) -> bool:
        """Whether ``capture_id`` was armed for an episode before the job's current generation began
        (:meth:`new_run`; restored from an episode closed by it): its verdict, of the old run, is not the new run's
        (the new run forgot the old run's verdicts). A capture no episode holds (a manual arm) is not."""
        return any(c.armed_unix_s < self._run_since for e in (*self.open.values(), *self.closed) for c in e.captures
                   if c.capture_id == capture_id)

    def _window_step_s(self, capture_id: str) -> float | None:
        """The job step time (s) of ``capture_id``'s window: the one it was armed on (:meth:`armed`, kept in its
        :attr:`EpisodeCapture.job_step_s` rows, so across a restart too), else (none known at the arm) the one the
        last :meth:`advance` was given. A verdict is judged at its window's level: a job that changed speed
        between the window and the verdict (the analysis takes minutes) is not taken for the level it found."""
        armed = (c.job_step_s for e in (*self.open.values(), *self.closed) for c in e.captures
                 if c.capture_id == capture_id and c.job_step_s is not None)
        return next(armed, None) or self._step_s

    def _stamp(self, hit: list[EpisodeCapture], status: str, named: tuple[int, ...], now_unix_s: float,
               window_s: float | None) -> None:
        """Record how the captures ``hit`` ended; with a verdict, when, and the job step time of its window
        ``window_s`` (:meth:`_window_step_s`; what a restart restores the latest verdict from:
        :meth:`_restore_verdict`)."""
        for c in hit:
            c.status, c.named = status, named
            if status in VERDICTS:
                c.verdict_unix_s, c.job_step_s = now_unix_s, window_s

    def _confirm(self, capture_id: str, status: str, named: tuple[int, ...], now_unix_s: float, *,
                 whole: bool, window_s: float | None) -> None:
        """Remember what the job's latest verdict named; when it named ranks, the job step time at the verdict for
        each open ranked episode (not rotating) whose ranks it named, with the episode's level then (one moment's
        pair: the ranks' share is their level's growth since), and, for a capture of every rank (``whole``), the job
        step time of its window ``window_s`` (:meth:`_window_step_s`: the level the capture saw and found normal or
        explained) for the verdict itself (:meth:`_explaining`'s references). An outcome without a verdict (failed,
        cancelled, replay's ``simulated``) changes nothing, nor does a capture of an earlier run
        (:meth:`_of_earlier_run`)."""
        if status not in VERDICTS or self._of_earlier_run(capture_id):
            return
        self._last_named = named if status != "no_suspect" else ()
        self._verdict = None
        self._verdict_at = now_unix_s
        if window_s is not None and whole and (self._last_named or status == "no_suspect"):
            self._verdict = (capture_id, self._last_named, window_s, now_unix_s)
        if self._step_s is None or not self._last_named:
            return
        for s in self.open.values():
            if s.ranks and not s.rotation and set(named) & set(s.ranks):
                self._confirmed[s.episode_id] = s.confirmed = (self._step_s, s.level)
                self._touch(s)

    def _explaining(self, ep: Episode, now_unix_s: float) -> tuple[str, tuple[int, ...], float] | None:
        """What explains the job-wide level ``ep`` reached (the open ranked episode whose known slow ranks do, else
        the capture whose verdict named them), the ranks, and the job's change left once their own share is taken
        out (relative); None when nothing does (rule: :data:`EXPLAINED_GROWTH`) or the job's latest verdict is over
        an hour old (``HOUR_S``: a change inside host load's reach that outlasts it is captured once more). The reached level is the report's
        ``step_time_s``, else ``reference_s * (1 + magnitude)``; the ranks' share is ``(1 + level now) / (1 + level
        at the verdict)`` of their episode (its excess over the peers). Without such an episode, open or closed
        within the hour (:meth:`_ranked_lately`; no stage timings: every rank reports the synchronous step time),
        the latest verdict of a capture of every rank that named
        ranks explains for an hour (``HOUR_S``: then one capture confirms it), its ranks' share unknown (1), while
        the level before ``ep`` (``reference_s``) also lies within the rule of the verdict's (a rank that healed
        brought the job far below it: a change from there is new). A latest verdict of a capture of every rank that
        found nobody (``no_suspect``) explains the same way for an hour, with or without ranked episodes (the ranks
        returned are then empty: a level found normal), when the move from ``reference_s`` to the reached level is
        also under :data:`EXPLAINED_GROWTH` (one jump larger than host load makes is a change of its own)."""
        reached = ep.detail.get("step_time_s")
        if not isinstance(reached, (int, float)) or isinstance(reached, bool) or not reached > 0:
            reached = ep.reference_s * (1.0 + ep.magnitude) if ep.reference_s else None
        if reached is None or now_unix_s - self._verdict_at > HOUR_S:
            return None  # a verdict explains for an hour: a job-wide change that outlasts it is confirmed by one
        for s in self.open.values() if self._last_named else ():
            conf = self._confirmed.get(s.episode_id)
            if conf is None or not s.ranks or s.rotation or not set(self._last_named) <= set(s.ranks):
                continue
            ref_s, ref_level = conf
            share = (1.0 + max(s.level, 0.0)) / (1.0 + max(ref_level, 0.0))
            rest = float(reached) / ref_s / share - 1.0
            if rest < EXPLAINED_GROWTH:
                return s.episode_id, s.ranks, rest
        v = self._verdict
        if v is None or now_unix_s - v[3] > HOUR_S or ep.reference_s is None:
            return None
        if v[1] and self._ranked_lately(now_unix_s):
            return None  # the job shows ranks of its own: the verdict's ranks are not known slow any more
        rest = float(reached) / v[2] - 1.0
        if not v[1] and float(reached) / ep.reference_s - 1.0 >= EXPLAINED_GROWTH:
            return None  # a level found normal explains moves host load makes, never one jump larger than those
        if rest < EXPLAINED_GROWTH and ep.reference_s * (1.0 + EXPLAINED_GROWTH) >= v[2]:
            return v[0], v[1], rest
        return None

    def _ranked_lately(self, now_unix_s: float) -> bool:
        """Whether an episode naming ranks is open or closed within the last hour: the job shows ranks of its own
        (stage timings), so a slow rank the verdicts named without one is not known to the detector any more (it
        healed, or a second slow rank hides it from the peers' median)."""
        return (any(e.ranks for e in self.open.values())
                or any(e.ranks and now_unix_s - (e.closed_unix_s or 0.0) <= HOUR_S for e in self.closed))

    def _explain(self, ep: Episode, now_unix_s: float) -> list[Event]:
        """Mark a job-wide ``step_regression`` never captured as explained by a known slow rank
        (:meth:`_explaining`): ``episode_updated`` with reason ``explained`` once, then it waits as
        ``explained_by_ranks`` (never captured, holding nobody); when the rank's episode ends, a later verdict
        names other ranks or the job grows past the rule, the mark goes (reason ``unexplained``) and it is
        captured as a new episode."""
        if ep.kind != "step_regression" or ep.ranks or ep.captures:
            if ep.explained_by:  # another episode's capture of every rank covered it: captured, nothing to explain
                ep.explained_by = ""
                self._touch(ep)
            return []
        found = self._explaining(ep, now_unix_s)
        if found is None:
            if not ep.explained_by:
                return []
            ep.explained_by = ""
            self._touch(ep)
            return [self._event(TYPE_EPISODE_UPDATED, ep, f"-unexplained-{ep.reports}", reason="unexplained",
                                text="no longer explained by a known slow rank: captured as a change of its own")]
        by, ranks, rest = found
        if ep.explained_by == by:
            return []
        ep.explained_by = by
        self._touch(ep)
        if not ranks:  # the latest verdict, of a capture of every rank, found nobody at a level this one is within
            level = self._verdict[2] if self._verdict is not None else None
            at = f" ({level:.4g} s per step)" if level else ""
            return [self._event(
                TYPE_EPISODE_UPDATED, ep, f"-explained-{by}", reason="explained", explained_by=by, named=[],
                rest_change=round(rest, 6),
                text=f"capture {by} of every rank found no suspect rank at the job's level then{at}, within the hour; "
                     f"the job moved {rest:+.0%} from that level, under +{EXPLAINED_GROWTH:.0%} (host load): not "
                     "captured again as a change of its own until an hour after that verdict")]
        shown = ", ".join(str(r) for r in ranks[:16])
        return [self._event(
            TYPE_EPISODE_UPDATED, ep, f"-explained-{by}", reason="explained", explained_by=by,
            rest_change=round(rest, 6),
            text=f"the job is slower because rank(s) {shown} are ({by}, named by the job's latest verdict): with their "
                 f"own share taken out the job moved {rest:+.0%} since that verdict (host load), under "
                 f"+{EXPLAINED_GROWTH:.0%}: not captured again as a change of its own")]

    def withdraw_returned(self, now_unix_s: float, *, furthest_step: int | None, reach_steps: int | None,
                          returned: Callable[[int], Mapping[str, Any] | None],
                          confirm: Callable[[str, str], bool] = lambda cid, why: True,
                          ) -> list[tuple[str, str, list[Event]]]:
        """Withdraw the captures of job-wide episodes whose excursion came back before the window opened.

        A candidate: an open job-wide ``step_regression`` episode of a spike-held level report (``pattern
        "level"``: steps over ``spike_min_effect`` that outlasted the hold) with its own capture in flight whose
        ``start_step`` is at least ``reach_steps`` ahead of the job's furthest step (the planner's lead,
        ``profwatch.core.capture.planner.lead_steps``: the steps an idle config needs to reach every rank before
        the window; None, no step time known: nothing is withdrawn. Closer, the ranks may run the window anyway and
        its data would lie under a capture that says it recorded nothing). ``returned(first_step)`` gives the detector's
        evidence that the steps came back to the level before it (``JobDetector.excursion_returned``, JSON), or
        None. For each: the capture ends with status ``withdrawn`` (it covers nothing more), its arm leaves the
        budget (:meth:`ArmHistory.withdraw`: no hourly slot, no gap, no bytes), and the episode closes with reason
        ``returned`` in one ``episode_closed`` event that carries the evidence and says the report was a
        transient (``relabelled "step_spike"``): a checkpoint the job does not flag, seen before it could be
        learned. A change that lasts keeps its steps elevated and its capture. Counted in ``withdrawn``.
        ``confirm(capture_id, why)`` cancels the capture first (the coordinator: ``lifecycle.withdraw``, its idle
        config) and says whether it could (False: a rank started the window; nothing changes here).
        Returns ``(capture_id, why, events)`` per withdrawal."""
        out: list[tuple[str, str, list[Event]]] = []
        if furthest_step is None or reach_steps is None:
            return out
        for ep in list(self.open.values()):
            cid = ep.in_flight
            flight = self._flight.get(cid) if cid is not None else None
            if (not withdrawable(ep.anomaly()) or flight is None
                    or flight[0] is None or flight[0] - furthest_step < max(1, reach_steps)
                    or not any(c.own and c.capture_id == cid for c in ep.captures)):
                continue
            first = ep.detail.get("first_step")
            evidence = returned(first) if isinstance(first, int) and not isinstance(first, bool) else None
            if evidence is None:
                continue
            assert cid is not None
            why = (f"the job came back to its level {evidence.get('steps_back')} steps after the excursion from step "
                   f"{first} ended (step {evidence.get('last_elevated_step')}), before the window at step "
                   f"{flight[0]}: a transient (an unflagged checkpoint or evaluation), not a change")
            if not confirm(cid, why):
                continue
            self.history.withdraw(cid)
            events = self.capture_ended(cid, now_unix_s, "withdrawn")
            self.withdrawn += 1
            events.append(self._close(ep, now_unix_s, "returned", withdrawn=cid, evidence=dict(evidence),
                                      relabelled="step_spike", why=why))
            out.append((cid, why, events))
        return out

    def _moved(self, key: str, tops: list[tuple[int, float, tuple[int, ...]]], n: int) -> bool:
        """Whether the culprit of ``key`` moved at each of the captures ``tops`` (at least ``n`` of them; each its top
        rank, the time it was armed, Unix s, and the ranks its verdict named, empty without one; oldest first): each
        top differs from the one before, and the one before was no longer slow at the later capture: its verdict did
        not name it, or, without a verdict, the key's episodes no longer named it (the trail: reports and the
        detector's ongoing names) when it was armed (its current stretch of the trail does not span the arm: one
        begun after it, :data:`NAMED_GAP_S` after a healthy gap, is the rotation come back). A rank still slow then is slow beside the new top, not left
        behind by it: two ranks slow from the same step, one named a step before the other, read as a rotation
        2 -> 5 (the second capture took the new rank beside the first), and neither was captured again
        (``tests/integration/test_replay.py``, ``tests/unit/test_episodes.py``)."""
        if len(tops) < n:
            return False
        trail = self._trail.get(key, {})
        for (a, _, _), (b, armed, named) in zip(tops, tops[1:], strict=False):
            seen = trail.get(a)
            # named at the arm: its current stretch spans it (one begun after it is a hot period come back, e.g.
            # an expert hot again before a verdict-less capture ended: 0 -> 3 -> 0 read as no move)
            if a == b or (a in named if named else seen is not None and seen[0] <= armed <= seen[1]):
                return False
        return True

    def _rotation_across(self, ep: Episode, own: list[EpisodeCapture], now_unix_s: float) -> list[Event]:
        """Remember the top rank of each capture of a ranked episode under its key, its own or another episode's
        that covered it (the verdict's first named rank, else, without a verdict, the episode's ranks at the arm when
        it named one; a verdict that named nobody has no top: :func:`_found_no_suspect`); when the last ``rotation_captures`` of the
        key, from more than one episode and within an hour of each other, named a different rank each time, the
        key's culprit rotates across episodes: ``culprit_rotates`` once, the captures of the rotation no longer
        count toward ``max_captures_per_hour`` (they never hold a slow rank's capture), the open episode of the key
        is not captured again and later episodes of the key wait until they persist (:meth:`_persists`)."""
        if not ep.ranks:
            return []  # a job-wide finding's key is not a culprit
        tops = self._tops.setdefault(ep.key, deque(maxlen=MAX_TOPS))
        if len(self._tops) > MAX_OPEN:  # keys of closed episodes go first (memory bound, as the trail's)
            stale = [k for k in self._tops if k not in self.open and k != ep.key]
            for k in stale[:len(self._tops) - MAX_OPEN]:
                del self._tops[k]
        for c in own:
            top = c.named[0] if c.named else (c.ranks[0] if len(c.ranks) == 1 and not _found_no_suspect(c.status)
                                              else None)
            if top is not None:
                tops.append((top, ep.episode_id, c.capture_id, c.armed_unix_s, c.named))
        n = self.settings.rotation_captures
        last = list(tops)[-n:]
        if (ep.key in self.rotating or len(last) < n or len({e for _, e, *_ in last}) < 2
                or last[-1][3] - last[0][3] > HOUR_S or not self._moved(ep.key, [(t, at, nm) for t, _, _, at, nm in last], n)):
            return []
        longest = 0.0
        for _, eid, *_ in last:
            member = self.find(eid)
            if member is not None:
                longest = max(longest, (member.closed_unix_s or now_unix_s) - member.opened_unix_s)
        ranks = tuple(t for t, *_ in last)
        self.rotating[ep.key] = (ranks, longest)
        for _, _, cid, *_ in last:
            self.history.release(cid)
        if ep.closed_unix_s is None and not ep.rotation:
            ep.rotation = ranks
            self._touch(ep)
        text = ", ".join(str(r) for r in ranks)
        return [self._event(
            TYPE_CULPRIT_ROTATES, ep, "-across", rotation=list(ranks), across_episodes=True,
            capture_ids=[cid for _, _, cid, *_ in last],
            detail=f"culprit rotates: ranks {text} in the last {n} captures of {ep.key}, each in an episode of its "
                   "own: load imbalance, e.g. MoE routing; later episodes of it are captured only once they "
                   f"persist ({PERSIST_S:.0f} s and {PERSIST_STEPS} steps at least), and its captures no longer count "
                   "toward the hourly cap")]

    def _rotation_named(self, ep: Episode, now_unix_s: float) -> list[Event]:
        """Recognise a rotation from the ranks the episodes of ``ep``'s key named, whatever the captures' verdicts
        said: the hot spot *moved* (a rank first named after another one was last named, that one no longer named
        and named within the last hour: the set of named ranks moves among ranks, within one episode or across
        successive ones; two ranks slow at once, one dropping out of the detector's names for a moment, are no
        move) and the key's episodes already took ``rotation_captures`` captures (own or covering)
        armed within the last hour (``HOUR_S``) of this job generation. Then ``culprit_rotates`` once (``across_episodes``, ``evidence: named_ranks``), the
        rotation's captures leave the hourly cap and no episode of the key is captured again until it persists
        (:meth:`_persists`, :meth:`_persistent_ranks`). Bounds a rotation at ``rotation_captures`` captures when no
        verdict names a top rank (a capture that found nobody, ranks named together). A rank that a verdict of the
        key's captures armed within the hour named (:meth:`_verdict_named`) is no move's destination: a capture
        found it slow, and whether the verdicts rotate is :meth:`_rotation_across`'s to judge (a false arm on a
        healthy rank 0 that found nobody, then the real rank 1 named by its own capture's verdict, read as a move
        0 -> 1 and made rank 1's episode a rotation on the live serving pair)."""
        key = ep.key
        if key in self.rotating or ep.rotation or ep.closed_unix_s is not None:
            return []
        # captures armed within the hour, as for a rotation across episodes: two slow ranks hours apart are two
        # faults, not a hot spot that moves (with the generation's captures, a straggler named 30 min after another
        # rank healed was held as a rotation at its first report, 3 h after the key's first capture)
        caps = [cid for cid, armed in self._key_captures.get(key, []) if now_unix_s - armed <= HOUR_S]
        n = self.settings.rotation_captures
        if len(caps) < n:
            return []
        trail = self._trail.get(key, {})
        now_named = set(ep.ranks)
        left = [(r, f, last) for r, (f, last, _) in trail.items() if r not in now_named and now_unix_s - last <= HOUR_S]
        confirmed = self._verdict_named(key, now_unix_s)
        came = [(r, f) for r, (f, _, _) in trail.items() if r in now_named and r not in confirmed]
        moves = [(a, b) for a, _, la in left for b, fb in came if fb > la]
        if not moves:
            return []
        order = tuple(r for r, _ in sorted(trail.items(), key=lambda x: x[1][0]))[-MAX_TOPS:]
        longest = max((last - f for _, f, last in left), default=0.0)
        self.rotating[key] = (order, longest)
        for cid in caps:
            self.history.release(cid)
        ep.rotation = order
        self._named_span[ep.episode_id] = max(self._named_span.get(ep.episode_id, 0.0), longest)
        self._touch(ep)
        text = ", ".join(str(r) for r in order)
        a, b = moves[-1]
        return [self._event(
            TYPE_CULPRIT_ROTATES, ep, "-named", rotation=list(order), across_episodes=True, evidence="named_ranks",
            capture_ids=list(caps),
            detail=f"culprit rotates: the ranks {key} names moved among ranks {text} (rank {a} no longer slow, rank "
                   f"{b} slow since): load imbalance, e.g. MoE routing; it took {len(caps)} captures "
                   f"(rotation_captures {n}) and is not captured or paged again; a rank that stays slow is captured "
                   f"as an episode of its own once it persists ({PERSIST_S:.0f} s and {PERSIST_STEPS} steps at "
                   "least, and twice as long as the rotation stays on one rank)")]

    def _verdict_named(self, key: str, now_unix_s: float) -> frozenset[int]:
        """The ranks a verdict named (``ok``, ``weak``, a ``partial`` that named ranks) for a capture of an
        episode of ``key`` armed within the last hour (``HOUR_S``), open or among the closed kept."""
        return frozenset(r for e in (*self.open.values(), *self.closed) if e.key == key for c in e.captures
                         if c.status in VERDICTS and c.named and now_unix_s - c.armed_unix_s <= HOUR_S
                         for r in c.named)

    # -- views ----------------------------------------------------------------------------------------------------------
    def view(self, now_unix_s: float, closed: int = 5) -> list[dict[str, Any]]:
        """Open episodes (queue order first, then the rest), then the last ``closed`` closed ones, as JSON."""
        queued = self.queue()
        rest = [e for e in self.open.values() if e not in queued]
        out = []
        for pos, ep in enumerate([*queued, *rest]):
            v = ep.to_json(now_unix_s)
            v["queue_position"] = pos + 1 if ep in queued else None
            until = ep.waiting_until_unix_s
            v["waiting_in_s"] = round(max(0.0, until - now_unix_s), 1) if until is not None else None
            out.append(v)
        out.extend(e.to_json(now_unix_s) for e in list(self.closed)[-closed:] if closed > 0)
        return out
