"""``scan`` / ``analyze`` on real torch_npu / msprof-analyze output files that no one here wrote.

The files are the public samples in ``../shared/data/ascend_samples/`` (see its ``SOURCES.md``: Ascend/msprof-analyze
test resources: a single-rank ``trace_view.json``, two ``kernel_details.csv`` column sets, and the text-mode
cluster outputs). A fixture lays them out, in a temporary folder, as what a text-export capture leaves behind:
two ``*_ascend_pt`` rank dirs with ``ASCEND_PROFILER_OUTPUT/`` text files and ``analyse.done``, plus the
``cluster_analysis_output/`` a text-mode ``msprof-analyze cluster`` run writes beside them. Only the
``profiler_info_{rank}.json`` / ``profiler_metadata.json`` around them are written here, in torch-npu 2.13.0's
shape. profwatch reads DB exports only: both commands must give the documented status "text export: re-export
as db", not crash, and read no text file. The samples are never copied into the repository.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from profwatch.commands.analyze import analyze
from profwatch.commands.scan import scan
from profwatch.core.batches.completeness import TEXT_EXPORT_REASON
from tests.conftest import SHARED

SAMPLES = (Path(os.environ.get("PROFWATCH_SHARED_DIR") or SHARED) / "data" / "ascend_samples"
           / "msprof-analyze-test-resources" / "test")
"""``../shared/data`` beside the clone (CI); ``PROFWATCH_SHARED_DIR`` points elsewhere (a git worktree)."""
FILES = {
    "trace_view": SAMPLES / "ut/advisor/timeline_advice/trace_view.json",
    "kernels_new": SAMPLES / "ut/advisor/compute_advice/data/kernel_details.csv",
    "kernels_old": SAMPLES / "ut/advisor/advisor_backend/compute_advice/kernel_details.csv",
    "cluster_steps": SAMPLES / "resource/advisor/cluster_analysis_output/cluster_step_trace_time.csv",
    "cluster_comm": SAMPLES / "resource/advisor/cluster_analysis_output/cluster_communication.json",
}


def _info(rank: int) -> dict:
    """profiler_info_{rank}.json as torch-npu 2.13.0 writes it for a text export (see test_monitor_protocol)."""
    return {
        "config": {"common_config": {"activities": ["ProfilerActivity.CPU", "ProfilerActivity.NPU"],
                                     "schedule": {"wait": 0, "active": 2, "warmup": 1, "repeat": 1, "skip_first": 0,
                                                  "skip_first_wait": 0},
                                     "record_shapes": False, "profile_memory": False, "with_stack": False,
                                     "with_flops": False, "with_modules": False},
                   "experimental_config": {"_profiler_level": "Level1", "_aic_metrics": "ACL_AICORE_PIPE_UTILIZATION",
                                           "_export_type": ["text"]}},
        "start_info": {"syscnt_enable": True, "freq": 100, "start_cnt": 1, "start_monotonic": 1},
        "end_info": {"collectionTimeEnd": 1767268801000000000, "MonotonicTimeEnd": 2},
        "torch_npu_version": "2.13.0", "cann_version": "8.5.0", "rank_id": str(rank),
    }


@pytest.fixture
def text_capture(tmp_path: Path) -> Path:
    missing = [str(p) for p in FILES.values() if not p.is_file()]
    if missing:
        pytest.skip(f"the public msprof-analyze samples are not beside this clone (../shared/data/ascend_samples): "
                    f"missing {missing[:2]}")
    root = tmp_path / "capture"
    group = {"10.0.0.1%eth0_60000_0_1767268800000000": {"group_name": "default_group", "group_rank": 0,
                                                        "global_ranks": [0, 1]}}
    for rank, kernels in ((0, FILES["kernels_new"]), (1, FILES["kernels_old"])):
        rd = root / f"node0_{4100 + rank}_2026010112000000{rank}_ascend_pt"
        out = rd / "ASCEND_PROFILER_OUTPUT"
        out.mkdir(parents=True)
        (rd / f"profiler_info_{rank}.json").write_text(json.dumps(_info(rank), indent=4))
        meta = {"ENV_VARIABLES": {"HCCL_ALGO": ""}, "parallel_group_info": group, "trace_id": f"{rank:032X}"}
        meta["parallel_group_info"] = {k: {**v, "group_rank": rank} for k, v in group.items()}
        (rd / "profiler_metadata.json").write_text(json.dumps(meta))
        shutil.copyfile(kernels, out / "kernel_details.csv")
        if rank == 0:
            shutil.copyfile(FILES["trace_view"], out / "trace_view.json")
        (out / "analyse.done").touch()
    cluster = root / "cluster_analysis_output"
    cluster.mkdir()
    shutil.copyfile(FILES["cluster_steps"], cluster / "cluster_step_trace_time.csv")
    shutil.copyfile(FILES["cluster_comm"], cluster / "cluster_communication.json")
    return root


def test_scan_says_text_export_re_export_as_db(text_capture: Path) -> None:
    res = CliRunner().invoke(scan, [str(text_capture), "--json"])
    assert res.exit_code == 1, res.output
    (batch,) = json.loads(res.output[res.output.index("["):])
    assert batch["status"] == "incomplete" and batch["expected_ranks"] == [0, 1]
    assert batch["rank_states"] == {"0": "failed", "1": "failed"}
    assert all(TEXT_EXPORT_REASON in p["reason"] for p in batch["problems"]), batch["problems"]
    table = CliRunner().invoke(scan, [str(text_capture)]).output
    assert TEXT_EXPORT_REASON in table and "Traceback" not in table
    for bad in ("rank ?", "rank None", "missing ranks []"):
        assert bad not in table


def test_analyze_says_text_export_re_export_as_db(text_capture: Path, tmp_path: Path) -> None:
    res = CliRunner().invoke(analyze, [str(text_capture), "--json", "--no-advisor", "--no-html", "--out",
                                       str(tmp_path / "work")])
    assert res.exit_code == 1, res.output
    out = json.loads(res.output.strip().splitlines()[-1])
    assert out["status"] == "not_applicable", out
    assert out["detail"].startswith(f"every rank of the batch is unusable: {TEXT_EXPORT_REASON}")
    assert out["recipes"]["completeness"] == "not_applicable", out["recipes"]
    assert not out["suspects"]
