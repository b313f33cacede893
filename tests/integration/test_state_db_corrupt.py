"""Issue 24 item 18: a state db of profwatch's that is corrupt at start (damaged pages) is moved aside and kept, the
coordinator starts empty and publishes ``state_store_reset`` with what was lost; a db of a newer schema still stops
the start with exit 2. Issue 33 #2: anything that is not profwatch's own db (a text file, a FIFO, a directory, a
device, another program's SQLite db) and a profwatch db whose header is destroyed are never moved: exit 2 naming
the path (real SQLite files, a live coordinator, the real CLI)."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner

from profwatch.adapters.store.state import APPLICATION_ID, SCHEMA_VERSION, StateStore
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


def _start(tmp: Path, db: Path) -> tuple[int, str]:
    """Start the real ``profwatch coordinator`` CLI on ``db``: (exit code, output)."""
    cfg = tmp / "c.toml"
    cfg.write_text(f'[coordinator]\nstate_db = "{db}"\nwork_dir = "{tmp}/w"\n'
                   'ingest_bind = "tcp://127.0.0.1:0"\ncontrol_bind = "tcp://127.0.0.1:0"\npub_bind = "tcp://127.0.0.1:0"\n')
    res = CliRunner().invoke(cli, ["coordinator", "--config", str(cfg)])
    return res.exit_code, res.output


def _foreign_db(path: Path, app_id: int) -> None:
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE notes (t TEXT)")
    con.execute("INSERT INTO notes VALUES ('mine')")
    con.execute(f"PRAGMA application_id={app_id}")
    con.commit()
    con.close()


def _make(kind: str, tmp: Path) -> Path:
    p = tmp / "state.db"
    if kind == "toml":  # a config named by mistake
        p.write_text('[coordinator]\nstate_db = "/var/lib/profwatch/state.db"\n')
    elif kind == "fifo":
        os.mkfifo(p)
    elif kind == "directory":
        p.mkdir()
    elif kind == "device":  # a symlink to a character device (mknod needs root): what it names is checked
        p.symlink_to("/dev/null")
    elif kind == "dangling_symlink":  # issue 33 H3: the link itself was renamed and a regular file created
        p.symlink_to(tmp / "nowhere" / "x.db")
    elif kind == "symlink_loop":
        p.symlink_to(p)
    elif kind == "foreign_app_id":
        _foreign_db(p, 0x12345678)
    elif kind == "foreign_tables":
        _foreign_db(p, 0)
    elif kind == "foreign_same_names":  # issue 33 H4: tables named captures and events, not profwatch's columns
        _foreign_db(p, 0)
        con = sqlite3.connect(p)
        con.execute("CREATE TABLE captures (id INTEGER PRIMARY KEY, photo BLOB)")
        con.execute("CREATE TABLE events (id INTEGER PRIMARY KEY, title TEXT, body TEXT)")
        con.commit()
        con.close()
    return p


KINDS = ["toml", "fifo", "directory", "device", "dangling_symlink", "symlink_loop", "foreign_app_id", "foreign_tables",
         "foreign_same_names"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_state_db_that_is_not_profwatchs_is_never_moved_and_exits_2_naming_it(short_tmp: Path, kind: str) -> None:
    """Issue 33 #2: the quarantine renamed whatever ``state_db`` named (a TOML file, a device, /dev/full as root)."""
    p = _make(kind, short_tmp)
    before = sorted(x.name for x in short_tmp.iterdir())
    image = p.read_bytes() if kind.startswith("foreign") else b""
    code, out = _start(short_tmp, p)
    assert code == EXIT_USAGE and f"state_db {p}" in out, out
    assert len(out.strip().splitlines()) == 1, out  # one line, no traceback
    assert sorted(x.name for x in short_tmp.iterdir() if x.name not in ("c.toml", "w")) == before  # nothing moved
    if kind == "toml":
        assert p.read_text().startswith("[coordinator]")
    if kind.endswith("symlink") or kind == "symlink_loop":
        assert p.is_symlink() and not (short_tmp / "nowhere").exists()
    if kind.startswith("foreign"):
        assert p.read_bytes() == image  # nothing written into it (no tables created, not switched to WAL)
        assert sqlite3.connect(p).execute("SELECT t FROM notes").fetchall() == [("mine",)]


def test_a_profwatch_db_whose_header_is_destroyed_stays_in_place_with_how_to_move_it(short_tmp: Path) -> None:
    db = short_tmp / "state.db"
    _filled_db(db)
    with open(db, "r+b") as f:
        f.write(b"\0" * 16)  # the "SQLite format 3" string gone; the application_id at offset 68 still there
    damaged = db.read_bytes()
    code, out = _start(short_tmp, db)
    assert code == EXIT_USAGE and "header is destroyed" in out and f"mv {db} {db}.corrupt" in out, out
    assert db.read_bytes() == damaged and not list(short_tmp.glob("state.db.corrupt*"))


def test_a_db_of_an_older_profwatch_without_application_id_is_still_its_own(short_tmp: Path) -> None:
    db = short_tmp / "state.db"
    _filled_db(db)
    con = sqlite3.connect(db)
    con.execute("PRAGMA application_id=0")  # written before profwatch set one
    con.commit()
    con.close()
    from profwatch.adapters.store.state_open import check_own, open_state_store

    check_own(db)
    st, reset = open_state_store(db, 0.0)
    try:
        assert reset is None and st.db.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
    finally:
        st.close()


def test_a_newer_schema_still_exits_2(short_tmp: Path) -> None:
    db = short_tmp / "state.db"
    con = sqlite3.connect(db)
    con.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    con.execute(f"PRAGMA application_id={APPLICATION_ID}")  # a newer profwatch's own file
    con.close()
    cfg = short_tmp / "c.toml"
    cfg.write_text(f'[coordinator]\nstate_db = "{db}"\nwork_dir = "{short_tmp}/w"\n'
                   'ingest_bind = "tcp://127.0.0.1:0"\ncontrol_bind = "tcp://127.0.0.1:0"\npub_bind = "tcp://127.0.0.1:0"\n')
    res = CliRunner().invoke(cli, ["coordinator", "--config", str(cfg)])
    assert res.exit_code == EXIT_USAGE and "newer" in res.output, res.output
    assert db.exists() and not list(short_tmp.glob("state.db.corrupt-*"))


def test_a_healthy_db_locked_by_another_process_is_not_corrupt_exit_2_naming_the_holder(short_tmp: Path) -> None:
    """Issue 33 H2: a healthy db held by ``BEGIN EXCLUSIVE`` in another process was moved aside as "cannot open:
    database is locked" and the coordinator started on a fresh db."""
    import subprocess
    import sys

    db = short_tmp / "state.db"
    _filled_db(db)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sqlite3, sys\nc = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
         "c.execute('BEGIN EXCLUSIVE')\nc.execute('INSERT INTO nodes(node_id) VALUES(\"held\")')\n"
         "print('held', flush=True)\nsys.stdin.read()\n", str(db)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        code, out = _start(short_tmp, db)
    finally:
        holder.communicate("", timeout=30)
    assert code == EXIT_USAGE and f"state_db {db} is locked" in out and f"pid {holder.pid}" in out, out
    assert not list(short_tmp.glob("state.db.corrupt*"))
    con = sqlite3.connect(db)  # the file is the same healthy db, with its rows
    try:
        assert con.execute("SELECT COUNT(*) FROM events").fetchone()[0] == 300
        assert con.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
    finally:
        con.close()


def test_a_second_coordinator_on_the_same_state_db_exits_2_naming_the_holder(short_tmp: Path) -> None:
    """Issue 33 S6: two coordinators with different binds ran together on one state db (two writers, each
    thinking it alone owns captures and pins). The second now stops at start; the first is untouched."""
    h = CoordinatorHarness(short_tmp)
    try:
        db = Path(h.coord.settings.coordinator.state_db)  # type: ignore[union-attr]
        assert db.exists()
        code, out = _start(short_tmp, db)  # binds differ (ephemeral ports): only the lock stops it
        assert code == EXIT_USAGE and f"state_db {db} is in use by another coordinator (pid {os.getpid()}" in out, out
        assert not list(short_tmp.glob("state.db.corrupt*"))
        assert not h.coord.state.closed  # type: ignore[union-attr]
    finally:
        h.close()
    code, out = _open_once(short_tmp, db)  # released at close: the next start proceeds
    assert code == 0, out


def _open_once(tmp: Path, db: Path) -> tuple[int, str]:
    from profwatch.adapters.store.state_open import open_state_store

    st, reset = open_state_store(db, 0.0)
    st.close()
    return (0 if reset is None else 1), str(reset)


@pytest.mark.parametrize("kind", ["toml", "fifo", "device", "dangling_symlink", "symlink_loop", "foreign_app_id",
                                  "foreign_same_names"])
def test_config_check_reports_a_state_db_the_coordinator_refuses(short_tmp: Path, kind: str) -> None:
    """Issue 33 S2: ``config check`` called these configs valid; the coordinator then refused them (exit 2)."""
    p = _make(kind, short_tmp)
    cfg = short_tmp / "c.toml"
    cfg.write_text(f'[coordinator]\nstate_db = "{p}"\nwork_dir = "{short_tmp}/w"\n')
    res = CliRunner().invoke(cli, ["config", "check", "--config", str(cfg)])
    assert res.exit_code == EXIT_USAGE and f"coordinator.state_db: state_db {p}" in res.output, res.output
    assert not list(short_tmp.glob("state.db.corrupt*")) and not (short_tmp / "state.db.lock").exists()


def test_config_check_reports_an_authorization_the_coordinator_refuses(short_tmp: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 33 S2: an unset ``authorization_env`` and an empty ``authorization_file`` passed ``config check``."""
    empty = short_tmp / "auth"
    empty.write_text("")
    monkeypatch.delenv("PW_TEST_UNSET_TOKEN", raising=False)
    cfg = short_tmp / "c.toml"
    base = f'[coordinator]\nstate_db = "{short_tmp}/state.db"\nwork_dir = "{short_tmp}/w"\n'
    cfg.write_text(base + '[webhook]\nurl = "https://hooks.example/x"\nauthorization_env = "PW_TEST_UNSET_TOKEN"\n'
                   f'[alertmanager]\nurl = "https://am.example"\nauthorization_file = "{empty}"\n')
    res = CliRunner().invoke(cli, ["config", "check", "--config", str(cfg)])
    assert res.exit_code == EXIT_USAGE, res.output
    assert "webhook.authorization_env: [webhook] env var PW_TEST_UNSET_TOKEN is empty or unset" in res.output
    assert f"alertmanager.authorization_file: [alertmanager] authorization_file {empty} is empty" in res.output
    monkeypatch.setenv("PW_TEST_UNSET_TOKEN", "Bearer t0k")
    empty.write_text("Bearer other")
    res = CliRunner().invoke(cli, ["config", "check", "--config", str(cfg)])
    assert res.exit_code == 0 and "valid" in res.output, res.output


def test_a_state_db_whose_folder_cannot_be_created_exits_2_naming_the_key(short_tmp: Path) -> None:
    """``state_db = "/proc/nope/s.db"`` (a folder no user can create) ended the start with ``cannot start: [Errno 2]
    No such file or directory: '/proc/nope'``: no key, the errno twice. Now one line naming the key, the path and
    the cause; nothing is created."""
    db = Path("/proc/profwatch-nope") / "s.db"
    code, out = _start(short_tmp, db)
    assert code == EXIT_USAGE and len(out.strip().splitlines()) == 1, out
    assert f"[coordinator] state_db {db}: cannot create /proc/profwatch-nope: No such file or directory" in out, out
    assert "[Errno" not in out and not db.parent.exists()


def test_a_work_dir_that_cannot_be_created_exits_2_naming_the_key(short_tmp: Path) -> None:
    """``work_dir = "/proc/nope/w"``: the coordinator started and every analysis would then fail to stage its batch
    or write its report. Now it refuses to start, one line naming the key, the path and the cause."""
    cfg = short_tmp / "c.toml"
    work = Path("/proc/profwatch-nope") / "w"
    cfg.write_text(f'[coordinator]\nstate_db = "{short_tmp}/s.db"\nwork_dir = "{work}"\n'
                   'ingest_bind = "tcp://127.0.0.1:0"\ncontrol_bind = "tcp://127.0.0.1:0"\npub_bind = "tcp://127.0.0.1:0"\n')
    res = CliRunner().invoke(cli, ["coordinator", "--config", str(cfg)])
    assert res.exit_code == EXIT_USAGE and len(res.output.strip().splitlines()) == 1, res.output
    assert f"[coordinator] work_dir {work}: cannot create /proc/profwatch-nope" in res.output, res.output
    assert not (short_tmp / "s.db").exists()  # refused before the state store was opened
