"""A verdict over a targeted capture says what it did not see (issue 22 item 3), on trees the generator writes and
the real msprof-analyze: the capture's rank_list and world size travel in the rank dirs' metadata (so an offline
scan expects the subset), a prefix rank_list (0-3 of 8) stays a subset, and when every captured rank waits for a
rank outside the capture the verdict is ``partial`` with the reason, naming the rank when only one is outside."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from profwatch.adapters.fs.rank_dir_fs import scan_tree
from profwatch.analysis.facade import AnalysisSettings, analyze_batch
from profwatch.analysis.result import AnalysisResult
from profwatch.core.batches.prof_layout import MAX_DECODED_RANKS, RANK_LIST_KEY, WORLD_SIZE_KEY
from profwatch.core.capture.planner import capture_metadata
from profwatch.core.verdict.msprof_plan import MsprofSettings
from profwatch.simulate.ascend_tree import generate_cluster

WORLD = 8


def _targeted(root: Path, keep: list[int], **kw: object) -> Path:
    """An 8-rank job captured with ``rank_list = keep``: the metadata the planner stamps, the other dirs absent."""
    meta = capture_metadata("cap-t", "manual", "job", keep, WORLD)
    meta.pop("profwatch_capture_id")
    dirs = generate_cluster(root, world_size=WORLD, steps=4, capture_id="cap-t", metadata=meta, seed=3,
                            **kw)  # type: ignore[arg-type]
    for r, d in enumerate(dirs):
        if r not in keep:
            shutil.rmtree(d)
    return root


def _analyze(prof: Path, work: Path) -> AnalysisResult:
    (batch,) = scan_tree(prof)  # offline: no hint, no --world-size
    assert batch.status == "complete", batch.describe()
    settings = AnalysisSettings(msprof=MsprofSettings(advisor=False, communication_matrix=False, timeout_s=300))
    return analyze_batch(batch, work_dir=work, settings=settings, armed_steps=[1, 2, 3, 4], enrich=False)


def test_capture_metadata_carries_the_rank_list_as_ranges_within_torch_npus_limit() -> None:
    meta = capture_metadata("c", "r", "j", [0, 1, 2, 3, 8, 10, 11, 12], 16)
    assert meta[RANK_LIST_KEY] == "0-3,8,10-12" and meta[WORLD_SIZE_KEY] == 16
    assert RANK_LIST_KEY not in capture_metadata("c", "r", "j", None, 16)  # a whole-job capture says nothing
    scattered = list(range(0, 4000, 2))  # 2,000 single ranks: more than 4,096 characters even as ranges
    big = capture_metadata("c", "r", "j", scattered, 4000)
    assert RANK_LIST_KEY not in big and big[WORLD_SIZE_KEY] == 4000
    runs = [r for k in range(0, 65536, 16) for r in range(k, k + 8)]  # 4,096 runs of 8: long, but as ranges?
    encoded = capture_metadata("c", "r", "j", runs, 65536).get(RANK_LIST_KEY)
    assert encoded is None or len(encoded) + 2 <= 4096
    assert MAX_DECODED_RANKS >= 65536


@pytest.mark.parametrize("keep", [[0, 1, 2, 3], [2, 3, 4, 5]], ids=["prefix", "middle"])
def test_waits_for_an_uncaptured_slow_rank_make_the_verdict_partial(tmp_path: Path, keep: list[int]) -> None:
    res = _analyze(_targeted(tmp_path / "prof", keep, slow_ranks={6: 1.3}), tmp_path / "work")
    data = res.alert_data()
    assert data["captured_ranks"] == keep and data["world_size"] == WORLD  # a prefix is a subset too
    assert res.status == "partial" and res.suspects == [], res.detail
    assert "wait for ranks outside the capture" in res.detail and "cannot be named" in res.detail
    waited = data["waited_for"]
    assert waited["named"] == [] and waited["uncaptured_count"] == WORLD - len(keep)
    assert waited["wait_pct_of_step"] > 15  # 30 % more compute on rank 6: the others wait ~22 % of their step


def test_the_one_uncaptured_rank_is_named(tmp_path: Path) -> None:
    keep = [0, 1, 2, 3, 4, 5, 7]
    res = _analyze(_targeted(tmp_path / "prof", keep, slow_ranks={6: 1.3}), tmp_path / "work")
    assert res.status == "partial" and res.alert_data()["waited_for"]["named"] == [6]
    assert "rank 6, the only rank not captured" in res.detail


def test_a_captured_slow_rank_is_named_and_no_outside_wait_is_claimed(tmp_path: Path) -> None:
    res = _analyze(_targeted(tmp_path / "prof", [0, 1, 2, 3], slow_ranks={2: 1.3}), tmp_path / "work")
    assert res.status == "ok" and res.suspects[0].rank == 2 and res.waited_for is None, res.detail


def test_a_balanced_subset_is_no_suspect_among_the_captured_ranks(tmp_path: Path) -> None:
    res = _analyze(_targeted(tmp_path / "prof", [0, 1, 2, 3]), tmp_path / "work")
    assert res.status == "no_suspect" and res.waited_for is None, res.detail
    assert "targeted capture" in res.detail and res.captured_ranks == [0, 1, 2, 3]
