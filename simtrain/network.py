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


def parse_port(name: str) -> tuple[str, int, str] | None:
    """Split an engine port name ``"<link>:<rank>:<out|in>"`` (see :class:`Topology`).

    Returns:
        ``(link, rank, direction)``, e.g. ``("nic", 3, "out")``, or None for any other resource name.
    """
    parts = name.split(":")
    if len(parts) == 3 and parts[1].isdigit():
        return parts[0], int(parts[1]), parts[2]
    return None


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
        first = self.parallel.gpu_id(pp_rank)
        last = first + stride * (size - 1)
        per_node = self.hardware.gpus_per_node
        return self._collective_route(pp_rank, first // per_node == last // per_node)

    def gradient_route(self, pp_rank: int, holders: tuple[int, ...]) -> Route:
        """Route of the gradient reduction of a model chunk held by pipeline ranks ``holders`` (one
        rank, or DualPipe's two copies), over all their DP replicas, seen from ``pp_rank``.

        NVLink when all those GPUs sit in one node, else the inter-node network; it occupies both
        directions of the rank's port. With ``holders == (pp_rank,)`` it is :meth:`dp_route`.
        """
        nodes = {self.node_of(h, d) for h in holders for d in range(self.parallel.dp)}
        return self._collective_route(pp_rank, len(nodes) == 1)

    def _collective_route(self, pp_rank: int, one_node: bool) -> Route:
        hw = self.hardware
        if one_node:
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
        """Route of the data-parallel group of ``pp_rank`` (GPU ids ``pp * tp`` apart, or ``tp``
        apart when ``ep > 1``)."""
        stride = self.parallel.gpu_id(pp_rank, 1) - self.parallel.gpu_id(pp_rank, 0)
        return self.group_route(pp_rank, stride, self.parallel.dp)

    def expert_dp_route(self, pp_rank: int) -> Route:
        """Route of the expert-data-parallel group of ``pp_rank``: the ``dp * tp / ep`` GPUs of the
        stage that hold the same experts (GPU ids ``ep`` apart; Megatron-Core's expert-DP group)."""
        p = self.parallel
        return self.group_route(pp_rank, p.ep, p.dp * p.tp // p.ep)

    def ep_placement(self, pp_rank: int) -> tuple[int, int]:
        """Where the EP group of ``pp_rank``'s representative GPU sits.

        The group is the ``ep`` consecutive GPU ids starting at the stage's first GPU (see
        :mod:`simtrain.parallel`).

        Returns:
            ``(g, n)``: members on the representative's node (itself included) and nodes the
            group spans.
        """
        first = self.parallel.gpu_id(pp_rank)
        nodes = [(first + i) // self.hardware.gpus_per_node for i in range(self.parallel.ep)]
        return nodes.count(nodes[0]), len(set(nodes))

    def a2a_routes(self, pp_rank: int, lane: str = "") -> tuple[Route, Route]:
        """The two routes of an EP all-to-all of ``pp_rank``: NVLink (the GPU's whole per-direction
        bandwidth to the node switch) and the node's NICs (the GPU's share). Each holds both
        directions of the GPU's port, since in an all-to-all every GPU sends and receives at once.

        Args:
            pp_rank: pipeline rank.
            lane: suffix of the port names (``"-combine"`` gives the combine its own lanes in the
                idealised full-duplex model; ``""`` shares the ports with p2p and the dispatch).

        Returns:
            ``(nvlink_route, nic_route)``.
        """
        hw = self.hardware
        return (
            Route(hw.intra_node, hw.intra_node.bandwidth_bytes_per_s, self._ports(f"nvlink{lane}", pp_rank)),
            Route(hw.inter_node, hw.nic_bandwidth_per_gpu_bytes_per_s, self._ports(f"nic{lane}", pp_rank)),
        )
