"""Why the suspect is slow (issue 32, the drill-down): each suspect against its median peer, operator by operator,
in the enrich phase: torch.profiler per-op totals, Ascend ``msprof-analyze compare``; in ``op_compare``, the
report, the alert's ``why`` and ``analyze``'s output."""

from __future__ import annotations

from pathlib import Path

import pytest

from profwatch.adapters.fs.rank_dir_fs import scan_tree
from profwatch.adapters.tools.kineto_reader import compare_suspects
from profwatch.adapters.tools.msprof_runner import MsprofRunner
from profwatch.analysis.facade import AnalysisSettings, analyze_batch, enrich_analysis
from profwatch.commands.analyze import _human
from profwatch.core.alerts.alertmanager import AlertBook
from profwatch.core.alerts.events import TYPE_ANALYSIS_ENRICHED, TYPE_SUSPECT_RANKS, make_cloudevent
from profwatch.core.verdict.msprof_plan import MsprofSettings
from profwatch.simulate.ascend_tree import generate_cluster
from tests.integration.test_analyze import _torch_batch
from tests.real_traces import TRACES, layout


def _run(root: Path, world: int, work: Path):
    settings = AnalysisSettings(msprof=MsprofSettings(advisor=False, communication_matrix=False, timeout_s=300))
    with MsprofRunner(settings.msprof) as runner:
        res = analyze_batch(scan_tree(root, world_size=world)[0], work_dir=work, settings=settings, runner=runner,
                            enrich=False)
        enrich_analysis(res, runner=runner)
    return res


def _alert_why(res) -> str:
    """The ``why`` annotation of the top suspect's alert as the enriched update sets it: the alert phase's
    ``suspect_ranks`` (no drill-down yet) fires the alert, then ``analysis_enriched`` updates it (an enriched
    update only updates standing alerts, docs/alerts.md)."""
    book = AlertBook(cluster="c", resend_interval_s=60)
    first = make_cloudevent(TYPE_SUSPECT_RANKS, "job-1", {**res.alert_data(), "op_compare": []}, source="//t",
                            now_unix_s=1.7e9)
    assert not any(p["annotations"].get("why") for p in book.apply(first, 1.7e9))
    ev = make_cloudevent(TYPE_ANALYSIS_ENRICHED, "job-1", res.alert_data(), source="//t", now_unix_s=1.7e9 + 1)
    posts = book.apply(ev, 1.7e9 + 1)
    suspect = [p for p in posts if p["labels"].get("rank") == str(res.suspects[0].rank)]
    return suspect[0]["annotations"].get("why", "") if suspect else ""


def test_torch_slow_rank_names_its_slower_operator_first(tmp_path: Path):
    # rank 1's aten::mm 1.3x: 3 chunks of 10 ms a step -> +9 ms/step over its median peer
    _torch_batch(tmp_path / "prof", work={1: 1.3})
    res = _run(tmp_path / "prof", 4, tmp_path / "w")
    assert res.suspects[0].rank == 1 and res.recipes["kineto_op_compare"].status == "ok", res.recipes
    (drill,) = res.op_compare
    assert drill["rank"] == 1 and drill["reference_rank"] in (0, 2, 3) and drill["source"] == "kineto op totals"
    top = drill["ops"][0]
    assert top["name"] == "aten::mm" and top["kind"] == "operator"
    assert top["excess_us_per_step"] == pytest.approx(9_000, rel=0.15)
    assert "why (over its median peer" in _human(res) and "aten::mm" in _human(res)
    html = Path(res.report).read_text()
    assert "why it is slow" in html and "aten::mm" in html
    assert "aten::mm" in _alert_why(res)


@pytest.mark.slow
def test_ascend_slow_rank_names_its_slower_operator_first_with_msprof_compare(tmp_path: Path):
    # rank 2's MatMul kernels 2x: 4 collectives x 3 MatMul kernels x 2.5 ms a step -> +30 ms/step
    generate_cluster(tmp_path / "prof", world_size=4, rank_slow_ops={2: {"MatMul": 2.0}}, seed=3)
    res = _run(tmp_path / "prof", 4, tmp_path / "w")
    assert res.suspects and res.suspects[0].rank == 2, res.detail
    assert res.recipes["suspect_compare"].status == "ok", res.recipes["suspect_compare"]
    drill = res.op_compare[0]
    assert drill["rank"] == 2 and drill["source"] == "msprof-analyze compare"
    top = drill["ops"][0]
    assert top["name"] == "aten::matmul" and top["kind"] == "operator", drill["ops"]
    assert top["excess_us_per_step"] == pytest.approx(30_000, rel=0.15)
    assert "aten::matmul" in _alert_why(res) and "aten::matmul" in Path(res.report).read_text()
    assert res.to_json()["op_compare"][0]["ops"][0]["name"] == "aten::matmul"


def test_real_traces_drill_down_on_device_kernels(tmp_path: Path):
    # HTA's trace_diff test trace as a "suspect" against its control as the "peer": the excess is on device
    # kernels (host operators such as aten::item only wait for the device), led by the embedding backward
    dirs = layout(tmp_path / "prof", [TRACES["trace_diff_control"], TRACES["trace_diff_test"]])
    out, status = compare_suspects(dirs, [1], 0)
    assert status.status == "ok" and out[0]["steps"] == 6, status
    ops = out[0]["ops"]
    assert ops and {o["kind"] for o in ops} <= {"kernel", "memory", "collective"}
    assert ops[0]["name"] == "Memcpy DtoD (Device -> Device)" or "split_embedding" in ops[0]["name"], ops[:2]
    assert [o["excess_us_per_step"] for o in ops] == sorted((o["excess_us_per_step"] for o in ops), reverse=True)
