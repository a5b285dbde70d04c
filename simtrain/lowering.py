"""Lowering: (Schedule, StageCosts, Topology) -> TaskGraph with compute, communication and memory.

For every action of the schedule the lowering emits a compute task on the rank's ``compute``
stream (in the schedule's order) and, with tensor parallelism, the TP collectives of that action
on the rank's ``tp`` stream; the rank's next action waits for them (Megatron without TP overlap).
Communication follows from data dependencies, so every schedule gets it without code of its own:

* forward of stage s for microbatch j needs the forward of the stage before s on j's path; the
  activation is sent point to point when the two stages sit on different ranks;
* the backward (B, or I) of stage s needs the backward of the stage after s on the path (its
  gradient is sent back the same way) and the forward of s itself; W needs I;
* data-parallel gradient reduction: the last backward that produces a stage's weight gradients
  (its last W, or its last B) is cut into ``dp_buckets`` equal pieces; after each piece one bucket
  is all-reduced (reduce-scattered under ZeRO-1) on the rank's ``dp`` stream, overlapping the rest
  of the backward (Li et al. 2020, "PyTorch Distributed", §3.2.3 gradient bucketing). When a
  model chunk is computed on two ranks (DualPipe keeps two copies), the group is both copies'
  DP replicas (2·dp GPUs, also when dp = 1) and each bucket waits until both copies have it;
* each rank ends with its optimizer step (memory-bound Adam) after its reductions, and, under
  ZeRO-1, an all-gather of the updated parameters.

On a stage with MoE blocks under expert parallelism, F, B and I (and overlapped F&B pairs with an
MoE half) are cut into attention / dispatch / experts / combine sub-operations by
:func:`simtrain.ep_lowering.lower_moe_parts` (serial, or in ``waves`` expert waves; a pair's two
chains interleave); routed-expert gradients are reduced over the expert-data-parallel group.

An overlapped forward-and-backward pair (DualPipe's F&B) is lowered by :func:`_lower_pair`: its two
halves alternate layer by layer on the compute stream, each layer's TP collectives overlapping the
other half's next layer; its compute is scaled by the profile's ``overlap_compute_factor``, and
its p2p sends leave when the whole pair is done (``overlap_sends = "after_pair"``, the default:
what deepseek-ai/DualPipe's released ``step()`` and torch's runtime do) or each when its half is
(``"per_half"``: a runtime that overlaps communication inside the pair, as DeepSeek-V3's Figure 4).

Memory: each rank starts with the static bytes of the chunks it holds; F allocates its chunk's
activation when it starts; B frees it when it ends; I frees all but what W needs; W frees the rest.
A forward-only step (``parallel.forward_only``) runs only the forwards (a pair runs its forward
half alone), each freeing its activation when it ends, with no gradient reduction or optimizer.

Runtime: every compute action (each part of an overlapped pair) also costs the profile's
per-action framework overhead (``action_overhead_s``), an action that sends or receives a p2p
message the per-message overhead (``message_overhead_s``; both 0 unless calibrated), and when a
node runs more ranks than it has processors, their compute tasks share one processor pool
(:meth:`simtrain.network.Topology.processor_pools`).
"""

from __future__ import annotations

from .costs import StageCosts
from .engine import Task, TaskGraph
from .ep_lowering import lower_moe_parts
from .network import Collective, Topology
from .schedules.ir import Action, OverlapAction, Schedule


def lower(schedule: Schedule, costs: StageCosts, topology: Topology, comm: bool = True, waves: int = 1) -> TaskGraph:
    """Build the task graph of one training step (or forward-only step).

    Args:
        schedule: a validated schedule.
        costs: per-chunk costs with ``schedule.num_chunks`` chunks.
        topology: placement and routes (its ParallelConfig gives dp, ZeRO stage, buckets,
            forward_only and the all-to-all lanes).
        comm: False makes every communication free (no communication tasks at all; MoE stages
            then run each action as one compute task).
        waves: expert waves per MoE block (1 = serial dispatch, experts, combine; > 1 = Waved-EP).

    Returns:
        The task graph; rank r of the graph is pipeline rank r.
    """
    parallel = topology.parallel
    forward_only = parallel.forward_only
    chunk = [costs.chunks[schedule.chunk_of(s)] for s in range(schedule.num_stages)]
    graph = TaskGraph(num_ranks=schedule.num_ranks)
    held = [{schedule.chunk_of(s) for s in schedule.stages_of(r)} for r in range(schedule.num_ranks)]
    graph.static_memory_bytes = [costs.static_bytes(h) for h in held]

    pool_of, graph.pools = topology.processor_pools(schedule.num_ranks)
    dp = parallel.dp if comm and not forward_only else 1
    holders = {c: tuple(sorted({schedule.stage_to_rank[s] for s in range(schedule.num_stages)
                                if schedule.chunk_of(s) == c})) for c in range(schedule.num_chunks)}
    group_of = {s: holders[schedule.chunk_of(s)] for s in range(schedule.num_stages)}  # ranks reducing s
    grad_buckets = ({a for a in _weight_grad_finishers(schedule) if dp * len(group_of[a.stage]) > 1}
                    if comm and not forward_only else set())
    buckets: dict[int, list[tuple[Task, Task]]] = {}  # stage -> (compute piece, its reduction)
    first: dict[Action, Task] = {}  # first task of each action (deps attach here)
    last: dict[Action, Task] = {}  # task whose end means the action is done
    dp_tasks: dict[int, list[Task]] = {r: [] for r in range(schedule.num_ranks)}

    def add_bucket(a: Action, i: int, piece: Task) -> None:
        reduce = _dp_bucket(graph, a, i, chunk[a.stage], costs, piece, topology, group_of[a.stage])
        buckets.setdefault(a.stage, []).append((piece, reduce))
        dp_tasks[piece.rank].append(reduce)

    for rank, order in enumerate(schedule.orders):
        tp_route = topology.tp_route(rank)
        after: list[int] = []  # tasks the rank's next action waits for
        for act in order:
            parts = [a for a in act.parts if a.kind == "F" or not forward_only]
            if comm and any(chunk[a.stage].moe is not None and a.kind != "W" for a in parts):
                after, built = _lower_moe_step(graph, parts, rank, after, chunk, topology, waves, first, last)
                for pt in built:
                    if pt.action in grad_buckets:  # bucket i is ready once (i+1)/buckets of the compute ran
                        total = sum(t.duration_s for t in pt.compute)
                        for i in range(parallel.dp_buckets):
                            add_bucket(pt.action, i, _task_at(pt.compute, total * (i + 1) / parallel.dp_buckets))
                continue
            if isinstance(act, OverlapAction) and len(parts) == 2:
                after = _lower_pair(graph, act, rank, after, chunk, topology, comm, first, last)
                b = act.backward
                if b in grad_buckets:  # all buckets after the pair (DualPipe(V) never has this)
                    for i in range(parallel.dp_buckets):
                        add_bucket(b, i, last[b])
                continue
            for a in parts:
                c = chunk[a.stage]
                duration = {
                    "F": c.forward_s, "B": c.backward_s, "I": c.backward_input_s, "W": c.backward_weight_s,
                }[a.kind]
                mem_start, mem_end = _memory(a, c, rank, forward_only)
                pieces = parallel.dp_buckets if a in grad_buckets else 1
                for i in range(pieces):
                    task = graph.add(
                        name=str(a), rank=rank, category="compute", kind=a.kind,
                        duration_s=duration / pieces, deps=list(after),
                        stream="compute", stage=a.stage, microbatch=a.microbatch,
                        mem_start=mem_start if i == 0 else [],
                        mem_end=mem_end if i == pieces - 1 else [],
                    )
                    if i == 0:
                        first[a] = task
                    after = [task.tid]
                    if a in grad_buckets:
                        add_bucket(a, i, task)
                tp_s = _tp_s(c, a.kind, topology, rank) if comm else 0.0
                if tp_s > 0:
                    task = graph.add(
                        name=f"tp {a}", rank=rank, category="comm", kind="tp", stream="tp",
                        duration_s=tp_s, deps=[task.tid], resources=tp_route.resources,
                        stage=a.stage, microbatch=a.microbatch,
                    )
                    after = [task.tid]
                last[a] = task

    for stage, pieces in buckets.items():  # a chunk's copies reduce bucket i together
        for other in buckets:
            if other != stage and schedule.chunk_of(other) == schedule.chunk_of(stage):
                for (_, reduce), (piece, _) in zip(pieces, buckets[other]):
                    reduce.deps.append(piece.tid)
    _add_pipeline_dependencies(schedule, graph, first, last, chunk, topology, comm)
    if not forward_only:
        _add_optimizer(schedule, graph, costs, topology, held, dp_tasks, dp)
    _add_runtime(graph, first, topology, pool_of)
    return graph


def _add_runtime(graph: TaskGraph, first: dict[Action, Task], topology: Topology, pool_of: dict[int, str]) -> None:
    """The calibrated runtime: the per-action overhead on the first task of every action (each half
    of a pair, each MoE action), and every compute task of a rank that shares processors on its
    node's pool."""
    overhead = topology.hardware.action_overhead_s
    if overhead:
        for task in first.values():
            task.duration_s += overhead
    if pool_of:
        for task in graph.tasks:
            if task.category == "compute" and task.rank in pool_of:
                task.pool = pool_of[task.rank]


def _memory(a: Action, c, rank: int, forward_only: bool) -> tuple[list, list]:
    """``(mem_start, mem_end)`` deltas of action ``a`` on chunk ``c`` (see the module docstring)."""
    if a.kind == "F":
        return [(rank, c.activation_bytes)], ([(rank, -c.activation_bytes)] if forward_only else [])
    return [], {
        "B": [(rank, -c.activation_bytes)],
        "I": [(rank, c.weight_grad_bytes - c.activation_bytes)],
        "W": [(rank, -c.weight_grad_bytes)],
    }[a.kind]


def _tp_s(c, kind: str, topology: Topology, rank: int) -> float:
    """Seconds of the TP collectives chunk ``c`` declares for an action of ``kind`` on ``rank``."""
    declared = {"F": c.tp_forward, "B": c.tp_backward, "I": c.tp_backward}.get(kind, ())
    return sum(topology.seconds(x, rank) for x in declared)


def _task_at(tasks: list[Task], elapsed_s: float) -> Task:
    """The first of ``tasks`` by whose end ``elapsed_s`` of their summed duration has run."""
    run = 0.0
    for t in tasks:
        run += t.duration_s
        if run >= elapsed_s * (1 - 1e-12):
            return t
    return tasks[-1]


def _lower_moe_step(graph, parts, rank, after, chunk, topology, waves, first, last) -> tuple[list[int], list]:
    """Lower one schedule step with an MoE half (a plain F/B/I, or both halves of an F&B pair) on
    ``rank`` through :func:`simtrain.ep_lowering.lower_moe_parts`, then add memory deltas and each
    half's TP collectives (on the ``tp`` stream after its last compute; the rank's next step waits
    for them). A pair's compute is scaled by the profile's ``overlap_compute_factor`` and its p2p
    sends follow ``overlap_sends`` as in :func:`_lower_pair`.

    Returns:
        Ids of the tasks the rank's next action waits for, and the
        :class:`simtrain.ep_lowering.PartTasks` of each half.
    """
    hw, forward_only = topology.hardware, topology.parallel.forward_only
    pair = len(parts) == 2
    built = lower_moe_parts(graph, rank, parts, [chunk[a.stage] for a in parts], topology, waves,
                            compute_factor=hw.overlap_compute_factor if pair else 1.0)
    ends = []
    for pt in built:
        a, c, tasks = pt.action, chunk[pt.action.stage], pt.compute
        tasks[0].deps += after
        tasks[0].mem_start, tasks[-1].mem_end = _memory(a, c, rank, forward_only)
        first[a], end = tasks[0], tasks[-1]
        tp_s = _tp_s(c, a.kind, topology, rank)
        if tp_s > 0:
            end = graph.add(
                name=f"tp {a}", rank=rank, category="comm", kind="tp", stream="tp", duration_s=tp_s,
                deps=[end.tid], resources=topology.tp_route(rank).resources, stage=a.stage, microbatch=a.microbatch,
            )
        last[a] = end
        ends.append(end)
    if pair and hw.overlap_sends == "after_pair":  # both sends wait for the later-built half's end
        for a in parts:
            last[a] = max(ends, key=lambda t: t.tid)
    return [t.tid for t in ends], built


def _dp_bucket(
    graph: TaskGraph, a: Action, i: int, c, costs: StageCosts, after: Task, topology: Topology,
    holders: tuple[int, ...],
) -> Task:
    """Gradient reduction (all-reduce, or reduce-scatter under ZeRO-1) of bucket ``i`` of ``a``'s
    weight gradients (chunk ``c``, ``dp_buckets`` equal buckets) over the DP replicas of every
    pipeline rank in ``holders`` (the ranks computing ``a``'s chunk), on the rank's ``dp`` stream
    after ``after``. Routed-expert gradients are reduced over the expert-DP replicas instead
    (``dp x tp / ep`` per holder), after the rest."""
    rank, parallel = after.rank, topology.parallel
    pieces = parallel.dp_buckets
    dense = (c.params - c.expert_params) * costs.grad_bytes_per_param / pieces
    experts = c.expert_params * costs.grad_bytes_per_param / pieces
    op = "reduce-scatter" if parallel.zero_stage >= 1 else "all-reduce"
    collective = Collective(op, "dp", dense)
    route = topology.route(collective, rank, holders)
    seconds = topology.seconds(collective, rank, holders)
    if experts > 0:
        seconds += topology.seconds(Collective(op, "expert_dp", experts), rank, holders)
    return graph.add(
        name=f"dp grad stage {a.stage} bucket {i}", rank=rank, category="comm", kind="dp", stream="dp",
        deps=[after.tid], resources=route.resources, duration_s=seconds, stage=a.stage, nbytes=dense + experts,
    )


def _lower_pair(graph, pair, rank, after, chunk, topology, comm, first, last) -> list[int]:
    """Lower an overlapped forward-and-backward pair (DualPipe's F&B) on ``rank``.

    Each half is cut into one slice per transformer layer of its chunk, and the slices alternate
    on the compute stream, forward slice first. This follows DeepSeek's published DualPipe
    training profile (deepseek-ai/profile-data, train.json: one pair of 4-layer chunks), which
    overlaps the pair layer by layer; within each layer pair the compute starts with the
    forward's attention and ends with the backward's attention (input, then weight gradients).
    Every slice takes its share of the half's compute times the
    profile's ``overlap_compute_factor``, and is followed on the ``tp`` stream by its share of the
    half's TP collectives; the half's next slice waits for them, the other half's does not, so
    each half's communication overlaps the other's compute. A half is done when its last slice
    and that slice's collectives are; with ``overlap_sends == "per_half"`` its p2p send leaves
    then, with ``"after_pair"`` both halves' sends wait for the end of the whole pair.

    Args:
        after: ids of the tasks the pair waits for (the rank's previous action).

    Returns:
        Ids of the tasks the rank's next action waits for: the last task of each half.
    """
    hw = topology.hardware
    tp_route = topology.tp_route(rank)
    halves = []
    for a in (pair.forward, pair.backward):
        c = chunk[a.stage]
        seconds = {"F": c.forward_s, "B": c.backward_s, "I": c.backward_input_s}[a.kind]
        tp_s = _tp_s(c, a.kind, topology, rank) if comm else 0.0
        mem = {"F": c.activation_bytes, "B": -c.activation_bytes, "I": c.weight_grad_bytes - c.activation_bytes}
        halves.append((a, max(1, len(c.layers)), seconds * hw.overlap_compute_factor, tp_s, mem[a.kind]))
    waits = {a: list(after) for a, *_ in halves}
    end = None
    for i in range(max(n for _, n, *_ in halves)):
        for a, n, seconds, tp_s, mem in halves:
            if i >= n:
                continue
            task = graph.add(
                name=f"{a} ({i + 1}/{n})", rank=rank, category="compute", kind=a.kind, stream="compute",
                duration_s=seconds / n, deps=list(waits[a]), stage=a.stage, microbatch=a.microbatch,
                mem_start=[(rank, mem)] if a.kind == "F" and i == 0 else [],
                mem_end=[(rank, mem)] if a.kind != "F" and i == n - 1 else [],
            )
            if i == 0:
                first[a] = task
            if tp_s > 0:
                task = graph.add(
                    name=f"tp {a} ({i + 1}/{n})", rank=rank, category="comm", kind="tp", stream="tp",
                    duration_s=tp_s / n, deps=[task.tid], resources=tp_route.resources,
                    stage=a.stage, microbatch=a.microbatch,
                )
            waits[a] = [task.tid]
            last[a] = end = task
    ends = [last[a].tid for a in pair.parts]
    if hw.overlap_sends == "after_pair":  # both sends wait for the later-listed half's end
        for a in pair.parts:
            last[a] = end
    return ends


def _weight_grad_finishers(schedule: Schedule) -> set[Action]:
    """For each stage, the action that completes its weight gradients: its last W or B."""
    finisher: dict[int, Action] = {}
    for order in schedule.orders:
        for act in order:
            for a in act.parts:
                if a.kind in ("B", "W"):
                    finisher[a.stage] = a
    return set(finisher.values())


def _add_pipeline_dependencies(schedule, graph, first, last, chunk, topology, comm) -> None:
    """Wire F -> F along each microbatch's path, B/I -> B/I back along it, F -> B/I, I -> W."""

    def backward_of(stage: int, mb: int) -> Action:
        b = Action(stage, "B", mb)
        return b if b in last else Action(stage, "I", mb)

    def connect(producer: Action, consumer: Action, nbytes: float) -> None:
        src, dst = schedule.stage_to_rank[producer.stage], schedule.stage_to_rank[consumer.stage]
        done = last[producer]
        if src == dst or not comm:
            first[consumer].deps.append(done.tid)
            return
        collective = Collective("p2p", "pp", nbytes)
        route = topology.route(collective, src, peer=dst)
        done.duration_s += topology.hardware.message_overhead_s  # posting the send
        first[consumer].duration_s += topology.hardware.message_overhead_s  # completing the receive
        send = graph.add(
            name=f"p2p {producer} -> {consumer}", rank=src, peer=dst, category="comm", kind="p2p",
            duration_s=topology.seconds(collective, src, peer=dst), deps=[done.tid], resources=route.resources,
            stage=producer.stage, microbatch=producer.microbatch, nbytes=nbytes,
        )
        first[consumer].deps.append(send.tid)

    for a in list(first):
        path = schedule.path(a.microbatch)
        i = path.index(a.stage)
        if a.kind == "F" and i > 0:
            connect(Action(path[i - 1], "F", a.microbatch), a, chunk[path[i - 1]].p2p_bytes)
        elif a.kind in ("B", "I"):
            first[a].deps.append(last[Action(a.stage, "F", a.microbatch)].tid)
            if i < len(path) - 1:
                nxt = path[i + 1]
                connect(backward_of(nxt, a.microbatch), a, chunk[a.stage].p2p_bytes)
        elif a.kind == "W":
            first[a].deps.append(last[Action(a.stage, "I", a.microbatch)].tid)


def _add_optimizer(schedule, graph, costs, topology, held, dp_tasks, dp) -> None:
    """Optimizer step per rank after its gradient reductions; ZeRO-1 parameter all-gather (dense
    parameters over DP, routed-expert parameters over expert-DP)."""
    parallel = topology.parallel
    last_compute: dict[int, int] = {}  # rank -> its last compute-stream task, in one pass
    for t in graph.tasks:
        if t.stream == "compute":
            last_compute[t.rank] = t.tid
    for rank in range(schedule.num_ranks):
        duration = costs.optimizer_s(held[rank])
        if duration <= 0:
            continue
        deps = [last_compute[rank]] if rank in last_compute else []
        deps += [t.tid for t in dp_tasks[rank]]
        opt = graph.add(
            name="optimizer step", rank=rank, category="compute", kind="OPT", stream="compute",
            duration_s=duration, deps=deps,
        )
        if parallel.zero_stage >= 1 and dp > 1:
            experts = sum(costs.chunks[c].expert_params for c in held[rank]) * costs.grad_bytes_per_param
            dense = sum(costs.chunks[c].params for c in held[rank]) * costs.grad_bytes_per_param - experts
            gather = Collective("all-gather", "dp", dense)
            route = topology.route(gather, rank)
            seconds = topology.seconds(gather, rank)
            if experts > 0:
                seconds += topology.seconds(Collective("all-gather", "expert_dp", experts), rank)
            graph.add(
                name="dp param all-gather", rank=rank, category="comm", kind="dp", stream="dp",
                duration_s=seconds, deps=[opt.tid], resources=route.resources, nbytes=dense + experts,
            )
