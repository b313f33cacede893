"""What is behind each change since the reference (the enrich phase's ``reference_compare``): the real
msprof-analyze compare on a generated healthy/regressed pair, a compare that times out, torch.profiler per-op
totals."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest

from profwatch.adapters.fs.rank_dir_fs import scan_tree
from profwatch.adapters.outputs.report import render_html
from profwatch.adapters.tools.msprof_runner import MsprofRunner
from profwatch.analysis.facade import AnalysisSettings, analyze_batch, enrich_analysis
from profwatch.changes.compare import REFERENCE_COMPARE, attach_comparison
from profwatch.changes.msprof_compare import read_xlsx
from profwatch.core.verdict.msprof_plan import MsprofSettings
from tests.conftest import PYTHON, python_env
from tests.integration.test_analyze import _torch_batch


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PYTHON, "-m", "profwatch.cli", *args], env=python_env(), cwd=cwd, capture_output=True,
                          text=True, timeout=600)


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """4 ranks, 3 steps: every link 3x slower and the MatMul operator 1.5x slower on every rank."""
    root = tmp_path_factory.mktemp("pair")
    made = _cli("simulate", "tree", str(root / "pair"), "--world-size", "4", "--pair", "--job-wide", "communication",
                "--slow-op", "MatMul:1.5", "--seed", "7", cwd=root)
    assert made.returncode == 0, made.stderr
    return root / "pair"


@pytest.mark.slow
def test_detail_names_the_slower_operator_and_the_collective(pair: Path, tmp_path: Path) -> None:
    res = _cli("analyze", str(pair / "regressed"), "--baseline", str(pair / "reference"), "--no-advisor", "--json",
               "--quiet", "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    (verdict,) = [json.loads(line) for line in res.stdout.splitlines() if line.strip()]
    assert verdict["recipes"][REFERENCE_COMPARE] == "ok", verdict["recipe_details"][REFERENCE_COMPARE]
    changes = {c["component"]: c for c in verdict["changes"]}
    compute, comm = changes["compute"]["detail"], changes["communication"]["detail"]
    # 4 chunks x 3 MatMul kernels of 2.5 ms, each 1.5x: +15 ms a step, all of it matmul's; add did not change
    assert compute[0]["name"] == "aten::matmul" and compute[0]["kind"] == "operator", compute
    assert compute[0]["delta_s_per_step"] == pytest.approx(0.015, rel=0.1)
    assert not any(d["name"] == "aten::add" for d in compute)
    assert compute[0]["ranks"] == [0, 1] and compute[0]["source"] == "msprof-analyze compare"
    # 4 allreduces a step, each 1 ms -> 3 ms of transfer: +8 ms, in the world group
    kinds = {d["kind"]: d for d in comm}
    assert kinds["collective"]["name"] == "allreduce", comm
    assert kinds["collective"]["delta_s_per_step"] == pytest.approx(0.008, rel=0.15)
    assert kinds["group"]["group"].startswith("10.0.0.1%eth0") and kinds["group"]["delta_s_per_step"] > 0.006
    assert changes["communication"]["detail"] == next(c["detail"] for c in verdict["comparison"]["components"]
                                                      if c["component"] == "communication")
    assert verdict["comparison"]["detail_ranks"] == [0, 1]
    # the workbook compare wrote, read without a spreadsheet package
    (book, *_) = sorted((tmp_path / "out" / "results").glob(
        f"*/{REFERENCE_COMPARE}/{REFERENCE_COMPARE}_rank0-*/performance_comparison_result_*.xlsx"))
    sheets = read_xlsx(book)
    assert {"OverallMetrics", "CommunicationCompare", "OperatorCompareStatistic", "KernelCompare"} <= set(sheets)
    assert "OperatorCompare" not in sheets  # --disable_details: no per-call sheet
    report = json.loads(Path(verdict["paths"]["report_json"]).read_text(encoding="utf-8"))
    assert report["changes"] == verdict["changes"]  # the enriched report carries the detail
    html = render_html(report, [])
    section = html[html.index('id="pw-changes"'):]
    section = section[:section.index("</section>")]
    assert "aten::matmul" in section and "allreduce" in section and "+15.0" in section and "behind it" in section
    human = _cli("analyze", str(pair / "regressed"), "--baseline", str(pair / "reference"), "--no-advisor",
                 "--quiet", "--no-html", "--out", str(tmp_path / "human"), cwd=tmp_path)
    assert human.returncode == 0, human.stderr
    assert "behind the compute change" in human.stdout and "aten::matmul" in human.stdout, human.stdout
    assert "behind the communication change" in human.stdout and "allreduce" in human.stdout


def _sleeper(path: Path) -> Path:
    """A stand-in for msprof-analyze that never finishes (what a compare stuck on a huge capture looks like)."""
    path.write_text("#!/bin/sh\nexec sleep 60\n", encoding="utf-8")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_a_compare_that_times_out_keeps_the_changes_and_says_so(pair: Path, tmp_path: Path) -> None:
    settings = AnalysisSettings(msprof=MsprofSettings(command=str(_sleeper(tmp_path / "stuck")), timeout_s=1.5,
                                                      retries=0, advisor=False, communication_matrix=False))
    (ref_batch,) = scan_tree(pair / "reference", world_size=4)
    (now_batch,) = scan_tree(pair / "regressed", world_size=4)
    with MsprofRunner(settings.msprof) as runner:
        reference = analyze_batch(ref_batch, work_dir=tmp_path / "ref", settings=settings.for_reference(),
                                  runner=runner, enrich=False)
        res = analyze_batch(now_batch, work_dir=tmp_path / "now", settings=settings, runner=runner, enrich=False)
        attach_comparison(res, reference, reference_path=str(pair / "reference"))
        assert REFERENCE_COMPARE in res.pending and res.alert_data()["pending_recipes"][-1] == REFERENCE_COMPARE
        enrich_analysis(res, runner=runner)
    assert res.enriched and "enrich_error" not in res.context
    assert res.recipes[REFERENCE_COMPARE].status == "timeout", res.recipes[REFERENCE_COMPARE]
    assert res.comparison is not None
    changes = {c["component"]: c for c in res.comparison["changes"]}
    assert set(changes) >= {"compute", "communication"}  # the changes stand, without detail
    assert changes["compute"]["detail"] is None and changes["communication"]["detail"] is None
    assert any("behind the changes since the reference is incomplete" in n and "timeout" in n
               for n in res.alert_data()["notes"]), res.notes
    # one stuck compare is enough: the second rank is not run to its timeout too (it held the enrich slot as long)
    assert any("not compared (the compare before it ended timeout)" in n for n in res.notes), res.notes
    assert res.recipes[REFERENCE_COMPARE].duration_s < 2 * 1.5
    assert not any(p.pid for p in runner.running())


def test_torch_captures_get_the_per_operator_difference(tmp_path: Path) -> None:
    _torch_batch(tmp_path / "ref", work={})
    _torch_batch(tmp_path / "now", work={r: 1.5 for r in range(4)})  # every rank's aten::mm 1.5x
    settings = AnalysisSettings(msprof=MsprofSettings(advisor=False, communication_matrix=False))
    with MsprofRunner(settings.msprof) as runner:
        reference = analyze_batch(scan_tree(tmp_path / "ref", world_size=4)[0], work_dir=tmp_path / "w1",
                                  settings=settings.for_reference(), runner=runner, enrich=False)
        res = analyze_batch(scan_tree(tmp_path / "now", world_size=4)[0], work_dir=tmp_path / "w2",
                            settings=settings, runner=runner, enrich=False)
        attach_comparison(res, reference, reference_path=str(tmp_path / "ref"))
        enrich_analysis(res, runner=runner)
    assert res.recipes[REFERENCE_COMPARE].status == "ok", res.recipes[REFERENCE_COMPARE]
    assert res.comparison is not None
    compute = next(c for c in res.comparison["changes"] if c["component"] == "compute")
    top = compute["detail"][0]
    # 3 chunks of 10 ms aten::mm a step, each 1.5x: +15 ms
    assert top["name"] == "aten::mm" and top["source"] == "kineto op totals"
    assert top["delta_s_per_step"] == pytest.approx(0.015, rel=0.05)
    assert os.path.isdir(tmp_path / "w2")


@pytest.mark.slow
def test_the_coordinators_analyser_fills_the_detail_in_the_follow_up(pair: Path, tmp_path: Path) -> None:
    """The live path: the verdict carries the changes and announces reference_compare; the follow-up (enrich)
    carries the detail."""
    from profwatch.captures.ports import BatchAnalyser

    settings = AnalysisSettings(msprof=MsprofSettings(advisor=False, communication_matrix=False))
    analyser = BatchAnalyser(settings)
    try:
        (ref_batch,) = scan_tree(pair / "reference", world_size=4)
        (now_batch,) = scan_tree(pair / "regressed", world_size=4)
        status, ref_payload = analyser.analyse(ref_batch, work_dir=tmp_path / "ref", hostnames={},
                                               context={"capture_id": "ref-1"}, job_id="j",
                                               capture_reason="reference")
        assert status == "no_suspect", ref_payload["detail"]
        ref = {"capture_id": "ref-1", "batch_id": ref_batch.batch_id, "prof_dir": str(pair / "reference"),
               "generation": 0, "age_s": 30.0, "world_size": 4}
        status, verdict = analyser.analyse(now_batch, work_dir=tmp_path / "now", hostnames={},
                                           context={"capture_id": "cap-2", "reference": ref}, job_id="j",
                                           capture_reason="anomaly")
        assert REFERENCE_COMPARE in verdict["pending_recipes"], verdict["pending_recipes"]
        assert {c["component"] for c in verdict["changes"]} >= {"compute", "communication"}
        assert all(c["detail"] is None for c in verdict["changes"])  # the alert does not wait for compare
        assert verdict["comparison"]["ranks_compared"] == [0, 1, 2, 3]  # no rank named: every rank both hold
        status, follow = analyser.enrich("cap-2")
        _, named = analyser.analyse(now_batch, work_dir=tmp_path / "named", hostnames={},
                                    context={"capture_id": "cap-3", "reference": {**ref, "named_ranks": [2, "x", -1]}},
                                    job_id="j", capture_reason="rank_outlier")
        assert named["comparison"]["ranks_compared"] == [2], named["comparison"]  # the capture's named rank
        assert named["changes"][0]["component"] in ("compute", "communication")
    finally:
        analyser.runner.close()
    assert follow["recipes"][REFERENCE_COMPARE]["status"] == "ok", follow["recipes"][REFERENCE_COMPARE]
    compute = next(c for c in follow["changes"] if c["component"] == "compute")
    assert compute["detail"][0]["name"] == "aten::matmul"


def _megatron_dirs(root: Path, *, slow: dict[int, float], drop: set[int]) -> None:
    """8 ranks, tensor 2 x data 2 x pipeline 2 (rank = stage * 4 + shard * 2 + slice) recorded in
    parallel_group_info; the ranks in ``drop`` left out, as a targeted capture leaves them (its rank_list)."""
    from profwatch.core.batches.prof_layout import RANK_LIST_KEY
    from profwatch.simulate import ascend_tree as at

    tls = at.build_timelines(world_size=8, seed=2, slow_ranks=slow)
    groups = [at.ParallelGroup(f"10.0.0.1%eth0_60000_{i}_1", f"tp{i}", (2 * i, 2 * i + 1)) for i in range(4)]
    groups += [at.ParallelGroup(f"10.0.0.1%eth0_60001_{i}_1", f"dp{i}", (b, b + 2))
               for i, b in enumerate((0, 1, 4, 5))]
    groups += [at.ParallelGroup(f"10.0.0.1%eth0_60002_{i}_1", f"pp{i}", (i, i + 4)) for i in range(4)]
    kept = [r for r in range(8) if r not in drop]
    for tl in tls:
        if tl.rank in kept:
            tl.groups = [*tl.groups, *groups]
            meta: dict[str, object] = {"profwatch_capture_id": f"cap-{root.name}"}
            if drop:
                meta[RANK_LIST_KEY] = kept
            at.write_rank_dir(root, tl, metadata=meta)


def test_a_named_rank_the_reference_lacks_is_compared_with_a_rank_of_its_role(tmp_path: Path) -> None:
    _megatron_dirs(tmp_path / "ref", slow={}, drop={5})
    _megatron_dirs(tmp_path / "now", slow={5: 1.5}, drop=set())
    settings = AnalysisSettings(msprof=MsprofSettings(advisor=False, communication_matrix=False))
    (ref_batch,) = scan_tree(tmp_path / "ref")
    (now_batch,) = scan_tree(tmp_path / "now")
    assert ref_batch.status == "complete" and 5 not in ref_batch.ranks, ref_batch.describe()
    with MsprofRunner(settings.msprof) as runner:
        reference = analyze_batch(ref_batch, work_dir=tmp_path / "w1", settings=settings.for_reference(),
                                  runner=runner, enrich=False)
        res = analyze_batch(now_batch, work_dir=tmp_path / "w2", settings=settings, runner=runner, enrich=False)
        attach_comparison(res, reference, reference_path=str(tmp_path / "ref"), ranks=[5])
        assert res.comparison is not None and res.comparison["paired"] == {"5": 4}, res.comparison["notes"]
        compute = next(c for c in res.comparison["changes"] if c["component"] == "compute")
        # its tensor peer 4 (same stage): 4 chunks of 15 ms, 1.5x on rank 5
        assert compute["delta_s_per_step"] == pytest.approx(0.030, rel=0.1)
        assert compute["basis"].startswith("rank 5 compared with reference rank 4 (same role")
        enrich_analysis(res, runner=runner)
    assert res.comparison is not None and res.recipes[REFERENCE_COMPARE].status == "ok"
    compute = next(c for c in res.comparison["changes"] if c["component"] == "compute")
    assert {d["name"] for d in compute["detail"]} == {"aten::matmul", "aten::add"}, compute["detail"]
    assert "rank 5 against reference rank 4" in compute["detail"][0]["source"]
