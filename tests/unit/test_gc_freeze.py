"""GcFreezer: big trees' states leave the collected generations, small trees never freeze, frozen states of a
dropped tree are freed (no leak over several batches), and cyclic garbage frozen meanwhile is collected at the
next refresh."""

from __future__ import annotations

import gc
import tracemalloc
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest

from profwatch.adapters.fs.incremental_scan import IncrementalScan
from profwatch.adapters.gc_freeze import GcFreezer
from profwatch.core.batches.completeness import RankDirState, evaluate_rank_dir
from profwatch.core.batches.tracker import RankDirTracker
from profwatch.simulate import ascend_tree as gen
from tests.unit.test_completeness import NOW, SETTINGS, obs


@pytest.fixture(autouse=True)
def _unfrozen() -> Iterator[None]:
    """Each test starts and ends with nothing frozen (the freezer acts on the whole process)."""
    gc.unfreeze()
    yield
    gc.unfreeze()


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _fill(tracker: RankDirTracker, states: list[RankDirState], freezer: GcFreezer) -> None:
    for s in states:
        tracker.update(s.path, s)
        freezer.after_reads(1, tree_dirs=len(tracker), pass_ended=False)


def _states(n: int, pid: int) -> list[RankDirState]:
    template = evaluate_rank_dir(obs(0, world=n), now_unix_s=NOW, settings=SETTINGS)
    return [RankDirState(**{**{f: getattr(template, f) for f in template.__dataclass_fields__},
                            "path": f"/prof/b{pid}/r{r:06d}", "rank": r, "groups": {"tp": (r, r + 1)},
                            "reasons": (f"r{r}",)})
            for r in range(n)]


def test_small_trees_never_freeze_big_ones_do() -> None:
    freezer = GcFreezer(min_tree_dirs=100, freeze_after_reads=50)
    small = RankDirTracker()
    _fill(small, _states(99, 1), freezer)
    assert freezer.freezes == 0 and gc.get_freeze_count() == 0
    big = RankDirTracker()
    _fill(big, _states(400, 2), freezer)
    assert freezer.freezes >= 5  # every 50 reads once the tree holds 100 dirs
    assert gc.get_freeze_count() > 400  # the states (and their dicts) are frozen


def test_a_full_look_at_a_big_tree_freezes_first() -> None:
    freezer = GcFreezer(min_tree_dirs=100)
    freezer.before_full_look(tree_dirs=99)
    assert freezer.freezes == 0 and gc.get_freeze_count() == 0
    freezer.before_full_look(tree_dirs=100)
    assert freezer.freezes == 1 and gc.get_freeze_count() > 0


def test_an_overflow_freezes_only_once_a_big_tree_was_seen() -> None:
    freezer = GcFreezer(min_tree_dirs=100)
    freezer.after_reads(5, tree_dirs=99, pass_ended=False)
    freezer.after_overflow()
    assert freezer.freezes == 0
    freezer.after_reads(1, tree_dirs=100, pass_ended=False)
    freezer.after_overflow()
    assert freezer.freezes == 1 and gc.get_freeze_count() > 0


def test_frozen_states_of_dropped_trees_are_freed_over_several_batches() -> None:
    freezer = GcFreezer(min_tree_dirs=100, freeze_after_reads=100)
    tracemalloc.start()
    try:
        sizes, frozen = [], []
        for batch in range(6):
            tracker = RankDirTracker()
            _fill(tracker, _states(2000, batch), freezer)
            assert gc.get_freeze_count() > 2000
            del tracker  # the capture is over and the scanner forgot its tree
            frozen.append(gc.get_freeze_count())
            sizes.append(tracemalloc.get_traced_memory()[0])
    finally:
        tracemalloc.stop()
    # what stays frozen is the rest of the process (and the last reads' young objects), not the batches: one
    # batch's states alone are > 2000 objects and several hundred KiB
    assert max(frozen[1:]) - min(frozen[1:]) < 1000, frozen
    assert max(sizes[1:]) - min(sizes[1:]) < 200_000, sizes


def test_cyclic_garbage_frozen_meanwhile_is_collected_at_the_next_refresh() -> None:
    clock = _Clock()
    freezer = GcFreezer(min_tree_dirs=1, freeze_after_reads=1, refresh_s=60.0, clock=clock)

    class Node:
        pass

    a, b = Node(), Node()
    a.other, b.other = b, a  # type: ignore[attr-defined]
    alive = weakref.ref(a)
    freezer.after_reads(1, tree_dirs=1, pass_ended=False)  # the pair is alive here: frozen with the rest
    del a, b
    gc.collect()
    assert alive() is not None  # garbage now, but frozen: a full collection skips it
    freezer.after_reads(1, tree_dirs=1, pass_ended=True)  # a pass ended, but within refresh_s: no refresh
    assert freezer.refreshes == 0 and alive() is not None
    clock.now = 61.0
    freezer.after_reads(1, tree_dirs=1, pass_ended=True)
    assert freezer.refreshes == 1 and alive() is None
    assert gc.get_freeze_count() > 0  # frozen again after the refresh


@pytest.mark.parametrize("slice_reads", ["all", "one"])
def test_incremental_scan_reports_its_reads(tmp_path: Path, slice_reads: str) -> None:
    """Issue 33 #9: flaky under load. The slice budget ran on the real clock, so a loaded box read one dir per
    slice, and the scan reported the tree's size as the dirs read so far (1, 2, 3 of 4: under ``min_tree_dirs``), so
    those reads never counted and nothing froze. A fake slice clock gives both extremes deterministically: the
    whole pass in one slice, and one dir per slice (the clock jumps past the slice at each read)."""
    gen.generate_cluster(tmp_path / "prof", world_size=4, capture_id="cap", minimal=True)
    freezer = GcFreezer(min_tree_dirs=4, freeze_after_reads=4)
    ticks = iter(range(10**6))
    clock = (lambda: 0.0) if slice_reads == "all" else (lambda: float(next(ticks)))
    scan = IncrementalScan(tmp_path / "prof", gc_freezer=freezer, clock=clock,
                           wall=lambda: gen.DEFAULT_TS_BASE_NS / 1e9 + 30)
    out = scan.update(None, capture_id="cap", world_size=4)
    assert scan.tree_dirs == 4  # listed by the walk, before the pass has read them
    updates = 1
    while out is None or scan.reconciling:
        out = scan.update((), capture_id="cap", world_size=4)
        updates += 1
    assert [b.status for b in out if b.capture_id == "cap"] == ["complete"]
    assert updates <= 2 if slice_reads == "all" else updates >= 4  # one slice (and the pass end), or one read each
    assert freezer.freezes == 1 and gc.get_freeze_count() > 0


def test_full_looks_that_come_before_any_pass_ends_still_refresh() -> None:
    # a busy big tree: each scan is a full look (more changed dirs than the watcher lists), each starts a new pass
    # that never reaches its end; every full look froze the process's cyclic garbage and none refreshed
    clock = _Clock()
    freezer = GcFreezer(min_tree_dirs=1, freeze_after_reads=10**9, refresh_s=60.0, clock=clock)

    class Node:
        pass

    a, b = Node(), Node()
    a.other, b.other = b, a  # type: ignore[attr-defined]
    alive = weakref.ref(a)
    freezer.before_full_look(tree_dirs=1)
    del a, b
    for t in range(0, 600, 30):  # ten minutes of full looks every 30 s
        clock.now = float(t)
        freezer.before_full_look(tree_dirs=1)
        freezer.after_reads(5, tree_dirs=1, pass_ended=False)
    assert freezer.refreshes >= 9 and alive() is None
    assert gc.get_freeze_count() > 0
