"""Per-batch ``report.json`` and an offline ``report.html`` (Jinja2 templates + plotly.js) (I/O).

The page is rendered from the package templates ``templates/report.html.j2`` (+ ``report.css``, ``report.js``)
with Jinja2 autoescaping, so every value from the data (host names, paths, recipe logs) is escaped; the chart
data goes in as ``|tojson`` (``<``, ``>``, ``&``, ``'`` escaped). plotly.js (~4.8 MB, 99 % of a page that inlined
it) is one shared file, :data:`PLOTLY_ASSET`, written once into the folder that holds the batches' report folders
and loaded by a relative ``<script src>``: no network, and a report is tens of kB. A page moved away from that
file says where the chart's script is and that ``report.json`` holds every number; :func:`render_html` without
``plotly_src`` still inlines it (one self-contained page). What the page shows is decided in :mod:`profwatch.core.verdict.report_view`; the chart in
:mod:`profwatch.adapters.outputs.report_charts`. Jinja2: https://jinja.palletsprojects.com/ (BSD-3-Clause).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from functools import lru_cache
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any
from urllib.parse import quote

from jinja2 import Environment, PackageLoader, StrictUndefined
from markupsafe import Markup

from profwatch.adapters.fs.whole_file import replace_whole
from profwatch.adapters.outputs.report_charts import PLOTLY_ASSET, plotly_bundle, plotly_js, rank_figure
from profwatch.core.verdict.evidence import RankStepSummary
from profwatch.core.verdict.report_view import build_view, impact_text

KNOWN_STATUS = frozenset({"ok", "no_suspect", "not_applicable", "skipped", "no_data", "incomplete", "partial",
                          "tool_error", "timeout", "cancelled", "failed"})


@lru_cache(maxsize=1)
def _env() -> Environment:
    return Environment(loader=PackageLoader("profwatch.adapters.outputs", "templates"), autoescape=True,
                       undefined=StrictUndefined, keep_trailing_newline=True)


def _version() -> str:
    try:
        return version("profwatch")
    except PackageNotFoundError:
        return "(source tree)"


def href(path: str, base: Path | None) -> str:
    """A link to a local path: relative to ``base`` when possible, percent-encoded (``:`` too, so no value can
    become a ``javascript:`` or other URL scheme)."""
    target = path
    if base is not None and os.path.isabs(path):
        try:
            target = os.path.relpath(path, base)
        except ValueError:
            target = path
    return quote(target, safe="/")


def render_html(data: Mapping[str, Any], summaries: Sequence[RankStepSummary], *, base: Path | None = None,
                generated: str = "", plotly_src: str | None = None) -> str:
    """The whole report page as one string (opens offline).

    Args:
        data: the ``suspect_ranks`` event data (``profwatch.core.alerts.events.suspect_alert_data``), optionally
            with ``detail``, ``advisor``, ``impact``, ``links``, ``armed_steps``, ``captured_steps`` and
            ``suspects[i].impact`` / ``suspects[i].evidence.strength`` (rendered when present).
        summaries: per-(rank, step) rows (µs) for the chart.
        base: folder the page will live in (links are made relative to it).
        generated: timestamp text for the header.
        plotly_src: relative URL of the shared plotly.js file (:data:`PLOTLY_ASSET`) the page loads; None: the
            bundle is inlined (a self-contained page of ~4.8 MB).

    Raises:
        jinja2.TemplateError: a broken template (a packaging error, not a data error).
    """
    view = build_view(data, summaries, generated=generated)
    figure = rank_figure(view)
    template = _env().get_template("report.html.j2")
    return template.render(
        v=view, figure=figure, batch_id=str(data.get("batch_id") or ""), version=_version(),
        plotly_js=Markup(plotly_js()) if figure and plotly_src is None else "", plotly_src=plotly_src,
        plotly_asset=PLOTLY_ASSET, known_status=KNOWN_STATUS, impact_text=impact_text,
        href=lambda p: href(str(p), base), basename=lambda p: os.path.basename(os.path.normpath(str(p))))


def write_report(out_dir: Path, data: Mapping[str, Any], summaries: Sequence[RankStepSummary], *,
                 html_enabled: bool = True, generated: str = "", assets_dir: Path | None = None,
                 inline_plotly: bool = False) -> tuple[Path, Path | None]:
    """Write ``report.json`` (``data`` plus ``summaries``: the raw per-(rank, step) rows, µs, one row per line) and
    ``report.html`` into ``out_dir``; a page with a chart loads plotly.js from :data:`PLOTLY_ASSET` in
    ``assets_dir`` (default: ``out_dir``'s parent, the folder of every batch's report folder), written there when
    absent. With ``inline_plotly`` (``[analysis] report_html_inline``), or where that folder cannot take the file,
    the page inlines the bundle (self-contained, ~4.8 MB).

    Returns ``(json_path, html_path or None)``. Files are written to a temp name and renamed (no torn reads).
    Raises OSError when ``out_dir`` is not writable.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / "report.json"
    doc = {k: v for k, v in data.items() if k != "summaries"}
    head = json.dumps(doc, indent=1, default=str)
    rows = ",\n  ".join(json.dumps(
        {"rank": s.rank, "step": s.step, "step_time_us": round(s.step_time_us, 3),
         "computation_us": round(s.computation_us, 3), "communication_us": round(s.communication_us, 3),
         "wait_us": round(s.wait_us, 3), "transmit_us": round(s.transmit_us, 3), "free_us": round(s.free_us, 3)},
        separators=(",", ":")) for s in summaries)  # ns resolution, as msprof-analyze writes µs
    # one row per line: 4096 ranks x 5 steps stay ~4 MB instead of ~6 MB with one key per line
    body = f'"summaries": [\n  {rows}\n ]' if rows else '"summaries": []'
    _atomic_write(json_path, (head[:-2] + f",\n {body}\n}}") if doc else f"{{\n {body}\n}}")
    html_path = None
    if html_enabled:
        html_path = out_dir / "report.html"
        assets = Path(assets_dir) if assets_dir is not None else out_dir.resolve().parent
        src = href(str(assets.resolve() / PLOTLY_ASSET), out_dir.resolve())
        if inline_plotly:
            page = render_html(data, summaries, base=out_dir, generated=generated)
        else:
            page = render_html(data, summaries, base=out_dir, generated=generated, plotly_src=src)
            if f'src="{src}"' in page:  # the page has a chart
                try:
                    _shared_asset(assets / PLOTLY_ASSET, plotly_bundle())
                except OSError:
                    page = render_html(data, summaries, base=out_dir, generated=generated)
        _atomic_write(html_path, page)
    return json_path, html_path


def _shared_asset(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` unless a file of its size is there (the name carries plotly's version; written to
    a temp file and renamed, so a file of the right size is whole:
    :func:`~profwatch.adapters.fs.whole_file.replace_whole`). Raises OSError when the
    folder is not writable."""
    data = text.encode("utf-8")
    try:
        if path.stat().st_size == len(data):
            return
    except OSError:
        pass
    replace_whole(path, data)


def _atomic_write(path: Path, text: str) -> None:
    replace_whole(path, text.encode("utf-8"))
