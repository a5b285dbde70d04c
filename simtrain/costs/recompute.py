"""Which operators a backward reruns: the ``--recompute`` vocabulary of the per-operator model.

``none``, ``selective`` (the attention core, Korthikanti et al. 2022 §5), ``full`` (every layer
operator), torchtitan's ``every-second-mm`` or a comma-separated list of operator names and groups
(DeepSeek-V3 §3.2.3 recomputes ``norm,mla_up``). :mod:`simtrain.costs.ops` prices what is named here.
"""

from __future__ import annotations

from collections.abc import Callable

from ..errors import SimtrainError
from ..parallel import flag_name, subject

ATTENTION_CORE = ("attention", "attn_scores", "attn_context", "softmax", "attn_dropout")
"""Operators that selective recomputation reruns (Korthikanti et al. 2022 §5)."""
LAYER_OPS = ("qkv", "q_down", "q_up", "kv_down", "kv_up", "attn_out", "router", "ffn_up", "ffn_down",
             *ATTENTION_CORE, "norm", "residual", "dropout", "activation", "rotary",
             "router_topk", "permute", "unpermute", "expert_up", "expert_activation", "expert_down")
"""Names of a transformer layer's operators, as ``--recompute MODULE,...`` takes them (the last six
are MoE layers', :mod:`simtrain.costs.moe_ops`; an MoE layer's shared experts are its ``ffn_*``)."""
LINEAR_OPS = (*LAYER_OPS[:9], "expert_up", "expert_down")
"""The linear-layer GEMMs among :data:`LAYER_OPS` (``qkv`` to ``ffn_down``, the routed experts')."""
ALIASES = {"attn_core": ATTENTION_CORE, "swiglu": ("activation",), "gelu": ("activation",),
           "mla_up": ("q_up", "kv_up"), "mlp": ("ffn_up", "activation", "ffn_down"), "ffn": ("ffn_up", "activation", "ffn_down"),
           "experts": ("expert_up", "expert_activation", "expert_down")}
"""Group names accepted by ``--recompute`` (DeepSeek-V3 §3.2.3 recomputes ``norm,mla_up``)."""
_MODULE_PARTS = {"expert_activation": ("expert_clamp",)}
"""Operators a named module reruns with it: Megatron-Core's ``moe_act`` checkpoint covers the whole
``bias_act_func``, the eager clamps of a clamped activation included (:mod:`simtrain.costs.expert_epilogue`)."""
FULL = "*"
EVERY_SECOND_MM = "every-second-mm"
"""torchtitan's selective per-op activation checkpointing ("selective op", pytorch/torchtitan
``parallelize_llama.py`` of April 2024 to 2025, ``_custom_policy``: "Saves output of all compute
ops, except every second mm"): inside each transformer block the outputs of ``aten.mm`` calls 1,
3, 5, ... in forward order and of the SDPA (flash / memory-efficient) kernel are saved, so the
backward reruns matmuls 2, 4, 6, ... and every operator that is not a compute op (norms, residual
adds, the FFN activation, rotary, dropout), but not the attention core. The mm order is the
module's: ``wq, wk, wv, wo, w1, w3, w2`` for a SwiGLU Llama block (``w1, w2`` for GeLU), so a
Llama block reruns ``wk``, ``wo`` and ``w3``. Defined for blocks with separate Q, K and V
projections (not MLA)."""
_EVERY_SECOND_MM_RERUNS = ("norm", "residual", "dropout", "activation", "rotary")
"""The non-compute operators :data:`EVERY_SECOND_MM` reruns (every one of the block)."""


def parse_recompute(spec: str, name: Callable[[str, object], str] = flag_name) -> frozenset[str]:
    """Operators rerun inside I: ``none``, ``selective`` (the attention core), ``full`` (every
    layer operator), ``every-second-mm`` (torchtitan's selective op policy,
    :data:`EVERY_SECOND_MM`) or a comma-separated list of :data:`LAYER_OPS` names and
    :data:`ALIASES`.

    ``name`` words the setting in a message, from its field and value (the flag ``--recompute
    norm``, a scenario file's field, an API argument: :func:`simtrain.cli.settings.setting_name`).

    Raises:
        SimtrainError: an unknown module name (the message lists the allowed ones), or one named
            twice.
    """
    if spec in ("none", "selective", "full"):
        return {"none": frozenset(), "selective": frozenset(ATTENTION_CORE), "full": frozenset({FULL})}[spec]
    if spec == EVERY_SECOND_MM:
        return frozenset({EVERY_SECOND_MM, *_EVERY_SECOND_MM_RERUNS})
    names = set()
    items = [x.strip() for x in spec.split(",")]
    for item in items:
        if items.count(item) > 1 and (item in ALIASES or item in LAYER_OPS):
            raise SimtrainError(f"{subject(name, 'recompute', spec)}: module {item!r} is listed {items.count(item)} times; name "
                                "each once")
        if item in ALIASES:
            names.update(ALIASES[item])
        elif item in LAYER_OPS:
            names.add(item)
        else:
            raise SimtrainError(f"{subject(name, 'recompute', spec)}: unknown module {item!r}; choose none, selective, full, "
                                f"{EVERY_SECOND_MM} or a comma-separated list of {', '.join(LAYER_OPS + tuple(ALIASES))}")
    for module, parts in _MODULE_PARTS.items():
        if module in names:
            names.update(parts)
    return frozenset(names)


def check_present(spec: str, model: str, present: set[str],
                  name: Callable[[str, object], str] = flag_name) -> None:
    """Refuse a ``--recompute`` module list naming an operator (or a group none of whose operators)
    the model has, e.g. ``mla_up`` on a model without MLA or ``experts`` on a dense one.

    Args:
        spec: a ``--recompute`` module list (:func:`parse_recompute` accepted it).
        model: the model's name, for the message.
        present: the operator names of the model's layers (:data:`LAYER_OPS` entries).
        name: how the message names the setting (as :func:`parse_recompute`).

    Raises:
        SimtrainError: one line naming the module and the operators the model has.
    """
    for item in (x.strip() for x in spec.split(",")):
        if not present & set(ALIASES.get(item, (item,))):
            raise SimtrainError(f"{subject(name, 'recompute', spec)}: {model} has no {item!r} operator; its layers have "
                                f"{', '.join(n for n in LAYER_OPS if n in present)}")


def _block_mms(model, layer: int) -> list[tuple[float, float, float]]:
    """``(fan_in, fan_out, rows per token)`` of every ``aten.mm`` of a dense block in forward order:
    Q, K, V, the output projection, then the FFN's ``w1`` (and ``w3``) and ``w2`` (torchtitan's
    ``FeedForward.forward``, ``w2(silu(w1(x)) * w3(x))``). A matmul whose fan-in is the hidden size
    is column-parallel under TP (its output split), the others row-parallel (its input split)."""
    from .layers import linear_layers

    m = model
    h, a, kv = m.hidden_size, m.num_heads, m.kv_heads
    width, _, mult = linear_layers(m, layer)[-1]  # the FFN intermediate (fan-in of the down projection)
    ffn_up = [(h, width), (h, width)] if m.activation == "swiglu" else [(h, width)]
    return [(h, a * m.q_head_dim, 1.0), (h, kv * m.q_head_dim, 1.0), (h, kv * m.v_head_dim, 1.0),
            (a * m.v_head_dim, h, 1.0), *((k, n, mult) for k, n in ffn_up), (width, h, mult)]


def _second_mms(ctx, layer: int) -> list:
    """The matmuls :data:`EVERY_SECOND_MM` reruns in ``layer``: the 2nd, 4th, ... of
    :func:`_block_mms`, each as its own GEMM (:class:`simtrain.costs.ops.OpCost`), split over TP as
    in :func:`simtrain.costs.ops._layer_ops`; ``ctx`` is that module's ``_Ctx``."""
    from .ops import _gemm

    h, tp = ctx.model.hidden_size, ctx.parallel.tp
    out = []
    for i, (k, n, rows) in enumerate(_block_mms(ctx.model, layer)[1::2]):
        k_, n_ = (k, n / tp) if k == h else (k / tp, n)
        out.append(_gemm(f"mm{2 * i + 2}", ctx.tokens * rows, k_, n_, ctx))
    return out


def every_second_mm_stored_bytes(model, layer: int, tp: int, sequence_parallel: bool, elem: int) -> float:
    """Bytes per token that one GPU keeps for the backward of ``layer`` under torchtitan's
    selective op checkpointing (:data:`EVERY_SECOND_MM`).

    torchtitan ``parallelize_llama.py`` at ``9dec370`` wraps each block in
    ``ptd_checkpoint_wrapper`` with a ``create_selective_checkpoint_contexts`` policy that returns
    ``MUST_SAVE`` for the ops of ``_save_list`` (``aten.mm`` but every second one,
    ``_scaled_dot_product_flash_attention`` / ``_efficient_attention``,
    ``_c10d_functional.reduce_scatter_tensor``, ``abs``, ``max``) and ``PREFER_RECOMPUTE`` for
    the rest. ``torch/utils/checkpoint.py``'s ``_CachingTorchDispatchMode`` stores the outputs of
    the saved ops in the forward and nothing else of the block; the non-reentrant checkpoint keeps
    the block's input for the recomputation. So a block keeps: its input (sharded over the
    sequence with sequence parallelism, else whole), the outputs of mms 1, 3, 5, ... (``wq``,
    ``wv``, ``w1``, ``w2`` of a SwiGLU block: a column-parallel one split over TP, a row-parallel
    one's output the whole unreduced partial sum), the SDPA output and its fp32 log-sum-exp (one per
    head and token), and under TP with sequence parallelism the two reduce-scatter outputs (of
    ``wo`` and ``w2``, split over TP). ``abs``/``max`` (Float8 scales) are one value per tensor:
    not counted. The count assumes linear layers without bias (``aten.mm``, not ``addmm``).

    Why it frees little under TP with sequence parallelism (review 11): ``w2`` is the 7th mm, so
    it is saved, and under DTensor's ``RowwiseParallel`` its mm output is the ``Partial(sum)``
    tensor before the reduce-scatter, ``h`` elements per token of the whole sequence, while the
    reduce-scatter's output (``h / tp``, sequence-sharded) is saved as well. torch's own selective
    checkpoint on torchtitan's block and TP plan stores exactly this count
    (``tests/data/sac_tp_saved.py``, torch 2.13 on CPU with the fake process group; checked in
    ``tests/test_review11_fixes.py``).

    Args:
        model: a dense model with separate Q, K and V projections.
        layer: the layer index.
        tp: the TP degree; ``sequence_parallel``: whether the block input and the reduce-scatter
            outputs are split over the sequence.
        elem: bytes per element of the compute dtype.

    Returns:
        Bytes per token (>= 0).
    """
    h, a = model.hidden_size, model.num_heads
    saved = sum(rows * (n / tp if k == h else n) for k, n, rows in _block_mms(model, layer)[0::2])
    sp = sequence_parallel and tp > 1
    inputs = h / tp if sp else h
    scatters = 2 * h / tp if sp else 0.0
    return elem * (inputs + saved + a * model.v_head_dim / tp + scatters) + 4.0 * a / tp


def stored_reduction(ctx, chunk, cache: dict) -> float:
    """Bytes by which a module list (``--recompute norm,mla_up``) shrinks one microbatch's stored
    activations of ``chunk`` under the per-operator model (``ctx``: :mod:`simtrain.costs.ops`'s
    ``_Ctx``): every rerun operator's outputs (:func:`simtrain.costs.layers._recomputable`) over
    the chunk's layers and tokens, split over TP as the stored count is, and the attention
    kernel's saved scores (or log-sum-exp) when the whole attention core is rerun.

    The base is ``recompute none``'s count (what ``compare`` sets for a module list); levels and
    ``full`` keep their own counts, so they give 0. Under ``kernels eager`` the eager block's
    saved tensors are not split per operator: 0 as well. :data:`EVERY_SECOND_MM` on top of
    ``none`` or ``selective`` (the published cases' setting) replaces that level's count of every
    layer (:func:`simtrain.costs.layers.stored_bytes_per_token`, eager or fused) by
    :func:`every_second_mm_stored_bytes`; on top of ``full`` it gives 0.

    Args:
        ctx: the per-operator context (model, parallel, attention kind, rerun names).
        chunk: a :class:`simtrain.costs.types.ChunkCosts` (its ``layers``).
        cache: a dict shared by the chunks of one model (layer shapes per dense/MoE kind).

    Returns:
        Bytes (>= 0) per microbatch on this GPU.
    """
    from .layers import FP8_CACHE_BYTES, layer_shape, stored_bytes_per_token

    rerun, parallel = ctx.recompute, ctx.parallel
    sac = EVERY_SECOND_MM in rerun and parallel.recompute != "full"
    if not sac and (parallel.recompute != "none" or not rerun or FULL in rerun):
        return 0.0
    replicated = 0.0 if parallel.sequence_parallel else 1.0 - 1.0 / parallel.tp
    per_token = 0.0
    for layer in chunk.layers:
        kind = ("stored", ctx.model.is_moe_layer(layer))
        if kind not in cache:
            ls = layer_shape(ctx.model, layer, ctx.seq, parallel.tp, ctx.elem,
                             FP8_CACHE_BYTES if parallel.activation_cache == "fp8" else None, parallel.kernels == "eager")
            if sac:
                drop = (stored_bytes_per_token(ls, parallel, ctx.attention == "unfused")
                        - every_second_mm_stored_bytes(ctx.model, layer, parallel.tp, parallel.sequence_parallel, ctx.elem))
            else:
                drop = sum(split / parallel.tp + shared * replicated
                           for name, (split, shared) in ls.recomputable.items() if name in rerun)
            if not sac and set(ATTENTION_CORE) <= rerun and ls.recomputable:
                drop += ls.score_bytes if ctx.attention == "unfused" else ls.lse_bytes
            cache[kind] = drop
        per_token += cache[kind]
    return per_token * ctx.tokens


def rerun_tp_collectives(ctx, chunk) -> tuple:
    """The TP collectives an I (or B) of ``chunk`` issues: ``chunk.tp_backward`` plus those
    :data:`EVERY_SECOND_MM` reruns. torchtitan's ``_save_list`` (``parallelize_llama.py`` at
    ``820504e``) saves ``_c10d_functional.reduce_scatter_tensor`` but not the all-gather, and the
    policy marks everything unsaved ``PREFER_RECOMPUTE``, which the compiled partitioner reruns as
    it does ``MUST_RECOMPUTE`` (``must_recompute`` in ``torch/_functorch/partitioners.py`` accepts
    both). With sequence parallelism the backward so reruns both all-gathers of each block: the
    gathered inputs of ``wq``/``wk``/``wv`` and of ``w1``/``w3`` feed the rerun ``wk`` and ``w3``
    and the weight gradients. Without it, it reruns the all-reduce after ``wo`` (mm 4, rerun),
    whose sum is the FFN norm's input. Each has the size of the forward's (``tp_forward``).

    Args:
        ctx: :mod:`simtrain.costs.ops`'s ``_Ctx`` (its ``recompute`` names and ``parallel``).
        chunk: a :class:`simtrain.costs.types.ChunkCost` as :mod:`simtrain.costs.stage` built it.

    Returns:
        A tuple of :class:`simtrain.network.Collective` (``chunk.tp_backward`` unchanged without
        TP or without :data:`EVERY_SECOND_MM`).
    """
    from dataclasses import replace

    if EVERY_SECOND_MM not in ctx.recompute or not chunk.tp_forward or not chunk.layers:
        return chunk.tp_backward
    forward = chunk.tp_forward[0]
    layers = len(chunk.layers)
    if ctx.parallel.sequence_parallel:
        return chunk.tp_backward + (replace(forward, op="all-gather", repeat=2 * layers),)
    return chunk.tp_backward + (replace(forward, op="all-reduce", repeat=layers),)
