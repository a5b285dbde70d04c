"""The look shared by every simtrain figure: one colour and one legend label per kind of task,
the schedule colours of sweep lines, the Plotly template, font and units of the axes (ms, GiB).

The same kind (F, B, I, W, F&B, p2p, collectives, all-to-all) has the same colour in every figure
(:data:`KIND_COLORS`).
"""

from __future__ import annotations

import plotly.graph_objects as go

GiB = 2**30
MS = 1e3

KIND_COLORS = {
    "F": "#4C78A8",
    "B": "#E45756",
    "I": "#F58518",
    "W": "#54A24B",
    "F&B": "#9467BD",
    "OPT": "#9D755D",
    "p2p": "#3BA3A3",
    "tp": "#E8C547",
    "dp": "#B8860B",
    "zero": "#8C6D31",
    "cp": "#17BECF",
    "offload": "#BCBD22",
    "a2a": "#F28CB1",
    "dispatch": "#F28CB1",
    "combine": "#D16BA5",
    "exposed comm": "#6E6E6E",
    "idle": "#D9D9D9",
}
"""One colour per kind, the same in every figure: compute kinds, then communication
(collectives in gold shades, all-to-all in pink shades), then the two parts of idle time."""

KIND_NAMES = {
    "F": "F forward",
    "B": "B backward",
    "I": "I backward (inputs)",
    "W": "W backward (weights)",
    "F&B": "F&B overlapped pair",
    "OPT": "optimizer step",
    "p2p": "p2p send/recv",
    "tp": "TP collectives",
    "dp": "DP gradient reduce",
    "zero": "ZeRO parameter all-gather",
    "cp": "CP attention collectives (exposed)",
    "offload": "activation offload / reload (PCIe)",
    "a2a": "EP all-to-all",
    "dispatch": "EP dispatch (all-to-all)",
    "combine": "EP combine (all-to-all)",
    "exposed comm": "exposed communication",
    "idle": "idle (pipeline bubble)",
}

MEMORY_COLORS = {"weights": "#1F3A5F", "gradients": "#4F7CAC", "optimizer_states": "#9D755D",
                 "activations": "#66A182", "w_pending": "#EDAE49", "comm_buffers": "#8D5A97",
                 "allocator_reserve": "#BBBBBB"}
"""Colour of each part of the memory breakdown (:data:`simtrain.memory.PARTS`)."""

KIND_ORDER = list(KIND_COLORS)
"""Legend and stacking order of kinds."""

SCHEDULE_COLORS = ["#1F3A5F", "#D1495B", "#00798C", "#EDAE49", "#6A4C93", "#66A182", "#8D5A97", "#3D405B"]
"""Colours of schedules in sweep lines (distinct from the kind colours' roles)."""

LINK_NAMES = {"nvlink": "NVLink", "nic": "NIC"}

TEMPLATE = "plotly_white"
FONT = dict(family="Inter, system-ui, -apple-system, Segoe UI, Roboto, sans-serif", size=12, color="#1f2430")
PLOT_CONFIG = {"displaylogo": False, "responsive": True,
               "toImageButtonOptions": {"format": "png", "scale": 2}}


def color_of(kind: str) -> str:
    """Colour of a task kind (grey for unknown kinds)."""
    return KIND_COLORS.get(kind, "#888888")


def name_of(kind: str) -> str:
    """Legend label of a task kind."""
    return KIND_NAMES.get(kind, kind)


def sorted_kinds(kinds) -> list[str]:
    """The distinct kinds of ``kinds`` in :data:`KIND_ORDER` (unknown kinds last, by name)."""
    known = {k: i for i, k in enumerate(KIND_ORDER)}
    return sorted(set(kinds), key=lambda k: (known.get(k, len(known)), k))


def style_figure(fig: go.Figure, title: str, height: int) -> go.Figure:
    """Apply the shared template, font, title and margins to ``fig`` (height in px); returns it."""
    fig.update_layout(
        template=TEMPLATE, font=FONT, height=height, title=dict(text=title, x=0.01, xanchor="left"),
        margin=dict(l=70, r=30, t=64, b=50), hoverlabel=dict(font_size=12),
    )
    return fig


def schedule_color(i: int) -> str:
    """Colour of the i-th schedule of a comparison (cycles)."""
    return SCHEDULE_COLORS[i % len(SCHEDULE_COLORS)]


def port_label(port: str) -> str:
    """Display name of a port kind: ``"nvlink:out"`` -> ``"NVLink out"`` (other names unchanged)."""
    link, sep, direction = port.partition(":")
    return f"{LINK_NAMES.get(link, link)} {direction}" if sep else port
