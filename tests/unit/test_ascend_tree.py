"""Tests for the Ascend rank-dir SIMULATOR: layout, file formats, timing physics, export modes, damage helpers."""

from __future__ import annotations

import json
import re
import sqlite3
import stat
from itertools import pairwise
from pathlib import Path

import pytest

from profwatch.adapters.tools.msprof_db import sqlite_truncated
from profwatch.simulate import ascend_tree as at
from profwatch.simulate.ascend_db import double_hash

NAME_RE = re.compile(r"^(?P<worker>.+)_(?P<pid>\d+)_(?P<ts>\d{17})_ascend_pt$")
PROFILER_TABLES = {"STRING_IDS", "COMMUNICATION_OP", "CANN_API", "RANK_DEVICE_MAP", "STEP_TIME", "TASK",
                   "COMPUTE_TASK_INFO", "META_DATA", "HOST_INFO", "PYTORCH_API", "COMMUNICATION_TASK_INFO"}
ANALYSIS_TABLES = {"StepTraceTime", "CommAnalyzerTime", "CommAnalyzerBandwidth", "CommAnalyzerMatrix"}


def _tables(db: Path) -> set[str]:
    con = sqlite3.connect(db)
    try:
        return {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    finally:
        con.close()


def _rows(db: Path, sql: str) -> list[tuple]:
    con = sqlite3.connect(db)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return at.generate_cluster(tmp_path_factory.mktemp("c4"), world_size=4, slow_ranks={2: 1.5},
                               export_type="both", capture_id="cap-7", metadata={"profwatch_job_id": "job1"})


def test_layout_names_and_modes(cluster: list[Path]) -> None:
    assert len(cluster) == 4
    for rank, rd in enumerate(cluster):
        m = NAME_RE.match(rd.name)
        assert m and m["worker"] == "node0" and m["pid"] == str(4000 + rank)
        out = rd / "ASCEND_PROFILER_OUTPUT"
        for p in (rd, out):
            assert stat.S_IMODE(p.stat().st_mode) == 0o750
        files = [rd / f"profiler_info_{rank}.json", rd / "profiler_metadata.json",
                 out / f"ascend_pytorch_profiler_{rank}.db", out / "analysis.db", out / "analyse.done",
                 out / "step_trace_time.csv", out / "communication.json", out / "communication_matrix.json",
                 out / "kernel_details.csv", out / "trace_view.json"]
        for f in files:
            assert stat.S_IMODE(f.stat().st_mode) == 0o640, f
        assert (out / "analyse.done").stat().st_size == 0
        # the marker is written last
        newest = max(f.stat().st_mtime_ns for f in files if f.name != "analyse.done")
        assert (out / "analyse.done").stat().st_mtime_ns >= newest


def test_profiler_info_and_metadata(cluster: list[Path]) -> None:
    rd = cluster[1]
    info = json.loads((rd / "profiler_info_1.json").read_text())
    assert info["rank_id"] == 1
    assert info["config"]["experimental_config"]["_export_type"] == ["text", "db"]
    assert info["config"]["experimental_config"]["_profiler_level"] == "Level1"
    assert int(info["end_info"]["collectionTimeEnd"]) > at.DEFAULT_TS_BASE_NS
    assert info["torch_npu_version"] and info["cann_version"]
    meta = json.loads((rd / "profiler_metadata.json").read_text())
    assert meta["profwatch_capture_id"] == "cap-7" and meta["profwatch_job_id"] == "job1"
    (raw, group), = meta["parallel_group_info"].items()
    assert group == {"group_name": "default_group", "group_rank": 1, "global_ranks": [0, 1, 2, 3]}
    db = rd / "ASCEND_PROFILER_OUTPUT" / "ascend_pytorch_profiler_1.db"
    db_meta = dict(_rows(db, "SELECT name, value FROM META_DATA"))
    assert json.loads(db_meta["parallel_group_info"])[raw]["global_ranks"] == [0, 1, 2, 3]
    assert db_meta["profwatch_capture_id"] == "cap-7"


def test_db_schema_and_rows(cluster: list[Path]) -> None:
    for rank, rd in enumerate(cluster):
        out = rd / "ASCEND_PROFILER_OUTPUT"
        db = out / f"ascend_pytorch_profiler_{rank}.db"
        assert PROFILER_TABLES <= _tables(db)
        assert ANALYSIS_TABLES <= _tables(out / "analysis.db")
        assert _rows(db, "SELECT rankId, deviceId FROM RANK_DEVICE_MAP") == [(rank, rank)]
        assert [r[0] for r in _rows(db, "SELECT id FROM STEP_TIME ORDER BY id")] == [1, 2, 3]
        assert _rows(db, "SELECT count(*) FROM COMMUNICATION_OP")[0][0] == 12
        memcpy = _rows(db, "SELECT count(*) FROM TASK JOIN STRING_IDS s ON s.id = TASK.taskType "
                           "WHERE s.value = 'MEMCPY_ASYNC'")[0][0]
        assert memcpy == 3
        # every communication op and compute task joins its CANN_API launch inside a step
        assert _rows(db, "SELECT count(*) FROM COMMUNICATION_OP c JOIN CANN_API a USING (connectionId) "
                         "JOIN STEP_TIME s ON a.startNs BETWEEN s.startNs AND s.endNs")[0][0] == 12
        steps = _rows(out / "analysis.db", "SELECT step, stage FROM StepTraceTime ORDER BY step")
        assert [s for s, _ in steps] == ["1", "2", "3"]
        groups = {g for (g,) in _rows(out / "analysis.db", "SELECT DISTINCT group_name FROM CommAnalyzerTime")}
        raw = _rows(db, "SELECT DISTINCT s.value FROM COMMUNICATION_OP c JOIN STRING_IDS s ON s.id = c.groupName")
        assert groups == {str(double_hash(raw[0][0]))}


def test_double_hash_matches_msprof_analyze() -> None:
    utils = pytest.importorskip("msprof_analyze.cluster_analyse.common_func.utils")
    name = "10.0.0.1%eth0_60000_0_1700000000000000"
    assert double_hash(name) == utils.double_hash(name) == 3703241067009432563


def test_collective_physics_slow_rank_shortest() -> None:
    tls = at.build_timelines(world_size=4, slow_ranks={2: 1.5}, steps=2, collectives_per_step=3)
    per_rank = [[s for st in tl.steps for s in st.segments if s.kind == "collective"] for tl in tls]
    for instance in zip(*per_rank, strict=True):
        assert len({c.name for c in instance}) == 1
        assert len({c.end_ns for c in instance}) == 1  # all ranks leave together
        durations = [c.end_ns - c.start_ns for c in instance]
        assert min(range(4), key=lambda r: durations[r]) == 2  # the last arrival waits least
        assert instance[2].wait_ns == 0 and all(c.wait_ns > 3_000_000 for i, c in enumerate(instance) if i != 2)
    compute = [sum(s.end_ns - s.start_ns for st in tl.steps for s in st.segments if s.kind == "compute")
               for tl in tls]
    assert compute[2] / compute[0] == pytest.approx(1.5, rel=0.05)


def test_host_bound_and_slow_link() -> None:
    tls = at.build_timelines(world_size=4, host_bound_ranks={1: 0.3}, slow_link_ranks={3: 2.0}, steps=1)

    def free(tl: at.RankTimeline) -> int:
        segs = tl.steps[0].segments  # gaps between back-to-back kernels (not across a collective)
        return sum(b.start_ns - a.end_ns for a, b in pairwise(segs) if a.kind == b.kind == "compute")

    assert free(tls[1]) > 3 * free(tls[0])
    colls = [[s for s in tl.steps[0].segments if s.kind == "collective"] for tl in tls]
    assert colls[3][0].link_transit_ns == 2 * colls[0][0].link_transit_ns
    assert colls[1][0].wait_ns == 0  # the host-bound rank arrives last


def test_write_rank_dir_from_measured_timeline(tmp_path: Path) -> None:
    t0 = 1_800_000_000_000_000_000
    group = at.ParallelGroup("g%x_1_0_1", "default_group", (0, 1))
    seg = (at.ComputeSegment(t0 + 100_000, t0 + 5_000_000),
           at.CollectiveSegment(t0 + 5_100_000, t0 + 7_000_000, "hcom_allReduce__1_0_1", group.raw_name,
                                wait_ns=900_000))
    tl = at.RankTimeline(rank=1, world_size=2, hostname="hostA", pid=99, start_ns=t0, groups=[group],
                         steps=[at.StepTimeline(7, t0, t0 + 8_000_000, seg)])
    rd = at.write_rank_dir(tmp_path, tl, with_marker=False, metadata={"profwatch_capture_id": "c1"})
    assert rd.name.startswith("hostA_99_") and not (rd / "ASCEND_PROFILER_OUTPUT" / "analyse.done").exists()
    db = rd / "ASCEND_PROFILER_OUTPUT" / "ascend_pytorch_profiler_1.db"
    assert _rows(db, "SELECT id, startNs, endNs FROM STEP_TIME") == [(7, t0, t0 + 8_000_000)]
    ana = rd / "ASCEND_PROFILER_OUTPUT" / "analysis.db"
    (computing, comm, free, stage), = _rows(ana, "SELECT computing, communication, free, stage FROM StepTraceTime")
    assert (computing, comm, stage) == (4900.0, 1900.0, 8000.0) and free == pytest.approx(1200.0)
    (wait, transit), = _rows(ana, "SELECT wait_time, transit_time FROM CommAnalyzerTime")
    assert wait == pytest.approx(0.9) and transit == pytest.approx(1.0)
    with pytest.raises(FileExistsError):
        at.write_rank_dir(tmp_path, tl)


def test_text_only_and_level0_modes(tmp_path: Path) -> None:
    text = at.generate_cluster(tmp_path / "t", world_size=2, export_type="text")
    out = text[0] / "ASCEND_PROFILER_OUTPUT"
    assert not list(out.glob("*.db")) and (out / "step_trace_time.csv").is_file()
    assert json.loads((text[0] / "profiler_info_0.json").read_text())["config"]["experimental_config"][
        "_export_type"] == ["text"]
    comm = json.loads((out / "communication.json").read_text())
    assert set(comm) == {"step1", "step2", "step3"} and len(comm["step1"]["collective"]) == 4
    lvl0 = at.generate_cluster(tmp_path / "l0", world_size=2, level="Level0")
    out0 = lvl0[0] / "ASCEND_PROFILER_OUTPUT"
    assert "COMMUNICATION_OP" not in _tables(out0 / "ascend_pytorch_profiler_0.db")
    assert _tables(out0 / "analysis.db") == {"StepTraceTime"}


def test_options_hostnames_steps_ts_base(tmp_path: Path) -> None:
    dirs = at.generate_cluster(tmp_path, world_size=2, steps=2, first_step=10, collectives_per_step=2,
                               hostnames={0: "a1", 1: "b2"}, ts_base=1_800_000_000_000_000_000, with_marker=False)
    assert [d.name.split("_")[0] for d in dirs] == ["a1", "b2"]
    db = dirs[1] / "ASCEND_PROFILER_OUTPUT" / "ascend_pytorch_profiler_1.db"
    assert [r[0] for r in _rows(db, "SELECT id FROM STEP_TIME")] == [10, 11]
    assert _rows(db, "SELECT hostName FROM HOST_INFO") == [("b2",)]
    assert _rows(db, "SELECT min(startNs) > 1800000000000000000 FROM TASK") == [(1,)]
    assert not (dirs[0] / "ASCEND_PROFILER_OUTPUT" / "analyse.done").exists()


def test_damage_helpers(tmp_path: Path) -> None:
    dirs = at.generate_cluster(tmp_path, world_size=4)
    db0 = at.truncate_db(dirs[0])
    assert sqlite_truncated(db0) and not sqlite_truncated(at.profiler_db_path(dirs[1]))
    with pytest.raises(sqlite3.DatabaseError):
        _rows(db0, "SELECT count(*) FROM TASK")
    at.drop_step_time(dirs[1])
    assert "STEP_TIME" not in _tables(at.profiler_db_path(dirs[1]))
    at.set_rank_device_map(dirs[2], 7)
    assert _rows(at.profiler_db_path(dirs[2]), "SELECT rankId FROM RANK_DEVICE_MAP") == [(7,)]
    at.remove_memcpy_tasks(dirs[2])
    assert _rows(at.profiler_db_path(dirs[2]), "SELECT count(*) FROM TASK t JOIN STRING_IDS s "
                 "ON s.id = t.taskType WHERE s.value = 'MEMCPY_ASYNC'") == [(0,)]
    assert [p.name for p in at.remove_profiler_info(dirs[3])] == ["profiler_info_3.json"]
    at.remove_marker(dirs[3])
    assert not (dirs[3] / "ASCEND_PROFILER_OUTPUT" / "analyse.done").exists()
    leftovers = at.add_prof_leftovers(dirs[3], devices=(3,))
    assert {p.relative_to(dirs[3]).parts[1:] for p in leftovers} == {("host", "sqlite"), ("device_3", "sqlite")}
    at.remove_output(dirs[3])
    assert not (dirs[3] / "ASCEND_PROFILER_OUTPUT").exists()


def test_many_ranks_minimal_layout(tmp_path: Path) -> None:
    """Rank numbering, device ids and node names of a larger minimal cluster (its generation time is measured by
    ``bench/bench_generate.py``, not asserted here)."""
    dirs = at.generate_cluster(tmp_path, world_size=64, slow_ranks={5: 1.5}, minimal=True)
    assert len(dirs) == 64 and len({d.name for d in dirs}) == 64
    db = at.profiler_db_path(dirs[63])
    assert _rows(db, "SELECT rankId, deviceId FROM RANK_DEVICE_MAP") == [(63, 7)]
    assert _rows(db, "SELECT count(*) FROM COMMUNICATION_OP") == [(12,)]
    assert dirs[63].name.startswith("node7_4063_")  # node = rank // 8, pid = 4000 + rank


def test_slow_ops_slow_one_operator_on_every_rank_and_nothing_else() -> None:
    def kernel_ns(tls: list[at.RankTimeline]) -> dict[tuple[int, str], int]:
        out: dict[tuple[int, str], int] = {}
        for tl in tls:
            for st in tl.steps:
                for seg in st.segments:
                    if isinstance(seg, at.ComputeSegment):
                        key = (tl.rank, seg.op_type)
                        out[key] = out.get(key, 0) + seg.end_ns - seg.start_ns
        return out

    base = kernel_ns(at.build_timelines(world_size=2, seed=3))
    slow = kernel_ns(at.build_timelines(world_size=2, seed=3, slow_ops={"MatMul": 1.5}))
    for rank in (0, 1):
        assert slow[(rank, "MatMul")] == pytest.approx(1.5 * base[(rank, "MatMul")], rel=1e-3)
        assert slow[(rank, "Add")] == base[(rank, "Add")]  # same draws: only the named operator moved
    with pytest.raises(ValueError, match="simulated operators"):
        at.build_timelines(world_size=2, slow_ops={"Conv2D": 2.0})
