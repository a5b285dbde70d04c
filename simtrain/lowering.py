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
  of the backward (Li et al. 2020, "PyTorch Distributed", §3.2.3 gradient bucketing);
* each rank ends with its optimizer step (memory-bound Adam) after its reductions, and, under
  ZeRO-1, an all-gather of the updated parameters.

* on a stage with MoE blocks under expert parallelism, F, B and I (and overlapped F&B pairs) are
  cut into attention / dispatch / experts / combine sub-operations by
  :func:`simtrain.ep_lowering.lower_moe_parts` (serial, or in ``waves`` expert waves);
  expert-parameter gradients are reduced over the expert-data-parallel group.

Memory: each rank starts with the static bytes of the chunks it holds; F allocates its chunk's
activation when it starts; B frees it when it ends; I frees all but what W needs; W frees the rest.
A forward-only step (``parallel.forward_only``) runs only the forwards, each freeing its
activation when it ends, with no gradient reduction or optimizer step.
"""

from __future__ import annotations

from .costs import StageCosts
from .engine import Task, TaskGraph
from .ep_lowering import lower_moe_parts
from .network import Topology, ring_all_gather_s, ring_all_reduce_s, ring_reduce_scatter_s
from .schedules.ir import Action, Schedule


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

    dp = parallel.dp if comm and not forward_only else 1
    grad_buckets = _weight_grad_finishers(schedule) if dp > 1 else {}
    first: dict[Action, Task] = {}  # first task of each action (deps attach here)
    last: dict[Action, Task] = {}  # task whose end means the action is done
    dp_tasks: dict[int, list[Task]] = {r: [] for r in range(schedule.num_ranks)}

    def grad_bucket(rank: int, a: Action, after: Task, i: int) -> None:
        c, pieces = chunk[a.stage], parallel.dp_buckets
        dense = (c.params - c.expert_params) * costs.grad_bytes_per_param / pieces
        experts = c.expert_params * costs.grad_bytes_per_param / pieces
        route = topology.dp_route(rank)
        dp_tasks[rank].append(graph.add(
            name=f"dp grad stage {a.stage} bucket {i}", rank=rank, category="comm",
            kind="dp", stream="dp", deps=[after.tid], resources=route.resources,
            duration_s=_dp_sync_s("reduce", dense, experts, rank, topology), stage=a.stage, nbytes=dense + experts,
        ))

    def tp_task(rank: int, a: Action, after: Task) -> Task:
        c = chunk[a.stage]
        tp_s = {"F": c.tp_forward_s, "B": c.tp_backward_s, "I": c.tp_backward_s}.get(a.kind, 0.0)
        if not comm or tp_s <= 0:
            return after
        return graph.add(
            name=f"tp {a}", rank=rank, category="comm", kind="tp", stream="tp",
            duration_s=tp_s, deps=[after.tid], resources=topology.tp_route(rank).resources,
            stage=a.stage, microbatch=a.microbatch,
        )

    for rank, order in enumerate(schedule.orders):
        prev: Task | None = None
        for act in order:
            parts = [a for a in act.parts if a.kind == "F" or not forward_only]
            if comm and any(chunk[a.stage].moe is not None and a.kind != "W" for a in parts):
                built = lower_moe_parts(graph, rank, parts, [chunk[a.stage] for a in parts], topology, waves)
                for pt in built:
                    a, tasks = pt.action, pt.compute
                    if prev is not None:
                        tasks[0].deps.append(prev.tid)
                    tasks[0].mem_start, tasks[-1].mem_end = _memory(a, chunk[a.stage], rank, forward_only)
                    first[a] = tasks[0]
                    if a in grad_buckets:
                        total = sum(t.duration_s for t in tasks)
                        for i in range(parallel.dp_buckets):
                            grad_bucket(rank, a, _task_at(tasks, total * (i + 1) / parallel.dp_buckets), i)
                    last[a] = tp_task(rank, a, tasks[-1])
                prev = max((last[pt.action] for pt in built), key=lambda t: t.tid)
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
                        duration_s=duration / pieces, deps=[prev.tid] if prev else [],
                        stream="compute", stage=a.stage, microbatch=a.microbatch,
                        mem_start=mem_start if i == 0 else [],
                        mem_end=mem_end if i == pieces - 1 else [],
                    )
                    if i == 0:
                        first[a] = task
                    prev = task
                    if a in grad_buckets:
                        grad_bucket(rank, a, task, i)
                prev = last[a] = tp_task(rank, a, prev)

    _add_pipeline_dependencies(schedule, graph, first, last, chunk, topology, comm)
    if not forward_only:
        _add_optimizer(schedule, graph, costs, topology, held, dp_tasks, dp)
    return graph


def _memory(a: Action, c, rank: int, forward_only: bool) -> tuple[list, list]:
    """``(mem_start, mem_end)`` deltas of action ``a`` on chunk ``c`` (see the module docstring)."""
    if a.kind == "F":
        return [(rank, c.activation_bytes)], ([(rank, -c.activation_bytes)] if forward_only else [])
    return [], {
        "B": [(rank, -c.activation_bytes)],
        "I": [(rank, c.weight_grad_bytes - c.activation_bytes)],
        "W": [(rank, -c.weight_grad_bytes)],
    }[a.kind]


def _task_at(tasks: list[Task], elapsed_s: float) -> Task:
    """The first of ``tasks`` by whose end ``elapsed_s`` of their summed duration has run."""
    run = 0.0
    for t in tasks:
        run += t.duration_s
        if run >= elapsed_s * (1 - 1e-12):
            return t
    return tasks[-1]


def _dp_sync_s(op: str, dense_bytes: float, expert_bytes: float, rank: int, topology: Topology) -> float:
    """Seconds of a gradient reduction (``op="reduce"``: all-reduce, or reduce-scatter under ZeRO-1)
    or a ZeRO-1 parameter all-gather (``op="gather"``): dense bytes over the DP group, routed-expert
    bytes over the expert-DP group (``dp x tp / ep`` GPUs), one after the other."""
    parallel = topology.parallel
    if op == "gather":
        collective = ring_all_gather_s
    else:
        collective = ring_reduce_scatter_s if parallel.zero_stage >= 1 else ring_all_reduce_s
    route = topology.dp_route(rank)
    seconds = collective(dense_bytes, parallel.dp, route.link, route.bandwidth_bytes_per_s)
    if expert_bytes > 0:
        edp = topology.expert_dp_route(rank)
        seconds += collective(expert_bytes, parallel.dp * parallel.tp // parallel.ep, edp.link,
                              edp.bandwidth_bytes_per_s)
    return seconds


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
        route = topology.p2p(src, dst)
        send = graph.add(
            name=f"p2p {producer} -> {consumer}", rank=src, peer=dst, category="comm", kind="p2p",
            duration_s=route.transfer_s(nbytes), deps=[done.tid], resources=route.resources,
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
    """Optimizer step per rank after its gradient reductions; ZeRO-1 parameter all-gather."""
    parallel = topology.parallel
    for rank in range(schedule.num_ranks):
        duration = costs.optimizer_s(held[rank])
        if duration <= 0:
            continue
        compute = [t for t in graph.tasks if t.rank == rank and t.stream == "compute"]
        deps = [compute[-1].tid] if compute else []
        deps += [t.tid for t in dp_tasks[rank]]
        opt = graph.add(
            name="optimizer step", rank=rank, category="compute", kind="OPT", stream="compute",
            duration_s=duration, deps=deps,
        )
        if parallel.zero_stage >= 1 and dp > 1:
            route = topology.dp_route(rank)
            experts = sum(costs.chunks[c].expert_params for c in held[rank]) * costs.grad_bytes_per_param
            dense = sum(costs.chunks[c].params for c in held[rank]) * costs.grad_bytes_per_param - experts
            graph.add(
                name="dp param all-gather", rank=rank, category="comm", kind="dp", stream="dp",
                duration_s=_dp_sync_s("gather", dense, experts, rank, topology),
                deps=[opt.tid], resources=route.resources, nbytes=dense + experts,
            )
