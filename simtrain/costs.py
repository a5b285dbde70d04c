"""Cost model: seconds, FLOPs and bytes of each pipeline stage (model chunk) for one microbatch.

Everything here is per microbatch (``b`` sequences of ``s`` tokens) and per GPU of a TP group.

FLOPs (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters
Using Megatron-LM", §5.1 / Appendix; split into F, I, W as in Qi et al. 2024, "Zero Bubble
Pipeline Parallelism", Table 1): each linear layer of fan-in K and fan-out N costs ``2·K·N`` FLOPs
per token in the forward pass (F), the same again for the input gradient (I) and again for the
weight gradient (W). Attention scores (``Q·Kᵀ`` and ``softmax·V``) cost ``2·s·d`` FLOPs per token
each in F, twice that in I, and nothing in W (so for GPT: F = sbh(24h+4s), I = sbh(24h+8s),
W = sbh·24h, the Zero Bubble paper's Table 1). Durations divide each GEMM's FLOPs by the profile's
achieved FLOP/s for that linear layer's pass and shape, and attention's by the attention rate
(peak x efficiency unless calibrated). Calibrated profiles add memory-bound kernels (norms,
activation function, residual adds, the loss softmax, gradient accumulation over microbatches:
bytes moved / the measured bandwidth of their class) and scale every pass by the measured ratio of
a stage's actions inside real pipeline steps to the sum of their kernels (``layer_slowdown``: F; a
full backward B; and I and W as the runtime splits the backward, which may cost more than B).

Activation memory (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
Transformer Models", §4): the tensors each layer stores for its backward, counted element by
element so that GPT-3 reproduces the paper's ``sbh(34 + 5as/h)`` bytes per layer; divided by tp
under sequence parallelism. ``selective`` recomputation drops the ``5as/h`` attention-score term,
``full`` stores only the layer input (``2sbh``). Memory that W still needs after I (Zero Bubble
Table 1, ``M_W`` = 32sbh for GPT): the input of every linear layer plus the gradient of its output.

Static memory per parameter (Rajbhandari et al. 2020, "ZeRO", §3.1): mixed-precision Adam keeps
a 16-bit parameter and gradient (2 + 2 bytes) and fp32 master weights, momentum and variance
(K = 12 bytes); ZeRO stage 1 divides the K bytes by the DP degree. In fp32 training the parameter
and gradient take 4 bytes each and the optimizer 8.

Tensor parallelism (Megatron-LM, Shoeybi et al. 2019; sequence parallelism, Korthikanti et al.
2022 §4.2.2) divides every weight matrix, FLOP and (with sequence parallelism) activation by tp
and adds, per layer, two all-gathers and two reduce-scatters of the ``s·b·h`` hidden states in F
and again in I (two all-reduces each without sequence parallelism).

Layers are split over stages as evenly as possible; when they do not divide evenly the extra
layers go to the middle stages first, since the first stage also holds the embedding and the last
the LM head and loss (the Llama 3 405B layout: 126 layers on 16 stages gives 7 layers to the first
and last stage and 8 to the others, Dubey et al. 2024 §3.3.2).

Expert parallelism (ep > 1) is modelled in :mod:`simtrain.moe`: routed experts sharded over EP
instead of TP, the all-to-all bytes, and each MoE chunk cut into segments around its MoE blocks
(``ChunkCost.moe``).
"""

from __future__ import annotations

import math

from dataclasses import dataclass, replace

from .errors import SimtrainError
from .hardware import HardwareProfile
from .models import ModelSpec
from .moe import MoEChunkCost, check_expert_parallel, chunk_cost, gpu_layer_params, imbalance_extra_s
from .network import Collective
from .parallel import ParallelConfig

OPTIMIZER_BYTES_PER_PARAM = 28
"""HBM bytes an Adam step reads and writes per parameter it updates (grad, master weight, m, v
read; master weight, m, v, 16-bit weight written): the step is memory-bound, at the HBM bandwidth
or a calibrated profile's measured optimizer rate (``compute.optimizer_gb_per_s``)."""


@dataclass(frozen=True)
class ChunkCost:
    """Costs of one model chunk (a pipeline stage) for one microbatch on one GPU.

    Attributes:
        chunk: model chunk index (0 = holds the embedding).
        layers: transformer layer indices in this chunk.
        has_embedding, has_head: whether it holds the input embedding / the LM head and loss.
        forward_s, backward_input_s, backward_weight_s: compute seconds of F, I and W
            (I includes recomputation when enabled); B = I + W.
        tp_forward, tp_backward: the tensor-parallel collectives F and I (or B) issue, declared,
            not priced (:meth:`simtrain.network.Topology.seconds` prices them).
        forward_flops, backward_input_flops, backward_weight_flops: model FLOPs on this GPU
            (no recomputation), for MFU.
        activation_bytes: bytes stored by F and held until the backward.
        weight_grad_bytes: bytes of that which W still needs after I (freed by W).
        p2p_bytes: bytes of the activation this chunk sends on (= the gradient it receives).
        params: parameters held by this GPU for this chunk.
        expert_params: how many of ``params`` are routed-expert parameters sharded over EP
            (reduced over the expert-data-parallel group; 0 when ep = 1).
        moe: the chunk cut around its MoE blocks (ep > 1 and at least one MoE layer), else None.
        full_backward_s: seconds of a full backward B when it differs from I + W (a runtime whose
            split backward costs more than a full one, see ``layer_slowdown``); None means I + W.
    """

    chunk: int
    layers: tuple[int, ...]
    has_embedding: bool
    has_head: bool
    forward_s: float
    backward_input_s: float
    backward_weight_s: float
    forward_flops: float
    backward_input_flops: float
    backward_weight_flops: float
    activation_bytes: float
    weight_grad_bytes: float
    p2p_bytes: float
    params: float
    expert_params: float = 0.0
    moe: MoEChunkCost | None = None
    full_backward_s: float | None = None
    tp_forward: tuple[Collective, ...] = ()
    tp_backward: tuple[Collective, ...] = ()

    @property
    def backward_s(self) -> float:
        """Full backward compute seconds: B = I + W (unless ``full_backward_s`` says otherwise)."""
        if self.full_backward_s is not None:
            return self.full_backward_s
        return self.backward_input_s + self.backward_weight_s

    @property
    def model_flops(self) -> float:
        """Model FLOPs of F + I + W for one microbatch on this GPU."""
        return self.forward_flops + self.backward_input_flops + self.backward_weight_flops


@dataclass(frozen=True)
class StageCosts:
    """Costs of every model chunk plus what is per parameter.

    Attributes:
        chunks: one :class:`ChunkCost` per model chunk, in model order.
        static_bytes_per_param: parameter + gradient + optimizer bytes per parameter held.
        grad_bytes_per_param: bytes per parameter of the gradient that DP reduces.
        optimizer_s_per_param: seconds of the optimizer step per parameter held.
        tokens_per_microbatch: b x s.
        fixed_op_times: True when durations were replaced by ``--op-times``.
        expert_static_bytes_per_param, expert_optimizer_s_per_param: the same for routed-expert
            parameters, whose optimizer states ZeRO-1 shards over the expert-DP group (None: as
            for the other parameters).
    """

    chunks: tuple[ChunkCost, ...]
    static_bytes_per_param: float
    grad_bytes_per_param: float
    optimizer_s_per_param: float
    tokens_per_microbatch: int
    fixed_op_times: bool = False
    expert_static_bytes_per_param: float | None = None
    expert_optimizer_s_per_param: float | None = None

    def _per_param(self, chunks, dense_rate: float, expert_rate: float | None) -> float:
        """Sum over ``chunks`` of dense parameters x ``dense_rate`` + routed-expert parameters x
        ``expert_rate`` (``dense_rate`` when None)."""
        expert_rate = dense_rate if expert_rate is None else expert_rate
        return sum((self.chunks[c].params - self.chunks[c].expert_params) * dense_rate
                   + self.chunks[c].expert_params * expert_rate for c in chunks)

    def static_bytes(self, chunks: set[int] | list[int]) -> float:
        """Parameter + gradient + optimizer bytes of the given chunks on one GPU."""
        return self._per_param(chunks, self.static_bytes_per_param, self.expert_static_bytes_per_param)

    def optimizer_s(self, chunks: set[int] | list[int]) -> float:
        """Seconds of the optimizer step for the given chunks on one GPU."""
        return self._per_param(chunks, self.optimizer_s_per_param, self.expert_optimizer_s_per_param)

    def with_op_times(self, forward_s: float, backward_input_s: float, backward_weight_s: float) -> StageCosts:
        """Copy with every chunk's F, I, W replaced by fixed seconds (TP and optimizer time 0).

        This is the papers' analysis setting: one action (one microbatch through one chunk) takes
        a fixed time, with no MoE sub-operations. Memory and message sizes keep coming from the
        model.

        Raises:
            SimtrainError: a time is negative, or all three are zero.
        """
        times = (forward_s, backward_input_s, backward_weight_s)
        if not all(math.isfinite(t) and t >= 0 for t in times) or sum(times) <= 0:
            raise SimtrainError(
                f"op-times F,I,W = {','.join(map(str, times))}: each must be a finite number >= 0 "
                "seconds and at least one > 0"
            )
        chunks = tuple(
            replace(
                c,
                forward_s=forward_s,
                backward_input_s=backward_input_s,
                backward_weight_s=backward_weight_s,
                tp_forward=(),
                tp_backward=(),
                moe=None,
                full_backward_s=None,
            )
            for c in self.chunks
        )
        return replace(self, chunks=chunks, optimizer_s_per_param=0.0, fixed_op_times=True)


# --------------------------------------------------------------------------- layer shapes
@dataclass(frozen=True)
class _LayerShape:
    """Per-token quantities of one layer on one GPU (already divided by tp)."""

    gemm_flops: float  # 2*K*N summed over linear layers, per token
    attn_flops: float  # attention-score FLOPs per token in F
    act_bytes: float  # stored activation bytes per token (recompute = none / selective)
    score_bytes: float  # attention-score bytes per token (dropped by selective recomputation)
    w_bytes: float  # bytes per token that W needs after I
    input_bytes: float  # layer input bytes per token (what full recomputation stores)
    ew_forward: dict[str, float]  # bytes per token memory-bound kernels move in F, per class
    ew_backward: dict[str, float]  # ... and in I (W runs GEMMs only)


def _linear_layers(model: ModelSpec, layer: int) -> list[tuple[int, int, float]]:
    """(fan_in, fan_out, tokens-multiplicity) of every linear layer a token passes in ``layer``."""
    h = model.hidden_size
    a = model.num_heads
    if model.mla is not None:
        m = model.mla
        gemms = [
            (h, m.q_lora_rank, 1.0),
            (m.q_lora_rank, a * (m.qk_nope_head_dim + m.qk_rope_head_dim), 1.0),
            (h, m.kv_lora_rank + m.qk_rope_head_dim, 1.0),
            (m.kv_lora_rank, a * (m.qk_nope_head_dim + m.v_head_dim), 1.0),
            (a * m.v_head_dim, h, 1.0),
        ]
    else:
        qkv = a * model.q_head_dim + model.kv_heads * (model.q_head_dim + model.v_head_dim)
        gemms = [(h, qkv, 1.0), (a * model.v_head_dim, h, 1.0)]

    def ffn(width: int, mult: float) -> list[tuple[int, int, float]]:
        if model.activation == "swiglu":
            return [(h, 2 * width, mult), (width, h, mult)]
        return [(h, width, mult), (width, h, mult)]

    if model.is_moe_layer(layer):
        moe = model.moe
        gemms.append((h, moe.num_experts, 1.0))  # router
        gemms += ffn(moe.expert_ffn_hidden_size, float(moe.top_k + moe.num_shared_experts))
    else:
        gemms += ffn(model.ffn_hidden_size, 1.0)
    return gemms


def _layer_shape(model: ModelSpec, layer: int, seq_len: int, tp: int, elem: int) -> _LayerShape:
    """Per-token FLOPs and bytes of ``layer`` on one of ``tp`` GPUs; ``elem`` = bytes/element."""
    h, a, s = model.hidden_size, model.num_heads, seq_len
    gemms = _linear_layers(model, layer)
    gemm_flops = sum(2 * k * n * mult for k, n, mult in gemms)
    attn_flops = 2 * s * a * model.q_head_dim + 2 * s * a * model.v_head_dim
    mask = 1 if model.dropout else 0  # dropout masks: 1 byte per element

    # Stored activations, Korthikanti et al. 2022 §4.1, element by element.
    norms = 2 * h * elem
    if model.mla is not None:
        m = model.mla
        attn = elem * (
            h  # input of the q/kv down-projections
            + 2 * m.q_lora_rank  # q latent before and after its norm
            + 2 * m.kv_lora_rank + m.qk_rope_head_dim  # kv latent before/after its norm, rope key
            + 2 * a * model.q_head_dim  # Q and K
            + 2 * a * model.v_head_dim  # V and the output-projection input
        )
    else:
        attn = elem * (
            h  # QKV input
            + a * model.q_head_dim  # Q
            + model.kv_heads * (model.q_head_dim + model.v_head_dim)  # K, V
            + a * model.v_head_dim  # output-projection input
        )
    attn += mask * h
    # softmax output (+ dropout mask and dropout output when training with dropout)
    scores = a * s * (2 * elem + 1 if model.dropout else elem)
    if model.is_moe_layer(layer):
        moe = model.moe
        f = moe.expert_ffn_hidden_size
        per_expert = (h + (3 * f if model.activation == "swiglu" else 2 * f)) * elem
        ffn = h * elem + (moe.top_k + moe.num_shared_experts) * per_expert + moe.top_k * h * elem
    else:
        f = model.ffn_hidden_size
        ffn = elem * (h + (3 * f if model.activation == "swiglu" else 2 * f))
    ffn += mask * h
    # What W needs after I: every linear layer's input and the gradient of its output.
    w_bytes = sum((k + n) * mult for k, n, mult in gemms) * elem
    # Memory-bound kernels (each reads its inputs and writes its output once), per class: two
    # norms (F: x -> y; backward: x, dy -> dx), the FFN activation (GeLU F: 1 + 1, backward:
    # 2 + 1; SwiGLU F: 2 + 1, backward: 3 + 2) over every token's expert widths, and two residual
    # adds (F: 2 reads, 1 write; backward: the two gradient branches summed).
    width = _ffn_width(model, layer)
    act_f, act_b = (3 * width, 5 * width) if model.activation == "swiglu" else (2 * width, 3 * width)
    return _LayerShape(
        gemm_flops=gemm_flops / tp,
        attn_flops=attn_flops / tp,
        act_bytes=(norms + attn + ffn) / tp,
        score_bytes=scores / tp,
        w_bytes=w_bytes / tp,
        input_bytes=h * elem / tp,
        ew_forward=dict(norm=4 * h * elem / tp, activation=act_f * elem / tp, add=6 * h * elem / tp),
        ew_backward=dict(norm=6 * h * elem / tp, activation=act_b * elem / tp, add=6 * h * elem / tp),
    )


def _elementwise_s(bytes_by_class: dict[str, float], hardware: HardwareProfile) -> float:
    """Seconds of memory-bound kernels moving ``bytes_by_class`` (0 for classes the profile lacks)."""
    rates = hardware.elementwise_bytes_per_s
    return sum(n / rates[k] for k, n in bytes_by_class.items() if k in rates)


def _ffn_width(model: ModelSpec, layer: int) -> float:
    """FFN intermediate elements one token passes through in ``layer`` (all its experts)."""
    if model.is_moe_layer(layer):
        moe = model.moe
        return moe.expert_ffn_hidden_size * (moe.top_k + moe.num_shared_experts)
    return model.ffn_hidden_size


def _gemm_seconds(
    gemms: list[tuple[int, int, float]], rows: float, tp: int, h: int, hardware: HardwareProfile, dtype: str
) -> tuple[float, float, float]:
    """Seconds of F, I and W of ``gemms`` (fan_in, fan_out, multiplicity) over ``rows`` tokens.

    Each linear layer ``Y = X Wᵀ`` of ``m`` tokens costs ``2·m·fan_in·fan_out`` FLOPs in each of
    F, I (``dX = dY W``) and W (``dW = dYᵀ X``), each at the profile's rate for that pass and shape
    (:meth:`HardwareProfile.linear_flops_per_s`). With tensor parallelism a layer whose fan-in is
    the hidden size is column-parallel (fan_out / tp), the others row-parallel (fan_in / tp)
    (Megatron-LM, Shoeybi et al. 2019 §3).
    """
    f = i = w = 0.0
    for k, n, mult in gemms:
        m = rows * mult
        k_, n_ = (k, n / tp) if k == h else (k / tp, n)
        flops = 2 * m * k_ * n_
        f += flops / hardware.linear_flops_per_s(m, k_, n_, "F", dtype)
        i += flops / hardware.linear_flops_per_s(m, k_, n_, "I", dtype)
        w += flops / hardware.linear_flops_per_s(m, k_, n_, "W", dtype)
    return f, i, w


def split_layers(num_layers: int, num_chunks: int) -> list[int]:
    """Layers per chunk: as even as possible, extra layers to the middle chunks first.

    Args:
        num_layers: transformer layers in the model.
        num_chunks: model chunks (pipeline stages).

    Returns:
        ``num_chunks`` counts summing to ``num_layers``.

    Raises:
        SimtrainError: more chunks than layers.
    """
    if num_chunks > num_layers:
        raise SimtrainError(
            f"{num_chunks} pipeline stages for a model of {num_layers} layers: "
            "each stage needs at least one layer (lower --pp, or --vp for interleaved schedules)"
        )
    base, extra = divmod(num_layers, num_chunks)
    counts = [base] * num_chunks
    middle = list(range(1, num_chunks - 1))
    order = middle + [0, num_chunks - 1] if num_chunks > 1 else [0]
    for i in order[:extra]:
        counts[i] += 1
    return counts


def stage_costs(
    model: ModelSpec,
    parallel: ParallelConfig,
    hardware: HardwareProfile,
    num_chunks: int,
) -> StageCosts:
    """Per-chunk costs of ``model`` cut into ``num_chunks`` pipeline stages.

    Args:
        model: the transformer.
        parallel: degrees, microbatch shape, dtype, recomputation, ZeRO stage.
        hardware: achieved FLOP/s and the TP link.
        num_chunks: model chunks (pp x vp, or pp for DualPipe whose 2·pp stages share chunks).

    Returns:
        A :class:`StageCosts` with ``num_chunks`` chunks.

    Raises:
        SimtrainError: more chunks than layers, tp that does not divide the heads, expert
            parallelism that cannot run (:func:`simtrain.moe.check_expert_parallel`), or a dtype
            the profile lacks.
    """
    tp = parallel.tp
    if model.num_heads % tp:
        raise SimtrainError(
            f"--tp {tp}: must divide the model's {model.num_heads} attention heads ({model.name})"
        )
    check_expert_parallel(model, parallel, hardware)
    s = parallel.seq_len or model.seq_len
    b = parallel.microbatch_size
    tokens = b * s
    elem = parallel.dtype_bytes
    dtype = parallel.dtype
    hardware.achieved_flops(dtype)  # an unknown dtype is an error even with calibrated tables
    slow = hardware.layer_slowdown
    slow_f, slow_b = slow.get("F", 1.0), slow.get("B", 1.0)
    slow_i, slow_w = slow.get("I", slow_b), slow.get("W", slow_b)
    weight_bytes = 2 if elem == 2 else 4  # 16-bit weights and gradients in mixed precision
    # gradient accumulation over microbatches: grad += new (2 reads, 1 write) after the first
    accumulate = (parallel.microbatches - 1) / parallel.microbatches * 3 * weight_bytes
    attn_f_rate = hardware.attention_flops_per_s(s, model.q_head_dim, dtype, backward=False)
    attn_b_rate = hardware.attention_flops_per_s(s, model.q_head_dim, dtype, backward=True)
    hidden_bytes = tokens * model.hidden_size * elem  # one full s*b*h tensor
    # per layer: 2 all-gathers + 2 reduce-scatters (as fast as each other) or 2 all-reduces
    tp_op, tp_per_layer = ("reduce-scatter", 4) if parallel.sequence_parallel else ("all-reduce", 2)
    act_div = tp if parallel.sequence_parallel else 1

    counts = split_layers(model.num_layers, num_chunks)
    chunks = []
    first = 0
    for c, n in enumerate(counts):
        layers = tuple(range(first, first + n))
        first += n
        has_emb, has_head = c == 0, c == num_chunks - 1
        gemm = attn = act = w = 0.0
        f_s = i_s = w_s = recompute_s = 0.0
        params = expert_params = 0.0
        layer_flops = []
        for layer in layers:
            ls = _layer_shape(model, layer, s, tp, elem)
            layer_flops.append((layer, ls.gemm_flops * tokens, ls.attn_flops * tokens))
            gemm += ls.gemm_flops * tokens
            attn += ls.attn_flops * tokens
            gf, gi, gw = _gemm_seconds(_linear_layers(model, layer), tokens, tp, model.hidden_size, hardware, dtype)
            attn_f = ls.attn_flops * tokens / attn_f_rate
            ew_f = _elementwise_s({k: v * tokens for k, v in ls.ew_forward.items()}, hardware)
            ew_b = _elementwise_s({k: v * tokens for k, v in ls.ew_backward.items()}, hardware)
            f_s += gf + attn_f + ew_f
            i_s += gi + 2 * ls.attn_flops * tokens / attn_b_rate + ew_b
            w_s += gw
            stored = ls.act_bytes + (ls.score_bytes if parallel.recompute == "none" else 0.0)
            if parallel.recompute == "full":
                act += ls.input_bytes * tokens
                recompute_s += gf + attn_f + ew_f
            else:
                act += stored * tokens
                if parallel.recompute == "selective":
                    recompute_s += attn_f
            w += ls.w_bytes * tokens
            layer_params, layer_experts = gpu_layer_params(model, layer, parallel)
            params += layer_params
            expert_params += layer_experts
        if not parallel.sequence_parallel and tp > 1:
            act *= tp / act_div  # activations replicated across the TP group
        if has_emb:
            params += model.embedding_params() / tp
        if has_head:
            h, v = model.hidden_size, model.vocab_size
            params += model.head_params() / tp
            if model.tied_embeddings and num_chunks > 1:
                params += v * h / tp  # the last stage keeps its own copy of the tied matrix
            gemm += 2 * h * v / tp * tokens
            gf, gi, gw = _gemm_seconds([(h, v, 1.0)], tokens, tp, h, hardware, dtype)
            # final norm (F 2h, backward 3h) and the fp32 softmax cross-entropy (F 2v, backward 3v)
            ew_f = _elementwise_s(dict(norm=tokens * 2 * h * elem / tp, activation=tokens * 2 * 4 * v / tp), hardware)
            ew_b = _elementwise_s(dict(norm=tokens * 3 * h * elem / tp, activation=tokens * 3 * 4 * v / tp), hardware)
            f_s, i_s, w_s = f_s + gf + ew_f, i_s + gi + ew_b, w_s + gw
            # norm and head input, fp32 logits for the loss (Korthikanti et al. 2022 §4.3)
            act += tokens * (2 * h * elem / tp + 4 * v / tp)
            w += tokens * (h + v / tp) * elem
        w_s += _elementwise_s(dict(add=accumulate * params), hardware)
        f_flops = gemm + attn
        i_flops = gemm + 2 * attn
        w_flops = gemm
        tp_f = Collective(tp_op, "tp", hidden_bytes, repeat=tp_per_layer * len(layers))
        tp_b = replace(tp_f, repeat=tp_f.repeat * (2 if parallel.recompute == "full" else 1))
        head_flops = 2 * model.hidden_size * model.vocab_size / tp * tokens if has_head else 0.0
        moe = chunk_cost(model, parallel, hardware, layer_flops, head_flops)
        extra_f, extra_i, extra_w = imbalance_extra_s(moe, parallel.expert_imbalance)
        chunks.append(
            ChunkCost(
                chunk=c,
                layers=layers,
                has_embedding=has_emb,
                has_head=has_head,
                forward_s=f_s * slow_f + extra_f,
                backward_input_s=(i_s + recompute_s) * slow_i + extra_i,
                backward_weight_s=w_s * slow_w + extra_w,
                forward_flops=f_flops,
                backward_input_flops=i_flops,
                backward_weight_flops=w_flops,
                activation_bytes=act,
                weight_grad_bytes=w,
                p2p_bytes=hidden_bytes / (tp if parallel.sequence_parallel else 1),
                params=params,
                expert_params=expert_params,
                moe=moe,
                full_backward_s=(i_s + recompute_s + w_s) * slow_b if (slow_i, slow_w) != (slow_b, slow_b) else None,
                tp_forward=(tp_f,) if tp > 1 and layers else (),
                tp_backward=(tp_b,) if tp > 1 and layers else (),
            )
        )

    optimizer_bytes = 12 if elem == 2 else 8
    optimizer_rate = hardware.optimizer_bytes_per_s or hardware.hbm_bandwidth_bytes_per_s
    shard = parallel.dp if parallel.zero_stage >= 1 else 1
    expert_shard = parallel.dp * tp // parallel.ep if parallel.zero_stage >= 1 else 1
    return StageCosts(
        chunks=tuple(chunks),
        static_bytes_per_param=2 * weight_bytes + optimizer_bytes / shard,
        grad_bytes_per_param=weight_bytes,
        optimizer_s_per_param=OPTIMIZER_BYTES_PER_PARAM / shard / optimizer_rate,
        tokens_per_microbatch=tokens,
        expert_static_bytes_per_param=2 * weight_bytes + optimizer_bytes / expert_shard,
        expert_optimizer_s_per_param=OPTIMIZER_BYTES_PER_PARAM / expert_shard / optimizer_rate,
    )
