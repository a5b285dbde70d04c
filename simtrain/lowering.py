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

Memory: each rank starts with the static bytes of the chunks it holds; F allocates its chunk's
activation when it starts; B frees it when it ends; I frees all but what W needs; W frees the rest.

Runtime: every compute action (each part of an overlapped pair) also costs the profile's
per-action framework overhead (``action_overhead_s``), an action that sends or receives a p2p
message the per-message overhead (``message_overhead_s``; both 0 unless calibrated), and when a
node runs more ranks than it has processors, their compute tasks share one processor pool
(:meth:`simtrain.network.Topology.processor_pools`).
"""

from __future__ import annotations

from .costs import StageCosts
from .engine import Task, TaskGraph
from .network import Topology, ring_all_gather_s, ring_all_reduce_s, ring_reduce_scatter_s
from .schedules.ir import Action, Schedule


def lower(schedule: Schedule, costs: StageCosts, topology: Topology, comm: bool = True) -> TaskGraph:
    """Build the task graph of one training step.

    Args:
        schedule: a validated schedule.
        costs: per-chunk costs with ``schedule.num_chunks`` chunks.
        topology: placement and routes (its ParallelConfig gives dp, ZeRO stage, buckets).
        comm: False makes every communication free (no communication tasks at all).

    Returns:
        The task graph; rank r of the graph is pipeline rank r.
    """
    parallel = topology.parallel
    chunk = [costs.chunks[schedule.chunk_of(s)] for s in range(schedule.num_stages)]
    graph = TaskGraph(num_ranks=schedule.num_ranks)
    rank_params = []
    for rank in range(schedule.num_ranks):
        held = {schedule.chunk_of(s) for s in schedule.stages_of(rank)}
        rank_params.append(sum(costs.chunks[c].params for c in held))
    graph.static_memory_bytes = [p * costs.static_bytes_per_param for p in rank_params]

    pool_of, graph.pools = topology.processor_pools(schedule.num_ranks)
    overhead = topology.hardware.action_overhead_s
    dp = parallel.dp if comm else 1
    grad_buckets = _weight_grad_finishers(schedule) if dp > 1 else {}
    first: dict[Action, Task] = {}  # first task of each action (deps attach here)
    last: dict[Action, Task] = {}  # task whose end means the action is done
    dp_tasks: dict[int, list[Task]] = {r: [] for r in range(schedule.num_ranks)}

    for rank, order in enumerate(schedule.orders):
        tp_route = topology.tp_route(rank)
        dp_route = topology.dp_route(rank)
        prev: Task | None = None
        for act in order:
            for a in act.parts:
                c = chunk[a.stage]
                duration = overhead + {
                    "F": c.forward_s, "B": c.backward_s, "I": c.backward_input_s, "W": c.backward_weight_s,
                }[a.kind]
                mem_start = [(rank, c.activation_bytes)] if a.kind == "F" else []
                mem_end = {
                    "F": [], "B": [(rank, -c.activation_bytes)],
                    "I": [(rank, c.weight_grad_bytes - c.activation_bytes)],
                    "W": [(rank, -c.weight_grad_bytes)],
                }[a.kind]
                pieces = parallel.dp_buckets if a in grad_buckets else 1
                bucket_bytes = c.params * costs.grad_bytes_per_param / pieces
                for i in range(pieces):
                    task = graph.add(
                        name=str(a), rank=rank, category="compute", kind=a.kind,
                        duration_s=duration / pieces, deps=[prev.tid] if prev else [],
                        stream="compute", stage=a.stage, microbatch=a.microbatch,
                        mem_start=mem_start if i == 0 else [],
                        mem_end=mem_end if i == pieces - 1 else [], pool=pool_of.get(rank),
                    )
                    if i == 0:
                        first[a] = task
                    prev = task
                    if a in grad_buckets:
                        reduce = ring_reduce_scatter_s if parallel.zero_stage >= 1 else ring_all_reduce_s
                        dp_tasks[rank].append(graph.add(
                            name=f"dp grad stage {a.stage} bucket {i}", rank=rank, category="comm",
                            kind="dp", stream="dp", deps=[task.tid], resources=dp_route.resources,
                            duration_s=reduce(bucket_bytes, dp, dp_route.link, dp_route.bandwidth_bytes_per_s),
                            stage=a.stage, nbytes=bucket_bytes,
                        ))
                tp_s = {"F": c.tp_forward_s, "B": c.tp_backward_s, "I": c.tp_backward_s}.get(a.kind, 0.0)
                if comm and tp_s > 0:
                    prev = graph.add(
                        name=f"tp {a}", rank=rank, category="comm", kind="tp", stream="tp",
                        duration_s=tp_s, deps=[prev.tid], resources=tp_route.resources,
                        stage=a.stage, microbatch=a.microbatch,
                    )
                last[a] = prev

    _add_pipeline_dependencies(schedule, graph, first, last, chunk, topology, comm)
    _add_optimizer(schedule, graph, costs, topology, rank_params, dp_tasks, dp, pool_of)
    return graph


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
        done.duration_s += topology.hardware.message_overhead_s  # posting the send
        first[consumer].duration_s += topology.hardware.message_overhead_s  # completing the receive
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


def _add_optimizer(schedule, graph, costs, topology, rank_params, dp_tasks, dp, pool_of) -> None:
    """Optimizer step per rank after its gradient reductions; ZeRO-1 parameter all-gather."""
    parallel = topology.parallel
    for rank in range(schedule.num_ranks):
        duration = rank_params[rank] * costs.optimizer_s_per_param
        if duration <= 0:
            continue
        compute = [t for t in graph.tasks if t.rank == rank and t.stream == "compute"]
        deps = [compute[-1].tid] if compute else []
        deps += [t.tid for t in dp_tasks[rank]]
        opt = graph.add(
            name="optimizer step", rank=rank, category="compute", kind="OPT", stream="compute",
            duration_s=duration, deps=deps, pool=pool_of.get(rank),
        )
        if parallel.zero_stage >= 1 and dp > 1:
            route = topology.dp_route(rank)
            nbytes = rank_params[rank] * costs.grad_bytes_per_param
            graph.add(
                name="dp param all-gather", rank=rank, category="comm", kind="dp", stream="dp",
                duration_s=ring_all_gather_s(nbytes, dp, route.link, route.bandwidth_bytes_per_s),
                deps=[opt.tid], resources=route.resources, nbytes=nbytes,
            )
