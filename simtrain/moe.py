"""Mixture-of-Experts with expert parallelism (EP): the per-layer costs of routed experts and of the
dispatch / combine all-to-all, and how an MoE stage's compute is cut around them.

Everything is per microbatch and per GPU, in SI units, for the *most loaded* rank of the EP group
(every rank waits for it inside the all-to-all).

**Placement.** EP groups are carved out of the ``dp x tp`` GPUs of a pipeline stage (Megatron-Core
``expert_model_parallel_size``; DeepSeek-V3 §3.1: PP 16 x DP 128 with EP 64 spanning 8 nodes): an
EP group is ``ep`` consecutive GPUs (:mod:`simtrain.parallel`), so it spans ``n`` nodes with ``g``
members on each. Each rank holds ``E / ep`` whole routed experts (no expert tensor parallelism);
attention, dense layers and shared experts stay tensor-parallel. Expert weights are replicated over
the ``dp x tp / ep`` GPUs of the expert-data-parallel group, which reduces their gradients and
(ZeRO-1) shards their optimizer states.

**Tokens.** A GPU routes ``T = b x s / tp`` tokens per layer (the sequence-parallel shard;
Megatron-Core requires sequence parallelism for MoE with TP) to ``k`` experts each.
Routing is uniform by default: each of the ``T x k`` token-expert pairs lands on any of the ``ep``
ranks with equal probability, so a rank sends and receives ``T x k`` pairs and its experts compute
on ``T x k`` tokens. ``expert_imbalance = f`` makes the simulated rank the most loaded one: its
expert compute and what it receives are ``f`` times the mean.

**All-to-all bytes** (the dispatch: ``T x k x h x bytes per element``, FP8 selectable as in
DeepSeek-V3 §3.3.2; the combine in the compute dtype, BF16). Of the ``k`` copies of a token:

* *direct* routing (default; Megatron-Core's all-to-all token dispatcher): ``k/ep`` stay on the
  GPU, ``k (g-1)/ep`` go over NVLink to the node's other members, ``k (ep-g)/ep`` over the NICs;
* *node-limited* routing (``node_limit = M``; DeepSeek-V3 §2.1.2 and §3.2.2): a token's experts
  are chosen among those of ``M`` of the ``n`` nodes (uniformly, so its own node is among them with
  probability ``M/n``); with ``e`` experts per node, its ``k`` experts fall on
  ``u = M (1 - C(Me - e, k) / C(Me, k))`` distinct nodes on average (:func:`expected_nodes`;
  DeepSeek-V3: 3.63 of at most 4). It crosses InfiniBand once per remote node (to the GPU of the
  same in-node index) and is forwarded over NVLink to the GPUs hosting its experts:
  ``u (n-1)/n`` copies over the NICs and ``k (g-1)/g`` over NVLink.

NVLink and the NICs carry their parts at the same time (the hierarchical all-to-all), each part
taking ``latency + bytes x f / (bandwidth x link efficiency)`` on the GPU's full per-direction
NVLink bandwidth or its share of the node's NICs (NCCL's all-to-all, ``ep_kernel nccl``, at the
profile's ``inter_node.alltoall_efficiency``); the all-to-all ends when both have.

**Sub-operations.** An MoE layer's forward is attention (with norms, router and shared experts),
then dispatch, the routed experts (Linear-1, activation, Linear-2), and combine; its backward is
the mirror: the gradient goes to the experts (an all-to-all like the dispatch, FP8 when the
dispatch is, DeepSeek-V3 §3.3.2), the experts' backward runs, the input gradient comes back (like
the combine), then attention's backward. :class:`Segment` cuts a model chunk accordingly: all
compute from one MoE block to the next, then the block.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from math import comb

from .errors import SimtrainError
from .hardware import HardwareProfile
from .models import ModelSpec
from .network import A2APart, Collective, Topology
from .parallel import DTYPE_BYTES, ParallelConfig, flag_name

DISPATCH_BYTES = {"bf16": 2, "fp8": 1}
"""Bytes per element of the dispatched activations."""


@dataclass(frozen=True)
class A2ACost:
    """One all-to-all of one MoE layer for one microbatch on the simulated GPU.

    Attributes:
        total_bytes: ``T x k x h x bytes per element``: every token-expert pair, local ones included.
        parts: the link classes that carry bytes (NVLink and/or the NICs), run concurrently,
            as :meth:`simtrain.network.Topology.all_to_all` prices them.
        collective: the declared all-to-all (None for hand-built costs).
    """

    total_bytes: float
    parts: tuple[A2APart, ...]
    collective: Collective | None = None

    @property
    def seconds(self) -> float:
        """Duration when both link classes run at once: the slower part."""
        return max((p.seconds() for p in self.parts), default=0.0)

    def link_bytes(self, link: str) -> float:
        """Bytes sent over ``link`` (0 if that link carries nothing)."""
        return sum(p.nbytes for p in self.parts if p.link == link)


@dataclass(frozen=True)
class MoEBlock:
    """The routed experts of one MoE layer and their two all-to-alls.

    Attributes:
        layer: 0-based layer index.
        expert_forward_s, expert_backward_input_s, expert_backward_weight_s: seconds of the local
            experts' GEMMs on the most loaded rank (under full recomputation the backward also
            replays ``expert_forward_s``, with its dispatch and combine).
        dispatch: tokens to the experts (in backward: output gradients to the experts).
        combine: expert outputs back to the tokens' ranks (in backward: input gradients back).
    """

    layer: int
    expert_forward_s: float
    expert_backward_input_s: float
    expert_backward_weight_s: float
    dispatch: A2ACost
    combine: A2ACost


@dataclass(frozen=True)
class Segment:
    """The compute of a chunk from one MoE block to the next, then that block (or none: the tail).

    Attributes:
        forward_s, backward_input_s, backward_weight_s: compute seconds of everything between
            the previous block and ``block`` (attention, norms, router, shared experts, dense
            layers, embedding, LM head). ``backward_input_s`` excludes the forward replay of full
            recomputation, which is ``recompute_s``.
        recompute_s: forward replay of this compute before its backward (full recomputation).
        block: the MoE block that follows, or None for the chunk's last segment.
    """

    forward_s: float
    backward_input_s: float
    backward_weight_s: float
    recompute_s: float
    block: MoEBlock | None


@dataclass(frozen=True)
class MoEChunkCost:
    """An MoE chunk cut into segments (forward order; the last one has no block).

    Attributes:
        segments: the segments; their seconds add up to the chunk's F, I and W.
        local_experts: routed experts per GPU (E / ep); waves partition them.
        full_recompute: whether backward replays each block's forward (dispatch, experts, combine).
        bound_fraction: per action kind F, I, B, the compute-bound share of the segments' and of
            the experts' seconds (:func:`simtrain.costs.ep_sms.bound_fractions`; 1: the flat model,
            every second GEMM-rated), which the SMs of overlapped EP kernels slow down.
    """

    segments: tuple[Segment, ...]
    local_experts: int
    full_recompute: bool
    bound_fraction: tuple[tuple[float, float], ...] = ((1.0, 1.0),) * 3

    @property
    def blocks(self) -> list[MoEBlock]:
        """The MoE blocks in layer order."""
        return [s.block for s in self.segments if s.block is not None]


# --------------------------------------------------------------------------- validation
def check_expert_parallel(model: ModelSpec, parallel: ParallelConfig, hardware: HardwareProfile,
                          name: Callable[[str, object], str] = flag_name) -> None:
    """Refuse expert-parallel settings that cannot run.

    Args:
        model, parallel, hardware: what runs where.
        name: how a message names a setting, from its field and value (default: the flag,
            ``--ep 4``; a scenario file's loader names the file's field instead).

    Raises:
        SimtrainError: ep > 1 on a dense model; ep not dividing dp x tp or the number of experts;
            an imbalance above ep; EP groups that sit differently on the nodes of different
            pipeline stages; ``ep_comm_sms`` not below the GPU's SMs
            (:func:`simtrain.costs.ep_sms.check_ep_sms`).
    """
    from .costs.ep_sms import check_ep_sms

    ep = parallel.ep
    if ep == 1:
        return
    if model.moe is None:
        raise SimtrainError(
            f"{name('ep', ep)}: model '{model.name}' is dense (no experts to shard); use {name('ep', 1)}"
        )
    if (parallel.dp * parallel.tp) % ep:
        raise SimtrainError(
            f"{name('ep', ep)}: must divide dp x tp = {parallel.dp} x {parallel.tp} = {parallel.dp * parallel.tp} "
            "(EP groups are carved out of the data- and tensor-parallel GPUs of a stage)"
        )
    if model.moe.num_experts % ep:
        raise SimtrainError(
            f"{name('ep', ep)}: must divide the {model.moe.num_experts} routed experts of '{model.name}'"
        )
    if parallel.expert_imbalance > ep:
        raise SimtrainError(
            f"{name('expert_imbalance', parallel.expert_imbalance)}: at most ep = {ep} (one rank receiving "
            "every token)"
        )
    check_ep_sms(hardware, parallel)
    topo = Topology(hardware, parallel)
    places = {topo.ep_placement(p) for p in range(parallel.pp)}
    if len(places) > 1:
        raise SimtrainError(
            f"{name('ep', ep)}: the EP groups of different pipeline stages sit differently on nodes of "
            f"{hardware.gpus_per_node} GPUs (dp x tp = {parallel.dp * parallel.tp}); choose dp x tp "
            "a multiple of the GPUs per node"
        )


def resolve_waves(model: ModelSpec, parallel: ParallelConfig, name: Callable[[str, object], str] = flag_name) -> int:
    """Waves per MoE layer for a ``+waved-ep`` schedule: ``--waves``, or min(4, local experts).

    Args:
        model, parallel: the model and its settings.
        name: how a message names a setting, from its field and value (default: the flag,
            ``--waves 8``; a scenario file's loader names the file's field, as for
            :func:`check_expert_parallel`).

    Raises:
        SimtrainError: ep = 1 (no all-to-all to overlap), or more waves than local experts.
    """
    if parallel.ep == 1 or model.moe is None:
        raise SimtrainError(
            "+waved-ep: needs an MoE model with expert parallelism (ep > 1); "
            f"got model '{model.name}' with {name('ep', parallel.ep)}"
        )
    local = model.moe.num_experts // parallel.ep
    if parallel.waves is None:
        return min(4, local)
    if parallel.waves > local:
        raise SimtrainError(
            f"{name('waves', parallel.waves)}: waves partition each rank's {local} local experts "
            f"({model.moe.num_experts} experts / ep {parallel.ep}); use {name('waves', local)} or fewer"
        )
    return parallel.waves


# --------------------------------------------------------------------------- bytes and params
def a2a_copies(top_k: int, ep: int, g: int, n: int, node_limit: int | None, experts_per_gpu: int = 1) -> dict[str, float]:
    """Copies of one token each link class carries in one all-to-all (see the module docstring).

    Args:
        top_k: experts per token (k).
        ep: EP group size.
        g: group members on the simulated GPU's node (itself included).
        n: nodes the group spans.
        node_limit: most nodes per token (M), or None for direct routing.
        experts_per_gpu: routed experts per GPU (for the node-limited count).

    Returns:
        ``{"local": ..., "nvlink": ..., "nic": ...}`` copies per token.
    """
    if node_limit is None or n == 1:
        return {"local": top_k / ep, "nvlink": top_k * (g - 1) / ep, "nic": top_k * (ep - g) / ep}
    u = expected_nodes(top_k, experts_per_gpu * g, n, node_limit)
    return {"local": top_k / g, "nvlink": top_k * (g - 1) / g, "nic": u * (n - 1) / n}


def expected_nodes(top_k: int, experts_per_node: int, nodes: int, node_limit: int) -> float:
    """Expected distinct nodes a token's ``top_k`` experts fall on when they are drawn uniformly,
    without replacement, from the experts of ``min(node_limit, nodes)`` nodes.

    Returns:
        ``m (1 - C(m e - e, k) / C(m e, k))`` with ``m = min(node_limit, nodes)``, ``e`` experts per
        node: each chosen node is missed with probability ``C(m e - e, k) / C(m e, k)``.
    """
    m = min(node_limit, nodes)
    pool = m * experts_per_node
    return m * (1 - comb(pool - experts_per_node, top_k) / comb(pool, top_k))


def a2a_cost(tokens: float, elem_bytes: int, model: ModelSpec, parallel: ParallelConfig,
             hardware: HardwareProfile) -> A2ACost:
    """One all-to-all of ``tokens`` tokens of ``elem_bytes``-byte elements on the simulated GPU.

    Returns:
        Its total bytes and per-link parts (imbalance applied to the times).
    """
    topo = Topology(hardware, parallel)
    g, n = topo.ep_placement(0)
    k, h = model.moe.top_k, model.hidden_size
    copies = a2a_copies(k, parallel.ep, g, n, parallel.node_limit, model.moe.num_experts // parallel.ep)
    collective = Collective(
        "all-to-all", "ep", tokens * k * h * elem_bytes,
        link_bytes=tuple((link, tokens * copies[link] * h * elem_bytes) for link in ("nvlink", "nic")),
        imbalance=parallel.expert_imbalance,
    )
    return A2ACost(total_bytes=collective.nbytes, parts=topo.all_to_all(collective), collective=collective)


def routed_params(model: ModelSpec, layer: int) -> int:
    """Parameters of the routed experts of ``layer`` (0 for a dense layer)."""
    if not model.is_moe_layer(layer):
        return 0
    return model.moe.num_experts * model.ffn_params(model.moe.expert_ffn_hidden_size)


def gpu_layer_params(model: ModelSpec, layer: int, parallel: ParallelConfig) -> tuple[float, float]:
    """Parameters of ``layer`` one GPU holds, and how many of them are routed-expert parameters.

    With ep > 1 the routed experts are sharded over EP (E / ep whole experts per GPU) and the rest
    over TP; with ep = 1 everything is sharded over TP.

    Returns:
        ``(params, expert_params)`` with ``expert_params`` included in ``params`` (0 when ep = 1).
    """
    total = model.layer_params(layer)
    if parallel.ep == 1 or not model.is_moe_layer(layer):
        return total / parallel.tp, 0.0
    experts = routed_params(model, layer) / parallel.ep
    return (total - routed_params(model, layer)) / parallel.tp + experts, experts


def routed_flops_per_token(model: ModelSpec) -> float:
    """Forward FLOPs of the routed experts per token: ``k x 2 x`` (fan-in x fan-out summed over
    an expert's linear layers; Narayanan et al. 2021 §5.1 counting)."""
    h, f = model.hidden_size, model.moe.expert_ffn_hidden_size
    per_expert = 3 * h * f if model.activation == "swiglu" else 2 * h * f
    return 2 * per_expert * model.moe.top_k


# --------------------------------------------------------------------------- chunk layout
def chunk_cost(
    model: ModelSpec,
    parallel: ParallelConfig,
    hardware: HardwareProfile,
    layer_flops: list[tuple[int, float, float]],
    head_flops: float,
) -> MoEChunkCost | None:
    """Cut one model chunk into segments around its MoE blocks.

    Args:
        model, parallel, hardware: as for :func:`simtrain.costs.stage_costs`.
        layer_flops: ``(layer, gemm_flops, attention_score_flops)`` of each layer of the chunk for
            one microbatch on one GPU (forward; counted as in :mod:`simtrain.costs`).
        head_flops: forward GEMM FLOPs of the LM head (0 if the chunk has none).

    Returns:
        The segments, or None when ep = 1 or the chunk has no MoE layer (then the chunk runs as
        one compute task per action). The segment seconds add up to the chunk's F, I and W of
        :mod:`simtrain.costs` plus, with imbalance, the extra expert time of the most loaded rank.
    """
    if parallel.ep == 1 or not any(model.is_moe_layer(layer) for layer, _, _ in layer_flops):
        return None
    rate = hardware.achieved_flops(parallel.dtype)
    tokens = parallel.microbatch_size * (parallel.seq_len or model.seq_len) / parallel.tp
    expert_flops = routed_flops_per_token(model) * tokens
    imb = parallel.expert_imbalance
    full = parallel.recompute == "full"
    elem = DTYPE_BYTES[parallel.dtype]
    dispatch = a2a_cost(tokens, DISPATCH_BYTES[parallel.dispatch_dtype], model, parallel, hardware)
    combine = a2a_cost(tokens, elem, model, parallel, hardware)

    segments = []
    f = i = w = r = 0.0  # compute FLOPs accumulated since the last block

    for layer, gemm, attn in layer_flops:
        moe = model.is_moe_layer(layer)
        pre = gemm - (expert_flops if moe else 0.0)
        f += pre + attn
        i += pre + 2 * attn + (attn if parallel.recompute == "selective" else 0.0)
        w += pre
        r += pre + attn if full else 0.0
        if moe:
            block = MoEBlock(
                layer=layer,
                expert_forward_s=expert_flops * imb / rate,
                expert_backward_input_s=expert_flops * imb / rate,
                expert_backward_weight_s=expert_flops * imb / rate,
                dispatch=dispatch,
                combine=combine,
            )
            segments.append(Segment(f / rate, i / rate, w / rate, r / rate, block))
            f = i = w = r = 0.0
    f, i, w = f + head_flops, i + head_flops, w + head_flops
    segments.append(Segment(f / rate, i / rate, w / rate, r / rate, None))
    return MoEChunkCost(tuple(segments), model.moe.num_experts // parallel.ep, full)


def imbalance_extra_s(moe: MoEChunkCost | None, imbalance: float) -> tuple[float, float, float]:
    """Extra F, I, W seconds of the most loaded rank's experts over a uniform load (0 if no MoE)."""
    if moe is None or imbalance == 1.0:
        return 0.0, 0.0, 0.0
    share = (imbalance - 1) / imbalance
    blocks = moe.blocks
    replay = moe.full_recompute
    return (
        share * sum(b.expert_forward_s for b in blocks),
        share * sum(b.expert_backward_input_s + (b.expert_forward_s if replay else 0.0) for b in blocks),
        share * sum(b.expert_backward_weight_s for b in blocks),
    )

