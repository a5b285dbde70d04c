"""The tables of a comparison, defined once for the dashboard (HTML) and the terminal (``simtrain
compare``): the summary of each schedule, the sweep, and the legend of kinds.

A :class:`Column` holds both headers and the text of a cell; the terminal's text differs only
where it has no thousands separators and where it marks an overflow in red (rich markup).
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pandas as pd

from .style import GiB, MS, color_of, name_of, sorted_kinds

if TYPE_CHECKING:
    from ..metrics import Report


def pct(x: float | None) -> str:
    """A ratio as a percentage with one decimal, ``"–"`` for None."""
    return "–" if x is None else f"{x:.1%}"


@dataclass(frozen=True)
class Column:
    """One column of a table.

    Attributes:
        key: identifier (``"step"``, ``"peak"`` ...).
        html: header on the dashboard.
        cli: header in the terminal table, or None when the terminal leaves the column out.
        text: cell text of one row on the dashboard.
        cli_text: cell text in the terminal (rich markup allowed), or None for ``text``.
        ep: shown only when some schedule has EP all-to-all.
    """

    key: str
    html: str
    cli: str | None
    text: Callable[[Any], str]
    cli_text: Callable[[Any], str] | None = None
    ep: bool = False

    def terminal(self, row: Any) -> str:
        """The cell text in the terminal."""
        return (self.cli_text or self.text)(row)


def _peak(r: Report) -> float:
    return max(r.peak_memory_bytes)


SUMMARY_COLUMNS: tuple[Column, ...] = (
    Column("schedule", "schedule", "schedule", lambda r: r.schedule),
    Column("step", "step time (ms)", "step time (ms)", lambda r: f"{r.step_time_s * MS:,.2f}",
           lambda r: f"{r.step_time_s * MS:.2f}"),
    Column("bubble", "bubble", "bubble", lambda r: pct(r.bubble_ratio)),
    Column("span", "span bubble", "span bubble", lambda r: pct(r.span_bubble_ratio)),
    Column("exposed", "exposed comm (ms)", "exposed comm (ms)", lambda r: f"{r.exposed_comm_s * MS:,.2f}",
           lambda r: f"{r.exposed_comm_s * MS:.2f}"),
    Column("overlap", "overlap", "overlap", lambda r: pct(r.overlap_ratio)),
    Column("peak", "peak memory (GiB)", "peak mem (GiB)", lambda r: f"{_peak(r) / GiB:.1f} / {r.hbm_bytes / GiB:.0f}"),
    Column("fits", "fits in HBM", "fits HBM", lambda r: "yes" if r.fits_in_hbm else "NO",
           lambda r: "yes" if r.fits_in_hbm else "[red]NO[/red]"),
    Column("inflight", "peak in-flight", "in-flight", lambda r: str(max(r.peak_inflight_microbatches))),
    Column("mfu", "MFU", "MFU", lambda r: pct(r.mfu)),
    Column("hfu", "HFU", "HFU", lambda r: pct(r.hfu)),
    Column("tokens", "tokens/s", "tokens/s", lambda r: f"{r.tokens_per_s:,.0f}"),
    Column("a2a", "all-to-all (ms)", "a2a (ms)", lambda r: f"{r.a2a_s * MS:,.2f}", lambda r: f"{r.a2a_s * MS:.2f}",
           ep=True),
    Column("exposed_a2a", "exposed all-to-all (ms)", "exposed a2a (ms)", lambda r: f"{r.exposed_a2a_s * MS:,.2f}",
           lambda r: f"{r.exposed_a2a_s * MS:.2f}", ep=True),
    Column("ep_share", "EP share", "EP share", lambda r: pct(r.ep_share), ep=True),
    Column("links", "link utilisation", None,
           lambda r: ", ".join(f"{k} {v:.0%}" for k, v in (r.link_utilisation or {}).items()), ep=True),
)
"""Columns of the summary table, one row per schedule (:class:`simtrain.metrics.Report`)."""

SWEEP_COLUMNS: tuple[Column, ...] = (
    Column("value", "{field}", "{field}", lambda r: str(r["value"])),
    Column("schedule", "schedule", "schedule", lambda r: r["schedule"]),
    Column("step", "step time (ms)", "step time (ms)", lambda r: f"{r['step_time_s'] * MS:,.2f}",
           lambda r: f"{r['step_time_s'] * MS:.2f}"),
    Column("bubble", "bubble", "bubble", lambda r: pct(r["bubble_ratio"])),
    Column("gpus", "GPUs", "GPUs", lambda r: f"{r['gpus']:.0f}"),
    Column("tokens", "tokens/s", "tokens/s", lambda r: f"{r['tokens_per_s']:,.0f}"),
    Column("tokens_gpu", "tokens/s/GPU", "tokens/s/GPU", lambda r: f"{r['tokens_per_s_per_gpu']:,.0f}"),
    Column("mfu", "MFU", "MFU", lambda r: pct(None if pd.isna(r["mfu"]) else r["mfu"])),
    Column("peak", "peak memory (GiB)", "peak mem (GiB)", lambda r: f"{r['peak_memory_bytes_max'] / GiB:.1f}"),
    Column("fits", "fits in HBM", "fits HBM", lambda r: "yes" if r["fits_in_hbm"] else "NO",
           lambda r: "yes" if r["fits_in_hbm"] else "[red]NO[/red]"),
)
"""Columns of the sweep table, one row per (value, schedule) of :func:`simtrain.sweep.run_sweep`
(``{field}`` in a header is the swept setting)."""


def summary_columns(reports: list[Report]) -> list[Column]:
    """The summary columns that apply: the EP columns only when some schedule has all-to-all."""
    ep = any(r.a2a_s > 0 for r in reports)
    return [c for c in SUMMARY_COLUMNS if ep or not c.ep]


def sweep_records(rows: pd.DataFrame) -> list[dict]:
    """The rows of a sweep table as dicts, in the order both tables list them (by value, stably)."""
    return rows.sort_values(["value"], kind="stable").to_dict("records")


def kinds_legend_html(kinds) -> str:
    """HTML chips naming the colour of each kind present."""
    chips = [f"<span><span class='chip' style='background:{color_of(k)}'></span>{html.escape(name_of(k))}</span>"
             for k in sorted_kinds(kinds)]
    return f"<div class='kinds'>{''.join(chips)}</div>"


def _summary_marks(reports: list[Report]) -> Callable[[Column, Report], str]:
    """The CSS class of a summary cell: ``best`` for the smallest step time, bubble, exposed
    communication and peak memory (with several schedules), ``bad`` for an HBM overflow."""
    best = {key: min(map(get, reports)) for key, get in (
        ("step", lambda r: r.step_time_s), ("bubble", lambda r: r.bubble_ratio),
        ("exposed", lambda r: r.exposed_comm_s), ("peak", _peak))} if reports else {}
    value = {"step": lambda r: r.step_time_s, "bubble": lambda r: r.bubble_ratio,
             "exposed": lambda r: r.exposed_comm_s, "peak": _peak}
    multi = len(reports) > 1

    def mark(col: Column, r: Report) -> str:
        if col.key in ("peak", "fits") and not r.fits_in_hbm:
            return "bad"
        if col.key in value and multi and math.isclose(value[col.key](r), best[col.key]):
            return "best"
        return ""

    return mark


def summary_table_html(reports: list[Report]) -> str:
    """An HTML table of the headline numbers, one row per schedule; the best step time, bubble,
    exposed communication and peak memory are marked, configurations that overflow HBM are red."""
    cols = summary_columns(reports)
    mark = _summary_marks(reports)
    rows = ["<tr>" + "".join(f"<td class='{mark(c, r)}'>{html.escape(c.text(r))}</td>" for c in cols) + "</tr>"
            for r in reports]
    header = "<tr>" + "".join(f"<th>{c.html}</th>" for c in cols) + "</tr>"
    return f"<table class='summary'>{header}{''.join(rows)}</table>"


def sweep_table_html(rows: pd.DataFrame, field: str) -> str:
    """An HTML table of a sweep: one row per (value, schedule)."""
    out = []
    for r in sweep_records(rows):
        if isinstance(r.get("error_message"), str):
            out.append("<tr>" + "".join(f"<td class=''>{html.escape(c.text(r))}</td>" for c in SWEEP_COLUMNS[:2])
                       + f"<td class='bad' colspan='{len(SWEEP_COLUMNS) - 2}' style='text-align:left'>"
                       f"{html.escape('not simulated: ' + r['error_message'])}</td></tr>")
            continue
        bad = "" if r["fits_in_hbm"] else "bad"
        out.append("<tr>" + "".join(f"<td class='{bad if c.key in ('peak', 'fits') else ''}'>"
                                    f"{html.escape(c.text(r))}</td>" for c in SWEEP_COLUMNS) + "</tr>")
    header = "<tr>" + "".join(f"<th>{html.escape(c.html.format(field=field))}</th>" for c in SWEEP_COLUMNS) + "</tr>"
    return f"<table class='summary'>{header}{''.join(out)}</table>"
