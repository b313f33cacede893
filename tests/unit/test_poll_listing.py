"""The polling observer's bounded work per wake (docs/rank-dirs.md#polling-bound): ``RankTreePoller`` driven poll by
poll on a real folder, so each poll is deterministic (no observer thread)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from watchdog.events import (
    DirCreatedEvent,
    DirDeletedEvent,
    DirModifiedEvent,
    FileCreatedEvent,
    FileDeletedEvent,
    FileModifiedEvent,
    FileSystemEvent,
)

from profwatch.adapters.fs.poll_listing import RankTreePoller
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
    """One watched tree polled by hand: real stat/scandir calls counted, the rank dirs each poll re-listed."""

    def __init__(self, root: Path, max_listings: int) -> None:
        self.calls = 0
        self.listed: list[str] = []

        def stat(path: str) -> os.stat_result:
            self.calls += 1
            return os.stat(path)

        def scandir(path: str) -> Any:
            self.calls += 1
            self.listed.append(path)
            return os.scandir(path)

        self.poller = RankTreePoller(str(root), max_listings, skip=WatchSettings().poll_skip_dirs, stat=stat,
                                     scandir=scandir)

    def poll(self) -> list[FileSystemEvent]:
        """One wake: the events watchdog's emitter would queue."""
        self.calls, self.listed = 0, []
        return self.poller.poll()

    def relisted(self, dirs: list[Path]) -> set[str]:
        return {str(d) for d in dirs} & set(self.listed)


def _paths(events: list[FileSystemEvent], kind: type[FileSystemEvent]) -> set[str]:
    return {os.fsdecode(e.src_path) for e in events if type(e) is kind}


def _settle(p: Poller) -> None:
    """The first poll learns the tree (no events), the second re-lists every rank dir (all new); then quiet."""
    assert p.poll() == []
    p.poll()


def test_rotation_relists_at_most_the_bound_and_starves_no_rank_dir(tmp_path: Path) -> None:
    dirs = _tree(tmp_path / "prof", 64)
    p = Poller(tmp_path / "prof", 16)
    _settle(p)
    period = relist_period(64, 16)
    assert period == 4
    seen: set[str] = set()
    for _ in range(3 * period):
        assert p.poll() == []  # nothing changed
        got = p.relisted(dirs)
        assert len(got) == 16  # exactly the bound
        assert p.poller.last_deferred == 48
        seen |= got
    assert seen == {str(d) for d in dirs}
    per_dir: dict[str, list[int]] = {str(d): [] for d in dirs}
    for i in range(2 * period):
        p.poll()
        for d in p.relisted(dirs):
            per_dir[d].append(i)
    assert all(len(v) == 2 and v[1] - v[0] == period for v in per_dir.values())  # every `period` polls, exactly
    assert p.poller.deferred_total == 48 * 5 * period


def test_the_bound_cuts_the_calls_of_a_quiet_poll(tmp_path: Path) -> None:
    _tree(tmp_path / "prof", 64)
    bounded, every = Poller(tmp_path / "prof", 16), Poller(tmp_path / "prof", 64)
    _settle(bounded)
    _settle(every)
    bounded.poll()
    every.poll()
    # every poll: the prof_dir stat'ed and listed; a rank dir re-listed: it and its ASCEND_PROFILER_OUTPUT/ stat'ed, a
    # scandir and a stat of profiler_metadata.json, of profiler_info_N.json and of ASCEND_PROFILER_OUTPUT/analyse.done;
    # one waiting for its marker and not due: its ASCEND_PROFILER_OUTPUT/ stat'ed (only analyse.done can come there)
    assert every.calls == 2 + 64 * 2 + 64 * 4
    assert bounded.calls == 2 + 48 * 1 + 16 * (2 + 4)


def test_finished_rank_dirs_are_looked_at_by_rotation_only(tmp_path: Path) -> None:
    """Once a rank dir's marker was seen, neither of its folders is stat'ed between its rotation re-lists: a quiet
    poll of a finished tree costs the same at any size (the bound), and a re-parse deleting its
    ASCEND_PROFILER_OUTPUT/ is seen within the rotation period, as an in-place rewrite is."""
    dirs = _tree(tmp_path / "prof", 64)
    p = Poller(tmp_path / "prof", 16)
    _settle(p)
    for d in dirs:
        (d / "ASCEND_PROFILER_OUTPUT" / "analyse.done").touch()
    created = p.poll()
    assert _paths(created, FileCreatedEvent) == {str(d / "ASCEND_PROFILER_OUTPUT" / "analyse.done") for d in dirs}
    p.poll()  # each saw a change: re-listed once more, then quiet
    skipped = p.poller.stats_skipped_total
    assert p.poll() == []
    assert p.calls == 2 + 16 * (2 + 4)  # the prof_dir, and the 16 rank dirs due: 48 rank dirs cost nothing
    assert p.poller.stats_skipped_total - skipped == 48 * 2
    period = relist_period(64, 16)
    out = dirs[5] / "ASCEND_PROFILER_OUTPUT"
    shutil.rmtree(out)  # a re-parse starts over
    gone_at = [i for i in range(1, period + 1) if str(out) in _paths(p.poll(), DirDeletedEvent)]
    assert len(gone_at) == 1 and gone_at[0] <= period


def test_a_marker_in_a_deferred_rank_dir_is_seen_at_the_next_poll(tmp_path: Path) -> None:
    dirs = _tree(tmp_path / "prof", 64)
    torch_dir = dirs[-1].with_name(dirs[-1].name.replace("_ascend_pt", "_torch_pt"))  # trace.done lands in it
    shutil.rmtree(dirs[-1] / "ASCEND_PROFILER_OUTPUT")
    dirs[-1] = dirs[-1].rename(torch_dir)
    for f in (torch_dir, tmp_path / "prof"):
        os.utime(f, ns=(OLD_NS, OLD_NS))
    p = Poller(tmp_path / "prof", 16)
    _settle(p)
    period = relist_period(64, 16)

    def due_next(d: Path) -> bool:
        return rotation_due(p.poller.polls + 1, p.poller._known[str(d)].slot, period)  # noqa: SLF001

    while due_next(torch_dir):
        p.poll()
    target = next(d for d in dirs if d != torch_dir and not due_next(d))
    (target / "ASCEND_PROFILER_OUTPUT" / "analyse.done").touch()  # moves the output folder's mtime only
    (torch_dir / "trace.done").touch()  # moves the rank dir's mtime
    events = p.poll()
    assert str(target / "ASCEND_PROFILER_OUTPUT") in _paths(events, DirModifiedEvent)
    assert str(torch_dir / "trace.done") in _paths(events, FileCreatedEvent)
    assert {str(target), str(torch_dir)} <= p.relisted(dirs)  # evidence of a change: re-listed on top of the bound
    assert len(p.relisted(dirs)) == 16 + 2
    p.poll()
    assert {str(target), str(torch_dir)} <= p.relisted(dirs)  # its last look saw a change: once more
    assert not any(p.poller._known[str(d)].active for d in (target, torch_dir))  # noqa: SLF001 - quiet: rotation


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
    seen_at = [i for i in range(1, period + 1) if str(info) in _paths(p.poll(), FileModifiedEvent)]
    assert seen_at == [period]


def test_a_marker_whose_folder_mtime_did_not_move_is_seen_within_the_period(tmp_path: Path) -> None:
    """``analyse.done`` lands in ``ASCEND_PROFILER_OUTPUT/`` but its folder's mtime does not move (a cached or
    coarse mtime): the rotation re-list stats the marker, so it is seen within ceil(total/N) polls, as the
    docstring says; its removal too."""
    dirs = _tree(tmp_path / "prof", 64)
    p = Poller(tmp_path / "prof", 16)
    _settle(p)
    p.poll()
    d = next(d for d in dirs if str(d) in p.relisted(dirs))  # just re-listed: due again in `period` polls
    marker = d / "ASCEND_PROFILER_OUTPUT" / "analyse.done"
    marker.touch()
    os.utime(marker.parent, ns=(OLD_NS, OLD_NS))  # the folder's mtime as it was
    period = relist_period(64, 16)
    seen_at = [i for i in range(1, period + 1) if str(marker) in _paths(p.poll(), FileCreatedEvent)]
    assert seen_at == [period]
    assert str(marker) not in _paths(p.poll(), FileCreatedEvent)  # reported once
    marker.unlink()
    os.utime(marker.parent, ns=(OLD_NS, OLD_NS))
    gone_at = [i for i in range(1, period + 1) if str(marker) in _paths(p.poll(), FileDeletedEvent)]
    assert len(gone_at) == 1 and gone_at[0] <= period


def test_vanished_and_new_rank_dirs_and_folders_are_seen_at_once(tmp_path: Path) -> None:
    dirs = _tree(tmp_path / "prof", 64)
    p = Poller(tmp_path / "prof", 16)
    _settle(p)
    for d in dirs[:40]:
        shutil.rmtree(d)
    events = p.poll()
    assert _paths(events, DirDeletedEvent) == {str(d) for d in dirs[:40]}
    assert len(p.poller._known) == 24  # noqa: SLF001 - the gone dirs are forgotten, slots compacted
    assert relist_period(p.poller._next_slot, 16) == 2  # noqa: SLF001
    host = tmp_path / "prof" / "host9"
    new = _tree(host, 1)[0]
    events = p.poll()
    assert str(host) in _paths(events, DirCreatedEvent) and str(new) in _paths(events, DirCreatedEvent)
    shutil.rmtree(host)
    events = p.poll()
    assert {str(host), str(new)} <= _paths(events, DirDeletedEvent)  # a folder above rank dirs went: a full look
    (tmp_path / "prof" / "PROF_000001_x").mkdir()  # skipped: never listed
    p.poll()
    assert str(tmp_path / "prof" / "PROF_000001_x") not in p.listed


def test_a_root_that_went_raises_and_keeps_what_was_seen(tmp_path: Path) -> None:
    dirs = _tree(tmp_path / "prof", 4)
    p = Poller(tmp_path / "prof", 16)
    _settle(p)
    (tmp_path / "prof").rename(tmp_path / "away")
    with pytest.raises(FileNotFoundError):
        p.poll()
    (tmp_path / "away").rename(tmp_path / "prof")
    assert p.poll() == [] and len(p.poller._known) == len(dirs)  # noqa: SLF001


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


def test_a_finished_rank_dir_replaced_under_the_same_name_is_looked_at_the_next_poll(tmp_path: Path) -> None:
    """A finished rank dir (marker seen: not stat'ed between its rotation re-lists) moved away and replaced by
    another folder of the same name, without a marker: its folder's listing shows another inode, so it is stat'ed
    and re-listed at the next poll (before: nothing until its rotation re-list, up to the period later; the
    parent's DirModifiedEvent names no rank dir)."""
    dirs = _tree(tmp_path / "prof", 64)
    p = Poller(tmp_path / "prof", 16)
    _settle(p)
    for d in dirs:
        (d / "ASCEND_PROFILER_OUTPUT" / "analyse.done").touch()
    p.poll()
    p.poll()
    assert p.poll() == []
    period = relist_period(64, 16)
    known = p.poller._known  # noqa: SLF001 - which rank dir rotation re-lists at the next poll
    target = next(d for d in dirs if not rotation_due(p.poller.polls + 1, known[str(d)].slot, period))
    target.rename(tmp_path / "moved-away")
    (target / "ASCEND_PROFILER_OUTPUT").mkdir(parents=True)
    (target / "profiler_metadata.json").write_text("{}")
    events = p.poll()
    assert str(target) in p.relisted(dirs) and period > 1
    assert str(target / "ASCEND_PROFILER_OUTPUT" / "analyse.done") in _paths(events, FileDeletedEvent)
