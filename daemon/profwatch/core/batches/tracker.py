"""Incremental completeness: the per-rank states of the rank dirs under one prof_dir, kept one rank dir at a time
(pure; no I/O, no clock).

A watch event names a rank dir; the adapter (``daemon/profwatch/adapters/fs/incremental_scan.py``) reads only that
dir, evaluates it (:func:`~profwatch.core.batches.completeness.evaluate_rank_dir`) and hands the state to
:meth:`RankDirTracker.update`, which replaces the dir's state and adjusts its batch's counts in O(1) and its
members, kept sorted in both orders ``evaluate_batch`` reads, in O(log N) (a new or vanished dir: one O(N) list
move), so deciding a batch sorts nothing (16,384 dirs: ~20 ms instead of ~100 ms). The counts
only say *when* a decision is possible (:meth:`RankDirTracker.ready`: every expected rank has a dir and none is
still appearing, parsing or unknown); the decision itself stays with
:func:`~profwatch.core.batches.completeness.evaluate_batch` and ``group_rank_dirs``, exactly as a full scan makes it
(:meth:`RankDirTracker.batch_of`, :meth:`RankDirTracker.batches`).

Events can be lost (an inotify queue overflow, a dead observer, docs/field-cases.md#fc-17), so a full walk still
reconciles (at start, after an overflow, on a slow timer), as a *pass*: :meth:`RankDirTracker.begin_pass` plans
every rank dir the walk found and every tracked one it did not (vanished, or below a folder that failed to list),
the adapter reads them in bounded slices through :meth:`RankDirTracker.next_to_read`, and a later call resumes
where the last slice stopped. Order: dirs the walk no longer finds, new dirs, dirs still pending (appearing,
raw_complete, parsing, unknown), then finished dirs least recently read first; a dir read since the pass began
(an event) is not read again by that pass. So after an overflow the dirs whose change can complete a batch are
read first, and a pass restarted by the next overflow or timer continues with the dirs read longest ago.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from profwatch.core.batches.completeness import (
    BY_PATH,
    BY_TIME_PATH,
    BatchState,
    CaptureHint,
    RankDirState,
    assess_states,
    evaluate_batch,
)
from profwatch.core.batches.settings import WatchSettings

PENDING_STATES: frozenset[str] = frozenset({"appearing", "raw_complete", "parsing", "unknown"})
"""Rank dir states that can still change into ``parsed`` or ``failed`` without anyone re-parsing."""

_Key = tuple[str, str | None, bool]
"""A batch's counts: ``(kind, capture_id, has_metadata)``. Stamped dirs group by capture id (rule 1 of
``group_rank_dirs``); unstamped dirs with metadata share ``(kind, None, True)``; dirs without metadata yet
(``appearing``) share ``(kind, None, False)`` and join the nearest batch when grouped."""


def expected_count(world_size: int | None, hint: CaptureHint | None) -> int | None:
    """How many ranks the capture expects: the hint's ``rank_list`` (distinct ranks), else ``world_size``, else the
    hint's world size; None when unknown (then only a full evaluation can decide)."""
    if hint is not None and hint.rank_list:
        return len(set(hint.rank_list))
    if world_size:
        return world_size
    return hint.world_size if hint is not None and hint.world_size else None


@dataclass(slots=True)
class _Tally:
    """One batch's counts and its members kept in the two orders :func:`evaluate_batch` reads them in (name time
    then path, as ``group_rank_dirs`` gives a batch; path), so deciding a batch sorts nothing: adding or removing a
    dir costs O(log N) compares and one O(N) list move, re-reading a dir (same path) O(log N)."""

    members: dict[str, RankDirState] = field(default_factory=dict)
    pending: int = 0
    claims: Counter[int] = field(default_factory=Counter)
    by_time: list[RankDirState] = field(default_factory=list)
    by_path: list[RankDirState] = field(default_factory=list)

    def add(self, s: RankDirState) -> None:
        self.members[s.path] = s
        insort(self.by_time, s, key=BY_TIME_PATH)
        insort(self.by_path, s, key=BY_PATH)
        self._count(s, 1)

    def remove(self, s: RankDirState) -> None:
        del self.members[s.path]
        del self.by_time[_index(self.by_time, s, BY_TIME_PATH)]
        del self.by_path[_index(self.by_path, s, BY_PATH)]
        self._count(s, -1)

    def replace(self, old: RankDirState, new: RankDirState) -> None:
        """``new`` read from the same dir as ``old`` (same path and name time: same places in both orders)."""
        self.members[new.path] = new
        self.by_time[_index(self.by_time, old, BY_TIME_PATH)] = new
        self.by_path[_index(self.by_path, old, BY_PATH)] = new
        self._count(old, -1)
        self._count(new, 1)

    def _count(self, s: RankDirState, sign: int) -> None:
        self.pending += sign * (s.state in PENDING_STATES)
        if s.rank is not None:
            self.claims[s.rank] += sign
            if self.claims[s.rank] <= 0:
                del self.claims[s.rank]


def _index(order: list[RankDirState], s: RankDirState, key: Callable[[RankDirState], Any]) -> int:
    """Where ``s`` (a member: its path is unique) sits in ``order`` (sorted by ``key``), by bisection."""
    i = bisect_left(order, key(s), key=key)
    if i == len(order) or order[i].path != s.path:
        raise KeyError(s.path)  # not a member: a bug of the caller
    return i


def _key(s: RankDirState) -> _Key:
    return (s.kind, s.capture_id, True) if s.capture_id is not None else (s.kind, None, s.has_metadata)


class RankDirTracker:
    """The rank dirs of one scan root: path -> :class:`RankDirState`, with counts per batch and a resumable
    reconcile pass. Not thread-safe (one reader thread owns it). Memory: one state per rank dir found."""

    def __init__(self) -> None:
        self._states: dict[str, RankDirState] = {}
        self._tallies: dict[_Key, _Tally] = {}
        self._read_no: dict[str, int] = {}  # path -> number of its last read (also of a read that found it gone)
        self._pending: set[str] = set()  # paths whose state is pending
        self._reads = 0
        self._plan: deque[str] = deque()
        self._pass_from = 0  # read number when the current pass began
        self._pass_open = False
        self.passes = 0
        """Reconcile passes begun so far."""

    # -- per rank dir ---------------------------------------------------------------------------------------------
    def update(self, path: str, state: RankDirState | None) -> None:
        """Record one read of ``path``: its new state, or None when it is gone (vanished, or no longer a rank dir)."""
        self._reads += 1
        self._read_no[path] = self._reads
        if state is not None and state.state in PENDING_STATES:
            self._pending.add(path)
        else:
            self._pending.discard(path)
        old = self._states.pop(path, None)
        if old is not None and state is not None and _key(old) == _key(state) \
                and BY_TIME_PATH(old) == BY_TIME_PATH(state):
            self._states[path] = state
            self._tallies[_key(old)].replace(old, state)
            return
        if old is not None:
            tally = self._tallies[_key(old)]
            tally.remove(old)
            if not tally.members:
                del self._tallies[_key(old)]
        if state is not None:
            self._states[path] = state
            self._tallies.setdefault(_key(state), _Tally()).add(state)

    def state(self, path: str) -> RankDirState | None:
        return self._states.get(path)

    def __len__(self) -> int:
        return len(self._states)

    @property
    def reads(self) -> int:
        """Rank dir reads recorded so far (events and passes together)."""
        return self._reads

    # -- when a decision is possible ------------------------------------------------------------------------------
    def _keys_of(self, capture_id: str | None) -> list[_Key]:
        """The counts a capture's batch is judged on: its stamped dirs, else the unstamped ones (as
        ``lifecycle.pick_batch`` prefers)."""
        stamped = [k for k in self._tallies if capture_id is not None and k[1] == capture_id]
        return stamped or [k for k in self._tallies if k[1] is None and k[2]]

    def count(self, capture_id: str | None) -> int:
        """Rank dirs of ``capture_id``'s batch (stamped with it, else unstamped with metadata)."""
        return sum(len(self._tallies[k].members) for k in self._keys_of(capture_id))

    def ready(self, capture_id: str | None, expected: int | None) -> bool:
        """True when ``capture_id``'s batch can be decided: at least ``expected`` distinct ranks have a dir and
        none of its dirs is pending. A necessary condition of ``complete`` (and of every status but ``parsing``
        before the deadline), read from the counts in O(1) per kind; :meth:`batch_of` decides."""
        if not expected:
            return False
        return any(self._tallies[k].pending == 0 and len(self._tallies[k].claims) >= expected
                   for k in self._keys_of(capture_id))

    # -- decisions (exact: the same as a full scan's) -------------------------------------------------------------
    def batches(self, *, now_unix_s: float, settings: WatchSettings, world_size: int | None = None,
                hints: Mapping[str, CaptureHint] | None = None) -> list[BatchState]:
        """Every batch, as :func:`~profwatch.core.batches.completeness.assess_batches` over the same states would
        return them (sorted by batch_id). O(rank dirs)."""
        return assess_states(self._states.values(), now_unix_s=now_unix_s, settings=settings, world_size=world_size,
                             hints=hints)

    def batch_of(self, capture_id: str | None, *, now_unix_s: float, settings: WatchSettings,
                 world_size: int | None = None, hint: CaptureHint | None = None) -> list[BatchState]:
        """The batches ``capture_id``'s batch is picked from, as :meth:`batches` would return them: the stamped
        group(s) alone when no dir of that kind still lacks metadata (grouping rule 1 then holds exactly those
        dirs, and :func:`evaluate_batch` runs over the batch's dirs only), else every batch (rule 3 may join a dir
        without metadata to any batch)."""
        keys = [k for k in self._keys_of(capture_id) if k[1] is not None]
        hints = {capture_id: hint} if capture_id is not None and hint is not None else None
        if not keys or any((k[0], None, False) in self._tallies for k in keys):
            return self.batches(now_unix_s=now_unix_s, settings=settings, world_size=world_size, hints=hints)
        out = []
        for k in keys:
            tally = self._tallies[k]
            out.append(evaluate_batch(tally.by_time, now_unix_s=now_unix_s, settings=settings, world_size=world_size,
                                      hint=hint, by_path=tally.by_path))
        return sorted(out, key=lambda b: b.batch_id)

    # -- the reconcile pass ---------------------------------------------------------------------------------------
    def begin_pass(self, found: Iterable[str]) -> int:
        """Plan a reconcile pass over the walk's rank dirs ``found`` (see the module doc for the order); replaces a
        pass in progress. Returns how many dirs it plans to read."""
        found_set = set(found)
        for p in self._read_no.keys() - self._states.keys() - found_set:
            del self._read_no[p]
        gone = sorted(self._states.keys() - found_set)
        new = sorted(found_set.difference(self._states))
        known = found_set.intersection(self._states)
        pending = sorted(known & self._pending)
        # every known dir was read (update numbers it), each read number is unique: no tie to break by path
        rest = sorted(known - self._pending, key=self._read_no.__getitem__)
        self._plan = deque([*gone, *new, *pending, *rest])
        self._pass_from = self._reads
        self._pass_open = True
        self.passes += 1
        return len(self._plan)

    def next_to_read(self) -> str | None:
        """The next rank dir the pass reads (skipping dirs read since it began), or None when none is left (then
        call :meth:`end_pass`)."""
        while self._plan:
            path = self._plan.popleft()
            if self._read_no.get(path, 0) <= self._pass_from:
                return path
        return None

    def end_pass(self) -> None:
        self._plan.clear()
        self._pass_open = False

    @property
    def reconciling(self) -> bool:
        """True from :meth:`begin_pass` until :meth:`end_pass`."""
        return self._pass_open

    @property
    def pass_left(self) -> int:
        """Rank dirs the pass may still read (an upper bound: some may have been read by events meanwhile)."""
        return len(self._plan)
