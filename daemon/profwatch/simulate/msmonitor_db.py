"""msMonitor's lightweight per-rank DBs, generated (I/O: writes files): ``msmonitor_{pid}_{ts17}_{rank}.db`` side by
side in one folder, one per rank, no rank dir around them.

No sample of a real msMonitor DB was at hand: the files are written from what msprof-analyze 26.2.0's own reader
expects of them, read in its cluster data preprocessing (``cluster_analyse/cluster_data_preprocess/
prof_data_allocate.py``: the name pattern ``^msmonitor_(\\d+)_\\d{17}_(-1|\\d+)\\.db$``, the rank from the last
number, files found up to 5 folders down; ``data_preprocessor.py``: the newest timestamp wins for a rank with
several) and its recipes (``recipes/base_recipe_analysis.py``: the file itself is the rank's profiler DB and there
is no ``analysis.db``; ``slow_rank`` reads ``COMMUNICATION_OP``, ``RANK_DEVICE_MAP``, ``STRING_IDS`` and
``CANN_API`` through ``prof_exports/cluster_time_summary_export.py: CommunicationTimeExport``, and ``STEP_TIME`` for
a step range). So each file holds the tables of the rank's ``ascend_pytorch_profiler_{rank}.db`` that
:func:`profwatch.simulate.ascend_db.write_profiler_db` writes (a superset of what those queries read).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path

from profwatch.simulate.ascend_db import write_profiler_db
from profwatch.simulate.ascend_tree import build_timelines


def msmonitor_db_name(pid: int, start_ns: int, rank: int) -> str:
    """``msmonitor_{pid}_{YYYYmmddHHMMSSfff}_{rank}.db`` (the timestamp in local time, 17 digits)."""
    s = start_ns / 1e9
    ts17 = time.strftime("%Y%m%d%H%M%S", time.localtime(s)) + f"{int(s * 1000) % 1000:03d}"
    return f"msmonitor_{pid}_{ts17}_{rank}.db"


def generate_msmonitor_batch(out_dir: Path, *, world_size: int = 4, slow_ranks: Mapping[int, float] | None = None,
                             steps: int = 3, seed: int = 0) -> list[Path]:
    """Write one batch of ``world_size`` msMonitor DBs flat under ``out_dir`` (Level1, with collectives);
    ``slow_ranks`` {rank: factor} as :func:`profwatch.simulate.ascend_tree.generate_cluster`. Returns the files by
    rank."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for tl in build_timelines(world_size=world_size, slow_ranks=slow_ranks, steps=steps, seed=seed):
        path = out / msmonitor_db_name(tl.pid, tl.start_ns, tl.rank)
        write_profiler_db(path, tl, metadata={}, minimal=False)
        paths.append(path)
    return paths
