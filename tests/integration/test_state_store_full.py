"""The state store when its writes fail (issue 12, "state disk full"): nothing the coordinator holds is lost, the
retry queue is bounded, duplicates are dropped by event id before, during and after the failure.

The file is made to fail with SQLite's own pragmas: ``max_page_count`` (the database cannot grow: a write that
needs a new page fails with ``SQLITE_FULL``, "database or disk is full", the error a full disk gives) and, where
every write must fail whatever its size, ``query_only`` (``SQLITE_READONLY``). The live test with a real full file
system is ``tests/integration/test_disk_full_live.py``."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from profwatch.adapters.store.state import SCHEMA_VERSION, StateStore, Stored
from profwatch.core.alerts.events import make_cloudevent
from profwatch.core.capture import lifecycle as lc
from profwatch.core.capture.planner import CaptureRequest, JobProgress, plan_capture

T0 = 1_800_000_000.0
BIG = "x" * 5000  # more than a page: every event needs a new (overflow) page, which a full file refuses


def _ev(i: int, type_: str = "io.profwatch.path_refused.v1") -> dict:
    return make_cloudevent(type_, "j1", {"i": i, "pad": BIG}, source="test", now_unix_s=T0 + i,
                           event_id=f"ev-{i}")


def _fill(store: StateStore) -> None:
    """No new page, and no room left in the pages there are (small rows fail too)."""
    store.db.execute("CREATE TABLE IF NOT EXISTS filler(x BLOB)")
    pages = store.db.execute("PRAGMA page_count").fetchone()[0]
    store.db.execute(f"PRAGMA max_page_count={pages}")
    for size in (1000, 100, 10, 1):
        try:
            while True:
                store.db.execute("INSERT INTO filler VALUES(zeroblob(?))", (size,))
        except sqlite3.OperationalError:
            pass


def _free(store: StateStore) -> None:
    store.db.execute("PRAGMA max_page_count=1073741823")
    store.db.execute("PRAGMA query_only=0")


def _refuse_writes(store: StateStore) -> None:
    store.db.execute("PRAGMA query_only=1")


def _stored_ids(path: Path) -> list[str]:
    db = sqlite3.connect(path)
    try:
        return [r[0] for r in db.execute("SELECT id FROM events ORDER BY seq")]
    finally:
        db.close()


def test_failed_event_writes_are_queued_deduplicated_and_retried_once(tmp_path: Path) -> None:
    failed: list[str] = []
    store = StateStore(tmp_path / "state.db", on_failed=lambda op, err: failed.append(op))
    assert store.add_event(_ev(0), True) is Stored.NEW
    _fill(store)
    results = [store.add_event(_ev(i), True) for i in range(1, 21)]
    assert set(results) == {Stored.QUEUED}
    queued = [i for i, r in zip(range(1, 21), results, strict=True) if r is Stored.QUEUED]
    assert failed and set(failed) == {"event"} and "full" in store.last_error
    assert store.add_event(_ev(0), True) is Stored.DUPLICATE  # stored before the failure: known by a read
    assert all(store.add_event(_ev(i), True) is Stored.DUPLICATE for i in queued)  # queued: known by the queue
    assert [e["id"] for e in store.pending_events()] == [f"ev-{i}" for i in queued]
    assert store.status()["pending"] == len(queued) and store.status()["failing_since_unix_s"] is not None
    assert store.retry(100.0) is False and len(store.queue) == len(queued)  # still full: nothing lost
    _free(store)
    assert store.retry(100.5) is False  # the backoff holds the next try (1 s, then 2 s, ...)
    assert store.retry(1e12) is True and len(store.queue) == 0 and store.status()["failing_since_unix_s"] is None
    ids = _stored_ids(tmp_path / "state.db")
    assert sorted(ids) == sorted(f"ev-{i}" for i in range(21)) and len(ids) == len(set(ids))
    assert all(store.add_event(_ev(i), True) is Stored.DUPLICATE for i in range(21))
    store.close()


def test_a_retried_event_whose_id_got_stored_meanwhile_is_dropped_not_doubled(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state.db")
    _refuse_writes(store)
    assert store.add_event(_ev(1), True) is Stored.QUEUED
    other = sqlite3.connect(tmp_path / "state.db")  # the same id stored by another path (e.g. before a restart)
    other.execute("INSERT INTO events(id, type, job_id, time, is_alert, body) VALUES('ev-1','t','j1','',1,'{}')")
    other.commit()
    other.close()
    _free(store)
    assert store.retry(1e12) is True
    assert _stored_ids(tmp_path / "state.db") == ["ev-1"]
    store.close()


def test_the_retry_queue_is_bounded_and_drops_non_alerts_first(tmp_path: Path) -> None:
    dropped: list[tuple[str, int]] = []
    store = StateStore(tmp_path / "state.db", retry_max_items=6, on_dropped=lambda k, n: dropped.append((k, n)))
    _refuse_writes(store)
    kinds = {}
    for i in range(10):
        is_alert = i % 3 == 0  # 0, 3, 6, 9 are alerts
        kinds[f"ev-{i}"] = is_alert
        store.add_event(_ev(i), is_alert)
    pending = [e["id"] for e in store.pending_events(alerts_only=False)]
    assert len(pending) == 6 and all(kinds[i] for i in ["ev-0", "ev-3", "ev-6", "ev-9"])
    assert {"ev-0", "ev-3", "ev-6", "ev-9"} <= set(pending)  # every alert kept; the oldest non-alerts went
    assert sum(n for _k, n in dropped) == 4 and store.dropped == {"event": 4}
    assert [e["id"] for e in store.pending_events()] == ["ev-0", "ev-3", "ev-6", "ev-9"]  # alerts only
    for i in range(10, 20):  # only alerts now: the oldest alerts go
        store.add_event(_ev(i), True)
    assert len(store.queue) == 6 and [e["id"] for e in store.pending_events()][-1] == "ev-19"
    store.close()


def test_capture_and_batch_rows_are_queued_latest_wins(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state.db")
    job = JobProgress(job_id="j1", world_size=2, furthest_step=100, step_time_s=0.5, prof_root="/prof",
                      now_unix_s=T0)
    plan = plan_capture(CaptureRequest(job_id="j1", reason="test", capture_id="c1"), job)
    settings = lc.LifecycleSettings()
    cap = lc.open_capture(plan, world_size=2, profiler_config_path="/cfg", writer="coordinator",
                          rank_steps={0: 100, 1: 100}, rank_step_time_s={}, rank_backends={}, nodes=[], now=T0,
                          settings=settings, generation=3).capture
    store.save_capture(cap)
    _refuse_writes(store)
    for i in range(3):
        store.save_batch("b1", "c1", "j1", "complete", T0 + i, {"pad": BIG * (i + 1)})
    assert ("batch", "b1") in store.queue and len(store.queue) == 1
    written = lc.config_written(cap, {"path": "/cfg/profiler_config.json", "mtime_s": int(T0) + 1}, T0 + 1,
                                settings).capture
    cancelled = lc.cancel(written, T0 + 2, settings, by="test").capture
    for c in (written, cancelled):
        store.save_capture(c, ranks=[0])
    assert ("capture", "c1") in store.queue and store.failures.get("capture", 0) >= 1
    older = store.get_capture("c1")
    assert older is not None and older.state is lc.CaptureState.PLANNED  # reads still answer (the older row)
    _free(store)
    assert store.retry(1e12) is True
    got, batch = store.get_capture("c1"), store.get_batch("b1")
    assert got is not None and batch is not None
    assert got.state is lc.CaptureState.CANCELLED and got.generation == 3 and sorted(got.ranks) == [0, 1]
    assert batch["result"]["pad"] == BIG * 3 and batch["updated_unix_s"] == T0 + 2
    store.close()


def test_close_tries_once_more_and_a_version_2_file_gains_the_generation_columns(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state.db")
    _fill(store)
    assert store.add_event(_ev(1), True) is Stored.QUEUED
    _free(store)
    store.close()  # the last retry at close writes it
    assert _stored_ids(tmp_path / "state.db") == ["ev-1"]
    db = sqlite3.connect(tmp_path / "v2.db")
    db.executescript("""CREATE TABLE jobs(job_id TEXT PRIMARY KEY, world_size INTEGER NOT NULL, backend TEXT,
        profiler_config_path TEXT, prof_root TEXT, first_seen_unix_s REAL, started_unix_s REAL, versions TEXT);
        INSERT INTO jobs VALUES('old', 4, 'torch', NULL, NULL, 1.0, 1.0, '{}'); PRAGMA user_version=2;""")
    db.close()
    store = StateStore(tmp_path / "v2.db")
    jobs, _r, _n = store.load_registry()
    assert jobs == [{"job_id": "old", "world_size": 4, "backend": "torch", "profiler_config_path": None,
                     "prof_root": None, "first_seen_unix_s": 1.0, "started_unix_s": 1.0, "versions": "{}",
                     "generation": 0, "restart_count": None}]
    assert store.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 4
    store.close()
