"""report.json / report.html: content, one self-contained file, escaping, graceful degradation, packaged templates.

The real browser render is checked in ``test_report_browser.py``.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

from profwatch.adapters.outputs.report import href, render_html, write_report
from profwatch.adapters.outputs.report_charts import PLOTLY_ASSET, plotly_bundle, plotly_js
from profwatch.core.alerts.events import suspect_alert_data
from profwatch.core.verdict.evidence import RankStepSummary, RecipeStatus
from profwatch.core.verdict.ranking import rank_suspects
from tests.conftest import REPO_ROOT
from tests.unit.test_ranking import make_evidence

EVIL = "<script>window.__pwned=1</script>"


def report_data(tmp_path: Path, world: int = 8, *, host_names: dict[int, str] | None = None, status: str | None = None,
                **kw: Any) -> tuple[dict[str, Any], list[RankStepSummary]]:
    """Suspect-ranks data for a synthetic batch (``make_evidence`` kwargs), ranked by the real ranking."""
    ev = make_evidence(world, steps=kw.pop("steps", 4), **kw)
    hosts = {r: f"node{r // 8}" for r in range(world)}
    hosts.update(host_names or {})
    dirs = {r: str(tmp_path / "stage" / f"{hosts[r]}_{4000 + r}_20260101120000000_ascend_pt") for r in range(world)}
    sus = rank_suspects(ev, hostnames=hosts, rank_dirs=dirs)
    recipes = {"cluster_time_summary": RecipeStatus("cluster_time_summary", "ok", "32 rows", rows=32, duration_s=3.0),
               "slow_rank": RecipeStatus("slow_rank", "not_applicable", "groups < 4"),
               "advisor": RecipeStatus("advisor", "tool_error", f"boom {EVIL}", log_tail="Traceback <b>x</b>"),
               "advisor_html": RecipeStatus("advisor_html", "ok", f"{tmp_path}/out/mstt_advisor_1.xlsx "
                                                                  f"{tmp_path}/out/mstt_advisor_1.html")}
    data = suspect_alert_data(batch_id="cap<1>", job_id="j&1", kind="ascend_pt",
                              status=status or ("ok" if sus else "no_suspect"), suspects=sus, summaries=ev.summaries,
                              recipes=recipes,
                              paths={"staging": str(tmp_path / "stage"),
                                     "advisor_html": str(tmp_path / "out" / "mstt_advisor_1.html")},
                              capture_reason="spike", world_size=world,
                              notes=[f"advisor report: {tmp_path}/out/mstt_advisor_1.xlsx, "
                                     f"{tmp_path}/out/mstt_advisor_1.html"])
    return data, ev.summaries


def _figure(page: str) -> dict[str, Any]:
    m = re.search(r'<script id="pw-figure" type="application/json">(.*?)</script>', page, re.DOTALL)
    assert m, "no figure JSON in the page"
    fig: dict[str, Any] = json.loads(m.group(1))
    return fig


def test_report_files_one_small_page_and_one_shared_plotly_file(tmp_path: Path) -> None:
    """The page was 4.8 MB, nearly all of it plotly.js inlined in every report; now the bundle is one file
    (``PLOTLY_ASSET``) in the folder of the report folders, written once, loaded by a relative ``<script src>``
    (offline), and each page is a few tens of kB. Without a writable folder for it the page inlines it."""
    data, rows = report_data(tmp_path, slow={3: 1.5})
    out = tmp_path / "out"
    jp, hp = write_report(out, data, rows, generated="now")
    assert hp is not None
    assert sorted(p.name for p in out.iterdir()) == ["report.html", "report.json"]
    shared = tmp_path / PLOTLY_ASSET
    assert shared.read_text() == plotly_bundle() and len(plotly_bundle()) > 1_000_000
    doc = json.loads(jp.read_text())
    assert doc["suspects"][0]["rank"] == 3 and len(doc["summaries"]) == 32
    page = hp.read_text()
    assert page.startswith("<!doctype html>") and "<style>" in page
    assert len(page.encode()) < 200_000 and plotly_js() not in page
    # offline: the one script it loads is the shared file, by a relative path; nothing fetched
    assert re.findall(r"<script[^>]+src=\"([^\"]+)\"", page) == [f"../{PLOTLY_ASSET}"]
    ours = page.replace(f'<script src="../{PLOTLY_ASSET}"></script>', "")
    assert not re.search(r"<script[^>]+src=|<link\b|@import|url\(\s*['\"]?(https?:)?//", ours, re.IGNORECASE)
    assert not re.search(r"(src|href)=\"(https?:)?//", ours)
    assert "report.json beside this page holds every number" in page  # what a page moved away from it says
    # a second report reuses the file; a folder that cannot take it gets the self-contained page
    before = shared.stat().st_mtime_ns
    write_report(tmp_path / "out2", data, rows, generated="now")
    assert shared.stat().st_mtime_ns == before
    blocked = tmp_path / "blocked"
    blocked.write_text("a file, not a folder")
    _, hp3 = write_report(tmp_path / "out3", data, rows, generated="now", assets_dir=blocked)
    assert hp3 is not None and plotly_js() in hp3.read_text()
    # the badge, the headline's rank, the strong suspect's row
    assert re.search(r'id="pw-badge" class="badge badge-found"[^>]*>slow rank found<', page)
    assert 'id="pw-top-suspect" data-rank="3"' in page
    assert 'class="pw-suspect pw-grade-strong" data-rank="3"' in page
    assert 'href="mstt_advisor_1.html"' in page  # relative link to the advisor output
    # each advisor path once: in Files, not again in the recipe detail and the notes
    assert page.count(f"{tmp_path}/out/mstt_advisor_1.html") == 1
    assert page.count(f"{tmp_path}/out/mstt_advisor_1.xlsx") == 1
    assert "advisor report:" not in page


def test_rank_chart_points_at_the_slow_rank(tmp_path: Path) -> None:
    data, rows = report_data(tmp_path, world=16, slow={11: 1.4}, noise=0.01)
    fig = _figure(render_html(data, rows))
    bars, wait, heat = (next(t for t in fig["data"] if t.get("meta") == m) for m in ("absmax", "max", "heat"))
    assert bars["x"] == list(range(16))
    # difference colouring: the slow rank's bar is the tallest, by far, and every other bar is near zero
    top = max(range(16), key=lambda i: bars["y"][i])
    assert bars["x"][top] == 11 and bars["y"][top] > 10
    assert all(abs(y) < 0.15 * bars["y"][top] for i, y in enumerate(bars["y"]) if i != top)
    assert bars["marker"]["color"] == bars["y"] and bars["marker"]["cmin"] == -bars["marker"]["cmax"]
    assert max(range(16), key=lambda i: wait["y"][i]) == top
    # rank x step: the darkest (largest) cell of every step is the slow rank's
    assert all(max(range(16), key=lambda j: row[j]) == top for row in heat["z"])
    assert heat["y"] == ["step 1", "step 2", "step 3", "step 4"] and heat["zmid"] == 0
    strong = next(t for t in fig["data"] if t.get("uid") == "pwstrong")
    assert strong["x"] == [11] and strong["text"] == ["rank 11"]
    titles = {k: v["title"]["text"] for k, v in fig["layout"].items() if k.startswith(("xaxis", "yaxis"))
              and "title" in v and "text" in v["title"]}
    assert titles == {"xaxis3": "rank", "yaxis": "ms per step", "yaxis2": "ms per step", "yaxis3": "step"}
    assert "step time" not in json.dumps(fig).lower()  # the uniform-by-construction step time map is gone


def test_weak_suspect_is_not_painted_like_the_strong_one(tmp_path: Path) -> None:
    data, rows = report_data(tmp_path, world=16, slow={2: 1.4}, noise=0.005)
    data["suspects"].append({"rank": 9, "score": 0.4, "kind": "host", "hostname": "node1",
                             "evidence": {"summary": "a little idle time", "strength": "weak"}, "rank_dir": None})
    data["suspects"][0]["evidence"]["strength"] = "strong"
    page = render_html(data, rows)
    assert 'class="pw-suspect pw-grade-weak" data-rank="9"' in page
    fig = _figure(page)
    weak = next(t for t in fig["data"] if t.get("uid") == "pwweak")
    strong = next(t for t in fig["data"] if t.get("uid") == "pwstrong")
    assert weak["x"] == [9] and strong["x"] == [2]
    assert weak["marker"]["color"] != strong["marker"]["color"] and weak["marker"]["symbol"].endswith("-open")
    assert weak["marker"]["opacity"][0] < strong["marker"]["opacity"][0]


@pytest.mark.parametrize(("status", "detail", "badge"), [
    ("no_suspect", "8 ranks analysed: no rank stands out", "no slow rank"),
    ("partial", "time breakdown covers 3 of 4 ranks", "could not judge: time breakdown covers 3 of 4 ranks"),
    ("failed", "no usable result; failed recipes: cluster_time_summary",
     "could not judge: no usable result; failed recipes: cluster_time_summary"),
])
def test_badge_without_a_named_rank(tmp_path: Path, status: str, detail: str, badge: str) -> None:
    data, rows = report_data(tmp_path, status=status)
    assert data["suspects"] == []
    data["detail"] = detail
    page = render_html(data, rows)
    assert re.search(rf'class="badge badge-(none|unknown)" data-state="\w+">{re.escape(badge)}<', page)
    assert "pw-top-suspect" not in page and "pwstrong" not in page


def test_only_weak_suspects_say_possible(tmp_path: Path) -> None:
    data, rows = report_data(tmp_path, slow={1: 1.3})
    data["suspects"][0]["evidence"]["strength"] = "weak"
    page = render_html(data, rows)
    assert ">possible slow rank (weak evidence)<" in page and "badge-possible" in page


def test_impact_links_and_steps_rendered_when_present(tmp_path: Path) -> None:
    data, rows = report_data(tmp_path, slow={3: 1.5})
    imp = {"saving_s_per_step": 0.0241, "saving_pct_of_step": 27.3, "accelerator_hours_per_day": 52.4}
    data["suspects"][0]["impact"] = imp
    data["impact"] = {**imp, "accelerator_hours_per_day": 60.0}
    data["links"] = [{"ranks": [2, 6], "group": "tp<0>", "bandwidth_gbps": 12.0, "peer_median_gbps": 48.0},
                     {"ranks": "bad"}]
    data["armed_steps"], data["captured_steps"] = [62, 63, 64], [62, 63, 64]
    page = render_html(data, rows)
    # one figure, one name: the verdict's 27.3 % of the mean step, as the alerts and the demo say it; the page
    # shows that mean step (the savings' base: 24.1 ms is 27.3 % of 88.3 ms) beside the median step time
    one = re.search(r"Fixing this rank alone saves 24\.1 ms/step \((\d+)% of the mean step\), about (\d+) "
                    r"accelerator-hours per day", page)
    every = re.search(r"All suspects fixed: saves <b>24\.1 ms/step \((\d+)% of the mean step\), about (\d+) "
                      r"accelerator-hours", page)
    assert one and every, page[:2000]
    assert (one.group(1), one.group(2), every.group(1), every.group(2)) == ("27", "52", "27", "60")
    assert "median step" not in one.group(0) + every.group(0)
    base = float(re.search(r"mean step time \(the savings&#39; base\) <b>([\d.]+) ms</b>", page).group(1))
    assert abs(base - 24.1 / 0.273) < 0.1
    assert 'data-ranks="2-6"' in page and "tp&lt;0&gt;" in page and ">25%<" in page and page.count("pw-link") == 1
    assert "armed steps <b>62-64</b>" in page and "steps <b>62-64</b>" in page
    data["captured_steps"] = [3, 4]
    assert "captured steps 3-4 are not the armed steps 62-64" in render_html(data, rows)


def test_absent_optional_keys_degrade_gracefully(tmp_path: Path) -> None:
    data, rows = report_data(tmp_path, slow={3: 1.5})
    data["impact"] = {"saving_s_per_step": "lots"}  # malformed: ignored, not a crash
    for s in data["suspects"]:  # an analysis that estimated no per-suspect impact
        s.pop("impact", None)
    page = render_html(data, rows)
    assert "not estimated" in page and "All suspects fixed" not in page and "Slow links" not in page


def test_every_data_value_is_escaped(tmp_path: Path) -> None:
    data, rows = report_data(tmp_path, slow={3: 1.5}, host_names={3: EVIL})
    data["suspects"][0]["rank_dir"] = f"/data/{EVIL}/x_ascend_pt"
    data["capture_reason"] = EVIL
    data["notes"] = [f"note {EVIL}"]
    data["advisor"] = {"problems": [{"category": "<img src=x onerror=alert(1)>", "description": EVIL}]}
    data["links"] = [{"ranks": [1, 2], "group": EVIL, "bandwidth_gbps": 1.0, "peer_median_gbps": 2.0}]
    data["detail"] = EVIL
    page = render_html(data, rows)
    assert EVIL not in page and "<img src=x" not in page
    assert "&lt;script&gt;window.__pwned=1&lt;/script&gt;" in page and "cap&lt;1&gt;" in page and "j&amp;1" in page
    fig_json = re.search(r'<script id="pw-figure" type="application/json">(.*?)</script>', page, re.DOTALL)
    assert fig_json and "<" not in fig_json.group(1)  # tojson escapes < > & in the embedded data
    assert "Traceback &lt;b&gt;x&lt;/b&gt;" in page


def test_href_cannot_become_a_url_scheme(tmp_path: Path) -> None:
    assert href("javascript:alert(1)", tmp_path) == "javascript%3Aalert%281%29"
    assert href(str(tmp_path / "a b" / "c.html"), tmp_path) == "a%20b/c.html"
    assert href("/elsewhere/x.html", None) == "/elsewhere/x.html"


def test_report_with_no_rows_and_html_optional(tmp_path: Path) -> None:
    data, _ = report_data(tmp_path)
    page = render_html(data, [])
    assert "No per-rank time breakdown" in page and "pw-figure" not in page and "Plotly" not in page
    jp, hp = write_report(tmp_path / "o2", data, [], html_enabled=False)
    assert jp.exists() and hp is None


def test_templates_ship_in_the_wheel_and_sdist(tmp_path: Path) -> None:
    pytest.importorskip("setuptools", reason="building the wheel needs setuptools in the test environment")
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO_ROOT / name, src / name)
    for pkg in ("daemon", "rankhook"):
        shutil.copytree(REPO_ROOT / pkg, src / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    built = []
    for hook in ("build_wheel", "build_sdist"):  # one process each: setuptools keeps state between the two
        proc = subprocess.run([sys.executable, "-c", f"import sys; from setuptools import build_meta as b; "
                               f"print('BUILT', b.{hook}(sys.argv[1]))", str(tmp_path / "dist")], cwd=src,
                              capture_output=True, text=True, timeout=240, check=False)
        assert proc.returncode == 0, proc.stderr[-3000:]
        built.append(re.findall(r"^BUILT (\S+)$", proc.stdout, re.MULTILINE)[-1])
    wheel_name, sdist_name = built
    templates = sorted(p.name for p in (REPO_ROOT / "daemon" / "profwatch" / "adapters" / "outputs" / "templates").iterdir())
    assert templates == ["report.css", "report.html.j2", "report.js"]
    with zipfile.ZipFile(tmp_path / "dist" / wheel_name) as whl:
        names = set(whl.namelist())
    assert {f"profwatch/adapters/outputs/templates/{t}" for t in templates} <= names
    import tarfile

    with tarfile.open(tmp_path / "dist" / sdist_name) as sd:
        members = {m.name.split("/", 1)[1] for m in sd.getmembers() if "/" in m.name}
    assert {f"daemon/profwatch/adapters/outputs/templates/{t}" for t in templates} <= members


def _small_comparison() -> dict[str, Any]:
    """A "what changed" of a 27 us compute change on an 8 ms step (deterministic, built by hand)."""
    from profwatch.core.changes.comparison import Change, Comparison

    compute = Change("compute", 27e-6, baseline_s_per_step=5.0e-3, now_s_per_step=5.027e-3, share=0.9,
                     interval_s_per_step=(12e-6, 41e-6), p_value=0.001, test="mann_whitney",
                     detail=[{"kind": "operator", "name": "aten::matmul", "delta_s_per_step": 25e-6,
                              "baseline_s_per_step": 1e-3, "now_s_per_step": 1.025e-3, "ranks": [0, 1],
                              "source": "msprof-analyze compare"}])
    comm = Change("communication", -3e-6, baseline_s_per_step=1e-3, now_s_per_step=0.997e-3)
    cmp = Comparison(changes=[compute], components=[compute, comm], step_time_baseline_s=8.0e-3,
                     step_time_now_s=8.03e-3, step_time_changed=True, step_time_interval_s=(1.5e-4, 2.5e-3),
                     ranks_compared=[0, 1], steps_baseline=6, steps_now=6)
    return cmp.to_json()


def test_small_changes_keep_their_digits_in_headline_report_and_cli(tmp_path: Path) -> None:
    """A 27 us compute change was "compute +0.0 ms" in the headline and "+0.03 ms" in the report and the terminal:
    every change is now shown with 2-3 significant digits (``drilldown.delta_text``, the drill-down's rule)."""
    from profwatch.analysis.result import AnalysisResult
    from profwatch.commands.analyze import _human
    from profwatch.core.changes.comparison import headline_line

    comparison = _small_comparison()
    assert comparison["headline"] == "+30 us/step since the reference: compute +27 us"
    assert headline_line(comparison) == "what changed: +30 us/step since the reference: compute +27 us"
    data, rows = report_data(tmp_path, slow={2: 1.5})
    data["comparison"] = comparison
    suspect = data["suspects"][0]["rank"]
    data["op_compare"] = [{"rank": suspect, "reference_rank": 0, "source": "op totals", "ops": [
        {"name": "aten::mm", "kind": "operator", "excess_us_per_step": 40.0, "reference_us_per_step": 900.0,
         "suspect_us_per_step": 940.0}]}]
    page = render_html(data, rows)
    assert "<code>aten::mm</code>: +40 us/step" in page  # the drill-down, by the same rule
    changes = page[page.index("pw-change"):page.index("</table>", page.index("pw-change"))]
    for shown in ("+30 us", "+0.15 ms .. +2.5 ms", "+27 us", "+12 us .. +41 us", "-3.0 us",
                  "<code>aten::matmul</code>: +25 us/step"):
        assert shown in changes, shown
    assert "+0.0 ms" not in changes and "+0.03 ms" not in changes
    cli = _human(AnalysisResult(status="ok", batch_id="b1", kind="ascend_pt", comparison=comparison))
    assert "what changed: +30 us/step since the reference: compute +27 us" in cli
    assert re.search(r"compute .* change +\+27 us  98% \[\+12 us, \+41 us\]", cli), cli
    assert "aten::matmul  +25 us/step" in cli and "+0.03" not in cli


def test_the_coordinators_captures_share_one_plotly_file_in_its_work_dir(tmp_path: Path) -> None:
    """The coordinator analyses each capture in ``<work_dir>/<job>/<capture>/``: with the shared file beside each
    capture's report folder every capture wrote its own 4.8 MB copy (a new user counted 7 in one afternoon). The
    analyser's ``assets_dir`` (the coordinator's work dir) holds the one file every page loads."""
    from profwatch.adapters.fs.rank_dir_fs import scan_tree
    from profwatch.captures.ports import BatchAnalyser
    from tests.integration.test_analyze import _settings, _torch_batch

    _torch_batch(tmp_path / "prof", work={2: 1.5})
    (batch,) = scan_tree(tmp_path / "prof", world_size=4)
    work = tmp_path / "work"
    analyser = BatchAnalyser(_settings(), assets_dir=work)
    try:
        pages = []
        for cid in ("c-1", "c-2"):
            status, data = analyser.analyse(batch, work_dir=work / "j" / cid, hostnames={}, context={"capture_id": cid},
                                            job_id="j", capture_reason="test")
            assert status == "ok" and data["paths"]["plotly_js"] == str((work / PLOTLY_ASSET).resolve())
            pages.append(Path(data["paths"]["report_html"]))
    finally:
        analyser.close()
    assert sorted(p.name for p in work.rglob("plotly-*.js")) == [PLOTLY_ASSET]  # one copy, in the work dir
    for page in pages:
        (src,) = re.findall(r"<script[^>]+src=\"([^\"]+)\"", page.read_text())
        assert (page.parent / src).resolve() == (work / PLOTLY_ASSET).resolve()


def test_shared_plotly_file_two_writers_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The coordinator writes reports on several analysis threads (one process): two first reports of a folder
    write the shared file at once. With a temp name of the pid alone, the second writer truncated and rewrote the
    first's temp file, its rename took it away and the first's rename raised (its page fell back to the 4.8 MB
    inlined bundle, the shared file could be seen half written). Each writer now has a temp file of its own; both
    succeed, the file is whole and no temp file is left."""
    import threading

    import profwatch.adapters.outputs.report as report_mod

    target = tmp_path / PLOTLY_ASSET
    real_replace = report_mod.os.replace
    calls: list[str] = []
    errors: list[BaseException] = []

    def other_writer() -> None:
        try:
            report_mod._shared_asset(target, "x" * 1000)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    def replace_after_another_writer(src: Any, dst: Any) -> None:
        calls.append(str(src))
        if len(calls) == 1:  # the first writer's temp file is whole: another thread writes the file meanwhile
            t = threading.Thread(target=other_writer)
            t.start()
            t.join(timeout=30)
        real_replace(src, dst)

    monkeypatch.setattr(report_mod.os, "replace", replace_after_another_writer)
    report_mod._shared_asset(target, "y" * 1000)
    assert not errors
    assert len(calls) == 2 and calls[0] != calls[1]
    assert target.read_text() == "y" * 1000
    assert sorted(p.name for p in tmp_path.iterdir()) == [PLOTLY_ASSET]


def test_shared_plotly_file_failed_write_leaves_no_temp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A write that fails (a full disk) raises OSError (the page is then inlined) and leaves no partial temp file
    of megabytes beside the report folders."""
    import profwatch.adapters.outputs.report as report_mod

    def full(src: Any, dst: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(report_mod.os, "replace", full)
    with pytest.raises(OSError):
        report_mod._shared_asset(tmp_path / PLOTLY_ASSET, "z" * 1000)
    assert list(tmp_path.iterdir()) == []


def test_report_files_never_write_through_a_planted_temp_name(tmp_path: Path) -> None:
    """A user who can write into the results folder could plant a symlink at a temp name the writer will open
    (``report.json.tmp``, ``report.html.tmp``, the shared plotly file's ``<name>.<pid>.<thread>.tmp``): the writer
    then wrote the report into the link's target and renamed the link over the report. Temp files are now
    ``mkstemp``'s (a random name, created exclusively): the target is untouched, every report file is a regular
    file of the usual mode (0o666 less the umask), and no temp file of the writer's is left. Before: the victim
    file held the report and ``report.json`` was a symlink to it."""
    import os
    import stat
    import threading

    data, rows = report_data(tmp_path, slow={3: 1.5})
    out = tmp_path / "results" / "b1"
    out.mkdir(parents=True)
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    planted = [out / "report.json.tmp", out / "report.html.tmp",
               out.parent / f"{PLOTLY_ASSET}.{os.getpid()}.{threading.get_ident()}.tmp"]
    for p in planted:
        p.symlink_to(victim)
    old = os.umask(0o022)
    try:
        jp, hp = write_report(out, data, rows, generated="now")
    finally:
        os.umask(old)
    assert victim.read_text() == "keep me"
    assert hp is not None
    for p in (jp, hp, out.parent / PLOTLY_ASSET):
        st = os.lstat(p)
        assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o644, p
    assert json.loads(jp.read_text())["summaries"]
    left = {p.name for p in (*out.iterdir(), *out.parent.iterdir())} - {"report.json", "report.html", PLOTLY_ASSET,
                                                                         "b1"}
    assert left == {p.name for p in planted}


def test_a_failed_report_write_leaves_no_temp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """report.json's write that fails at its rename (or while writing) raises OSError and removes its temp file."""
    import profwatch.adapters.outputs.report as report_mod

    def full(src: Any, dst: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(report_mod.os, "replace", full)
    data, rows = report_data(tmp_path)
    out = tmp_path / "o"
    with pytest.raises(OSError):
        write_report(out, data, rows, html_enabled=False)
    assert list(out.iterdir()) == []


def test_a_umask_that_cannot_be_read_never_widens_a_report_s_mode(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Where ``/proc/self/status`` has no ``Umask:`` (Linux before 4.7, e.g. CentOS 7) or cannot be read, the umask
    was taken as 0o022: under a umask of 077 the report became 0o644, readable by every user. Now it keeps
    mkstemp's 0o600; with the umask readable, its mode is 0o666 less it."""
    import os
    import stat

    import profwatch.adapters.fs.whole_file as whole_file

    data, rows = report_data(tmp_path)
    old = os.umask(0o077)
    try:
        monkeypatch.setattr(whole_file, "PROC_STATUS", str(tmp_path / "no-proc" / "status"))
        jp, _ = write_report(tmp_path / "a", data, rows, html_enabled=False)
        monkeypatch.setattr(whole_file, "PROC_STATUS", "/proc/self/status")
        jq, _ = write_report(tmp_path / "b", data, rows, html_enabled=False)
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.lstat(jp).st_mode) == 0o600
    assert stat.S_IMODE(os.lstat(jq).st_mode) == 0o600  # read from /proc: 0o666 & ~0o077


def test_a_file_system_that_refuses_modes_still_gets_its_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """vfat and some CIFS mounts refuse chmod (EPERM): the temp file's mode change failed the whole report, where
    the plain write before wrote it. Now it is written with mkstemp's 0o600."""
    import os

    import profwatch.adapters.outputs.report as report_mod

    def refuse(fd: int, mode: int) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(report_mod.os, "fchmod", refuse)
    data, rows = report_data(tmp_path)
    jp, _ = write_report(tmp_path / "o", data, rows, html_enabled=False)
    assert json.loads(jp.read_text())["summaries"] and oct(os.stat(jp).st_mode & 0o777) == "0o600"
