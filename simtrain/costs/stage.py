"""Stage costs: each model chunk's costs as the sum, in layer order, of named per-layer terms
(:class:`LayerTerms`, from the operators of :mod:`simtrain.costs.layers`), plus the embedding and
LM-head terms, the runtime's per-pass slowdown and the MoE segments of :mod:`simtrain.moe`.
Formulas and sources: :mod:`simtrain.costs`."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from ..errors import SimtrainError
from ..hardware import HardwareProfile
from ..models import ModelSpec
from ..moe import check_expert_parallel, chunk_cost, gpu_layer_params, imbalance_extra_s
from ..network import Collective, check_host_link
from ..parallel import ParallelConfig, flag_name
from ..schedules.ir import ScheduleWarning
from .context import check_context_parallel, cp_declaration
from .pipelining import StageBuffers, stage_buffers
from .saved import applies as saved_applies, eager_head_bytes
from .trainable import check_trainable, is_frozen, layer_adapter
from .layers import FP8_CACHE_BYTES, elementwise_s, gemm_seconds, layer_shape, linear_layers, stored_bytes_per_token
from .types import (OPTIMIZER_BYTES_PER_PARAM, ChunkCost, StageCosts, grad_accumulate_bytes_per_param,
                    static_parts_per_param)

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
            "each stage needs at least one layer (lower the pipeline degree pp, or the virtual stages vp of an "
            "interleaved schedule)"
        )
    base, extra = divmod(num_layers, num_chunks)
    counts = [base] * num_chunks
    middle = list(range(1, num_chunks - 1))
    order = middle + [0, num_chunks - 1] if num_chunks > 1 else [0]
    for i in order[:extra]:
        counts[i] += 1
    return counts


@dataclass(frozen=True)
class _Setting:
    """What every chunk of one ``stage_costs`` call shares (shapes, rates, the TP declaration)."""

    model: ModelSpec
    parallel: ParallelConfig
    hardware: HardwareProfile
    num_chunks: int
    seq_len: int
    tokens: int
    elem: int
    slow: dict[str, float]
    accumulate: float
    attn_f_rate: float
    attn_b_rate: float
    hidden_bytes: float
    tp_op: str
    tp_per_layer: int


@dataclass(frozen=True)
class LayerTerms:
    """One transformer layer's share of a chunk's costs for one microbatch on one GPU.

    Attributes:
        gemm_flops, attn_flops: forward GEMM and attention-score FLOPs.
        forward_s, backward_input_s, backward_weight_s: seconds of F, I (without recomputation)
            and W: GEMMs, attention and memory-bound kernels.
        attn_forward_s, attn_backward_s: the attention-score part of F and of I (seconds).
        recompute_s: seconds the backward replays (``full``: the whole forward; ``selective``: the
            attention scores; ``none``: 0).
        activation_bytes, weight_grad_bytes: stored by F; still needed by W after I.
        params, expert_params: parameters on this GPU, and how many are routed-expert ones.
        weight_gemm_flops: GEMM FLOPs of W (0 for frozen weights; LoRA adapters' only).
        frozen_params: how many of ``params`` are frozen (:mod:`simtrain.costs.trainable`).
        gemm_s: the linear GEMMs' seconds of F, I (with recomputation) and W.
    """

    gemm_flops: float
    attn_flops: float
    forward_s: float
    backward_input_s: float
    backward_weight_s: float
    recompute_s: float
    activation_bytes: float
    weight_grad_bytes: float
    params: float
    expert_params: float
    attn_forward_s: float = 0.0
    attn_backward_s: float = 0.0
    weight_gemm_flops: float = 0.0
    frozen_params: float = 0.0
    gemm_s: tuple[float, float, float] = (0.0, 0.0, 0.0)


def layer_terms(st: _Setting, layer: int) -> LayerTerms:
    """The :class:`LayerTerms` of ``layer``."""
    model, parallel, tokens = st.model, st.parallel, st.tokens
    tp = parallel.tp
    ls = layer_shape(model, layer, st.seq_len, tp, st.elem,
                     FP8_CACHE_BYTES if parallel.activation_cache == "fp8" else None, parallel.kernels == "eager")
    gf, gi, gw = gemm_seconds(linear_layers(model, layer), tokens, tp, model.hidden_size, st.hardware, parallel.dtype)
    attn_f = ls.attn_flops * tokens / st.attn_f_rate
    ew_f = elementwise_s({k: v * tokens for k, v in ls.ew_forward.items()}, st.hardware)
    ew_b = elementwise_s({k: v * tokens for k, v in ls.ew_backward.items()}, st.hardware)
    frozen, ad = is_frozen(parallel, layer), layer_adapter(model, layer, parallel, tokens, st.hardware)
    gf, gi = gf + ad.forward_s, gi + ad.backward_input_s
    gw = ad.backward_weight_s + (0.0 if frozen else gw)
    unfused = st.hardware.attention_kernel(parallel.attention) == "unfused"
    stored = stored_bytes_per_token(ls, parallel, unfused)
    if parallel.recompute == "full":
        act = ls.input_bytes * (1 if parallel.sequence_parallel else tp) * tokens
        recompute = gf + attn_f + ew_f
    else:
        act, recompute = stored * tokens + ad.activation_bytes, (attn_f if parallel.recompute == "selective" else 0.0)
    params, experts = gpu_layer_params(model, layer, parallel)
    attn_b = 2 * ls.attn_flops * tokens / st.attn_b_rate
    # what W holds after I: every linear layer's input and output gradient, or (torch's split
    # backward) the whole autograd graph, i.e. every activation the backward used, and those
    # output gradients (ParallelConfig.w_pending)
    held = (ls.w_bytes if parallel.w_pending == "gemm-io" else stored + ls.w_out_bytes) * tokens
    gemm = ls.gemm_flops * tokens
    return LayerTerms(
        gemm_flops=gemm + ad.flops, attn_flops=ls.attn_flops * tokens,
        forward_s=gf + attn_f + ew_f, backward_input_s=gi + attn_b + ew_b,
        backward_weight_s=gw, recompute_s=recompute, activation_bytes=act,
        weight_grad_bytes=0.0 if frozen and not ad.params else held,
        params=params + ad.params, expert_params=experts,
        attn_forward_s=attn_f, attn_backward_s=attn_b,
        weight_gemm_flops=ad.flops + (0.0 if frozen else gemm), frozen_params=params if frozen else 0.0,
        gemm_s=(gf, gi + (gf if parallel.recompute == "full" else 0.0), gw),
    )


@dataclass
class _Sums:
    """Running sums of a chunk's terms (added in layer order, then the head)."""

    gemm: float = 0.0
    attn: float = 0.0
    act: float = 0.0
    w: float = 0.0
    f_s: float = 0.0
    i_s: float = 0.0
    w_s: float = 0.0
    recompute_s: float = 0.0
    params: float = 0.0
    expert_params: float = 0.0
    attn_f_s: float = 0.0
    attn_b_s: float = 0.0
    w_gemm: float = 0.0
    frozen_params: float = 0.0
    gemm_s: tuple[float, float, float] = (0.0, 0.0, 0.0)
    layer_flops: list = field(default_factory=list)

    def add(self, layer: int, t: LayerTerms) -> None:
        """Add one layer's terms."""
        self.layer_flops.append((layer, t.gemm_flops, t.attn_flops))
        self.gemm += t.gemm_flops
        self.attn += t.attn_flops
        self.f_s += t.forward_s
        self.i_s += t.backward_input_s
        self.w_s += t.backward_weight_s
        self.act += t.activation_bytes
        self.recompute_s += t.recompute_s
        self.w += t.weight_grad_bytes
        self.params += t.params
        self.expert_params += t.expert_params
        self.w_gemm += t.weight_gemm_flops
        self.frozen_params += t.frozen_params
        self.attn_f_s += t.attn_forward_s
        self.attn_b_s += t.attn_backward_s
        self.gemm_s = tuple(a + b for a, b in zip(self.gemm_s, t.gemm_s))


def _add_head(sums: _Sums, st: _Setting, matrix: bool = True) -> None:
    """The LM head and loss: parameters (and the last stage's own copy of the input embedding when
    it needs one, :attr:`~simtrain.models.ModelSpec.last_stage_embedding`), the head GEMM, the
    final norm and the fp32 softmax cross-entropy (F 2v, backward 3v), and what they store: norm
    and head input, fp32 logits (Korthikanti et al. 2022 §4.3). Under LoRA the head is frozen: no
    W, no gradient (:mod:`simtrain.costs.trainable`). ``matrix=False``: an MTP module's shared
    head (:mod:`simtrain.costs.mtp`), whose only own parameters are its final norm's."""
    model, tokens, elem, tp, hw = st.model, st.tokens, st.elem, st.parallel.tp, st.hardware
    h, v = model.hidden_size, model.vocab_size
    frozen = st.parallel.lora_rank > 0
    copy = v * h / tp if model.last_stage_embedding and st.num_chunks > 1 else 0.0
    params = model.head_params() / tp + copy if matrix else model.norm_params(h) / tp
    sums.params += params
    sums.frozen_params += params if frozen else 0.0
    sums.gemm += 2 * h * v / tp * tokens
    sums.w_gemm += 0.0 if frozen else 2 * h * v / tp * tokens
    gf, gi, gw = gemm_seconds([(h, v, 1.0)], tokens, tp, h, hw, st.parallel.dtype)
    gw = 0.0 if frozen else gw
    ew_f = elementwise_s(dict(norm=tokens * 2 * h * elem / tp, activation=tokens * 2 * 4 * v / tp), hw)
    ew_b = elementwise_s(dict(norm=tokens * 3 * h * elem / tp, activation=tokens * 3 * 4 * v / tp), hw)
    sums.f_s, sums.i_s, sums.w_s = sums.f_s + gf + ew_f, sums.i_s + gi + ew_b, sums.w_s + gw
    # stored: norm and head inputs, fp32 logits; eager torchtitan: its final RMSNorm, the logits and
    # the loss's fp32 log-softmax (simtrain.costs.saved.eager_head_bytes), split over TP as the logits
    eager = st.parallel.kernels == "eager" and model.norm == "rmsnorm"
    kept = eager_head_bytes(model, elem) / tp if eager else 2 * h * elem / tp + 4 * v / tp
    sums.act += tokens * kept
    stored = tokens * kept if st.parallel.w_pending == "autograd" else tokens * h * elem
    sums.w += 0.0 if frozen else stored + tokens * v / tp * elem


def _add_mtp(sums: _Sums, st: _Setting) -> None:
    """The MTP modules' own operators on the last chunk (their Transformer blocks are layers of the
    chunk, :func:`stage_costs`): per module the RMSNorms of the hidden state and of the embedding,
    the projection of their concatenation (2h -> h) and the shared head (:func:`_add_head` without
    its matrix); formulas and sources: :mod:`simtrain.costs.mtp`. In the flat model's MoE segments
    (:func:`simtrain.moe.chunk_cost`) the projection joins the heads in the last segment (the
    per-operator model puts it before its block, :func:`simtrain.costs.moe_ops.moe_chunk`)."""
    model, tokens, elem, tp, par = st.model, st.tokens, st.elem, st.parallel.tp, st.parallel
    h, frozen = model.hidden_size, par.lora_rank > 0
    cache = FP8_CACHE_BYTES if par.activation_cache == "fp8" else elem
    proj = 2 * (2 * h) * h / tp * tokens
    gf, gi, gw = gemm_seconds([(2 * h, h, 1.0)], tokens, tp, h, st.hardware, par.dtype)
    ew_f = elementwise_s(dict(norm=tokens * 2 * 2 * h * elem / tp), st.hardware)
    ew_b = elementwise_s(dict(norm=tokens * 2 * 3 * h * elem / tp), st.hardware)
    for d in range(model.mtp_depth):
        params = (2 * model.norm_params(h) + 2 * h * h) / tp  # enorm, hnorm, projection (head norm: _add_head)
        sums.params += params
        sums.frozen_params += params if frozen else 0.0
        sums.gemm += proj
        sums.w_gemm += 0.0 if frozen else proj
        sums.f_s, sums.i_s = sums.f_s + gf + ew_f, sums.i_s + gi + ew_b
        sums.w_s += 0.0 if frozen else gw
        sums.act += tokens * (2 * h * elem + 2 * h * cache) / tp  # the norms' inputs, the projection's input
        sums.w += 0.0 if frozen else tokens * (2 * h * cache + h * elem) / tp  # its input, its output gradient
        _add_head(sums, st, matrix=False)


def _pp_buffers(st: _Setting, p2p: float, layers: tuple[int, ...], first: bool, last: bool) -> StageBuffers:
    """The pipeline runtime's buffers for one chunk (``ParallelConfig.pp_buffers``): none for
    ``per-transfer``; torch.distributed.pipelining's for ``per-microbatch``
    (:func:`simtrain.costs.pipelining.stage_buffers`). The chunk's first layer saves the received
    tensor itself unless it is an eager 16-bit block, which saves an fp32 copy of it."""
    par = st.parallel
    if par.pp_buffers == "per-transfer" or not layers:
        return StageBuffers()
    copies = par.kernels == "eager" and st.elem < 4 and saved_applies(st.model, layers[0])
    return stage_buffers(p2p, par.microbatches, first, last, par.recompute == "full" or not copies,
                         par.w_pending == "autograd")


def _chunk(st: _Setting, c: int, layers: tuple[int, ...]) -> ChunkCost:
    """The :class:`ChunkCost` of chunk ``c`` holding ``layers``."""
    model, parallel, tp = st.model, st.parallel, st.parallel.tp
    has_emb, has_head = c == 0, c == st.num_chunks - 1
    sums = _Sums()
    for layer in layers:
        sums.add(layer, layer_terms(st, layer))
    if has_emb:
        sums.params += model.embedding_params() / tp
        sums.frozen_params += model.embedding_params() / tp if parallel.lora_rank else 0.0
    if has_head:
        _add_head(sums, st)
        _add_mtp(sums, st)
    sums.w_s += elementwise_s(dict(add=st.accumulate * (sums.params - sums.frozen_params)), st.hardware)
    tp_f = Collective(st.tp_op, "tp", st.hidden_bytes, repeat=st.tp_per_layer * len(layers))
    tp_b = replace(tp_f, repeat=tp_f.repeat * (2 if parallel.recompute == "full" else 1))
    h, heads = model.hidden_size, 1 + model.mtp_depth  # the LM head, each MTP module's head and projection
    head_flops = heads * 2 * h * model.vocab_size / tp * st.tokens + model.mtp_depth * 4 * h * h / tp * st.tokens \
        if has_head else 0.0
    moe = chunk_cost(model, parallel, st.hardware, sums.layer_flops, head_flops)
    extra_f, extra_i, extra_w = imbalance_extra_s(moe, parallel.expert_imbalance)
    slow = st.slow
    slow_f, slow_b = slow.get("F", 1.0), slow.get("B", 1.0)
    slow_i, slow_w = slow.get("I", slow_b), slow.get("W", slow_b)
    split = (slow_i, slow_w) != (slow_b, slow_b)
    cp = cp_declaration(model, parallel, st.tokens, len(layers), sums.attn_f_s * slow_f, sums.attn_b_s * slow_i)
    p2p = st.hidden_bytes / (tp if parallel.sequence_parallel else 1)
    buf = _pp_buffers(st, p2p, layers, has_emb, has_head)
    return ChunkCost(
        chunk=c, layers=layers, has_embedding=has_emb, has_head=has_head,
        forward_s=sums.f_s * slow_f + extra_f,
        backward_input_s=(sums.i_s + sums.recompute_s) * slow_i + extra_i,
        backward_weight_s=sums.w_s * slow_w + extra_w,
        forward_flops=sums.gemm + sums.attn, backward_input_flops=sums.gemm + 2 * sums.attn,
        backward_weight_flops=sums.w_gemm, activation_bytes=sums.act + buf.activation_delta,
        weight_grad_bytes=sums.w + buf.held_delta, p2p_bytes=p2p, recv_buffer_bytes=buf.static,
        params=sums.params, expert_params=sums.expert_params, frozen_params=sums.frozen_params, moe=moe,
        full_backward_s=(sums.i_s + sums.recompute_s + sums.w_s) * slow_b if split else None,
        tp_forward=(tp_f,) if tp > 1 and layers else (), tp_backward=(tp_b,) if tp > 1 and layers else (),
        cp_forward=cp.forward, cp_backward=cp.backward,
        cp_hide_forward_s=cp.hide_forward_s, cp_hide_backward_s=cp.hide_backward_s,
        gemm_s=tuple(g * k for g, k in zip(sums.gemm_s, (slow_f, slow_i, slow_w))),
    )


def check_settings(model: ModelSpec, parallel: ParallelConfig, hardware: HardwareProfile,
                   name: Callable[[str, object], str] = flag_name) -> None:
    """Refuse parallel settings the model cannot be cut or run with: tp not dividing the
    attention heads (Megatron-LM shards whole heads), expert parallelism
    (:func:`simtrain.moe.check_expert_parallel`), context parallelism
    (:func:`~simtrain.costs.context.check_context_parallel`) and frozen weights / LoRA
    (:func:`~simtrain.costs.trainable.check_trainable`) and offload without a host link
    (:func:`simtrain.network.check_host_link`).

    Args:
        model, parallel, hardware: what runs where.
        name: how a message names a setting, from its field and value (default: the flag,
            ``--tp 3``; a scenario file's loader names the file's field,
            :func:`simtrain.cli.settings.setting_name`).

    Raises:
        SimtrainError: the first setting that cannot run, named by ``name``.
    """
    if model.num_heads % parallel.tp:
        raise SimtrainError(
            f"{name('tp', parallel.tp)}: must divide the model's {model.num_heads} attention heads ({model.name})"
        )
    check_expert_parallel(model, parallel, hardware, name)
    check_context_parallel(model, parallel, parallel.seq_len or model.seq_len, name)
    check_trainable(model, parallel, name)
    check_host_link(parallel, hardware, name)


def _warn_unrated(hardware: HardwareProfile, dtype: str) -> None:
    """Warn (:class:`ScheduleWarning`) when the profile has measured linear or attention rates, but
    none in ``dtype``: they are ignored, and this run's kernels take peak x ``efficiency.matmul``."""
    tables = (("compute.linear_tflops", {d for (d, _), rows in hardware.linear_rates.items() if rows}),
              ("compute.attention_tflops", {d for d, rows in hardware.attention_rates.items() if rows}))
    for field_name, dtypes in tables:
        if dtypes and dtype not in dtypes:
            where = hardware.path or hardware.name
            warnings.warn(f"{where}: {field_name} has rates for {', '.join(sorted(dtypes))} only, none for this "
                          f"{dtype} run: they are ignored, and its kernels run at peak_tflops.{dtype} x "
                          "efficiency.matmul", ScheduleWarning, stacklevel=3)


def stage_costs(
    model: ModelSpec,
    parallel: ParallelConfig,
    hardware: HardwareProfile,
    num_chunks: int,
) -> StageCosts:
    """Per-chunk costs of ``model`` cut into ``num_chunks`` pipeline stages; the last chunk also
    holds the MTP modules (``model.mtp_depth``; their blocks as layers ``num_layers + d``, after
    the main model's: DeepSeek-V3 §3.2.3 puts them with the output head, :mod:`simtrain.costs.mtp`).

    Args:
        model: the transformer.
        parallel: degrees, microbatch shape, dtype, recomputation, ZeRO stage.
        hardware: achieved FLOP/s and the TP link.
        num_chunks: model chunks (pp x vp, or pp for DualPipe whose 2·pp stages share chunks).

    Returns:
        A :class:`StageCosts` with ``num_chunks`` chunks.

    Raises:
        SimtrainError: more chunks than layers, settings that cannot run
            (:func:`check_settings`), or a dtype the profile lacks.
    """
    tp = parallel.tp
    check_settings(model, parallel, hardware)
    s = parallel.seq_len or model.seq_len
    tokens = parallel.microbatch_size * s // parallel.cp  # this GPU's share of the microbatch
    elem, dtype = parallel.dtype_bytes, parallel.dtype
    hardware.achieved_flops(dtype)  # an unknown dtype is an error even with calibrated tables
    _warn_unrated(hardware, dtype)
    weight_bytes = 2 if elem == 2 else 4  # 16-bit weights and gradients in mixed precision
    # per layer: 2 all-gathers + 2 reduce-scatters (as fast as each other) or 2 all-reduces
    tp_op, tp_per_layer = ("reduce-scatter", 4) if parallel.sequence_parallel else ("all-reduce", 2)
    st = _Setting(
        model, parallel, hardware, num_chunks, s, tokens, elem, hardware.layer_slowdown,
        accumulate=grad_accumulate_bytes_per_param(weight_bytes, parallel.grad_reduce_bytes, parallel.microbatches,
                                                   parallel.zero_stage),
        attn_f_rate=hardware.attention_flops_per_s(s, model.q_head_dim, dtype, backward=False),
        attn_b_rate=hardware.attention_flops_per_s(s, model.q_head_dim, dtype, backward=True),
        hidden_bytes=tokens * model.hidden_size * elem,  # one full s*b*h tensor
        tp_op=tp_op, tp_per_layer=tp_per_layer,
    )
    chunks, first = [], 0
    mtp = tuple(model.mtp_layer(d) for d in range(model.mtp_depth))  # MTP blocks: on the last chunk
    for c, n in enumerate(split_layers(model.num_layers, num_chunks)):
        chunks.append(_chunk(st, c, tuple(range(first, first + n)) + (mtp if c == num_chunks - 1 else ())))
        first += n
    optimizer_bytes = 12 if elem == 2 else 8
    optimizer_rate = hardware.optimizer_bytes_per_s or hardware.hbm_bandwidth_bytes_per_s
    shard = parallel.dp_cp if parallel.zero_stage >= 1 else 1
    expert_shard = parallel.expert_dp if parallel.zero_stage >= 1 else 1
    kept = parallel.grad_reduce_bytes  # an fp32 accumulation buffer is the kept gradient
    parts = static_parts_per_param(weight_bytes, optimizer_bytes, parallel.zero_stage, shard, kept)
    expert_parts = static_parts_per_param(weight_bytes, optimizer_bytes, parallel.zero_stage, expert_shard, kept)
    if parallel.forward_only:  # an inference / rollout step holds the weights alone: no gradient, no optimizer
        parts, expert_parts = (parts[0], 0.0, 0.0), (expert_parts[0], 0.0, 0.0)
    return StageCosts(
        chunks=tuple(chunks),
        static_bytes_per_param=sum(parts),
        grad_bytes_per_param=weight_bytes,
        static_parts_per_param=parts,
        # torch's foreach Adam: an fp32 sqrt(exp_avg_sq) per (sharded) parameter while it steps
        optimizer_temp_bytes_per_param=4.0 / shard if parallel.optimizer_impl == "foreach" else 0.0,
        optimizer_s_per_param=OPTIMIZER_BYTES_PER_PARAM / shard / optimizer_rate,
        tokens_per_microbatch=tokens * parallel.cp,
        frozen_static_bytes_per_param=weight_bytes / (shard if parallel.zero_stage >= 3 else 1),
        expert_static_bytes_per_param=sum(expert_parts),
        expert_optimizer_s_per_param=OPTIMIZER_BYTES_PER_PARAM / expert_shard / optimizer_rate,
        tied_embedding_params=model.vocab_size * model.hidden_size / tp
        if model.last_stage_embedding and num_chunks > 1 else 0.0,
        tied_embedding_frozen=parallel.lora_rank > 0,
        grad_reduce_bytes=kept,
        lazy_grad_bytes_per_param=parts[1] if parallel.grad_allocation == "first-backward" else 0.0,
    )
