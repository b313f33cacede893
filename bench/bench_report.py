"""Benchmark: report.html / report.json size and speed at 1024 and 4096 ranks (and more with --ranks).

Prints numbers only (no assertions). Issue 14: keep size and speed reasonable, aggregate what the browser cannot
show.

    .venv/bin/python bench/bench_report.py [--ranks 1024 4096] [--steps 5] [--no-browser]

Per rank count: synthetic per-(rank, step) rows (the synchronous-collective model of the ranking tests: own
work = computation + free, peers wait for the last arrival, one rank 1.4x slower), one strong suspect. Timed
(median of 3): the view (``build_view``), the plotly figure (``rank_figure``, validated by plotly.py), the whole
page render, ``write_report`` (page + report.json). Sizes: page, of it plotly.js (fixed) and the embedded chart
data, report.json. With Debian's chromium + chromium-driver present (and no ``--no-browser``): headless
Chromium at 900 px through Selenium, load -> chart drawn, drawn bar count and bin size, zoom to 100 ranks ->
re-binned and redrawn.
"""

from __future__ import annotations

import argparse
import random
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from statistics import median
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "daemon"))

from profwatch.adapters.outputs.report import render_html, write_report  # noqa: E402
from profwatch.adapters.outputs.report_charts import plotly_js, rank_figure  # noqa: E402
from profwatch.core.alerts.events import suspect_alert_data  # noqa: E402
from profwatch.core.verdict.evidence import RankStepSummary, RecipeStatus, Suspect  # noqa: E402
from profwatch.core.verdict.report_view import build_view  # noqa: E402


def make_rows(world: int, steps: int, slow: int, seed: int = 0) -> list[RankStepSummary]:
    rng = random.Random(seed)
    rows: list[RankStepSummary] = []
    for step in range(1, steps + 1):
        comp = [40_000.0 * (1.4 if r == slow else 1.0) * (1 + 0.01 * rng.gauss(0, 1)) for r in range(world)]
        free = [500.0 * (1 + 0.02 * rng.gauss(0, 1)) for _ in range(world)]
        own = [c + f for c, f in zip(comp, free, strict=True)]
        last = max(own)
        dur = [last - w + 4_000.0 for w in own]
        shortest = min(dur)
        step_time = max(w + d for w, d in zip(own, dur, strict=True))
        rows.extend(RankStepSummary(r, step, step_time, comp[r], dur[r], dur[r] - shortest, shortest, free[r])
                    for r in range(world))
    return rows


def data_for(world: int, rows: list[RankStepSummary], slow: int) -> dict[str, Any]:
    sus = [Suspect(slow, 0.95, "compute", f"node{slow // 8}", {"summary": "computation 56 ms vs peers 40 ms"},
                   f"/prof/node{slow // 8}_{4000 + slow}_20260101120000000_ascend_pt")]
    recipes = {"cluster_time_summary": RecipeStatus("cluster_time_summary", "ok", f"{world} ranks", rows=len(rows))}
    return suspect_alert_data(batch_id="bench", job_id="bench", kind="ascend_pt", status="ok", suspects=sus,
                              summaries=rows, recipes=recipes, paths={}, world_size=world)


def timed(fn: Any, n: int = 3) -> tuple[float, Any]:
    times, out = [], None
    for _ in range(n):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return median(times), out


def browser_numbers(page: Path) -> dict[str, float] | None:
    chromium, driver_path = shutil.which("chromium"), shutil.which("chromedriver")
    if not chromium or not driver_path:
        return None
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="pw-bench-chromium-")
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for arg in ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", f"--user-data-dir={profile}", "--window-size=900,1800"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(driver_path), options=opts)
    try:
        t = time.perf_counter()
        driver.get(page.as_uri())
        deadline = time.monotonic() + 120
        js_rendered = "return document.getElementById('pw-rank-chart').dataset.rendered === '1'"
        while not driver.execute_script(js_rendered):
            if time.monotonic() > deadline:
                return None
            time.sleep(0.02)
        load_s = time.perf_counter() - t
        bars = driver.execute_script(
            "return document.querySelectorAll('#pw-rank-chart .barlayer .trace')[0].querySelectorAll('.point').length")
        bin_size = float(driver.execute_script("return document.getElementById('pw-rank-chart').dataset.binSize"))
        t = time.perf_counter()
        driver.execute_script("var g = document.getElementById('pw-rank-chart'); g.dataset.rendered = '0'; "
                              "Plotly.relayout(g, {'xaxis.range': [1000, 1100]});")
        while not driver.execute_script(js_rendered):
            if time.monotonic() > deadline:
                return None
            time.sleep(0.02)
        zoom_s = time.perf_counter() - t
        zoom_bin = float(driver.execute_script("return document.getElementById('pw-rank-chart').dataset.binSize"))
        return {"load_s": load_s, "bars": float(bars), "bin": bin_size, "zoom_s": zoom_s, "zoom_bin": zoom_bin}
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[1024, 4096])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--no-browser", action="store_true")
    args = ap.parse_args()
    js_mb = len(plotly_js().encode()) / 1e6
    print(f"plotly.js inlined: {js_mb:.2f} MB (fixed part of every page)")
    print("ranks steps | view_s figure_s page_s write_s | page_MB chart_data_MB json_MB | browser: load_s bars bin "
          "zoom_s zoom_bin")
    for world in args.ranks:
        slow = world // 2 + 5
        rows = make_rows(world, args.steps, slow)
        data = data_for(world, rows, slow)
        t_view, view = timed(lambda: build_view(data, rows))  # noqa: B023
        t_fig, _ = timed(lambda: rank_figure(view))  # noqa: B023
        t_page, page = timed(lambda: render_html(data, rows))  # noqa: B023
        out = Path(tempfile.mkdtemp(prefix="pw-bench-report-"))
        try:
            t_write, (jp, hp) = timed(lambda: write_report(out, data, rows), n=1)  # noqa: B023
            m = re.search(r'<script id="pw-figure" type="application/json">(.*?)</script>', page, re.DOTALL)
            chart_mb = len(m.group(1).encode()) / 1e6 if m else 0.0
            b = None if args.no_browser else browser_numbers(hp)
            btxt = ("n/a (no chromium/chromedriver)" if b is None else
                    f"{b['load_s']:.2f} {b['bars']:.0f} {b['bin']:.0f} {b['zoom_s']:.2f} {b['zoom_bin']:.0f}")
            print(f"{world:5d} {args.steps:5d} | {t_view:.3f} {t_fig:.3f} {t_page:.3f} {t_write:.3f} | "
                  f"{hp.stat().st_size / 1e6:.2f} {chart_mb:.2f} {jp.stat().st_size / 1e6:.2f} | {btxt}", flush=True)
        finally:
            shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
