"""Per-batch ``report.json`` and a self-contained ``report.html`` (inline CSS + inline SVG, no JS, no CDN) (I/O).

The HTML is rendered by pure functions (:func:`render_html`) and written by :func:`write_report`. Sections:
suspects table, per-rank stacked bars (compute / communication / wait / free, medians over steps), rank x step
heat maps (step time, and own work = compute + free, the time the others wait for), recipe statuses, links.
"""

from __future__ import annotations

import html
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from statistics import median
from typing import Any

from daemon.core.evidence import RankStepSummary

COLORS = {"computation": "#3b6fd8", "communication": "#17a398", "wait": "#e8833a", "free": "#b9bec7"}
STATUS_COLORS = {"ok": "#1f9d55", "no_suspect": "#1f9d55", "not_applicable": "#7a8599", "skipped": "#7a8599",
                 "no_data": "#c98a00", "incomplete": "#c98a00", "partial": "#c98a00", "tool_error": "#d64545",
                 "timeout": "#d64545", "failed": "#d64545"}
KIND_COLORS = {"compute": "#3b6fd8", "communication": "#17a398", "host": "#8e5bd0", "unknown": "#7a8599"}
_MAX_BAR_RANKS = 512

CSS = """
:root{--fg:#1d2433;--muted:#6b7385;--line:#e3e6ec;--bg:#f6f7f9;--card:#fff}
*{box-sizing:border-box}body{margin:0;font:14px/1.45 -apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;
color:var(--fg);background:var(--bg)}
header{background:#1d2433;color:#fff;padding:18px 28px}header h1{margin:0;font-size:20px;font-weight:600}
header .meta{color:#b8c0d0;font-size:13px;margin-top:4px}header .meta span{margin-right:18px}
main{max-width:1180px;margin:0 auto;padding:20px 28px 40px}
.card{background:var(--card);border:1px solid var(--line);border-radius:10px;padding:16px 20px;margin:0 0 18px}
.card h2{margin:0 0 12px;font-size:16px}.muted{color:var(--muted)}
table{border-collapse:collapse;width:100%}th,td{text-align:left;padding:7px 10px;border-bottom:1px solid var(--line);
vertical-align:top}th{font-size:12px;text-transform:uppercase;letter-spacing:.04em;color:var(--muted);font-weight:600}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}td.nw{white-space:nowrap}code,.path{font:12px/1.4 ui-monospace,Menlo,Consolas,monospace;
word-break:break-all}
.pill{display:inline-block;padding:1px 9px;border-radius:999px;color:#fff;font-size:12px;font-weight:600}
.score{display:inline-block;width:70px;height:8px;background:#e9ecf1;border-radius:4px;margin-right:8px;vertical-align:middle}
.score i{display:block;height:8px;border-radius:4px;background:#d64545}
.legend span{display:inline-block;margin-right:16px;font-size:12px}.legend b{display:inline-block;width:11px;height:11px;
border-radius:2px;margin-right:5px;vertical-align:-1px}
.summary{font-size:15px}.big{font-size:22px;font-weight:700}
details pre{white-space:pre-wrap;background:#f3f4f7;padding:8px;border-radius:6px;font-size:12px;max-height:240px;overflow:auto}
.grid{display:grid;grid-template-columns:1fr 1fr;gap:18px}@media(max-width:900px){.grid{grid-template-columns:1fr}}
svg text{font-family:inherit}
"""


def _e(x: Any) -> str:
    return html.escape("" if x is None else str(x), quote=True)


def _ms(us: float) -> str:
    return f"{us / 1000:.1f}"


def _pill(status: str) -> str:
    return f'<span class="pill" style="background:{STATUS_COLORS.get(status, "#7a8599")}">{_e(status)}</span>'


def _link(path: str | None, base: Path | None, label: str | None = None) -> str:
    """``<a>`` to a local path, relative to the report's folder when possible."""
    if not path:
        return '<span class="muted">-</span>'
    href = path
    if base is not None:
        try:
            href = os.path.relpath(path, base)
        except ValueError:
            href = path
    return f'<a class="path" href="{_e(href)}">{_e(label or path)}</a>'


def _medians(summaries: Sequence[RankStepSummary]) -> dict[int, dict[str, float]]:
    by: dict[int, list[RankStepSummary]] = {}
    for s in summaries:
        if s.step >= 0:
            by.setdefault(s.rank, []).append(s)
    out = {}
    for rank, rows in by.items():
        out[rank] = {m: median(getattr(r, m) for r in rows) for m in
                     ("step_time_us", "computation_us", "communication_us", "wait_us", "free_us")}
    return out


def render_bars(summaries: Sequence[RankStepSummary], suspects: Sequence[int], width: int = 1080) -> str:
    """Inline SVG: one stacked horizontal bar per rank (median µs over steps), suspects marked in red."""
    med = _medians(summaries)
    ranks = sorted(med)[:_MAX_BAR_RANKS]
    if not ranks:
        return '<p class="muted">No per-rank time breakdown available.</p>'
    bar_h = 16 if len(ranks) <= 32 else 10 if len(ranks) <= 96 else 5
    gap = 4 if bar_h > 5 else 1
    left, right, top = 86, 20, 8
    total_max = max(v["computation_us"] + v["communication_us"] + v["free_us"] for v in med.values()) or 1.0
    scale = (width - left - right) / total_max
    height = top + len(ranks) * (bar_h + gap) + 30
    sus = set(suspects)
    parts = [f'<svg viewBox="0 0 {width} {height}" width="100%" role="img" aria-label="per-rank time breakdown">']
    for i, rank in enumerate(ranks):
        v = med[rank]
        y = top + i * (bar_h + gap)
        comm_only = max(0.0, v["communication_us"] - v["wait_us"])
        segs = [("computation", v["computation_us"]), ("communication", comm_only), ("wait", v["wait_us"]),
                ("free", v["free_us"])]
        label_color = "#d64545" if rank in sus else "#1d2433"
        weight = "700" if rank in sus else "400"
        if bar_h >= 10 or rank in sus:
            parts.append(f'<text x="{left - 8}" y="{y + bar_h - 3}" text-anchor="end" font-size="{min(12, bar_h + 1)}"'
                         f' fill="{label_color}" font-weight="{weight}">{"&#9650; " if rank in sus else ""}'
                         f'rank {rank}</text>')
        x = float(left)
        for name, val in segs:
            w = max(0.0, val * scale)
            if w > 0:
                parts.append(f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{bar_h}" fill="{COLORS[name]}">'
                             f'<title>rank {rank} {name}: {_ms(val)} ms</title></rect>')
            x += w
        if rank in sus:
            parts.append(f'<rect x="{left - 2}" y="{y - 1}" width="{x - left + 4:.1f}" height="{bar_h + 2}" '
                         'fill="none" stroke="#d64545" stroke-width="1.5" rx="2"/>')
    # axis
    y_axis = top + len(ranks) * (bar_h + gap) + 4
    parts.append(f'<line x1="{left}" y1="{y_axis}" x2="{width - right}" y2="{y_axis}" stroke="#c5cad3"/>')
    for k in range(6):
        val = total_max * k / 5
        x = left + val * scale
        parts.append(f'<line x1="{x:.1f}" y1="{y_axis}" x2="{x:.1f}" y2="{y_axis + 4}" stroke="#c5cad3"/>'
                     f'<text x="{x:.1f}" y="{y_axis + 17}" font-size="11" fill="#6b7385" text-anchor="middle">'
                     f'{_ms(val)} ms</text>')
    parts.append("</svg>")
    legend = "".join(f'<span><b style="background:{c}"></b>{n}</span>' for n, c in
                     (("computation", COLORS["computation"]), ("communication (transmit)", COLORS["communication"]),
                      ("wait in collectives", COLORS["wait"]), ("free / idle", COLORS["free"])))
    more = (f'<p class="muted">Showing the first {_MAX_BAR_RANKS} of {len(med)} ranks.</p>'
            if len(med) > _MAX_BAR_RANKS else "")
    return f'<div class="legend">{legend}</div>{"".join(parts)}{more}'


def _heat_color(t: float) -> str:
    """0..1 -> light yellow .. dark red (sequential, readable for colour-blind viewers)."""
    stops = [(255, 247, 214), (253, 190, 112), (240, 110, 60), (190, 30, 45), (120, 0, 40)]
    t = min(1.0, max(0.0, t)) * (len(stops) - 1)
    i = min(int(t), len(stops) - 2)
    f = t - i
    c = [round(a + (b - a) * f) for a, b in zip(stops[i], stops[i + 1], strict=True)]
    return f"rgb({c[0]},{c[1]},{c[2]})"


def render_heatmap(summaries: Sequence[RankStepSummary], metric: str, title: str, suspects: Sequence[int],
                   width: int = 520) -> str:
    """Inline SVG heat map, ranks as rows and steps as columns, colour = ``metric`` (µs) from min to max."""
    cells = {(s.rank, s.step): float(getattr(s, metric)) if metric != "own_us" else s.computation_us + s.free_us
             for s in summaries if s.step >= 0}
    if not cells:
        return '<p class="muted">No data.</p>'
    ranks = sorted({r for r, _ in cells})[:_MAX_BAR_RANKS]
    steps = sorted({s for _, s in cells})[:64]
    lo, hi = min(cells.values()), max(cells.values())
    hi = max(hi, lo + 0.1 * abs(median(cells.values())))  # a <10% spread stays pale, not alarming
    span = (hi - lo) or 1.0
    left, top = 70, 22
    cell_w = max(14, min(60, (width - left - 10) // max(1, len(steps))))
    cell_h = 14 if len(ranks) <= 32 else 8 if len(ranks) <= 96 else 3
    h = top + len(ranks) * cell_h + 44
    sus = set(suspects)
    out = [f'<svg viewBox="0 0 {width} {h}" width="100%" role="img" aria-label="{_e(title)}">']
    for j, step in enumerate(steps):
        out.append(f'<text x="{left + j * cell_w + cell_w / 2:.1f}" y="{top - 6}" font-size="11" fill="#6b7385" '
                   f'text-anchor="middle">{step}</text>')
    for i, rank in enumerate(ranks):
        y = top + i * cell_h
        if cell_h >= 8 or rank in sus:
            out.append(f'<text x="{left - 6}" y="{y + cell_h - 2}" font-size="{min(11, cell_h)}" text-anchor="end" '
                       f'fill="{"#d64545" if rank in sus else "#1d2433"}" '
                       f'font-weight="{"700" if rank in sus else "400"}">{rank}</text>')
        for j, step in enumerate(steps):
            v = cells.get((rank, step))
            fill = "#eceff3" if v is None else _heat_color((v - lo) / span)
            tip = "missing" if v is None else f"{_ms(v)} ms"
            out.append(f'<rect x="{left + j * cell_w}" y="{y}" width="{cell_w - 1}" height="{max(1, cell_h - 1)}" '
                       f'fill="{fill}"><title>rank {rank} step {step}: {tip}</title></rect>')
    ly = top + len(ranks) * cell_h + 12
    for k in range(50):
        out.append(f'<rect x="{left + k * 4}" y="{ly}" width="4" height="9" fill="{_heat_color(k / 49)}"/>')
    out.append(f'<text x="{left}" y="{ly + 22}" font-size="11" fill="#6b7385">{_ms(lo)} ms</text>'
               f'<text x="{left + 200}" y="{ly + 22}" font-size="11" fill="#6b7385" text-anchor="end">'
               f'{_ms(hi)} ms</text><text x="{left + 210}" y="{ly + 9}" font-size="11" fill="#6b7385">rows: rank, '
               'columns: step</text>')
    out.append("</svg>")
    return f"<h3 style='font-size:14px;margin:4px 0 8px'>{_e(title)}</h3>{''.join(out)}"


def _suspects_table(suspects: Sequence[Mapping[str, Any]], base: Path | None) -> str:
    if not suspects:
        return ('<p class="summary">No suspect rank: no rank&#39;s excess reached the threshold in enough steps. '
                'The cluster looks balanced for this capture.</p>')
    rows = []
    for s in suspects:
        ev = s.get("evidence") or {}
        score = float(s.get("score", 0.0))
        kind = str(s.get("kind", "unknown"))
        rows.append(
            f"<tr><td class='num big'>{_e(s.get('rank'))}</td>"
            f"<td><span class='score'><i style='width:{score * 100:.0f}%'></i></span>{score:.2f}</td>"
            f"<td><span class='pill' style='background:{KIND_COLORS.get(kind, '#7a8599')}'>{_e(kind)}</span></td>"
            f"<td>{_e(s.get('hostname') or '-')}</td><td>{_e(ev.get('summary', ''))}</td>"
            f"<td>{_link(s.get('rank_dir'), base, Path(str(s.get('rank_dir'))).name if s.get('rank_dir') else None)}"
            "</td></tr>")
    return ("<table><thead><tr><th>rank</th><th>score</th><th>kind</th><th>host</th><th>evidence</th>"
            f"<th>rank dir (open in MindStudio Insight / Perfetto)</th></tr></thead><tbody>{''.join(rows)}</tbody>"
            "</table>")


def _recipes_table(recipes: Mapping[str, Mapping[str, Any]], base: Path | None) -> str:
    if not recipes:
        return '<p class="muted">No recipe ran.</p>'
    rows = []
    for name, r in recipes.items():
        tail = r.get("log_tail") or ""
        extra = f"<details><summary>log tail</summary><pre>{_e(tail)}</pre></details>" if tail else ""
        out = _link(r.get("output_dir"), base, "output") if r.get("output_dir") else ""
        dur = r.get("duration_s") or 0.0
        rows.append(f"<tr><td class='nw'><code>{_e(name)}</code></td><td>{_pill(str(r.get('status')))}</td>"
                    f"<td>{_e(r.get('detail', ''))}{extra}</td><td class='num'>{dur:.1f} s</td>"
                    f"<td class='nw'>{out}</td></tr>")
    return ("<table><thead><tr><th>recipe</th><th>status</th><th>detail</th><th>time</th><th></th></tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table>")


def render_html(data: Mapping[str, Any], summaries: Sequence[RankStepSummary], *, base: Path | None = None,
                generated: str = "") -> str:
    """The whole report page as one string (no external assets).

    Args:
        data: the ``io.profwatch.suspect_ranks.v1`` data (``daemon.core.alerts.suspect_alert_data``).
        summaries: per-(rank, step) rows (µs) for the charts.
        base: folder the page will live in (links are made relative to it).
        generated: timestamp text for the header.
    """
    suspects = list(data.get("suspects") or [])
    sus_ranks = [int(s["rank"]) for s in suspects]
    paths = dict(data.get("paths") or {})
    status = str(data.get("status", ""))
    n_ranks = len({s.rank for s in summaries}) or data.get("world_size") or "?"
    head = (f"<header><h1>profwatch &middot; batch {_e(data.get('batch_id'))} {_pill(status)}</h1><div class='meta'>"
            f"<span>job {_e(data.get('job_id') or '-')}</span><span>{_e(data.get('kind'))}</span>"
            f"<span>{_e(n_ranks)} ranks</span><span>capture reason: {_e(data.get('capture_reason') or '-')}</span>"
            f"<span>{_e(generated)}</span></div></header>")
    top = ""
    if suspects:
        s0 = suspects[0]
        top = (f"<p class='summary'>Top suspect: <b>rank {_e(s0['rank'])}</b> on <b>{_e(s0.get('hostname') or '?')}"
               f"</b> ({_e(s0.get('kind'))}, score {float(s0.get('score', 0)):.2f}) &mdash; "
               f"{_e((s0.get('evidence') or {}).get('summary', ''))}</p>")
    links = [("advisor report (HTML)", paths.get("advisor_html")), ("analysis outputs", paths.get("outputs")),
             ("staged batch", paths.get("staging")), ("report.json", paths.get("report_json"))]
    link_rows = "".join(f"<tr><td>{_e(n)}</td><td>{_link(p, base)}</td></tr>" for n, p in links if p)
    advisor = data.get("advisor") or {}
    problems = advisor.get("problems") or []
    adv_html = ""
    if problems:
        adv_html = "<ul>" + "".join(f"<li><b>{_e(p.get('category'))}</b>: {_e(p.get('description'))}</li>"
                                    for p in problems[:12]) + "</ul>"
    notes = data.get("notes") or []
    notes_html = ("<ul>" + "".join(f"<li>{_e(n)}</li>" for n in notes) + "</ul>") if notes else ""
    body = f"""<main>
<section class="card"><h2>Suspect ranks</h2>{top}{_suspects_table(suspects, base)}</section>
<section class="card"><h2>Per-rank time breakdown <span class="muted">(median over steps)</span></h2>
{render_bars(summaries, sus_ranks)}</section>
<section class="card"><h2>Rank &times; step</h2><div class="grid">
<div>{render_heatmap(summaries, "step_time_us", "Step time", sus_ranks)}</div>
<div>{render_heatmap(summaries, "own_us", "Own work (computation + free): what peers wait for", sus_ranks)}</div>
</div></section>
<section class="card"><h2>Analysis recipes</h2>{_recipes_table(data.get("recipes") or {}, base)}</section>
<section class="card"><h2>Links</h2><table><tbody>{link_rows or '<tr><td class="muted">none</td></tr>'}</tbody></table>
{('<h3 style="font-size:14px">Advisor findings</h3>' + adv_html) if adv_html else ''}
{('<h3 style="font-size:14px">Notes</h3>' + notes_html) if notes_html else ''}</section>
</main>"""
    return (f"<!doctype html><html lang='en'><head><meta charset='utf-8'><meta name='viewport' "
            f"content='width=device-width,initial-scale=1'><title>profwatch batch {_e(data.get('batch_id'))}</title>"
            f"<style>{CSS}</style></head><body>{head}{body}</body></html>")


def write_report(out_dir: Path, data: Mapping[str, Any], summaries: Sequence[RankStepSummary], *,
                 html_enabled: bool = True, generated: str = "") -> tuple[Path, Path | None]:
    """Write ``report.json`` (``data`` plus the raw per-step rows) and ``report.html`` into ``out_dir``.

    Returns ``(json_path, html_path or None)``. Files are written to a temp name and renamed (no torn reads).
    Raises OSError when ``out_dir`` is not writable.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / "report.json"
    doc = dict(data)
    doc["summaries"] = [
        {"rank": s.rank, "step": s.step, "step_time_us": s.step_time_us, "computation_us": s.computation_us,
         "communication_us": s.communication_us, "wait_us": s.wait_us, "transmit_us": s.transmit_us,
         "free_us": s.free_us} for s in summaries]
    _atomic_write(json_path, json.dumps(doc, indent=1, default=str))
    html_path = None
    if html_enabled:
        html_path = out_dir / "report.html"
        _atomic_write(html_path, render_html(data, summaries, base=out_dir, generated=generated))
    return json_path, html_path


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
