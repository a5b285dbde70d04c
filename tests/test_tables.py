"""The summary and sweep tables are defined once (simtrain.viz.tables) and drawn by both the
dashboard and the terminal: the same rows, the same numbers, their own headers."""

from __future__ import annotations

import pytest

from simtrain.metrics import compute_report
from simtrain.trace import Trace
from simtrain.viz.tables import SUMMARY_COLUMNS, SWEEP_COLUMNS, summary_columns, summary_table_html


def _report(name: str, end_s: float, a2a: bool = False):
    nan = float("nan")
    rows = [(0, "compute", "compute", "F", "0F0", 0, 0, 0.0, end_s, 0.0, nan, "")]
    if a2a:
        rows.append((0, "ep", "comm", "a2a", "a2a", 0, 0, end_s, end_s + 1.0, 10.0, nan, "nvlink:0:out"))
    trace = Trace.from_rows(rows, [(0, 0.0, 2.0**30), (0, 0.5, 2 * 2.0**30)])
    return compute_report(name, trace, hbm_bytes=1.5 * 2**30, model_flops_per_replica=1e12, peak_flops=1e12,
                          gpus_per_replica=1, dp=1, tokens_per_replica=1000.0)


def test_ep_columns_only_with_all_to_all():
    plain = [c.key for c in summary_columns([_report("a", 2.0)])]
    assert "a2a" not in plain and "links" not in plain
    assert [c.key for c in summary_columns([_report("a", 2.0), _report("b", 1.0, a2a=True)])] == [
        c.key for c in SUMMARY_COLUMNS]


def test_dashboard_and_terminal_cells_agree():
    r = _report("a", 1234.5)  # 1,234,500 ms: the dashboard groups thousands, the terminal does not
    step = next(c for c in SUMMARY_COLUMNS if c.key == "step")
    assert step.text(r) == "1,234,500.00" and step.terminal(r) == "1234500.00"
    fits = next(c for c in SUMMARY_COLUMNS if c.key == "fits")
    assert fits.text(r) == "NO" and fits.terminal(r) == "[red]NO[/red]"  # 2 GiB peak > 1.5 GiB
    for c in SUMMARY_COLUMNS:
        if c.key not in ("step", "exposed", "a2a", "exposed_a2a", "fits"):
            assert c.text(r) == c.terminal(r), c.key


def test_summary_html_marks_best_and_overflow():
    html = summary_table_html([_report("slow", 2.0), _report("fast", 1.0)])
    assert html.count("<tr>") == 3
    assert "<th>step time (ms)</th>" in html and "<td class='best'>1,000.00</td>" in html
    assert "<td class='bad'>NO</td>" in html


@pytest.mark.parametrize("cols", [SUMMARY_COLUMNS, SWEEP_COLUMNS])
def test_every_column_has_a_unique_key(cols):
    keys = [c.key for c in cols]
    assert len(keys) == len(set(keys))
