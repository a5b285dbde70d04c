"""Where ranks sit, which link joins them, and how long collectives take on it.

simtrain simulates one representative GPU per pipeline stage of one DP replica (TP rank 0, DP
rank 0): the other TP and DP ranks do the same work at the same times. Each representative owns
the link ports of its GPU; these are the engine's shared resources (see :mod:`simtrain.engine`),
named ``"<link>:<rank>:out"`` and ``"<link>:<rank>:in"`` with link ``nvlink`` or ``nic``.

Collective times come from :mod:`simtrain.collectives` (NCCL's own tuning model: ring, tree and
NVLS, the cheapest for the size; multi-node rings over all the NICs of a node) on the group's
placement (:meth:`Topology.placement`). A p2p message is alpha-beta at its link class's achieved
bandwidth. An EP all-to-all runs its NVLink and NIC parts at once at their achieved rates; when
the EP group spans nodes the NVLink part is DeepEP's forwarding leg, capped at
:data:`simtrain.deepep.FORWARD_CEILING_BYTES_PER_S`. Every duration holds the route's ports, so
transfers contend on them (sharing their bandwidth or queueing, per the link's ``sharing``). The
textbook ring (Thakur, Rabenseifner & Gropp 2005, "Optimization of Collective Communication
Operations in MPICH", §2) below is kept for the calibration records that compare measurements
with it.

Communication is data: a :class:`Collective` names the operation, the parallel dimension of its
group and the bytes; :meth:`Topology.route` says which link it takes and which engine ports it
holds, :meth:`Topology.shared_links` which links' ports are shared by the transfers on them at
once (:mod:`simtrain.link_share`; the others serve one transfer at a time), :meth:`Topology.seconds`
how long it takes, and :meth:`Topology.all_to_all` how an EP all-to-all splits over NVLink and the
NICs. Nothing else in simtrain prices communication.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from .collectives import Group as Placement
from .collectives import estimate_group
from .deepep import FORWARD_CEILING_BYTES_PER_S
from .errors import SimtrainError
from .hardware import HardwareProfile, Link
from .parallel import GroupDim, ParallelConfig, flag_name


def check_host_link(parallel: ParallelConfig, hardware: HardwareProfile,
                    name: Callable[[str, object], str] = flag_name) -> None:
    """Refuse activation offload (``parallel.offload``, in a training step) on a profile without a ``pcie`` figure, the
    GPU-to-host link its copies are priced on (:meth:`Topology.host_route`).

    Args:
        parallel, hardware: the settings and the profile.
        name: how the message names the setting, from its field and value (default: the flag,
            ``--offload activations``; :func:`simtrain.costs.stage.check_settings` passes the entry
            point's: a scenario file's field, an API argument).

    Raises:
        SimtrainError: offload is on and the profile has no ``pcie`` field.
    """
    if parallel.offload_fraction > 0 and not parallel.forward_only and hardware.host_link is None:
        raise SimtrainError(
            f"{name('offload', parallel.offload)}: hardware profile {hardware.name} has no field 'pcie' "
            "(the GPU-to-host link); add pcie: {name, bandwidth_gb_per_s} (per direction, from the datasheet) to "
            f"the profile, or use {name('offload', 'none')}")

CollectiveOp = Literal["all-reduce", "reduce-scatter", "all-gather", "all-to-all", "p2p", "d2h", "h2d"]
"""The communication operations simtrain prices (nccl-tests names; ``d2h`` / ``h2d``: a copy from
the GPU to host memory and back, over the profile's ``pcie`` link)."""


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
class Collective:
    """What an action communicates: an operation over the group of one parallel dimension.

    Attributes:
        op: the operation.
        dim: the parallel dimension of the group (``tp``, ``cp``, ``dp``, ``ep``, ``expert_dp``; ``pp`` for
            p2p; ``host`` for a ``d2h`` / ``h2d`` copy); the group itself follows from :meth:`simtrain.parallel.ParallelConfig.group`.
        nbytes: bytes of the buffer (all-reduce / reduce-scatter input, all-gather output, the
            message of a p2p, everything one GPU sends in an all-to-all, local copies included).
        repeat: how many identical collectives back to back (e.g. 4 per layer x layers).
        link_bytes: for an all-to-all, bytes the GPU sends per link class (``("nvlink", b)``,
            ``("nic", b)``); the routing model of :mod:`simtrain.moe` decides them; empty: a
            uniform all-to-all over the group, ``repeat`` times (see ``Topology._spread``).
        imbalance: for an all-to-all, what the most loaded GPU receives over the mean (>= 1).
    """

    op: CollectiveOp
    dim: GroupDim | Literal["pp", "host"]
    nbytes: float
    repeat: int = 1
    link_bytes: tuple[tuple[str, float], ...] = ()
    imbalance: float = 1.0


@dataclass(frozen=True)
class A2APart:
    """The share of one all-to-all that one link class carries, for the simulated GPU.

    Attributes:
        link: ``"nvlink"`` or ``"nic"``.
        nbytes: bytes the GPU sends over this link class (it receives as many, times the imbalance).
        latency_s: one message latency of the link (paid once per all-to-all, or per wave).
        transfer_s: seconds of the bytes at the achieved bandwidth (imbalance included).
    """

    link: str
    nbytes: float
    latency_s: float
    transfer_s: float

    def seconds(self, waves: int = 1) -> float:
        """Duration of one of ``waves`` equal pieces: ``latency + transfer / waves``."""
        return self.latency_s + self.transfer_s / waves


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
        """Alpha-beta time of one message of ``nbytes`` on this route at the link class's achieved
        bandwidth (``bandwidth x Link.collective_efficiency``); 0 if empty."""
        if nbytes <= 0:
            return 0.0
        return self.link.latency_s + nbytes / (self.bandwidth_bytes_per_s * self.link.collective_efficiency)


@dataclass(frozen=True)
class Topology:
    """Placement of the job's GPUs on nodes and the routes between pipeline ranks.

    Args:
        hardware: the profile (GPUs per node, links).
        parallel: the degrees; GPU ids follow :meth:`ParallelConfig.gpu_id`.
    """

    hardware: HardwareProfile
    parallel: ParallelConfig
    _placements: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def node_of(self, pp_rank: int, dp_rank: int = 0, tp_rank: int = 0) -> int:
        """Node index of a GPU."""
        return self.parallel.gpu_id(pp_rank, dp_rank, tp_rank) // self.hardware.gpus_per_node

    def _ports(self, kind: str, src: int, dst: int | None = None) -> tuple[str, ...]:
        if dst is None:
            return (f"{kind}:{src}:out", f"{kind}:{src}:in")
        return (f"{kind}:{src}:out", f"{kind}:{dst}:in")

    def shared_links(self) -> frozenset[str]:
        """The link names (the first part of a port name: ``nvlink``, ``nic``, ``pcie`` and the
        all-to-all lanes ``nvlink-combine`` / ``nic-combine``) whose ports share bandwidth among the
        transfers using them at once: those of the profile's links with ``sharing: fair``
        (:attr:`simtrain.hardware.Link.sharing`, :mod:`simtrain.link_share`)."""
        hw = self.hardware
        names = []
        if hw.intra_node.sharing == "fair":
            names += ["nvlink", "nvlink-combine"]
        if hw.inter_node.sharing == "fair":
            names += ["nic", "nic-combine"]
        if hw.host_link is not None and hw.host_link.sharing == "fair":
            names.append("pcie")
        return frozenset(names)

    def p2p(self, src: int, dst: int) -> Route:
        """Route of a point-to-point message from pipeline rank ``src`` to ``dst``.

        Inside a node it uses NVLink at the per-peer bandwidth; across nodes, the GPU's share of
        the node's NICs. It occupies the sender's outgoing and the receiver's incoming port.
        """
        hw = self.hardware
        if self.node_of(src) == self.node_of(dst):
            return Route(hw.intra_node, hw.intra_node.peer_bandwidth_bytes_per_s, self._ports("nvlink", src, dst))
        return Route(hw.inter_node, hw.nic_bandwidth_per_gpu_bytes_per_s, self._ports("nic", src, dst))

    def host_route(self, pp_rank: int, op: str) -> Route:
        """Route of a copy between ``pp_rank``'s GPU and host memory: the profile's ``pcie`` link at
        its per-direction bandwidth; a ``d2h`` copy holds the port ``pcie:<rank>:out``, an ``h2d``
        copy ``pcie:<rank>:in`` (the link is full duplex: offloads and reloads do not contend).

        Raises:
            SimtrainError: the profile has no ``pcie`` figure.
        """
        link = self.hardware.host_link
        if link is None:
            raise SimtrainError(f"hardware profile {self.hardware.name}: field 'pcie' is missing, so activation "
                                "offload cannot be priced; add pcie: {name, bandwidth_gb_per_s} (per direction, "
                                "from the datasheet)")
        return Route(link, link.bandwidth_bytes_per_s, (f"pcie:{pp_rank}:{'out' if op == 'd2h' else 'in'}",))

    def gradient_route(self, pp_rank: int, holders: tuple[int, ...]) -> Route:
        """Route of the gradient reduction of a model chunk held by pipeline ranks ``holders`` (one
        rank, or DualPipe's two copies), over all their DP replicas, seen from ``pp_rank``."""
        return self.route(Collective("all-reduce", "dp", 0.0), pp_rank, holders)

    def _collective_route(self, pp_rank: int, one_node: bool) -> Route:
        hw = self.hardware
        if one_node:
            return Route(hw.intra_node, hw.intra_node.bandwidth_bytes_per_s, self._ports("nvlink", pp_rank))
        return Route(hw.inter_node, hw.nic_bandwidth_per_gpu_bytes_per_s, self._ports("nic", pp_rank))

    def route(self, c: Collective, pp_rank: int = 0, holders: tuple[int, ...] | None = None,
              peer: int | None = None) -> Route:
        """The route of collective ``c`` issued by ``pp_rank``'s simulated GPU.

        Args:
            c: the collective (not an all-to-all: see :meth:`all_to_all`).
            pp_rank: the issuing pipeline rank (its ports are held).
            holders: for ``dp`` / ``expert_dp`` gradient collectives, the pipeline ranks holding
                the model chunk (see :meth:`simtrain.parallel.ParallelConfig.group`).
            peer: for a p2p, the receiving pipeline rank.

        Returns:
            NVLink when the group sits in one node, else the inter-node network (a ring is as
            fast as its slowest hop), holding both directions of the rank's port; a p2p holds
            the sender's outgoing and the receiver's incoming port (see :meth:`p2p`).
        """
        if c.op == "p2p":
            return self.p2p(pp_rank, peer)
        if c.op in ("d2h", "h2d"):
            return self.host_route(pp_rank, c.op)
        lo, hi = self.parallel.group(c.dim, pp_rank, holders).span
        per_node = self.hardware.gpus_per_node
        return self._collective_route(pp_rank, lo // per_node == hi // per_node)

    def seconds(self, c: Collective, pp_rank: int = 0, holders: tuple[int, ...] | None = None,
                peer: int | None = None) -> float:
        """Seconds of collective ``c`` (``repeat`` times) issued by ``pp_rank``: NCCL's model
        (:func:`simtrain.collectives.estimate_group`) for all-reduce / reduce-scatter / all-gather
        on the group's :meth:`placement`, alpha-beta for a p2p (:meth:`Route.transfer_s`), the
        slower link class for an all-to-all (:meth:`all_to_all`). 0 for an empty buffer or a group
        of one GPU.
        """
        if c.op == "all-to-all":  # repeat counts for a uniform one (an EP one's bytes are its whole)
            return (1 if c.link_bytes else c.repeat) * max((p.seconds() for p in self.all_to_all(c, pp_rank)),
                                                           default=0.0)
        if c.op in ("p2p", "d2h", "h2d"):
            return c.repeat * self.route(c, pp_rank, holders, peer).transfer_s(c.nbytes)
        return c.repeat * estimate_group(c.op, c.nbytes, self.hardware, self.placement(c.dim, pp_rank, holders)).time_s

    def placement(self, dim: GroupDim, pp_rank: int, holders: tuple[int, ...] | None = None) -> Placement:
        """Where the group of ``dim`` around ``pp_rank``'s GPU sits (members as in
        :meth:`ParallelConfig.group`).

        Returns:
            ``Placement(gpus, per_node, nodes)``: the group's size, the most members it has on one
            node, and the nodes it spans.
        """
        key = (dim, pp_rank, holders)  # priced again for every bucket of every stage: worked out once
        if key not in self._placements:
            self._placements[key] = self._placement(dim, pp_rank, holders)
        return self._placements[key]

    def _placement(self, dim: GroupDim, pp_rank: int, holders: tuple[int, ...] | None) -> Placement:
        p, per_node = self.parallel, self.hardware.gpus_per_node
        holders = (pp_rank,) if holders is None else holders
        # gpu_id is affine in each index, so numpy broadcasts it over the whole group at once
        if dim in ("tp", "ep"):
            ids = p.gpu_id(pp_rank) + np.arange(p.tp if dim == "tp" else p.ep)
        elif dim == "cp":
            ids = p.gpu_id(pp_rank, cp_rank=np.arange(p.cp))
        elif dim == "dp":  # the DP replicas and their CP ranks (they hold the same parameters)
            ids = p.gpu_id(np.reshape(holders, (-1, 1, 1)), np.arange(p.dp).reshape(1, -1, 1),
                           cp_rank=np.arange(p.cp).reshape(1, 1, -1))
        else:
            ids = p.gpu_id(np.reshape(holders, (-1, 1))) + p.ep * np.arange(p.expert_dp).reshape(1, -1)
        per = np.unique(np.ravel(ids) // per_node, return_counts=True)[1]
        return Placement(int(per.sum()), int(per.max()), len(per))

    def all_to_all(self, c: Collective, pp_rank: int = 0) -> tuple[A2APart, ...]:
        """The per-link-class parts of an EP all-to-all (hierarchical: NVLink and NICs at once,
        each at the GPU's full NVLink bandwidth or its share of the node's NICs; see
        :meth:`a2a_routes`). Each part takes ``latency + bytes x imbalance / (bandwidth x
        efficiency)``, the NVLink part of a group spanning nodes at most DeepEP's forwarding
        ceiling; link classes without bytes are left out. The efficiency is the link's
        collective one, except NCCL's all-to-all (every one but an EP one with ``ep_kernel
        fused``) on the NICs: :attr:`simtrain.hardware.Link.a2a_efficiency`."""
        nvlink, nic = self.a2a_routes(pp_rank)
        routes = {"nvlink": nvlink, "nic": nic}
        nccl = not (c.dim == "ep" and self.parallel.ep_kernel == "fused")
        parts = []
        for link, nbytes in c.link_bytes or self._spread(c, pp_rank):
            route = routes[link]
            if nbytes > 0:
                eff = route.link.a2a_efficiency if nccl and link == "nic" else route.link.collective_efficiency
                bw = route.bandwidth_bytes_per_s * eff
                if link == "nvlink" and self.placement("ep", pp_rank).nodes > 1:
                    bw = min(bw, FORWARD_CEILING_BYTES_PER_S)  # DeepEP's internode forwarding leg
                parts.append(A2APart(link, nbytes, route.link.latency_s, nbytes * c.imbalance / bw))
        return tuple(parts)

    def _spread(self, c: Collective, pp_rank: int) -> tuple[tuple[str, float], ...]:
        """Link bytes of a uniform all-to-all over the group of ``c.dim`` (e.g. Ulysses over CP):
        of the ``nbytes`` a GPU holds, 1/n stays local, 1/n goes to each other member, over NVLink
        to those on its node and over the NICs to the others. The group's members are evenly
        spaced GPU ids from its span."""
        group = self.parallel.group(c.dim, pp_rank)
        n, (lo, hi) = group.size, group.span
        if n <= 1:
            return ()
        stride = (hi - lo) // (n - 1)
        per_node = self.hardware.gpus_per_node
        local = sum(1 for i in range(n) if (lo + i * stride) // per_node == lo // per_node)
        return (("nvlink", c.nbytes * (local - 1) / n), ("nic", c.nbytes * (n - local) / n))

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
        return self.route(Collective("all-reduce", "tp", 0.0), pp_rank)

    def dp_route(self, pp_rank: int) -> Route:
        """Route of the data-parallel group of ``pp_rank``."""
        return self.route(Collective("all-reduce", "dp", 0.0), pp_rank)

    def expert_dp_route(self, pp_rank: int) -> Route:
        """Route of the expert-data-parallel group of ``pp_rank`` (see
        :attr:`simtrain.parallel.ParallelConfig.expert_dp`)."""
        return self.route(Collective("all-reduce", "expert_dp", 0.0), pp_rank)

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
