"""The real msprof-analyze 26.2.0 on generated trees: statuses, slow-rank votes, time summaries, advisor."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from profwatch.adapters.tools.msprof_analysis import run_msprof_analysis
from profwatch.adapters.tools.msprof_runner import MsprofRunner, MsprofSettings, resolve_command
from profwatch.core.verdict.evidence import ClusterEvidence
from profwatch.simulate import ascend_tree as at

pytestmark = pytest.mark.skipif(shutil.which(resolve_command(MsprofSettings().command)) is None,
                                reason="msprof-analyze is not installed (pip install -e '.[test]')")

FAST = MsprofSettings(advisor=False, timeout_s=120)


def _analyze(tmp: Path, dirs: list[Path], world_size: int, settings: MsprofSettings = FAST) -> ClusterEvidence:
    with MsprofRunner(settings) as runner:
        return run_msprof_analysis(dirs[0].parent, tmp / "out", runner=runner, world_size=world_size)


@pytest.fixture(scope="module")
def slow4(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Path], ClusterEvidence]:
    """4 ranks, rank 2 computes 1.5x: the shared tarball's scenario, with advisor."""
    tmp = tmp_path_factory.mktemp("slow4")
    dirs = at.generate_cluster(tmp / "batch", world_size=4, slow_ranks={2: 1.5})
    return dirs, _analyze(tmp, dirs, 4, MsprofSettings(advisor=True, advisor_html=True, timeout_s=180))


@pytest.mark.slow
def test_slow_rank_named_in_4(slow4: tuple[list[Path], ClusterEvidence]) -> None:
    dirs, ev = slow4
    assert {k: v.status for k, v in ev.recipes.items()} == {
        "cluster_time_summary": "ok", "slow_rank": "ok", "communication_matrix": "ok", "advisor": "ok",
        "advisor_html": "ok"}
    assert {(int(r["src_rank"]), int(r["dst_rank"])) for r in ev.link_rows} >= {(0, 1), (3, 2)}
    assert ev.collectives_per_step == 4
    assert max(ev.slow_rank_votes, key=ev.slow_rank_votes.__getitem__) == 2
    assert ev.slow_rank_votes[2] >= 10  # 3 steps x 4 collectives
    assert ev.slow_ops and all(op["slow_ranks"] == [2] for op in ev.slow_ops)
    assert len(ev.summaries) == 12 and {s.step for s in ev.summaries} == {1, 2, 3}
    for s in ev.summaries:
        if s.rank == 2:
            assert s.wait_us < 50 and s.computation_us > 85_000
        else:
            assert s.wait_us > 20_000
    assert ev.rank_paths == {r: str(d) for r, d in enumerate(dirs)}
    assert ev.versions["msprof_analyze"] == "26.2.0" and ev.versions["torch_npu"] == at.TORCH_NPU_VERSION


@pytest.mark.slow
def test_advisor_finds_slow_rank_with_fresh_output_dirs(slow4: tuple[list[Path], ClusterEvidence]) -> None:
    _dirs, ev = slow4
    assert any(p["category"] == "slow rank" for p in ev.advisor["problems"])
    assert ev.advisor["max_compute_rank"] == 2
    assert any("Rank2" in title for title in ev.advisor["comparisons"])
    outs = [Path(r.output_dir) for r in ev.recipes.values() if r.output_dir]
    assert len(set(outs)) == 5  # a fresh -o per command, so each advisor run did its own cluster pass
    for out in outs:
        assert (out / "cluster_analysis_output" / "cluster_analysis.db").is_file()
    html_dir = Path(ev.recipes["advisor_html"].output_dir)
    assert list(html_dir.glob("mstt_advisor_*.html")), "advisor's HTML is kept for people"
    assert ev.recipes["advisor"].rows >= 1


def test_slow_rank_named_in_8(tmp_path: Path) -> None:
    dirs = at.generate_cluster(tmp_path / "batch", world_size=8, slow_ranks={5: 1.4}, seed=3)
    ev = _analyze(tmp_path, dirs, 8)
    assert ev.recipes["slow_rank"].status == "ok"
    assert max(ev.slow_rank_votes, key=ev.slow_rank_votes.__getitem__) == 5
    waits = {s.rank: s.wait_us for s in ev.summaries if s.step == 2}
    assert min(waits, key=waits.__getitem__) == 5 and waits[5] < 50


def test_balanced_cluster_has_no_votes(tmp_path: Path) -> None:
    dirs = at.generate_cluster(tmp_path / "batch", world_size=4)
    ev = _analyze(tmp_path, dirs, 4)
    assert ev.recipes["slow_rank"].status == "ok" and "no slow rank" in ev.recipes["slow_rank"].detail
    assert ev.slow_rank_votes == {} and ev.slow_ops == []
    assert ev.recipes["cluster_time_summary"].status == "ok" and len(ev.summaries) == 12


def test_three_ranks_slow_rank_not_applicable(tmp_path: Path) -> None:
    dirs = at.generate_cluster(tmp_path / "batch", world_size=3, slow_ranks={1: 1.5})
    ev = _analyze(tmp_path, dirs, 3)
    assert ev.recipes["slow_rank"].status == "not_applicable" and "4" in ev.recipes["slow_rank"].detail
    assert ev.recipes["cluster_time_summary"].status == "ok"
    assert min(ev.summaries, key=lambda s: s.wait_us).rank == 1


def test_level0_has_no_communication(tmp_path: Path) -> None:
    dirs = at.generate_cluster(tmp_path / "batch", world_size=4, level="Level0")
    ev = _analyze(tmp_path, dirs, 4)
    for name in ("cluster_time_summary", "slow_rank"):
        assert ev.recipes[name].status == "not_applicable"
        assert "no communication" in ev.recipes[name].detail and "Level0" in ev.recipes[name].detail


def test_no_memcpy_is_not_applicable(tmp_path: Path) -> None:
    dirs = at.generate_cluster(tmp_path / "batch", world_size=3)
    for d in dirs:
        at.remove_memcpy_tasks(d)
    ev = _analyze(tmp_path, dirs, 3)
    assert ev.recipes["cluster_time_summary"].status == "not_applicable"
    assert "MEMCPY_ASYNC" in ev.recipes["cluster_time_summary"].detail


def test_text_only_export_is_not_an_empty_success(tmp_path: Path) -> None:
    dirs = at.generate_cluster(tmp_path / "batch", world_size=4, export_type="text")
    ev = _analyze(tmp_path, dirs, 4)
    for name in ("cluster_time_summary", "slow_rank"):
        assert ev.recipes[name].status == "no_data" and "text" in ev.recipes[name].detail
    assert ev.summaries == [] and ev.slow_rank_votes == {}
    # what the tool itself says on this input: "success" with an empty message, rc 0 (docs/msprof-analyze.md#exit-codes)
    with MsprofRunner(FAST) as runner:
        run = runner.run("cluster_time_summary", ["-m", "cluster_time_summary", "-d", str(dirs[0].parent),
                                                  "--agent", "--force"], tmp_path / "raw")
    assert run.returncode == 0 and run.agent.status == "success" and run.agent.message == {}
    assert "only supports DB" in run.log_text()


def test_truncated_db_and_missing_step_time_are_not_ok(tmp_path: Path) -> None:
    dirs = at.generate_cluster(tmp_path / "batch", world_size=4, slow_ranks={2: 1.5})
    at.truncate_db(dirs[1])
    at.drop_step_time(dirs[3])
    ev = _analyze(tmp_path, dirs, 4)
    cts = ev.recipes["cluster_time_summary"]
    assert cts.status == "no_data" and "incomplete" in cts.detail and cts.log_tail
    assert "step -1" in cts.detail
    assert any("ranks [1]" in n for n in ev.notes)
    assert ev.recipes["slow_rank"].status != "tool_error"
    assert all(s.step != -1 for s in ev.summaries)


def test_timeout_and_spawn_failure(tmp_path: Path) -> None:
    dirs = at.generate_cluster(tmp_path / "batch", world_size=4, minimal=True)
    ev = _analyze(tmp_path, dirs, 4, MsprofSettings(advisor=False, timeout_s=0.3, retries=1))
    ran = {k: r for k, r in ev.recipes.items() if k != "advisor"}
    assert {r.status for r in ran.values()} == {"timeout"}
    assert all("2 attempt" in r.detail for r in ran.values())
    bad = MsprofSettings(command=str(tmp_path / "no-such-msprof"), advisor=True, retries=1)
    ev = _analyze(tmp_path / "second", dirs, 4, bad)
    assert {r.status for r in ev.recipes.values()} == {"tool_error"}
    assert all("cannot start" in r.detail for r in ev.recipes.values())
