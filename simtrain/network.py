"""Where ranks sit, which link joins them, and how long collectives take on it.

simtrain simulates one representative GPU per pipeline stage of one DP replica (TP rank 0, DP
rank 0): the other TP and DP ranks do the same work at the same times. Each representative owns
the link ports of its GPU; these are the engine's shared resources (see :mod:`simtrain.engine`),
named ``"<link>:<rank>:out"`` and ``"<link>:<rank>:in"`` with link ``nvlink`` or ``nic``.

Collective times use the ring algorithm's alpha-beta cost (Thakur, Rabenseifner & Gropp 2005,
"Optimization of Collective Communication Operations in MPICH", §2): for n ranks and a message
of M bytes, reduce-scatter and all-gather take ``(n-1) * alpha + (n-1)/n * M / bw`` and an
all-reduce (reduce-scatter + all-gather) twice that.
"""

from __future__ import annotations

from dataclasses import dataclass

from .hardware import HardwareProfile, Link
from .parallel import ParallelConfig


def ring_reduce_scatter_s(nbytes: float, n: int, link: Link, bandwidth_bytes_per_s: float) -> float:
    """Seconds for a ring reduce-scatter (or all-gather) of an ``nbytes`` buffer over ``n`` ranks.

    Returns 0 when ``n == 1`` or the buffer is empty.
    """
    if n <= 1 or nbytes <= 0:
        return 0.0
    return (n - 1) * link.latency_s + (n - 1) / n * nbytes / (bandwidth_bytes_per_s * link.efficiency)


def ring_all_gather_s(nbytes: float, n: int, link: Link, bandwidth_bytes_per_s: float) -> float:
    """Seconds for a ring all-gather producing an ``nbytes`` buffer on each of ``n`` ranks."""
    return ring_reduce_scatter_s(nbytes, n, link, bandwidth_bytes_per_s)


def ring_all_reduce_s(nbytes: float, n: int, link: Link, bandwidth_bytes_per_s: float) -> float:
    """Seconds for a ring all-reduce of an ``nbytes`` buffer over ``n`` ranks (RS + AG)."""
    return 2 * ring_reduce_scatter_s(nbytes, n, link, bandwidth_bytes_per_s)


@dataclass(frozen=True)
class Route:
    """A link class and the bandwidth one GPU gets on it, plus the engine resources it occupies.

    Attributes:
        link: the link class (latency, efficiency).
        bandwidth_bytes_per_s: nominal per-direction bandwidth available to this traffic.
        resources: engine resource names held for the duration of a transfer.
    """

    link: Link
    bandwidth_bytes_per_s: float
    resources: tuple[str, ...]

    def transfer_s(self, nbytes: float) -> float:
        """Alpha-beta time of one message of ``nbytes`` on this route (0 if empty)."""
        return self.link.transfer_s(nbytes, self.bandwidth_bytes_per_s)


@dataclass(frozen=True)
class Topology:
    """Placement of the job's GPUs on nodes and the routes between pipeline ranks.

    Args:
        hardware: the profile (GPUs per node, links).
        parallel: the degrees; GPU ids follow :meth:`ParallelConfig.gpu_id`.
    """

    hardware: HardwareProfile
    parallel: ParallelConfig

    def node_of(self, pp_rank: int, dp_rank: int = 0, tp_rank: int = 0) -> int:
        """Node index of a GPU."""
        return self.parallel.gpu_id(pp_rank, dp_rank, tp_rank) // self.hardware.gpus_per_node

    def _ports(self, kind: str, src: int, dst: int | None = None) -> tuple[str, ...]:
        if dst is None:
            return (f"{kind}:{src}:out", f"{kind}:{src}:in")
        return (f"{kind}:{src}:out", f"{kind}:{dst}:in")

    def p2p(self, src: int, dst: int) -> Route:
        """Route of a point-to-point message from pipeline rank ``src`` to ``dst``.

        Inside a node it uses NVLink at the per-peer bandwidth; across nodes, the GPU's share of
        the node's NICs. It occupies the sender's outgoing and the receiver's incoming port.
        """
        hw = self.hardware
        if self.node_of(src) == self.node_of(dst):
            return Route(hw.intra_node, hw.intra_node.peer_bandwidth_bytes_per_s, self._ports("nvlink", src, dst))
        return Route(hw.inter_node, hw.nic_bandwidth_per_gpu_bytes_per_s, self._ports("nic", src, dst))

    def group_route(self, pp_rank: int, stride: int, size: int) -> Route:
        """Route used by a collective over ``size`` GPUs spaced ``stride`` apart in GPU ids.

        NVLink when the whole group sits in one node, else the inter-node network (a ring is as
        fast as its slowest hop). It occupies both directions of the rank's port.
        """
        hw = self.hardware
        first = self.parallel.gpu_id(pp_rank)
        last = first + stride * (size - 1)
        if first // hw.gpus_per_node == last // hw.gpus_per_node:
            return Route(hw.intra_node, hw.intra_node.bandwidth_bytes_per_s, self._ports("nvlink", pp_rank))
        return Route(hw.inter_node, hw.nic_bandwidth_per_gpu_bytes_per_s, self._ports("nic", pp_rank))

    def processor_pools(self, num_ranks: int) -> tuple[dict[int, str], dict[str, float]]:
        """Which pipeline ranks share processors, for nodes running more ranks than processors.

        A node whose job GPUs (ranks) outnumber the profile's ``processors_per_node`` (e.g. 4
        ranks on a 2-core CPU) runs their compute on one shared pool. simtrain simulates one
        rank per pipeline stage (TP and DP rank 0), so the pool gets the simulated ranks' share
        of the node's processors: ``processors x simulated ranks / job ranks on the node``.

        Args:
            num_ranks: pipeline ranks simulated (0 .. num_ranks-1).

        Returns:
            ``(rank -> pool name, pool name -> processors)``; both empty when nothing is shared
            (always for profiles without ``compute.processors_per_node``).
        """
        processors = self.hardware.processors_per_node
        if processors is None:
            return {}, {}
        gpn, world = self.hardware.gpus_per_node, self.parallel.world_size
        nodes = {r: self.node_of(r) for r in range(num_ranks)}
        assignment: dict[int, str] = {}
        pools: dict[str, float] = {}
        for rank, node in nodes.items():
            on_node = min(gpn, world - node * gpn)
            if on_node <= processors:
                continue
            name = f"processors:node{node}"
            simulated = sum(1 for n in nodes.values() if n == node)
            pools[name] = processors * simulated / on_node
            assignment[rank] = name
        return assignment, pools

    def tp_route(self, pp_rank: int = 0) -> Route:
        """Route of the tensor-parallel group of ``pp_rank`` (consecutive GPU ids)."""
        return self.group_route(pp_rank, 1, self.parallel.tp)

    def dp_route(self, pp_rank: int) -> Route:
        """Route of the data-parallel group of ``pp_rank`` (GPU ids ``pp * tp`` apart)."""
        return self.group_route(pp_rank, self.parallel.pp * self.parallel.tp, self.parallel.dp)
