"""`profwatch analyze DIR --baseline REF` on a generated healthy/regressed pair, with the real msprof-analyze."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from profwatch.adapters.outputs.report import render_html
from tests.conftest import PYTHON, python_env


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PYTHON, "-m", "profwatch.cli", *args], env=python_env(), cwd=cwd, capture_output=True,
                          text=True, timeout=600)


@pytest.mark.slow
def test_a_job_wide_communication_regression_leads_with_communication(tmp_path: Path) -> None:
    made = _cli("simulate", "tree", str(tmp_path / "pair"), "--world-size", "4", "--steps", "4", "--pair",
                "--job-wide", "communication", "--seed", "5", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    res = _cli("analyze", str(tmp_path / "pair" / "regressed"), "--baseline", str(tmp_path / "pair" / "reference"),
               "--no-advisor", "--no-html", "--json", "--quiet", "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    (verdict,) = [json.loads(line) for line in res.stdout.splitlines() if line.strip()]
    assert verdict["status"] == "no_suspect"  # nobody stands out: every rank got slower
    changes = verdict["changes"]
    assert changes and changes[0]["component"] == "communication", changes
    assert abs(changes[0]["delta_s_per_step"] - 4 * 2 * 1e-3) <= 0.15 * 8e-3  # 4 collectives x (3x - 1x) 1 ms
    cmp = verdict["comparison"]
    assert cmp["ranks_compared"] == [0, 1, 2, 3] and cmp["headline"].startswith("+")
    assert cmp["reference"]["path"].endswith("reference") and cmp["impact_accelerator_hours_per_day"] > 0
    report = json.loads(Path(verdict["paths"]["report_json"]).read_text(encoding="utf-8"))
    assert report["comparison"]["headline"] == cmp["headline"] and report["changes"] == changes  # on disk too
    html = render_html(report, [])  # the report shows reference vs now side by side per component
    section = html[html.index('id="pw-changes"'):]
    section = section[:section.index("</section>")]
    assert cmp["headline"] in section and section.count('class="pw-change') == 1 + len(cmp["components"])
    changed = [row for row in section.split("<tr")[1:] if 'pw-change changed"' in row]
    assert any(">communication<" in row for row in changed) and not any(">compute<" in row for row in changed)
    ref_runs = {p.name.rsplit("-", 1)[0] for p in (tmp_path / "out" / "reference" / "results").glob("*/msprof/*-*")}
    assert ref_runs == {"cluster_time_summary", "slow_rank"}, ref_runs  # the reference: its time breakdown only
    same = _cli("analyze", str(tmp_path / "pair" / "reference"), "--baseline", str(tmp_path / "pair" / "reference"),
                "--no-advisor", "--no-html", "--json", "--quiet", "--out", str(tmp_path / "same"), cwd=tmp_path)
    (itself,) = [json.loads(line) for line in same.stdout.splitlines() if line.strip()]
    assert itself["changes"] == [] and any("this capture itself" in n for n in itself["comparison"]["notes"])


def test_a_baseline_without_one_complete_batch_is_refused(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    made = _cli("simulate", "tree", str(tmp_path / "now"), "--world-size", "2", "--steps", "2", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    res = _cli("analyze", str(tmp_path / "now"), "--baseline", str(tmp_path / "empty"), "--out",
               str(tmp_path / "out"), cwd=tmp_path)
    assert res.returncode == 2 and "must hold exactly one complete batch" in res.stderr, res.stderr
    assert not (tmp_path / "out").exists()  # refused before anything was written
    partial = tmp_path / "partial"  # a reference with a rank dir missing: its status is said, --baseline-batch not
    made = _cli("simulate", "tree", str(partial), "--world-size", "2", "--steps", "2", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    for rank_dir in sorted(partial.glob("*_ascend_pt"))[1:]:
        shutil.rmtree(rank_dir)
    res = _cli("analyze", str(tmp_path / "now"), "--baseline", str(partial), "--world-size", "2", "--json", "--out",
               str(tmp_path / "out"), cwd=tmp_path)
    (line,) = res.stdout.splitlines()
    refusal = json.loads(line)
    assert res.returncode == 2 and refusal["status"] == "no_batch", res.stdout
    assert "(incomplete)" in refusal["detail"] and "missing ranks [1]" in refusal["detail"], refusal
    assert "--baseline-batch" not in refusal["detail"]
    assert not (tmp_path / "out").exists()


def test_simulate_options_are_checked(tmp_path: Path) -> None:
    res = _cli("simulate", "tree", str(tmp_path / "t"), "--factor", "2", cwd=tmp_path)
    assert res.returncode == 2 and "--factor needs --job-wide" in res.stderr
    res = _cli("simulate", "job", "--ranks", "2", "--slow-rank", "7", "--config-dir", str(tmp_path / "c"),
               "--prof-root", str(tmp_path / "p"), cwd=tmp_path)
    assert res.returncode == 2 and "outside 0..1" in res.stderr
    res = _cli("simulate", "job", "--ranks", "2", "--slow-rank", "some", "--config-dir", str(tmp_path / "c"),
               "--prof-root", str(tmp_path / "p"), cwd=tmp_path)
    assert res.returncode == 2 and "'all'" in res.stderr
    for bad in (["--job-wide", "compute", "--factor", "inf"], ["--job-wide", "host", "--factor", "nan"],
                ["--slow", "1:-3"], ["--slow-link", "1:1e400"], ["--steps", "0"], ["--slow-op", "Conv2D:2"],
                ["--slow-op", "MatMul:x"], ["--slow-op", "MatMul:inf"]):  # a usage error, no traceback
        res = _cli("simulate", "tree", str(tmp_path / "bad"), *bad, cwd=tmp_path)
        assert res.returncode == 2 and "Traceback" not in res.stderr and "Error:" in res.stderr, (bad, res.stderr)
    assert not (tmp_path / "bad").exists()
    for bad in (["--slowdown", "nan"], ["--duration-s", "inf"], ["--ranks", "0"]):
        res = _cli("simulate", "job", *bad, "--config-dir", str(tmp_path / "c"), "--prof-root", str(tmp_path / "p"),
                   cwd=tmp_path)
        assert res.returncode == 2 and "Error:" in res.stderr, (bad, res.stderr)
