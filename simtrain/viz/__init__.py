"""Plotly views of simulated (and measured) steps: the comparison dashboard and its figures.

Input is a :class:`simtrain.trace.Trace`'s tables, :class:`simtrain.metrics.Report` objects and
metrics computed by :mod:`simtrain.metrics`, and plain tables (sweeps, measured traces); nothing
here computes a metric, knows about SimPy or about schedules. One module per part:

* :mod:`.style`: one colour and label per kind, the template, units (ms, GiB);
* :mod:`.timeline`: per schedule, the timeline, memory per rank, link utilisation;
* :mod:`.compare`: the four comparison bars across schedules and the sweep lines;
* :mod:`.overlay`: measured vs simulated timeline and per-action differences;
* :mod:`.tables`: the summary and sweep tables (columns shared with the CLI's tables);
* :mod:`.page`: :func:`write_dashboard` and :func:`write_overlay`, one self-contained HTML file
  each (plotly.js embedded, opens offline).
"""

from .compare import comparison_figure, sweep_figure
from .overlay import difference_figure, overlay_figure
from .page import Panel, Sweep, dashboard_figures, write_dashboard, write_overlay
from .style import KIND_COLORS, KIND_NAMES, KIND_ORDER, color_of, name_of, schedule_color
from .tables import kinds_legend_html, summary_table_html, sweep_table_html
from .timeline import MAX_TIMELINE_BARS, coarsen_trace, link_figure, memory_figure, timeline_figure

__all__ = [
    "KIND_COLORS", "KIND_NAMES", "KIND_ORDER", "MAX_TIMELINE_BARS", "Panel", "Sweep", "coarsen_trace", "color_of",
    "comparison_figure", "dashboard_figures", "difference_figure", "kinds_legend_html", "link_figure",
    "memory_figure", "name_of", "overlay_figure", "schedule_color", "summary_table_html", "sweep_figure",
    "sweep_table_html", "timeline_figure", "write_dashboard", "write_overlay",
]
