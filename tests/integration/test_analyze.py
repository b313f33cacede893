"""analyze_batch and ``profwatch analyze`` end to end: generated Ascend trees + the real msprof-analyze 26.2.0, and
real torch.profiler traces from a CPU gloo job.

Each scenario is generated and analysed once per module (msprof-analyze runs take 2.5-9 s each).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from profwatch.adapters.fs.rank_dir_fs import scan_tree
from profwatch.analysis.facade import AnalysisResult, AnalysisSettings, analyze_batch
from profwatch.commands.analyze import analyze
from profwatch.core.alerts.alertmanager import AlertBook
from profwatch.core.alerts.events import TYPE_SUSPECT_RANKS, make_cloudevent
from profwatch.simulate.ascend_tree import empty_device_data, generate_cluster, truncate_db
from tests.conftest import PYTHON, REPO_ROOT, python_env

SCENARIOS: dict[str, dict[str, Any]] = {
    "one_in_4": {"world_size": 4, "slow_ranks": {2: 1.5}},
    "one_in_8": {"world_size": 8, "slow_ranks": {5: 1.3}},
    "one_in_32": {"world_size": 32, "slow_ranks": {17: 1.2}},
    "one_in_64": {"world_size": 64, "slow_ranks": {40: 1.15}},
    "two_in_8": {"world_size": 8, "slow_ranks": {1: 1.6, 6: 1.3}},
    "balanced_8": {"world_size": 8},
    "host_bound_8": {"world_size": 8, "host_bound_ranks": {3: 0.3}},
    "world_2": {"world_size": 2, "slow_ranks": {1: 1.4}},
    "world_3": {"world_size": 3, "slow_ranks": {0: 1.4}},
    "text_only_4": {"world_size": 4, "slow_ranks": {2: 1.5}, "export_type": "text"},
    "level0_4": {"world_size": 4, "slow_ranks": {2: 1.5}, "level": "Level0"},
    "slow_link_pair_8": {"world_size": 8, "slow_links": {(2, 5): 3.0}},
    "startup_delay_8": {"world_size": 8, "steps": 5, "first_step_delay_ranks": {6: 0.6}},
}


def _settings(advisor: bool = False) -> AnalysisSettings:
    s = AnalysisSettings()
    s.msprof.advisor = advisor
    s.msprof.max_concurrent_runs = 2
    s.msprof.timeout_s = 120
    return s


@pytest.fixture(scope="module")
def run_scenario(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., AnalysisResult]:
    root = tmp_path_factory.mktemp("analyze")
    cache: dict[str, AnalysisResult] = {}

    def run(name: str, *, advisor: bool = False, damage: Callable[[list[Path]], None] | None = None,
            **kw: Any) -> AnalysisResult:
        if name not in cache:
            spec = {**SCENARIOS.get(name, {}), **kw}
            dirs = generate_cluster(root / name / "prof", capture_id=f"cap-{name}", seed=7, **spec)
            if damage:
                damage(dirs)
            batches = scan_tree(root / name / "prof", world_size=spec["world_size"])
            assert len(batches) == 1, [b.to_json() for b in batches]
            cache[name] = analyze_batch(batches[0], work_dir=root / name / "work", settings=_settings(advisor),
                                        capture_reason="test")
        return cache[name]

    return run


@pytest.mark.parametrize("name", ["one_in_4", "one_in_8", "one_in_32", "one_in_64"])
def test_one_slow_rank_is_top_suspect(run_scenario, name: str):
    res = run_scenario(name)
    slow = next(iter(SCENARIOS[name]["slow_ranks"]))
    assert res.status == "ok", res.to_json()
    assert res.suspects[0].rank == slow and res.suspects[0].kind == "compute"
    assert len(res.suspects) == 1
    assert res.recipes["cluster_time_summary"].status == "ok"
    top = res.suspects[0]
    assert top.hostname == f"node{slow // 8}" and top.rank_dir and top.rank_dir.endswith("_ascend_pt")
    assert "report.html" in (res.report or "") and Path(res.report).exists()


def test_one_in_4_slow_rank_votes_agree(run_scenario):
    res = run_scenario("one_in_4")
    assert res.evidence.slow_rank_votes.get(2, 0) > 0
    assert res.suspects[0].evidence["slow_rank_votes"] > 0


def test_two_simultaneous_slow_ranks(run_scenario):
    res = run_scenario("two_in_8")
    assert {s.rank for s in res.suspects[:2]} == {1, 6}
    assert res.suspects[0].rank == 1  # the slower one first


def test_balanced_gives_no_suspect(run_scenario):
    res = run_scenario("balanced_8")
    assert res.status == "no_suspect" and res.suspects == []
    assert res.recipes["cluster_time_summary"].status == "ok"
    data = res.alert_data()
    assert data["suspects"] == [] and len(data["ranks"]) == 8


def test_host_bound_rank(run_scenario):
    res = run_scenario("host_bound_8")
    assert res.suspects and res.suspects[0].rank == 3 and res.suspects[0].kind == "host"


@pytest.mark.parametrize("name,slow", [("world_2", 1), ("world_3", 0)])
def test_small_worlds_without_slow_rank_votes(run_scenario, name: str, slow: int):
    res = run_scenario(name)
    assert res.recipes["slow_rank"].status == "not_applicable"
    assert res.status == "ok" and res.suspects[0].rank == slow


def test_text_only_export_is_a_clear_status(run_scenario):
    res = run_scenario("text_only_4")
    assert res.status == "not_applicable" and res.suspects == []
    assert res.recipes["completeness"].status == "not_applicable" and "text-only" in res.detail


def test_level0_no_communication(run_scenario):
    res = run_scenario("level0_4")
    assert res.status == "not_applicable" and "Level1" in res.detail
    assert res.recipes["cluster_time_summary"].status == "not_applicable"


def test_truncated_db_never_crashes(run_scenario):
    res = run_scenario("truncated_4", world_size=4, slow_ranks={2: 1.5},
                      damage=lambda dirs: truncate_db(dirs[1]))
    # completeness rejects the damaged rank before msprof-analyze could silently zero-fill it (docs/field-cases.md#fc-05)
    assert res.status == "incomplete" and "damaged" in res.detail and res.suspects == []
    json.dumps(res.to_json(), default=str)


def test_incomplete_batch_not_analysed(tmp_path: Path):
    dirs = generate_cluster(tmp_path / "prof", world_size=4, capture_id="cap-x")
    import shutil

    shutil.rmtree(dirs[3])
    batches = scan_tree(tmp_path / "prof", world_size=4)
    res = analyze_batch(batches[0], work_dir=tmp_path / "w", settings=_settings())
    assert res.status == "incomplete" and list(res.recipes) == ["completeness"] and "[3]" in res.detail


@pytest.mark.slow
def test_slow_link_via_advisor(run_scenario):
    res = run_scenario("slow_link_8", advisor=True, world_size=8, slow_link_ranks={3: 3.0})
    assert res.recipes["advisor"].status == "ok"
    assert res.suspects and res.suspects[0].rank == 3 and res.suspects[0].kind == "communication"


def test_alert_payload_from_result(run_scenario):
    res = run_scenario("one_in_8")
    ev = make_cloudevent(res.event_type, "job", res.alert_data(), source="//t", now_unix_s=1.7e9)
    assert ev["type"] == TYPE_SUSPECT_RANKS
    am = AlertBook(cluster="c", resend_interval_s=60).apply(ev, 1.7e9)
    assert am[0]["labels"]["rank"] == "5" and ev["data"]["judged_ranks"] == list(range(8))
    j = res.to_json()
    assert set(j) >= {"status", "batch_id", "kind", "suspects", "recipes", "report"}
    assert j["recipes"]["cluster_time_summary"] == "ok"
    assert set(j["suspects"][0]) == {"rank", "score", "kind", "hostname", "evidence", "rank_dir", "impact"}
    assert set(j["suspects"][0]["impact"]) == {"saving_s_per_step", "saving_pct_of_step", "accelerator_hours_per_day"}
    assert j["suspects"][0]["evidence"]["strength"] == "strong" and j["impact"] == j["suspects"][0]["impact"]
    assert j["links"] == [] and j["captured_steps"] == [1, 2, 3] and j["armed_steps"] is None
    data = res.alert_data()
    assert data["impact"] == j["impact"] and data["strength"] == "strong" and data["unjudged_ranks"] == []


def test_slow_link_is_one_link_not_two_ranks(run_scenario):
    """issue 11 item 9, with the real communication_matrix_sum on a generated tree."""
    res = run_scenario("slow_link_pair_8")
    assert res.recipes["communication_matrix"].status == "ok", res.recipes["communication_matrix"].detail
    assert res.suspects == [] and [lk.ranks for lk in res.links] == [(2, 5)]
    link = res.to_json()["links"][0]
    assert link["bandwidth_ratio"] == pytest.approx(1 / 3, rel=0.1) and link["group"]
    # the whole group's collectives wait 4 x 2 ms more per step
    assert link["impact"]["saving_s_per_step"] == pytest.approx(0.008, rel=0.15)
    assert res.status == "ok" and "link 2<->5" in res.detail


def test_startup_delay_on_one_rank_is_not_a_suspect(run_scenario):
    """issue 11 item 4: a one-off delay on the first recorded step of one rank."""
    res = run_scenario("startup_delay_8")
    assert res.status == "no_suspect" and res.suspects == [], res.detail
    assert res.captured_steps == [1, 2, 3, 4, 5]


def test_rank_without_device_data_is_partial_and_named(run_scenario, tmp_path: Path):
    """issue 11 item 5a: analyse.done but empty TASK / COMPUTE_TASK_INFO and an empty device_0."""
    res = run_scenario("no_device_data_4", world_size=4, slow_ranks={2: 1.5},
                       damage=lambda dirs: empty_device_data(dirs[1]))
    assert res.status == "partial" and set(res.unjudged_ranks) == {1}, res.detail
    assert "no usable device data" in res.unjudged_ranks[1] and "rank 1" in res.detail
    assert [s.rank for s in res.suspects] == [2]  # judged among the others
    data = res.alert_data()
    assert data["unjudged_ranks"][0]["rank"] == 1 and data["status"] == "partial"


def test_cli_exit_status_for_a_partial_batch(tmp_path: Path):
    dirs = generate_cluster(tmp_path / "prof", world_size=4, slow_ranks={2: 1.6}, capture_id="cap-part")
    empty_device_data(dirs[3], device_dir=False)
    batches = scan_tree(tmp_path / "prof", world_size=4)
    assert batches[0].status != "complete" and batches[0].judgeable()
    out = CliRunner().invoke(analyze, [str(tmp_path / "prof"), "--world-size", "4", "--json", "--no-advisor",
                                       "--out", str(tmp_path / "work")])
    assert out.exit_code == 1, out.output
    doc = json.loads(out.output.strip().splitlines()[-1])
    assert doc["status"] == "partial" and doc["unjudged_ranks"][0]["rank"] == 3


def test_cli_analyze_json(tmp_path: Path):
    generate_cluster(tmp_path / "prof", world_size=4, slow_ranks={1: 1.6}, capture_id="cap-cli")
    out = CliRunner().invoke(analyze, [str(tmp_path / "prof"), "--world-size", "4", "--json", "--no-advisor",
                                       "--out", str(tmp_path / "work")])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout.strip().splitlines()[-1])
    assert doc["status"] == "ok" and doc["suspects"][0]["rank"] == 1 and doc["batch_id"] == "cap-cli"
    # per-recipe progress on stderr (plain lines off a terminal): the verdict before the follow-up's recipes
    said = [line.split("] ")[0] for line in out.stderr.splitlines() if line.startswith("analyze: cap-cli: ")]
    assert any("cluster_time_summary ok in" in s for s in said) and any("slow_rank ok in" in s for s in said), said
    verdict = next(i for i, s in enumerate(said) if "verdict ok" in s)
    assert verdict < next(i for i, s in enumerate(said) if "communication_matrix started" in s)
    assert verdict < next(i for i, s in enumerate(said) if "follow-up done" in s)
    assert doc["recipe_details"]["communication_matrix"]["phase"] == "enrich"
    assert not any("analyze:" in line for line in out.stdout.splitlines())
    human = CliRunner().invoke(analyze, [str(tmp_path / "prof"), "--no-advisor", "--out", str(tmp_path / "w2")])
    assert human.exit_code == 0 and "rank 1" in human.output
    empty = CliRunner().invoke(analyze, [str(tmp_path / "work" / "results"), "--json"])
    assert empty.exit_code == 2 and json.loads(empty.output)["status"] == "no_batch"


@pytest.fixture(scope="module")
def gloo_batch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("gloo")
    proc = subprocess.run([PYTHON, str(REPO_ROOT / "tests" / "integration" / "gloo_job.py"), str(out),
                           "--world-size", "4", "--slow-rank", "2", "--extra-ms", "40", "--steps", "4"],
                          env=python_env(), capture_output=True, text=True, timeout=240, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


@pytest.mark.slow
def test_real_torch_gloo_traces(gloo_batch: Path, tmp_path: Path):
    batches = scan_tree(gloo_batch, world_size=4)
    assert len(batches) == 1 and batches[0].status == "complete" and batches[0].kind == "torch_pt"
    res = analyze_batch(batches[0], work_dir=tmp_path, settings=_settings())
    assert res.recipes["kineto_breakdown"].status == "ok", res.to_json()
    assert res.status == "ok" and res.suspects[0].rank == 2 and res.suspects[0].kind == "compute"
    assert len({s.step for s in res.evidence.summaries}) == 4
    assert Path(res.report).exists()
    # steps paired by time: the clock offsets (same host, so truly 0) come out within a few ms from collective ends
    al = res.evidence.alignment
    assert al["method"] == "collective_ends" and all(abs(v) < 5_000 for v in al["offsets_us"].values()), al
    assert res.suspects[0].impact["saving_s_per_step"] > 0.02  # 40 ms of extra compute per step on rank 2
    # every figure reconciles (docs/report.md): DDP's concurrent gloo buckets once summed waits past the step
    from profwatch.core.verdict.figures import figure_violations
    from profwatch.core.verdict.report_view import build_view

    data = res.alert_data()
    view = build_view(data, res.evidence.summaries)
    assert figure_violations(res.evidence.summaries, view.ranks, data["suspects"]) == []
    assert not [n for n in view.notes if n.startswith("figure check")]


def _torch_batch(root: Path, *, work: dict[int, float], steps: int = 3) -> dict[int, Path]:
    from profwatch.adapters.tools.kineto_reader import write_torch_trace
    from tests.unit.test_kineto_align import job_events

    events = job_events(4, work=work, steps=steps)
    dirs = {}
    for r in range(4):
        d = root / f"node0_{4000 + r}_20260101120000{r:03d}_torch_pt"
        d.mkdir(parents=True)
        (d / f"profiler_info_{r}.json").write_text(json.dumps({"rank_id": r, "world_size": 4}))
        (d / "profiler_metadata.json").write_text(json.dumps({"profwatch_capture_id": "cap-torch"}))
        write_torch_trace(d / f"node0_{4000 + r}.1767268800000.pt.trace.json", r, 4, events[r])
        (d / "trace.done").write_text("")
        dirs[r] = d
    return dirs


def test_torch_batch_short_window_is_weak_and_unparseable_trace_is_partial(tmp_path: Path):
    """issue 11 items 10 and 5b on torch.profiler captures (no msprof-analyze needed)."""
    dirs = _torch_batch(tmp_path / "prof", work={1: 1.3})
    batch = scan_tree(tmp_path / "prof", world_size=4)[0]
    assert batch.status == "complete"
    full = analyze_batch(batch, work_dir=tmp_path / "w1", settings=_settings(), armed_steps=[1, 2, 3])
    assert full.status == "ok" and full.suspects[0].rank == 1 and full.strength == "strong"
    short = analyze_batch(batch, work_dir=tmp_path / "w2", settings=_settings(), armed_steps=[1, 2, 3, 4, 5])
    assert short.status == "weak" and "3 of 5 armed steps" in short.detail
    assert short.to_json()["armed_steps"] == [1, 2, 3, 4, 5] and short.to_json()["captured_steps"] == [1, 2, 3]
    trace = next(dirs[3].glob("*.pt.trace.json"))
    trace.write_bytes(trace.read_bytes()[:400])
    part = analyze_batch(scan_tree(tmp_path / "prof", world_size=4)[0], work_dir=tmp_path / "w3",
                         settings=_settings())
    assert part.status == "partial" and set(part.unjudged_ranks) == {3}, part.detail
    assert "cannot be parsed" in part.unjudged_ranks[3] and part.suspects[0].rank == 1
    out = CliRunner().invoke(analyze, [str(tmp_path / "prof"), "--world-size", "4", "--json",
                                       "--out", str(tmp_path / "w4")])
    assert out.exit_code == 1 and json.loads(out.output.strip().splitlines()[-1])["status"] == "partial"
