"""report.html in a real headless Chromium through Selenium (Debian's ``chromium`` + ``chromium-driver``).

Checked at 900 px wide (8 ranks) and on a 1024-rank report: the slow rank's highlighted elements are in the DOM
(badge, suspect row, chart marker), the tallest drawn bar is the slow rank's, a weak suspect is drawn unlike the
strong one, hover and zoom work, nothing is fetched, the console has no errors, no injected script ran.
Screenshots are saved under the test's tmp dir (kept with ``--basetemp``). In CI
(``PROFWATCH_REQUIRE_REAL_TOOLS=1``) a missing browser fails these tests instead of skipping them.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from profwatch.adapters.outputs.report import write_report
from tests.conftest import require_tool, wait_for
from tests.integration.test_report import EVIL, report_data

CHROMIUM_ARGS = ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--hide-scrollbars")

# the tallest drawn bar of the own-work chart: its rank (a bin's bar carries its largest rank's numbers)
TALLEST_BAR_JS = """
var gd = document.getElementById('pw-rank-chart');
var paths = gd.querySelectorAll('.barlayer .trace')[0].querySelectorAll('.point path');
var best = null, bh = -1;
paths.forEach(function (p) { var h = p.getBoundingClientRect().height; if (h > bh) { bh = h; best = p; } });
var style = getComputedStyle(best);
return {rank: gd.data[0].customdata[best.__data__.i][0], height: bh, fill: style.fill, n: paths.length,
        second: Array.from(paths).map(function (p) { return p.getBoundingClientRect().height; })
                     .sort(function (a, b) { return b - a; })[1]};
"""


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One headless Chromium for the module (fresh profile dir), quit in ``finally``."""
    chromium = require_tool("chromium", "the report browser check needs Debian's chromium (apt-get install chromium)")
    driver_path = require_tool("chromedriver", "the report browser check needs Debian's chromium-driver")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="pw-chromium-")
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for arg in (*CHROMIUM_ARGS, f"--user-data-dir={profile}"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(driver_path), options=opts)
    try:
        yield driver
    finally:
        driver.quit()
        import shutil

        shutil.rmtree(profile, ignore_errors=True)


def _open(driver: Any, page: Path, width: int, height: int) -> None:
    driver.set_window_size(width, height)
    driver.get_log("browser")  # drop what an earlier page logged
    driver.get(page.as_uri())

    def rendered() -> bool:
        try:
            return bool(driver.execute_script(
                "var g = document.getElementById('pw-rank-chart'); return !!g && g.dataset.rendered === '1'"))
        except Exception:  # noqa: BLE001 - page still loading: not there yet
            return False

    wait_for(rendered, timeout_s=60, interval_s=0.1, what="the rank chart to render")


def _console_errors(driver: Any) -> list[dict[str, Any]]:
    return [e for e in driver.get_log("browser") if e.get("level") in ("SEVERE", "ERROR")]


def _rgb(css: str) -> tuple[int, ...]:
    return tuple(int(float(v)) for v in css[css.index("(") + 1:css.index(")")].split(",")[:3])


def _hover_text(driver: Any, axis: str, x: float, y: float, expect: str) -> str:
    """Move the real mouse over data point (x, y) of subplot ``axis`` ("" or "3") and return the hover label once
    it contains ``expect`` (plotly throttles hover updates, so a label of a point passed on the way may show
    first). Raises AssertionError when no such label shows within 10 s."""
    from selenium.webdriver.common.action_chains import ActionChains

    gd = driver.find_element("id", "pw-rank-chart")
    px, py = driver.execute_script(
        f"var fl = document.getElementById('pw-rank-chart')._fullLayout, xa = fl['xaxis{axis}'], "
        f"ya = fl['yaxis{axis}']; return [xa._offset + xa.l2p(arguments[0]), ya._offset + ya.l2p(arguments[1])];",
        x, y)
    rect = gd.rect
    ActionChains(driver).move_to_element_with_offset(gd, int(px - rect["width"] / 2),
                                                     int(py - rect["height"] / 2)).perform()

    def label() -> str:
        return str(driver.execute_script(
            "return Array.from(document.querySelectorAll('#pw-rank-chart .hoverlayer .hovertext'))"
            ".map(function (e) { return e.textContent; }).join(' | ')") or "")

    def expected_label() -> str:
        text = label()
        return text if expect in text else ""

    return wait_for(expected_label, timeout_s=10, what=f"a hover label with {expect!r}")


def test_900px_report_points_at_the_slow_rank(browser: Any, tmp_path: Path) -> None:
    data, rows = report_data(tmp_path, world=8, slow={5: 1.4}, noise=0.01, host_names={2: EVIL})
    data["capture_reason"] = EVIL
    _, page = write_report(tmp_path / "out", data, rows, generated="now")
    assert page is not None
    _open(browser, page, 900, 2000)
    try:
        badge = browser.find_element("id", "pw-badge")
        assert badge.text == "slow rank found"
        assert browser.find_element("css selector", "#pw-top-suspect[data-rank='5']").text.startswith("rank 5")
        row = browser.find_element("css selector", "tr.pw-suspect.pw-grade-strong[data-rank='5']")
        assert row.is_displayed()
        marker = browser.find_element("css selector", "#pw-rank-chart g.tracepwstrong text")
        assert marker.text == "rank 5"
        tallest = browser.execute_script(TALLEST_BAR_JS)
        assert tallest["rank"] == 5 and tallest["n"] == 8 and tallest["height"] > 5 * tallest["second"]
        r, g, b = _rgb(tallest["fill"])
        assert r > 150 and g < 80 and b < 80, tallest["fill"]  # red: more own work than its peers
        # readable at 900 px: no horizontal overflow, chart labels >= 12 px
        assert browser.execute_script("return document.documentElement.scrollWidth") <= 900
        sizes = browser.execute_script(
            "return Array.from(document.querySelectorAll('#pw-rank-chart g[class$=tick] text'))"
            ".map(function (e) { return parseFloat(getComputedStyle(e).fontSize); })")
        assert sizes and min(sizes) >= 12
        ticks = browser.execute_script(
            "return Array.from(document.querySelectorAll('#pw-rank-chart g.x3tick text'))"
            ".map(function (e) { return e.textContent; })")
        assert [t for t in ticks if t] == [str(i) for i in range(8)]
        hover = _hover_text(browser, "", 5, tallest_y(browser, 5), "rank 5")
        assert "rank 5" in hover and "own work" in hover and "ms" in hover
        hover = _hover_text(browser, "3", 5, 1, "rank 5, step 2")
        assert "rank 5, step 2" in hover and "difference" in hover
        # the injected host name and reason are shown as text, never run; nothing was fetched
        assert browser.execute_script("return window.__pwned === undefined")
        assert EVIL in browser.find_element("tag name", "header").text
        assert browser.execute_script("return performance.getEntriesByType('resource').length") == 0
        assert _console_errors(browser) == []
    finally:
        browser.save_screenshot(str(tmp_path / "report-900px.png"))
    assert (tmp_path / "report-900px.png").stat().st_size > 20_000


def tallest_y(driver: Any, rank: int) -> float:
    """Half the height of ``rank``'s own-work bar (data units), a point inside the bar for hovering."""
    return float(driver.execute_script(
        "var t = document.getElementById('pw-rank-chart').data[0]; return t.y[t.x.indexOf(arguments[0])] / 2;", rank))


@pytest.mark.slow
def test_1024_rank_report_bins_zooms_and_grades(browser: Any, tmp_path: Path) -> None:
    data, rows = report_data(tmp_path, world=1024, slow={517: 1.4}, noise=0.01)
    data["suspects"].append({"rank": 40, "score": 0.45, "kind": "host", "hostname": "node5", "rank_dir": None,
                             "evidence": {"summary": "idle time a little above its peers", "strength": "weak"}})
    _, page = write_report(tmp_path / "out", data, rows, generated="now")
    assert page is not None
    _open(browser, page, 900, 1900)
    try:
        assert browser.find_element("id", "pw-badge").text == "slow rank found"
        assert browser.find_element("css selector", "tr.pw-suspect.pw-grade-strong[data-rank='517']")
        assert browser.find_element("css selector", "tr.pw-suspect.pw-grade-weak[data-rank='40']")
        gd = browser.find_element("id", "pw-rank-chart")
        assert int(gd.get_attribute("data-bin-size")) > 1  # more ranks than pixels: binned, largest kept
        tallest = browser.execute_script(TALLEST_BAR_JS)
        assert tallest["rank"] == 517 and tallest["n"] < 1024 and tallest["height"] > 5 * tallest["second"]
        strong = browser.find_element("css selector", "#pw-rank-chart g.tracepwstrong text")
        weak = browser.find_element("css selector", "#pw-rank-chart g.tracepwweak text")
        assert strong.text == "rank 517" and weak.text == "rank 40"
        fills = browser.execute_script(
            "return ['tracepwstrong', 'tracepwweak'].map(function (c) { var p = document.querySelector("
            "'#pw-rank-chart g.' + c + ' path.point'); return [getComputedStyle(p).fill, getComputedStyle(p).stroke,"
            " getComputedStyle(p).opacity]; })")
        assert fills[0][0] != fills[1][0] and fills[1][0] in ("none", "rgba(0, 0, 0, 0)")  # weak: hollow marker
        assert float(fills[1][2]) < float(fills[0][2])
        ticks = [t for t in browser.execute_script(
            "return Array.from(document.querySelectorAll('#pw-rank-chart g.x3tick text'))"
            ".map(function (e) { return e.textContent; })") if t]
        assert 3 <= len(ticks) <= 12 and all(int(t.replace(",", "")) % 100 == 0 for t in ticks), ticks  # round
        browser.save_screenshot(str(tmp_path / "report-1024-ranks.png"))
        # zoom into 80 ranks: every rank gets its own bar again
        browser.execute_script("Plotly.relayout('pw-rank-chart', {'xaxis.range': [480, 560]})")
        wait_for(lambda: gd.get_attribute("data-bin-size") == "1", timeout_s=30, what="re-binning after zoom")
        tallest = browser.execute_script(TALLEST_BAR_JS)
        assert tallest["rank"] == 517
        hover = _hover_text(browser, "3", 517, 2, "rank 517, step 3")
        assert "rank 517, step 3" in hover and "largest of" not in hover
        browser.save_screenshot(str(tmp_path / "report-1024-ranks-zoomed.png"))
        assert _console_errors(browser) == []
    finally:
        browser.save_screenshot(str(tmp_path / "report-1024-ranks-last.png"))
