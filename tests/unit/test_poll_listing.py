"""The polling observer's bounded work per wake (issue 34): ``BoundedPollListing`` driven poll by poll through
watchdog's own ``DirectorySnapshot`` on a real folder, so each poll is deterministic (no observer thread)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from watchdog.utils.dirsnapshot import DirectorySnapshot, DirectorySnapshotDiff

from profwatch.adapters.fs.poll_listing import BoundedPollListing
from profwatch.adapters.fs.prof_watch import completion_scandir
from profwatch.core.batches.poll_rotation import relist_period, rotation_due
from profwatch.core.batches.settings import WatchSettings
from profwatch.simulate import ascend_tree as gen

OLD_NS = 1_000_000_000 * 1_000_000_000  # 2001: every folder's mtime set here, so a change is never within a tick


def _tree(root: Path, n: int) -> list[Path]:
    dirs = []
    for r in range(n):
        d = root / gen.rank_dir_name(f"node{r // 8}", 4000 + r, gen.DEFAULT_TS_BASE_NS + r * 1_000_000)
        out = d / "ASCEND_PROFILER_OUTPUT"
        out.mkdir(parents=True)
        (d / "profiler_metadata.json").write_text("{}")
        (d / f"profiler_info_{r}.json").write_text("{}")
        (d / "PROF_000001_x").mkdir()
        for p in (out, d):
            os.utime(p, ns=(OLD_NS, OLD_NS))
        dirs.append(d)
    os.utime(root, ns=(OLD_NS, OLD_NS))
    return dirs


class Poller:
    """One watched tree polled by hand: real stat/scandir calls counted, each rank dir's re-lists recorded."""

    def __init__(self, root: Path, max_listings: int) -> None:
        self.calls = 0
        self.listed: list[str] = []
        self.deferred: list[int] = []
        inner = completion_scandir(WatchSettings().poll_skip_dirs)

        def stat(path: str) -> os.stat_result:
            self.calls += 1
            return os.stat(path)

        def listdir(path: str | None) -> Iterator[os.DirEntry[str]]:
            self.calls += 1
            self.listed.append(os.fspath(path or "."))
            return inner(path)

        self.listing = BoundedPollListing(str(root), max_listings, stat=stat, listdir=listdir,
                                          on_deferred=self.deferred.append)
        self.root = str(root)
        self.snap = self._take()

    def _take(self) -> DirectorySnapshot:
        return DirectorySnapshot(self.root, stat=self.listing.stat, listdir=self.listing.listdir)

    def poll(self) -> DirectorySnapshotDiff:
        """One wake: the events watchdog would emit, as a diff (the listing's re-lists in ``self.listed``)."""
        self.calls, self.listed = 0, []
        new = self._take()
        diff, self.snap = DirectorySnapshotDiff(self.snap, new), new
        return diff

    def relisted(self, dirs: list[Path]) -> set[str]:
        return {str(d) for d in dirs} & set(self.listed)


def _settle(p: Poller) -> None:
    """The first two polls re-list everything (new dirs, then their first listing differed from nothing)."""
    for _ in range(2):
        p.poll()


def test_rotation_relists_at_most_the_bound_and_starves_no_rank_dir(tmp_path: Path) -> None:
    dirs = _tree(tmp_path / "prof", 64)
    p = Poller(tmp_path / "prof", 16)
    _settle(p)
    period = relist_period(64, 16)
    assert period == 4
    seen: set[str] = set()
    for _ in range(3 * period):
        diff = p.poll()
        got = p.relisted(dirs)
        assert len(got) == 16  # exactly the bound: no rank dir changed
        seen |= got
        assert not (diff.files_created or diff.files_modified or diff.dirs_modified or diff.files_deleted)
    assert seen == {str(d) for d in dirs}
    # each rank dir is re-listed exactly once in every `period` consecutive polls
    per_dir: dict[str, list[int]] = {str(d): [] for d in dirs}
    for i in range(2 * period):
        p.poll()
        for d in p.relisted(dirs):
            per_dir[d].append(i)
    assert all(len(v) == 2 and v[1] - v[0] == period for v in per_dir.values())
    assert p.listing.deferred_total >= 48 * 5 * period
    assert p.deferred[-1] == 48  # told per poll, at the next poll's start


def test_the_bound_cuts_the_calls_of_a_quiet_poll(tmp_path: Path) -> None:
    _tree(tmp_path / "prof", 64)
    bounded, whole = Poller(tmp_path / "prof", 16), Poller(tmp_path / "prof", 64)
    _settle(bounded)
    _settle(whole)
    bounded.poll()
    whole.poll()
    # every poll: the prof_dir stat'ed and listed, each rank dir and its ASCEND_PROFILER_OUTPUT/ stat'ed, the
    # output folder's (empty, no syscall) listing; re-listed: a scandir and two stats more (metadata, info)
    assert whole.calls == 2 + 64 * 6
    assert bounded.calls == 2 + 64 * 3 + 16 * 3


def test_a_marker_in_a_deferred_rank_dir_is_seen_at_the_next_poll(tmp_path: Path) -> None:
    dirs = _tree(tmp_path / "prof", 64)
    p = Poller(tmp_path / "prof", 16)
    _settle(p)
    p.poll()
    quiet = [d for d in dirs if str(d) not in p.relisted(dirs)]
    # the next poll's rotation (the slots are in first-seen order, so take one it will not re-list)
    nxt = p.listing.polls + 1
    period = relist_period(64, 16)
    target = next(d for d in quiet if not rotation_due(nxt, p.listing._known[str(d)].slot, period))  # noqa: SLF001
    torch_dir = next(d for d in quiet if d != target and not rotation_due(
        nxt, p.listing._known[str(d)].slot, period))  # noqa: SLF001
    (target / "ASCEND_PROFILER_OUTPUT" / "analyse.done").touch()  # the folder's mtime moves, not the rank dir's
    (torch_dir / "trace.done").touch()  # the rank dir's mtime moves
    diff = p.poll()
    assert str(target / "ASCEND_PROFILER_OUTPUT") in diff.dirs_modified
    assert str(target) not in p.relisted(dirs)  # seen by the folder's stat alone
    assert str(torch_dir / "trace.done") in diff.files_created
    assert str(torch_dir) in p.relisted(dirs)
    # a dir whose last look saw a change is re-listed the poll after, then cached again once quiet
    p.poll()
    assert {str(target), str(torch_dir)} <= p.relisted(dirs)


def test_an_in_place_rewrite_waits_for_rotation_within_the_period(tmp_path: Path) -> None:
    """The documented cost: a change that moves neither folder's mtime is seen within ceil(total/N) polls."""
    dirs = _tree(tmp_path / "prof", 64)
    p = Poller(tmp_path / "prof", 16)
    _settle(p)
    p.poll()
    d = next(d for d in dirs if str(d) in p.relisted(dirs))  # just re-listed: due again in `period` polls
    info = next(d.glob("profiler_info_*.json"))
    info.write_text('{"torch_npu_version": "2.1.0"}')  # bigger, same inode: the dir's mtime does not move
    period = relist_period(64, 16)
    polls = 0
    while True:
        polls += 1
        diff = p.poll()
        if str(info) in diff.files_modified:
            break
        assert polls < period
    assert polls == period


def test_vanished_and_new_rank_dirs_are_seen_at_once(tmp_path: Path) -> None:
    dirs = _tree(tmp_path / "prof", 64)
    p = Poller(tmp_path / "prof", 16)
    _settle(p)
    for d in dirs[:40]:
        for f in sorted(d.rglob("*"), reverse=True):
            f.rmdir() if f.is_dir() else f.unlink()
        d.rmdir()
    diff = p.poll()
    assert {str(d) for d in dirs[:40]} <= set(diff.dirs_deleted)
    p.poll()
    assert len(p.listing._known) == 24  # noqa: SLF001 - the gone dirs are forgotten, slots compacted
    assert relist_period(p.listing._next_slot, 16) == 2  # noqa: SLF001
    new = _tree(tmp_path / "other", 1)[0]
    moved = tmp_path / "prof" / new.name.replace("node0", "node99")
    new.rename(moved)
    diff = p.poll()
    assert str(moved) in diff.dirs_created and str(moved / "trace.done") not in diff.files_created
    assert str(moved) in p.relisted([moved])


def test_rotation_is_bounded_for_every_tree_size() -> None:
    sizes = [(p, s) for p in (1, 16, 1024) for s in (0, 1, p - 1, p, p + 1, 3 * p + 7, 16_384)
             if s * relist_period(s, p) <= 300_000]  # (1, 16384) would be 16384 polls of 16384 slots
    assert (1024, 16_384) in sizes
    for per_poll, slots in sizes:
        period = relist_period(slots, per_poll)
        counts = [sum(rotation_due(poll, s, period) for s in range(slots)) for poll in range(period)]
        assert max(counts, default=0) <= per_poll
        assert all(sum(rotation_due(poll, s, period) for poll in range(period)) == 1 for s in range(slots))
    with pytest.raises(ValueError, match="per_poll"):
        relist_period(10, 0)


def test_the_setting_has_a_floor() -> None:
    assert WatchSettings().poll_max_rank_dir_listings == 1024
    with pytest.raises(ValueError, match="greater than or equal to 16"):
        WatchSettings(poll_max_rank_dir_listings=4)
