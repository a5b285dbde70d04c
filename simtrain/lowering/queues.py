"""Hardware work queues (``CUDA_DEVICE_MAX_CONNECTIONS``) in the lowering: how many of a rank's
streams really run at the same time.

The CUDA driver feeds a device through a fixed number of hardware work queues ("connections"),
``CUDA_DEVICE_MAX_CONNECTIONS`` of them: 1 to 32, default 8 (CUDA C++ Programming Guide, "CUDA
Environment Variables"). Streams are multiplexed onto them; streams that share a queue are
falsely serialised, since one queue launches its work in order (NVIDIA, "Kepler GK110
Architecture Whitepaper", Hyper-Q: before Hyper-Q every stream shared one queue). Megatron-LM
requires ``CUDA_DEVICE_MAX_CONNECTIONS=1`` with tensor (sequence) or context parallelism before
Blackwell, so that its communication kernels are launched before the GEMMs they overlap
(``megatron/training/arguments.py``), while FSDP asks for more than one queue "for better
parallelization" (the same file's warning).

How simtrain models it (``parallel.hardware_queues``; None leaves every stream on a queue of its
own, as CUDA's default 8 does for simtrain's at most seven streams per rank): the rank's streams,
in the order :data:`STREAM_ORDER`, go to queue ``i mod hardware_queues``, and every task of a
stream holds its queue (an engine resource named ``hwqueue-<rank>-<queue>``) while it runs, so
two streams on one queue never run at once. That is the whole false serialisation of a shared
queue, an upper bound: a real queue can still run two adjacent kernels of different streams
together. Stream-less transfers (p2p sends, EP all-to-all parts) hold no queue. The part of the
TP collectives that ``--tp-overlap`` hides runs inside the GEMM operator (Transformer Engine's
userbuffers pipeline the GEMM's chunks with the exchange), so it needs no queue of its own; only
the exposed rest runs on the ``tp`` stream. The launch order that Megatron's single queue
guarantees is not modelled: the hidden part is assumed hidden whatever the queue count.
"""

from __future__ import annotations

from .items import Lowering

STREAM_ORDER = ("compute", "tp", "cp", "dp", "zero", "offload", "reload")
"""The streams a rank's tasks run on, in the order they are given hardware queues."""


def add_hardware_queues(low: Lowering) -> None:
    """Give every stream task the hardware queue of its stream (see the module docstring);
    nothing when ``hardware_queues`` is None or at least the number of streams."""
    queues = low.topology.parallel.hardware_queues
    if queues is None or queues >= len(STREAM_ORDER):
        return
    index = {stream: i % queues for i, stream in enumerate(STREAM_ORDER)}
    for task in low.graph.tasks:
        if task.stream in index:
            task.resources = (*task.resources, f"hwqueue-{task.rank}-{index[task.stream]}")
