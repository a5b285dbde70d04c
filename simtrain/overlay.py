"""Measured vs simulated: rebuild the schedule a real step ran, and compare action by action.

The measured actions come from :func:`simtrain.measured.read_torch_trace`. From them
:func:`schedule_from_measured` rebuilds the per-rank orders torch really ran (so any schedule torch
can run can be simulated, including ones simtrain has no generator for), :func:`measured_op_times`
takes the median measured F, I and W times (for ``--op-times measured``), and
:func:`action_differences` pairs each measured compute action with the simulated one.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .errors import SimtrainError
from .schedules.ir import Action, OverlapAction, Schedule, ScheduleError, parse_action


def _compute(measured: pd.DataFrame) -> pd.DataFrame:
    return measured[measured["category"] == "compute"]


def schedule_from_measured(measured: pd.DataFrame, name: str = "measured") -> Schedule:
    """The schedule a measured step ran: each rank's compute actions in start order.

    Args:
        measured: rows of :func:`simtrain.measured.read_torch_trace`.
        name: the schedule's name.

    Returns:
        A validated :class:`Schedule`; stage placement is where each stage's actions ran, and
        microbatches are 0 .. (largest seen).

    Raises:
        ScheduleError: a stage that ran on two ranks, a rank without actions, or an incomplete
            step (e.g. a backward missing because the profiler stopped early).
    """
    comp = _compute(measured).sort_values(["start_s"], kind="stable")
    if comp.empty:
        raise ScheduleError("the measured trace has no compute actions")
    stage_rank: dict[int, int] = {}
    orders: dict[int, list] = {}
    microbatches = 0
    for rank, text in zip(comp["rank"], comp["name"]):
        act = parse_action(text)
        for part in act.parts:
            owner = stage_rank.setdefault(part.stage, int(rank))
            if owner != rank:
                raise ScheduleError(f"measured trace: stage {part.stage} ran on ranks {owner} and {int(rank)}")
            microbatches = max(microbatches, part.microbatch + 1)
        orders.setdefault(int(rank), []).append(act)
    num_ranks = max(orders) + 1
    missing = [r for r in range(num_ranks) if r not in orders]
    if missing:
        raise ScheduleError(f"measured trace: rank {missing[0]} has no compute actions (give one trace per rank)")
    num_stages = max(stage_rank) + 1
    if set(stage_rank) != set(range(num_stages)):
        gap = min(set(range(num_stages)) - set(stage_rank))
        raise ScheduleError(f"measured trace: no action of stage {gap} was recorded")
    schedule = Schedule(
        name=name, num_microbatches=microbatches,
        stage_to_rank=tuple(stage_rank[s] for s in range(num_stages)),
        orders=tuple(tuple(orders[r]) for r in range(num_ranks)),
    )
    schedule.validate()
    return schedule


def measured_op_times(measured: pd.DataFrame) -> tuple[float, float, float]:
    """Median measured seconds of one F, I and W (B = I + W) over all stages.

    When the step has full backwards only, I and W are half of the median B each.

    Raises:
        SimtrainError: no forward or no backward was measured.
    """
    comp = _compute(measured)
    dur = comp["end_s"] - comp["start_s"]
    med = {k: float(dur[comp["kind"] == k].median()) for k in ("F", "B", "I", "W") if (comp["kind"] == k).any()}
    if "F" not in med or not ({"B"} <= med.keys() or {"I", "W"} <= med.keys()):
        raise SimtrainError("--op-times measured: the trace needs forwards and backwards (B, or I and W)")
    if "I" in med and "W" in med:
        return med["F"], med["I"], med["W"]
    return med["F"], med["B"] / 2, med["B"] / 2


def _simulated_spans(simulated: pd.DataFrame) -> dict[tuple[int, str], tuple[float, float]]:
    """(rank, action text) -> (start, end) of each simulated action (pieces merged)."""
    comp = simulated[(simulated["category"] == "compute") & simulated["stage"].notna()]
    spans: dict[tuple[int, str], tuple[float, float]] = {}
    for (rank, stage, kind, mb), rows in comp.groupby(["rank", "stage", "kind", "microbatch"]):
        text = str(Action(int(stage), str(kind), int(mb)))
        spans[(int(rank), text)] = (float(rows["start_s"].min()), float(rows["end_s"].max()))
    return spans


def action_differences(measured: pd.DataFrame, simulated: pd.DataFrame) -> pd.DataFrame:
    """Pair every measured compute action with the simulated one of the same rank and name.

    An overlapped F&B pair is compared with the span of its two simulated parts.

    Args:
        measured: rows of :func:`simtrain.measured.read_torch_trace`.
        simulated: the engine trace of the same schedule.

    Returns:
        DataFrame in measured start order with rank, name, label (``"r<rank> <name>"``), kind,
        measured_start_s, measured_s, simulated_start_s, simulated_s, duration_diff_s and
        start_diff_s (measured minus simulated); actions the simulation lacks are left out.
    """
    spans = _simulated_spans(simulated)
    rows = []
    for r in _compute(measured).itertuples():
        act = parse_action(r.name)
        parts = [spans.get((int(r.rank), str(p))) for p in act.parts]
        if any(p is None for p in parts):
            continue
        s, e = min(p[0] for p in parts), max(p[1] for p in parts)
        m_dur = r.end_s - r.start_s
        rows.append(dict(
            rank=int(r.rank), name=r.name, label=f"r{int(r.rank)} {r.name}",
            kind="F&B" if isinstance(act, OverlapAction) else act.kind,
            measured_start_s=r.start_s, measured_s=m_dur, simulated_start_s=s, simulated_s=e - s,
            duration_diff_s=m_dur - (e - s), start_diff_s=r.start_s - s,
        ))
    cols = ["rank", "name", "label", "kind", "measured_start_s", "measured_s", "simulated_start_s", "simulated_s",
            "duration_diff_s", "start_diff_s"]
    return pd.DataFrame(rows, columns=cols)


def overlay_summary(measured: pd.DataFrame, simulated: pd.DataFrame, diffs: pd.DataFrame) -> dict:
    """Headline numbers of an overlay (seconds).

    Returns:
        dict with ``measured_span_s`` and ``simulated_span_s`` (first action start to last compute
        action end), ``span_error`` (simulated / measured - 1), ``matched`` (actions paired) and
        ``per_kind``: kind -> {measured_s, simulated_s (means), mean_abs_diff_s, count}.
    """
    m_comp = _compute(measured)
    s_comp = simulated[(simulated["category"] == "compute") & simulated["stage"].notna()]
    m_span = float(m_comp["end_s"].max() - m_comp["start_s"].min()) if len(m_comp) else 0.0
    s_span = float(s_comp["end_s"].max() - s_comp["start_s"].min()) if len(s_comp) else 0.0
    per_kind = {}
    for kind, part in diffs.groupby("kind", sort=False):
        per_kind[str(kind)] = dict(
            measured_s=float(part["measured_s"].mean()), simulated_s=float(part["simulated_s"].mean()),
            mean_abs_diff_s=float(np.abs(part["duration_diff_s"]).mean()), count=int(len(part)),
        )
    return dict(measured_span_s=m_span, simulated_span_s=s_span,
                span_error=(s_span / m_span - 1) if m_span > 0 else 0.0, matched=int(len(diffs)), per_kind=per_kind)
