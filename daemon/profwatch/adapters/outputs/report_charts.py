"""Plotly figures of the batch report and the plotly.js bundle to inline (wraps plotly; no file writes).

The figure is built with ``plotly.graph_objects`` (which validates every attribute name, so a typo fails here
rather than being silently ignored by plotly.js) and handed to the page as JSON; plotly.js draws it in the browser
(hover, zoom). The page's own script (``templates/report.js``) bins ranks to about two pixels each when a view
holds more ranks than the chart has pixels, keeping each bin's largest value, and re-bins on zoom: at 4096 ranks a
slow rank is never averaged or drawn away. Plotly: https://plotly.com/python/ (MIT).
"""

from __future__ import annotations

import html
from functools import lru_cache
from typing import Any

import plotly
import plotly.graph_objects as go
from plotly.offline import get_plotlyjs
from plotly.subplots import make_subplots

from profwatch.core.verdict.report_view import ReportView

DIVERGING = [[0.0, "#2166ac"], [0.35, "#92c5de"], [0.5, "#f7f7f7"], [0.65, "#f4a582"], [1.0, "#b2182b"]]
"""Blue (less own work than the peer median) - white (as the peers) - red (more: the others wait for it)."""
GRADE_STYLE = {"strong": {"color": "#c0171d", "symbol": "triangle-down", "size": 17},
               "weak": {"color": "#b7791f", "symbol": "triangle-down-open", "size": 13}}
WAIT_COLOR = "#e8833a"
FONT = "-apple-system, 'Segoe UI', Roboto, Helvetica, Arial, sans-serif"
_TOP_PX, _WAIT_PX, _GAP_PX, _MARGIN_PX = 320, 150, 64, 110


PLOTLY_ASSET = f"plotly-{plotly.__version__}.min.js"
"""File name of the shared plotly.js bundle beside the report folders (the version in the name: reports written
by another plotly keep loading their own)."""


@lru_cache(maxsize=1)
def plotly_bundle() -> str:
    """The plotly.js bundle shipped inside the plotly package (minified, ~4.8 MB), as the shared file holds it."""
    return get_plotlyjs()


@lru_cache(maxsize=1)
def plotly_js() -> str:
    """The plotly.js bundle shipped inside the plotly package (minified, ~4.8 MB), safe to inline in ``<script>``."""
    return plotly_bundle().replace("</script", "<\\/script")


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 3)


def rank_figure(view: ReportView) -> dict[str, Any] | None:
    """The per-rank chart as a plotly figure dict (``{"data": [...], "layout": {...}}``), None without rank rows.

    Rows, all sharing the rank axis: (1) own work minus the peer median per rank (bars coloured by the same
    difference, suspects marked above their bar, graded), (2) the wait each rank causes its peers, (3) the
    own-work difference per rank and step (heat map). Values in ms; hover shows each rank's and step's numbers.
    Trace ``meta`` tells the page script how to bin it (``absmax``, ``max``, ``heat``) or not (``keep``).
    """
    rows = view.ranks
    if not rows:
        return None
    m = view.matrix
    n_steps = max(1, len(m.steps))
    heat_px = min(420, 44 + 26 * n_steps)
    total = _TOP_PX + _WAIT_PX + heat_px + 2 * _GAP_PX
    fig = make_subplots(rows=3, cols=1, shared_xaxes=True, vertical_spacing=_GAP_PX / total,
                        row_heights=[_TOP_PX / total, _WAIT_PX / total, heat_px / total],
                        subplot_titles=("Own work (computation + free) minus the peer median, per step: "
                                        "red = the others wait for it",
                                        "Wait it causes: how long each peer waits for it per step",
                                        "Own work minus the peer median, per rank and step"))
    lim = view.colour_limit_ms
    ranks = [r.rank for r in rows]
    fig.add_trace(go.Bar(
        x=ranks, y=[_r(r.own_delta_ms) for r in rows], meta="absmax", name="own work - peer median",
        marker={"color": [_r(r.own_delta_ms) for r in rows], "colorscale": DIVERGING, "cmin": -lim, "cmax": lim,
                "line": {"width": 0}},
        customdata=[[r.rank, _r(r.own_ms), _r(r.peer_own_ms), _r(r.computation_ms), _r(r.free_ms),
                     _r(r.wait_caused_ms), r.steps] for r in rows],
        text=[""] * len(rows), textposition="none",
        hovertemplate=("<b>rank %{customdata[0]}</b>%{text}<br>own work %{customdata[1]:.1f} ms vs peer median "
                       "%{customdata[2]:.1f} ms<br>difference <b>%{y:+.1f} ms</b> per step<br>computation "
                       "%{customdata[3]:.1f} ms, free %{customdata[4]:.1f} ms<br>peers wait for it "
                       "%{customdata[5]:.1f} ms per step (median of %{customdata[6]} steps)<extra></extra>")),
        row=1, col=1)
    pad = 0.06 * max(lim, max((abs(r.own_delta_ms) for r in rows), default=0.0))
    for grade in ("weak", "strong"):
        sus = [s for s in view.suspects if s.grade == grade]
        if not sus:
            continue
        st = GRADE_STYLE[grade]
        fig.add_trace(go.Scatter(
            x=[s.rank for s in sus], y=[_r(max(0.0, s.row.own_delta_ms if s.row else 0.0) + pad) for s in sus],
            mode="markers+text", meta="keep", uid=f"pw{grade}", name=f"{grade} suspect",
            text=[f"rank {s.rank}" for s in sus], textposition="top center", cliponaxis=False,
            textfont={"color": st["color"], "size": 13 if grade == "strong" else 12},
            marker={"symbol": st["symbol"], "size": st["size"], "color": st["color"],
                    "opacity": [round(0.45 + 0.55 * s.score, 3) for s in sus], "line": {"width": 2,
                                                                                      "color": st["color"]}},
            # plotly.js reads a few tags (<b>, <br>, <a>) in hover text: data strings go in entity-escaped
            customdata=[[s.position, s.score, html.escape(s.kind), html.escape(s.hostname or "-")] for s in sus],
            hovertemplate=(f"<b>suspect #%{{customdata[0]}}: %{{text}}</b> ({grade})<br>score "
                           "%{customdata[1]:.2f}, %{customdata[2]}, host %{customdata[3]}<extra></extra>")),
            row=1, col=1)
    fig.add_trace(go.Bar(
        x=ranks, y=[_r(r.wait_caused_ms) for r in rows], meta="max", name="wait caused",
        marker={"color": WAIT_COLOR, "line": {"width": 0}}, text=[""] * len(rows), textposition="none",
        customdata=[[r.rank, _r(r.wait_ms)] for r in rows],
        hovertemplate=("<b>rank %{customdata[0]}</b>%{text}<br>each peer waits <b>%{y:.1f} ms</b> per step for it"
                       "<br>it waits %{customdata[1]:.1f} ms itself<extra></extra>")),
        row=2, col=1)
    fig.add_trace(go.Heatmap(
        x=m.ranks, y=[f"step {s}" for s in m.steps], z=[[_r(v) for v in line] for line in m.delta_ms],
        meta="heat", zmin=-lim, zmax=lim, zmid=0, colorscale=DIVERGING, hoverongaps=False, name="per step",
        customdata=[[[k, _r(o), _r(p)] for k, o, p in zip(m.ranks, own, peer, strict=True)]
                    for own, peer in zip(m.own_ms, m.peer_ms, strict=True)],
        text=[[""] * len(m.ranks) for _ in m.steps],
        colorbar={"title": {"text": "ms vs<br>peers", "side": "top"}, "thickness": 12, "lenmode": "pixels",
                  "len": heat_px, "y": 0, "yanchor": "bottom", "outlinewidth": 0},
        hovertemplate=("<b>rank %{customdata[0]}, %{y}</b>%{text}<br>own work %{customdata[1]:.1f} ms vs peer "
                       "median %{customdata[2]:.1f} ms<br>difference <b>%{z:+.1f} ms</b><extra></extra>")),
        row=3, col=1)
    axis = {"showline": True, "linecolor": "#9aa3b2", "ticks": "outside", "tickcolor": "#9aa3b2",
            "gridcolor": "#eceef2", "zeroline": False, "fixedrange": True, "automargin": True,
            "title": {"font": {"size": 13}}, "tickfont": {"size": 12}}
    x_axis = {**axis, "fixedrange": False, "tickformat": "d", "showspikes": False}
    if len(ranks) <= 40:
        x_axis["dtick"] = 1
    fig.update_xaxes(**x_axis)
    fig.update_xaxes(title={"text": "rank", "font": {"size": 13}}, row=3, col=1)
    fig.update_yaxes(**axis)
    fig.update_yaxes(title={"text": "ms per step"}, zeroline=True, zerolinecolor="#9aa3b2", rangemode="tozero",
                     row=1, col=1)
    fig.update_yaxes(title={"text": "ms per step"}, rangemode="tozero", row=2, col=1)
    fig.update_yaxes(title={"text": "step"}, autorange="reversed", showgrid=False, row=3, col=1)
    fig.update_annotations(font={"size": 13, "color": "#1d2433"}, xanchor="left", x=0)
    fig.update_layout(
        height=total + _MARGIN_PX, margin={"l": 70, "r": 30, "t": 36, "b": 56}, showlegend=False,
        bargap=0.15, dragmode="zoom", hovermode="closest", plot_bgcolor="#ffffff", paper_bgcolor="#ffffff",
        font={"family": FONT, "size": 13, "color": "#1d2433"},
        hoverlabel={"font": {"family": FONT, "size": 13}, "align": "left"})
    out: dict[str, Any] = fig.to_plotly_json()
    return out
