"""Hardware work queues (``CUDA_DEVICE_MAX_CONNECTIONS``) in the lowering: the order in which a
rank's streams reach the GPU.

What the hardware does. The CUDA driver feeds a device through a fixed number of hardware work
queues ("connections"), ``CUDA_DEVICE_MAX_CONNECTIONS`` of them: 1 to 32, default 8 (CUDA C++
Programming Guide, "CUDA Environment Variables"; the MPS guide: "the preferred number of compute
and copy engine concurrent connections (work queues) from the host to the device"). Streams are
multiplexed onto them. A queue hands its work to the GPU in the order the host launched it: the
kernel at its head waits until its own stream and event dependencies are met, then starts, and the
queue goes on to the next kernel while it runs. So kernels of different streams on one queue still
run together, but none starts before the kernel launched ahead of it has started: "launch order =
start order", and a kernel that waits for its own stream holds up everything launched after it
(the "false dependencies" of a shared queue, NVIDIA, "Kepler GK110 Architecture Whitepaper",
Hyper-Q). NVIDIA's CUDA sample ``simpleHyperQ`` launches ``kernel_A; kernel_B`` (B after A in its
stream) on each of n streams and states the time without Hyper-Q as ``(nstreams + 1) *
kernel_time`` at best (``Samples/0_Introduction/simpleHyperQ/simpleHyperQ.cu``): one A and one B
run at a time, B_i beside A_(i+1), which is this rule exactly (tests/test_hardware_queues.py
reproduces it); queues held while a kernel runs would give ``2 * nstreams * kernel_time``.
Megatron-LM requires one queue with tensor (sequence) or context parallelism before Blackwell for
that reason: "It enforces the order of kernel execution on GPU as the kernel queuing order from
host", so the TP communication kernel launched before the GEMM gets its SMs first
(NVIDIA/Megatron-LM#533, answer by a Megatron-LM developer; ``megatron/training/arguments.py``;
Transformer Engine's userbuffers overlap relies on it: NVIDIA/TransformerEngine#1308, "the
current TP-overlap relay is on a single kernel queue to configure launch ordering"). The cost
is the head-of-line blocking above: users see a DP reduce-scatter overlap the backward under one
queue in some places and block it in others (NVIDIA/Megatron-LM#636; alibaba/Megatron-LLaMA#26).

How simtrain models it (``parallel.hardware_queues``; None leaves every stream on a queue of its
own, as CUDA's default 8 does for simtrain's at most seven streams per rank): the rank's streams,
in the order :data:`STREAM_ORDER`, go to queue ``i mod hardware_queues``; on each (rank, queue)
every task is *dispatched after* the task launched before it on that queue (an engine
``dispatch_after`` edge, :mod:`simtrain.engine`: it starts no earlier than that one was
dispatched, i.e. had its dependencies met). The launch order, :func:`issue_order`, is the rank's
host order: the chains of its actions in schedule order, as the emitter made them
(:func:`simtrain.lowering.chains.emit_chains`: a TP collective after the compute slice that
produces its input), and every task a later pass adds right after the last of its same-rank
dependencies and of its stream's previous task, i.e. launched as soon as its input's producer has
been: a DP gradient bucket's reduction right after the backward piece that completes the bucket
(Megatron-Core's DDP launches it from the backward post-hook, ``register_grad_ready`` ->
``start_grad_sync`` in ``megatron/core/distributed/param_and_grad_buffer.py``), the optimizer
step after the last compute and reductions, the ZeRO-1/2 parameter all-gather after the
optimizer, a ZeRO-3 gather after the action it is prefetched behind. Stream-less transfers (p2p
sends, EP all-to-all parts) are on no queue. The part of the TP collectives that
``--tp-overlap`` hides runs inside the GEMM operator (Transformer Engine's userbuffers pipeline
the GEMM's chunks with the exchange), so it needs no queue of its own; only the exposed rest runs
on the ``tp`` stream.

Not modelled: a kernel's SMs (a GEMM launched first may leave too few for a collective launched
behind it; that is what the launch order is for, and :mod:`simtrain.lowering.nccl_sms` prices the
SMs a running collective takes), host launch time (the queue never runs dry because the host is
late), and the order CUDA gives streams their connections (round-robin here, in
:data:`STREAM_ORDER`).
"""

from __future__ import annotations

from ..engine import Task
from .items import Lowering

STREAM_ORDER = ("compute", "tp", "cp", "dp", "zero", "offload", "reload")
"""The streams a rank's tasks run on, in the order they are given hardware queues."""


def issue_order(tasks: list[Task], chain_tasks: int) -> dict[int, list[int]]:
    """Each rank's stream tasks in host launch order (see the module docstring).

    Args:
        tasks: the lowered graph's tasks, after every pass that adds tasks.
        chain_tasks: how many of them the chains' emitter made (they come first: ids 0 to
            ``chain_tasks - 1``, :attr:`simtrain.lowering.items.Lowering.chain_tasks`).

    Returns:
        rank -> ids of its tasks on a stream of :data:`STREAM_ORDER`, in launch order.
    """
    key: dict[int, tuple[int, ...]] = {}  # tid -> sort key: a chain task (tid,), a later one its anchor's + (tid,)
    previous: dict[tuple[int, str], int] = {}  # (rank, stream) -> its last task so far
    streams = frozenset(STREAM_ORDER)
    for t in tasks:
        if t.stream not in streams:
            continue
        before = previous.get((t.rank, t.stream))
        previous[t.rank, t.stream] = t.tid
        if t.tid < chain_tasks:
            key[t.tid] = (t.tid,)
            continue
        anchors = [key[d] for d in t.deps if d in key and tasks[d].rank == t.rank]
        if before is not None:
            anchors.append(key[before])
        key[t.tid] = (*max(anchors, default=(-1,)), t.tid)
    order: dict[int, list[int]] = {}
    for tid in sorted(key, key=key.__getitem__):
        order.setdefault(tasks[tid].rank, []).append(tid)
    return order


def add_hardware_queues(low: Lowering) -> None:
    """Dispatch every stream task after the task launched before it on its hardware queue (see the
    module docstring); nothing when ``hardware_queues`` is None or at least the number of streams.
    An edge to the previous task of the same stream is left out: its end, which the stream waits
    for, comes after its dispatch."""
    queues = low.topology.parallel.hardware_queues
    if queues is None or queues >= len(STREAM_ORDER):
        return
    index = {stream: i % queues for i, stream in enumerate(STREAM_ORDER)}
    tasks = low.graph.tasks
    for ids in issue_order(tasks, low.chain_tasks).values():
        last: dict[int, int] = {}  # queue -> its last task so far
        for tid in ids:
            task = tasks[tid]
            queue = index[task.stream]
            before = last.get(queue)
            if before is not None and tasks[before].stream != task.stream:
                task.dispatch_after = (*task.dispatch_after, before)
            last[queue] = tid
