"""The SMs a running NCCL collective takes from the compute that overlaps it on the same GPU.

What NCCL does (NVIDIA/nccl at 5067397c2676d5aed50042fc39e5c8ee96eb0027):

* a collective is one kernel launched with one CTA per channel: ``ncclLaunchKernel`` in
  ``src/enqueue.cc`` sets ``grid = {nChannels}`` with ``nChannels`` the bits of the plan's
  channel mask;
* for ring and tree algorithms the channel count starts at the communicator's ``nChannels``
  and is lowered only for small messages (``topoGetAlgoInfo``, ``src/enqueue.cc``:
  ``while (nBytes < nc * nt * threadThreshold) nc--``), so a large gradient bucket or layer
  all-gather uses all of them;
* the communicator's ``nChannels`` is twice what the topology search found
  (``ncclTopoPostset``, ``src/graph/connect.cc``: ``nChannels = min(MAXCHANNELS, nChannels * 2)``),
  within ``NCCL_MIN_NCHANNELS`` / ``NCCL_MAX_NCHANNELS`` and ``config.minCTAs/maxCTAs``;
* an NCCL CTA does not share its SM with compute kernels: "NCCL CTAs won't share an SM with
  compute kernels" (S. Jeaugey, NCCL maintainer, NVIDIA/nccl#689, 2023-08).

The channel counts (CTAs, hence SMs) of the shipped profiles' nodes, each a measurement:

* DGX A100 (108 SMs), a group within one node: 24 (NVIDIA/nccl-tests#100, NCCL_DEBUG=INFO of
  an 8-GPU HGX A100 on NVSwitch: ``Channel 00/24`` ... ``Channel 23/24``);
* DGX A100, a group across nodes (8 HDR NICs): 16 ("If you are on DGX with 8 NICs and a top
  speed of 190 GB/s, then it would use 16 SMs", S. Jeaugey in NVIDIA/nccl#689);
* H100 SXM (132 SMs), within one node: 24 (an FSDP all-gather beside a GEMM on H100,
  Nsight Systems: "the concurrent ncclAllGather kernel launches 24 blocks", NVIDIA developer
  forum thread 337991, 2025);
* H100 SXM, across nodes (8 NDR NICs): 16 (NVIDIA/nccl#1453, NCCL_DEBUG=INFO of 3 x 8 H100 on
  IB: ``Channel 00/16`` ... ``Channel 15/16``).

They agree with the source: the search finds 6 A100 NVLink channels at 40 GB/s (12 links of
``SM80_NVLINK_BW`` 20), doubled by ``ncclTopoDupChannels`` and again by ``ncclTopoPostset``:
24; across nodes one channel per NIC (8), not duplicated below 25 GB/s a channel, doubled by
``ncclTopoPostset``: 16. H100 takes the same path at 60 GB/s a channel (``sm90SpeedArrayIntra``)
and 48 a NIC (``sm90SpeedArrayInter``). They are the profile's ``nccl_channels``; a run that sets
``NCCL_MAX_NCHANNELS`` / ``maxCTAs`` gives ``parallel.nccl_channels``.

Model (:class:`simtrain.sm_share.SmShare`): while such a kernel runs on a rank, the compute
tasks of that rank run on the other ``S - c`` SMs, their compute-bound share slowed by
``S / (S - c)`` and their memory-bound share unchanged (the assumption of
:mod:`simtrain.costs.ep_sms`). Dynamic and exact: a compute task is slowed only for the part of
it that a collective overlaps. The measured size of the effect agrees in magnitude: compute
overlapped with communication slowed by 18.9 % on average (up to 40 %) over GPT and Llama
training on 4 A100 and 4 H100 (Lee et al. 2025, arXiv:2507.03114, abstract); the model gives
``S / (S - c) - 1`` = 17.4 % (A100, 16 channels) to 28.6 % (A100, 24) for compute-bound work.

Which tasks take SMs: the collectives of the ``dp`` (gradient reduction, ZeRO-1/2 parameter
all-gather, tied-embedding all-reduce), ``zero`` (ZeRO-3 parameter all-gathers, ZeRO-1/2's under
``overlap_param_gather``) and ``tp`` streams. Not modelled: pipeline p2p sends (NCCL send/recv kernels on a few p2p channels),
context-parallel exchanges (p2p), EP all-to-alls (DeepEP's own SMs: :mod:`simtrain.costs.ep_sms`),
copies (the copy engines), NVLS all-reduce's own channel count (``NVLS_NCHANNELS``, 16 on H100),
the HBM bandwidth NCCL takes, and the wave quantization of a GEMM whose last wave no longer fits
(the forum thread above saw a 132-tile GEMM nearly double).
"""

from __future__ import annotations

from ..errors import SimtrainError
from ..sm_share import SmShare
from .items import Lowering

NCCL_KINDS = frozenset({"dp", "zero", "tp"})
"""Kinds of the communication tasks that run as NCCL collective kernels on the GPU's SMs."""

MEMORY_BOUND_KINDS = frozenset({"OPT"})
"""Compute kinds that are memory-bound elementwise work (the optimizer step), not slowed."""


def channels(hardware, parallel, resources: tuple[str, ...]) -> int:
    """SMs a collective holding engine ports ``resources`` takes on its GPU.

    Args:
        hardware: a :class:`simtrain.hardware.HardwareProfile` (``nccl_channels``: intra-node,
            inter-node CTAs; ``sms``).
        parallel: a :class:`simtrain.parallel.ParallelConfig` (``nccl_channels``: the run's
            ``NCCL_MAX_NCHANNELS``, or None for the profile's).
        resources: the task's ports; a ``nic:`` port means its group spans nodes
            (:meth:`simtrain.network.Topology.route`).

    Returns:
        The channel count, 0 where the profile has no ``sms`` or no ``nccl_channels`` (and the
        run sets none), or the run sets 0.
    """
    if hardware.sms is None:
        return 0
    if parallel.nccl_channels is not None:
        return parallel.nccl_channels
    if hardware.nccl_channels is None:
        return 0
    intra, inter = hardware.nccl_channels
    return inter if any(r.startswith("nic:") for r in resources) else intra


def compute_bound_share(chunk, kind: str) -> float:
    """Compute-bound share of the seconds of an action of ``kind`` on ``chunk`` (a
    :class:`simtrain.costs.ChunkCost`): its ``compute_bound_fraction`` per pass (B: I and W
    weighted by their seconds); 0 for the optimizer step; 1 without a chunk."""
    if kind in MEMORY_BOUND_KINDS:
        return 0.0
    if chunk is None:
        return 1.0
    f, i, w = chunk.compute_bound_fraction
    if kind == "F":
        return f
    if kind == "I":
        return i
    if kind == "W":
        return w
    total = chunk.backward_input_s + chunk.backward_weight_s
    return (i * chunk.backward_input_s + w * chunk.backward_weight_s) / total if total > 0 else 1.0


def add_nccl_sms(low: Lowering) -> None:
    """The last lowering pass: on every rank where an NCCL collective runs, that rank's compute
    tasks and its collectives share one :class:`simtrain.sm_share.SmShare` pool ``sms:<rank>``
    (module docstring). Nothing changes without ``sms`` or channel counts, with ``--op-times``
    costs, or for a task already on a processor pool (``compute.processors_per_node``).

    Raises:
        SimtrainError: ``parallel.nccl_channels`` set (> 0) on a profile without ``sms``, not
            below the profile's ``sms``, or, with expert parallelism, not below what DeepEP's
            ``ep_comm_sms`` leave (the two can run at once).
    """
    hardware, parallel = low.topology.hardware, low.topology.parallel
    if hardware.sms is None and parallel.nccl_channels:
        raise SimtrainError(f"parallel.nccl_channels = {parallel.nccl_channels}: hardware profile {hardware.name} "
                            "has no field 'sms' (the GPU's streaming multiprocessors), so NCCL's SM share cannot apply; "
                            "add sms to the profile or leave nccl_channels unset")
    if low.costs.fixed_op_times or hardware.sms is None:
        return
    ep_sms = parallel.ep_comm_sms if parallel.ep > 1 and any(c.moe for c in low.costs.chunks) else 0
    worst = parallel.nccl_channels if parallel.nccl_channels is not None else max(hardware.nccl_channels or (0,))
    if worst and worst + ep_sms >= hardware.sms:
        raise SimtrainError(f"parallel.nccl_channels = {worst}" + (f" with ep_comm_sms = {ep_sms}" if ep_sms else "")
                            + f": must leave compute some of the {hardware.sms} SMs (sms) of hardware profile "
                            f"{hardware.name}; allowed: below {hardware.sms - ep_sms}")
    takers: dict[int, dict[int, int]] = {}
    for task in low.graph.tasks:
        if task.category == "comm" and task.kind in NCCL_KINDS and task.duration_s > 0 and task.pool is None:
            c = channels(hardware, parallel, task.resources)
            if c > 0:
                takers.setdefault(task.rank, {})[task.tid] = c
    inside = _overlap_windows(low.graph.tasks, takers)  # drops the collectives no compute can overlap
    takers = {rank: taking for rank, taking in takers.items() if taking}
    if not takers:
        return
    bound: dict[int, dict[int, float]] = {rank: {} for rank in takers}
    names = {rank: f"sms:{rank}" for rank in takers}
    shares: dict[tuple, float] = {}  # (stage, kind) -> compute-bound share
    for task in low.graph.tasks:
        rank = task.rank
        if rank not in takers or task.pool is not None:
            continue
        if task.category == "compute":
            if not inside(task):
                continue  # ordered before or after every collective of its rank: never slowed
            key = (task.stage, task.kind)
            if key not in shares:
                shares[key] = compute_bound_share(low.chunk[task.stage] if task.stage is not None else None, task.kind)
            bound[rank][task.tid] = shares[key]
            task.pool = names[rank]
        elif task.tid in takers[rank]:
            task.pool = names[rank]
    for rank, taking in takers.items():
        low.graph.pools[f"sms:{rank}"] = SmShare(hardware.sms, taking, bound[rank]).factory


def _overlap_windows(tasks: list, takers: dict[int, dict[int, int]]):
    """Which compute tasks a collective of their rank can overlap, from the dependency order
    alone, so that only those join the pool (the same trace, far fewer pool steps: a TP
    collective between two layers' compute overlaps neither).

    A ``compute``-stream task at or before (in stream order) a same-rank compute task that the
    collective depends on ends before it starts; one at or after a same-rank compute task that
    depends on the collective starts after it ends. A collective's window is the stream
    positions strictly between the two, from its direct dependencies and direct dependants
    (without one, the window stays open on that side: wider, never wrong). Collectives with an
    empty window are removed from ``takers`` (in place); on a rank with a compute task off the
    compute stream every collective is kept.

    Returns:
        A predicate ``task -> bool``: the compute task lies in some window of its rank.
    """
    pos: dict[int, int] = {}  # tid -> position on its rank's compute stream (ranks with takers)
    counts: dict[int, int] = {}
    loose: set[int] = set()  # ranks with compute off the compute stream
    lo: dict[int, int] = {tid: -1 for taking in takers.values() for tid in taking}
    hi: dict[int, float] = dict.fromkeys(lo, INF)
    for t in tasks:
        rank = t.rank
        if rank not in takers or t.category != "compute":
            continue
        if t.stream != "compute":
            loose.add(rank)
            continue
        p = pos[t.tid] = counts.get(rank, 0)
        counts[rank] = p + 1
        for d in t.deps:  # a compute task waiting for a collective: the collective's upper end
            if d in hi and tasks[d].rank == rank and p < hi[d]:
                hi[d] = p
    covered: dict[int, list[bool]] = {}  # rank -> per compute-stream position: inside some window
    for rank, taking in takers.items():
        size = counts.get(rank, 0)
        diff = [0] * (size + 1)
        for tid in list(taking):
            first = max([pos.get(d, -1) for d in tasks[tid].deps if tasks[d].rank == rank], default=-1) + 1
            stop = min(hi[tid], size)
            if first < stop:  # positions first .. stop - 1
                diff[first] += 1
                diff[stop] -= 1
            elif rank not in loose:
                del taking[tid]  # nothing can overlap it
        marks, depth = [], 0
        for k in range(size):
            depth += diff[k]
            marks.append(depth > 0)
        covered[rank] = marks

    def inside(task) -> bool:
        p = pos.get(task.tid, -1)
        return p < 0 or covered[task.rank][p]

    return inside


INF = float("inf")
