"""Benchmark of the slow-link judgement's memory in our own process (issue 34: <= 1 GiB at 1024 ranks; prints a table,
no assertions).

Per ``--sizes`` rank count, in a fresh child process (so each peak is its own): the rows of msprof-analyze's
``ClusterCommunicationMatrix`` for every directed pair of one world group (``1024 * 1023 = 1,047,552`` pairs at 1024
ranks), ``--steps`` steps of ``Total Op Info`` rows, one slow link (ranks 1 and 2 at 40 % bandwidth), held as the
evidence holds them (``ClusterEvidence.link_rows``: columns, ``link_rows.LinkRows``, filled from row tuples in
chunks as ``msprof_db.read_link_rows`` fills them from the result DB; ``--dicts``: a list of one dict per row, as
before issue 34), then judged by ``links.find_slow_links``. Printed: the seconds to build the rows, the peak resident
set (``ru_maxrss``) after the rows were built and after the judgement, the judgement's wall and CPU seconds, the
pairs judged, the links named, and the 1-minute load average.

``--db``: the rows are first written to a ``ClusterCommunicationMatrix`` table of a SQLite file in ``--work`` (as
``communication_matrix_sum`` leaves them) and the child reads them with ``msprof_db.read_link_rows``, the path of
``profwatch analyze`` and the coordinator after the recipe (the file is deleted afterwards).

Usage: ``python bench/bench_links_memory.py [--sizes 256,1024] [--steps 1] [--dicts | --db]``; run it niced on a
shared box, alone.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "daemon"))

MiB = 2**20
CHUNK = 16384


NAMES = ("step", "hccl_op_name", "group_name", "src_rank", "dst_rank", "transport_type", "transit_size",
         "transit_time", "bandwidth", "op_name")


def matrix_tuples(ranks: int, steps: int) -> Iterator[tuple[Any, ...]]:
    """Directed-pair rows of one world group as an SQLite cursor gives them (tuples in the order of ``NAMES``)."""
    for step in range(1, steps + 1):
        for src in range(ranks):
            for dst in range(ranks):
                if src == dst:
                    continue
                slow = {src, dst} == {1, 2}
                t = 1.0 * (1 + 0.01 * ((src * 31 + dst * 17 + step) % 7)) * (2.5 if slow else 1.0)
                yield (f"step{step}", "Total Op Info", "world", src, dst, "RDMA", 16.0, t, 16.0 / t, "Total Op Info")


def matrix_rows(ranks: int, steps: int, dicts: bool) -> Any:
    """The rows held as ``ClusterEvidence.link_rows`` holds them (columns, read ``CHUNK`` rows at a time as
    ``msprof_db.read_link_rows`` reads them), or (``dicts``) as a list of one dict per row (before issue 34)."""
    from profwatch.core.verdict.link_rows import LinkRows

    if dicts:
        return [dict(zip(NAMES, r, strict=True)) for r in matrix_tuples(ranks, steps)]
    out = LinkRows()
    rows = matrix_tuples(ranks, steps)
    while chunk := list(itertools.islice(rows, CHUNK)):
        out.extend_tuples(NAMES, chunk)
    return out


def write_db(path: Path, ranks: int, steps: int) -> None:
    """The rows as msprof-analyze's ``communication_matrix_sum`` leaves them: a ``ClusterCommunicationMatrix`` table
    of ``path`` (``--db``)."""
    import sqlite3

    con = sqlite3.connect(path)
    con.execute(f"CREATE TABLE ClusterCommunicationMatrix ({', '.join(NAMES)})")
    con.executemany(f"INSERT INTO ClusterCommunicationMatrix VALUES ({', '.join('?' * len(NAMES))})",
                    matrix_tuples(ranks, steps))
    con.commit()
    con.close()


def child(ranks: int, steps: int, dicts: bool, db: str = "") -> dict[str, Any]:
    from profwatch.core.verdict.links import find_slow_links

    t0 = time.monotonic()
    if db:  # the CLI's and the coordinator's path: msprof_db.read_link_rows from the result DB
        from profwatch.adapters.tools.msprof_db import read_link_rows

        rows = read_link_rows(Path(db), "ClusterCommunicationMatrix")
    else:
        rows = matrix_rows(ranks, steps, dicts)
    read_s = time.monotonic() - t0
    rss_rows = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    t0, c0 = time.monotonic(), time.process_time()
    found = find_slow_links(rows, world_size=ranks, step_time_us=100_000.0)
    wall, cpu = time.monotonic() - t0, time.process_time() - c0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"rows": len(rows), "read_s": read_s, "rss_rows": rss_rows, "rss": rss, "wall": wall, "cpu": cpu,
            "pairs": found.pairs_judged, "links": [list(lk.ranks) for lk in found.links],
            "folded": sorted(found.folded_ranks)}


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--sizes", default="256,1024")
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--dicts", action="store_true", help="hold the rows as a list of dicts (before issue 34)")
    ap.add_argument("--db", action="store_true", help="read the rows from a ClusterCommunicationMatrix table "
                    "(msprof_db.read_link_rows, the CLI's path), written in --work first")
    ap.add_argument("--work", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")))
    ap.add_argument("--child", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--child-db", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.steps, args.dicts, args.child_db)))
        return
    args.work.mkdir(parents=True, exist_ok=True)  # a --work that does not exist yet is made (sqlite cannot open in it)
    print(f"{'ranks':>6} {'rows':>9} {'read s':>7} {'pairs judged':>12} {'peak MiB rows':>13} {'peak MiB judged':>15} "
          f"{'wall s':>7} {'CPU s':>7} {'links':>12} {'folded':>8} {'load 1m':>8}", flush=True)
    for n in (int(x) for x in args.sizes.split(",")):
        db = args.work / f"bench-links-{os.getpid()}-{n}.db" if args.db else None
        try:
            if db is not None:
                write_db(db, n, args.steps)
            out = subprocess.run([sys.executable, __file__, "--child", str(n), "--steps", str(args.steps)]
                                 + (["--dicts"] if args.dicts else []) + (["--child-db", str(db)] if db else []),
                                 capture_output=True, text=True, check=True)
        finally:
            if db is not None:
                db.unlink(missing_ok=True)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"{n:>6} {r['rows']:>9} {r['read_s']:>7.1f} {r['pairs']:>12} {r['rss_rows'] / MiB:>13.0f} {r['rss'] / MiB:>15.0f} "
              f"{r['wall']:>7.1f} {r['cpu']:>7.1f} {json.dumps(r['links']):>12} {json.dumps(r['folded']):>8} "
              f"{os.getloadavg()[0]:>8.2f}", flush=True)


if __name__ == "__main__":
    main()
