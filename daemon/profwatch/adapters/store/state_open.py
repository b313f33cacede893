"""Opening the coordinator's state store at start, and what happens to a corrupt one (I/O: file checks, rename).

Only profwatch's own file is ever moved (:func:`check_own`): a regular file with the SQLite header whose
``application_id`` is profwatch's (:data:`~profwatch.adapters.store.state.APPLICATION_ID`), or, without one, a db of
an older profwatch that the migrations recognise (its ``captures`` and ``events`` tables with profwatch's columns,
read on a read-only connection before anything is written). Anything else at the
``state_db`` path (a text file named by mistake, a device, a FIFO, a directory, another program's SQLite db) is
left untouched and the start stops with exit 2 naming the path (:class:`StateFileRefused`); so does a profwatch db
whose first bytes are destroyed (its ``application_id`` at header offset 68 still says whose it is), with how to
move it aside by hand.

A state db of profwatch's that SQLite cannot use (the file header is not ``SQLite format 3``, ``PRAGMA integrity_check`` does not
answer ``ok``, or opening it fails with ``SQLITE_CORRUPT``/``SQLITE_NOTADB``) is moved aside, never deleted: renamed to
``<name>.corrupt-<UTC time>`` with its ``-wal``/``-shm`` files, and the coordinator starts with an empty store and
publishes ``state_store_reset`` (what was lost, as far as the damaged file still tells, and what comes back by
itself). A db of a newer schema is not corrupt: :class:`~profwatch.adapters.store.state.StateSchemaError` still
stops the start (exit 2), as the file is fine for the profwatch that wrote it; so does a db that is locked by another
process (``SQLITE_BUSY``/``SQLITE_LOCKED`` after :data:`BUSY_WAIT_S` of retries; :class:`StateFileBusy` names the
holders' pids from ``/proc/locks``) or that fails to open for any other reason (read-only, I/O error): never moved.

Sources: the header string and the integrity check are SQLite's (https://www.sqlite.org/fileformat.html section
1.3, https://www.sqlite.org/pragma.html#pragma_integrity_check). ``integrity_check`` reads the whole file: about
one second per few hundred MB on a local disk, once per start.
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from profwatch.adapters.store.state import APPLICATION_ID, SCHEMA_VERSION, StateSchemaError, StateStore
from profwatch.core.capture.lifecycle import IN_FLIGHT

log = structlog.get_logger("profwatch.state")
SQLITE_HEADER = b"SQLite format 3\x00"
REBUILT_FROM_NODES = ("jobs, their ranks and last steps (every node re-registers its ranks when it reconnects)",
                      "node records (at the next heartbeat)")
"""What comes back by itself after a reset (the ``state_store_reset`` event says it)."""

_LOST_QUERIES: dict[str, str] = {
    "pinned_jobs": "SELECT COUNT(*) FROM jobs",
    "captures_in_flight": "SELECT COUNT(*) FROM captures WHERE state IN ({in_flight})",
    "captures": "SELECT COUNT(*) FROM captures",
    "queued_deliveries": "SELECT COUNT(*) FROM sink_outbox",
    "events": "SELECT COUNT(*) FROM events",
    "batches": "SELECT COUNT(*) FROM batches",
    "open_episodes": "SELECT COUNT(*) FROM episodes WHERE open=1",
}


@dataclass(frozen=True, slots=True)
class StoreReset:
    """A corrupt state db moved aside at start: ``moved_to`` (the kept file), ``problem`` (what was wrong),
    ``lost`` (row counts per kind the damaged file still gave; ``None`` for a kind it could not tell), and
    ``rebuilt`` (what comes back from the nodes)."""

    path: str
    moved_to: str
    problem: str
    lost: dict[str, int | None] = field(default_factory=dict)
    rebuilt: tuple[str, ...] = REBUILT_FROM_NODES

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "moved_to": self.moved_to, "problem": self.problem, "lost": dict(self.lost),
                "rebuilt_from_nodes": list(self.rebuilt),
                "not_rebuilt": "captures in flight and their analyses, queued webhook deliveries, stored events, "
                               "verdicts and open episodes (the moved file keeps them for inspection)"}


class StateFileRefused(Exception):
    """The ``state_db`` path names something that is not profwatch's own state db, or a place where no db can be
    created: left untouched (exit 2)."""


_KINDS = ((stat.S_ISDIR, "directory"), (stat.S_ISFIFO, "FIFO"), (stat.S_ISCHR, "character device"),
          (stat.S_ISBLK, "block device"), (stat.S_ISSOCK, "socket"))
_HEADER_BYTES = 100
"""SQLite's database header (https://www.sqlite.org/fileformat.html section 1.3): all :func:`check_own` reads."""
_V1_TABLES = frozenset({"captures", "events"})
"""Tables every profwatch state db has had since schema version 1 (``state.py`` module doc)."""
_V1_EVENTS = frozenset({"id", "type", "job_id", "is_alert", "body"})
"""Columns of ``events`` in every schema version; with ``captures.capture_id`` and one of :data:`_CAPTURES_MARK`
they make a db without an ``application_id`` an older profwatch's (checked read-only, before any write)."""
_CAPTURES_MARK = frozenset({"plan", "judge_unix_s"})
"""``captures.plan`` (schema version 1) or ``captures.judge_unix_s`` (versions 2 to 4)."""


def check_own(path: Path) -> None:
    """Refuse a ``state_db`` that is not profwatch's own (module doc); return for an absent or empty file (SQLite
    creates it) and for profwatch's own db, healthy or not. Follows a symlink (the file it names is checked); a
    dangling symlink or a symlink loop is refused.
    Reads at most the 100-byte header (and, for a db without an ``application_id``, its table names).

    Raises:
        StateFileRefused: a dangling symlink or a loop, not a regular file, not SQLite, another application's db, unreadable, or a profwatch db
            whose header is destroyed (the message names the path and says what to do).
    """
    try:
        lst = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise StateFileRefused(f"state_db {path}: cannot stat: {exc.strerror}") from None
    try:
        st = os.stat(path) if stat.S_ISLNK(lst.st_mode) else lst
    except FileNotFoundError:  # a dangling symlink: SQLite would create the file it names, or fail to
        raise StateFileRefused(f"state_db {path} is a symlink to {os.readlink(path)}, which does not exist: left "
                               "untouched; create the folder it names or set [coordinator] state_db to the real "
                               "path") from None
    except OSError as exc:  # a symlink loop (ELOOP), a folder without search permission
        raise StateFileRefused(f"state_db {path} is a symlink that cannot be followed: {exc.strerror}: left "
                               "untouched") from None
    if not stat.S_ISREG(st.st_mode):
        kind = next((name for test, name in _KINDS if test(st.st_mode)), "special file")
        raise StateFileRefused(f"state_db {path} is a {kind}, not a regular file: left untouched; set [coordinator] "
                               "state_db to the path of profwatch's own database file")
    if st.st_size == 0:
        return
    try:
        with open(path, "rb") as f:
            head = f.read(_HEADER_BYTES)
    except OSError as exc:
        raise StateFileRefused(f"state_db {path}: cannot read: {exc.strerror}") from None
    app = int.from_bytes(head[68:72], "big") if len(head) >= 72 else 0
    if head[: len(SQLITE_HEADER)] != SQLITE_HEADER:
        if app == APPLICATION_ID:
            raise StateFileRefused(
                f"state_db {path} is a profwatch state db whose SQLite header is destroyed: left in place. To start "
                f"with an empty state, move it aside (mv {path} {path}.corrupt, and its -wal/-shm files if any) or "
                "restore it from a backup")
        raise StateFileRefused(f"state_db {path} is not an SQLite database (it starts with {head[:16]!r}): not "
                               "profwatch's, left untouched; set [coordinator] state_db to profwatch's own file")
    if app == APPLICATION_ID:
        return
    if app != 0:
        raise StateFileRefused(f"state_db {path} is another application's SQLite database (application_id "
                               f"{app:#010x}, profwatch's is {APPLICATION_ID:#010x}): left untouched")
    try:  # no application_id: a db of a profwatch from before it set one, recognised by its tables
        db = sqlite3.connect(f"{Path(path).resolve().as_uri()}?mode=ro", uri=True, timeout=5)
        try:
            tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            version = int(db.execute("PRAGMA user_version").fetchone()[0])
            cols = {t: {r[1] for r in db.execute(f"PRAGMA table_info({t})")} for t in _V1_TABLES & tables}
        finally:
            db.close()
    except sqlite3.Error as exc:
        raise StateFileRefused(
            f"state_db {path} is an SQLite database without profwatch's application_id whose tables cannot be read "
            f"({exc}): left in place; if it is profwatch's, move it aside (mv {path} {path}.corrupt) to start with "
            "an empty state") from None
    if not _V1_TABLES <= tables:
        raise StateFileRefused(f"state_db {path} is an SQLite database that is not profwatch's (no application_id; "
                               f"tables {sorted(tables)[:8]}): left untouched")
    captures, events = cols["captures"], cols["events"]
    if (version > SCHEMA_VERSION or not _V1_EVENTS <= events or "capture_id" not in captures
            or not captures & _CAPTURES_MARK):
        raise StateFileRefused(
            f"state_db {path} is an SQLite database that is not profwatch's (no application_id; its captures/events "
            f"tables lack profwatch's columns: captures {sorted(captures)[:6]}, events {sorted(events)[:6]}, "
            f"user_version {version}): left untouched")


BUSY_WAIT_S = 10.0
"""How long the start waits for a state db another process holds locked (SQLite's busy timeout retries within it),
then exits 2 naming the holder."""
_CORRUPT_CODES = frozenset({11, 26})
"""SQLITE_CORRUPT and SQLITE_NOTADB (https://www.sqlite.org/rescode.html): the only open errors that are damage."""
_BUSY_CODES = frozenset({5, 6})
"""SQLITE_BUSY and SQLITE_LOCKED: another connection holds the file; never damage."""


class StateFileBusy(StateFileRefused):
    """The state db is healthy but locked by another process past :data:`BUSY_WAIT_S`: left in place (exit 2)."""


def _code(exc: sqlite3.Error) -> int | None:
    code = getattr(exc, "sqlite_errorcode", None)
    return None if code is None else int(code) & 0xFF


def lock_holders(path: Path) -> list[int]:
    """Pids holding a POSIX/flock lock on ``path`` or its ``-wal``/``-shm`` (Linux ``/proc/locks``; ``[]``
    elsewhere or when unreadable). A hint for the operator, not a proof: an OFD lock shows no pid."""
    inodes: set[tuple[int, int, int]] = set()
    for p in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        try:
            st = os.stat(p)
        except OSError:
            continue
        inodes.add((os.major(st.st_dev), os.minor(st.st_dev), st.st_ino))
    pids: list[int] = []
    try:
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return pids
    for line in lines:
        f = line.split()
        if "->" in f:  # a waiter ("1: -> POSIX ..."): not a holder
            continue
        try:
            pid = int(f[4])
            major, minor, ino = f[5].split(":")
            key = (int(major, 16), int(minor, 16), int(ino))
        except (IndexError, ValueError):
            continue
        if key in inodes and pid > 0 and pid not in pids:
            pids.append(pid)
    return pids


def _not_damage(path: Path, exc: sqlite3.Error, busy_wait_s: float) -> StateFileRefused:
    """The refusal for an open error that is not damage: locked (with the holders' pids) or otherwise unusable."""
    if _code(exc) in _BUSY_CODES:
        pids = lock_holders(path)
        held = f" (held by pid {', '.join(map(str, pids))})" if pids else ""
        return StateFileBusy(
            f"state_db {path} is locked by another process{held} after {busy_wait_s:g} s of retries: left in place, "
            "not corrupt; stop the other coordinator or the sqlite3 session holding it, then start again")
    return StateFileRefused(f"state_db {path} cannot be opened ({exc}): left in place, not treated as corrupt")


def check_file(path: Path, busy_wait_s: float = BUSY_WAIT_S) -> str | None:
    """What is wrong with an existing state db file (None: usable, or absent/empty, which SQLite creates).
    Never raises for a damaged file. Opened read-write as the store itself would be (a read-only open fails on a
    healthy WAL file whose ``-shm`` is missing), so a crash's WAL is recovered first.

    Raises:
        StateFileBusy: another process holds the file locked for more than ``busy_wait_s`` (seconds).
        StateFileRefused: an open error that is not damage (cannot open, I/O error, read-only): left in place.
    """
    try:
        with open(path, "rb") as f:
            head = f.read(len(SQLITE_HEADER))
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"cannot read: {exc.strerror}"
    if not head:
        return None
    if head != SQLITE_HEADER:
        return f"not an SQLite database (header {head[:16]!r})"
    try:
        db = sqlite3.connect(path, timeout=busy_wait_s)
    except sqlite3.Error as exc:
        if _code(exc) in _CORRUPT_CODES:
            return f"cannot open: {exc}"
        raise _not_damage(path, exc, busy_wait_s) from None
    try:
        rows = db.execute("PRAGMA integrity_check(20)").fetchall()
    except sqlite3.DatabaseError as exc:
        if _code(exc) in _CORRUPT_CODES:
            return f"integrity_check failed: {exc}"
        raise _not_damage(path, exc, busy_wait_s) from None
    finally:
        db.close()
    if [tuple(r) for r in rows] != [("ok",)]:
        return "integrity_check: " + "; ".join(str(r[0]) for r in rows[:5])
    return None


def _count_lost(path: Path) -> dict[str, int | None]:
    lost: dict[str, int | None] = {}
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
    except sqlite3.Error:
        return {k: None for k in _LOST_QUERIES}
    in_flight = ",".join(f"'{s.value}'" for s in IN_FLIGHT)
    try:
        for kind, q in _LOST_QUERIES.items():
            try:
                lost[kind] = int(db.execute(q.format(in_flight=in_flight)).fetchone()[0])
            except sqlite3.Error:
                lost[kind] = None
    finally:
        db.close()
    return lost


def move_aside(path: Path, problem: str, now_unix_s: float) -> StoreReset:
    """Rename a corrupt db (and its ``-wal``/``-shm``) to ``<name>.corrupt-<UTC time>``; count what it held first.

    Raises:
        OSError: the file cannot be renamed (then the daemon cannot start: exit 2 with the reason).
    """
    lost = _count_lost(path)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now_unix_s))
    target = path.with_name(f"{path.name}.corrupt-{stamp}")
    n = 1
    while target.exists():
        n += 1
        target = path.with_name(f"{path.name}.corrupt-{stamp}-{n}")
    path.rename(target)
    for suffix in ("-wal", "-shm"):
        side = path.with_name(path.name + suffix)
        if side.exists():
            side.rename(target.with_name(target.name + suffix))
    reset = StoreReset(str(path), str(target), problem, lost)
    log.error("state_db_corrupt", path=str(path), moved_to=str(target), problem=problem, lost=lost,
              note="started with an empty state store; the damaged file is kept")
    return reset


class StateLock:
    """The single-writer lock of a state db: an exclusive ``flock`` on ``<state_db>.lock`` (profwatch's own file,
    next to the file the path resolves to; it holds the holder's pid), held while the store is open. ``flock``
    locks an open file description, so a second open in the same process conflicts too; the kernel releases it
    when the process dies, so a stale lock file is harmless."""

    def __init__(self, db: Path) -> None:
        """Take the lock for ``db``.

        Raises:
            StateFileBusy: another process (or store) holds it: the message names the db and the holder's pid.
            StateFileRefused: the db's folder or the lock file cannot be created (a read-only or impossible
                folder): the message names ``[coordinator] state_db``, the path and the cause, without OSError's
                ``[Errno N]`` prefix (before: ``[Errno 2] No such file or directory: '/proc/nope'``, no key).
        """
        real = Path(os.path.realpath(db))
        self.path = real.with_name(real.name + ".lock")
        try:
            real.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
        except OSError as exc:
            raise StateFileRefused(f"[coordinator] state_db {db}: cannot create {exc.filename or real.parent}: "
                                   f"{exc.strerror or exc}; give state_db a path in a folder this user may "
                                   "create and write") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
            os.close(fd)
            raise StateFileBusy(
                f"state_db {db} is in use by another coordinator (pid {holder}, lock {self.path}): one coordinator "
                "per state db; stop that one, or give this one its own state_db") from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd: int | None = fd

    def close(self) -> None:
        """Release the lock (idempotent); the lock file stays."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def open_state_store(path: str | Path, now_unix_s: float, **kw: Any) -> tuple[StateStore, StoreReset | None]:
    """Open the state store; a corrupt file is moved aside and an empty store opened (module doc).

    Returns ``(store, reset or None)``. ``kw`` goes to :class:`StateStore`.
    Raises:
        StateFileRefused: the path is not profwatch's own db (:func:`check_own`): not moved, not used; or its
            folder cannot be created (:class:`StateLock`).
        StateSchemaError: the file is of a newer schema (or an unknown captures table): not moved, not used.
        StateFileBusy: another coordinator holds the db's :class:`StateLock`, or the file is locked by another
            process past :data:`BUSY_WAIT_S`: not moved (exit 2).
        OSError: a corrupt file cannot be moved aside.
    """
    if str(path) == ":memory:":
        return StateStore(path, **kw), None
    p = Path(path)
    check_own(p)
    lock = StateLock(p)  # before anything reads for damage or moves: a second coordinator never touches the file
    try:
        store, reset = _open_locked(p, now_unix_s, **kw)
    except BaseException:
        lock.close()
        raise
    store.owner_lock = lock
    return store, reset


def _open_locked(p: Path, now_unix_s: float, **kw: Any) -> tuple[StateStore, StoreReset | None]:
    problem = check_file(p)
    if problem is None:
        try:
            return StateStore(p, **kw), None
        except StateSchemaError:
            raise
        except sqlite3.DatabaseError as exc:
            if _code(exc) not in _CORRUPT_CODES:  # locked, cannot open, I/O, read-only: not damage, never moved
                raise _not_damage(p, exc, BUSY_WAIT_S) from None
            problem = f"cannot open: {exc}"
    reset = move_aside(Path(os.path.realpath(p)), problem, now_unix_s)  # a symlink stays, the file it names moves
    return StateStore(p, **kw), reset
