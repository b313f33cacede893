"""``profwatch status`` with the coordinator down reads the state db as it is: a file an older profwatch wrote, or
a record with a damaged time, is shown for what it holds (``adapters/store/state_reader.py: read_status``,
``core/status_text.py: render_offline_status``)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from profwatch.adapters.store.state import StateStore
from profwatch.adapters.store.state_reader import StateUnreadable, read_status
from profwatch.core.status_text import render_offline_status

T0 = 1.7e9


def _store(path: Path) -> None:
    store = StateStore(path)
    store.save_registry([{"job_id": "j1", "world_size": 2, "backend": "torch_npu", "profiler_config_path": "/cfg",
                          "prof_root": "/prof", "first_seen_unix_s": T0, "started_unix_s": T0, "versions": "{}",
                          "generation": 0, "restart_count": 0}],
                        [("j1", r, "h1", "n1", 100 + r, r, "torch_npu", 120 + r, 0.5, T0 + 60 + r, 0) for r in (0, 1)],
                        [("n1", "h1", 1, T0 + 30, "{}")])
    store.close()


def test_a_state_db_an_older_profwatch_wrote_is_shown_for_what_it_holds(tmp_path: Path) -> None:
    """A version-2 file (no ``jobs.generation``) without the ``episodes`` table: what the coordinator finds after
    an upgrade it never started under. It was refused whole as "not a readable profwatch state db"."""
    path = tmp_path / "state.db"
    _store(path)
    db = sqlite3.connect(path)
    db.executescript("ALTER TABLE jobs DROP COLUMN restart_count; ALTER TABLE jobs DROP COLUMN generation; "
                     "DROP TABLE episodes; PRAGMA user_version=2;")
    db.close()
    got = read_status(path)
    assert [(j["job_id"], j["generation"], j["ranks"], j["last_step"]) for j in got.jobs] == [("j1", 0, 2, 121)]
    assert got.recorded_unix_s == T0 + 61 and [n["node_id"] for n in got.nodes] == ["n1"]
    db = sqlite3.connect(path)
    db.executescript("ALTER TABLE captures RENAME TO captures_new; CREATE TABLE captures(capture_id TEXT, plan TEXT);")
    db.close()
    got = read_status(path)
    assert got.jobs and got.captures == [] and any("no captures read" in n and "version 2" in n for n in got.notes)


def test_a_file_with_no_profwatch_tables_is_still_refused(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    sqlite3.connect(path).executescript("CREATE TABLE t(x); INSERT INTO t VALUES(1);")
    with pytest.raises(StateUnreadable, match="not a readable profwatch state db"):
        read_status(path)


def test_a_recorded_time_no_date_can_show_is_said_not_a_crash() -> None:
    state = {"state_db": "/x", "recorded_unix_s": 1e300, "jobs": [{"job_id": "j1", "world_size": 2,
             "ranks": 2, "last_step": 5, "seen_unix_s": -1e300}], "nodes": [], "captures": []}
    lines = render_offline_status("no coordinator at tcp://x", state, T0)
    assert "not a date" in lines[0] and "not a date" in lines[2]


def test_a_state_db_read_past_a_writers_lock_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file another process keeps locked (``database is locked`` after the 5 s timeout) was read without its
    lock and shown as if whole, with no note."""
    from profwatch.adapters.store import state_reader

    path = tmp_path / "state.db"
    _store(path)
    real = state_reader._connect

    def locked(p: Path, immutable: bool) -> sqlite3.Connection:
        if not immutable:
            raise sqlite3.OperationalError("database is locked")
        return real(p, immutable)

    monkeypatch.setattr(state_reader, "_connect", locked)
    got = read_status(path)
    assert got.jobs and any("database is locked" in n and "inconsistent" in n for n in got.notes), got.notes
