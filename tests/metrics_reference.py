"""The metrics as simtrain computed them before they moved to numpy (per-rank pandas masks and
Python interval loops), kept as the reference that tests/test_metrics_reference.py compares the
vectorised :func:`simtrain.metrics.compute_report` with, bit for bit."""

from __future__ import annotations

import numpy as np
import pandas as pd

from simtrain.trace import Trace, parse_port


def _union(intervals: np.ndarray) -> np.ndarray:
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


def _peak_inflight(trace: pd.DataFrame, rank: int) -> int:
    rows = trace[(trace["rank"] == rank) & (trace["category"] == "compute") & trace["stage"].notna()]
    if rows.empty:
        return 0
    g = rows.groupby(["stage", "microbatch", "kind"])
    start, end = g["start_s"].min(), g["end_s"].max()
    events = []
    backward = {(stage, mb) for stage, mb, kind in end.index if kind in ("B", "I")}
    for (stage, mb, kind), t in start.items():
        if kind == "F":
            events.append((t, 1))
    for (stage, mb, kind), t in end.items():
        if kind in ("B", "I") or (kind == "F" and (stage, mb) not in backward):
            events.append((t, -1))
    events.sort(key=lambda e: (e[0], e[1]))
    level = peak = 0
    for _, d in events:
        level += d
        peak = max(peak, level)
    return peak


def _link_utilisation(trace: pd.DataFrame, num_ranks: int, step_s: float) -> dict[str, float]:
    if step_s <= 0:
        return {}
    busy: dict[str, float] = {}
    held = trace[trace["resources"].fillna("") != ""]
    for res, start, end in zip(held["resources"], held["start_s"], held["end_s"]):
        for name in str(res).split(","):
            port = parse_port(name)
            key = f"{port[0]}:{port[2]}" if port else name
            busy[key] = busy.get(key, 0.0) + end - start
    return {k: v / (num_ranks * step_s) for k, v in sorted(busy.items())}


def per_rank_reference(result: Trace) -> dict:
    """The per-rank and whole-step figures of the old ``compute_report``: ranks, busy, comm,
    exposed, a2a, a2a_exposed, span, pipe, peaks (memory), inflight and link utilisation."""
    trace, step = result.tasks, result.makespan_s
    ranks = sorted(result.memory["rank"].unique())
    out: dict = {k: [] for k in ("busy", "comm", "exposed", "a2a", "a2a_exposed", "span", "pipe")}
    for r in ranks:
        comp = trace[(trace["rank"] == r) & (trace["category"] == "compute")]
        comp_iv = _union(comp[["start_s", "end_s"]].to_numpy(dtype=float))
        involved = ((trace["category"] == "comm") & (trace["kind"] != "offload")
                    & ((trace["rank"] == r) | (trace["peer"] == r)))
        comm_iv = _union(trace.loc[involved, ["start_s", "end_s"]].to_numpy(dtype=float))
        out["busy"].append(_length(comp_iv))
        out["comm"].append(_length(comm_iv))
        out["exposed"].append(out["comm"][-1] - _intersection_length(comm_iv, comp_iv))
        a2a_iv = _union(trace.loc[involved & (trace["kind"] == "a2a"), ["start_s", "end_s"]].to_numpy(dtype=float))
        out["a2a"].append(_length(a2a_iv))
        out["a2a_exposed"].append(out["a2a"][-1] - _intersection_length(a2a_iv, comp_iv))
        pipe_iv = _union(comp.loc[comp["stage"].notna(), ["start_s", "end_s"]].to_numpy(dtype=float))
        out["span"].append(pipe_iv[-1, 1] - pipe_iv[0, 0] if len(pipe_iv) else 0.0)
        out["pipe"].append(_length(pipe_iv))
    out["ranks"] = [int(r) for r in ranks]
    out["peaks"] = [float(p) for p in result.memory.groupby("rank")["bytes"].max().reindex(ranks)]
    out["inflight"] = [_peak_inflight(trace, r) for r in ranks]
    out["link_utilisation"] = _link_utilisation(trace, len(ranks), step)
    return out
