"""The dashboard pages: one self-contained HTML file (plotly.js embedded, opens offline).

:func:`write_dashboard` lays out a summary table and the comparison bars, optionally a sweep, and
per schedule its timeline, memory per rank and link utilisation; :func:`write_overlay` the
measured-vs-simulated page.
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd
import plotly.graph_objects as go

from .. import atomic
from ..metrics import time_breakdown
from .compare import comparison_figure, sweep_figure
from .overlay import difference_figure, overlay_figure
from .style import MS, PLOT_CONFIG
from .tables import kinds_legend_html, summary_table_html, sweep_table_html
from .timeline import link_figure, memory_figure, timeline_figure

if TYPE_CHECKING:
    from ..metrics import Report

_STYLE = """
:root { --ink:#1f2430; --muted:#5c6475; --line:#e3e7ee; --card:#ffffff; --bg:#f4f6f9; --accent:#1F3A5F; }
* { box-sizing: border-box; }
body { font-family: Inter, system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 0;
       color: var(--ink); background: var(--bg); }
header { background: var(--accent); color: white; padding: 22px 32px 16px; }
header h1 { font-size: 24px; margin: 0 0 6px; font-weight: 650; letter-spacing: .2px; }
header p { margin: 2px 0; color: #d7dfeb; font-size: 13.5px; max-width: 1200px; }
nav { position: sticky; top: 0; z-index: 10; background: white; border-bottom: 1px solid var(--line);
      padding: 8px 32px; font-size: 13px; }
nav a { color: var(--accent); text-decoration: none; margin-right: 18px; font-weight: 550; }
nav a:hover { text-decoration: underline; }
main { padding: 18px 32px 40px; max-width: 1500px; }
section { background: var(--card); border: 1px solid var(--line); border-radius: 10px;
          padding: 14px 18px; margin: 16px 0; box-shadow: 0 1px 2px rgba(20,30,50,.04); }
section h2 { font-size: 17px; margin: 4px 0 8px; }
section p.note { color: var(--muted); font-size: 12.5px; margin: 0 0 6px; }
.kinds { display: flex; flex-wrap: wrap; gap: 6px 16px; font-size: 12.5px; color: var(--muted); margin: 6px 0 2px; }
.kinds span.chip { display: inline-block; width: 12px; height: 12px; border-radius: 3px; margin-right: 5px;
                   vertical-align: -2px; }
table.summary { border-collapse: collapse; width: 100%; font-size: 13.5px; font-variant-numeric: tabular-nums; }
table.summary th { text-align: right; color: var(--muted); font-weight: 600; padding: 6px 10px;
                   border-bottom: 2px solid var(--line); white-space: nowrap; }
table.summary td { text-align: right; padding: 6px 10px; border-bottom: 1px solid var(--line); }
table.summary th:first-child, table.summary td:first-child { text-align: left; font-weight: 600; }
table.summary tr:hover td { background: #f7f9fc; }
td.best { color: #11734b; font-weight: 650; }
td.bad { color: #C0392B; font-weight: 650; }
.grid2 { display: grid; grid-template-columns: 1fr 1fr; gap: 12px; }
@media (max-width: 1100px) { .grid2 { grid-template-columns: 1fr; } }
"""


@dataclass
class Panel:
    """One schedule's data for the dashboard: its report, trace and memory timeline."""

    report: Report
    trace: pd.DataFrame
    memory: pd.DataFrame


@dataclass
class Sweep:
    """A sweep to draw: ``rows`` as :func:`sweep_figure` takes them, the swept ``field`` and
    the pipeline ranks ``pp`` (for the formula line of a microbatch sweep)."""

    rows: pd.DataFrame
    field: str
    pp: int | None = None


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text.lower()).strip("-") or "x"


def dashboard_figures(panels: list[Panel], sweep: Sweep | None = None) -> list[tuple[str, str, go.Figure]]:
    """Every figure of the dashboard, in page order, as (section id, heading, figure)."""
    reports = [p.report for p in panels]
    figs: list[tuple[str, str, go.Figure]] = []
    if sweep is not None:
        figs.append(("sweep", f"sweep over {sweep.field}", sweep_figure(sweep.rows, sweep.field, sweep.pp)))
    if panels:
        figs.append(("compare", "schedules compared", comparison_figure(reports, [time_breakdown(p.report, p.trace) for p in panels])))
    x_max = max((r.step_time_s for r in reports), default=0.0) * MS * 1.01 or None
    for p in panels:
        name = p.report.schedule
        sid = f"s-{_slug(name)}"
        figs.append((sid, f"{name}: timeline", timeline_figure(p.trace, f"{name}: timeline", x_max)))
        figs.append((sid, f"{name}: memory per rank",
                     memory_figure(p.memory, p.report.hbm_bytes, f"{name}: memory per rank", x_max)))
        link = link_figure(p.trace, p.report.step_time_s, f"{name}: link utilisation")
        if link is not None:
            figs.append((sid, f"{name}: link utilisation", link))
    return figs


def _page(title: str, meta: list[str], nav: list[tuple[str, str]], body: list[str]) -> str:
    links = "".join(f"<a href='#{i}'>{html.escape(t)}</a>" for i, t in nav)
    metas = "".join(f"<p>{html.escape(m)}</p>" for m in meta if m)
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><meta name='generator' content='simtrain'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body>"
        f"<header><h1>{html.escape(title)}</h1>{metas}</header><nav>{links}</nav><main>"
        + "\n".join(body) + "</main></body></html>"
    )


def _manifest(traces: dict[str, int]) -> str:
    """A JSON script block naming each figure's div and its number of traces (for checks)."""
    return ("<script type='application/json' id='simtrain-manifest'>"
            + json.dumps({"figures": traces}) + "</script>")


def _figure_html(fig: go.Figure, div_id: str, first: bool) -> str:
    return fig.to_html(full_html=False, include_plotlyjs=first, div_id=div_id, config=PLOT_CONFIG)


def write_dashboard(path: Path, panels: list[Panel], title: str, subtitle: str = "", source: str = "",
                    sweep: Sweep | None = None) -> Path:
    """Write the comparison dashboard as one self-contained HTML file (plotly.js embedded).

    Args:
        path: HTML file to write (parent folders are created).
        panels: one :class:`Panel` per schedule (the comparison at the scenario's own settings).
        title, subtitle: page heading and a line of context (model, hardware, parallelism).
        source: where the setting comes from (shown under the heading).
        sweep: an optional :class:`Sweep`, drawn above the comparison.

    Returns:
        The path written.
    """
    reports = [p.report for p in panels]
    figs = dashboard_figures(panels, sweep)
    kinds = set().union(*(set(p.trace["kind"]) for p in panels)) if panels else set()
    nav = []
    body = []
    if sweep is not None:
        nav.append(("sweep", f"sweep over {sweep.field}"))
    nav.append(("summary", "summary"))
    nav += [(f"s-{_slug(p.report.schedule)}", p.report.schedule) for p in panels]
    first = True
    sections: dict[str, list[str]] = {}
    for i, (sid, _heading, fig) in enumerate(figs):
        sections.setdefault(sid, []).append(_figure_html(fig, f"fig-{i}", first))
        first = False
    body.append(_manifest({f"fig-{i}": len(fig.data) for i, (_s, _h, fig) in enumerate(figs)}))
    if sweep is not None:
        body.append("<section id='sweep'><h2>Sweep over " + html.escape(sweep.field) + "</h2>"
                    "<p class='note'>One line per schedule; points that could not be simulated are left out "
                    "(see the table).</p>" + "".join(sections.get("sweep", []))
                    + sweep_table_html(sweep.rows, sweep.field) + "</section>")
    if panels:
        note = ("Step time is split, per rank on average, into compute by kind, communication the rank waits on "
                "(exposed), and the rest of the idle time, the pipeline bubble. Bubble = that idle time / step time; "
                "exposed communication is its own bar.")
        body.append("<section id='summary'><h2>Summary</h2>" + summary_table_html(reports)
                    + kinds_legend_html(kinds | {"exposed comm", "idle"}) + "</section>")
        body.append(f"<section id='compare'><p class='note'>{html.escape(note)}</p>"
                    + "".join(sections.get("compare", [])) + "</section>")
    for p in panels:
        sid = f"s-{_slug(p.report.schedule)}"
        body.append(f"<section id='{sid}'><h2>{html.escape(p.report.schedule)}</h2>"
                    "<p class='note'>Drag to zoom, double-click to reset; click a legend entry to hide a kind. "
                    "Numbers on bars are microbatches.</p>" + "".join(sections.get(sid, [])) + "</section>")
    page = _page(title, [subtitle, f"Source: {source}" if source else ""], nav, body)
    return atomic.write_text(Path(path), page)


def write_overlay(path: Path, measured: pd.DataFrame, simulated: pd.DataFrame, diffs: pd.DataFrame,
                  summary: dict, title: str, subtitle: str = "") -> Path:
    """Write the measured-vs-simulated page: a summary, the overlaid timeline, per-action
    differences and their table.

    Args:
        path: HTML file to write.
        measured: measured actions (see :mod:`simtrain.measured`).
        simulated: the engine trace of the simulated step.
        diffs: :func:`simtrain.overlay.action_differences`.
        summary: :func:`simtrain.overlay.overlay_summary` (seconds).
        title, subtitle: heading and context line.

    Returns:
        The path written.
    """
    span = summary
    rows = "".join(
        f"<tr><td>{html.escape(k)}</td><td>{v['measured_s'] * MS:,.3f}</td><td>{v['simulated_s'] * MS:,.3f}</td>"
        f"<td>{v['mean_abs_diff_s'] * MS:,.3f}</td><td>{v['count']}</td></tr>"
        for k, v in span["per_kind"].items()
    )
    table = ("<table class='summary'><tr><th>kind</th><th>mean measured (ms)</th><th>mean simulated (ms)</th>"
             "<th>mean |difference| (ms)</th><th>actions</th></tr>" + rows + "</table>")
    head = (f"<p class='note'>Measured step (first to last action): {span['measured_span_s'] * MS:,.3f} ms; "
            f"simulated: {span['simulated_span_s'] * MS:,.3f} ms "
            f"({span['span_error']:+.1%}). Matched {span['matched']} actions.</p>")
    figs = [overlay_figure(measured, simulated, "measured vs simulated, rank by rank")]
    if not diffs.empty:
        figs.append(difference_figure(diffs))
    body = [f"<section id='summary'><h2>Summary</h2>{head}{table}"
            f"{kinds_legend_html(set(measured['kind']) | set(simulated['kind']))}</section>",
            _manifest({f"fig-{i}": len(f.data) for i, f in enumerate(figs)})]
    body.append("<section id='timeline'>" + _figure_html(figs[0], "fig-0", True) + "</section>")
    if len(figs) > 1:
        body.append("<section id='differences'>" + _figure_html(figs[1], "fig-1", False) + "</section>")
    page = _page(title, [subtitle], [("summary", "summary"), ("timeline", "timeline"),
                                     ("differences", "differences")], body)
    return atomic.write_text(Path(path), page)
