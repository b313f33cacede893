"""The rank DB check before a verdict, cold page cache: the whole-file ``PRAGMA quick_check`` it used to run beside
the targeted check (header, schema, ``quick_check`` of the tables a verdict reads: ``rank_dir_fs.CHECKED_TABLES``).

One SQLite file shaped like a rank DB whose bytes are mostly in a table no verdict reads (``PYTORCH_API`` ~90 %,
``COMMUNICATION_OP`` and ``TASK`` ~10 %: in the issue's 1024-rank batch 1.79 GB of DBs against the 0.2 GB the
recipe reads). Before each run the file is evicted from the page cache (``fdatasync`` +
``posix_fadvise(POSIX_FADV_DONTNEED)``, no root needed); the two sides alternate, the order reversed each round.
Prints wall and CPU seconds per side and the load average; nothing is asserted.

Usage: python bench/bench_db_check.py [--rounds 4] [--rows 500000] [--work DIR]
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "daemon"))

from profwatch.adapters.fs import rank_dir_fs  # noqa: E402


def evict(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def make(path: Path, rows: int) -> None:
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE PYTORCH_API(startNs INTEGER, endNs INTEGER, pad TEXT)")
        db.execute("CREATE TABLE COMMUNICATION_OP(opName INTEGER, startNs INTEGER, endNs INTEGER, pad TEXT)")
        db.execute("CREATE TABLE TASK(startNs INTEGER, endNs INTEGER, taskType INTEGER, pad TEXT)")
        db.executemany("INSERT INTO PYTORCH_API VALUES(?,?,?)", ((i, i + 5, "y" * 180) for i in range(rows)))
        db.executemany("INSERT INTO COMMUNICATION_OP VALUES(?,?,?,?)",
                       ((i, i, i + 5, "x" * 80) for i in range(rows // 25)))
        db.executemany("INSERT INTO TASK VALUES(?,?,?,?)", ((i, i + 5, i % 7, "t" * 60) for i in range(rows // 8)))
    sqlite3.connect(path).close()


def whole_file(path: Path) -> None:
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        assert con.execute("PRAGMA quick_check(1)").fetchone()[0] == "ok"
    finally:
        con.close()


def targeted(path: Path) -> None:
    st = path.stat()
    assert rank_dir_fs._check_sqlite(str(path), path.name, st.st_size, st.st_mtime).error is None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--rows", type=int, default=500_000)
    ap.add_argument("--work", type=Path, default=Path("/tmp/profwatch-bench-dbcheck"))
    a = ap.parse_args()
    a.work.mkdir(parents=True, exist_ok=True)
    db = a.work / "ascend_pytorch_profiler_0.db"
    db.unlink(missing_ok=True)
    make(db, a.rows)
    res: dict[str, list[tuple[float, float]]] = {"whole-file quick_check": [], "targeted check": []}
    sides = [("whole-file quick_check", whole_file), ("targeted check", targeted)]
    for r in range(a.rounds):
        for name, fn in sides if r % 2 == 0 else sides[::-1]:
            evict(db)
            c0, t0 = time.process_time(), time.monotonic()
            fn(db)
            res[name].append((time.monotonic() - t0, time.process_time() - c0))
    print(f"{db.stat().st_size / 2**20:.0f} MiB DB, cold page cache, {a.rounds} rounds; load {os.getloadavg()[0]:.1f}")
    for name, rows in res.items():
        print(f"  {name:<24} wall s {min(w for w, _ in rows):.3f}-{max(w for w, _ in rows):.3f}  "
              f"CPU s {min(c for _, c in rows):.3f}-{max(c for _, c in rows):.3f}")
    db.unlink()


if __name__ == "__main__":
    main()
