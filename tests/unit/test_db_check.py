"""The rank DB check reads the header, the schema and the tables a verdict reads, not every byte of the file
(daemon/profwatch/adapters/fs/rank_dir_fs.py): a corrupt page in a checked table is caught, one in a table no
verdict reads is not looked for, a truncated or foreign file is refused by its header. Real SQLite files."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

from profwatch.adapters.fs.rank_dir_fs import CHECKED_TABLES, RankDirReader

PAGE = 4096


def _db(path: Path) -> dict[str, int]:
    """A rank DB with a verdict table (COMMUNICATION_OP) and a table no verdict reads (PYTORCH_API), each over many
    pages; returns each table's root page number."""
    with closing(sqlite3.connect(path)) as db:
        db.execute(f"PRAGMA page_size={PAGE}")
        db.execute("CREATE TABLE COMMUNICATION_OP(opName INTEGER, startNs INTEGER, endNs INTEGER, pad TEXT)")
        db.execute("CREATE TABLE PYTORCH_API(startNs INTEGER, endNs INTEGER, pad TEXT)")
        db.execute("CREATE TABLE RANK_DEVICE_MAP(rankId INTEGER, deviceId INTEGER)")
        db.execute("INSERT INTO RANK_DEVICE_MAP VALUES(0, 0)")
        db.executemany("INSERT INTO COMMUNICATION_OP VALUES(?,?,?,?)", [(i, i, i + 5, "x" * 200) for i in range(2000)])
        db.executemany("INSERT INTO PYTORCH_API VALUES(?,?,?)", [(i, i + 5, "y" * 200) for i in range(2000)])
        db.commit()
        return {n: r for n, r in db.execute("SELECT name, rootpage FROM sqlite_master WHERE type='table'")}


def _spoil(path: Path, page: int) -> None:
    """Overwrite a page's b-tree header with garbage (page numbers count from 1)."""
    with open(path, "r+b") as fh:
        fh.seek((page - 1) * PAGE)
        fh.write(b"\x0f" + b"\xff" * 63)


def _check(path: Path) -> str | None:
    return RankDirReader().check_db(str(path)).error


def test_a_corrupt_page_in_a_verdict_table_is_caught(tmp_path: Path) -> None:
    db = tmp_path / "ascend_pytorch_profiler_0.db"
    roots = _db(db)
    assert "COMMUNICATION_OP" in CHECKED_TABLES and "PYTORCH_API" not in CHECKED_TABLES
    assert _check(db) is None
    _spoil(db, roots["COMMUNICATION_OP"])
    err = _check(db)
    assert err is not None and ("COMMUNICATION_OP" in err or "malformed" in err), err


def test_a_corrupt_page_no_verdict_reads_is_not_looked_for(tmp_path: Path) -> None:
    """What the whole-file quick_check used to find at the cost of reading every byte; the verdict never reads
    that table (an enrich recipe that does fails on its own)."""
    db = tmp_path / "ascend_pytorch_profiler_0.db"
    roots = _db(db)
    _spoil(db, roots["PYTORCH_API"])
    with closing(sqlite3.connect(db)) as con:
        assert con.execute("PRAGMA quick_check(1)").fetchone()[0] != "ok"  # the whole-file check would refuse it
    assert _check(db) is None


def test_a_truncated_or_foreign_file_is_refused_by_its_header(tmp_path: Path) -> None:
    db = tmp_path / "ascend_pytorch_profiler_0.db"
    _db(db)
    size = db.stat().st_size
    with open(db, "r+b") as fh:
        fh.truncate(size - 3 * PAGE)  # an interrupted copy
    assert "truncated" in (_check(db) or "")
    other = tmp_path / "analysis.db"
    other.write_bytes(b"not SQLite at all " * 100)
    assert "not a database" in (_check(other) or "")
    bad_page = tmp_path / "x.db"
    _db(bad_page)
    with open(bad_page, "r+b") as fh:
        fh.seek(16)
        fh.write((3000).to_bytes(2, "big"))  # a page size that is not a power of two
    assert "page size 3000" in (_check(bad_page) or "")


def test_a_db_damaged_in_place_with_its_mtime_restored_is_checked_again(tmp_path: Path) -> None:
    """One reader keeps its DB checks under the file's identity: a page spoiled in place (same size) with the mtime
    set back (``touch -d``, ``cp -p``) still misses the cache, by its ctime, which no user can set back."""
    import os
    import time

    db = tmp_path / "ascend_pytorch_profiler_0.db"
    roots = _db(db)
    reader = RankDirReader()
    assert reader.check_db(str(db)).error is None
    before = os.stat(db)
    _spoil(db, roots["COMMUNICATION_OP"])
    deadline = time.monotonic() + 10
    while True:  # the kernel's ctime ticks coarsely (a few ms): restore the mtime until the ctime has moved
        os.utime(db, ns=(before.st_atime_ns, before.st_mtime_ns))
        after = os.stat(db)
        if after.st_ctime_ns != before.st_ctime_ns or time.monotonic() > deadline:
            break
        time.sleep(0.001)
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    assert after.st_ctime_ns != before.st_ctime_ns
    err = reader.check_db(str(db)).error
    assert err is not None and ("COMMUNICATION_OP" in err or "malformed" in err), err
