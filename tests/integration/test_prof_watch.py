"""ProfWatcher on real folders: inotify and polling observers, supervision, overflow rescans, mount detection.

Completion is always decided by scan_tree from the wake callback, never by an event (docs/field-cases.md#fc-18).
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from watchdog.events import (
    DirCreatedEvent,
    DirDeletedEvent,
    FileMovedEvent,
    FileSystemEvent,
    FileSystemEventHandler,
)
from watchdog.observers.api import BaseObserver
from watchdog.observers.polling import PollingObserver

from profwatch.adapters.fs.inotify_observer import RankDirsChangedEvent
from profwatch.adapters.fs.prof_watch import (
    ProfWatcher,
    fs_type_of,
    is_network_fs,
    make_inotify_observer,
    parse_mountinfo,
)
from profwatch.adapters.fs.rank_dir_fs import RankDirReader, scan_tree
from profwatch.adapters.outputs.metrics import DaemonMetrics
from profwatch.core.batches.settings import WatchSettings
from profwatch.simulate import ascend_tree as gen
from tests.conftest import wait_for

EARLY = gen.DEFAULT_TS_BASE_NS / 1e9 + 30
FAST = {"poll_interval_s": 0.1, "supervise_interval_s": 0.05, "reconcile_interval_s": 30.0}


class Recorder:
    """on_wake callback that re-scans the prof_dir and keeps the latest batch statuses."""

    def __init__(self) -> None:
        self.wakes: list[str] = []
        self.status: dict[str, str] = {}
        self.reader = RankDirReader()
        self.lock = threading.Lock()

    def __call__(self, prof_dir: str) -> None:
        try:
            batches = scan_tree(prof_dir, now=EARLY, reader=self.reader, world_size=4)
        except OSError:
            batches = []
        with self.lock:
            self.wakes.append(prof_dir)
            self.status = {b.batch_id: b.status for b in batches}

    def count(self, prof_dir: str | None = None) -> int:
        with self.lock:
            return sum(1 for w in self.wakes if prof_dir is None or w == prof_dir)


def _recording_inotify(**options: Any) -> tuple[list[BaseObserver], Callable[[str, Callable[[], None]], BaseObserver]]:
    """An observer factory for ``ProfWatcher`` that builds ``make_inotify_observer(on_overflow, **options)`` and the
    list it appends each observer it built to (a test reads their watches and emitters)."""
    observers: list[BaseObserver] = []

    def factory(mode: str, on_overflow: Callable[[], None]) -> BaseObserver:
        obs = make_inotify_observer(on_overflow, **options)
        observers.append(obs)
        return obs

    return observers, factory


@pytest.mark.parametrize("observer", ["inotify", "polling"])
def test_batch_completes_only_after_last_marker(tmp_path: Path, observer: str) -> None:
    rec = Recorder()
    prof = tmp_path / "prof"
    with ProfWatcher(rec, settings=WatchSettings(observer=observer, **FAST)) as w:  # type: ignore[arg-type]
        assert w.watch(prof) == observer  # not created yet: armed when it appears
        dirs = gen.generate_cluster(prof, world_size=4, capture_id="cap", with_marker=False)
        wait_for(lambda: rec.status.get("cap") == "parsing", 10, what="parsing seen")
        n = rec.count()  # read before the touches: the wakes they cause may all be over before the next line
        for d in dirs[:3]:
            (d / "ASCEND_PROFILER_OUTPUT" / "analyse.done").touch()
        wait_for(lambda: rec.count() > n, 10, what="wake after markers")
        assert rec.status["cap"] == "parsing"  # three markers are not a complete batch
        (dirs[3] / "ASCEND_PROFILER_OUTPUT" / "analyse.done").touch()
        wait_for(lambda: rec.status.get("cap") == "complete", 10, what="complete")


def test_unwatch_stops_wakes(tmp_path: Path) -> None:
    rec = Recorder()
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    with ProfWatcher(rec, settings=WatchSettings(observer="inotify", **FAST)) as w:
        w.watch(a)
        w.watch(b)
        wait_for(lambda: rec.count(str(a)) and rec.count(str(b)), 5, what="initial wakes")
        w.unwatch(a)
        before_a = rec.count(str(a))
        (a / "x").write_text("1")
        n_b = rec.count(str(b))
        (b / "y").write_text("1")
        wait_for(lambda: rec.count(str(b)) > n_b, 5, what="wake for b")
        assert rec.count(str(a)) == before_a
        assert set(w.watched()) == {str(b)}


def test_recreated_prof_dir_is_rewatched(tmp_path: Path) -> None:
    rec = Recorder()
    prof = tmp_path / "prof"
    prof.mkdir()
    with ProfWatcher(rec, settings=WatchSettings(observer="inotify", **FAST)) as w:
        w.watch(prof)
        wait_for(lambda: rec.count() >= 1, 5)
        shutil.rmtree(prof)
        prof.mkdir()
        wait_for(lambda: rec.count() >= 2, 5, what="wake on recreate")
        gen.generate_cluster(prof, world_size=4, capture_id="again")
        wait_for(lambda: rec.status.get("again") == "complete", 10, what="complete after recreate")


def test_dead_observer_is_restarted(tmp_path: Path) -> None:
    created: list[BaseObserver] = []

    def factory(mode: str, on_overflow: Callable[[], None]) -> BaseObserver:
        obs = PollingObserver(timeout=0.1)
        created.append(obs)
        return obs

    rec = Recorder()
    prof = tmp_path / "prof"
    prof.mkdir()
    with ProfWatcher(rec, settings=WatchSettings(observer="polling", **FAST), observer_factory=factory) as w:
        w.watch(prof)
        wait_for(lambda: rec.count() >= 1, 5)
        created[0].stop()  # the observer thread dies (docs/field-cases.md#fc-16)
        created[0].join(5)
        wait_for(lambda: w.stats.observer_restarts >= 1 and len(created) == 2, 5, what="restart")
        gen.generate_cluster(prof, world_size=4, capture_id="after")
        wait_for(lambda: rec.status.get("after") == "complete", 10, what="events after restart")


def test_overflow_triggers_rescan(tmp_path: Path) -> None:

    observers, factory = _recording_inotify()

    rec = Recorder()
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    with ProfWatcher(rec, settings=WatchSettings(observer="inotify", **FAST), observer_factory=factory) as w:
        w.watch(a)
        w.watch(b)
        wait_for(lambda: rec.count(str(a)) and rec.count(str(b)), 5)
        na, nb = rec.count(str(a)), rec.count(str(b))
        observers[0].simulate_overflow()  # type: ignore[attr-defined]
        wait_for(lambda: rec.count(str(a)) > na and rec.count(str(b)) > nb, 5, what="rescan of every dir")
        assert w.stats.overflows == 2  # one inotify instance per prof_dir: each overflowed


def test_reconcile_wakes_without_events(tmp_path: Path) -> None:
    rec = Recorder()
    settings = WatchSettings(observer="polling", poll_interval_s=30, supervise_interval_s=0.05,
                             reconcile_interval_s=0.1)
    with ProfWatcher(rec, settings=settings) as w:
        w.watch(tmp_path)
        wait_for(lambda: w.stats.reconciles >= 2 and rec.count() >= 3, 5, what="reconcile wakes")


def test_without_its_own_reconcile_the_watcher_wakes_only_for_events(tmp_path: Path) -> None:
    """The coordinator's watcher (``reconcile=False``): the capture shell's tick is the one reconcile timer, so the
    watcher's rounds pass without a wake, and an event still wakes."""
    rec = Recorder()
    settings = WatchSettings(observer="inotify", poll_interval_s=30, supervise_interval_s=0.05,
                             reconcile_interval_s=0.05)
    with ProfWatcher(rec, settings=settings, reconcile=False) as w:
        w.watch(tmp_path)
        wait_for(lambda: rec.count() >= 1, 10, what="the first look when the watch starts")
        first = rec.count()
        left = w.stats.reconciles_left
        wait_for(lambda: w.stats.reconciles_left >= left + 4, 10, what="reconcile rounds left to the caller")
        assert w.stats.reconciles == 0 and rec.count() == first  # no timer wakes
        (tmp_path / "moved").mkdir()
        (tmp_path / "moved").rename(tmp_path / "gone")  # a folder moved below the prof_dir: a full look
        wait_for(lambda: rec.count() > first, 10, what="the event's wake")


def test_callback_errors_do_not_stop_watching(tmp_path: Path) -> None:
    calls: list[str] = []

    def bad(prof_dir: str) -> None:
        calls.append(prof_dir)
        raise RuntimeError("bug in the logic")

    with ProfWatcher(bad, settings=WatchSettings(observer="inotify", **FAST)) as w:
        w.watch(tmp_path)
        wait_for(lambda: calls, 5)
        (tmp_path / "x").write_text("1")
        wait_for(lambda: len(calls) >= 2, 5)


MOUNTINFO = """\
22 1 0:21 / / rw,relatime - ext4 /dev/sda1 rw
30 22 0:40 / /mnt/shared rw,relatime shared:5 - nfs4 srv:/export rw,vers=4.2
31 22 0:41 / /mnt/my\\040data rw - fuse.sshfs host: rw
32 30 0:42 / /mnt/shared/local rw - xfs /dev/sdb rw
"""


def test_mountinfo_and_network_detection(tmp_path: Path) -> None:
    mounts = parse_mountinfo(MOUNTINFO)
    assert ("/mnt/my data", "fuse.sshfs") in mounts
    patterns = WatchSettings().network_fs_types
    assert fs_type_of("/mnt/shared/run1/prof", mounts) == "nfs4"
    assert fs_type_of("/mnt/shared/local/x", mounts) == "xfs"
    assert fs_type_of("/home/u", mounts) == "ext4"
    assert fs_type_of("/mnt/sharedX", mounts) == "ext4"
    assert is_network_fs("fuse.sshfs", patterns) and is_network_fs("nfs4", patterns)
    assert not is_network_fs("ext4", patterns) and not is_network_fs(None, patterns)
    fake = tmp_path / "mountinfo"
    fake.write_text(f"22 1 0:21 / / rw - ext4 /dev/sda1 rw\n40 22 0:50 / {tmp_path}/nfs rw - nfs srv:/x rw\n")
    (tmp_path / "nfs").mkdir()
    with ProfWatcher(lambda p: None, settings=WatchSettings(**FAST), mountinfo_path=str(fake)) as w:
        assert w.watch(tmp_path / "nfs" / "prof") == "polling"  # not created yet: its mount decides
        assert w.watch(tmp_path / "local") == "inotify"


def test_watch_limit_polls_what_inotify_could_not_watch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The inotify watch limit (ENOSPC) reached below a watched prof_dir: that subtree is polled.
    Simulated by making the kernel call fail for the directories named ``deep*``; the rest is real inotify."""
    import errno

    from structlog.testing import capture_logs

    from profwatch.adapters.fs import inotify_observer
    from profwatch.adapters.outputs.metrics import DaemonMetrics

    real = inotify_observer._add_watch

    def limited(fd: int, path: str, mask: int) -> int:
        if Path(path).name.startswith("deep"):
            raise OSError(errno.ENOSPC, "inotify watch limit reached")
        return real(fd, path, mask)

    monkeypatch.setattr(inotify_observer, "_add_watch", limited)
    rec = Recorder()
    prof = tmp_path / "prof"
    (prof / "deep" / "deeper").mkdir(parents=True)
    metrics = DaemonMetrics("test")
    with capture_logs() as logs, ProfWatcher(rec, settings=WatchSettings(observer="inotify", **FAST),
                                             metrics=metrics) as w:
        assert w.watch(prof) == "inotify"
        wait_for(lambda: w.polled_subtrees() == {str(prof): [str(prof / "deep")]}, 10, what="deep polled")
        n = rec.count()
        (prof / "deep" / "deeper" / "x").write_text("1")  # no inotify watch there: only polling sees it
        wait_for(lambda: rec.count() > n, 10, what="wake from a polled subtree")
        (prof / "deep_late").mkdir()  # a directory created later hits the limit too
        wait_for(lambda: w.stats.watch_limit_fallbacks == 2, 10, what="late subtree polled")
        n = rec.count()
        gen.generate_cluster(prof / "deep_late", world_size=4, capture_id="late")
        wait_for(lambda: rec.status.get("late") == "complete", 20, what="complete from polling")
        (prof / "shallow").mkdir()  # unaffected directories stay on inotify
        assert str(prof / "shallow") not in w.polled_subtrees()[str(prof)]
        shutil.rmtree(prof / "deep")
        wait_for(lambda: w.polled_subtrees() == {str(prof): [str(prof / "deep_late")]}, 10, what="gone: unpolled")
    limit_logs = [e for e in logs if e["event"] == "inotify_watch_limit_reached"]
    assert len(limit_logs) == 1 and "max_user_watches" in limit_logs[0]["action"]  # logged once
    assert metrics.registry.get_sample_value("profwatch_watch_fallbacks_total", {"reason": "watch_limit"}) == 2
    assert w.stats.polling_fallbacks == 0  # the root itself was watched by inotify


def test_inotify_watches_follow_the_layout_not_the_whole_tree(tmp_path: Path) -> None:
    """Two watches per rank dir (itself and ASCEND_PROFILER_OUTPUT/) plus the folders above rank dirs; raw data
    (PROF_*/device_*/data ...) is never watched. Rank dirs inside a folder that appears later (or moved in whole)
    are armed and reported, and their markers still complete the batch."""
    observers, factory = _recording_inotify()

    rec = Recorder()
    prof = tmp_path / "prof"
    dirs = gen.generate_cluster(prof / "job" / "a", world_size=4, capture_id="cap", with_marker=False)
    for d in dirs:  # raw data as torch_npu leaves it: folders a recursive watch would have to watch
        for sub in ("PROF_000001_20260101120000000_TEST/device_0/data", "PROF_000001_20260101120000000_TEST/host/data",
                    "FRAMEWORK", "logs"):
            (d / sub).mkdir(parents=True)
    assert sum(1 for d in dirs for p in d.rglob("*") if p.is_dir()) == 8 * len(dirs)
    with ProfWatcher(rec, settings=WatchSettings(observer="inotify", **FAST), observer_factory=factory) as w:
        w.watch(prof)
        wait_for(lambda: rec.status.get("cap") == "parsing", 10, what="parsing seen")
        wait_for(lambda: observers[0].watch_count() == 3 + 2 * 4, 10,  # type: ignore[attr-defined]
                 what="prof, job, job/a, and two per rank dir")
        for d in dirs:
            (d / "ASCEND_PROFILER_OUTPUT" / "analyse.done").touch()
        wait_for(lambda: rec.status.get("cap") == "complete", 10, what="complete from the markers' events")
        staged = tmp_path / "staged"  # a folder of finished rank dirs moved in whole: no event of their own
        gen.generate_cluster(staged / "b", world_size=4, capture_id="moved", with_marker=True)
        staged.rename(prof / "job" / "moved")
        wait_for(lambda: rec.status.get("moved") == "complete", 10, what="rank dirs moved in are read")
        wait_for(lambda: observers[0].watch_count() == 5 + 2 * 8, 10,  # type: ignore[attr-defined]
                 what="the moved-in folders and their rank dirs armed")


def test_a_burst_of_markers_costs_one_event_each_and_few_deliveries(tmp_path: Path) -> None:
    """Issue 34: a marker created and closed within one read of the inotify fd is one ``FileCreatedEvent`` (its
    ``IN_CLOSE_WRITE`` folded into it), and a burst's rank dirs reach ``on_rank_dirs`` gathered (``GATHER_S``),
    not one call per marker; a file closed after a later write still raises its ``FileClosedEvent``."""
    observers, factory = _recording_inotify()

    prof = tmp_path / "prof"
    dirs = gen.generate_cluster(prof / "a", world_size=64, capture_id="cap", with_marker=False)
    calls: list[frozenset[str]] = []
    events: list[tuple[str, str]] = []
    lock = threading.Lock()

    def on_rank_dirs(prof_dir: str, rank_dirs: frozenset[str]) -> None:
        with lock:
            calls.append(rank_dirs)

    class Seen(FileSystemEventHandler):
        def on_any_event(self, event: FileSystemEvent) -> None:
            with lock:
                events.append((event.event_type, str(event.src_path)))

    with ProfWatcher(lambda p: None, settings=WatchSettings(observer="inotify", **FAST), observer_factory=factory,
                     on_rank_dirs=on_rank_dirs) as w:
        w.watch(prof)
        wait_for(lambda: observers and observers[0].watch_count() == 2 + 2 * 64, 10,  # type: ignore[attr-defined]
                 what="prof, a, and two per rank dir")
        emitter = next(iter(observers[0].emitters))
        observers[0].add_handler_for_watch(Seen(), emitter.watch)
        markers = [d / "ASCEND_PROFILER_OUTPUT" / "analyse.done" for d in dirs]
        with emitter._fd_lock:  # the emitter reads nothing meanwhile: every marker's two events wait in one queue
            for m in markers:
                m.touch()
        named = lambda: {d for c in calls for d in c}  # noqa: E731
        wait_for(lambda: named() >= {str(d) for d in dirs}, 10, what="every rank dir named")
        wait_for(lambda: sum(1 for k, p in events if p.endswith("analyse.done")) >= 64, 10, what="marker events")
        with markers[0].open("a") as fh:  # a later write and close: its own read, its own closed event
            fh.write("x")
        wait_for(lambda: ("closed", str(markers[0])) in events, 10, what="the later close")
    with lock:
        kinds = [k for k, p in events if p.endswith("analyse.done")]
    assert kinds.count("created") == 64 and kinds.count("closed") == 1, kinds
    assert emitter.closes_folded == 64  # type: ignore[attr-defined]
    assert len(calls) <= 16, f"{len(calls)} deliveries for a burst of 64 markers"


def test_the_daemons_inotify_observer_gathers_a_reads_rank_dir_files_into_one_event(tmp_path: Path) -> None:
    """The observer ProfWatcher builds itself gathers the files changed in rank dirs within one read of the inotify
    fd into one ``RankDirsChangedEvent`` naming their rank dirs (no per-file event, no per-file handler call), and
    the rank dirs still reach ``on_rank_dirs``; moves and folders inside a rank dir keep their own events, a
    deleted file names its rank dir, and a recreated ``ASCEND_PROFILER_OUTPUT/`` is watched again."""
    prof = tmp_path / "prof"
    dirs = gen.generate_cluster(prof / "a", world_size=64, capture_id="cap", with_marker=False)
    named: list[str] = []
    events: list[FileSystemEvent] = []
    lock = threading.Lock()

    def on_rank_dirs(prof_dir: str, rank_dirs: frozenset[str]) -> None:
        with lock:
            named.extend(rank_dirs)

    class Seen(FileSystemEventHandler):
        def on_any_event(self, event: FileSystemEvent) -> None:
            with lock:
                events.append(event)

    def seen(kind: type[FileSystemEvent]) -> list[FileSystemEvent]:
        with lock:
            return [e for e in events if isinstance(e, kind)]

    with ProfWatcher(lambda p: None, settings=WatchSettings(observer="inotify", **FAST),
                     on_rank_dirs=on_rank_dirs) as w:
        w.watch(prof)
        obs = w._observers["inotify"]  # noqa: SLF001 - the observer the watcher built (no factory)
        wait_for(lambda: obs.watch_count() == 2 + 2 * 64, 10, what="prof, a, and two per rank dir")  # type: ignore[attr-defined]
        emitter = next(iter(obs.emitters))
        obs.add_handler_for_watch(Seen(), emitter.watch)
        with emitter._fd_lock:  # noqa: SLF001 - nothing is read meanwhile: every marker's events in one read
            for d in dirs:
                (d / "ASCEND_PROFILER_OUTPUT" / "analyse.done").touch()
        want = {str(d) for d in dirs}
        wait_for(lambda: want <= set(named), 10, what="every rank dir named")
        gathered = seen(RankDirsChangedEvent)
        assert len(gathered) == 1 and gathered[0].rank_dirs == want  # type: ignore[attr-defined]
        assert gathered[0].src_path == str(prof)
        assert not [e for e in events if str(e.src_path).endswith("analyse.done")]  # no per-file event

        out = dirs[0] / "ASCEND_PROFILER_OUTPUT"
        (out / "analyse.done").rename(out / "analyse.old")  # a move: its own event, as before
        wait_for(lambda: any(e.src_path == str(out / "analyse.done") for e in seen(FileMovedEvent)), 10,
                 what="the move's own event")
        with lock:
            named.clear()
        (dirs[1] / "ASCEND_PROFILER_OUTPUT" / "analyse.done").unlink()
        wait_for(lambda: str(dirs[1]) in named, 10, what="a deleted marker names its rank dir")
        shutil.rmtree(dirs[2] / "ASCEND_PROFILER_OUTPUT")  # a re-parse: the folder goes and comes back
        wait_for(lambda: any(e.src_path == str(dirs[2] / "ASCEND_PROFILER_OUTPUT") for e in seen(DirDeletedEvent)),
                 10, what="the folder's own deleted event")
        (dirs[2] / "ASCEND_PROFILER_OUTPUT").mkdir()
        wait_for(lambda: any(e.src_path == str(dirs[2] / "ASCEND_PROFILER_OUTPUT") for e in seen(DirCreatedEvent)),
                 10, what="the folder's own created event")
        wait_for(lambda: obs.watch_count() == 2 + 2 * 64, 10, what="the new folder watched")  # type: ignore[attr-defined]
        with lock:
            named.clear()
        (dirs[2] / "ASCEND_PROFILER_OUTPUT" / "analyse.done").touch()
        wait_for(lambda: str(dirs[2]) in named, 10, what="a marker in the recreated folder")


def test_after_a_read_naming_rank_dirs_the_emitter_waits_so_a_bursts_markers_come_in_one_read(
        tmp_path: Path) -> None:
    """With ``gather_s``, the emitter waits that long after a read that named rank dirs before it reads again: the
    markers written meanwhile (and the first marker's close) come in one more read and one ``RankDirsChangedEvent``,
    instead of a read, an event and a handler call per marker; every rank dir is still named, and a marker written
    after the pause is read on its own. Without ``gather_s`` the same writes take a read each or so (not asserted:
    scheduling decides)."""
    observers, factory = _recording_inotify(gather_rank_dirs=True, gather_s=1.0)

    prof = tmp_path / "prof"
    dirs = gen.generate_cluster(prof / "a", world_size=64, capture_id="cap", with_marker=False)
    named: list[str] = []
    gathered: list[frozenset[str]] = []
    lock = threading.Lock()

    def on_rank_dirs(prof_dir: str, rank_dirs: frozenset[str]) -> None:
        with lock:
            named.extend(rank_dirs)

    class Seen(FileSystemEventHandler):
        def on_any_event(self, event: FileSystemEvent) -> None:
            if isinstance(event, RankDirsChangedEvent):
                with lock:
                    gathered.append(event.rank_dirs)

    def named_now() -> set[str]:
        with lock:
            return set(named)

    with ProfWatcher(lambda p: None, settings=WatchSettings(observer="inotify", **FAST), observer_factory=factory,
                     on_rank_dirs=on_rank_dirs) as w:
        w.watch(prof)
        wait_for(lambda: observers and observers[0].watch_count() == 2 + 2 * 64, 10,  # type: ignore[attr-defined]
                 what="prof, a, and two per rank dir")
        emitter = next(iter(observers[0].emitters))
        observers[0].add_handler_for_watch(Seen(), emitter.watch)
        markers = [d / "ASCEND_PROFILER_OUTPUT" / "analyse.done" for d in dirs]
        markers[0].touch()
        wait_for(lambda: str(dirs[0]) in named_now(), 10, what="the first marker's rank dir named")
        reads = emitter.reads  # type: ignore[attr-defined]
        for m in markers[1:]:  # within the emitter's pause (1 s): they wait in the kernel's queue
            m.touch()
        wait_for(lambda: named_now() >= {str(d) for d in dirs}, 10, what="every rank dir named")
        assert emitter.reads - reads <= 2, f"{emitter.reads - reads} reads for 63 markers"  # type: ignore[attr-defined]
        with lock:
            named.clear()
        markers[0].unlink()  # after the pause: read and named again
        wait_for(lambda: str(dirs[0]) in named_now(), 10, what="a later change named")
    with lock:
        assert set().union(*gathered) >= {str(d) for d in dirs}
        assert len(gathered) <= 4, f"{len(gathered)} gathered events for 64 markers"


def test_polling_bounds_the_listings_per_wake_and_still_sees_each_marker(tmp_path: Path) -> None:
    """Issue 34: with more rank dirs than ``poll_max_rank_dir_listings``, the real polling observer serves the quiet
    ones from their cached listing (counted) and a marker in any of them still completes the batch."""
    prof = tmp_path / "prof"
    dirs = gen.generate_cluster(prof, world_size=4, capture_id="cap", with_marker=False)
    gen.generate_cluster(prof, world_size=36, capture_id="other", with_marker=True, minimal=True,
                         ts_base=gen.DEFAULT_TS_BASE_NS + 10**12)  # quiet, finished rank dirs: 40 > the bound
    assert len([p for p in prof.iterdir() if p.is_dir()]) == 40
    rec = Recorder()
    settings = WatchSettings(observer="polling", poll_max_rank_dir_listings=16, **FAST)
    metrics = DaemonMetrics("coordinator")
    with ProfWatcher(rec, settings=settings, metrics=metrics) as w:
        w.watch(prof)
        wait_for(lambda: rec.status.get("cap") == "parsing", 10, what="parsing seen")
        wait_for(lambda: w.stats.poll_listings_deferred >= 3 * 24, 20, what="rank dirs served from the cache")
        for d in dirs:
            (d / "ASCEND_PROFILER_OUTPUT" / "analyse.done").touch()
        wait_for(lambda: rec.status.get("cap") == "complete", 10, what="complete")
    assert metrics.registry.get_sample_value("profwatch_watch_poll_deferred_total") == w.stats.poll_listings_deferred
