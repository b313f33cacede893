"""profwatch's first verdict (each rank's own tables) against the msprof-analyze-based one, on generated batches of
every family ``profwatch simulate tree`` makes, 8 to 1,024 ranks, with the real msprof-analyze 26.2.0.

Two checks per batch: the own rows equal msprof-analyze's ``ClusterTimeSummary`` rows (same (rank, step) keys,
every figure within 1e-3 µs + 1e-6 relative), and the verdict judged on them names the same suspects (same top
one, same kinds) as the verdict on msprof-analyze's rows and slow_rank votes, figures within 2 %
(``compare_verdicts``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from profwatch.adapters.fs import staging
from profwatch.adapters.fs.rank_dir_fs import scan_tree
from profwatch.adapters.tools.msprof_analysis import prepare_msprof, run_phase
from profwatch.adapters.tools.msprof_runner import MsprofRunner
from profwatch.adapters.tools.own_tables_reader import read_batch_tables
from profwatch.core.verdict.agreement import compare_verdicts
from profwatch.core.verdict.evidence import ClusterEvidence, RankStepSummary
from profwatch.core.verdict.own_tables import combine_rank_tables
from profwatch.core.verdict.ranking import judge_batch
from profwatch.core.verdict.settings import AnalysisSettings
from profwatch.simulate.ascend_tree import generate_cluster

FIGURES = ("step_time_us", "computation_us", "communication_us", "wait_us", "transmit_us", "free_us")


def _families(n: int) -> dict[str, dict[str, Any]]:
    a, b = n // 2 + 1, n // 4
    return {
        "slow_rank": {"slow_ranks": {a: 1.3}},
        "two_slow": {"slow_ranks": {a: 1.5, b: 1.3}},
        "host_bound": {"host_bound_ranks": {a: 0.3}},
        "slow_link_rank": {"slow_link_ranks": {a: 3.0}},
        "slow_link_pair": {"slow_links": {(b, a): 3.0}},
        "job_wide_compute": {"slow_ranks": dict.fromkeys(range(n), 1.2)},
        "job_wide_communication": {"slow_link_ranks": dict.fromkeys(range(n), 3.0)},
        "job_wide_host": {"host_bound_ranks": dict.fromkeys(range(n), 0.2)},
        "balanced": {},
        "startup_delay": {"steps": 5, "first_step_delay_ranks": {a: 0.6}},
        "throttled": {"throttled_ranks": {a: 1300.0}},
    }


CASES = [(8, fam) for fam in _families(8)] + [(32, "slow_rank"), (32, "host_bound"), (32, "two_slow"),
                                              (128, "slow_rank"), (256, "slow_rank"), (256, "job_wide_compute"),
                                              (1024, "slow_rank")]


def _assert_rows_equal(own: list[RankStepSummary], tool: list[RankStepSummary]) -> None:
    a, b = {(r.rank, r.step): r for r in own}, {(r.rank, r.step): r for r in tool}
    assert set(a) == set(b), sorted(set(a) ^ set(b))[:10]
    for key, row in b.items():
        for f in FIGURES:
            x, y = getattr(a[key], f), getattr(row, f)
            assert abs(x - y) <= 1e-3 + 1e-6 * abs(y), (key, f, x, y)


@pytest.mark.slow
@pytest.mark.parametrize(("world", "family"), CASES, ids=[f"{f}-{n}" for n, f in CASES])
def test_first_verdict_agrees_with_msprof_analyze(tmp_path: Path, world: int, family: str) -> None:
    spec = {"world_size": world, "seed": 11, "minimal": world > 32, **_families(world)[family]}
    generate_cluster(tmp_path / "prof", capture_id=f"agree-{family}", **spec)
    (batch,) = scan_tree(tmp_path / "prof", world_size=world)
    tables, _ = read_batch_tables(batch.rank_dirs)
    own = combine_rank_tables(tables)
    first = judge_batch(ClusterEvidence(kind="ascend_pt", summaries=own.summaries,
                                                 collectives_per_step=own.collectives_per_step), world_size=world)

    settings = AnalysisSettings()
    settings.msprof.advisor = False
    settings.msprof.max_concurrent_runs = 2
    settings.msprof.timeout_s = 600
    runner = MsprofRunner(settings.msprof)
    try:
        staged = staging.stage_batch(batch, tmp_path / "staging")
        ev, session = prepare_msprof(staged, tmp_path / "msprof", runner=runner, world_size=world,
                                     owner=batch.batch_id, expected_ranks=sorted(batch.ranks))
        run_phase(session, ev, "alert", runner=runner)
    finally:
        runner.close()
    assert ev.recipes["cluster_time_summary"].status == "ok", ev.recipes["cluster_time_summary"]
    confirmed = judge_batch(ev, world_size=world)

    _assert_rows_equal(own.summaries, ev.summaries)
    agreement = compare_verdicts(own.summaries, first.suspects, ev.summaries, confirmed.suspects)
    assert agreement.agree, agreement.to_json()
    assert [s.kind for s in first.suspects] == [s.kind for s in confirmed.suspects]
    if family in ("slow_rank", "two_slow", "host_bound", "throttled"):
        assert first.suspects, f"{family}: the first verdict names nobody"
    if family == "balanced":
        assert not first.suspects
