"""The state store keeps captures as typed rows; a version-1 state.db (captures as JSON blobs) is migrated in place,
a newer or unknown one is refused with a clear message (real SQLite files)."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest

from profwatch.adapters.store.state import SCHEMA_VERSION, StateSchemaError, StateStore
from profwatch.core.capture import lifecycle as lc
from profwatch.core.capture.lifecycle import CaptureState
from profwatch.core.capture.planner import CaptureRequest, JobProgress, plan_capture

T0 = 1_800_000_000.0

# The schema and row shapes written by profwatch before typed rows (daemon/profwatch/adapters/store/state.py and
# daemon/capture_manager.py of that version), verbatim.
V1_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs(
  job_id TEXT PRIMARY KEY, world_size INTEGER NOT NULL, backend TEXT, profiler_config_path TEXT, prof_root TEXT,
  first_seen_unix_s REAL, started_unix_s REAL, versions TEXT);
CREATE TABLE IF NOT EXISTS ranks(
  job_id TEXT NOT NULL, rank INTEGER NOT NULL, hostname TEXT, node_id TEXT, pid INTEGER, local_rank INTEGER,
  backend TEXT, last_step INTEGER, last_step_time_s REAL, seen_unix_s REAL, left INTEGER DEFAULT 0,
  PRIMARY KEY(job_id, rank));
CREATE TABLE IF NOT EXISTS nodes(
  node_id TEXT PRIMARY KEY, hostname TEXT, pid INTEGER, last_seen_unix_s REAL, counters TEXT);
CREATE TABLE IF NOT EXISTS captures(
  capture_id TEXT PRIMARY KEY, job_id TEXT NOT NULL, state TEXT NOT NULL, reason TEXT, created_unix_s REAL,
  updated_unix_s REAL, plan TEXT, detail TEXT);
CREATE TABLE IF NOT EXISTS batches(
  batch_id TEXT PRIMARY KEY, capture_id TEXT, job_id TEXT, status TEXT, updated_unix_s REAL, result TEXT);
CREATE TABLE IF NOT EXISTS events(
  seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT UNIQUE NOT NULL, type TEXT NOT NULL, job_id TEXT,
  time TEXT, is_alert INTEGER NOT NULL DEFAULT 0, body TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS events_job ON events(job_id, seq);
"""


def _v1_plan(cid: str, **kw: object) -> dict:
    plan = {"capture_id": cid, "job_id": "j1", "reason": "manual", "start_step": 120, "warmup": 1, "active": 2,
            "rank_list": None, "prof_dir": f"/prof/j1/{cid}/", "profiler_config_path": "/cfg/j1",
            "deadline_unix_s": T0 + 300, "config": {"start_step": 120, "warmup": 1, "active": 2},
            "writer": "coordinator", "dry_run": False, "furthest_step": 110, "step_time_s": 0.5, "world_size": 2}
    plan.update(kw)
    return plan


def _make_v1(path: Path) -> None:
    db = sqlite3.connect(path)
    db.executescript(V1_SCHEMA)
    rows = [
        ("c-1", "analysed", T0, _v1_plan("c-1"), {"written": {"path": "/cfg/j1/profiler_config.json", "mtime_s": 17},
                                                  "written_unix_s": T0 + 1, "acknowledged": T0 + 3, "total_bytes": 4096,
                                                  "batch_id": "b-1", "analysis_status": "ok"}),
        ("c-2", "refused", T0 + 10, _v1_plan("c-2"), {"error": "config dir not allowed"}),
        ("c-3", "planned", T0 + 20, _v1_plan("c-3", writer="node", nodes=["n1", "n2"]), {}),
        ("c-4", "collecting", T0 + 30, _v1_plan("c-4", rank_list=[1]), {"written_unix_s": T0 + 31}),
        ("c-5", "capturing", T0 + 40, {"garbage": True}, {}),
    ]
    for cid, state, t, plan, detail in rows:
        db.execute("INSERT INTO captures VALUES(?,?,?,?,?,?,?,?)",
                   (cid, "j1", state, "manual", t, t + 5, json.dumps(plan), json.dumps(detail)))
    db.execute("INSERT INTO events(id, type, job_id, time, is_alert, body) VALUES('e1','t','j1','x',1,'{}')")
    db.execute("INSERT INTO batches VALUES('b-1','c-1','j1','analysed',1.0,'{}')")
    db.commit()
    db.close()


def test_a_version_1_state_db_is_migrated_in_place(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    _make_v1(path)
    store = StateStore(path)
    try:
        caps = {c.capture_id: c for c in store.captures()}
        assert list(caps) == ["c-1", "c-2", "c-3", "c-4", "c-5"]
        c1 = caps["c-1"]
        assert c1.state is CaptureState.ANALYSED and c1.start_step == 120 and c1.armed_steps == [121, 122]
        assert c1.expected_ranks == [0, 1] and all(p.acknowledged for p in c1.ranks.values())
        assert c1.total_bytes == 4096 and c1.config_mtime_s == 17 and c1.batch_id == "b-1"
        assert c1.deadline_unix_s is None and c1.judge_unix_s == T0 + 300 + 600
        c2 = caps["c-2"]
        assert c2.state is CaptureState.FAILED and "config dir not allowed" in c2.outcome and "'refused'" in c2.outcome
        c3 = caps["c-3"]  # the fault: planned forever. It now has a deadline and can expire
        assert c3.state is CaptureState.PLANNED and sorted(c3.nodes) == ["n1", "n2"]
        assert c3.deadline_unix_s == pytest.approx(T0 + 25 + lc.LifecycleSettings().write_timeout_s)
        assert lc.expire(c3, T0 + 10_000, lc.LifecycleSettings()).capture.state is CaptureState.FAILED
        c4 = caps["c-4"]
        assert c4.state is CaptureState.COLLECTING and c4.rank_list == (1,) and c4.expected_ranks == [1]
        assert caps["c-5"].state is CaptureState.COLLECTING and caps["c-5"].prof_dir == ""
        assert [c for c in caps if caps[c].idle_owed] == ["c-2"]  # an arm that could not be written
        assert [e for _, e in store.events(job_id="j1")] == [{}]
        assert store.get_batch("b-1") is not None
        old = store.db.execute("SELECT count(*) FROM captures_v1").fetchone()[0]
        assert old == 5  # the old rows are kept
        assert store.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    finally:
        store.close()
    again = StateStore(path)  # a second open is a no-op
    try:
        assert [c.capture_id for c in again.captures(states=[CaptureState.PLANNED])] == ["c-3"]
    finally:
        again.close()


def test_a_newer_or_unknown_schema_is_refused_with_a_clear_message(tmp_path: Path) -> None:
    newer = tmp_path / "newer.db"
    db = sqlite3.connect(newer)
    db.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    db.commit()
    db.close()
    with pytest.raises(StateSchemaError, match="newer than this profwatch"):
        StateStore(newer)
    odd = tmp_path / "odd.db"
    db = sqlite3.connect(odd)
    db.execute("CREATE TABLE captures(capture_id TEXT, something TEXT)")
    db.commit()
    db.close()
    with pytest.raises(StateSchemaError, match="unknown captures table"):
        StateStore(odd)


def test_typed_rows_round_trip_and_partial_rank_writes(tmp_path: Path) -> None:
    job = JobProgress(job_id="j1", world_size=3, furthest_step=50, step_time_s=0.5, prof_root="/prof", now_unix_s=T0,
                      rank_steps={0: 50, 1: 50, 2: 49})
    plan = plan_capture(CaptureRequest(job_id="j1", reason="step_regression"), job)
    settings = lc.LifecycleSettings()
    cap = lc.open_capture(plan, world_size=3, profiler_config_path="/cfg/j1", writer="node", rank_steps=job.rank_steps,
                          rank_step_time_s={1: 0.6}, rank_backends={0: "torch_npu", 1: "torch_npu", 2: "none"},
                          nodes=["n1"], now=T0, settings=settings, step_time_s=0.5).capture
    store = StateStore(tmp_path / "s.db")
    try:
        store.save_capture(cap)
        assert store.get_capture(cap.capture_id) == cap
        cap2 = lc.node_write_result(cap, "n1", True, "", {"mtime_s": 9}, T0 + 1, settings).capture
        cap2 = replace(cap2, ranks={**cap2.ranks, 1: replace(cap2.ranks[1], tool_seen_unix_s=T0 + 2, steps=(3, 4))})
        store.save_capture(cap2, ranks=[1])
        back = store.get_capture(cap.capture_id)
        assert back == cap2 and back.state is CaptureState.WRITTEN and back.nodes["n1"].ok is True
        assert back.ranks[1].steps == (3, 4) and back.ranks[2].backend == "none"
        assert store.captures("j") == [] and store.captures("j1") == [cap2]  # exact job ids
        assert store.captures(states=[CaptureState.PLANNED]) == []
        later = replace(cap2, capture_id="c-later", created_unix_s=T0 + 7200)
        store.save_capture(later)
        assert [c.capture_id for c in store.captures(newest=1)] == ["c-later"]
        assert [c.capture_id for c in store.captures(newest=5)] == [cap2.capture_id, "c-later"]
        assert [c.capture_id for c in store.captures(since_unix_s=T0 + 3600)] == ["c-later"]
    finally:
        store.close()


def test_a_version_3_file_gains_idle_owed_derived_as_the_transitions_decided_it(tmp_path: Path) -> None:
    job = JobProgress(job_id="j1", world_size=2, furthest_step=50, step_time_s=0.5, prof_root="/prof", now_unix_s=T0)
    settings = lc.LifecycleSettings()
    planned = lc.open_capture(plan_capture(CaptureRequest(job_id="j1", reason="r"), job), world_size=2,
                              profiler_config_path="/cfg/j1", writer="coordinator", rank_steps={}, rank_step_time_s={},
                              rank_backends={}, nodes=[], now=T0, settings=settings).capture
    written = lc.config_written(planned, {"mtime_s": 1}, T0 + 1, settings).capture
    analysing = replace(written, state=CaptureState.ANALYSING, batch_id="b-1")
    endings = {
        "cancelled-written": lc.cancel(written, T0 + 2, settings).capture,
        "cancelled-analysing": lc.cancel(analysing, T0 + 2, settings).capture,
        "cancelled-resumed": lc.cancel(lc.resume(analysing, T0 + 2, settings).capture, T0 + 3, settings).capture,
        "superseded": lc.supersede(written, 1, T0 + 2, settings).capture,
        "write-failed": lc.config_write_failed(planned, "ro", T0 + 2, settings).capture,
        "analysis-failed": lc.analysis_raised(analysing, "boom", T0 + 2, settings).capture,
        "analysed": lc.analysis_done(analysing, "ok", {}, T0 + 2, settings).capture,
    }
    path = tmp_path / "v3.db"
    store = StateStore(path)
    for name, cap in endings.items():
        store.save_capture(replace(cap, capture_id=name))
    store.close()
    db = sqlite3.connect(path)  # as version 3 wrote it: no idle_owed column
    db.executescript("ALTER TABLE captures DROP COLUMN idle_owed; PRAGMA user_version=3;")
    db.close()
    store = StateStore(path)
    try:
        owed = {c.capture_id: c.idle_owed for c in store.captures()}
        assert owed == {name: cap.idle_owed for name, cap in endings.items()}  # what each transition decided
        assert owed == {"cancelled-written": True, "cancelled-analysing": False, "cancelled-resumed": True,
                        "superseded": True, "write-failed": True, "analysis-failed": False, "analysed": False}
        assert store.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 4
    finally:
        store.close()
    again = StateStore(path)  # a second open is a no-op
    try:
        assert sum(c.idle_owed for c in again.captures()) == 4
    finally:
        again.close()


def test_a_version_3_state_db_gains_the_episodes_table_and_keeps_episodes(tmp_path: Path) -> None:
    """The episodes table is created in a version-3 file that lacks it, in place, without a version change; rows
    round-trip, every open episode and the last closed ones per job are read back, a damaged body is skipped."""
    path = tmp_path / "state.db"
    first = StateStore(path)
    first.db.execute("DROP TABLE episodes")
    first.db.execute("PRAGMA user_version=3")
    first.db.commit()
    first.close()
    store = StateStore(path)
    try:
        assert store.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert store.episodes() == []
        store.save_episode("ep-1", "j1", True, T0, {"episode_id": "ep-1", "job_id": "j1"})
        for k in range(3):
            store.save_episode(f"ep-c{k}", "j1", False, T0 + 1 + k, {"episode_id": f"ep-c{k}"})
        store.save_episode("ep-1", "j1", True, T0 + 10, {"episode_id": "ep-1", "job_id": "j1", "reports": 2})
        store.save_episode("ep-9", "j9", True, T0, {"episode_id": "ep-9"})
        store.db.execute("UPDATE episodes SET body='not json' WHERE episode_id='ep-9'")
        store.db.commit()
        assert [e["episode_id"] for e in store.episodes(["j1"], closed_per_job=2)] == ["ep-c1", "ep-c2", "ep-1"]
        assert store.episodes(["j1"])[-1]["reports"] == 2
        assert store.episodes(["j9"]) == [] and store.episodes([]) == []
    finally:
        store.close()
