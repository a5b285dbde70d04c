"""The first lowering pass: every action of every rank becomes one chain of items, emitted by one
emitter.

A schedule step of a rank (one plain action, or the two halves of an overlapped F&B pair) becomes
one :class:`~simtrain.lowering.items.Chain` per action, built from one table of what each action
kind computes (:func:`compute_s`), holds in memory (:func:`memory`) and communicates inside the
tensor-parallel group (:func:`tp_item`, priced by :meth:`simtrain.network.Topology.seconds` from the
collectives the chunk declares). Three builders differ only in how they cut an action:

* :func:`plain_chain`: one compute slice (or ``dp_buckets`` equal slices when the action completes
  its stage's weight gradients), then its TP collectives (Megatron without TP overlap);
* :func:`pair_chains` (DualPipe's F&B without MoE blocks): each half cut into one slice per
  transformer layer, each slice followed by its share of the half's TP collectives, the halves'
  slices alternating forward first. This follows DeepSeek's published DualPipe training profile
  (deepseek-ai/profile-data, train.json), which overlaps the pair layer by layer. Its TP
  collectives block the compute stream (the profile's ``overlap.tp: blocking``, the default):
  every next slice of either half waits for them, as in Megatron-Core's combined 1F1B, which
  runs attention and MLP (their TP collectives inside) on the compute stream and only the EP
  all-to-alls on its communication stream (``TransformerLayerSchedulePlan.run`` in
  ``megatron/core/models/common/model_chunk_schedule_plan.py`` at d98e8a64), and in
  deepseek-ai/DualPipe and torch's ``OVERLAP_F_B``, which run the halves one after the other
  unless the model brings its own ``overlapped_forward_backward``. With ``overlap.tp: hidden``
  each half's TP collectives overlap the other half's compute (taking NCCL's SMs from it:
  :mod:`simtrain.lowering.nccl_sms`), which needs such a custom overlap;
* :func:`moe_chains`: an action on an MoE stage under expert parallelism, cut into attention /
  dispatch / experts / combine (:mod:`simtrain.lowering.moe`); a pair's items alternate backward
  first, and each half's TP collectives follow all its items.

A pair's compute is scaled by the profile's ``overlap_compute_factor``, and compute that runs beside
EP all-to-alls (an MoE pair's, Waved-EP's experts) by the SMs their kernels take
(:mod:`simtrain.costs.ep_sms`); its p2p sends leave when the
whole pair is done (``overlap_sends = "after_pair"``, what deepseek-ai/DualPipe's released
``step()`` and torch's runtime do) or each when its half is (``"per_half"``, DeepSeek-V3 Figure 4).
"""

from __future__ import annotations

from ..costs import ChunkCost
from ..costs.ep_sms import ep_slowdown
from ..engine import Task
from ..network import Topology
from ..schedules.ir import Action, OverlapAction
from .items import Block, Chain, Compute, Item, Lowering, TPComm
from .moe import add_block, item_template, named, transfers


def compute_s(c: ChunkCost, kind: str) -> float:
    """Compute seconds of an action of ``kind`` (F, B, I, W) on chunk ``c``."""
    return {"F": c.forward_s, "B": c.backward_s, "I": c.backward_input_s, "W": c.backward_weight_s}[kind]


def memory(a: Action, c: ChunkCost, rank: int, forward_only: bool) -> tuple[list, list]:
    """``(mem_start, mem_end)`` deltas of action ``a`` on chunk ``c``: F allocates the activation
    when it starts (and frees it when it ends in a forward-only step); B frees it; I frees all but
    what W needs; W frees the rest."""
    if a.kind == "F":
        return [(rank, c.activation_bytes)], ([(rank, -c.activation_bytes)] if forward_only else [])
    return [], {
        "B": [(rank, -c.activation_bytes)],
        "I": [(rank, c.weight_grad_bytes - c.activation_bytes)],
        "W": [(rank, -c.weight_grad_bytes)],
    }[a.kind]


def tp_seconds(c: ChunkCost, kind: str, topology: Topology, rank: int) -> float:
    """Exposed seconds of the TP collectives chunk ``c`` declares for an action of ``kind`` on
    ``rank``: all of their priced time, or with ``parallel.tp_overlap`` what the action's compute
    does not hide, ``max(tp - tp_overlap_fraction x compute, e x tp)`` with ``e`` the profile's
    ``tp_exposed_fraction`` (0 where the profile has no measurement: ``tp - min(tp, ...)``).

    TP overlap is Megatron-LM's ``--tp-comm-overlap`` (Transformer Engine's userbuffers): each
    sequence-parallel all-gather and reduce-scatter is split into chunks pipelined with the chunks
    of the GEMM next to it (the all-gather before QKV and FC1, the reduce-scatter after the
    attention projection and FC2, and their transposes in the backward; Wang et al. 2023,
    "Overlap Communication with Dependent Computation via Decomposition", ASPLOS), so the
    collective costs only what the GEMMs cannot cover: the window is ``tp_overlap_fraction`` x the
    action's linear-GEMM seconds (:func:`gemm_window_s`; default 1: full overlap, limited by the
    GEMM time). Even GEMMs longer than the collective leave part of it exposed: the chunk
    that must arrive before the first GEMM chunk, the one reduced after the last, and the
    GEMM's slowdown from the SMs given to communication. The profile's ``tp_exposed_fraction``
    is that share, measured at kernel level (ByteDance FLUX, ``docs/performance_report.md``:
    8 GPUs, TP 8, M 4096, K 12288, N 49152 overlapped vs GEMM alone vs NCCL alone; see
    ``docs/published_validation.md``, "TP overlap: the exposed share").
    """
    declared = {"F": c.tp_forward, "B": c.tp_backward, "I": c.tp_backward}.get(kind, ())
    seconds = sum(topology.seconds(x, rank) for x in declared)
    if topology.parallel.tp_overlap:
        hidden = topology.parallel.tp_overlap_fraction * gemm_window_s(c, kind)
        seconds = max(seconds - hidden, topology.hardware.tp_exposed_fraction * seconds, 0.0)
    return seconds


def gemm_window_s(c: ChunkCost, kind: str) -> float:
    """Seconds of the linear GEMMs of an action of ``kind`` on chunk ``c`` (``c.gemm_s``: F; I;
    B = I + W, whose weight-gradient GEMMs Megatron's bulk overlap also uses), or the action's
    whole compute where the costs do not say (``gemm_s`` None)."""
    if c.gemm_s is None:
        return compute_s(c, kind)
    f, i, w = c.gemm_s
    return {"F": f, "B": i + w, "I": i, "W": w}[kind]


def cp_seconds(c: ChunkCost, kind: str, topology: Topology, rank: int) -> float:
    """Exposed seconds of the context-parallel collectives chunk ``c`` declares for an action of
    ``kind``: their priced time less the attention time that hides them (ring attention)."""
    declared = {"F": c.cp_forward, "B": c.cp_backward, "I": c.cp_backward}.get(kind, ())
    hide = c.cp_hide_forward_s if kind == "F" else c.cp_hide_backward_s
    return max(0.0, sum(topology.seconds(x, rank) for x in declared) - hide)


def tp_item(low: Lowering, a: Action, rank: int, share: int = 1, suffix: str = "", stream: str = "tp") -> list[Item]:
    """The in-stage collectives of ``a`` on ``rank`` (1/``share`` of them) as one item on the
    ``tp`` stream (or the ``cp`` one, with ``stream="cp"``) holding the ports of the first one's
    route, or nothing when free."""
    key = (a.stage, a.kind, rank, stream)  # priced once per stage, kind, rank and stream
    if key not in low.tp_cache:
        c = low.chunk[a.stage]
        price = tp_seconds if stream == "tp" else cp_seconds
        seconds = price(c, a.kind, low.topology, rank) if low.comm else 0.0
        if stream == "tp":
            declared = c.tp_forward if a.kind == "F" else c.tp_backward
        else:
            declared = c.cp_forward if a.kind == "F" else c.cp_backward
        low.tp_cache[key] = (seconds, low.topology.route(declared[0], rank).resources if seconds > 0 else (),
                             sum(x.nbytes * x.repeat for x in declared))
    seconds, resources, nbytes = low.tp_cache[key]
    if seconds <= 0:
        return []
    return [TPComm(seconds / share if share > 1 else seconds, f"{stream} {a}{suffix}", resources, stream,
                   nbytes / share if share > 1 else nbytes)]


def in_stage_items(low: Lowering, a: Action, rank: int, share: int = 1, suffix: str = "") -> list[Item]:
    """The action's CP collectives then its TP collectives (see :func:`tp_item`)."""
    return tp_item(low, a, rank, share, suffix, "cp") + tp_item(low, a, rank, share, suffix)


def plain_chain(low: Lowering, a: Action, rank: int, pieces: int) -> Chain:
    """One plain action: ``pieces`` equal compute slices, then its TP collectives."""
    c = low.chunk[a.stage]
    duration = compute_s(c, a.kind)
    chain = Chain(a, c, [[Compute(duration / pieces, str(a))] for _ in range(pieces)], buckets="pieces")
    if chain.steps:
        chain.steps[-1] += in_stage_items(low, a, rank)
    return chain


def pair_chains(low: Lowering, pair: OverlapAction, rank: int) -> list[Chain]:
    """An overlapped F&B pair without MoE blocks: one slice per layer, each with its TP share."""
    factor = low.topology.hardware.overlap_compute_factor
    chains = []
    for a in pair.parts:
        c = low.chunk[a.stage]
        n = max(1, len(c.layers))
        seconds, name = compute_s(c, a.kind) * factor, str(a)
        shares = in_stage_items(low, a, rank, n)  # each layer's share of the collectives, priced once
        steps = [[Compute(seconds / n, f"{name} ({i + 1}/{n})"),
                  *(TPComm(x.seconds, f"{x.label} ({i + 1}/{n})", x.resources, x.stream, x.nbytes) for x in shares)]
                 for i in range(n)]
        chains.append(Chain(a, c, steps))
    return chains


def moe_chains(low: Lowering, parts: list[Action], rank: int) -> list[Chain]:
    """A step with an MoE half: the MoE items of each part, its TP collectives in the tail."""
    pair, hw = len(parts) == 2, low.topology.hardware
    factor = hw.overlap_compute_factor if pair else 1.0
    layers = low.topology.parallel.moe_coarsen
    # compute beside EP kernels loses their SMs: a pair's every item, Waved-EP's experts (costs.ep_sms)
    sm = ep_slowdown(hw, low.topology.parallel) if pair or low.waves > 1 else 1.0
    chains = []
    for a in parts:
        key = (a.stage, a.kind, factor, pair)  # the items of every microbatch's action are alike
        if key not in low.item_cache:
            low.item_cache[key] = item_template(a.kind, low.chunk[a.stage], factor, layers, sm, not pair)
        chains.append(Chain(a, low.chunk[a.stage], [[item] for item in named(low.item_cache[key], a)],
                            tail=tp_item(low, a, rank), buckets="elapsed"))
    return chains


def step_chains(low: Lowering, act, rank: int, grad_buckets: set[Action]) -> tuple[list[Chain], bool, bool]:
    """The chains of one schedule step, whether its steps alternate backward first (MoE), and
    whether every item holds the rank's compute stream for both halves (a dense pair under
    ``overlap.tp: blocking``)."""
    parts = [a for a in act.parts if a.kind == "F" or low.training]
    if low.comm and any(low.chunk[a.stage].moe is not None and a.kind != "W" for a in parts):
        return moe_chains(low, parts, rank), True, False
    if isinstance(act, OverlapAction) and len(parts) == 2:
        return pair_chains(low, act, rank), False, low.topology.hardware.overlap_tp == "blocking"
    buckets = low.topology.parallel.dp_buckets
    return [plain_chain(low, a, rank, buckets if a in grad_buckets else 1) for a in parts], False, False


def emit_chains(low: Lowering, grad_buckets: set[Action]) -> None:
    """Pass 1: emit every rank's chains in schedule order; record each action's first and last
    task and, for the actions in ``grad_buckets``, where each gradient bucket is ready."""
    forward_only = not low.training
    for rank, order in enumerate(low.schedule.orders):
        after: list[int] = []  # tasks the rank's next step waits for
        for act in order:
            chains, backward_first, blocking = step_chains(low, act, rank, grad_buckets)
            if not chains:
                continue
            after = _emit_step(low, rank, chains, after, backward_first, forward_only, blocking)
            for ch in chains:
                if ch.action in grad_buckets:
                    low.bucket_after[ch.action] = _bucket_anchors(low, ch)


def _emit_step(low: Lowering, rank: int, chains: list[Chain], after: list[int], backward_first: bool,
               forward_only: bool, blocking: bool = False) -> list[int]:
    """Emit the chains of one step (one action, or a pair's two halves); returns the ids of the
    tasks the rank's next step waits for: the last task of each chain. ``blocking``: each item
    waits for the one emitted before it, whichever half that was (TP collectives on the compute
    stream)."""
    pending = {id(ch): list(after) for ch in chains}
    for ch, items in _interleave(chains, backward_first):
        for item in items:
            done = _emit_item(low, rank, ch, item, pending[id(ch)])
            if blocking:
                pending = dict.fromkeys(pending, done)
            else:
                pending[id(ch)] = done
    for ch in chains:
        for item in ch.tail:
            pending[id(ch)] = _emit_item(low, rank, ch, item, pending[id(ch)])
    ends = [ch.tasks[-1] for ch in chains]
    for ch in chains:
        a = ch.action
        ch.compute[0].mem_start, ch.compute[-1].mem_end = memory(a, ch.chunk, rank, forward_only)
        low.first[a], low.last[a], low.freed[a] = ch.compute[0], ch.tasks[-1], ch.compute[-1]
    if len(chains) == 2 and low.topology.hardware.overlap_sends == "after_pair":
        for ch in chains:  # both sends wait for the later-built half's end
            low.last[ch.action] = max(ends, key=lambda t: t.tid)
    return [t.tid for t in ends]


def _emit_item(low: Lowering, rank: int, ch: Chain, item: Item, pending: list[int]) -> list[int]:
    """Add the tasks of one item after ``pending``; returns what the chain's next item waits for."""
    a, graph = ch.action, low.graph
    tasks = graph.tasks  # appended in place, as TaskGraph.add does, without its keyword round trip
    if isinstance(item, Compute):
        task = Task(len(tasks), item.label, rank, "compute", a.kind, item.seconds, list(pending), "compute", (),
                    a.stage, a.microbatch)
        tasks.append(task)
        ch.compute.append(task)
        ch.tasks.append(task)
        return [task.tid]
    if isinstance(item, TPComm):
        task = Task(len(tasks), item.label, rank, "comm", item.stream, item.seconds, list(pending), item.stream,
                    item.resources, a.stage, a.microbatch, item.nbytes)
        tasks.append(task)
        ch.tasks.append(task)
        return [task.tid]
    assert isinstance(item, Block)
    lane = "-combine" if low.topology.parallel.a2a_links == "separate" else ""
    experts, sent, back = add_block(
        graph, rank, waves=low.waves, after=[ch.compute[-1].tid], expert_s=item.expert_s,
        to_experts=_transfers(low, item.to_experts, rank, ""), back=_transfers(low, item.back, rank, lane),
        kind=a.kind, names=item.names, label=f"{a} {item.label}", stage=a.stage, microbatch=a.microbatch,
    )
    ch.compute += experts
    ch.tasks += sent + experts + back
    return [t.tid for t in back] or [experts[-1].tid]


def _transfers(low: Lowering, cost, rank: int, lane: str) -> list:
    """:func:`simtrain.lowering.moe.transfers` of ``cost`` on ``rank``'s ``lane``, built once per
    all-to-all cost object, rank and lane (every MoE block of a chunk shares its two costs)."""
    key = (id(cost), rank, lane)
    hit = low.a2a_cache.get(key)
    if hit is None or hit[0] is not cost:
        merged = low.waves if low.topology.parallel.moe_coarsen > 1 else 0
        hit = low.a2a_cache[key] = (cost, transfers(cost, low.topology, rank, lane, merged))
    return hit[1]


def _interleave(chains: list[Chain], backward_first: bool):
    """Yield ``(chain, step)``: one chain in order, or a pair's two alternating (backward first
    for MoE pairs, whose backward starts with its chunk's tail so its first all-to-all leaves at
    once; forward first for layer-sliced pairs)."""
    if len(chains) == 1:
        yield from ((chains[0], step) for step in chains[0].steps)
        return
    order = chains[::-1] if backward_first else chains
    for i in range(max(len(ch.steps) for ch in chains)):
        for ch in order:
            if i < len(ch.steps):
                yield ch, ch.steps[i]


def _bucket_anchors(low: Lowering, ch: Chain) -> list:
    """The task after which each of ``ch``'s gradient buckets is ready."""
    n = low.topology.parallel.dp_buckets
    if ch.buckets == "pieces":
        return list(ch.compute)
    if ch.buckets == "elapsed":  # bucket i is ready once (i+1)/buckets of the compute ran
        total = sum(t.duration_s for t in ch.compute)
        return [_task_at(ch.compute, total * (i + 1) / n) for i in range(n)]
    return [low.last[ch.action]] * n


def _task_at(tasks: list, elapsed_s: float):
    """The first of ``tasks`` by whose end ``elapsed_s`` of their summed duration has run."""
    run = 0.0
    for t in tasks:
        run += t.duration_s
        if run >= elapsed_s * (1 - 1e-12):
            return t
    return tasks[-1]
