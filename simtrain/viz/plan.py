"""The ``simtrain plan --out`` page: the Pareto front of step time against peak memory (every
simulated configuration that fits, hover for its settings), the top-K table, and the best
configuration's timeline and memory per rank (the dashboard's own figures, :mod:`.page`).
"""

from __future__ import annotations

import html
from pathlib import Path

import plotly.graph_objects as go

from .. import atomic
from ..hardware import GiB
from .page import Panel, _figure_html, _manifest, _page, dashboard_figures
from .style import style_figure
from .tables import summary_table_html


def config_label(row: dict) -> str:
    """``TP 8 x PP 12 x DP 4, 1f1b, b 1, m 384, full, ZeRO 0`` (plus EP / vp when they are not 1)."""
    return (f"TP {row['tp']} x PP {row['pp']} x DP {row['dp']}" + (f" (EP {row['ep']})" if row["ep"] > 1 else "")
            + f", {row['schedule']}" + (f" vp {row['vp']}" if row["vp"] > 1 else "")
            + f", b {row['microbatch_size']}, m {row['microbatches']}, {row['recompute']}, ZeRO {row['zero_stage']}")


def pareto_figure(rows: list[dict], pareto: list[dict], hbm_bytes: float) -> go.Figure:
    """Scatter of step time (s) against the worst rank's peak memory (GiB), front highlighted."""
    fig = go.Figure()
    for name, data, style in (("simulated", rows, dict(size=7, color="#9aa5b1")),
                              ("Pareto front", pareto, dict(size=10, color="#d62728"))):
        fig.add_trace(go.Scatter(
            x=[r["peak_memory_bytes_max"] / GiB for r in data], y=[r["step_time_s"] for r in data],
            mode="markers+lines" if name == "Pareto front" else "markers", name=name, marker=style,
            line=dict(shape="hv", color=style["color"]),
            text=[config_label(r) + f"<br>MFU {r['mfu']:.1%}, {r['tokens_per_s_per_gpu']:,.0f} tokens/s/GPU"
                  for r in data],
            hovertemplate="%{text}<br>step %{y:.3f} s, peak %{x:.1f} GiB<extra></extra>",
        ))
    fig.add_vline(x=hbm_bytes / GiB, line_dash="dot", annotation_text="HBM")
    fig.update_xaxes(title="peak memory of the worst rank (GiB)")
    fig.update_yaxes(title="step time (s)")
    return style_figure(fig, "step time against peak memory (configurations that fit)", 480)


def _top_table(top: list[dict]) -> str:
    head = "".join(f"<th>{h}</th>" for h in ("#", "configuration", "GPUs", "step (s)", "tokens/s/GPU", "MFU",
                                              "peak GiB", "fits"))
    body = "".join(
        f"<tr><td>{i + 1}</td><td>{html.escape(config_label(r))}</td><td>{r['gpus']}</td>"
        f"<td>{r['step_time_s']:.3f}</td><td>{r['tokens_per_s_per_gpu']:,.0f}</td><td>{r['mfu']:.1%}</td>"
        f"<td>{r['peak_memory_bytes_max'] / GiB:.1f}</td><td>{'yes' if r['fits_in_hbm'] else 'no'}</td></tr>"
        for i, r in enumerate(top))
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def write_plan_page(path: Path, summary: dict, rows: list[dict], best: Panel, hbm_bytes: float,
                    title: str, subtitle: str) -> Path:
    """Write the plan page as one self-contained HTML file (plotly.js embedded once).

    Args:
        path: file to write.
        summary: :func:`simtrain.plan.summarise`'s object.
        rows: every simulated row (those that fit are drawn).
        best: the best configuration's simulation (report, trace, memory).
        hbm_bytes: HBM per GPU, drawn as a line.
        title, subtitle: heading and context line.

    Returns:
        ``path``.
    """
    figs = [("pareto", "Pareto front", pareto_figure([r for r in rows if r["fits_in_hbm"]], summary["pareto"],
                                                      hbm_bytes))]
    figs += [f for f in dashboard_figures([best]) if f[0] != "compare"]
    parts = [_figure_html(fig, f"fig-{i}", i == 0) for i, (_s, _h, fig) in enumerate(figs)]
    pruned = ", ".join(f"{k.replace('_', ' ')} {v:,}" for k, v in summary["pruned"].items() if v)
    body = [
        _manifest({f"fig-{i}": len(fig.data) for i, (_s, _h, fig) in enumerate(figs)}),
        f"<section id='pareto'><h2>Pareto front</h2><p class='note'>{summary['considered']:,} configurations "
        f"considered, {summary['evaluated']:,} simulated; pruned: {html.escape(pruned)}.</p>{parts[0]}</section>",
        f"<section id='top'><h2>Top {len(summary['top'])}</h2>{_top_table(summary['top'])}</section>",
        "<section id='best'><h2>Best: " + html.escape(config_label(summary["best"])) + "</h2>"
        + summary_table_html([best.report]) + "".join(parts[1:]) + "</section>",
    ]
    nav = [("pareto", "Pareto front"), ("top", "top configurations"), ("best", "best configuration")]
    path = Path(path)
    return atomic.write_text(Path(path), _page(title, [subtitle], nav, body))
