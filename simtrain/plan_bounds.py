"""Analytic bounds of the planner (:mod:`simtrain.plan`): what a configuration needs at least, in
HBM bytes and in step seconds, without simulating it.

Both are *lower* bounds of what :func:`simtrain.scenario.run_schedule` reports, so pruning with
them never drops a configuration the simulator would have kept (tests/test_plan.py checks
``bound <= simulated`` on every schedule of the registry):

* **memory** of rank r: the static bytes of the chunks it holds plus the most activation bytes its
  own action order ever holds. The lowering (:mod:`simtrain.lowering`) allocates a chunk's
  activation when F starts, frees it when B ends, frees all but W's share at the end of I and the
  rest at the end of W; the rank's compute stream runs its actions in order, so the running sum
  after each action is reached in the timeline. An overlapped F&B pair is counted after both its
  halves (its interior may go higher, never lower than both ends).
* **step time** of rank r: ``head_r + busy_r - tp_r + max(tail_r, optimizer_r)``. ``busy_r`` sums the
  compute of its actions (plus, outside pairs and MoE steps, the TP collectives the next action
  waits for, and the per-action overhead); a pair costs ``overlap_compute_factor x (F + B)``,
  plus its TP collectives where they block its compute stream (``overlap.tp: blocking``, no MoE).
  No action waits for the last action's TP collectives (the optimizer step runs beside them), so
  ``tp_r``, the most TP seconds of any one action of the rank, is taken off.
  ``head_r``: a rank's first action is a forward, which needs the forwards of the stages before it
  on that microbatch's path (the 1F1B warm-up, Narayanan et al. 2021 §2.2: the ``(p-1)·t_f`` of
  the bubble). ``tail_r`` (schedules without split backward only): after the rank's last B the
  stages before it on that path still run theirs (the cool-down ``(p-1)·t_b``). The optimizer
  step follows the rank's last action. Communication other than TP, and the DP reduction, are left
  out (they can overlap). With uniform stages and 1F1B this is ``(m + p - 1)(t_f + t_b)``, the
  bubble formula of Narayanan et al. 2021 Eq. (1) / Huang et al. 2019.

Before any schedule is generated a cheaper bound orders the search: every microbatch passes every
chunk once, so some rank computes at least the mean, ``m · Σ_c (F_c + B_c) / p``; every chunk is
held by some rank, so some rank holds at least ``Σ_c static_c / p`` (the largest TP collective of
one action is taken off, as above).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from .costs import ChunkCost, StageCosts, split_layers
from .lowering.chains import tp_seconds
from .network import Topology
from .schedules.ir import OverlapAction, Schedule


@dataclass(frozen=True)
class RankShape:
    """What the bounds need from one pipeline rank's action order.

    Attributes:
        chunks: the model chunks the rank holds.
        counts: ``(kind, chunk, paired) -> actions`` (kind F, B, I or W; paired: half of an F&B pair),
            scaled to the step's microbatches.
        heads: per candidate first action, the chunks whose forwards must run before it.
        tails: per candidate last action, the chunks whose backwards must run after it
            (empty when the schedule splits backwards into I and W).
        memory_rows: distinct running sums of held activations after each action, as counts
            ``(n, 2 x len(chunks))``: first the activation units of each chunk, then W's units.
    """

    chunks: tuple[int, ...]
    counts: dict[tuple[str, int, bool], float]
    heads: tuple[tuple[int, ...], ...]
    tails: tuple[tuple[int, ...], ...]
    memory_rows: np.ndarray


_DELTA = {"F": (1, 0), "B": (-1, 0), "I": (-1, 1), "W": (0, -1)}  # (activation, W-share) units


def divisors(n: int) -> list[int]:
    """Every divisor of ``n`` >= 1, ascending (trial division up to sqrt(n): O(sqrt n), so a
    request for a billion GPUs enumerates in milliseconds)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


def shape_microbatches(microbatches: int, ranks: int, paired: bool = False) -> int:
    """Microbatches of the schedule the bounds read for a step of ``microbatches``: all of them up
    to ``4 x ranks``, else ``4 x ranks`` plus the remainder modulo ``2 x ranks`` (the warm-up,
    cool-down and the schedules' divisibility rules are kept; steady-state rounds add nothing to
    the in-flight peak, and their action counts are scaled back up by :func:`schedule_shape`).
    tests/test_plan_bounds.py checks that the capped bounds stay below the full ones.

    A schedule of overlapped F&B pairs (``paired``: DualPipe, DualPipeV) is not capped: its steady
    state is all pairs, whose TP collectives hide behind the other half, so scaling a capped
    schedule's counts would price too many unpaired actions, TP included, and could exceed the step.
    """
    cap = 4 * ranks
    if paired or microbatches <= cap:
        return microbatches
    return cap + (microbatches - cap) % (2 * ranks)


def scale_shape(shapes: tuple[RankShape, ...], factor: float) -> tuple[RankShape, ...]:
    """``shapes`` with every action count times ``factor`` (a capped schedule's counts scaled to the
    step's microbatches: every microbatch visits its path once)."""
    return tuple(replace(sh, counts={k: n * factor for k, n in sh.counts.items()}) for sh in shapes)


def schedule_shape(schedule: Schedule, microbatches: int | None = None) -> tuple[RankShape, ...]:
    """Summarise ``schedule`` per rank for :func:`memory_bound` and :func:`step_bound` (cost-free,
    so one summary serves every model, degree and recompute mode).

    Args:
        schedule: the (possibly capped, :func:`shape_microbatches`) schedule.
        microbatches: the step's real microbatches (default: the schedule's), see :func:`scale_shape`.

    Returns:
        One :class:`RankShape` per pipeline rank.
    """
    split = any(a.kind in ("I", "W") for order in schedule.orders for act in order for a in act.parts)
    paths = {schedule.path(mb) for mb in range(schedule.num_microbatches)}
    shapes = []
    for rank, order in enumerate(schedule.orders):
        chunks = tuple(sorted({schedule.chunk_of(s) for s in schedule.stages_of(rank)}))
        col = {c: i for i, c in enumerate(chunks)}
        counts: dict[tuple[str, int, bool], int] = {}
        held = [0] * (2 * len(chunks))
        rows = {tuple(held)}
        for act in order:
            paired = isinstance(act, OverlapAction)
            for a in act.parts:
                c = schedule.chunk_of(a.stage)
                counts[(a.kind, c, paired)] = counts.get((a.kind, c, paired), 0) + 1
                d_act, d_w = _DELTA[a.kind]
                held[col[c]] += d_act
                held[len(chunks) + col[c]] += d_w
            rows.add(tuple(held))
        heads, tails = set(), set()
        for path in paths:
            for p, stage in enumerate(path):
                if schedule.stage_to_rank[stage] == rank:
                    before = tuple(sorted(schedule.chunk_of(s) for s in path[:p]))
                    heads.add(before)
                    if not split:
                        tails.add(before)
        shapes.append(RankShape(chunks, counts, tuple(heads), tuple(tails), np.array(sorted(rows))))
    scale = (microbatches or schedule.num_microbatches) / schedule.num_microbatches
    return scale_shape(tuple(shapes), scale) if scale != 1 else tuple(shapes)


def memory_bound(shapes: tuple[RankShape, ...], costs: StageCosts) -> float:
    """Lower bound of the simulated peak memory (bytes) of the worst rank (module docstring)."""
    worst = 0.0
    for sh in shapes:
        per_unit = np.array([costs.chunks[c].activation_bytes for c in sh.chunks]
                            + [costs.chunks[c].weight_grad_bytes for c in sh.chunks])
        static = costs.static_bytes(sh.chunks) - costs.lazy_grad_bytes(sh.chunks)  # grad_allocation: at least
        worst = max(worst, static + float((sh.memory_rows @ per_unit).max()))
    return worst


def _action_times(costs: StageCosts, topology: Topology, kind: str, chunk: int, paired: bool) -> tuple[float, float]:
    """``(busy, tp)``: seconds an action surely keeps its rank's compute stream busy, and of those
    the TP collectives the action after it waits for (none in an MoE step, nor in a pair whose
    TP collectives are hidden, ``overlap.tp: hidden``). TP collectives are priced for pipeline
    rank 0, whose TP group (GPUs 0 .. tp-1) has the fastest route."""
    hardware = topology.hardware
    c = costs.chunks[chunk]
    compute = {"F": c.forward_s, "B": c.backward_s, "I": c.backward_input_s, "W": c.backward_weight_s}[kind]
    hidden = paired and hardware.overlap_tp == "hidden"
    tp = 0.0 if c.moe is not None or hidden else tp_seconds(c, kind, topology, 0)
    if paired:
        return compute * hardware.overlap_compute_factor + tp + hardware.action_overhead_s, tp
    return compute + tp + hardware.action_overhead_s, tp


def step_bound(shapes: tuple[RankShape, ...], costs: StageCosts, topology: Topology) -> float:
    """Lower bound of the simulated step time (seconds): the max over ranks of
    ``head + busy - tp + max(tail, optimizer)`` (module docstring)."""
    paired_any = any(p for sh in shapes for (_k, _c, p) in sh.counts)
    chunks = range(len(costs.chunks))
    keys = {k for sh in shapes for k in sh.counts} | {(kind, c, paired_any) for kind in "FB" for c in chunks}
    times = {k: _action_times(costs, topology, *k) for k in keys}
    fwd = [times[("F", c, paired_any)][0] for c in chunks]
    bwd = [times[("B", c, paired_any)][0] for c in chunks]
    best = 0.0
    for sh in shapes:
        busy = sum(n * times[k][0] for k, n in sh.counts.items())
        last_tp = max((times[k][1] for k, n in sh.counts.items() if n), default=0.0)
        head = min((sum(fwd[c] for c in h) for h in sh.heads), default=0.0)
        tail = min((sum(bwd[c] for c in t) for t in sh.tails), default=0.0)
        best = max(best, head + busy - last_tp + max(tail, costs.optimizer_s(sh.chunks)))
    return best


@dataclass(frozen=True)
class MeanBounds:
    """Schedule-free sums of a model cut one layer per chunk, for :func:`cheap_step_bound`.

    Attributes:
        work_s: sum over chunks of one microbatch's F + B (+ TP) seconds.
        optimizer_s: optimizer seconds of all parameters.
        static_bytes: static bytes of all parameters.
        min_work_s, min_optimizer_s: the same for the cheapest single layer.
        layers: transformer layers.
        tp_s: the most TP seconds of one action (F or B of a chunk), which the last action of a
            rank need not wait for (:func:`step_bound`).
    """

    work_s: float
    optimizer_s: float
    static_bytes: float
    min_work_s: float
    min_optimizer_s: float
    layers: int
    tp_s: float = 0.0


def mean_bounds(costs: StageCosts, topology: Topology, paired: bool) -> MeanBounds:
    """Sum ``costs`` (one layer per chunk) for the schedule-free bounds; ``paired``: the schedule
    overlaps F&B pairs (compute x ``overlap_compute_factor``; TP as :func:`_action_times`)."""
    times = [(_action_times(costs, topology, "F", c, paired), _action_times(costs, topology, "B", c, paired))
             for c in range(len(costs.chunks))]
    per = [f[0] + b[0] for f, b in times]
    opt = [costs.optimizer_s([c]) for c in range(len(costs.chunks))]
    tp = max(t[1] for pair in times for t in pair)
    return MeanBounds(sum(per), sum(opt), costs.static_bytes(range(len(costs.chunks))), min(per), min(opt),
                      len(costs.chunks), tp)


def cheap_step_bound(mb: MeanBounds, microbatches: int, ranks: int, copies: bool, chunks: int | None = None) -> float:
    """Lower bound of the step (seconds) before the schedule is known: the ranks' mean of compute
    plus optimizer, and (each layer on one rank: ``copies`` False) the pigeonhole bound that some
    rank holds at least ``ceil(layers / ranks)`` layers; less the TP seconds of a rank's last
    action, which nothing waits for: at most ``ceil(layers / chunks)`` of ``mb``'s entries
    (:func:`simtrain.costs.split_layers` cuts ``chunks`` chunks as evenly as that).

    Args:
        mb: :func:`mean_bounds` of one-layer chunks, or of the configuration's own chunks.
        microbatches, ranks: m and p.
        copies: a chunk may be held by two ranks (DualPipe).
        chunks: the configuration's model chunks (None: ``mb.layers``, its entries are the chunks).
    """
    bound = (microbatches * mb.work_s + mb.optimizer_s) / ranks
    if not copies:
        most = -(-mb.layers // ranks)
        bound = max(bound, most * (microbatches * mb.min_work_s + mb.min_optimizer_s))
    return bound - -(-mb.layers // (chunks or mb.layers)) * mb.tp_s


_SUMMED = ("forward_s", "backward_input_s", "backward_weight_s", "forward_flops",
           "backward_input_flops", "backward_weight_flops", "activation_bytes", "weight_grad_bytes", "params",
           "expert_params")


def aggregate(per_layer: StageCosts, num_chunks: int) -> StageCosts:
    """Costs of ``num_chunks`` chunks as sums of a one-layer-per-chunk ``per_layer`` (dense models:
    :func:`simtrain.costs.stage_costs` adds up its per-layer terms, the embedding sits on the first
    chunk and the LM head with its tied copy on the last, so the sums are its chunks' values; only
    gradient accumulation, which grows with the microbatches, is left out when ``per_layer`` was
    built for one microbatch, keeping the result a lower bound).

    Raises:
        SimtrainError: more chunks than layers (:func:`simtrain.costs.split_layers`).
    """
    chunks, first = [], 0
    for c, n in enumerate(split_layers(len(per_layer.chunks), num_chunks)):
        part = per_layer.chunks[first:first + n]
        first += n
        sums = {f: sum(getattr(x, f) for x in part) for f in _SUMMED}
        chunks.append(ChunkCost(chunk=c, layers=tuple(i for x in part for i in x.layers), has_embedding=c == 0,
                                has_head=c == num_chunks - 1, p2p_bytes=part[0].p2p_bytes,
                                tp_forward=_merged(x.tp_forward for x in part),
                                tp_backward=_merged(x.tp_backward for x in part), **sums))
    return replace(per_layer, chunks=tuple(chunks))


def _merged(groups) -> tuple:
    """Declared collectives of several chunks as one tuple, equal ones merged by adding ``repeat``."""
    total: dict = {}
    for group in groups:
        for c in group:
            key = replace(c, repeat=1)
            total[key] = total.get(key, 0) + c.repeat
    return tuple(replace(k, repeat=n) for k, n in total.items())
