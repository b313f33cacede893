"""The first Ascend verdict is judged on the ranks' own tables; msprof-analyze confirms it in the enrich phase and the
enriched verdict states whether the tools agree (analysis/facade.py; docs/msprof-analyze.md#own-tables)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from profwatch.adapters.fs.rank_dir_fs import scan_tree
from profwatch.adapters.tools.msprof_runner import MsprofRunner
from profwatch.adapters.tools.own_tables_reader import TablePrefetcher, read_batch_tables
from profwatch.analysis.facade import AnalysisSettings, analyze_batch, enrich_analysis
from profwatch.core.verdict.own_tables import combine_rank_tables
from profwatch.simulate.ascend_tree import drop_table, generate_cluster
from tests.conftest import wait_for


def _settings() -> AnalysisSettings:
    s = AnalysisSettings()
    s.msprof.advisor = False
    s.msprof.max_concurrent_runs = 2
    s.msprof.timeout_s = 300
    return s


def _batch(root: Path, **kw: object):  # type: ignore[no-untyped-def]
    dirs = generate_cluster(root / "prof", world_size=8, capture_id="first", seed=3, **kw)  # type: ignore[arg-type]
    (batch,) = scan_tree(root / "prof", world_size=8)
    return batch, dirs


@pytest.mark.slow
def test_first_verdict_then_confirmed_and_agreement_stated(tmp_path: Path) -> None:
    batch, _ = _batch(tmp_path, slow_ranks={5: 1.3})
    settings = _settings()
    runner = MsprofRunner(settings.msprof)
    try:
        res = analyze_batch(batch, work_dir=tmp_path / "w", settings=settings, runner=runner, enrich=False)
        assert res.verdict_source == "own_tables" and set(res.recipes) == {"own_tables"}
        assert res.recipes["own_tables"].status == "ok" and [s.rank for s in res.suspects] == [5]
        assert res.status == "ok" and res.pending[:2] == ["cluster_time_summary", "slow_rank"]
        first = res.alert_data()
        assert first["agreement"] is None and any("first verdict" in n for n in first["notes"])
        enrich_analysis(res, runner=runner)
    finally:
        runner.close()
    assert res.verdict_source == "msprof-analyze" and res.recipes["cluster_time_summary"].status == "ok"
    assert res.agreement is not None and res.agreement["agree"] is True, res.agreement
    assert [s.rank for s in res.suspects] == [5]
    report = json.loads(Path(res.paths["report_json"]).read_text())
    assert report["agreement"]["agree"] is True and report["verdict_source"] == "msprof-analyze"
    assert any("confirms the first verdict" in n for n in report["notes"])


@pytest.mark.slow
def test_a_disagreement_is_stated_in_the_alert_and_the_report(tmp_path: Path) -> None:
    batch, _ = _batch(tmp_path, slow_ranks={5: 1.3})
    settings = _settings()
    runner = MsprofRunner(settings.msprof)
    try:
        res = analyze_batch(batch, work_dir=tmp_path / "w", settings=settings, runner=runner, enrich=False)
        assert [s.rank for s in res.suspects] == [5]
        # between the two reads, rank 2's StepTraceTime changes: msprof-analyze sees another computation
        db = Path(batch.rank_dirs[2]) / "ASCEND_PROFILER_OUTPUT" / "analysis.db"
        db.chmod(0o640)
        con = sqlite3.connect(db)
        con.execute("UPDATE StepTraceTime SET computing = computing * 1.5")
        con.commit()
        con.close()
        enrich_analysis(res, runner=runner)
    finally:
        runner.close()
    assert res.agreement is not None and res.agreement["agree"] is False
    assert any("rank 2 own work" in d for d in res.agreement["differences"]), res.agreement
    data = res.alert_data()
    assert "msprof-analyze disagrees with the first verdict" in data["detail"]
    assert any("disagrees" in n for n in data["notes"])
    report = json.loads(Path(res.paths["report_json"]).read_text())
    assert report["agreement"]["agree"] is False and "disagrees" in report["detail"]


def test_damaged_tables_leave_the_first_verdict_to_msprof_analyze(tmp_path: Path) -> None:
    batch, dirs = _batch(tmp_path, slow_ranks={5: 1.3})
    drop_table(dirs[3], "StepTraceTime", which="analysis")
    res = analyze_batch(batch, work_dir=tmp_path / "w", settings=_settings(), enrich=False)
    assert res.verdict_source == "msprof-analyze"
    assert "cluster_time_summary" in res.recipes and "own_tables" not in res.recipes


def test_prefetched_tables_are_used_unless_their_db_changed(tmp_path: Path) -> None:
    batch, dirs = _batch(tmp_path, slow_ranks={5: 1.3})
    fetcher = TablePrefetcher(workers=2)
    try:
        assert fetcher.submit("cap", batch.rank_dirs) == 8
        assert fetcher.submit("cap", batch.rank_dirs) == 0  # a rank dir is read once
        wait_for(lambda: fetcher.unfinished("cap") == 0, timeout_s=60)  # take() cancels reads still queued
        got = fetcher.take("cap")
    finally:
        fetcher.close()
    assert sorted(got) == sorted(batch.rank_dirs.values())
    fresh, _ = read_batch_tables(batch.rank_dirs)
    # rank 2's analysis.db is rewritten after the prefetch: its tables are read again, the others are reused
    db = Path(batch.rank_dirs[2]) / "ASCEND_PROFILER_OUTPUT" / "analysis.db"
    db.chmod(0o640)
    con = sqlite3.connect(db)
    con.execute("UPDATE StepTraceTime SET computing = computing + 1000")
    con.commit()
    con.close()
    used, _ = read_batch_tables(batch.rank_dirs, prefetched=got)
    assert used[2].trace[1].computing_us == pytest.approx(fresh[2].trace[1].computing_us + 1000)
    assert all(used[r] is got[batch.rank_dirs[r]][1] for r in batch.rank_dirs if r != 2)
    assert combine_rank_tables(used).summaries != combine_rank_tables(fresh).summaries


@pytest.mark.slow
def test_the_drill_down_follows_the_final_ranking_not_the_first_verdict(tmp_path: Path) -> None:
    """The drill-down (suspect_compare) compares the suspects of the verdict the enrich phase publishes, not those
    of the first verdict: between the two reads rank 2's StepTraceTime computing grows 1.5x and rank 5's shrinks
    to its peers', so msprof-analyze names rank 2 (first) where the first verdict named rank 5 only. Before: the
    drill-down compared rank 5 alone."""
    batch, _ = _batch(tmp_path, slow_ranks={5: 1.3})
    settings = _settings()
    settings.msprof.communication_matrix = False
    runner = MsprofRunner(settings.msprof)
    try:
        res = analyze_batch(batch, work_dir=tmp_path / "w", settings=settings, runner=runner, enrich=False)
        assert [s.rank for s in res.suspects] == [5] and "suspect_compare" in res.pending
        for rank, factor in ((2, 1.5), (5, 1 / 1.3)):
            db = Path(batch.rank_dirs[rank]) / "ASCEND_PROFILER_OUTPUT" / "analysis.db"
            db.chmod(0o640)
            con = sqlite3.connect(db)
            con.execute("UPDATE StepTraceTime SET computing = computing * ?", (factor,))
            con.commit()
            con.close()
        enrich_analysis(res, runner=runner)
    finally:
        runner.close()
    final = [s.rank for s in res.suspects]
    assert res.agreement is not None and res.agreement["agree"] is False and 2 in final, (final, res.agreement)
    assert res.recipes["suspect_compare"].status == "ok", res.recipes["suspect_compare"]
    assert [c["rank"] for c in res.op_compare] == final[:3]
    report = json.loads(Path(res.paths["report_json"]).read_text())
    assert [c["rank"] for c in report["op_compare"]] == final[:3]
