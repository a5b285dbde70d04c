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
* Host copies of activation offload (kind ``offload``, :mod:`simtrain.lowering.offload`) are not
  communication between GPUs: they count in neither of the two above. A backward that waits for
  its reload is idle time of its rank (bubble), and the step time shows the cost.
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
from typing import TYPE_CHECKING

import numpy as np

from .trace import Columns, Trace, held_ports, held_resources

if TYPE_CHECKING:
    import pandas as pd

_NO_INTERVALS = (np.empty(0), np.empty(0))


def _merge(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Merge [start, end) intervals sorted by start into disjoint sorted intervals (touching ones
    join): a new interval begins where a start lies after every end before it.

    Returns:
        ``(starts, ends)`` of the merged intervals, float arrays.
    """
    if len(start) == 0:
        return _NO_INTERVALS
    reach = np.maximum.accumulate(end)
    first = np.flatnonzero(np.concatenate(([True], start[1:] > reach[:-1])))
    last = np.append(first[1:] - 1, len(start) - 1)
    return start[first], reach[last]


def _unions(owner: np.ndarray, start: np.ndarray, end: np.ndarray, ranks: np.ndarray) -> list:
    """:func:`_merge` of the intervals of each rank, for all ranks with one sort.

    Args:
        owner: rank of each interval (int array); start, end: its bounds (s).
        ranks: the ranks wanted, sorted.

    Returns:
        One ``(starts, ends)`` pair per entry of ``ranks`` (empty arrays for a rank with none).
    """
    order = _by_owner_then_start(owner, start)
    owner, start, end = owner[order], start[order], end[order]
    lo, hi = np.searchsorted(owner, ranks, "left"), np.searchsorted(owner, ranks, "right")
    return [_merge(start[a:b], end[a:b]) for a, b in zip(lo.tolist(), hi.tolist())]


def _by_owner_then_start(owner: np.ndarray, start: np.ndarray) -> np.ndarray:
    """The permutation ``np.lexsort((start, owner))`` (sorted by owner, then start, ties in index
    order), in two stable sorts that are linear on a trace: by start (timsort; the tasks table is
    sorted by start already, or a few sorted runs of it are joined), then by owner (radix sort,
    for ranks below 2**16)."""
    if len(owner) == 0 or owner.min() < 0 or owner.max() >= 1 << 16:
        return np.lexsort((start, owner))
    by_start = np.argsort(start, kind="stable")
    return by_start[np.argsort(owner[by_start].astype(np.uint16), kind="stable")]


def _length(merged: tuple[np.ndarray, np.ndarray]) -> float:
    """Total length of merged intervals (numpy's pairwise sum of their lengths)."""
    start, end = merged
    return float((end - start).sum()) if len(start) else 0.0


def _intersection_length(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> float:
    """Total length of the intersection of two disjoint sorted interval sets: every pair that
    overlaps gives one piece; the pieces, in time order, are added one after the other."""
    (a_start, a_end), (b_start, b_end) = a, b
    if len(a_start) == 0 or len(b_start) == 0:
        return 0.0
    first = np.searchsorted(b_end, a_start, "right")  # first b ending after a starts
    stop = np.searchsorted(b_start, a_end, "left")  # b's starting before a ends
    count = np.maximum(stop - first, 0)
    if not count.any():
        return 0.0
    ai = np.repeat(np.arange(len(a_start)), count)
    bi = np.arange(count.sum()) - np.repeat(np.cumsum(count) - count, count) + np.repeat(first, count)
    piece = np.minimum(a_end[ai], b_end[bi]) - np.maximum(a_start[ai], b_start[bi])
    piece = piece[piece > 0]
    return float(np.cumsum(piece)[-1]) if len(piece) else 0.0


def _changes(*keys: np.ndarray) -> np.ndarray:
    """True where any of the (sorted) key arrays differs from the row before (and at row 0)."""
    out = np.zeros(len(keys[0]), bool)
    out[0] = True
    for k in keys:
        out[1:] |= k[1:] != k[:-1]
    return out


def _peak_inflight(cols: Columns, ranks: np.ndarray) -> list[int]:
    """Most (stage, microbatch) activations each of ``ranks`` holds at once (see module docstring).

    Per (rank, stage, microbatch, kind) of the compute tasks of pipeline actions: an F allocates at
    its first start; a B or an I frees at its last end; the F of a (stage, microbatch) without B
    or I frees at its own last end. At equal times frees come first.
    """
    code = np.select([cols.equal("kind", "F"), cols.equal("kind", "B"), cols.equal("kind", "I")], [0, 1, 2], -1)
    keep = cols.equal("category", "compute") & ~np.isnan(cols["stage"]) & ~np.isnan(cols["microbatch"]) & (code >= 0)
    if not keep.any():
        return [0] * len(ranks)
    rank, stage, mb, code = cols["rank"][keep], cols["stage"][keep], cols["microbatch"][keep], code[keep]
    order = np.lexsort((code, mb, stage, rank))
    rank, stage, mb, code = rank[order], stage[order], mb[order], code[order]
    first = np.flatnonzero(_changes(rank, stage, mb, code))  # one group per (rank, stage, mb, kind)
    g_start = np.minimum.reduceat(cols["start_s"][keep][order], first)
    g_end = np.maximum.reduceat(cols["end_s"][keep][order], first)
    rank, code = rank[first], code[first]
    action = np.cumsum(_changes(rank, stage[first], mb[first])) - 1
    has_backward = np.zeros(action[-1] + 1, bool)
    has_backward[action[code > 0]] = True
    frees = (code > 0) | ~has_backward[action]
    alloc = code == 0
    ev_rank = np.concatenate((rank[alloc], rank[frees]))
    ev_time = np.concatenate((g_start[alloc], g_end[frees]))
    ev_delta = np.concatenate((np.ones(alloc.sum(), np.int64), -np.ones(frees.sum(), np.int64)))
    order = np.lexsort((ev_delta, ev_time, ev_rank))
    ev_rank, level = ev_rank[order], np.cumsum(ev_delta[order])
    lo, hi = np.searchsorted(ev_rank, ranks, "left"), np.searchsorted(ev_rank, ranks, "right")
    peaks = []
    for a, b in zip(lo.tolist(), hi.tolist()):
        base = int(level[a - 1]) if a > 0 else 0
        peaks.append(max(0, int(level[a:b].max()) - base) if b > a else 0)
    return peaks


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


def _per_rank(cols: Columns, ranks: np.ndarray) -> dict[str, list[float]]:
    """Per rank (in ``ranks`` order), in seconds: compute-busy time (``busy``), communication in
    flight (``comm``) and its exposed part (``exposed``), the same for all-to-all (``a2a``,
    ``a2a_exposed``), the span of pipeline actions (``span``) and their busy time (``pipe``).

    A communication task involves its rank and its peer; intervals of a rank are merged before
    they are measured (see the module docstring)."""
    rank, peer, start, end = cols["rank"], cols["peer"], cols["start_s"], cols["end_s"]
    compute = cols.equal("category", "compute")
    comm = cols.equal("category", "comm") & ~cols.equal("kind", "offload")  # host copies are not GPU communication
    to_peer = comm & ~np.isnan(peer)
    to_peer[to_peer] = peer[to_peer] != rank[to_peer]  # a transfer to itself involves its rank once
    owner = np.concatenate((rank[comm], peer[to_peer].astype(np.int64)))
    c_start, c_end = np.concatenate((start[comm], start[to_peer])), np.concatenate((end[comm], end[to_peer]))
    a2a = cols.equal("kind", "a2a")
    is_a2a = np.concatenate((a2a[comm], a2a[to_peer]))
    pipe = compute & ~np.isnan(cols["stage"])
    comp_iv = _unions(rank[compute], start[compute], end[compute], ranks)
    comm_iv = _unions(owner, c_start, c_end, ranks)
    a2a_iv = _unions(owner[is_a2a], c_start[is_a2a], c_end[is_a2a], ranks)
    pipe_iv = _unions(rank[pipe], start[pipe], end[pipe], ranks)
    out: dict[str, list[float]] = {k: [] for k in ("busy", "comm", "exposed", "a2a", "a2a_exposed", "span", "pipe")}
    for comp, com, a2a, pip in zip(comp_iv, comm_iv, a2a_iv, pipe_iv):
        out["busy"].append(_length(comp))
        out["comm"].append(_length(com))
        out["exposed"].append(out["comm"][-1] - _intersection_length(com, comp))
        out["a2a"].append(_length(a2a))
        out["a2a_exposed"].append(out["a2a"][-1] - _intersection_length(a2a, comp))
        out["span"].append(float(pip[1][-1] - pip[0][0]) if len(pip[0]) else 0.0)
        out["pipe"].append(_length(pip))
    return out


RATIO_NOISE = 1e-12
"""A ratio closer to 0 than this is 0: a difference of sums of float seconds leaves ~1e-16 where
the exact value is 0 (e.g. a zero-bubble schedule's bubble ratio of 5.55e-17)."""


def tidy_ratio(ratio: float) -> float:
    """``ratio``, with float noise around 0 (``|ratio| < RATIO_NOISE``) made exactly 0.0."""
    return 0.0 if abs(ratio) < RATIO_NOISE else float(ratio)


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
    step = result.makespan_s
    mem = result.memory_columns
    ranks = np.array(sorted(set(mem["rank"].tolist())), dtype=np.int64)  # (np.unique would import numpy.ma)
    per = _per_rank(result.columns, ranks)
    busy, exposed, comm_total, spans, pipe_busy = per["busy"], per["exposed"], per["comm"], per["span"], per["pipe"]
    a2a_total, a2a_exposed = per["a2a"], per["a2a_exposed"]
    n = len(ranks)
    max_span = max(spans) if spans else 0.0
    peaks = np.full(len(ranks), -np.inf)
    np.maximum.at(peaks, np.searchsorted(ranks, mem["rank"]), mem["bytes"])
    total_comm = sum(comm_total)
    # exposed communication lies inside the idle time; the rest of it is the pipeline bubble
    # (subtracted last, so that without communication the figures equal the idle ones bit for bit)
    idle = 1 - sum(busy) / (n * step) if step > 0 else 0.0
    idle_per_rank = [1 - b / step if step > 0 else 0.0 for b in busy]
    return Report(
        schedule=name,
        step_time_s=step,
        bubble_ratio=tidy_ratio(max(0.0, idle - sum(exposed) / (n * step))) if step > 0 else 0.0,
        bubble_ratio_per_rank=[tidy_ratio(max(0.0, i - e / step)) if step > 0 else 0.0 for i, e in zip(idle_per_rank, exposed)],
        bubble_time_s_per_rank=[max(0.0, float((step - b) - e)) for b, e in zip(busy, exposed)],
        idle_ratio=tidy_ratio(idle),
        idle_ratio_per_rank=[tidy_ratio(i) for i in idle_per_rank],
        span_bubble_ratio=tidy_ratio(1 - float(np.mean(pipe_busy)) / max_span) if max_span > 0 else 0.0,
        exposed_comm_s=float(np.mean(exposed)) if exposed else 0.0,
        exposed_comm_s_per_rank=exposed,
        comm_s=total_comm,
        overlap_ratio=tidy_ratio(1 - sum(exposed) / total_comm) if total_comm > 0 else None,
        peak_memory_bytes=[float(p) for p in peaks],
        hbm_bytes=hbm_bytes,
        fits_in_hbm=bool(peaks.max() <= hbm_bytes),
        peak_inflight_microbatches=_peak_inflight(result.columns, ranks),
        mfu=(model_flops_per_replica / (step * gpus_per_replica * peak_flops)) if mfu_valid and step > 0 else None,
        tokens_per_s=dp * tokens_per_replica / step if step > 0 else 0.0,
        model_flops=model_flops_per_replica * dp,
        gpus=gpus_per_replica * dp,
        a2a_s=float(np.mean(a2a_total)) if a2a_total else 0.0,
        exposed_a2a_s=float(np.mean(a2a_exposed)) if a2a_exposed else 0.0,
        ep_share=float(np.mean(a2a_exposed)) / step if step > 0 and a2a_exposed else 0.0,
        link_utilisation=link_utilisation(result, n, step),
    )


def link_utilisation(trace: Trace, num_ranks: int, step_s: float) -> dict[str, float]:
    """Busy time / (ranks x step) per port kind (see the module docstring).

    Args:
        trace: the step (its ``resources`` column names the ports each task held).
        num_ranks: ranks simulated.
        step_s: step time.

    Returns:
        ``{kind: utilisation}`` with kind ``"<link>:<direction>"`` for link ports (see
        :func:`simtrain.trace.held_ports`; other resources are their own kind), sorted by kind.
    """
    if step_s <= 0:
        return {}
    cols = trace.columns
    code, distinct = trace.codes("resources")  # resources entry -> its code (not a string: none held)
    holders: dict[str, dict[int, int]] = {}  # port kind -> {entry code: how often the entry holds one}
    for res, i in distinct.items():
        for port, _rank in held_ports(res) if isinstance(res, str) else ():
            per_entry = holders.setdefault(port, {})
            per_entry[i] = per_entry.get(i, 0) + 1
    sums: dict[tuple, float] = {}  # port kinds held by the same tasks alike (a link's out and in ports) sum alike
    busy: dict[str, float] = {}
    for port, per_entry in holders.items():
        key = tuple(per_entry.items())  # (filled in one order: the same holders give the same key)
        if key not in sums:
            times = np.zeros(len(code), np.int64)
            times[list(per_entry)] = list(per_entry.values())
            count = times[code]
            rows = np.repeat(np.flatnonzero(count), count[count > 0])  # table order, once per holding
            # ((0 + end) - start + end) - start ... in table order (the order the goldens pin), as one
            # running sum over end, -start, end, -start, ...: add.accumulate adds one by one, and
            # a - b is a + (-b) exactly in IEEE 754
            terms = np.empty(2 * len(rows))
            terms[0::2], terms[1::2] = cols["end_s"][rows], -cols["start_s"][rows]
            sums[key] = float(np.add.accumulate(terms)[-1]) if len(rows) else 0.0
        busy[port] = sums[key]
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
    import pandas as pd

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
