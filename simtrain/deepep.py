"""MoE dispatch and combine priced the way DeepEP runs them (deepseek-ai/DeepEP).

**Normal kernels** (training, prefill; DeepEP README "Normal kernels with NVLink and RDMA
forwarding", ``csrc/kernels/internode.cu``): a token bound for experts on another node crosses
the network once per target node, to the GPU with the *same local index* there, which forwards it
over NVLink to every GPU of that node that holds one of its experts; combine runs the same path
backwards (NVLink reduction to the forwarder, then RDMA home). Inside one node (``ep <=
gpus_per_node``) tokens go straight over NVLink. Dispatch moves FP8 tokens with one FP32 scale per
128 channels (DeepSeek-V3 report §3.3, 1x128 tiles) or BF16; combine moves BF16.

**Low-latency kernels** (decoding): pure RDMA, every (token, expert) pair sent on its own
(DeepEP README "Low-latency kernels with pure RDMA").

Routing (**node-limited**, DeepSeek-V3 §2.1.2 and DeepEP's tests): every token picks ``node_limit``
nodes, then its ``topk`` experts among the experts of those nodes; scores i.i.d., so both picks are
uniform. Expectations per token follow from the hypergeometric law: a GPU (node) is hit unless all
``topk`` experts miss its experts.

Time is the slowest link: ``max(NIC bytes / NIC rate, NVLink bytes / NVLink rate)`` plus one link
latency; the bottleneck is named. The bandwidths are reported as DeepEP's tests count them
(``tests/test_internode.py``; DeepEP#51, #285): RDMA bytes = tokens x nodes reached (the own node
included) x token bytes; NVLink bytes = tokens received by the GPU x token bytes.

Rates: NVLink and the NIC at their achieved bandwidth (``Link.achieved_bandwidth_bytes_per_s``).
The NVLink forwarding leg of the internode kernels does not reach the NVLink rate: with DeepEP's
default 24 SMs it tops out at :data:`FORWARD_CEILING_BYTES_PER_S`, the median of third-party
``test_internode.py`` measurements on two nodes (DeepEP#51, H800: 141.1 GB/s NVL; DeepEP#493, H200:
145.2 combine, 133.8 BF16 dispatch, 124.9 FP8 dispatch). On H200 (450 GB/s NVLink) the same ceiling
appears, so it is the kernel's, not the link's (DeepEP#285: "NVLink the bottleneck" at EP16 on
H800). These are kernel-level measurements by other users, not DeepEP's README table (R4); the
H800 one was taken on the same hardware with the same script.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from math import comb

from .errors import SimtrainError
from .hardware import GB, HardwareProfile

FORWARD_CEILING_BYTES_PER_S = statistics.median([141.14, 145.16, 133.78, 124.92]) * GB
FP8_SCALE_BLOCK = 128
"""Channels per FP32 scale in FP8 dispatch (1x128 activation tiles)."""


@dataclass(frozen=True)
class Routing:
    """Expected traffic of one GPU's ``tokens`` under node-limited top-k routing.

    Attributes:
        nodes: nodes the EP group spans.
        nodes_per_token: nodes a token reaches, its own included (DeepEP's RDMA count).
        remote_nodes_per_token: nodes other than its own a token reaches (network sends).
        gpus_per_token: GPUs a token reaches (= tokens a GPU receives per token it sends).
    """

    nodes: int
    nodes_per_token: float
    remote_nodes_per_token: float
    gpus_per_token: float


def _miss(pool: int, held: int, k: int) -> float:
    """Probability that ``k`` distinct experts drawn from ``pool`` all avoid ``held`` of them."""
    return comb(pool - held, k) / comb(pool, k)


def routing(ep: int, gpus_per_node: int, experts: int, topk: int, node_limit: int | None) -> Routing:
    """Expected per-token fan-out of uniform node-limited routing (see the module docstring).

    Raises:
        SimtrainError: experts not a multiple of ep, topk out of range, node limit out of range.
    """
    g = min(ep, gpus_per_node)
    if ep % g:
        raise SimtrainError(f"--ep = {ep}: must fill whole nodes of {gpus_per_node} GPUs when it spans nodes")
    nodes = ep // g
    if experts % ep:
        raise SimtrainError(f"--experts = {experts}: must be a multiple of --ep ({ep})")
    limit = nodes if node_limit is None else node_limit
    if not 1 <= limit:
        raise SimtrainError(f"--node-limit = {node_limit}: must be >= 1")
    limit = min(limit, nodes)
    pool = experts // nodes * limit
    if not 1 <= topk <= pool:
        raise SimtrainError(f"--topk = {topk}: must be 1 to {pool} (experts on the {limit} node(s) a token may use)")
    picked = limit / nodes
    node_hit = picked * (1 - _miss(pool, experts // nodes, topk))
    gpu_hit = picked * (1 - _miss(pool, experts // ep, topk))
    return Routing(nodes, nodes * node_hit, (nodes - 1) * node_hit, ep * gpu_hit)


def token_bytes(hidden: int, dtype: str) -> float:
    """Bytes of one token: BF16 ``2 h``; FP8 ``h`` plus one FP32 scale per 128 channels.

    Raises:
        SimtrainError: dtype other than bf16 or fp8.
    """
    if dtype == "bf16":
        return 2.0 * hidden
    if dtype == "fp8":
        return hidden + 4.0 * -(-hidden // FP8_SCALE_BLOCK)
    raise SimtrainError(f"--dispatch-dtype = {dtype!r}: choose bf16 or fp8")


@dataclass(frozen=True)
class EpEstimate:
    """Predicted dispatch or combine of one GPU's tokens.

    Attributes:
        op: ``dispatch`` or ``combine``; ep: group size; kernel: ``normal`` or ``low-latency``.
        time_s: seconds.
        bottleneck: ``nvlink`` or ``rdma``.
        nvlink_bytes_per_s, rdma_bytes_per_s: bandwidths as DeepEP's tests report them
            (0 where the kernel uses no such link).
        nic_bytes, nvlink_bytes: bytes the GPU's NIC share and its NVLink port carry.
    """

    op: str
    ep: int
    kernel: str
    time_s: float
    bottleneck: str
    nvlink_bytes_per_s: float
    rdma_bytes_per_s: float
    nic_bytes: float
    nvlink_bytes: float


def estimate_ep(op: str, hw: HardwareProfile, ep: int, tokens: int, hidden: int, topk: int,
                dispatch_dtype: str = "fp8", node_limit: int | None = None, experts: int = 256,
                low_latency: bool = False) -> EpEstimate:
    """Time of DeepEP's dispatch or combine of ``tokens`` tokens per GPU over ``ep`` GPUs.

    Args:
        op: ``dispatch`` or ``combine``.
        hw: hardware profile (achieved NVLink and NIC rates, GPUs per node).
        ep: expert-parallel group size; tokens, hidden, topk: per-GPU batch, model width, experts
            per token; dispatch_dtype: ``fp8`` or ``bf16`` (combine is always BF16);
            node_limit: nodes a token may use (None: all); experts: routed experts in total
            (default 256, DeepSeek-V3); low_latency: DeepEP's pure-RDMA kernels.

    Returns:
        The :class:`EpEstimate`.

    Raises:
        SimtrainError: a non-positive size, a group larger than the cluster, or bad routing.
    """
    if op not in ("dispatch", "combine"):
        raise SimtrainError(f"collective '{op}': choose dispatch or combine")
    for flag, v in (("--ep", ep), ("--tokens", tokens), ("--hidden", hidden), ("--topk", topk), ("--experts", experts)):
        if v < 1:
            raise SimtrainError(f"{flag} = {v}: must be >= 1")
    r = routing(ep, hw.gpus_per_node, experts, topk, node_limit)
    hw.check_nodes(r.nodes, f"--ep = {ep}")
    b = token_bytes(hidden, dispatch_dtype if op == "dispatch" else "bf16")
    nvl_rate = hw.intra_node.achieved_bandwidth_bytes_per_s
    nic_rate = hw.inter_node.achieved_bandwidth_bytes_per_s * min(1.0, hw.inter_node.nics_per_node / hw.gpus_per_node)
    if low_latency:
        nic_bytes = tokens * min(topk, ep) * b
        t = hw.inter_node.latency_s + nic_bytes / nic_rate
        return EpEstimate(op, ep, "low-latency", t, "rdma", 0.0, nic_bytes / t, nic_bytes, 0.0)
    nvl_bytes = tokens * r.gpus_per_token * b
    if r.nodes == 1:
        t = hw.intra_node.latency_s + nvl_bytes / nvl_rate
        return EpEstimate(op, ep, "normal", t, "nvlink", nvl_bytes / t, 0.0, 0.0, nvl_bytes)
    nic_bytes = tokens * r.remote_nodes_per_token * b
    t_nic = nic_bytes / nic_rate
    t_nvl = nvl_bytes / min(nvl_rate, FORWARD_CEILING_BYTES_PER_S)
    t = hw.inter_node.latency_s + max(t_nic, t_nvl)
    rdma_counted = tokens * r.nodes_per_token * b
    return EpEstimate(op, ep, "normal", t, "rdma" if t_nic >= t_nvl else "nvlink", nvl_bytes / t,
                      rdma_counted / t, nic_bytes, nvl_bytes)
