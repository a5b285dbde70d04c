"""Metrics of one simulated step, computed from the trace and memory timeline alone.

Definitions (sources use different ones; these are simtrain's):

* **step time**: end of the last task (compute, communication or optimizer) of the step.
* **bubble ratio** (the pipeline bubble): the time a rank's compute stream is idle while none of
  its communication is in flight, i.e. ``idle_r - exposed_r``, summed over ranks / (ranks x step
  time); per rank ``(step - busy_r - exposed_r) / step``. Time spent waiting on communication is
  the **exposed communication** below, not bubble. With unit costs and free communication GPipe
  and 1F1B give ``(p-1)/(m+p-1)``: the bubble over the makespan of GPipe (Huang et al. 2019 §2.3)
  and of sail-sg's zero-bubble README; Megatron-LM's bubble time fraction (Narayanan et al. 2021
  §2.2.1) divides by the ideal time instead, ``(p-1)/m = b / (1 - b)``.
* **idle ratio**: ``1 - (sum over ranks of compute-busy time) / (ranks x step time)``, all idle
  time (bubble plus exposed communication; per rank ``1 - busy_r / step``): the figure reported as
  "bubble" before the two were told apart. Equal to the bubble ratio when communication is free.
* **span bubble ratio** (Zero Bubble paper, Qi et al. 2024 §5.3: bubble rate
  ``(cost - m(T_F+T_B+T_W)) / cost`` with cost the largest execution time of all stages, measured
  per stage from its first forward to its last W as sail-sg's ``auto_schedule.py`` does):
  ``(cost - mean_r busy_r) / cost``, with cost the longest per-rank span of pipeline actions
  (first F/B/I/W start to last end) and busy_r the time rank r computes them. With balanced
  stages every ``busy_r`` is the paper's ``m(T_F+T_B+T_W)`` (its T_B is our I). It ignores the
  wait before a rank's first action, so ZB-H2 and ZB-V reach 0 where the bubble ratio does not.
* **exposed communication** of a rank: time during which communication that involves the rank
  (as sender, receiver or collective member) is in flight and its compute stream is idle;
  ``exposed_comm_s`` is the mean over ranks.
* **overlap ratio**: ``1 - exposed / total communication time`` (summed over ranks; None when
  there is no communication).
* **peak memory** per rank: the maximum of its memory timeline (static + activations).
* **peak in-flight microbatches** per rank: the most (stage, microbatch) activations held at once,
  an activation counting from the start of its F to the end of the backward that frees its input
  gradient (its B, or its I); in a forward-only step, to the end of its F.
* **MFU** (Chowdhery et al. 2022, PaLM, Appendix B): model FLOPs of the step (no recomputation)
  / (step time x GPUs x peak FLOP/s of the dtype).
* **tokens/s**: dp x m x b x s / step time.
* **all-to-all** (EP dispatch and combine, kind ``a2a``): ``a2a_s`` is the mean over ranks of the
  time a rank's all-to-all is in flight, ``exposed_a2a_s`` the mean of the time it is in flight
  while the rank's compute stream is idle, and ``ep_share = exposed_a2a_s / step time``: the share
  of the step the ranks wait on expert-parallel communication.
* **link utilisation** per port kind (``nvlink:out``, ``nic:in`` ...): busy time of the ports of that
  kind summed over ranks / (ranks x step time). Ports have capacity 1, so busy time is the time
  some transfer holds the port.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from .trace import Trace, held_resources


def _union(intervals: np.ndarray) -> np.ndarray:
    """Merge an (n, 2) array of [start, end) intervals into disjoint sorted intervals."""
    if len(intervals) == 0:
        return np.empty((0, 2))
    iv = intervals[np.argsort(intervals[:, 0], kind="stable")]
    merged = [list(iv[0])]
    for s, e in iv[1:]:
        if s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    return np.array(merged, dtype=float)


def _length(merged: np.ndarray) -> float:
    return float((merged[:, 1] - merged[:, 0]).sum()) if len(merged) else 0.0


def _intersection_length(a: np.ndarray, b: np.ndarray) -> float:
    """Total length of the intersection of two disjoint sorted interval sets."""
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i, 0], b[j, 0]), min(a[i, 1], b[j, 1])
        if hi > lo:
            total += hi - lo
        if a[i, 1] < b[j, 1]:
            i += 1
        else:
            j += 1
    return total


def peak_inflight(trace: pd.DataFrame, rank: int) -> int:
    """Most (stage, microbatch) activations ``rank`` holds at once (see module docstring)."""
    rows = trace[(trace["rank"] == rank) & (trace["category"] == "compute") & trace["stage"].notna()]
    if rows.empty:
        return 0
    g = rows.groupby(["stage", "microbatch", "kind"])
    start = g["start_s"].min()
    end = g["end_s"].max()
    events = []
    backward = {(stage, mb) for stage, mb, kind in end.index if kind in ("B", "I")}
    for (stage, mb, kind), t in start.items():
        if kind == "F":
            events.append((t, 1))
    for (stage, mb, kind), t in end.items():
        if kind in ("B", "I") or (kind == "F" and (stage, mb) not in backward):
            events.append((t, -1))
    events.sort(key=lambda e: (e[0], e[1]))  # frees before allocations at equal times
    level = peak = 0
    for _, d in events:
        level += d
        peak = max(peak, level)
    return peak


@dataclass
class Report:
    """Metrics of one schedule's step. Times in seconds, memory in bytes, ratios in [0, 1].

    ``to_row()`` gives the JSON row of ``simtrain compare --json``.
    """

    schedule: str
    step_time_s: float
    bubble_ratio: float
    bubble_ratio_per_rank: list[float]
    bubble_time_s_per_rank: list[float]
    idle_ratio: float
    idle_ratio_per_rank: list[float]
    span_bubble_ratio: float
    exposed_comm_s: float
    exposed_comm_s_per_rank: list[float]
    comm_s: float
    overlap_ratio: float | None
    peak_memory_bytes: list[float]
    hbm_bytes: float
    fits_in_hbm: bool
    peak_inflight_microbatches: list[int]
    mfu: float | None
    tokens_per_s: float
    model_flops: float
    gpus: int
    a2a_s: float = 0.0
    exposed_a2a_s: float = 0.0
    ep_share: float = 0.0
    link_utilisation: dict[str, float] | None = None
    hfu: float | None = None
    memory_breakdown_bytes: list[dict[str, float]] | None = None

    def to_row(self) -> dict:
        """A plain dict (JSON-serialisable) of every field."""
        return asdict(self)


def compute_report(
    name: str,
    result: Trace,
    *,
    hbm_bytes: float,
    model_flops_per_replica: float,
    peak_flops: float,
    gpus_per_replica: int,
    dp: int,
    tokens_per_replica: float,
    mfu_valid: bool = True,
) -> Report:
    """Compute the :class:`Report` of one simulated step.

    Args:
        name: schedule name.
        result: the engine's output (a :class:`simtrain.trace.Trace`).
        hbm_bytes: HBM capacity per GPU.
        model_flops_per_replica: model FLOPs of the step for one DP replica (all its GPUs).
        peak_flops: peak FLOP/s of one GPU in the compute dtype.
        gpus_per_replica: tp x pp.
        dp: data-parallel degree.
        tokens_per_replica: tokens one replica processes per step (m x b x s).
        mfu_valid: False when durations are fixed op-times (MFU is then reported as None).
    """
    trace = result.trace
    step = result.makespan_s
    ranks = sorted(result.memory["rank"].unique())
    busy, exposed, comm_total, spans, pipe_busy = [], [], [], [], []
    a2a_total, a2a_exposed = [], []
    for r in ranks:
        comp = trace[(trace["rank"] == r) & (trace["category"] == "compute")]
        comp_iv = _union(comp[["start_s", "end_s"]].to_numpy(dtype=float))
        involved = (trace["category"] == "comm") & ((trace["rank"] == r) | (trace["peer"] == r))
        comm_iv = _union(trace.loc[involved, ["start_s", "end_s"]].to_numpy(dtype=float))
        b = _length(comp_iv)
        c = _length(comm_iv)
        busy.append(b)
        comm_total.append(c)
        exposed.append(c - _intersection_length(comm_iv, comp_iv))
        a2a_iv = _union(trace.loc[involved & (trace["kind"] == "a2a"), ["start_s", "end_s"]].to_numpy(dtype=float))
        a2a_total.append(_length(a2a_iv))
        a2a_exposed.append(a2a_total[-1] - _intersection_length(a2a_iv, comp_iv))
        pipe_iv = _union(comp.loc[comp["stage"].notna(), ["start_s", "end_s"]].to_numpy(dtype=float))
        spans.append(pipe_iv[-1, 1] - pipe_iv[0, 0] if len(pipe_iv) else 0.0)
        pipe_busy.append(_length(pipe_iv))
    n = len(ranks)
    max_span = max(spans) if spans else 0.0
    peaks = result.memory.groupby("rank")["bytes"].max().reindex(ranks).tolist()
    total_comm = sum(comm_total)
    # exposed communication lies inside the idle time; the rest of it is the pipeline bubble
    # (subtracted last, so that without communication the figures equal the idle ones bit for bit)
    idle = 1 - sum(busy) / (n * step) if step > 0 else 0.0
    idle_per_rank = [1 - b / step if step > 0 else 0.0 for b in busy]
    return Report(
        schedule=name,
        step_time_s=step,
        bubble_ratio=max(0.0, idle - sum(exposed) / (n * step)) if step > 0 else 0.0,
        bubble_ratio_per_rank=[max(0.0, i - e / step) if step > 0 else 0.0 for i, e in zip(idle_per_rank, exposed)],
        bubble_time_s_per_rank=[max(0.0, float((step - b) - e)) for b, e in zip(busy, exposed)],
        idle_ratio=idle,
        idle_ratio_per_rank=idle_per_rank,
        span_bubble_ratio=1 - float(np.mean(pipe_busy)) / max_span if max_span > 0 else 0.0,
        exposed_comm_s=float(np.mean(exposed)) if exposed else 0.0,
        exposed_comm_s_per_rank=exposed,
        comm_s=total_comm,
        overlap_ratio=(1 - sum(exposed) / total_comm) if total_comm > 0 else None,
        peak_memory_bytes=[float(p) for p in peaks],
        hbm_bytes=hbm_bytes,
        fits_in_hbm=bool(max(peaks) <= hbm_bytes),
        peak_inflight_microbatches=[peak_inflight(trace, r) for r in ranks],
        mfu=(model_flops_per_replica / (step * gpus_per_replica * peak_flops)) if mfu_valid and step > 0 else None,
        tokens_per_s=dp * tokens_per_replica / step if step > 0 else 0.0,
        model_flops=model_flops_per_replica * dp,
        gpus=gpus_per_replica * dp,
        a2a_s=float(np.mean(a2a_total)) if a2a_total else 0.0,
        exposed_a2a_s=float(np.mean(a2a_exposed)) if a2a_exposed else 0.0,
        ep_share=float(np.mean(a2a_exposed)) / step if step > 0 and a2a_exposed else 0.0,
        link_utilisation=link_utilisation(trace, n, step),
    )


def link_utilisation(trace: pd.DataFrame, num_ranks: int, step_s: float) -> dict[str, float]:
    """Busy time / (ranks x step) per port kind (see the module docstring).

    Args:
        trace: the tasks table (its ``resources`` column names the ports each task held).
        num_ranks: ranks simulated.
        step_s: step time.

    Returns:
        ``{kind: utilisation}`` with kind ``"<link>:<direction>"`` for link ports (see
        :func:`simtrain.trace.parse_port`; other resources are their own kind), sorted by kind.
    """
    if step_s <= 0:
        return {}
    busy: dict[str, float] = {}
    for port, _rank, _kind, start, end in held_resources(trace):
        busy[port] = busy.get(port, 0.0) + end - start  # this order of additions is what the goldens pin
    return {k: v / (num_ranks * step_s) for k, v in sorted(busy.items())}


LINK_BUSY_COLUMNS = ["port", "rank", "kind", "busy_s", "fraction"]


def link_busy(trace: pd.DataFrame, step_s: float) -> pd.DataFrame:
    """Busy fraction of every link port, per rank and kind of traffic (what the dashboard draws).

    A port (engine resource ``"<link>:<rank>:<out|in>"``) is held by one task at a time, so the
    busy time of a port is the sum of the durations of the tasks that held it.

    Args:
        trace: the tasks table (``resources``: comma-joined names; empty for none).
        step_s: the step time the fractions are of.

    Returns:
        DataFrame (port, rank, kind, busy_s, fraction), port ``"<link>:<direction>"`` (e.g.
        ``"nvlink:out"``; any other resource its own name, with the rank of the task that held
        it), kind the kind of traffic, sorted by (port, rank, kind); empty when nothing was held.
    """
    held = held_resources(trace) if step_s > 0 else []
    if not held:
        return pd.DataFrame(columns=LINK_BUSY_COLUMNS)
    df = pd.DataFrame([(port, rank, kind, end - start) for port, rank, kind, start, end in held],
                      columns=["port", "rank", "kind", "busy_s"])
    df = df.groupby(["port", "rank", "kind"], as_index=False)["busy_s"].sum()
    df["fraction"] = df["busy_s"] / step_s
    return df[LINK_BUSY_COLUMNS]


def time_breakdown(report: Report, trace: pd.DataFrame) -> dict[str, float]:
    """Where a rank's step goes, in seconds, averaged over ranks (the dashboard's step-time bar).

    Args:
        report: the step's :class:`Report` (its ranks, exposed communication and step time).
        trace: the step's tasks table.

    Returns:
        ``{kind: seconds}``: busy time per compute kind (summed over ranks / ranks), then
        ``"exposed comm"`` (:attr:`Report.exposed_comm_s`) and ``"idle"`` (the rest of the step,
        at least 0). The values add up to the step time when compute and exposed communication
        fit in it.
    """
    n = max(1, len(report.peak_memory_bytes))
    comp = trace[trace["category"] == "compute"]
    out = ((comp["end_s"] - comp["start_s"]).groupby(comp["kind"]).sum() / n).to_dict()
    busy = sum(out.values())
    out["exposed comm"] = report.exposed_comm_s
    out["idle"] = max(0.0, report.step_time_s - busy - report.exposed_comm_s)
    return out
