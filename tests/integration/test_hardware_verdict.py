"""AI Core clock in verdicts (issue 21 item 3), on generated Ascend batches read through the real scan and the first
verdict (each rank's own tables): a throttled rank is named with its clock, a whole job throttled shows only against
its reference, and a healthy batch claims no hardware cause."""

from __future__ import annotations

from pathlib import Path

from profwatch.adapters.fs.rank_dir_fs import scan_tree
from profwatch.analysis.facade import AnalysisSettings, analyze_batch
from profwatch.analysis.result import AnalysisResult
from profwatch.changes.compare import attach_comparison
from profwatch.core.verdict.msprof_plan import MsprofSettings
from profwatch.simulate.ascend_tree import generate_cluster


def _first_verdict(prof: Path, work: Path) -> AnalysisResult:
    (batch,) = scan_tree(prof)
    assert batch.status == "complete", batch.describe()
    settings = AnalysisSettings(msprof=MsprofSettings(advisor=False, communication_matrix=False, timeout_s=300))
    res = analyze_batch(batch, work_dir=work, settings=settings, armed_steps=[1, 2, 3, 4], enrich=False)
    assert res.verdict_source == "own_tables", res.notes
    return res


def test_a_throttled_rank_is_named_with_its_clock_as_a_hardware_cause(tmp_path: Path) -> None:
    generate_cluster(tmp_path / "prof", world_size=8, steps=4, seed=4, throttled_ranks={6: 1200.0})
    res = _first_verdict(tmp_path / "prof", tmp_path / "work")
    assert res.status == "ok" and res.suspects[0].rank == 6, res.detail
    (hw,) = res.alert_data()["hardware"]
    assert (hw["rank"], hw["mean_mhz"], hw["peers_mhz"]) == (6, 1200.0, 1800.0)
    assert hw["seconds_below"] > 0 and hw["seconds_below"] == hw["window_s"]  # the whole window
    assert "rank 6's AI Core ran at 1200 MHz against its peers' 1800 MHz (hardware)" in res.detail
    assert any("a hardware cause" in n for n in res.notes)


def test_a_healthy_batch_claims_no_hardware_cause_and_a_throttled_job_shows_against_its_reference(
        tmp_path: Path) -> None:
    generate_cluster(tmp_path / "ref", world_size=4, steps=4, seed=2)
    generate_cluster(tmp_path / "now", world_size=4, steps=4, seed=2, throttled_ranks={r: 1500.0 for r in range(4)})
    ref = _first_verdict(tmp_path / "ref", tmp_path / "w1")
    now = _first_verdict(tmp_path / "now", tmp_path / "w2")
    assert ref.hardware == [] and now.hardware == []  # every rank at one clock: nobody below their peers
    attach_comparison(now, ref, reference_path=str(tmp_path / "ref"))
    assert now.comparison is not None
    changes = now.comparison["changes"]
    assert changes[0]["component"] == "compute"  # the timed change leads: 1800/1500 x the 60 ms of compute
    assert abs(changes[0]["delta_s_per_step"] - 0.2 * 0.06) <= 0.15 * 0.012, changes[0]
    (hw,) = [c for c in changes if c["component"] == "hardware"]
    assert hw["delta_s_per_step"] is None and "ranks 0, 1, 2, 3: 1800 -> 1500 MHz (reference -> now" in hw["detail"]
    assert now.comparison["headline"].count("since the reference") == 1
    assert "1800 -> 1500 MHz" in now.comparison["headline"]
    attach_comparison(ref, ref, reference_path=str(tmp_path / "ref"))
    assert ref.comparison is not None and ref.comparison["changes"] == []


def test_a_note_added_after_the_alert_phase_survives_the_enrich_phase(tmp_path: Path) -> None:
    """The enrich phase judges again and rebuilds the notes: a comparison that could not be made (noted after the
    first verdict) must still be said in the enriched verdict."""
    from profwatch.adapters.tools.msprof_runner import MsprofRunner
    from profwatch.analysis.facade import enrich_analysis

    generate_cluster(tmp_path / "prof", world_size=4, steps=3, seed=1, slow_ranks={2: 1.5})
    (batch,) = scan_tree(tmp_path / "prof")
    settings = AnalysisSettings(msprof=MsprofSettings(advisor=False, communication_matrix=False, timeout_s=300))
    runner = MsprofRunner(settings.msprof)
    try:
        res = analyze_batch(batch, work_dir=tmp_path / "work", settings=settings, runner=runner, enrich=False)
        assert res.pending, res.recipes
        attach_comparison(res, AnalysisResult(status="failed", batch_id="ref", kind="ascend_pt"), reference_path="/refs/x")
        note = next(n for n in res.notes if n.startswith("no comparison with the reference /refs/x"))
        enrich_analysis(res, runner=runner)
    finally:
        runner.close()
    assert res.enriched and res.suspects and res.suspects[0].rank == 2
    assert note in res.notes and res.notes.count(note) == 1
