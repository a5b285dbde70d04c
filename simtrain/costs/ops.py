"""Per-operator compute model: a stage's F, I and W seconds as sums of named operator terms.

Each operator of a transformer layer (every linear layer's GEMM, the attention core, norms, the
FFN activation, rotary/positional terms, residual adds, dropout, and on the last stage the LM head
and the fp32 softmax cross-entropy) costs, in each pass, a roofline
``max(FLOPs / rate(shape, dtype), bytes / (HBM bandwidth x hbm_efficiency))`` (Williams et al.
2009, "Roofline"). The rates come from kernel-level measurements shipped in ``op_data.yaml``
(each cited there), never from an end-to-end run:

* GEMMs: the measured (m, n, k) table of the GPU kind, interpolated linearly in log2 of each
  dimension; above the table's largest size the rate stays at that size's (saturated); below its
  smallest, a dimension ``d`` scales the rate by ``d / dims[0]`` (tile quantization: a tile of
  ``dims[0]`` rows does ``d`` rows of useful work; NVIDIA "Matrix Multiplication Background User's
  Guide", tile quantization). Batched GEMMs (the unfused attention's per-head products) take the
  table's batch axis (1, 2, 4 GEMMs per call), clamped at its largest. F runs ``C[m,n] = X[m,k] W[k,n]``, I the input gradient
  ``dX[m,k] = dY[m,n] Wᵀ`` and W the weight gradient ``dW[k,n] = Xᵀ dY`` (shapes (m,k,n) and
  (k,n,m)).
* Attention with a fused kernel (``flash``): the causal work (half the ``4 s d`` FLOPs per token
  and head that simtrain counts) at the measured forward rate of the run's kernel
  (``parallel.attention_kernel``, else the GPU kind's default: FlashAttention-2/3/4 or cuDNN's,
  :mod:`simtrain.costs.attention_rates`) for the sequence length and head dim (the mean of the
  query/key and value head dims, MLA's 192 and 128 -> 160; log-interpolated, clamped), the
  backward 2.5x the forward's work (five matrix products against two: Dao 2023 §3.1;
  flash-attention's benchmark count) at the kernel's measured backward rate. Without one (``unfused``, Megatron-LM 2021 / BLOOM): Q·Kᵀ and P·V as batched
  GEMMs of the GEMM table, plus the materialised ``a s`` scores per token through the fused
  scale-mask-softmax and the attention dropout (bytes at HBM rate).
* Memory-bound kernels: each reads its inputs and writes its outputs once (bytes counted per
  operator below). Without sequence parallelism every TP rank runs them on all tokens.

Recomputation: ``full`` reruns every forward operator inside I; ``selective`` reruns the
attention core (Korthikanti et al. 2022 §5); ``every-second-mm`` is torchtitan's "selective op"
policy (:data:`EVERY_SECOND_MM`). MoE layers: :mod:`simtrain.costs.moe_ops` (router, shared and
routed experts, token permutation; the MoE segments around the unchanged all-to-alls).

The model enters :func:`simtrain.scenario.run_schedule` as its ``runtime`` hook
(:func:`ops_runtime`), replacing each chunk's ``forward_s``, ``backward_input_s`` and
``backward_weight_s`` by the sums of :func:`chunk_breakdown`; layers of one shape are costed once.
"""

from __future__ import annotations

import dataclasses
import warnings

from ..errors import SimtrainError
from ..hardware import HardwareProfile
from ..models import ModelSpec
from ..moe import check_expert_parallel
from ..parallel import ParallelConfig, flag_name, subject
from ..schedules.ir import ScheduleWarning
from .context import cp_declaration
from .cp_merge import cp_merge_op
from .eager import eager_factors  # noqa: F401 (re-exported)
from .fp8 import fp8_cast
from .attention_rates import BACKWARD_FLOPS_PER_FORWARD
from .kernels import KernelRates, rates_for
from .launch import KERNELS, OWN_KERNELS, _kernels, _launch  # noqa: F401 (KERNELS re-exported)
from .layers import linear_layers
from .moe_ops import ATTENTION_FFN, check_moe, moe_chunk, moe_layer_ops
from .mtp import mtp_ops
from .projections import projection_ops
from .recompute import (ALIASES, ATTENTION_CORE, EVERY_SECOND_MM, FULL, LAYER_OPS, LINEAR_OPS,  # noqa: F401
                        _EVERY_SECOND_MM_RERUNS, _second_mms, check_present, parse_recompute,
                        rerun_tp_collectives, stored_reduction)
from .trainable import adapter_ops, is_frozen, without_weight_pass
from .types import StageCosts, grad_accumulate_bytes_per_param
from .unfused import bias_add, rotary


@dataclasses.dataclass(frozen=True)
class OpCost:
    """One operator of one chunk for one microbatch on one GPU.

    Attributes:
        name: operator (``qkv``, ``attention``, ``norm``, ...), prefixed by ``head:`` on the head.
        flops, bytes: per pass (F, I, W): FLOPs and HBM bytes, summed over the chunk's layers.
        seconds: per pass, roofline seconds summed over the chunk's layers.
        bound: ``compute`` or ``memory``: which side of the roofline its forward is on (``host``
            for the ``launch`` row).
        kernels: per pass, CUDA kernels it launches (:data:`KERNELS`), summed over the layers.
    """

    name: str
    flops: tuple[float, float, float]
    bytes: tuple[float, float, float]
    seconds: tuple[float, float, float]
    bound: str
    kernels: tuple[float, float, float] = (0.0, 0.0, 0.0)

    def scaled(self, n: float) -> OpCost:
        """This operator ``n`` times (n layers of one shape)."""
        return OpCost(self.name, *(tuple(v * n for v in t) for t in (self.flops, self.bytes, self.seconds)),
                      self.bound, tuple(v * n for v in self.kernels))


# ----------------------------------------------------------------------------- operators
@dataclasses.dataclass(frozen=True)
class _Ctx:
    """What every operator of one chunk needs (SI units)."""

    model: ModelSpec
    parallel: ParallelConfig
    rates: KernelRates
    attention: str
    hbm_bytes_per_s: float
    recompute: frozenset[str] = frozenset()
    gemm_dtype: str | None = None
    host_bound: bool = True

    @property
    def tokens(self) -> int:
        """Tokens of one microbatch on this GPU: ``b x s / cp`` (context parallelism splits every
        sequence, :mod:`simtrain.costs.context`)."""
        return self.parallel.microbatch_size * self.seq // self.parallel.cp

    @property
    def seq(self) -> int:
        """The full sequence length ``s`` (what every query attends to, whatever the CP degree)."""
        return self.parallel.seq_len or self.model.seq_len

    @property
    def query_len(self) -> int:
        """Queries per sequence in one attention kernel: ``s / cp`` under ring and all-gather CP
        (each rank's block), ``s`` under Ulysses (all queries, a ``1 / cp`` share of the heads)."""
        cp = self.parallel.cp
        return self.seq if cp == 1 or self.parallel.cp_kind == "ulysses" else self.seq // cp

    @property
    def elem(self) -> int:
        return self.parallel.dtype_bytes

    @property
    def row_tokens(self) -> float:
        """Tokens a TP rank runs row-wise kernels (norms, adds, dropout) on: sharded under SP."""
        return self.tokens / self.parallel.tp if self.parallel.sequence_parallel else self.tokens


def _roofline(flops: float, nbytes: float, rate: float, bw: float) -> float:
    return max(flops / rate if flops else 0.0, nbytes / bw)


def _gemm(name: str, m: float, k: float, n: float, ctx: _Ctx, batch: float = 1) -> OpCost:
    """A linear layer ``Y[m,n] = X[m,k] W[k,n]``: F (m,n,k), I (m,k,n), W (k,n,m); ``batch`` such
    GEMMs run as one batched call (rated per GEMM, the returned cost is one GEMM's)."""
    flops = 2 * m * k * n
    nbytes = ctx.elem * (m * k + k * n + m * n)
    dtype = ctx.gemm_dtype or ctx.parallel.dtype
    shapes = ((m, n, k), (m, k, n), (k, n, m))
    rates = [ctx.rates.gemm_flops_per_s(*sh, dtype, batch) for sh in shapes]
    secs = tuple(_roofline(flops, nbytes, r, ctx.hbm_bytes_per_s) for r in rates)
    bound = "compute" if flops / rates[0] >= nbytes / ctx.hbm_bytes_per_s else "memory"
    return OpCost(name, (flops,) * 3, (nbytes,) * 3, secs, bound)


def _memory(name: str, fwd_bytes: float, bwd_bytes: float, ctx: _Ctx, w_bytes: float = 0.0,
            kernels: tuple[float, float, float] = (0.0, 0.0, 0.0)) -> OpCost:
    """A memory-bound kernel moving ``fwd_bytes`` in F, ``bwd_bytes`` in I (and ``w_bytes`` in W);
    run as eager ops (:func:`eager_factors`) when ``parallel.kernels`` is ``eager``, or, for the
    head's operators (``head:`` names), ``compiled-blocks`` (compiled blocks, eager loss). ``kernels``:
    its own kernels per pass, for an operator of :data:`simtrain.costs.launch.OWN_KERNELS` (the
    others get :data:`KERNELS` when the chunk is summed)."""
    bw = ctx.hbm_bytes_per_s
    mode = ctx.parallel.kernels
    if mode == "eager" or (mode == "compiled-blocks" and name.startswith("head:")):
        f, i = eager_factors(name, ctx.elem, ctx.model.activation)
        fwd_bytes, bwd_bytes = fwd_bytes * f, bwd_bytes * i
    b = (fwd_bytes, bwd_bytes, w_bytes)
    return OpCost(name, (0.0, 0.0, 0.0), b, tuple(x / bw for x in b), "memory", kernels)


def _attention(ctx: _Ctx) -> list[OpCost]:
    """The attention core of one layer: fused (FlashAttention) or unfused with materialised scores."""
    m, s, b = ctx.model, ctx.seq, ctx.parallel.microbatch_size
    heads = m.num_heads / ctx.parallel.tp
    dq, dv = m.q_head_dim, m.v_head_dim
    counted = ctx.tokens * heads * (2 * s * dq + 2 * s * dv)  # simtrain's F count (non-causal)
    if ctx.attention == "flash" and ctx.rates.attention:
        kernel, s_q, dtype = ctx.parallel.attention_kernel, ctx.query_len, ctx.parallel.dtype
        work, hd = counted / 2, (dq + dv) / 2  # causal: half the score matrix; MLA: the mean head dim
        secs = (work / ctx.rates.attention_flops_per_s(s_q, hd, dtype, kernel),
                BACKWARD_FLOPS_PER_FORWARD * work / ctx.rates.attention_flops_per_s(s_q, hd, dtype, kernel, backward=True),
                0.0)
        return [OpCost("attention", (counted, 2 * counted, 0.0), _flash_bytes(ctx, heads), secs, "compute")]
    ops = []
    core = dataclasses.replace(ctx, gemm_dtype=None)  # attention stays in the compute dtype
    sq = ctx.tokens // b  # this rank's queries per sequence (all of them without CP)
    for name, (mm, nn, kk) in (("attn_scores", (sq, s, dq)), ("attn_context", (sq, dv, s))):
        g = _gemm(name, mm, kk, nn, core, batch=b * heads).scaled(b * heads)
        # backward: two GEMMs of the forward's size (no weight gradient)
        ops.append(OpCost(name, (g.flops[0], 2 * g.flops[0], 0.0), (g.bytes[0], 2 * g.bytes[0], 0.0),
                          (g.seconds[0], g.seconds[0] + g.seconds[1], 0.0), g.bound))
    scores = ctx.tokens * heads * s  # materialised score elements
    e = ctx.elem
    ops.append(_memory("softmax", 2 * e * scores, 3 * e * scores, ctx))  # fused scale-mask-softmax
    if m.dropout:
        ops.append(_memory("attn_dropout", (2 * e + 1) * scores, (2 * e + 1) * scores, ctx))
    return ops


def _flash_bytes(ctx: _Ctx, heads: float) -> tuple[float, float, float]:
    """HBM bytes a fused attention kernel must move (each tensor once; shown, not priced: its
    measured rate already includes them): F reads Q, K, V and writes O and the fp32 log-sum-exp;
    I reads Q, K, V, O, dO and the log-sum-exp and writes dQ, dK, dV (Dao 2023 §3.1-3.2). K and V:
    the KV heads on this rank, for every key its queries see (``s``; Ulysses: ``s`` at ``1/cp`` of them)."""
    m, e, p = ctx.model, ctx.elem, ctx.parallel
    q, o = ctx.tokens * heads * m.q_head_dim * e, ctx.tokens * heads * m.v_head_dim * e
    keys = p.microbatch_size * ctx.seq / (p.cp if p.cp_kind == "ulysses" else 1)
    kv = keys * m.kv_heads / p.tp * (m.q_head_dim + m.v_head_dim) * e
    lse = ctx.tokens * heads * 4
    return (q + kv + o + lse, 2 * (q + kv) + 2 * o + lse, 0.0)


def _layer_ops(ctx: _Ctx, layer: int) -> list[OpCost]:
    """Every operator of transformer ``layer`` for one microbatch on one TP rank."""
    m, tp, e = ctx.model, ctx.parallel.tp, ctx.elem
    h = m.hidden_size
    gemms = linear_layers(m, layer)
    names = (["q_down", "q_up", "kv_down", "kv_up", "attn_out"] if m.mla is not None else ["qkv", "attn_out"])
    names += (["router"] if m.is_moe_layer(layer) else []) + ["ffn_up", "ffn_down"]
    ops, fp8 = [], []  # fp8: the FP8 GEMMs' shapes (an MoE layer's FFN: simtrain.costs.moe_ops)
    for name, (k, n, mult) in zip(names, gemms):
        k_, n_ = (k, n / tp) if k == h else (k / tp, n)
        ops += projection_ops(ctx, name, layer, ctx.tokens * mult, k_, n_)  # fused or separate layers
        if name not in (ATTENTION_FFN if m.is_moe_layer(layer) else ("router",)):
            fp8.append((ctx.tokens * mult, k_, n_, 1))
    ops += _attention(ctx) + cp_merge_op(ctx) + ([fp8_cast(ctx, fp8)] if ctx.gemm_dtype == "fp8" else [])
    rows = ctx.row_tokens
    lat = ctx.tokens * (m.mla.q_lora_rank + m.mla.kv_lora_rank) / tp if m.mla else 0.0  # MLA: q_norm, kv_norm
    ops.append(_memory("norm", 2 * 2 * e * h * rows + 2 * e * lat, 2 * 3 * e * h * rows + 3 * e * lat, ctx))
    ops.append(_memory("residual", 2 * 3 * e * h * rows, 2 * 3 * e * h * rows, ctx))
    if m.dropout:
        ops.append(_memory("dropout", 2 * (2 * e + 1) * h * rows, 2 * (2 * e + 1) * h * rows, ctx))
    width = ctx.tokens * (gemms[-1][0] / tp) * gemms[-1][2]  # FFN intermediate elements on this rank
    f_b, i_b = (3, 5) if m.activation == "swiglu" else (2, 3)
    ops.append(_memory("activation", f_b * e * width, i_b * e * width, ctx))
    if not m.learned_positions:  # MLA: only the rope parts, of every query head and the one shared key
        rope = ctx.tokens * ((m.num_heads + 1) * m.mla.qk_rope_head_dim if m.mla else
                             (m.num_heads + m.kv_heads) * m.q_head_dim) / tp
        ops.append(rotary(ctx, rope))  # fused, or Megatron-Core's unfused ops (simtrain.costs.unfused)
    return ops + bias_add(ctx, m.is_moe_layer(layer))


def _head_ops(ctx: _Ctx) -> list[OpCost]:
    """Final norm, LM head GEMM and the fp32 softmax cross-entropy (Korthikanti et al. 2022 §4.3);
    the head's GEMM stays in the compute dtype under ``--fp8 gemms`` (DeepSeek-V3 §3.3: "the output head")."""
    m, tp, e = ctx.model, ctx.parallel.tp, ctx.elem
    h, v = m.hidden_size, m.vocab_size
    rows = ctx.row_tokens
    return [_memory("head:norm", 2 * e * h * rows, 3 * e * h * rows, ctx),
            _gemm("head:lm_head", ctx.tokens, h, v / tp, dataclasses.replace(ctx, gemm_dtype=None)),
            _memory("head:cross_entropy", 2 * 4 * v / tp * ctx.tokens, 3 * 4 * v / tp * ctx.tokens, ctx)]


def _add(a: OpCost, b: OpCost) -> OpCost:
    """Two terms of one operator summed (a's name and bound)."""
    return OpCost(a.name, *(tuple(x + y for x, y in zip(getattr(a, f), getattr(b, f)))
                            for f in ("flops", "bytes", "seconds")), a.bound,
                  tuple(x + y for x, y in zip(a.kernels, b.kernels)))


def chunk_breakdown(ctx: _Ctx, layers: tuple[int, ...], has_embedding: bool, has_head: bool,
                    params: float, cache: dict | None = None) -> list[OpCost]:
    """The operators of one chunk for one microbatch, summed over its layers (one row per name),
    plus ``recompute`` (forward work rerun inside I) and ``grad_accum`` (W's gradient accumulation
    over the chunk's ``params`` trainable parameters). Frozen layers (``--trainable``) run no W;
    under LoRA a ``lora`` row holds the adapters' GEMMs (:mod:`simtrain.costs.trainable`).

    The chunk's F, I and W seconds are the column sums of ``seconds``. Layers of one shape are
    costed once: :func:`_layer_ops` per dense/MoE kind, kept in ``cache`` (pass one dict for every
    chunk of a model to share it); so is a whole chunk, for the chunks of one make-up (layers of the
    same kinds, frozen alike, the same ends and parameters: every row depends on these alone).
    """
    m, e = ctx.model, ctx.elem
    by_kind = {} if cache is None else cache
    make_up = tuple((m.is_moe_layer(x), is_frozen(ctx.parallel, x)) for x in layers)
    shape = ("chunk", make_up, has_embedding, has_head, params)
    if shape in by_kind:
        return list(by_kind[shape])
    rows: dict[str, OpCost] = {}
    counts: dict[str, int] = {}  # layers holding each operator
    w_counts: dict[str, int] = {}  # layers running each operator's W (not frozen)
    for layer in layers:
        kind = m.is_moe_layer(layer)
        if kind not in by_kind:
            if kind:  # an MoE layer's operators, in the parts its segments need (simtrain.costs.moe_ops)
                by_kind[("moe", True)] = moe_layer_ops(ctx, layer)
            by_kind[kind] = by_kind[("moe", True)].ops if kind else _layer_ops(ctx, layer)
        frozen = is_frozen(ctx.parallel, layer)
        if frozen and ("frozen", kind) not in by_kind:  # no W (dense only: simtrain.costs.trainable)
            by_kind[("frozen", kind)] = [without_weight_pass(o) for o in by_kind[kind]] + adapter_ops(
                ctx.model, layer, ctx.parallel, lambda k, n, mult: _gemm("lora", ctx.tokens * mult, k, n, ctx), _add)
        for op in by_kind[("frozen", kind) if frozen else kind]:
            rows[op.name] = _add(rows[op.name], op) if op.name in rows else op
            counts[op.name] = counts.get(op.name, 0) + 1
            w_counts[op.name] = w_counts.get(op.name, 0) + (not frozen or op.name == "lora")
    ops = [o if o.name in OWN_KERNELS else  # these count their own kernels (simtrain.costs.launch)
           dataclasses.replace(o, kernels=tuple(k * n for k, n in zip(_kernels(o.name), (counts[o.name],) * 2
                                                                      + (w_counts[o.name],))))
           for o in rows.values()]
    if has_embedding:
        h = m.hidden_size
        ops.append(_memory("embedding", 2 * e * h * ctx.row_tokens, 3 * e * h * ctx.row_tokens, ctx))
    if has_head:
        ops += _head_ops(ctx)
    ops = [o if o.name in rows else dataclasses.replace(o, kernels=_kernels(o.name)) for o in ops]
    ops += mtp_ops(ctx) if has_head else []  # the MTP modules' own operators (simtrain.costs.mtp)
    if ctx.parallel.lora_rank:  # the embedding and the LM head are frozen under LoRA
        ops = [o if o.name in rows else without_weight_pass(o) for o in ops]
    rerun = [o for o in ops if o.name in ctx.recompute or (FULL in ctx.recompute and o.name in rows)]
    if EVERY_SECOND_MM in ctx.recompute:
        for layer in layers:
            key = ("every-second-mm", m.is_moe_layer(layer))
            if key not in by_kind:
                by_kind[key] = _second_mms(ctx, layer)
            rerun += by_kind[key]
    ops.append(OpCost("recompute", (0.0, sum(o.flops[0] for o in rerun), 0.0),
                      (0.0, sum(o.bytes[0] for o in rerun), 0.0), (0.0, sum(o.seconds[0] for o in rerun), 0.0),
                      "compute", (0.0, sum(o.kernels[0] for o in rerun), 0.0)))
    ops.append(_grad_accum(ctx, params, len(layers)))
    if ctx.parallel.zero_stage >= 3 and ctx.parallel.zero_impl == "fsdp2":
        ops.append(_fsdp2_copy_out(ctx, params, len(layers) + (has_embedding or has_head)))
    ops.append(_launch(ops, ctx))
    by_kind[shape] = tuple(ops)
    return ops


def _grad_accum(ctx: _Ctx, params: float, layers: int) -> OpCost:
    """W's gradient accumulation over microbatches (bytes: :func:`grad_accumulate_bytes_per_param`),
    one kernel per parameter tensor (two with a wider accumulator: cast, then add), a layer holding
    one weight per linear layer (and a bias with ``model.bias``) and two per norm (one for RMSNorm)."""
    m, par = ctx.model, ctx.parallel
    weight_bytes = 2 if ctx.elem == 2 else 4
    reduce_bytes = par.grad_reduce_bytes
    per_param = grad_accumulate_bytes_per_param(weight_bytes, reduce_bytes, par.microbatches, par.zero_stage)
    tensors = layers * (len(linear_layers(m, 0)) * (2 if m.bias else 1) + 2 * (2 if m.norm == "layernorm" else 1))
    wide = reduce_bytes is not None and reduce_bytes > weight_bytes
    op = _memory("grad_accum", 0.0, 0.0, ctx, w_bytes=per_param * params)
    return dataclasses.replace(op, kernels=(0.0, 0.0, tensors * (2 if wide else 1)))


def _fsdp2_copy_out(ctx: _Ctx, params: float, units: int) -> OpCost:
    """torch FSDP2's all-gather copy-out under ZeRO-3 (``ParallelConfig.zero_impl = "fsdp2"``):
    ``foreach_all_gather_copy_out`` (``torch/distributed/_composable/fsdp/_fsdp_collectives.py``,
    2024) makes the compute stream wait for the all-gather, then copies the gathered flat buffer
    into each parameter's unsharded tensor (``torch.ops.fsdp.split_with_sizes_copy``) on that
    stream: each of the chunk's ``params`` is read and written once in the parameter dtype before
    every F and every I (the backward gathers again after ``reshard_after_forward``), one kernel per
    FSDP unit (``units``: a block each, plus the root module's embedding / head). Returns the
    memory-bound row ``fsdp_copy_out``."""
    weight_bytes = 2 if ctx.elem == 2 else 4
    moved = 2 * weight_bytes * params
    return _memory("fsdp_copy_out", moved, moved, ctx, kernels=(float(units), float(units), 0.0))


# ----------------------------------------------------------------------------- into the simulator
GRAD_NORM_CLIP_BYTES_PER_PARAM = 12
"""HBM bytes per parameter of the per-step gradient-norm (read the fp32 gradient: 4) and clipping
(read and write it: 8) that Megatron-style trainers run before the optimizer step; memory-bound."""


def grad_norm_clip_s(ctx: _Ctx, params: float) -> float:
    """Seconds of the per-step gradient norm and clipping over ``params`` parameters of one GPU
    (:data:`GRAD_NORM_CLIP_BYTES_PER_PARAM` at the memory-bound rate) on the gradient the rank holds
    reduced: the ZeRO-1+ shard over DP x CP (the group the optimizer states are sharded over:
    :func:`simtrain.costs.stage_costs`) when gradients are reduce-scattered; the whole gradient when
    they are all-reduced, as DeepSpeed's BF16_Optimizer does under ZeRO-1 (``step`` norms and clips
    ``get_grads_for_norm()``, the unpartitioned fp32 gradients: deepspeed/runtime/bf16_optimizer.py
    at v0.6.5)."""
    sharded = ctx.parallel.zero_stage >= 1 and ctx.parallel.dp_reduce_op == "reduce-scatter"
    shard = ctx.parallel.dp_cp if sharded else 1
    return GRAD_NORM_CLIP_BYTES_PER_PARAM / ctx.hbm_bytes_per_s / shard * params


def ops_runtime(model: ModelSpec, parallel: ParallelConfig, hardware: HardwareProfile,
                attention: str = "flash", recompute: str | None = None, fp8: str | None = None,
                host_bound: bool = True, name=flag_name):
    """A ``runtime`` hook for :func:`simtrain.scenario.run_schedule` that replaces each chunk's F,
    I and W seconds by the per-operator sums of :func:`chunk_breakdown`, and adds the gradient
    norm and clipping to the optimizer step.

    Args:
        model, parallel, hardware: what is simulated.
        attention: ``flash`` (a fused kernel) or ``unfused`` (materialised scores).
        recompute: operators rerun inside I (:func:`parse_recompute`); None takes
            ``parallel.recompute``. A module list on top of ``recompute none`` also leaves the
            rerun operators' outputs out of the stored activations
            (:func:`simtrain.costs.recompute.stored_reduction`); levels keep
            ``parallel.recompute``'s memory (:mod:`simtrain.costs`).
        fp8: ``gemms`` runs the transformer layers' linear GEMMs at the GPU kind's FP8 rate while
            attention, the MoE router, the LM head and memory-bound kernels stay in
            ``parallel.dtype`` (DeepSeek-V3 §3.3); None: no FP8.
        host_bound: False leaves out the excess of asynchronous kernel launches over the GPU's time
            (the ``launch`` row's per-pass maximum): what :mod:`simtrain.plan` sums over layers
            for its lower bounds.
        name: how a refusal names a parallel setting and its value (``--recompute x``, or a
            scenario file's field: :func:`simtrain.cli.settings.setting_name`).

    Returns:
        A function StageCosts -> StageCosts. Costs given by ``--op-times`` pass through
        unchanged; an MoE chunk's segments (:mod:`simtrain.moe`) are priced by operator too
        (:func:`simtrain.costs.moe_ops.moe_chunk`), its all-to-alls kept.

    Raises:
        SimtrainError: ``attention`` is not flash/unfused, ``parallel.attention_kernel`` set with
            unfused attention or not measured on the GPU kind, an unknown recompute module,
            one the model lacks, a module list with ``kernels: eager``, ``every-second-mm`` with an MLA or MoE model, ``fp8`` other than gemms, or a GPU kind without kernel tables (or without an FP8 GEMM table).
    """
    if attention not in ("flash", "unfused"):
        raise SimtrainError(f"attention = {attention!r}: choose flash or unfused")
    if fp8 not in (None, "gemms"):
        raise SimtrainError(f"{subject(name, 'fp8', fp8)}: the only choice is gemms (FP8 GEMMs, attention in {parallel.dtype})")
    spec = recompute or parallel.recompute
    rerun = parse_recompute(spec)  # validated by recompute_modules where it was given
    if EVERY_SECOND_MM in rerun and model.mla is not None:
        raise SimtrainError(f"{name('recompute', EVERY_SECOND_MM)}: defined for blocks with separate Q, K and V "
                            f"projections; {model.name} uses MLA (name the modules instead)")
    rates = rates_for(hardware)
    if parallel.attention_kernel is not None:
        said = name("attention_kernel", parallel.attention_kernel)
        if attention != "flash":
            raise SimtrainError(f"{said}: names a fused-attention kernel, and attention is {attention} "
                                f"(set {name('attention', 'flash')} or leave the kernel out)")
        rates.attention_kernel(parallel.attention_kernel, said)  # measured on this kind, or an error
    if attention == "flash" and not rates.attention:
        warnings.warn(f"{hardware.name} ({rates.kind}): no measured fused-attention rate in op_data.yaml, so "
                      f"attention is priced as unfused (materialised scores), slower than a fused kernel; "
                      f"{name('attention', 'unfused')} says so explicitly", ScheduleWarning, stacklevel=2)
    if fp8 and "fp8" not in rates.gemm:
        raise SimtrainError(f"{name('fp8', fp8)}: {hardware.name} ({rates.kind}) has no FP8 GEMM table; "
                            f"it has {sorted(rates.gemm)}")
    ctx = _Ctx(model, parallel, rates, attention, hardware.hbm_bandwidth_bytes_per_s * rates.hbm_efficiency,
               rerun, "fp8" if fp8 else None, host_bound)
    check_moe(ctx, name)
    check_expert_parallel(model, parallel, hardware, name)  # before pricing an expert layer
    if spec not in ("none", "selective", "full", EVERY_SECOND_MM) and parallel.kernels == "eager":
        raise SimtrainError(f"{name('recompute', spec)} with {name('kernels', 'eager')}: eager saved tensors are counted per block, "
                            f"so reruns would free no memory; use none, selective, full or {EVERY_SECOND_MM}")
    if spec not in ("none", "selective", "full", EVERY_SECOND_MM):  # a module list: one layer of each kind
        kinds = {model.is_moe_layer(i): i for i in range(model.num_layers)}
        check_present(spec, model.name, {o.name for moe, i in kinds.items()
                                         for o in (moe_layer_ops(ctx, i).ops if moe else _layer_ops(ctx, i))}, name)
    return _apply_with(ctx)


def _linear_seconds(ctx: _Ctx, ops: list[OpCost]) -> tuple[float, float, float]:
    """F, I (with the reruns of recomputation) and W seconds of a chunk's transformer-layer linear
    GEMMs (:data:`LINEAR_OPS`; the LM head's GEMM is not next to a TP collective of a layer)."""
    linear = [o for o in ops if o.name in LINEAR_OPS]
    rerun = sum(o.seconds[0] for o in linear if o.name in ctx.recompute or FULL in ctx.recompute)
    return (sum(o.seconds[0] for o in linear), sum(o.seconds[1] for o in linear) + rerun,
            sum(o.seconds[2] for o in linear))


def _compute_bound(ops: list[OpCost]) -> tuple[float, float, float]:
    """Per pass (F, I, W), the share of a chunk's seconds in compute-bound operators (1 if none)."""
    total = [sum(o.seconds[p] for o in ops) for p in range(3)]
    bound = [sum(o.seconds[p] for o in ops if o.bound == "compute") for p in range(3)]
    return tuple(b / t if t > 0 else 1.0 for b, t in zip(bound, total))


def _apply_with(ctx: _Ctx):
    """The StageCosts -> StageCosts function of :func:`ops_runtime` for one context."""
    model, parallel = ctx.model, ctx.parallel

    def apply(costs: StageCosts) -> StageCosts:
        if costs.fixed_op_times:
            return costs
        chunks, cache = [], {}
        for c in costs.chunks:
            ops = chunk_breakdown(ctx, c.layers, c.has_embedding, c.has_head, c.params - c.frozen_params, cache)
            f, i, w = (sum(o.seconds[p] for o in ops) for p in range(3))
            moe = c.moe and moe_chunk(ctx, c, cache, ops)  # segments around the (unchanged) all-to-alls
            attn_f, attn_i = (sum(o.seconds[p] for o in ops if o.name in ATTENTION_CORE) for p in range(2))
            cp = cp_declaration(model, parallel, ctx.tokens, len(c.layers), attn_f, attn_i)  # what hides ring CP
            kept = stored_reduction(ctx, c, cache)  # a module list's outputs are not stored
            held = kept if parallel.w_pending == "autograd" else 0.0  # W holding the whole graph
            chunks.append(dataclasses.replace(c, forward_s=f, backward_input_s=i, backward_weight_s=w, moe=moe,
                                              activation_bytes=c.activation_bytes - kept,
                                              weight_grad_bytes=c.weight_grad_bytes - held,
                                              full_backward_s=None, cp_hide_forward_s=cp.hide_forward_s,
                                              cp_hide_backward_s=cp.hide_backward_s, gemm_s=_linear_seconds(ctx, ops),
                                              compute_bound_fraction=_compute_bound(ops),
                                              tp_backward=rerun_tp_collectives(ctx, c)))
        return dataclasses.replace(costs, chunks=tuple(chunks),
                                   optimizer_s_per_param=costs.optimizer_s_per_param + grad_norm_clip_s(ctx, 1.0))

    apply.ctx = ctx
    return apply


published_runtime = ops_runtime
"""The per-operator model as :func:`simtrain.published.run_suite` takes it."""
