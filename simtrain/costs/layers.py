"""Per-token FLOPs, bytes and GEMM seconds of one transformer layer's operators on one GPU of a
TP group (formulas and sources: :mod:`simtrain.costs`)."""

from __future__ import annotations

from dataclasses import dataclass

from ..hardware import HardwareProfile
from ..models import ModelSpec
from .saved import applies as saved_applies, eager_layer_bytes


@dataclass(frozen=True)
class LayerShape:
    """Per-token quantities of one layer on one GPU (already divided by tp)."""

    gemm_flops: float  # 2*K*N summed over linear layers, per token
    attn_flops: float  # attention-score FLOPs per token in F
    act_bytes: float  # stored activation bytes per token (recompute = none / selective)
    score_bytes: float  # attention-score bytes per token, unfused attention (dropped by selective recomputation)
    lse_bytes: float  # FlashAttention's saved softmax log-sum-exp bytes per token (fp32 per head)
    w_bytes: float  # bytes per token that W needs after I
    w_out_bytes: float  # of w_bytes: the linear layers' output gradients
    input_bytes: float  # layer input bytes per token (what full recomputation stores)
    shared_bytes: float  # of act_bytes x tp: what every TP rank stores whole without sequence parallelism
    ew_forward: dict[str, float]  # bytes per token memory-bound kernels move in F, per class
    ew_backward: dict[str, float]  # ... and in I (W runs GEMMs only)
    # of act_bytes x tp, per operator: (bytes per token of that operator's stored outputs, of which
    # replicated on every TP rank without sequence parallelism): what recomputing it removes
    recomputable: dict[str, tuple[float, float]]


def linear_layers(model: ModelSpec, layer: int) -> list[tuple[int, int, float]]:
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


FP8_CACHE_BYTES = 1 + 4 / 128
"""Bytes per element of an activation cached in FP8 for a linear layer's backward: one E4M3 byte
plus one fp32 scale per 1 x 128 tile (DeepSeek-V3 report, arXiv:2412.19437, §3.3.1 fine-grained
quantization and §3.3.2 low-precision storage)."""


def layer_shape(model: ModelSpec, layer: int, seq_len: int, tp: int, elem: int,
                cache_elem: float | None = None, eager: bool = False) -> LayerShape:
    """Per-token FLOPs and bytes of ``layer`` on one of ``tp`` GPUs; ``elem`` = bytes/element.
    ``eager``: the stored activations are those autograd saves in an eager torchtitan block
    (:func:`simtrain.costs.saved.eager_layer_bytes`) where that count :func:`applies
    <simtrain.costs.saved.applies>` to the layer; else Korthikanti et al.'s fused count."""
    h, a, s = model.hidden_size, model.num_heads, seq_len
    gemms = linear_layers(model, layer)
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
    # What W needs after I: every linear layer's input and the gradient of its output. With an
    # FP8 cache (``cache_elem``) the saved inputs of the linear layers take cache_elem bytes
    # each, in the stored activations and in what W holds; output gradients stay in ``elem``.
    cache = elem if cache_elem is None else cache_elem
    inputs = sum(k * mult for k, _n, mult in gemms) - (h if model.mla is not None else 0)  # q/kv down share x
    w_bytes = sum(k * mult for k, _n, mult in gemms) * cache + sum(n * mult for _k, n, mult in gemms) * elem
    saved = (elem - cache) * inputs  # per token, what the FP8 cache saves in the stored activations
    w_out_bytes = sum(n * mult for _k, n, mult in gemms) * elem
    # Memory-bound kernels (each reads its inputs and writes its output once), per class: two
    # norms (F: x -> y; backward: x, dy -> dx), the FFN activation (GeLU F: 1 + 1, backward:
    # 2 + 1; SwiGLU F: 2 + 1, backward: 3 + 2) over every token's expert widths, and two residual
    # adds (F: 2 reads, 1 write; backward: the two gradient branches summed).
    # replicated without sequence parallelism: norm and first-GEMM inputs, dropout masks (§4.2.1)
    shared = norms + 2 * h * elem + 2 * mask * h
    if eager and saved_applies(model, layer):  # the eager block's saved tensors; norms as the shared part
        by_op = eager_layer_bytes(model, elem)
        shared = by_op["attention_norm"] + by_op["ffn_norm"]
        norms, attn, ffn = shared, by_op["attention"], by_op["ffn"]
    recomputable = _recomputable(model, layer, elem, cache, mask)
    width = _ffn_width(model, layer)
    act_f, act_b = (3 * width, 5 * width) if model.activation == "swiglu" else (2 * width, 3 * width)
    return LayerShape(
        gemm_flops=gemm_flops / tp,
        attn_flops=attn_flops / tp,
        act_bytes=(norms + attn + ffn - saved) / tp,
        score_bytes=scores / tp,
        lse_bytes=4 * a / tp,  # FlashAttention-2 (Dao 2023) Algorithm 1: L, one fp32 per query row and head
        w_bytes=w_bytes / tp,
        w_out_bytes=w_out_bytes / tp,
        input_bytes=h * elem / tp,
        shared_bytes=shared - (elem - cache) * 2 * h,  # the two first-GEMM inputs are cached too
        ew_forward=dict(norm=4 * h * elem / tp, activation=act_f * elem / tp, add=6 * h * elem / tp),
        ew_backward=dict(norm=6 * h * elem / tp, activation=act_b * elem / tp, add=6 * h * elem / tp),
        recomputable={} if eager and saved_applies(model, layer) else recomputable,
    )


def stored_bytes_per_token(ls: LayerShape, parallel, unfused: bool) -> float:
    """Bytes per token one GPU stores for a layer's backward at ``parallel.recompute`` ``none`` or
    ``selective``: ``ls.act_bytes``, the parts every TP rank keeps whole without sequence
    parallelism, and under ``none`` what attention's backward needs (the scores of ``unfused``
    attention, else FlashAttention's log-sum-exp).

    Args:
        ls: the layer's :class:`LayerShape` (already split over TP).
        parallel: a :class:`simtrain.parallel.ParallelConfig` (tp, sequence_parallel, recompute).
        unfused: whether the attention kernel materialises the scores.
    """
    replicated = 0.0 if parallel.sequence_parallel else 1.0 - 1.0 / parallel.tp
    kept = ls.score_bytes if unfused else ls.lse_bytes
    return ls.act_bytes + ls.shared_bytes * replicated + (kept if parallel.recompute == "none" else 0.0)


def _recomputable(model: ModelSpec, layer: int, elem: int, cache: float, mask: int) -> dict[str, tuple[float, float]]:
    """Per ``--recompute`` operator name: the bytes per token (whole, before the TP split) of the
    tensors in :func:`layer_shape`'s stored count that the operator outputs, and of them the part
    replicated on every TP rank without sequence parallelism. A backward that reruns an operator
    does not keep its outputs (DeepSeek-V3 report, arXiv:2412.19437, §3.2.3: recomputing every
    RMSNorm and the MLA up-projections eliminates "the need to persistently store their output
    activations"); its inputs stay stored (they are other operators' outputs or the layer's input).
    Linear-layer inputs count at the activation cache's ``cache`` bytes per element, the rest at
    ``elem``. Operators whose outputs the count does not store (the output projections, the FFN's
    down projection of a dense layer, residual adds, rotary, the router) are absent: rerunning
    them frees nothing."""
    h, a = model.hidden_size, model.num_heads
    up = 2 if model.activation == "swiglu" else 1  # FFN up-projection outputs per intermediate element
    out: dict[str, tuple[float, float]] = {"dropout": (2.0 * mask * h, 2.0 * mask * h)}
    norms = 2 * h  # the two layer norms' outputs: the first GEMMs' inputs
    if model.mla is not None:
        m = model.mla
        norms += m.q_lora_rank + m.kv_lora_rank  # the q and kv latents after their norms
        out["q_down"] = (float(m.q_lora_rank * elem), 0.0)
        out["kv_down"] = (float((m.kv_lora_rank + m.qk_rope_head_dim) * elem), 0.0)
        out["q_up"] = (float(a * model.q_head_dim * elem), 0.0)  # Q
        out["kv_up"] = (float(a * (model.q_head_dim + model.v_head_dim) * elem), 0.0)  # K and V
    else:
        out["qkv"] = (float((a * model.q_head_dim + model.kv_heads * (model.q_head_dim + model.v_head_dim)) * elem), 0.0)
    if model.is_moe_layer(layer):
        moe = model.moe
        f, shared, routed = moe.expert_ffn_hidden_size, moe.num_shared_experts, moe.top_k
        norms += shared * h  # the shared experts' inputs are the norm's output
        out["ffn_up"], out["activation"] = (shared * up * f * elem, 0.0), (shared * f * cache, 0.0)
        out["permute"] = (routed * h * cache, 0.0)  # the routed experts' input copies
        out["expert_up"], out["expert_activation"] = (routed * up * f * elem, 0.0), (routed * f * cache, 0.0)
        out["expert_down"] = (float(routed * h * elem), 0.0)  # kept for the combine's gate gradient
    else:
        f = model.ffn_hidden_size
        out["ffn_up"], out["activation"] = (up * f * elem, 0.0), (f * cache, 0.0)
    out["norm"] = (norms * cache, 2 * h * cache)
    return out


def elementwise_s(bytes_by_class: dict[str, float], hardware: HardwareProfile) -> float:
    """Seconds of memory-bound kernels moving ``bytes_by_class`` (0 for classes the profile lacks)."""
    rates = hardware.elementwise_bytes_per_s
    return sum(n / rates[k] for k, n in bytes_by_class.items() if k in rates)


def _ffn_width(model: ModelSpec, layer: int) -> float:
    """FFN intermediate elements one token passes through in ``layer`` (all its experts)."""
    if model.is_moe_layer(layer):
        moe = model.moe
        return moe.expert_ffn_hidden_size * (moe.top_k + moe.num_shared_experts)
    return model.ffn_hidden_size


def gemm_seconds(
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
