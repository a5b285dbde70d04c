"""Lowering of the actions of an MoE stage into sub-operations: attention, dispatch, experts, combine.

:func:`moe_items` gives the items of one action on an MoE stage for the chain emitter of
:mod:`simtrain.lowering.chains` (which also adds memory deltas and TP collectives); :func:`add_block`
adds one MoE block's tasks. Each action becomes a chain of *items* from the chunk's segments
(:class:`simtrain.moe.Segment`): a compute item (attention, router, shared experts, dense layers,
head) on the rank's ``compute`` stream, or an MoE block: an all-to-all to the experts, the local
experts' compute, and an all-to-all back. Backward runs the chunk in reverse and each block mirrored
(output gradients to the experts, the experts' backward, input gradients back); with full
recomputation each segment's forward, block included, is replayed first.

Overlap modes:

* **serial** (``waves = 1``): every block is dispatch -> experts -> combine, and the next compute
  waits for the combine;
* **waved** (Waved-EP, DeepSeek-V4 report §3.1; Mega MoE in deepseek-ai/DeepGEMM): the local
  experts are split into ``w`` waves, each moving ``1/w`` of the bytes (paying the link latency
  again) and computing ``1/w`` of the experts. The dispatches of all waves queue on the link at once,
  the experts run in wave order on the compute stream as their dispatch arrives, and each wave's
  combine leaves as soon as its experts finish: a flow shop over (dispatch link, compute stream,
  combine link) whose makespan with independent resources is
  ``(D+L+C)/w + (w-1)/w * max(D, L, C)`` (:func:`flow_shop_makespan`);
* **F&B pairing** (DeepSeek-V3 report §3.2.1, Figure 4): when the schedule overlaps a forward and a
  backward (:class:`simtrain.schedules.ir.OverlapAction`), the two chains' items alternate on the
  compute stream, so that each half's all-to-all is in flight while the other half computes. The
  backward's first item (its chunk's tail: the LM head's backward, or nothing) goes first, so its
  first all-to-all starts at once; the pair's compute then begins with the forward's attention and
  ends with the backward's attention, the layer-by-layer order of DeepSeek's published DualPipe
  profile that pairs without MoE blocks follow (:func:`simtrain.lowering.chains.pair_chains`).
  Pairing and waves compose.

Bandwidth sharing: an all-to-all part holds both directions of the GPU's port of its link class
(``nvlink:<rank>:out/in`` or ``nic:<rank>:out/in``) for its whole duration, since every GPU of the
group sends and receives at once; transfers that need a held port wait in first-come order (the
engine's capacity-1 ports: sharing a port serialises transfers, which gives the same busy time and
the same last end time as fair sharing). So dispatch and combine of overlapping waves share one
link (``a2a_links = "shared"``: the half-duplex flow shop, at least ``max(D+C, L)``), as do p2p and
data-parallel traffic on the same ports. ``a2a_links = "separate"`` gives the way back its own lanes
(``nvlink-combine:<rank>:...``), the idealised full-duplex model of the Waved-EP analysis.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

from ..costs import ChunkCost
from ..costs.ep_sms import PASSES, item_factor
from ..engine import Task, TaskGraph
from ..moe import A2ACost, MoEBlock, MoEChunkCost, Segment
from ..network import A2APart, Topology
from ..schedules.ir import Action
from .items import NO_DELTAS, Block, Compute, Transfer


def flow_shop_makespan(d: float, l: float, c: float, waves: int) -> float:
    """Makespan of ``waves`` equal jobs through three independent machines (dispatch, experts,
    combine) taking ``d``, ``l``, ``c`` in all: ``(d+l+c)/w + (w-1)/w * max(d, l, c)`` (a
    permutation flow shop of identical jobs; the Waved-EP timing model of the reference data)."""
    return (d + l + c) / waves + (waves - 1) / waves * max(d, l, c)


def moe_items(action: Action, chunk: ChunkCost, factor: float = 1.0, layers: int = 1) -> list[Compute | Block]:
    """The items of ``action`` (F, B or I) on ``chunk``, in execution order, every compute
    duration times ``factor`` (the profile's slowdown of an F&B pair's compute, 1 for a plain
    action), with ``layers`` consecutive MoE layers merged into one block (:func:`coarsen`; 1:
    exact). A chunk without MoE blocks (``chunk.moe`` None) is one compute item."""
    return named(item_template(action.kind, chunk, factor, layers), action)


def item_template(kind: str, chunk: ChunkCost, factor: float = 1.0, layers: int = 1,
                  sm: float = 1.0, experts_only: bool = False) -> list[Compute | Block]:
    """:func:`moe_items` of any action of ``kind`` on ``chunk``, each compute item's label only
    the suffix after the action's name (``" part 2"``); the same for every microbatch, so the
    lowering builds it once per stage and kind (:func:`named` completes it).

    ``sm`` (:func:`simtrain.costs.ep_sms.ep_slowdown`, 1: none) slows the compute-bound share of
    the items that run beside EP communication: every item, or with ``experts_only`` the blocks'
    experts (Waved-EP outside a pair), by :func:`simtrain.costs.ep_sms.item_factor` of the
    chunk's ``bound_fraction`` for ``kind``."""
    seg_f = exp_f = factor
    if sm != 1.0 and chunk.moe is not None and kind in PASSES:
        seg, exp = chunk.moe.bound_fraction[PASSES.index(kind)]
        seg_f, exp_f = (factor if experts_only else factor * item_factor(sm, seg)), factor * item_factor(sm, exp)
    return [_scaled(item, seg_f, exp_f) for item in _items(kind, chunk, layers)]


def named(template: list[Compute | Block], action: Action) -> list[Compute | Block]:
    """The items of ``action`` from its kind's :func:`item_template` (labels prefixed with the
    action's name; blocks shared)."""
    name = str(action)
    return [Compute(it.seconds, name + it.label) if isinstance(it, Compute) else it for it in template]


def _scaled(item: Compute | Block, factor: float, expert_factor: float) -> Compute | Block:
    if isinstance(item, Compute):
        return Compute(item.seconds * factor, item.label) if factor != 1.0 else item
    return Block(item.layer, item.expert_s * expert_factor, item.to_experts, item.back, item.names, item.last_layer)


def coarsen(moe: MoEChunkCost, layers: int) -> tuple[tuple[Segment, int | None], ...]:
    """The segments of ``moe``, each with the last layer it stands for (None: only its own),
    each run of ``layers`` consecutive MoE blocks merged into one segment (the last run may be
    shorter): its compute is the run's compute, summed, and its block carries the run's expert
    seconds and all-to-all parts summed (bytes, latency and transfer seconds, so each wave of
    the merged all-to-all lasts as long as the run's waves end to end). The trailing segment
    without a block is kept; ``layers = 1`` gives the segments unchanged.

    This is the approximation ``parallel.moe_coarsen`` selects: a lone action lasts as long as
    the exact one (up to rounding), but the other half of an F&B pair, p2p and DP traffic now
    overlap a few long all-to-alls instead of many short ones."""
    if layers == 1:
        return tuple((seg, None) for seg in moe.segments)
    return _coarsened(moe, layers)


@lru_cache(maxsize=256)
def _coarsened(moe: MoEChunkCost, layers: int) -> tuple[tuple[Segment, int | None], ...]:
    """:func:`coarsen` for ``layers > 1`` (cached: hashing a chunk's segments is cheaper than
    merging them again, and the actions of a chunk share the merged costs)."""
    segments = moe.segments
    blocks = segments[:-1]
    runs = [blocks[i:i + layers] for i in range(0, len(blocks), layers)]
    return (*((_merged(run), run[-1].block.layer if len(run) > 1 else None) for run in runs), (segments[-1], None))


def _merged(run: tuple[Segment, ...]) -> Segment:
    """One segment standing for the consecutive segments ``run`` (each with a block)."""
    if len(run) == 1:
        return run[0]

    def total(get) -> float:
        return sum(get(s) for s in run)

    block = MoEBlock(
        layer=run[0].block.layer,
        expert_forward_s=total(lambda s: s.block.expert_forward_s),
        expert_backward_input_s=total(lambda s: s.block.expert_backward_input_s),
        expert_backward_weight_s=total(lambda s: s.block.expert_backward_weight_s),
        dispatch=_summed([s.block.dispatch for s in run]),
        combine=_summed([s.block.combine for s in run]),
    )
    return Segment(total(lambda s: s.forward_s), total(lambda s: s.backward_input_s),
                   total(lambda s: s.backward_weight_s), total(lambda s: s.recompute_s), block)


def _summed(costs: list[A2ACost]) -> A2ACost:
    """The all-to-all costs ``costs`` (same link classes) as one: bytes and seconds summed."""
    parts = tuple(
        A2APart(ps[0].link, sum(p.nbytes for p in ps), sum(p.latency_s for p in ps), sum(p.transfer_s for p in ps))
        for ps in zip(*(c.parts for c in costs))
    )
    return A2ACost(sum(c.total_bytes for c in costs), parts, costs[0].collective)


def _items(kind: str, chunk: ChunkCost, layers: int = 1) -> list[Compute | Block]:
    if chunk.moe is None:
        seconds = {"F": chunk.forward_s, "B": chunk.backward_s, "I": chunk.backward_input_s}[kind]
        return [Compute(seconds, "")]
    segments = coarsen(chunk.moe, layers)
    items: list[Compute | Block] = []
    if kind == "F":
        for i, (seg, last) in enumerate(segments):
            items.append(Compute(seg.forward_s, f" part {i}"))
            if seg.block is not None:
                items.append(_forward_block(seg.block, last))
        return items
    weight = kind == "B"
    for i in reversed(range(len(segments))):
        seg, last = segments[i]
        if chunk.moe.full_recompute:
            items.append(Compute(seg.recompute_s, f" recompute part {i}"))
            if seg.block is not None:
                items.append(_forward_block(seg.block, last))
        if seg.block is not None:
            b = seg.block
            expert_s = b.expert_backward_input_s + (b.expert_backward_weight_s if weight else 0.0)
            items.append(Block(b.layer, expert_s, b.dispatch, b.combine, ("combine-bwd", "dispatch-bwd"), last))
        items.append(Compute(seg.backward_input_s + (seg.backward_weight_s if weight else 0.0), f" part {i}"))
    return items


def _forward_block(b: MoEBlock, last_layer: int | None = None) -> Block:
    return Block(b.layer, b.expert_forward_s, b.dispatch, b.combine, ("dispatch", "combine"), last_layer)


def transfers(cost: A2ACost, topology: Topology, rank: int, lane: str = "", merged_waves: int = 0) -> list[Transfer]:
    """The engine transfers of ``cost`` on ``rank``'s ports (``lane``: see
    :meth:`simtrain.network.Topology.a2a_routes`): one per link class, or, with ``merged_waves
    = w > 0`` (``parallel.moe_coarsen``), one transfer holding every link class's ports for as
    long as the slowest part's wave of ``w`` lasts (the all-to-all's own end,
    :attr:`simtrain.moe.A2ACost.seconds`), carrying all the bytes; it is named ``links``."""
    nvlink, nic = topology.a2a_routes(rank, lane)
    ports = {"nvlink": nvlink.resources, "nic": nic.resources}
    if merged_waves and len(cost.parts) > 1:
        slowest = max(cost.parts, key=lambda p: p.seconds(merged_waves))
        part = A2APart("links", sum(p.nbytes for p in cost.parts), slowest.latency_s, slowest.transfer_s)
        return [Transfer(part, tuple(r for p in cost.parts for r in ports[p.link]))]
    return [Transfer(p, ports[p.link]) for p in cost.parts]


def add_block(
    graph: TaskGraph,
    rank: int,
    *,
    waves: int,
    after: Sequence[int],
    expert_s: float,
    to_experts: Sequence[Transfer],
    back: Sequence[Transfer],
    kind: str = "F",
    names: tuple[str, str] = ("dispatch", "combine"),
    label: str = "",
    stage: int | None = None,
    microbatch: int | None = None,
) -> tuple[list[Task], list[Task], list[Task]]:
    """Add one MoE block split into ``waves`` waves (1 = serial) to ``graph``.

    Wave i's transfers to the experts wait for the tasks ``after``; its experts (``expert_s /
    waves`` on ``rank``'s compute stream, in wave order) wait for them; its transfers back wait for
    its experts. All transfers are stream-less and hold their ports (see the module docstring).

    Args:
        graph: the graph to extend.
        rank: the rank recorded on every task.
        waves: waves (>= 1).
        after: ids of the tasks the first all-to-all waits for.
        expert_s: seconds of all the block's expert compute.
        to_experts, back: the two all-to-alls, one :class:`Transfer` per link class.
        kind: kind of the expert tasks (the action's kind, so metrics count them with it).
        names: trace names of the two all-to-alls.
        label, stage, microbatch: recorded on the tasks.

    Returns:
        ``(expert tasks, tasks to the experts, tasks back)``; whatever follows the block waits for
        the tasks back (or the last expert task when the way back carries nothing).
    """
    tasks = graph.tasks  # tasks are appended in place, as TaskGraph.add does, without its keyword round trip
    append, tid = tasks.append, len(tasks)
    # each transfer's per-wave duration, bytes, ports and link name, worked out once for all waves
    out_parts = [(t.part.seconds(waves), t.part.nbytes / waves, t.resources, t.part.link) for t in to_experts]
    back_parts = [(t.part.seconds(waves), t.part.nbytes / waves, t.resources, t.part.link) for t in back]
    share = expert_s / waves
    experts, sent, returned = [], [], []

    def transfers(parts, head: str, deps, into: list) -> None:
        """One task per transfer of ``parts`` (ids from ``tid`` on), all waiting on ``deps``."""
        nonlocal tid
        for seconds, nbytes, resources, link in parts:
            task = Task(tid, head + link, rank, "comm", "a2a", seconds, deps, None, resources,
                        stage, microbatch, nbytes, None, NO_DELTAS, NO_DELTAS)
            append(task)
            into.append(task)
            tid += 1

    start = tuple(after)  # the dependencies of every transfer to the experts (shared: never changed)
    for i in range(waves):
        tag = f" w{i + 1}/{waves}" if waves > 1 else ""
        first = tid
        transfers(out_parts, f"{names[0]} {label}{tag} ", start, sent)
        expert = Task(tid, f"experts {label}{tag}", rank, "compute", kind, share,
                      list(range(first, tid)) or list(after), "compute", (), stage, microbatch)
        append(expert)
        experts.append(expert)
        tid += 1
        transfers(back_parts, f"{names[1]} {label}{tag} ", (expert.tid,), returned)
    return experts, sent, returned
