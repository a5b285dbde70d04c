"""Per-schedule figures: the timeline (a compute lane and one lane per communication stream per
rank), the memory timeline per rank, and the busy fraction of every link port.

Input is a trace's tables (:mod:`simtrain.trace`) and metrics (:mod:`simtrain.metrics`); nothing
here computes a metric or knows about SimPy.
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.colors import sample_colorscale

from ..metrics import link_busy
from ..trace import COMPUTE_LANE, lane_order, lanes
from .style import GiB, MS, color_of, name_of, port_label, sorted_kinds, style_figure

# --- timelines ---------------------------------------------------------------------------------

MAX_TIMELINE_BARS = 20_000
"""Above this many tasks a timeline is drawn coarsened (see :func:`coarsen_trace`)."""


def coarsen_trace(trace: pd.DataFrame, max_bars: int = MAX_TIMELINE_BARS) -> tuple[pd.DataFrame, float]:
    """Merge the sub-operations of one action into fewer bars, so huge traces stay drawable.

    MoE steps have one task per attention block, expert wave and all-to-all wave: hundreds of
    thousands of tasks, more than a browser draws. Tasks on the same rank and lane with the same
    kind, stage and microbatch are merged when the gap between them is at most ``tol`` seconds;
    ``tol`` starts at 1/4000 of the step (below a pixel on a full-width timeline) and doubles until
    at most ``max_bars`` bars remain. A merged bar spans first start to last end and its name says
    how many tasks it holds. The trace itself (metrics, ``--trace``, ``--csv``) is never coarsened.

    Args:
        trace: the engine trace.
        max_bars: the most bars to draw.

    Returns:
        ``(trace, tol)``: the (possibly merged) trace and the gap merged in seconds (0 if unchanged).
    """
    if len(trace) <= max_bars:
        return trace, 0.0
    t = trace.assign(_lane=lanes(trace)).reset_index(drop=True)
    key_cols = ["rank", "_lane", "kind", "category", "stage", "microbatch"]
    keys = t.groupby(key_cols, dropna=False, sort=False).ngroup()
    t = t.assign(_key=keys).sort_values(["_key", "start_s"], kind="stable")
    step = float(t["end_s"].max()) or 1.0
    tol = step / 4000
    while True:
        prev_end = t.groupby("_key")["end_s"].cummax().groupby(t["_key"]).shift()
        new_block = (t["_key"] != t["_key"].shift()) | (t["start_s"] - prev_end > tol)
        blocks = new_block.cumsum()
        if blocks.iloc[-1] <= max_bars or tol > step:
            break
        tol *= 2
    g = t.groupby(blocks, sort=False)
    merged = g.agg(
        rank=("rank", "first"), stream=("stream", "first"), category=("category", "first"),
        kind=("kind", "first"), name=("name", "first"), stage=("stage", "first"),
        microbatch=("microbatch", "first"), start_s=("start_s", "min"), end_s=("end_s", "max"),
        bytes=("bytes", "sum"), peer=("peer", "first"), resources=("resources", "first"),
        _n=("name", "size"),
    )
    label = [
        n if k == 1 else (f"{int(st)}{kd}{int(mb)}: {k} tasks" if not (pd.isna(st) or pd.isna(mb)) else f"{kd}: {k} tasks")
        for n, k, st, kd, mb in zip(merged["name"], merged["_n"], merged["stage"], merged["kind"], merged["microbatch"])
    ]
    merged = merged.assign(name=label).drop(columns="_n")
    return merged.sort_values(["start_s", "rank"], kind="stable").reset_index(drop=True), tol


def timeline_figure(trace: pd.DataFrame, title: str = "", x_max_ms: float | None = None) -> go.Figure:
    """Gantt timeline: per rank a compute lane and one lane per communication stream.

    Args:
        trace: the engine trace (columns of :data:`simtrain.trace.TRACE_COLUMNS`).
        title: figure title.
        x_max_ms: right end of the time axis (share it across schedules to compare them).

    Returns:
        A figure with one bar trace per kind (clicking a legend entry hides or shows that kind),
        microbatch numbers on compute bars, hover text with name, lane, start, end, duration,
        bytes and peer; drag to zoom, double-click to reset.
    """
    fig = go.Figure()
    trace, merged_s = coarsen_trace(trace)
    if merged_s:
        title += f" (coarsened: tasks of one action less than {merged_s * MS:.2f} ms apart are one bar)"
    lane = lanes(trace)
    ranks = sorted(int(r) for r in trace["rank"].unique())
    rows: list[str] = []
    ticks: list[str] = []
    for r in ranks:
        for name in lane_order(lane[trace["rank"] == r]):
            rows.append(f"rank {r} · {name}")
            ticks.append(f"<b>rank {r}</b>" if name == COMPUTE_LANE else f"{name}  ")
    y_all = [f"rank {int(r)} · {n}" for r, n in zip(trace["rank"], lane)]
    trace = trace.assign(_y=y_all, _lane=lane)
    for kind in sorted_kinds(trace["kind"]):
        part = trace[trace["kind"] == kind]
        compute = part["category"] == "compute"
        for is_compute in (True, False):
            rows_k = part[compute == is_compute]
            if rows_k.empty:
                continue
            dur = (rows_k["end_s"] - rows_k["start_s"]) * MS
            text = ["" if pd.isna(mb) or not is_compute else str(int(mb)) for mb in rows_k["microbatch"]]
            extra = [
                " · ".join(x for x in (
                    f"{b / 1e6:,.2f} MB" if b else "",
                    f"to rank {int(p)}" if not pd.isna(p) else "",
                ) if x)
                for b, p in zip(rows_k["bytes"], rows_k["peer"])
            ]
            custom = list(zip(rows_k["name"].astype(str), rows_k["_y"], rows_k["start_s"] * MS,
                              rows_k["end_s"] * MS, dur, extra))
            fig.add_trace(go.Bar(
                name=name_of(kind), legendgroup=kind, showlegend=is_compute or not (compute.any()),
                orientation="h", y=rows_k["_y"], x=dur, base=rows_k["start_s"] * MS,
                width=0.82 if is_compute else 0.5, marker=dict(color=color_of(kind), line=dict(width=0.4, color="white")),
                text=text, textposition="inside", insidetextanchor="middle", textangle=0,
                textfont=dict(color="white", size=10), customdata=custom,
                hovertemplate="<b>%{customdata[0]}</b><br>%{customdata[1]}<br>"
                              "%{customdata[2]:.3f} → %{customdata[3]:.3f} ms (%{customdata[4]:.3f} ms)"
                              "<br>%{customdata[5]}<extra></extra>",
            ))
    _add_pair_outlines(fig, trace)
    # light bands behind alternate ranks
    reversed_rows = rows[::-1]
    pos = {name: i for i, name in enumerate(reversed_rows)}
    for j, r in enumerate(ranks):
        idx = [pos[n] for n in rows if n.startswith(f"rank {r} · ")]
        if j % 2 == 0 and idx:
            fig.add_shape(type="rect", xref="paper", x0=0, x1=1, y0=min(idx) - 0.5, y1=max(idx) + 0.5,
                          fillcolor="#EEF2F8", line_width=0, layer="below")
    style_figure(fig, title, max(260, 22 * len(rows) + 130))
    fig.update_layout(
        barmode="overlay", bargap=0.1, uniformtext=dict(minsize=8, mode="hide"),
        legend=dict(orientation="h", yanchor="bottom", y=1.0, xanchor="right", x=1, title_text=""),
        xaxis=dict(title="time (ms)", range=[0, x_max_ms] if x_max_ms else None, showgrid=True,
                   zeroline=False),
        yaxis=dict(categoryorder="array", categoryarray=reversed_rows, tickmode="array",
                   tickvals=reversed_rows, ticktext=ticks[::-1], showgrid=False, fixedrange=False),
    )
    return fig


_SLICE = r" \(\d+/\d+\)$"


def pair_spans(trace: pd.DataFrame) -> pd.DataFrame:
    """The overlapped F&B pairs of a trace: per rank, a forward and a backward action cut into slices (``"0F7 (1/4)"``) whose time spans interleave
    (:func:`simtrain.lowering.chains.pair_chains` cuts a pair into one slice per layer).

    Returns:
        One row per pair: ``rank``, ``start_s``, ``end_s``, ``name`` (``"0F7 & 7B3"``); empty when
        the trace has none.
    """
    comp = trace[(trace["category"] == "compute") & trace["name"].astype(str).str.contains(_SLICE, regex=True)]
    if comp.empty:
        return pd.DataFrame(columns=["rank", "start_s", "end_s", "name"])
    comp = comp.assign(action=comp["name"].astype(str).str.replace(_SLICE, "", regex=True))
    spans = comp.groupby(["rank", "action"], sort=False).agg(
        start_s=("start_s", "min"), end_s=("end_s", "max"), kind=("kind", "first")).reset_index()
    rows = []
    for rank, part in spans.groupby("rank", sort=False):
        fwd, bwd = part[part["kind"] == "F"], part[part["kind"] != "F"]
        for f in fwd.itertuples():
            match = bwd[(bwd["start_s"] < f.end_s) & (bwd["end_s"] > f.start_s)]
            if not match.empty:
                b = match.iloc[0]
                rows.append(dict(rank=rank, start_s=min(f.start_s, b["start_s"]), end_s=max(f.end_s, b["end_s"]),
                                 name=f"{f.action} & {b['action']}"))
    return pd.DataFrame(rows, columns=["rank", "start_s", "end_s", "name"])


def _add_pair_outlines(fig: go.Figure, trace: pd.DataFrame) -> None:
    """An outlined bar around each overlapped F&B pair, with its own legend entry."""
    pairs = pair_spans(trace)
    if pairs.empty:
        return
    fig.add_trace(go.Bar(
        name=name_of("F&B"), legendgroup="F&B", orientation="h",
        y=[f"rank {int(r)} · {COMPUTE_LANE}" for r in pairs["rank"]],
        x=(pairs["end_s"] - pairs["start_s"]) * MS, base=pairs["start_s"] * MS, width=0.98,
        marker=dict(color="rgba(0,0,0,0)", line=dict(width=2, color=color_of("F&B"))),
        customdata=list(zip(pairs["name"], pairs["start_s"] * MS, pairs["end_s"] * MS)),
        hovertemplate="<b>overlapped pair %{customdata[0]}</b><br>%{customdata[1]:.3f} → %{customdata[2]:.3f} ms"
                      "<extra></extra>",
    ))


def memory_figure(memory: pd.DataFrame, hbm_bytes: float, title: str = "",
                  x_max_ms: float | None = None) -> go.Figure:
    """Memory per rank over the step (step lines, ranks in a sequential palette) with the HBM
    capacity as a dashed red line.

    Args:
        memory: (rank, time_s, bytes) rows of the memory timeline.
        hbm_bytes: HBM capacity of one GPU.
        title: figure title.
        x_max_ms: right end of the time axis.
    """
    fig = go.Figure()
    ranks = sorted(memory["rank"].unique())
    palette = sample_colorscale("Viridis", [i / max(1, len(ranks) - 1) * 0.9 for i in range(len(ranks))])
    end_s = float(memory["time_s"].max()) if len(memory) else 0.0
    for color, r in zip(palette, ranks):
        rows = memory[memory["rank"] == r].sort_values("time_s", kind="stable")
        x = list(rows["time_s"] * MS) + [end_s * MS]
        y = list(rows["bytes"] / GiB) + [float(rows["bytes"].iloc[-1]) / GiB]
        fig.add_trace(go.Scatter(
            x=x, y=y, mode="lines", line=dict(shape="hv", width=1.8, color=color), name=f"rank {int(r)}",
            hovertemplate=f"rank {int(r)}<br>%{{x:.3f}} ms<br>%{{y:.2f}} GiB<extra></extra>",
        ))
    fig.add_hline(y=hbm_bytes / GiB, line_dash="dash", line_color="#C0392B",
                  annotation_text=f"HBM {hbm_bytes / GiB:.0f} GiB", annotation_position="top left")
    style_figure(fig, title, 340)
    fig.update_layout(xaxis=dict(title="time (ms)", range=[0, x_max_ms] if x_max_ms else None),
                      yaxis=dict(title="memory (GiB)", rangemode="tozero"), legend_title_text="")
    if len(ranks) > 8:  # a long legend goes below the plot, in rows
        fig.update_layout(legend=dict(orientation="h", yanchor="top", y=-0.22, x=0), height=380,
                          margin=dict(b=110))
    return fig


def link_figure(trace: pd.DataFrame, step_s: float, title: str = "") -> go.Figure | None:
    """Stacked bars: for each link port class and rank, the fraction of the step the port is
    busy, split by the kind of traffic (colours of :data:`KIND_COLORS`). None without traffic."""
    busy = link_busy(trace, step_s)
    busy = busy.assign(port=busy["port"].map(port_label))
    if busy.empty:
        return None
    ports = sorted(busy["port"].unique())
    ranks = sorted(busy["rank"].unique())
    x_port = [p for p in ports for _ in ranks]
    x_rank = [f"r{r}" for _ in ports for r in ranks]
    fig = go.Figure()
    for kind in sorted_kinds(busy["kind"]):
        part = busy[busy["kind"] == kind].set_index(["port", "rank"])["fraction"]
        y = [float(part.get((p, r), 0.0)) for p in ports for r in ranks]
        fig.add_trace(go.Bar(
            name=name_of(kind), legendgroup=kind, x=[x_port, x_rank], y=y, marker_color=color_of(kind),
            hovertemplate=f"{name_of(kind)}<br>%{{x}}<br>busy %{{y:.1%}} of the step<extra></extra>",
        ))
    style_figure(fig, title, 330)
    fig.update_layout(barmode="stack", yaxis=dict(title="busy fraction of the step", tickformat=".0%",
                                                  rangemode="tozero"),
                      legend=dict(orientation="h", yanchor="bottom", y=1.0, xanchor="right", x=1),
                      bargap=0.15)
    return fig
