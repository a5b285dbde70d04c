"""Plotly views of traces and reports: timelines, memory over time, comparison bars.

Input is the trace and memory DataFrames of :mod:`simtrain.engine` and :class:`Report` objects;
nothing here knows about SimPy or schedules. :func:`write_dashboard` writes one self-contained
HTML file (plotly.js embedded, opens offline). Times are shown in milliseconds and memory in GiB.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .metrics import Report

GiB = 2**30
MS = 1e3

KIND_COLORS = {
    "F": "#4C78A8",
    "B": "#E45756",
    "I": "#F58518",
    "W": "#54A24B",
    "F&B": "#B279A2",
    "OPT": "#9D755D",
    "p2p": "#72B7B2",
    "tp": "#EECA3B",
    "dp": "#BAB0AC",
    "a2a": "#FF9DA6",
}
"""One colour per kind, the same in every figure."""

KIND_NAMES = {
    "F": "F (forward)",
    "B": "B (backward)",
    "I": "I (backward for inputs)",
    "W": "W (backward for weights)",
    "F&B": "F&B (overlapped pair)",
    "OPT": "optimizer step",
    "p2p": "p2p send/recv",
    "tp": "TP collectives",
    "dp": "DP gradient reduce",
    "a2a": "EP all-to-all",
}


@dataclass
class Panel:
    """One schedule's data for the dashboard: its report, trace and memory timeline."""

    report: Report
    trace: pd.DataFrame
    memory: pd.DataFrame


def color_of(kind: str) -> str:
    """Colour of a task kind (grey for unknown kinds)."""
    return KIND_COLORS.get(kind, "#888888")


def timeline_figure(trace: pd.DataFrame, title: str = "") -> go.Figure:
    """Gantt timeline: one compute and one communication lane per rank, a bar per task.

    Args:
        trace: the engine trace (columns of :data:`simtrain.engine.TRACE_COLUMNS`).
        title: figure title.

    Returns:
        A figure with one bar trace per kind (legend toggles a kind), microbatch numbers on
        compute bars, and hover text with name, start, end, duration and bytes.
    """
    fig = go.Figure()
    ranks = sorted(trace["rank"].unique())
    lanes = []
    for r in ranks:
        lanes += [f"rank {r} compute", f"rank {r} comm"]
    for kind, rows in trace.groupby("kind", sort=False):
        lane = [f"rank {r} {'compute' if c == 'compute' else 'comm'}" for r, c in zip(rows["rank"], rows["category"])]
        dur = (rows["end_s"] - rows["start_s"]) * MS
        text = [
            "" if pd.isna(mb) or cat != "compute" else str(int(mb))
            for mb, cat in zip(rows["microbatch"], rows["category"])
        ]
        hover = [
            f"{html.escape(str(n))}<br>rank {r}<br>start {s * MS:.3f} ms<br>end {e * MS:.3f} ms"
            f"<br>duration {(e - s) * MS:.3f} ms" + (f"<br>{b / 1e6:.2f} MB" if b else "")
            for n, r, s, e, b in zip(rows["name"], rows["rank"], rows["start_s"], rows["end_s"], rows["bytes"])
        ]
        fig.add_trace(go.Bar(
            name=KIND_NAMES.get(kind, kind), legendgroup=kind, orientation="h",
            y=lane, x=dur, base=rows["start_s"] * MS, marker_color=color_of(kind),
            marker_line_width=0.5, marker_line_color="white", text=text, textposition="inside",
            insidetextanchor="middle", hovertext=hover, hoverinfo="text",
        ))
    fig.update_layout(
        title=title, barmode="overlay", xaxis_title="time (ms)", bargap=0.15,
        height=max(260, 48 * len(lanes) + 120), legend_title_text="kind",
        yaxis=dict(categoryorder="array", categoryarray=lanes[::-1]),
    )
    return fig


def memory_figure(memory: pd.DataFrame, hbm_bytes: float, title: str = "") -> go.Figure:
    """Memory per rank over the step (step lines), with the HBM capacity as a dashed line."""
    fig = go.Figure()
    for r, rows in memory.groupby("rank"):
        rows = rows.sort_values("time_s", kind="stable")
        fig.add_trace(go.Scatter(
            x=rows["time_s"] * MS, y=rows["bytes"] / GiB, mode="lines", line_shape="hv",
            name=f"rank {r}",
        ))
    fig.add_hline(y=hbm_bytes / GiB, line_dash="dash", line_color="red", annotation_text="HBM")
    fig.update_layout(title=title, xaxis_title="time (ms)", yaxis_title="memory (GiB)", height=360)
    return fig


def comparison_figure(reports: list[Report]) -> go.Figure:
    """Bars per schedule: step time, bubble ratio, exposed communication, peak memory vs HBM, and
    (when any schedule has EP all-to-all) the exposed all-to-all."""
    names = [r.schedule for r in reports]
    ep = any(r.a2a_s > 0 for r in reports)
    titles = ("step time (ms)", "bubble ratio", "exposed comm (ms)", "peak memory (GiB)")
    fig = make_subplots(rows=1, cols=5 if ep else 4, subplot_titles=titles + (
        ("exposed all-to-all (ms)",) if ep else ()))
    colors = ["#4C78A8", "#F58518", "#54A24B", "#E45756", "#72B7B2", "#B279A2", "#EECA3B", "#9D755D"]
    bar_colors = [colors[i % len(colors)] for i in range(len(names))]
    values = [
        [r.step_time_s * MS for r in reports],
        [r.bubble_ratio for r in reports],
        [r.exposed_comm_s * MS for r in reports],
        [max(r.peak_memory_bytes) / GiB for r in reports],
    ]
    if ep:
        values.append([r.exposed_a2a_s * MS for r in reports])
    for col, vals in enumerate(values, start=1):
        fig.add_trace(go.Bar(x=names, y=vals, marker_color=bar_colors, showlegend=False), row=1, col=col)
    if reports:
        fig.add_hline(y=reports[0].hbm_bytes / GiB, line_dash="dash", line_color="red", row=1, col=4,
                      annotation_text="HBM")
    fig.update_layout(height=360, title="schedules compared")
    return fig


def summary_table_html(reports: list[Report]) -> str:
    """An HTML table of the headline numbers, one row per schedule."""
    head = ("schedule", "step time (ms)", "bubble", "exposed comm (ms)", "overlap",
            "peak memory (GiB)", "fits in HBM", "peak in-flight", "MFU", "tokens/s")
    ep = any(r.a2a_s > 0 for r in reports)
    if ep:
        head += ("all-to-all (ms)", "exposed all-to-all (ms)", "EP share", "link utilisation")
    rows = []
    for r in reports:
        cells = (
            r.schedule, f"{r.step_time_s * MS:.2f}", f"{r.bubble_ratio:.1%}",
            f"{r.exposed_comm_s * MS:.2f}", "–" if r.overlap_ratio is None else f"{r.overlap_ratio:.1%}",
            f"{max(r.peak_memory_bytes) / GiB:.1f}", "yes" if r.fits_in_hbm else "NO",
            str(max(r.peak_inflight_microbatches)), "–" if r.mfu is None else f"{r.mfu:.1%}",
            f"{r.tokens_per_s:,.0f}",
        )
        if ep:
            links = ", ".join(f"{k} {v:.0%}" for k, v in (r.link_utilisation or {}).items())
            cells += (f"{r.a2a_s * MS:.2f}", f"{r.exposed_a2a_s * MS:.2f}", f"{r.ep_share:.1%}", links)
        rows.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
    header = "<tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>"
    return f"<table class='summary'>{header}{''.join(rows)}</table>"


_STYLE = """
body { font-family: system-ui, sans-serif; margin: 24px; color: #222; }
h1 { font-size: 22px; margin-bottom: 4px; } h2 { font-size: 18px; margin-top: 28px; }
p.meta { color: #555; margin-top: 0; }
table.summary { border-collapse: collapse; margin: 12px 0; }
table.summary th, table.summary td { border: 1px solid #ccc; padding: 4px 10px; text-align: right; }
table.summary th:first-child, table.summary td:first-child { text-align: left; }
"""


def write_dashboard(path: Path, panels: list[Panel], title: str, subtitle: str = "") -> Path:
    """Write the comparison dashboard: summary table, bars, and per schedule its timeline and memory.

    Args:
        path: HTML file to write (parent folders are created).
        panels: one :class:`Panel` per schedule.
        title, subtitle: page heading and a line of context (model, hardware, parallelism).

    Returns:
        The path written.
    """
    reports = [p.report for p in panels]
    figures = [comparison_figure(reports)]
    for p in panels:
        figures.append(timeline_figure(p.trace, f"{p.report.schedule}: timeline"))
        figures.append(memory_figure(p.memory, p.report.hbm_bytes, f"{p.report.schedule}: memory per rank"))
    parts = [
        f"<html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
        f"<style>{_STYLE}</style></head><body>",
        f"<h1>{html.escape(title)}</h1><p class='meta'>{html.escape(subtitle)}</p>",
        summary_table_html(reports),
    ]
    for i, fig in enumerate(figures):
        parts.append(fig.to_html(full_html=False, include_plotlyjs=(i == 0)))
    parts.append("</body></html>")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(parts))
    return path
