"""Issue 24 item 18: a state db that is corrupt at start (damaged pages, or not SQLite at all) is moved aside and
kept, the coordinator starts empty and publishes ``state_store_reset`` with what was lost; a db of a newer schema
still stops the start with exit 2 (real SQLite files, a live coordinator, the real CLI)."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from click.testing import CliRunner

from profwatch.adapters.store.state import SCHEMA_VERSION, StateStore
from profwatch.cli import cli
from profwatch.core.alerts.event_types import TYPE_STATE_STORE_RESET
from profwatch.exitcodes import EXIT_USAGE
from tests.conftest import wait_for
from tests.integration.sink_support import CoordinatorHarness


def _filled_db(path: Path) -> None:
    st = StateStore(path)
    try:
        for i in range(300):
            st.add_event({"id": f"e{i}", "type": "io.profwatch.anomaly.v1", "subject": "j1", "time": "t",
                          "data": {"pad": "x" * 200}}, False)
        st.save_registry([{"job_id": "j1", "world_size": 2, "backend": "torch", "profiler_config_path": None,
                           "prof_root": None, "first_seen_unix_s": 1.0, "started_unix_s": 1.0, "versions": None,
                           "generation": 0, "restart_count": None}], [], [])
        st.outbox_add("webhook", "e1", b"{}")
        st.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        st.close()


def _reset_event(h: CoordinatorHarness) -> dict:
    found = [e for e in h.events(None, alerts_only=True) if e["type"] == TYPE_STATE_STORE_RESET]
    return found[0] if found else {}


def test_damaged_pages_are_moved_aside_and_the_loss_is_alerted(short_tmp: Path) -> None:
    db = short_tmp / "state.db"
    _filled_db(db)
    original = db.read_bytes()
    with open(db, "r+b") as f:  # three pages of the events table overwritten (header page intact)
        f.seek(4096 * 5)
        f.write(os.urandom(4096 * 3))
    damaged = db.read_bytes()
    assert damaged != original
    h = CoordinatorHarness(short_tmp)
    try:
        wait_for(lambda: bool(_reset_event(h)), 30, what="state_store_reset published")
        data = _reset_event(h)["data"]
        assert data["lost"]["pinned_jobs"] == 1 and data["lost"]["queued_deliveries"] == 1
        assert data["lost"]["open_episodes"] == 0 and data["lost"]["captures_in_flight"] == 0
        assert "integrity_check" in data["problem"]
        kept = Path(data["moved_to"])
        assert kept.parent == short_tmp and kept.name.startswith("state.db.corrupt-")
        assert kept.read_bytes()[:4096] == damaged[:4096]  # kept, not rewritten
        assert data["rebuilt_from_nodes"]
        m = h.coord.metrics.registry  # type: ignore[union-attr]
        assert m.get_sample_value("profwatch_state_store_resets_total") == 1
    finally:
        h.close()
    # the fresh store is a healthy db the next start opens without another reset
    h2 = CoordinatorHarness(short_tmp)
    try:
        assert len([e for e in h2.events(None, alerts_only=True) if e["type"] == TYPE_STATE_STORE_RESET]) == 1
    finally:
        h2.close()
    assert len(list(short_tmp.glob("state.db.corrupt-*[0-9Z]"))) == 1


def test_a_file_that_is_not_sqlite_is_moved_aside(short_tmp: Path) -> None:
    (short_tmp / "state.db").write_bytes(b"garbage, not a database\n" * 100)
    h = CoordinatorHarness(short_tmp)
    try:
        wait_for(lambda: bool(_reset_event(h)), 30, what="state_store_reset published")
        data = _reset_event(h)["data"]
        assert "not an SQLite database" in data["problem"]
        assert set(data["lost"].values()) == {None}  # nothing could be counted
        assert Path(data["moved_to"]).read_bytes().startswith(b"garbage")
    finally:
        h.close()


def test_a_newer_schema_still_exits_2(short_tmp: Path) -> None:
    db = short_tmp / "state.db"
    con = sqlite3.connect(db)
    con.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    con.close()
    cfg = short_tmp / "c.toml"
    cfg.write_text(f'[coordinator]\nstate_db = "{db}"\nwork_dir = "{short_tmp}/w"\n'
                   'ingest_bind = "tcp://127.0.0.1:0"\ncontrol_bind = "tcp://127.0.0.1:0"\npub_bind = "tcp://127.0.0.1:0"\n')
    res = CliRunner().invoke(cli, ["coordinator", "--config", str(cfg)])
    assert res.exit_code == EXIT_USAGE and "newer" in res.output, res.output
    assert db.exists() and not list(short_tmp.glob("state.db.corrupt-*"))
