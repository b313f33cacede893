"""Rank dir names, profiler_info and profiler_metadata parsing (msprof-analyze.md sections 3, 4.1, 12)."""

from __future__ import annotations

import pytest

from profwatch.core.batches.prof_layout import (
    LayoutError,
    parse_profiler_info,
    parse_profiler_metadata,
    parse_rank_dir_name,
    rank_from_db_name,
    rank_from_profiler_info_name,
)


@pytest.mark.parametrize(
    ("name", "worker", "pid", "ts", "kind"),
    [
        ("node0_4000_20260101120000123_ascend_pt", "node0", 4000, "20260101120000123", "ascend_pt"),
        ("my_host_name_7_20251231235959999_torch_pt", "my_host_name", 7, "20251231235959999", "torch_pt"),
    ],
)
def test_rank_dir_names(name: str, worker: str, pid: int, ts: str, kind: str) -> None:
    parsed = parse_rank_dir_name(name)
    assert parsed is not None
    assert (parsed.worker, parsed.pid, parsed.ts, parsed.kind) == (worker, pid, ts, kind)


@pytest.mark.parametrize(
    "name",
    [
        "node0_4000_2026010112000012_ascend_pt",  # 16 digits
        "node0_4000_20261301120000123_ascend_pt",  # month 13
        "node0_x_20260101120000123_ascend_pt",
        "_4000_20260101120000123_ascend_pt",
        "node0_4000_20260101120000123_ascend_ms",
        "PROF_000001_20260101120000123_ABC",
        "ASCEND_PROFILER_OUTPUT",
        "node0_4000_20260101120000123_ascend_pt\n",  # a trailing newline: `$` alone would accept it
    ],
)
def test_not_rank_dirs(name: str) -> None:
    assert parse_rank_dir_name(name) is None


def test_ts_is_local_naive() -> None:
    parsed = parse_rank_dir_name("h_1_20260101120000123_ascend_pt")
    assert parsed is not None and parsed.ts_naive.microsecond == 123000 and parsed.ts_naive.tzinfo is None


def test_file_name_ranks() -> None:
    assert rank_from_profiler_info_name("profiler_info_12.json") == 12
    assert rank_from_profiler_info_name("profiler_info.json") is None
    assert rank_from_profiler_info_name("profiler_metadata.json") is None
    assert rank_from_db_name("ascend_pytorch_profiler_3.db") == 3
    assert rank_from_db_name("ascend_pytorch_profiler.db") == -1
    assert rank_from_db_name("analysis.db") is None
    assert rank_from_profiler_info_name("profiler_info_12.json\n") is None  # whole names only
    assert rank_from_db_name("ascend_pytorch_profiler_3.db\n") is None


def test_profiler_info_fields() -> None:
    info = parse_profiler_info({
        "config": {"experimental_config": {"_export_type": ["text", "db"], "_profiler_level": "Level1"}},
        "end_info": {"collectionTimeEnd": "1767268800005000000"},
        "torch_npu_version": "2.7.1", "cann_version": "8.3.RC1", "rank_id": 3,
    })
    assert info.rank_id == 3 and info.export_types == ("text", "db") and info.profiler_level == "Level1"
    assert info.collection_time_end_ns == 1767268800005000000 and info.torch_npu_version == "2.7.1"
    assert parse_profiler_info({"config": {"experimental_config": {"_export_type": "Text"}}}).export_types == ("text",)
    assert parse_profiler_info({"end_info": {}}).rank_id is None


def test_profiler_info_bad_shapes() -> None:
    with pytest.raises(LayoutError):
        parse_profiler_info([])  # type: ignore[arg-type]
    with pytest.raises(LayoutError):
        parse_profiler_info({"rank_id": "three"})


def test_metadata_world_size_and_ids() -> None:
    meta = parse_profiler_metadata({
        "profwatch_capture_id": "cap-1", "profwatch_job_id": "job", "profwatch_reason": "slow",
        "parallel_group_info": {
            "g1": {"group_name": "default_group", "global_ranks": [0, 1, 2, 3, 4, 5, 6, 7]},
            "g2": {"group_name": "tp", "global_ranks": [0, 1]},
        },
        "distributed_args": {"world_size": 16},
    })
    assert meta.capture_id == "cap-1" and meta.job_id == "job" and meta.reason == "slow"
    assert meta.world_size == 8  # default_group wins over distributed_args (docs/rank-dirs.md#completion)
    assert meta.group_names == frozenset({"g1", "g2"})
    assert parse_profiler_metadata({"distributed_args": {"world_size": 16}}).world_size == 16
    assert parse_profiler_metadata({"trace_id": "x"}).world_size is None
    with pytest.raises(LayoutError):
        parse_profiler_metadata("x")  # type: ignore[arg-type]
