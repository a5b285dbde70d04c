"""Measured vs simulated: the overlaid timeline and the per-action differences."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .style import MS, color_of, name_of, sorted_kinds, style_figure

def overlay_figure(measured: pd.DataFrame, simulated: pd.DataFrame, title: str = "") -> go.Figure:
    """One timeline with, per rank, the measured lane above the simulated lane(s).

    Args:
        measured: measured actions (columns of the engine trace; see :mod:`simtrain.measured`).
        simulated: the engine trace of the same schedule.
        title: figure title.

    Returns:
        A figure whose rows are ``rank r · measured`` (compute actions, with torch's send/recv
        and other actions as thin bars) and ``rank r · simulated`` (compute) and, when there is
        simulated communication, ``rank r · simulated comm``. One legend entry per kind toggles
        that kind in both.
    """
    data = []
    for source, df in (("measured", measured), ("simulated", simulated)):
        if df.empty:
            continue
        lane = df["category"].map(lambda c, s=source: s if c == "compute" or s == "measured" else f"{s} comm")
        data.append(df.assign(_y=[f"rank {int(r)} · {ln}" for r, ln in zip(df["rank"], lane)], _src=source))
    both = pd.concat(data, ignore_index=True)
    ranks = sorted(int(r) for r in both["rank"].unique())
    rows = []
    for r in ranks:
        for ln in ("measured", "simulated", "simulated comm"):
            if (both["_y"] == f"rank {r} · {ln}").any():
                rows.append(f"rank {r} · {ln}")
    fig = go.Figure()
    shown: set[str] = set()
    for kind in sorted_kinds(both["kind"]):
        for source in ("measured", "simulated"):
            for is_compute in (True, False):
                part = both[(both["kind"] == kind) & (both["_src"] == source) & ((both["category"] == "compute") == is_compute)]
                if part.empty:
                    continue
                dur = (part["end_s"] - part["start_s"]) * MS
                fig.add_trace(go.Bar(
                    name=name_of(kind), legendgroup=kind, showlegend=kind not in shown, orientation="h",
                    y=part["_y"], x=dur, base=part["start_s"] * MS, width=0.8 if is_compute else 0.35,
                    marker=dict(color=color_of(kind), opacity=1.0 if source == "measured" else 0.75,
                                line=dict(width=0.4, color="white")),
                    text=["" if pd.isna(mb) or not is_compute else str(int(mb)) for mb in part["microbatch"]],
                    textposition="inside", insidetextanchor="middle", textangle=0, textfont=dict(color="white", size=10),
                    customdata=list(zip(part["name"].astype(str), part["_y"], part["start_s"] * MS, part["end_s"] * MS, dur)),
                    hovertemplate="<b>%{customdata[0]}</b><br>%{customdata[1]}<br>%{customdata[2]:.3f} → "
                                  "%{customdata[3]:.3f} ms (%{customdata[4]:.3f} ms)<extra></extra>",
                ))
                shown.add(kind)
    reversed_rows = rows[::-1]
    style_figure(fig, title, max(260, 30 * len(rows) + 140))
    fig.update_layout(barmode="overlay", uniformtext=dict(minsize=8, mode="hide"),
                      legend=dict(orientation="h", yanchor="bottom", y=1.0, xanchor="right", x=1),
                      xaxis_title="time since the first action (ms)",
                      yaxis=dict(categoryorder="array", categoryarray=reversed_rows))
    return fig


def difference_figure(diffs: pd.DataFrame) -> go.Figure:
    """Per action, measured minus simulated: duration (top) and start time (bottom), in ms.

    Args:
        diffs: rows of :func:`simtrain.overlay.action_differences` (``label``, ``kind``,
            ``duration_diff_s``, ``start_diff_s``), in measured start order.
    """
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08, subplot_titles=(
        "duration: measured − simulated (ms)", "start: measured − simulated (ms)"))
    for kind in sorted_kinds(diffs["kind"]):
        part = diffs[diffs["kind"] == kind]
        for row, col in ((1, "duration_diff_s"), (2, "start_diff_s")):
            fig.add_trace(go.Bar(
                x=part["label"], y=part[col] * MS, name=name_of(kind), legendgroup=kind, showlegend=row == 1,
                marker_color=color_of(kind), hovertemplate="%{x}<br>%{y:+.3f} ms<extra></extra>"), row=row, col=1)
    fig.update_xaxes(categoryorder="array", categoryarray=list(diffs["label"]), tickangle=-60, tickfont_size=9)
    style_figure(fig, "per-action differences", 520)
    fig.update_layout(barmode="relative", legend=dict(orientation="h", yanchor="bottom", y=1.04, xanchor="right", x=1))
    return fig
