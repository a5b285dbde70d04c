"""The lowering passes after the chains: pipeline p2p, DP/ZeRO gradient reduction, the optimizer
step and the calibrated runtime overheads (see :func:`simtrain.lowering.lower` for the order).
Every collective is declared as a :class:`simtrain.network.Collective` and priced by the topology.
"""

from __future__ import annotations

from ..engine import Task
from ..network import Collective
from ..schedules.ir import Action, Schedule
from .items import Lowering, add_delta
from .zero import sharded_reduction_bytes, zero12_gather


def weight_grad_finishers(schedule: Schedule) -> set[Action]:
    """For each stage, the action that completes its weight gradients: its last W or B."""
    finisher: dict[int, Action] = {}
    for order in schedule.orders:
        for act in order:
            for a in act.parts:
                if a.kind in ("B", "W"):
                    finisher[a.stage] = a
    return set(finisher.values())


def gradient_holders(schedule: Schedule) -> dict[int, tuple[int, ...]]:
    """For each stage, the pipeline ranks computing its model chunk (two for DualPipe's copies)."""
    holders = {c: tuple(sorted({schedule.stage_to_rank[s] for s in range(schedule.num_stages)
                                if schedule.chunk_of(s) == c})) for c in range(schedule.num_chunks)}
    return {s: holders[schedule.chunk_of(s)] for s in range(schedule.num_stages)}


def add_p2p(low: Lowering) -> None:
    """Pass 2: wire F -> F along each microbatch's path, B/I -> B/I back along it, F -> B/I and
    I -> W; a dependency between stages on different ranks becomes a p2p send of the activation
    (or its gradient) on the route :meth:`simtrain.network.Topology.route` gives, and costs the
    profile's per-message overhead on both ends (like torch's ``_add_send_recv``, which inserts
    SEND/RECV actions between the compute actions of a schedule)."""
    schedule, topology, first, last = low.schedule, low.topology, low.first, low.last
    priced: dict[tuple[int, int, float], tuple[float, tuple[str, ...]]] = {}  # (src, dst, bytes) -> s, ports

    def backward_of(stage: int, mb: int) -> Action:
        b = Action(stage, "B", mb)
        return b if b in last else Action(stage, "I", mb)

    def connect(producer: Action, consumer: Action, nbytes: float) -> None:
        src, dst = schedule.stage_to_rank[producer.stage], schedule.stage_to_rank[consumer.stage]
        done = last[producer]
        if src == dst or not low.comm:
            first[consumer].deps.append(done.tid)
            return
        if (src, dst, nbytes) not in priced:
            collective = Collective("p2p", "pp", nbytes)
            priced[src, dst, nbytes] = (topology.seconds(collective, src, peer=dst),
                                        topology.route(collective, src, peer=dst).resources)
        seconds, resources = priced[src, dst, nbytes]
        done.duration_s += topology.hardware.message_overhead_s  # posting the send
        first[consumer].duration_s += topology.hardware.message_overhead_s  # completing the receive
        send = low.graph.add(
            name=f"p2p {producer} -> {consumer}", rank=src, peer=dst, category="comm", kind="p2p",
            duration_s=seconds, deps=[done.tid], resources=resources,
            stage=producer.stage, microbatch=producer.microbatch, nbytes=nbytes,
        )
        first[consumer].deps.append(send.tid)

    paths: dict[int, tuple[tuple[int, ...], dict[int, int]]] = {}  # microbatch -> path, stage -> its first index
    for a in list(first):
        if a.microbatch not in paths:  # (one pass per microbatch, not a scan of its path per action)
            path = schedule.path(a.microbatch)
            position: dict[int, int] = {}
            for i, stage in enumerate(path):
                position.setdefault(stage, i)
            paths[a.microbatch] = path, position
        path, position = paths[a.microbatch]
        i = position[a.stage]
        if a.kind == "F" and i > 0:
            connect(Action(path[i - 1], "F", a.microbatch), a, low.chunk[path[i - 1]].p2p_bytes)
        elif a.kind in ("B", "I"):
            first[a].deps.append(last[Action(a.stage, "F", a.microbatch)].tid)
            if i < len(path) - 1:
                connect(backward_of(path[i + 1], a.microbatch), a, low.chunk[a.stage].p2p_bytes)
        elif a.kind == "W":
            first[a].deps.append(last[Action(a.stage, "I", a.microbatch)].tid)


def add_gradient_reduction(low: Lowering) -> None:
    """Pass 3: after each piece of the action that completes a stage's weight gradients, reduce
    one of ``dp_buckets`` equal buckets on the rank's ``dp`` stream (all-reduce, or reduce-scatter
    under ZeRO-1; Li et al. 2020, "PyTorch Distributed", §3.2.3 gradient bucketing) over the DP
    replicas of every rank holding the chunk; routed-expert gradients over the expert-DP group.
    A chunk's copies (DualPipe) reduce bucket i together: each waits for both copies' piece i.
    Under ZeRO-2/3 every backward reduces its microbatch's gradient with two bucket buffers: a
    piece waits for the reduction of the bucket two before it; what each bucket holds unsharded
    is :func:`sharded_reduction_bytes`'s (:mod:`simtrain.lowering.zero`)."""
    parallel, topology, costs = low.topology.parallel, low.topology, low.costs
    holders = gradient_holders(low.schedule)
    op = parallel.dp_reduce_op
    transient = parallel.zero_stage >= 2
    pieces = parallel.dp_buckets
    buckets: dict[int, list[tuple[Task, Task]]] = {}  # stage -> (compute piece, its reduction)
    in_flight: dict[int, list[int]] = {}  # rank -> its ZeRO-2/3 bucket reductions so far, in order
    for a, anchors in low.bucket_after.items():
        c, group = low.chunk[a.stage], holders[a.stage]
        per = costs.grad_reduce_bytes_per_param
        dense = (c.params - c.expert_params - c.frozen_params) * per / pieces
        experts = c.expert_params * per / pieces
        produced, reduced = sharded_reduction_bytes(c, costs, pieces) if transient else (0.0, 0.0)
        for i, piece in enumerate(anchors):
            rank = piece.rank
            if transient:  # the bucket's unsharded gradient, from its piece's start to its reduction
                add_delta(piece, "start", rank, produced)
                earlier = in_flight.setdefault(rank, [])  # (reduction, its piece), in order
                if len(earlier) >= 2 and earlier[-2][1] is not piece and earlier[-2][0] not in piece.deps:
                    piece.deps.append(earlier[-2][0])  # two bucket buffers (not within one task)
            collective = Collective(op, "dp", dense)
            seconds = topology.seconds(collective, rank, group)
            if experts > 0:
                seconds += topology.seconds(Collective(op, "expert_dp", experts), rank, group)
            reduce = low.graph.add(
                name=f"dp grad stage {a.stage} bucket {i}", rank=rank, category="comm", kind="dp", stream="dp",
                deps=[piece.tid], resources=topology.route(collective, rank, group).resources, duration_s=seconds,
                stage=a.stage, microbatch=a.microbatch if transient else None, nbytes=dense + experts,
                mem_start=[(rank, reduced - produced)] if transient else [], mem_end=[(rank, -reduced)] if transient else [],
            )
            buckets.setdefault(a.stage, []).append((piece, reduce))
            if transient:
                in_flight[rank].append((reduce.tid, piece))
            low.dp_tasks.setdefault(rank, []).append(reduce)
    for stage, pairs in buckets.items():
        for other in buckets:
            if other != stage and low.schedule.chunk_of(other) == low.schedule.chunk_of(stage):
                for (_, reduce), (piece, _) in zip(pairs, buckets[other]):
                    reduce.deps.append(piece.tid)


_ACTION_STREAMS = frozenset({"compute", "tp", "cp"})
"""The streams an action's chain runs on (:func:`_last_compute`)."""


def _last_compute(low: Lowering) -> dict[int, list[int]]:
    """Rank -> the ids of its last task so far on each of the streams its actions run on
    (compute, and the in-stage TP and CP collectives that end an action's chain; one pass over
    the graph). What follows a rank's last action (its gradient sync, its optimizer step) waits
    for all of them: the last backward's TP collective carries the input gradient the embedding's
    weight gradient is computed from, and Megatron-LM issues it on the compute stream before the
    optimizer's kernels."""
    last: dict[int, dict[str, int]] = {}
    wanted = _ACTION_STREAMS
    for t in low.graph.tasks:
        if t.stream in wanted:
            last.setdefault(t.rank, {})[t.stream] = t.tid
    return {rank: list(by_stream.values()) for rank, by_stream in last.items()}


def add_embedding_sync(low: Lowering) -> None:
    """Pass 3b: the tied word-embedding gradient all-reduce between the rank holding the first
    chunk (input embedding) and the rank holding the last (LM head), after each rank's last
    compute and before its optimizer step (Megatron-LM: ``_allreduce_embedding_grads`` over the
    embedding group of the first and last pipeline stage, Shoeybi et al. 2019 / Narayanan et al.
    2021 §2). Megatron-Core's ``finalize_model_grads``
    (``megatron/core/distributed/finalize_model_grads.py``) calls it after ``finish_grad_sync``,
    the wait for the rank's DP gradient reductions, and a collective ends on neither rank before
    both have joined, so each rank's task also waits for the other rank's gradient reductions
    (``p2p_mode: blocking``, DeepSpeed's pipeline engine, reduces the tied gradients before the DP
    ones, ``ReduceTiedGrads`` then ``ReduceGrads``: not there). A ring all-reduce of two GPUs sends
    and receives the whole buffer once, so each
    rank's task lasts one message of ``tied_embedding_params x grad bytes`` on the route between
    them (:meth:`simtrain.network.Topology.p2p`), in the gradient-reduction dtype (DeepSpeed's
    ``_exec_reduce_tied_grads`` reduces ``weight._hp_grad``, the fp32 copy, under bf16). Skipped
    with ``--op-times`` (no per-step costs)."""
    costs, schedule, topology = low.costs, low.schedule, low.topology
    if costs.tied_embedding_params <= 0 or costs.fixed_op_times:
        return
    last_chunk = len(costs.chunks) - 1
    holders = [next(r for r in range(schedule.num_ranks) if c in low.held[r]) for c in (0, last_chunk)]
    if holders[0] == holders[1]:
        return
    nbytes = costs.tied_embedding_params * costs.grad_reduce_bytes_per_param
    last_compute = _last_compute(low)
    deps = [tid for r in holders for tid in last_compute.get(r, [])]
    if low.topology.parallel.p2p_mode != "blocking":
        deps += [t.tid for r in holders for t in low.dp_tasks.get(r, [])]
    for rank, peer in (holders, holders[::-1]):
        collective = Collective("p2p", "pp", nbytes)
        task = low.graph.add(name="embedding grad all-reduce", rank=rank, peer=peer, category="comm", kind="dp",
                             stream="dp", duration_s=topology.seconds(collective, rank, peer=peer), deps=list(deps),
                             resources=topology.route(collective, rank, peer=peer).resources, nbytes=nbytes)
        low.dp_tasks.setdefault(rank, []).append(task)


def add_optimizer(low: Lowering) -> None:
    """Pass 5: each rank's optimizer step (memory-bound Adam) after its last compute and its
    gradient reductions; under ZeRO-1 and 2 an all-gather of the updated parameters
    (:func:`~simtrain.lowering.zero.zero12_gather`), unless ``overlap_param_gather`` moved it into
    the step's forwards (:func:`~simtrain.lowering.zero.add_overlapped_param_gathers`); ZeRO-3
    gathers them before each forward."""
    schedule, costs, parallel = low.schedule, low.costs, low.topology.parallel
    dp = parallel.dp_cp if low.comm else 1
    last_compute = _last_compute(low)
    for rank in range(schedule.num_ranks):
        duration = costs.optimizer_s(low.held[rank])
        if duration <= 0:
            continue
        deps = list(last_compute.get(rank, []))
        deps += [t.tid for t in low.dp_tasks.get(rank, [])]
        temp = costs.optimizer_temp_bytes(low.held[rank])  # foreach Adam's temporary, held while it steps
        opt = low.graph.add(name="optimizer step", rank=rank, category="compute", kind="OPT", stream="compute",
                            duration_s=duration, deps=deps, mem_start=[(rank, temp)] if temp else [],
                            mem_end=[(rank, -temp)] if temp else [])
        if parallel.zero_stage in (1, 2) and dp > 1 and not parallel.overlap_param_gather:
            seconds, resources, nbytes = zero12_gather(low, rank, low.held[rank])
            low.graph.add(name="dp param all-gather", rank=rank, category="comm", kind="dp", stream="dp",
                          duration_s=seconds, deps=[opt.tid], resources=resources, nbytes=nbytes)


def add_runtime_overheads(low: Lowering) -> None:
    """Pass 6: the calibrated runtime: the per-action overhead (``action_overhead_s``) on the first
    task of every action (each half of a pair, each MoE action), and every compute task of a rank
    that shares processors on its node on that node's pool
    (:meth:`simtrain.network.Topology.processor_pools`)."""
    overhead = low.topology.hardware.action_overhead_s
    if overhead:
        for task in low.first.values():
            task.duration_s += overhead
    pool_of, low.graph.pools = low.topology.processor_pools(low.schedule.num_ranks)
    if pool_of:
        for task in low.graph.tasks:
            if task.category == "compute" and task.rank in pool_of:
                task.pool = pool_of[task.rank]
