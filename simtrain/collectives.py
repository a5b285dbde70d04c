"""NCCL collectives priced the way NCCL's own tuning model prices them.

One call, :func:`estimate`, takes a collective (``op``), the size nccl-tests reports for it
(``nbytes``), the group (``gpus`` over nodes of ``gpus_per_node`` members) and a hardware profile,
and returns the time of the fastest algorithm/protocol NCCL could pick, with nccl-tests' algbw and
busbw (NVIDIA/nccl-tests doc/PERFORMANCE.md: ``algbw = size / time``; ``busbw = algbw x 2(n-1)/n``
for all-reduce, ``x (n-1)/n`` for all-gather, reduce-scatter and all-to-all, ``x 1`` for broadcast
and send/recv).

The model follows NCCL's tuning model (NVIDIA/nccl ``src/graph/tuning.cc``, commit 5067397,
``ncclTopoTuneModel`` and ``ncclTopoGetAlgoTime``): ``time = latency + size / algbw`` per
(algorithm, protocol), the cheapest wins, so busbw rises with message size and saturates.

* **Latency**: NCCL's base latency plus per-step hop latencies (``baseLatencies``,
  ``hwLatencies``); a ring all-reduce has ``2(n-1)`` steps, ``2(nodes-1)`` of them over the
  network; a tree ``2((n/nodes - 1) intra + log2(nodes) inter)``; NVLS one NVLS hop.
* **Bandwidth**: each link class at its achieved rate (``Link.achieved_bandwidth_bytes_per_s``:
  nominal x ``intra_node.efficiency`` / ``inter_node.efficiency``). A ring's bus bandwidth is
  bounded by NVLink inside a node and by the node's NICs across nodes: NCCL builds one ring per
  channel and each channel leaves a node through its own NIC, so the bus traffic of a rank leaves
  the node over all NICs together (hierarchical: NVLink phase inside, every NIC across).
  Protocol factors from NCCL's tuning model: LL x 0.5, LL128 x 0.92 (ring); tree all-reduce
  algbw = 0.5 x 0.92 x bus bandwidth, LL x 1/3.8, LL128 x 7/9 (one node) or 120/128, times NCCL's
  tree correction per size; multi-node ring/Simple all-reduce latency x 1.4 (NCCL's plateau).
* **NVLS** (NVLink SHARP, one node, where ``intra_node.nvls_efficiency`` is set): the switch
  reduces (``multimem.ld_reduce``) and multicasts (``multimem.st``); per GPU and direction an
  all-reduce moves ``S (1 + 1/n)`` bytes, a reduce-scatter or all-gather ``S``, at
  NVLink x ``nvls_efficiency`` (NCCL's ``nvlsEfficiency``: Hopper 0.85, Blackwell 0.74).
* **p2p** (send/recv): one message at the peer NVLink bandwidth or the GPU's NIC share, with the
  profile's link latency. **all-to-all**: each rank sends ``S/n`` to every peer; NVLink and the
  NIC share carry their parts at once, the NICs at ``inter_node.alltoall_efficiency`` where the
  profile has it (NCCL's all-to-all, measured by nccl-tests ``alltoall_perf``).

Not modelled: NVLS-Tree and CollNet (multi-node in-network reduction), PAT, NCCL's LL/LL128 caps
per channel; a multi-node NVLS request is an error.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .errors import SimtrainError
from .hardware import HardwareProfile

OPS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "broadcast", "p2p")
ALGORITHMS = ("auto", "ring", "tree", "nvls")
US = 1e-6

# NCCL src/graph/tuning.cc (commit 5067397), ncclTunerConstantsDefaults, in microseconds.
BASE_LATENCY_US = {"tree": {"LL": 6.8, "LL128": 14.0, "Simple": 8.4},
                   "ring": {"LL": 6.6, "LL128": 14.0, "Simple": 8.4},
                   "nvls": {"Simple": 0.0}}
HOP_LATENCY_US = {"nvlink": {"tree": {"LL": 0.6, "LL128": 1.25, "Simple": 4.0},
                             "ring": {"LL": 0.6, "LL128": 1.9, "Simple": 3.4},
                             "nvls": {"Simple": 25.0}},
                  "net": {"tree": {"LL": 5.0, "LL128": 8.5, "Simple": 14.0},
                          "ring": {"LL": 2.7, "LL128": 4.0, "Simple": 14.0},
                          "nvls": {"Simple": 18.0}}}
# Bandwidth factors per protocol (same file, "Various model refinements").
RING_PROTOCOL_FACTOR = {"LL": 0.5, "LL128": 0.92, "Simple": 1.0}
TREE_FACTOR = 0.92
# ncclTopoGetAlgoTime: tree all-reduce bandwidth correction per protocol, index log2(bytes / 64),
# 64 B to 256 MiB (LL, LL128, Simple); and the multi-node ring/Simple all-reduce "plateau" x1.4 (sm80+).
TREE_CORRECTION = {
    "LL": (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0),
    "LL128": (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0),
    "Simple": (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9),
}
RING_PLATEAU = 1.4


@dataclass(frozen=True)
class Estimate:
    """Predicted time of one collective, with nccl-tests' bandwidth definitions.

    Attributes:
        op: one of :data:`OPS`.
        gpus, nodes: group size and the nodes it spans.
        nbytes: nccl-tests' size (bytes).
        time_s: seconds.
        algbw_bytes_per_s, busbw_bytes_per_s: ``nbytes / time_s`` and algbw x the bus factor.
        algorithm: ``ring``, ``tree``, ``nvls``, ``direct`` (p2p, all-to-all) or ``none`` (n = 1).
        protocol: NCCL protocol (``LL``, ``LL128``, ``Simple``) or ``-``.
        bottleneck: link class that bounds the bandwidth: ``nvlink`` or ``nic`` (``-`` if none).
    """

    op: str
    gpus: int
    nodes: int
    nbytes: float
    time_s: float
    algbw_bytes_per_s: float
    busbw_bytes_per_s: float
    algorithm: str
    protocol: str
    bottleneck: str


@dataclass(frozen=True)
class Group:
    """Where a collective's ranks sit: ``gpus`` ranks, ``per_node`` on each of ``nodes`` nodes."""

    gpus: int
    per_node: int
    nodes: int


def bus_factor(op: str, n: int) -> float:
    """nccl-tests' busbw / algbw ratio for ``op`` over ``n`` ranks (doc/PERFORMANCE.md)."""
    if op == "all-reduce":
        return 2 * (n - 1) / n
    if op in ("all-gather", "reduce-scatter", "all-to-all"):
        return (n - 1) / n
    return 1.0


def place(hw: HardwareProfile, gpus: int, gpus_per_node: int | None = None) -> Group:
    """Place ``gpus`` ranks, ``gpus_per_node`` (default: the node's GPUs) on each node.

    Raises:
        SimtrainError: ``gpus < 1``; more members per node than the node has GPUs; ``gpus`` not a
            multiple of the members per node when the group spans nodes; more nodes than the
            cluster (``inter_node.nodes``) has.
    """
    if gpus < 1:
        raise SimtrainError(f"--gpus = {gpus}: must be >= 1")
    per_node = hw.gpus_per_node if gpus_per_node is None else gpus_per_node
    if not 1 <= per_node <= hw.gpus_per_node:
        raise SimtrainError(f"--gpus-per-node = {per_node}: must be 1 to {hw.gpus_per_node} "
                            f"(GPUs in a node of '{hw.name}')")
    per_node = min(per_node, gpus)
    if gpus % per_node:
        raise SimtrainError(f"--gpus = {gpus}: must be a multiple of --gpus-per-node ({per_node}) "
                            "when the group spans nodes")
    nodes = gpus // per_node
    hw.check_nodes(nodes, f"--gpus = {gpus}", per_node)
    return Group(gpus, per_node, nodes)


def node_nic_bytes_per_s(hw: HardwareProfile, per_node: int) -> float:
    """Achieved inter-node bandwidth a node gives a group with ``per_node`` members on it.

    Each member drives the NICs nearest it (NCCL's channels use one NIC each), so the group gets
    ``nics x per_node / gpus_per_node`` NICs, at least one and at most all of them.
    """
    nics = max(1.0, min(hw.inter_node.nics_per_node, hw.inter_node.nics_per_node * per_node / hw.gpus_per_node))
    return nics * hw.inter_node.achieved_bandwidth_bytes_per_s


def ring_bus_bytes_per_s(hw: HardwareProfile, g: Group) -> tuple[float, str]:
    """Bus bandwidth of NCCL's rings over group ``g`` and the link class that bounds it."""
    options = []
    if g.per_node > 1:
        options.append((hw.intra_node.achieved_bandwidth_bytes_per_s, "nvlink"))
    if g.nodes > 1:
        options.append((node_nic_bytes_per_s(hw, g.per_node), "nic"))
    return min(options)


def _steps(op: str, n: int) -> int:
    return 2 * (n - 1) if op == "all-reduce" else n - 1 if op in ("all-gather", "reduce-scatter") else n


def _ring(op: str, nbytes: float, hw: HardwareProfile, g: Group) -> list[tuple[float, str, str, str]]:
    bus, limit = ring_bus_bytes_per_s(hw, g)
    steps = _steps(op, g.gpus)
    inter = 0 if g.nodes == 1 else (2 * (g.nodes - 1) if op == "all-reduce" else g.nodes - 1)
    out = []
    for proto, factor in RING_PROTOCOL_FACTOR.items():
        intra_lat = HOP_LATENCY_US["nvlink"]["ring"][proto]
        lat = BASE_LATENCY_US["ring"][proto] + (steps - inter) * intra_lat + inter * HOP_LATENCY_US["net"]["ring"][proto]
        if proto == "Simple" and op == "all-reduce" and g.nodes > 1:
            lat *= RING_PLATEAU
        algbw = bus * factor / bus_factor(op, g.gpus)
        out.append((lat * US + nbytes / algbw, "ring", proto, limit))
    return out


def _tree(nbytes: float, hw: HardwareProfile, g: Group) -> list[tuple[float, str, str, str]]:
    bus, limit = ring_bus_bytes_per_s(hw, g)
    factors = {"LL": 1 / 3.8, "LL128": 7 / 9 if g.nodes == 1 else 120 / 128, "Simple": 1.0}
    size_index = int(math.log2(max(nbytes, 64) / 64))
    out = []
    for proto, factor in factors.items():
        table = TREE_CORRECTION[proto]
        factor *= TREE_FACTOR * (table[size_index] if size_index < len(table) else 1.0)
        lat = BASE_LATENCY_US["tree"][proto] + 2 * (
            (g.per_node - 1) * HOP_LATENCY_US["nvlink"]["tree"][proto]
            + math.log2(g.nodes) * HOP_LATENCY_US["net"]["tree"][proto])
        out.append((lat * US + nbytes / (0.5 * bus * factor), "tree", proto, limit))
    return out


def _nvls(op: str, nbytes: float, hw: HardwareProfile, g: Group) -> list[tuple[float, str, str, str]]:
    bw = hw.intra_node.achieved_bandwidth_bytes_per_s * hw.intra_node.nvls_efficiency
    moved = nbytes * (1 + 1 / g.gpus) if op == "all-reduce" else nbytes
    lat = BASE_LATENCY_US["nvls"]["Simple"] + HOP_LATENCY_US["nvlink"]["nvls"]["Simple"]
    return [(lat * US + moved / bw, "nvls", "Simple", "nvlink")]


def _direct(op: str, nbytes: float, hw: HardwareProfile, g: Group) -> tuple[float, str, str, str]:
    """p2p (one message to the next rank) or all-to-all (``nbytes / n`` to every peer)."""
    intra, inter = hw.intra_node, hw.inter_node
    nic_share = node_nic_bytes_per_s(hw, g.per_node) / g.per_node
    if op == "p2p":
        if g.nodes == 1:
            bw = intra.peer_bandwidth_bytes_per_s * intra.achieved_bandwidth_bytes_per_s / intra.bandwidth_bytes_per_s
            return intra.latency_s + nbytes / bw, "direct", "-", "nvlink"
        return inter.latency_s + nbytes / nic_share, "direct", "-", "nic"
    n = g.gpus
    t_nvl = nbytes * (g.per_node - 1) / n / intra.achieved_bandwidth_bytes_per_s
    t_nic = nbytes * (n - g.per_node) / n / (nic_share * inter.a2a_efficiency / inter.collective_efficiency)
    lat = inter.latency_s if g.nodes > 1 else intra.latency_s
    return lat + max(t_nvl, t_nic), "direct", "-", "nic" if t_nic >= t_nvl else "nvlink"


def check_algorithm(op: str, algorithm: str, hw: HardwareProfile, g: Group) -> None:
    """Reject an algorithm that ``op`` or the hardware lacks.

    Raises:
        SimtrainError: unknown op or algorithm; ``tree`` for anything but all-reduce; ``nvls``
            on a fabric without NVLink SHARP, across nodes, or for broadcast/p2p/all-to-all;
            ``ring``/``tree``/``nvls`` for p2p or all-to-all.
    """
    if op not in OPS:
        raise SimtrainError(f"collective '{op}': choose one of {', '.join(OPS)}")
    if algorithm not in ALGORITHMS:
        raise SimtrainError(f"--algorithm = {algorithm!r}: choose one of {', '.join(ALGORITHMS)}")
    if algorithm == "auto":
        return
    if op in ("p2p", "all-to-all"):
        raise SimtrainError(f"--algorithm {algorithm}: {op} has no algorithm choice in NCCL; use auto")
    if algorithm == "tree" and op != "all-reduce":
        raise SimtrainError(f"--algorithm tree: NCCL's tree runs only all-reduce, not {op}")
    if algorithm == "nvls":
        if hw.intra_node.nvls_efficiency is None:
            raise SimtrainError(f"--algorithm nvls: hardware '{hw.name}' has no NVLink SHARP "
                                "(intra_node.nvls_efficiency is not set; NCCL needs NVSwitch and sm90+)")
        if op not in ("all-reduce", "all-gather", "reduce-scatter"):
            raise SimtrainError(f"--algorithm nvls: NVLS runs all-reduce, all-gather and reduce-scatter, not {op}")
        if g.nodes > 1:
            raise SimtrainError(f"--algorithm nvls: the group spans {g.nodes} nodes; simtrain models NVLS "
                                "inside one node only (NVLS-Tree is not modelled)")


def estimate(op: str, nbytes: float, hw: HardwareProfile, gpus: int, gpus_per_node: int | None = None,
             algorithm: str = "auto") -> Estimate:
    """Time of one NCCL collective of nccl-tests size ``nbytes`` over ``gpus`` ranks.

    Args:
        op: one of :data:`OPS`.
        nbytes: nccl-tests' size in bytes (all-reduce/broadcast/p2p: the buffer; all-gather: the
            gathered output; reduce-scatter: the input; all-to-all: each rank's send buffer).
        hw: the hardware profile (achieved link bandwidths, NVLS availability).
        gpus: ranks in the group.
        gpus_per_node: ranks per node (default the node's GPUs).
        algorithm: ``auto`` (NCCL's choice: cheapest of those the hardware has), ``ring``,
            ``tree`` or ``nvls``.

    Returns:
        The :class:`Estimate` (time 0 and bandwidths 0 for one rank or an empty buffer).

    Raises:
        SimtrainError: bad group (see :func:`place`), op or algorithm (see :func:`check_algorithm`),
            or a negative size.
    """
    return estimate_group(op, nbytes, hw, place(hw, gpus, gpus_per_node), algorithm)


def estimate_group(op: str, nbytes: float, hw: HardwareProfile, g: Group, algorithm: str = "auto") -> Estimate:
    """:func:`estimate` for an already placed group ``g`` (e.g. one of a training job's groups).

    Raises:
        SimtrainError: as :func:`check_algorithm`, or a negative size.
    """
    check_algorithm(op, algorithm, hw, g)
    if not nbytes >= 0:
        raise SimtrainError(f"size = {nbytes!r}: must be >= 0 bytes")
    if g.gpus == 1 or nbytes == 0:
        return Estimate(op, g.gpus, g.nodes, nbytes, 0.0, 0.0, 0.0, "none", "-", "-")
    if op in ("p2p", "all-to-all"):
        options = [_direct(op, nbytes, hw, g)]
    else:
        options = []
        if algorithm in ("auto", "ring"):
            options += _ring(op, nbytes, hw, g)
        if op == "all-reduce" and algorithm in ("auto", "tree"):
            options += _tree(nbytes, hw, g)
        nvls_ok = hw.intra_node.nvls_efficiency is not None and g.nodes == 1 and op != "broadcast"
        if algorithm == "nvls" or (algorithm == "auto" and nvls_ok):
            options += _nvls(op, nbytes, hw, g)
    time_s, algo, proto, limit = min(options)
    algbw = nbytes / time_s
    return Estimate(op, g.gpus, g.nodes, nbytes, time_s, algbw, algbw * bus_factor(op, g.gpus), algo, proto, limit)
