"""torch.profiler traces parsed as each rank dir finishes (kineto_reader.TracePrefetcher): the first verdict is the
same as when every trace is parsed at completion (generated traces and a real gloo job's), a prefetched trace is
used only while its file is unchanged, and the coordinator's analyser parses each rank once, as its scan sees it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from profwatch.adapters.fs.rank_dir_fs import scan_tree
from profwatch.adapters.tools.kineto_reader import TracePrefetcher, find_trace_files
from profwatch.analysis.facade import AnalysisResult, analyze_batch
from tests.conftest import wait_for
from tests.integration.test_analyze import _settings, _torch_batch, gloo_batch  # noqa: F401 (module fixture)


def _verdict(res: AnalysisResult) -> dict[str, Any]:
    """Everything the verdict says, without the clocks."""
    out = res.to_json()
    out.pop("timings_s", None)
    for detail in out.get("recipe_details", {}).values():
        detail.pop("duration_s", None)
    return out


def _both_ways(prof: Path, work: Path, world: int) -> tuple[AnalysisResult, AnalysisResult, int]:
    """The verdict with every trace parsed at completion, then with each parsed ahead (as the coordinator does)."""
    (batch,) = scan_tree(prof, world_size=world)
    assert batch.status == "complete" and batch.kind == "torch_pt"
    cold = analyze_batch(batch, work_dir=work, settings=_settings(), armed_steps=None)
    fetcher = TracePrefetcher(workers=2)
    try:
        for rank, path in batch.rank_dirs.items():  # one at a time, as the ranks' markers land
            assert fetcher.submit("cap", {rank: path}) == 1
        assert fetcher.submit("cap", batch.rank_dirs) == 0  # once per rank
        wait_for(lambda: fetcher.unfinished("cap") == 0, timeout_s=60)
        ahead = fetcher.take("cap")
    finally:
        fetcher.close()
    warm = analyze_batch(batch, work_dir=work, settings=_settings(), prefetched_traces=ahead)
    return cold, warm, len(ahead)


def test_generated_traces_give_the_same_verdict_parsed_ahead(tmp_path: Path) -> None:
    _torch_batch(tmp_path / "prof", work={2: 1.4})
    cold, warm, n = _both_ways(tmp_path / "prof", tmp_path / "work", 4)
    assert n == 4 and cold.status == "ok" and cold.suspects[0].rank == 2
    assert _verdict(warm) == _verdict(cold)


@pytest.mark.slow
def test_real_gloo_traces_give_the_same_verdict_parsed_ahead(gloo_batch: Path, tmp_path: Path) -> None:  # noqa: F811
    cold, warm, n = _both_ways(gloo_batch, tmp_path / "work", 4)
    assert n == 4 and cold.status == "ok" and cold.suspects[0].rank == 2
    assert _verdict(warm) == _verdict(cold)


def test_a_prefetched_trace_is_used_only_while_its_file_is_unchanged(tmp_path: Path) -> None:
    dirs = _torch_batch(tmp_path / "prof", work={1: 1.3})
    (batch,) = scan_tree(tmp_path / "prof", world_size=4)
    fetcher = TracePrefetcher(workers=2)
    fetcher.submit("cap", batch.rank_dirs)
    wait_for(lambda: fetcher.unfinished("cap") == 0, timeout_s=60)
    ahead = fetcher.take("cap")
    fetcher.close()
    assert len(ahead) == 4
    # rank 3's trace is overwritten with garbage of the same size and mtime: the read made ahead is still used
    (trace,) = find_trace_files(dirs[3])
    st = trace.stat()
    trace.write_bytes(b" " * st.st_size)
    os.utime(trace, ns=(st.st_atime_ns, st.st_mtime_ns))
    used = analyze_batch(batch, work_dir=tmp_path / "w1", settings=_settings(), prefetched_traces=ahead)
    assert used.status == "ok" and not used.unjudged_ranks and used.suspects[0].rank == 1
    # once its mtime moves (a rewrite), the analysis parses the file itself, and finds it broken
    os.utime(trace, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    fresh = analyze_batch(batch, work_dir=tmp_path / "w2", settings=_settings(), prefetched_traces=ahead)
    assert fresh.status == "partial" and "cannot be parsed" in fresh.unjudged_ranks[3]


def test_the_analyser_parses_each_finished_rank_once_as_its_scan_sees_it(tmp_path: Path) -> None:
    from profwatch.captures.ports import BatchAnalyser

    _torch_batch(tmp_path / "prof", work={0: 1.3})
    (batch,) = scan_tree(tmp_path / "prof", world_size=4)
    analyser = BatchAnalyser(_settings())
    try:
        analyser.prefetch("cap-torch", batch)
        analyser.prefetch("cap-torch", batch)  # a second scan of the same ranks
        assert analyser.traces.submit("cap-torch", batch.rank_dirs) == 0  # each rank queued once
        status, data = analyser.analyse(batch, work_dir=tmp_path / "w", hostnames={}, context={"capture_id":
                                        "cap-torch"}, job_id="j", capture_reason="test")
        assert status == "ok" and data["suspects"][0]["rank"] == 0
        assert analyser.traces.take("cap-torch") == {}  # handed to the analysis
    finally:
        analyser.close()
