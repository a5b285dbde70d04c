"""Per-operator compute model of MoE layers: the router, shared and routed experts, and the token
permutation around the dispatch / combine all-to-alls, priced as the dense operators of
:mod:`simtrain.costs.ops` are (a roofline per operator from the kernel tables of ``op_data.yaml``).

An MoE layer's operators, for one microbatch on one GPU (``T`` the tokens this GPU routes: ``b s /
tp`` with expert parallelism, the sequence-parallel shard of :mod:`simtrain.moe`; ``b s`` without):

* **attention part**: as a dense layer (:func:`simtrain.costs.ops._layer_ops`: the MLA or QKV
  projections, the attention core, the two norms, residual adds, rotary, dropout);
* ``router``: the gate GEMM ``[T, h] x [h, E]`` in the compute dtype even under ``--fp8 gemms``
  (DeepSeek-V3 report, arXiv:2412.19437, §3.3: "MoE gating modules" keep BF16/FP32); ``router_topk``:
  the memory-bound scoring and top-k over fp32 logits (F reads the logits and writes the scores, 8E
  bytes per token, then reads them for the top-k and writes ``k`` indices and weights, 4E + 12k;
  I reads the k weight gradients, scatters them into E and runs the score backward: 12k + 16E);
* **shared experts** (``ffn_up``, ``activation``, ``ffn_down``): one dense FFN of width
  ``num_shared x f`` (Megatron-Core ``SharedExpertMLP``), tensor-parallel as a dense FFN;
* ``fp8_cast`` (``--fp8 gemms``): the quantization of the shared and routed experts' FP8 GEMM
  inputs (:mod:`simtrain.costs.fp8`; the routed experts' in their block, at the mean rank's bytes);
* ``permute`` / ``unpermute``: the token dispatcher's gathers (Megatron-Core
  ``moe_utils.permute``/``unpermute`` around ``MoEAlltoAllTokenDispatcher``'s all-to-alls):
  permute reads and writes ``T k`` rows of ``h`` (F ``2 T k h e``; its backward sums the ``k``
  copies back, ``(k + 1) T h e``); unpermute reads the ``T k`` expert outputs and writes their
  weighted sum (F ``(k + 1) T h e``; backward ``(2k + 1) T h e``: the gradient of each copy and of
  its routing weight);
* **routed experts** (``expert_up``, ``expert_activation``, ``expert_down``): each GPU holds
  ``G = E / ep`` experts (all ``E``, tensor-parallel, when ep = 1) and receives ``R = T k``
  token-expert pairs (uniform routing, :mod:`simtrain.moe`), so each expert runs its two GEMMs at
  ``M = R / G`` rows, as one grouped GEMM of ``G`` groups (``expert_gemm: grouped``: DeepGEMM's
  grouped GEMMs): the GEMM table's batch axis (``G`` GEMMs per call, clamped at its largest); or
  (``multi-stream``: Transformer Engine's ``GroupedLinear`` on Hopper) as ``G`` cuBLAS GEMMs, each
  at its own shape's single-GEMM rate (:mod:`simtrain.costs.unfused`). With
  ``expert_imbalance = f`` the simulated (most loaded) rank's experts run at ``f M`` rows: their
  seconds are that rank's, their FLOPs the mean rank's (model FLOPs). Under ``--fp8 gemms`` they
  run at the FP8 table's rate, as DeepSeek-V3's (§3.3). A clamped gated activation or biased
  experts add Megatron-Core's eager element-wise kernels around them
  (:mod:`simtrain.costs.expert_epilogue`).

The FLOPs equal the flat model's exactly (:mod:`simtrain.costs.layers`, :func:`simtrain.moe.chunk_cost`):
router ``2 T h E``, shared ``2 x 3 h f s`` per token (SwiGLU), routed ``k x 2 x 3 h f``.

:func:`moe_chunk` cuts a chunk's operators into the segments of :class:`simtrain.moe.MoEChunkCost`
(compute up to each MoE block; the block's dispatch and combine are the flat model's, untouched):
permute ends the segment before a block, unpermute starts the one after, the embedding joins the
first segment, an MTP module's input operators (:mod:`simtrain.costs.mtp`) the segment ending at its
block, and the heads, gradient accumulation and the ``launch`` row the last.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from ..errors import SimtrainError
from ..moe import MoEChunkCost, Segment
from ..parallel import subject
from .ep_sms import bound_fractions
from .expert_epilogue import epilogue_ops
from .fp8 import fp8_cast
from .mtp import MTP_INPUT, is_mtp_layer
from .recompute import FULL
from .unfused import expert_gemm_batch

ATTENTION_FFN = ("router", "ffn_up", "ffn_down", "activation")
"""Operators of :func:`simtrain.costs.ops._layer_ops` that an MoE layer replaces by its own."""
EXPERT_OPS = ("expert_up", "expert_activation", "expert_down")
"""The routed experts' operators (the MoE block's compute; with a clamped activation or biases also
the eager ``expert_clamp`` / ``expert_bias`` of :mod:`simtrain.costs.expert_epilogue`)."""


@dataclasses.dataclass(frozen=True)
class MoELayerOps:
    """One MoE layer's operators (:class:`simtrain.costs.ops.OpCost`), in three parts.

    Attributes:
        pre: before the dispatch (attention part, router, shared experts, permute).
        experts: the routed experts (on the most loaded rank's token count).
        post: after the combine (unpermute).
    """

    pre: tuple
    experts: tuple
    post: tuple

    @property
    def ops(self) -> list:
        """Every operator of the layer."""
        return [*self.pre, *self.experts, *self.post]


def routed_tokens(ctx) -> float:
    """``T``: tokens this GPU routes per MoE layer (``b s / tp`` with ep > 1, as
    :func:`simtrain.moe.chunk_cost`; ``b s`` with ep = 1, the experts then being tensor-parallel)."""
    par = ctx.parallel
    return ctx.tokens / par.tp if par.ep > 1 else ctx.tokens


def moe_layer_ops(ctx, layer: int) -> MoELayerOps:
    """The operators of MoE ``layer`` for one microbatch on one GPU (module docstring).

    Args:
        ctx: the :class:`simtrain.costs.ops._Ctx` of the run.
        layer: an MoE layer of ``ctx.model``.

    Returns:
        Its :class:`MoELayerOps`.
    """
    from .ops import _gemm, _layer_ops, _memory

    m, par, e = ctx.model, ctx.parallel, ctx.elem
    moe, h, tp = m.moe, m.hidden_size, par.tp
    swiglu = m.activation == "swiglu"
    f_b, i_b = (3, 5) if swiglu else (2, 3)  # activation bytes per intermediate element, as dense
    pre = [o for o in _layer_ops(ctx, layer) if o.name not in ATTENTION_FFN]
    gate = dataclasses.replace(ctx, gemm_dtype=None)  # the gating GEMM stays in the compute dtype
    pre.append(_gemm("router", ctx.tokens, h, moe.num_experts / tp, gate))
    rows, E, k = ctx.row_tokens, moe.num_experts, moe.top_k
    pre.append(_memory("router_topk", rows * (12 * E + 12 * k), rows * (16 * E + 12 * k), ctx))
    if moe.num_shared_experts:
        width = moe.num_shared_experts * moe.expert_ffn_hidden_size
        pre.append(_gemm("ffn_up", ctx.tokens, h, (2 if swiglu else 1) * width / tp, ctx))
        pre.append(_memory("activation", f_b * e * ctx.tokens * width / tp, i_b * e * ctx.tokens * width / tp, ctx))
        pre.append(_gemm("ffn_down", ctx.tokens, width / tp, h, ctx))
        if ctx.gemm_dtype == "fp8":  # the shared experts' FP8 GEMMs' inputs (simtrain.costs.fp8)
            shapes = [(ctx.tokens, h, (2 if swiglu else 1) * width / tp, 1), (ctx.tokens, width / tp, h, 1)]
            pre.append(fp8_cast(ctx, shapes))
    t = routed_tokens(ctx)
    pre.append(_memory("permute", 2 * e * t * k * h, (k + 1) * e * t * h, ctx))
    post = [_memory("unpermute", (k + 1) * e * t * h, (2 * k + 1) * e * t * h, ctx)]
    return MoELayerOps(tuple(pre), tuple(_experts(ctx, t * k)), tuple(post))


def _experts(ctx, pairs: float) -> list:
    """The routed experts' grouped GEMMs and activation for ``pairs`` token-expert pairs on this
    GPU (seconds at the most loaded rank's ``expert_imbalance`` x pairs, FLOPs and bytes at the mean)."""
    from .ops import OpCost, _gemm, _memory

    m, par, e = ctx.model, ctx.parallel, ctx.elem
    h, f = m.hidden_size, m.moe.expert_ffn_hidden_size
    split = par.tp if par.ep == 1 else 1  # ep = 1: every expert tensor-parallel
    groups = m.moe.num_experts // par.ep
    imb = par.expert_imbalance
    rows = pairs * imb / groups  # each local expert's rows on the most loaded rank
    up_n = (2 if m.activation == "swiglu" else 1) * f / split

    def mean(op: OpCost) -> OpCost:
        return dataclasses.replace(op, flops=tuple(x / imb for x in op.flops), bytes=tuple(x / imb for x in op.bytes))

    batch, kernels = expert_gemm_batch(par, groups)  # one grouped kernel, or TE's per-expert GEMMs
    up, down = (dataclasses.replace(_gemm(name, rows, k, n, ctx, batch=batch).scaled(groups), kernels=(kernels,) * 3)
                for name, k, n in (("expert_up", h, up_n), ("expert_down", f / split, h)))
    width = pairs * imb * f / split
    f_b, i_b = (3, 5) if m.activation == "swiglu" else (2, 3)
    act = _memory("expert_activation", f_b * e * width, i_b * e * width, ctx)
    ops = [mean(up), mean(act), mean(down)] + [mean(o) for o in epilogue_ops(ctx, pairs * imb, f / split, groups)]
    if ctx.gemm_dtype == "fp8":  # the grouped GEMMs' inputs and G weights each (simtrain.costs.fp8)
        ops.append(mean(fp8_cast(ctx, [(pairs * imb, h, up_n, groups), (pairs * imb, f / split, h, groups)])))
    return ops


def check_moe(ctx, name: Callable[[str, object], str]) -> None:
    """Refuse what the MoE operators do not define; ``name`` words the setting (the flag, a
    scenario file's field, an API argument: :func:`simtrain.costs.ops.ops_runtime`'s).

    Raises:
        SimtrainError: ``every-second-mm`` recomputation on an MoE model (torchtitan's policy
            counts the matmuls of a dense block).
    """
    from .recompute import EVERY_SECOND_MM

    if ctx.model.moe is not None and EVERY_SECOND_MM in ctx.recompute:
        raise SimtrainError(f"{subject(name, 'recompute', EVERY_SECOND_MM)}: defined for dense blocks (torchtitan's policy); "
                            f"{ctx.model.name} is an MoE model (name the modules instead)")


def _sums(ops, ctx, rerun: bool = True) -> tuple[float, float, float, float, float]:
    """F, I, W seconds of ``ops``, the F seconds of those named in ``--recompute`` (rerun inside
    I) and the F seconds full recomputation replays (none for ``rerun=False``: the embedding,
    head and per-chunk rows, which :func:`simtrain.costs.ops.chunk_breakdown` never reruns)."""
    named = sum(o.seconds[0] for o in ops if o.name in ctx.recompute) if rerun else 0.0
    full = sum(o.seconds[0] for o in ops) if rerun and FULL in ctx.recompute else 0.0
    return (*(sum(o.seconds[p] for o in ops) for p in range(3)), named, full)


def _per_chunk(name: str) -> bool:
    """Whether breakdown row ``name`` is not a transformer layer's (embedding, head, MTP modules'
    own operators, per-chunk rows)."""
    return name in ("embedding", "grad_accum", "launch") or name.startswith(("head:", "mtp:"))


def moe_chunk(ctx, chunk, cache: dict, breakdown: list) -> MoEChunkCost:
    """The MoE segments of ``chunk`` priced by operator (module docstring).

    Args:
        ctx: the per-operator context.
        chunk: a :class:`simtrain.costs.ChunkCost` whose ``moe`` is set (its blocks give the
            dispatch and combine, kept as they are).
        cache: the per-layer-kind cache of :func:`simtrain.costs.ops.chunk_breakdown`, filled
            by it (``False``: a dense layer's operators, ``("moe", True)``: an MoE layer's parts).
        breakdown: that function's operators of ``chunk`` (for the embedding, head,
            gradient-accumulation and launch rows).

    Returns:
        The segments; their F, I, W (:func:`moe_totals`) equal the column sums of ``breakdown``.
    """
    first = _sums([o for o in breakdown if o.name == "embedding"], ctx, rerun=False)
    before = ("embedding", *MTP_INPUT)  # an MTP module's input operators precede its block
    tail = _sums([o for o in breakdown if _per_chunk(o.name) and o.name not in before], ctx, rerun=False)
    depth = ctx.model.mtp_depth
    mtp_in = _sums([o.scaled(1 / depth) for o in breakdown if o.name in MTP_INPUT], ctx, rerun=False) \
        if depth else (0.0,) * 5
    blocks = {b.layer: b for b in chunk.moe.blocks}
    full = FULL in ctx.recompute
    segments, acc, start = [], [], first
    for layer in chunk.layers:
        if is_mtp_layer(ctx.model, layer):  # one module's projection, norms, embedding lookup
            start = tuple(a + b for a, b in zip(start, mtp_in))
        if not ctx.model.is_moe_layer(layer):
            acc += cache[False]
            continue
        parts = cache[("moe", True)]
        f, i, w, named, replay = (a + b for a, b in zip(_sums(acc + list(parts.pre), ctx), start))
        ef, ei, ew, e_named, _ = _sums(parts.experts, ctx)
        block = dataclasses.replace(blocks[layer], expert_forward_s=ef, expert_backward_input_s=ei + e_named,
                                    expert_backward_weight_s=ew)
        segments.append(Segment(f, i + named, w, replay, block))
        acc, start = list(parts.post), (0.0,) * 5
    f, i, w, named, replay = (a + b + c for a, b, c in zip(_sums(acc, ctx), start, tail))
    segments.append(Segment(f, i + named, w, replay, None))
    moe_ops = cache[("moe", True)]  # the chunk has MoE layers (chunk.moe is set)
    dense = cache[False] if not all(ctx.model.is_moe_layer(x) for x in chunk.layers) else []
    fractions = bound_fractions([*dense, *moe_ops.pre, *moe_ops.post], moe_ops.experts)
    return MoEChunkCost(tuple(segments), chunk.moe.local_experts, full, fractions)


def moe_totals(moe: MoEChunkCost) -> tuple[float, float, float]:
    """F, I (with what full recomputation replays: each segment's ``recompute_s`` and block's
    expert forward) and W seconds of the compute of ``moe``'s segments and blocks, as the lowering
    (:mod:`simtrain.lowering.moe`) runs them."""
    segs, full = moe.segments, moe.full_recompute
    blocks = moe.blocks
    return (sum(s.forward_s for s in segs) + sum(b.expert_forward_s for b in blocks),
            sum(s.backward_input_s + (s.recompute_s if full else 0.0) for s in segs)
            + sum(b.expert_backward_input_s + (b.expert_forward_s if full else 0.0) for b in blocks),
            sum(s.backward_weight_s for s in segs) + sum(b.expert_backward_weight_s for b in blocks))
