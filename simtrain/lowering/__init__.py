"""Lowering: (Schedule, StageCosts, Topology) -> TaskGraph with compute, communication and memory.

:func:`lower` is a short chain of named passes over one shared state
(:class:`~simtrain.lowering.items.Lowering`), in the manner of torch's
``torch/distributed/pipelining/schedules.py`` (``_prepare_schedule_with_comms``, which takes a
compute-only schedule through ``_add_unshard_reshard`` and ``_add_send_recv``):

1. :func:`~simtrain.lowering.chains.emit_chains`: every action (plain, each half of an
   overlapped F&B pair, an action on an MoE stage) becomes one chain of compute slices, TP
   collectives and MoE blocks, emitted by one emitter on the rank's streams in schedule order,
   with its memory deltas (F allocates its activation; B frees it; I frees all but what W
   needs; W frees the rest; a forward-only F frees it when it ends); with ``grad_allocation:
   first-backward``, :func:`~simtrain.lowering.grads.add_lazy_gradients` then allocates each
   chunk's gradients at its first B or W instead of in the static memory;
2. :func:`~simtrain.lowering.comms.add_p2p`: data dependencies along each microbatch's path, a
   p2p send where two stages sit on different ranks; every schedule gets its communication
   without code of its own (``p2p_mode: blocking``:
   :func:`~simtrain.lowering.blocking.add_blocking_p2p`, rendezvous transfers in DeepSpeed's
   pipeline-engine order, and the gradient reductions after each rank's last transfer);
3. :func:`~simtrain.lowering.comms.add_gradient_reduction`: DP (ZeRO-1: reduce-scatter) gradient
   buckets overlapping the last backward of each stage (ZeRO-2/3: every backward's); then
   :func:`~simtrain.lowering.comms.add_embedding_sync`: the tied word-embedding gradient
   all-reduce between the first and the last stage's ranks;
4. :func:`~simtrain.lowering.zero.add_param_gathers` (ZeRO-3 only): each F, B and I all-gathers
   its chunk's parameters first, prefetched one action ahead (:mod:`simtrain.lowering.zero`);
5. :func:`~simtrain.lowering.offload.add_offload` (``--offload`` only): each F's activations
   copied to the host over PCIe and back before its backward (:mod:`simtrain.lowering.offload`);
6. :func:`~simtrain.lowering.comms.add_optimizer`: the optimizer step, and ZeRO-1/2's parameter
   all-gather (``overlap_param_gather``: :func:`~simtrain.lowering.zero.add_overlapped_param_gathers`
   moves it to the step's start, each chunk's first forward waiting for its chunk);
7. :func:`~simtrain.lowering.comms.add_runtime_overheads`: calibrated per-action and per-message
   overheads and shared processor pools; then
   :func:`~simtrain.lowering.queues.add_hardware_queues` (``--hardware-queues`` only): the tasks
   of streams sharing a hardware work queue start in the host's launch order
   (:mod:`simtrain.lowering.queues`).
8. :func:`~simtrain.lowering.nccl_sms.add_nccl_sms`: compute that overlaps an NCCL collective on
   its rank runs on the SMs the collective's CTAs leave (:mod:`simtrain.lowering.nccl_sms`).

A forward-only step (``parallel.forward_only``) runs only the forwards (a pair runs its forward half
alone), with no gradient reduction or optimizer. Communication is declared as
:class:`simtrain.network.Collective` and priced by :class:`simtrain.network.Topology` alone.
"""

from __future__ import annotations

from ..costs import StageCosts
from ..engine import TaskGraph, gc_paused
from ..network import Topology
from ..schedules.ir import Schedule
from .chains import emit_chains
from .comms import (add_embedding_sync, add_gradient_reduction, add_optimizer, add_p2p, add_runtime_overheads, gradient_holders,
                    weight_grad_finishers)
from .blocking import add_blocking_p2p, after_last_instruction
from .grads import add_lazy_gradients
from .items import Lowering
from .nccl_sms import add_nccl_sms
from .offload import add_offload
from .queues import add_hardware_queues
from .zero import add_overlapped_param_gathers, add_param_gathers, check_zero, gradient_actions


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
    with gc_paused():  # hundreds of thousands of tasks, no cycles to collect
        return _lower(schedule, costs, topology, comm, waves)


def _lower(schedule: Schedule, costs: StageCosts, topology: Topology, comm: bool, waves: int) -> TaskGraph:
    """:func:`lower` (with the garbage collector off)."""
    held = [{schedule.chunk_of(s) for s in schedule.stages_of(r)} for r in range(schedule.num_ranks)]
    low = Lowering(
        schedule, costs, topology, comm, waves,
        TaskGraph(num_ranks=schedule.num_ranks, shared_links=topology.shared_links()),
        chunk=[costs.chunks[schedule.chunk_of(s)] for s in range(schedule.num_stages)], held=held,
    )
    low.graph.static_memory_bytes = [costs.static_bytes(h) + costs.recv_buffer_bytes(h) for h in held]
    reduce = comm and low.training
    holders = gradient_holders(schedule)
    dp, zero_stage = topology.parallel.dp_cp, topology.parallel.zero_stage
    check_zero(schedule, zero_stage, holders)
    reducing = gradient_actions(schedule) if zero_stage >= 2 else weight_grad_finishers(schedule)
    grad_buckets = {a for a in reducing if dp * len(holders[a.stage]) > 1} if reduce else set()
    emit_chains(low, grad_buckets)
    low.chain_tasks = len(low.graph.tasks)
    add_lazy_gradients(low)
    blocking = topology.parallel.p2p_mode == "blocking" and low.training
    done = add_blocking_p2p(low) if blocking else add_p2p(low)
    if reduce:
        add_gradient_reduction(low)
        add_embedding_sync(low)
    if comm and zero_stage >= 3 and dp > 1:
        add_param_gathers(low)
    add_offload(low)
    if low.training:
        add_optimizer(low)
        if comm and zero_stage in (1, 2) and dp > 1 and topology.parallel.overlap_param_gather:
            add_overlapped_param_gathers(low)
    if blocking:
        after_last_instruction(low, done)
    add_runtime_overheads(low)
    add_hardware_queues(low)
    add_nccl_sms(low)
    return low.graph


__all__ = ["lower"]
