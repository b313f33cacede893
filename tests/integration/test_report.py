"""report.json / report.html: content, self-containment, escaping, and (when chromium exists) a real render."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from daemon.adapters.report import render_html, write_report
from daemon.core.alerts import suspect_alert_data
from daemon.core.evidence import RecipeStatus
from daemon.core.ranking import rank_suspects
from tests.unit.test_ranking import make_evidence


def _data(tmp_path: Path, world: int = 8, **kw):
    ev = make_evidence(world, steps=4, **kw)
    dirs = {r: str(tmp_path / "stage" / f"node{r // 8}_{4000 + r}_20260101120000000_ascend_pt") for r in range(world)}
    sus = rank_suspects(ev, hostnames={r: f"node{r // 8}" for r in range(world)}, rank_dirs=dirs)
    recipes = {"cluster_time_summary": RecipeStatus("cluster_time_summary", "ok", "32 rows", rows=32, duration_s=3.0),
               "slow_rank": RecipeStatus("slow_rank", "not_applicable", "groups < 4"),
               "advisor": RecipeStatus("advisor", "tool_error", "boom <script>alert(1)</script>",
                                       log_tail="Traceback <b>x</b>")}
    data = suspect_alert_data(batch_id="cap<1>", job_id="j&1", kind="ascend_pt", status="ok" if sus else "no_suspect",
                              suspects=sus, summaries=ev.summaries, recipes=recipes,
                              paths={"staging": str(tmp_path / "stage"),
                                     "advisor_html": str(tmp_path / "out" / "mstt_advisor_1.html")},
                              capture_reason="spike", world_size=world)
    return data, ev.summaries


def test_report_files_and_content(tmp_path: Path):
    data, rows = _data(tmp_path, slow={3: 1.5})
    jp, hp = write_report(tmp_path / "out", data, rows, generated="now")
    doc = json.loads(jp.read_text())
    assert doc["suspects"][0]["rank"] == 3 and len(doc["summaries"]) == 32
    page = hp.read_text()
    assert page.startswith("<!doctype html>") and "<svg" in page and "<style>" in page
    # self-contained: no external fetches, no scripts
    assert not re.search(r"<script|<link |src=\"http|@import|url\(http", page, re.IGNORECASE)
    # escaping of user-controlled strings
    assert "<script>alert(1)</script>" not in page and "&lt;script&gt;" in page and "cap&lt;1&gt;" in page
    assert "node0_4003_20260101120000000_ascend_pt" in page and "compute" in page
    assert 'href="mstt_advisor_1.html"' in page  # relative link to the advisor output
    assert page.count("<rect") > 8 * 4


def test_balanced_report_says_no_suspect_and_html_optional(tmp_path: Path):
    data, rows = _data(tmp_path)
    assert data["suspects"] == []
    assert "No suspect rank" in render_html(data, rows)
    jp, hp = write_report(tmp_path / "o2", data, rows, html_enabled=False)
    assert jp.exists() and hp is None


def test_report_with_no_rows(tmp_path: Path):
    data, _ = _data(tmp_path)
    page = render_html(data, [])
    assert "No per-rank time breakdown" in page


@pytest.mark.skipif(not shutil.which("chromium"), reason="chromium not installed")
def test_render_with_headless_chromium(tmp_path: Path):
    data, rows = _data(tmp_path, world=32, slow={7: 1.4}, host={20: 0.2})
    _, hp = write_report(tmp_path / "out", data, rows)
    png = tmp_path / "shot.png"
    proc = subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1280,2200",
                           f"--screenshot={png}", hp.as_uri()], capture_output=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert png.exists() and png.stat().st_size > 20_000
