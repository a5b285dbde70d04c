"""Code paths that run as several kernels where the per-operator model's default counts one fused
kernel (:mod:`simtrain.costs.ops`), each switched by a :class:`simtrain.parallel.ParallelConfig`
field and priced from the public code it names (memory-bound bytes at the profile's streaming
rate, GEMMs at the GEMM table's rate for their own shape):

* ``rope_fusion: false``: Megatron-Core's unfused rotary embedding
  (``megatron/core/models/common/embeddings/rope_utils.py`` ``_apply_rotary_pos_emb_bshd`` at
  tag core_v0.17.0), called once for the queries and once for the keys
  (``transformer/attention.py``). Per call, on the ``[s, 1, 1, d]`` fp32 frequencies:
  ``cos``, ``* mscale``, ``.to(dtype)`` and the same for ``sin`` (six kernels, 4 + 4, 4 + 4 and
  4 + 2 bytes per element each); per element of the rotated tensor (``e`` its element size):
  ``t * cos`` (2e), ``_rotate_half``'s ``-x2`` (one half: e) and ``cat((-x2, x1))`` (2e),
  ``* sin`` (2e), the sum (3e) and the closing ``cat((t, t_pass))`` (2e): 12e and six kernels
  against the fused kernel's 2e. Autograd's backward: the two products' input gradients (2e each),
  the negation (e), the ``chunk``'s gradient joined again (2e) and the two paths' gradients summed
  (3e): 10e, five kernels (the ``cat``s' backwards are views; the frequencies need no gradient).
  Megatron-Bridge turns the fusion off for YaRN (``src/megatron/bridge/utils/fusions.py``
  ``validate_rope_fusion_compatibility``: only ``position_embedding_type == "rope"``, called by
  ``GPTModelProvider.provide``, tag v0.4.2), and ``apply_rotary_pos_emb`` takes the unfused path
  for any ``mscale != 1`` as well. MLA's de-interleaving ``cat`` is not counted.
* ``bias_dropout_fusion: false`` on a model with biases: Megatron-Core's unfused bias-dropout-add
  (``megatron/core/fusions/fused_bias_dropout.py`` ``_bias_dropout_add_func``) adds the bias in
  its own kernel, ``x = x + bias`` (reads and writes ``e`` per element of the ``[rows, h]``
  output: 2e, one kernel), before the residual add that ``residual`` prices; dropout with
  ``p = 0`` launches nothing (ATen ``dropout`` returns its input). Its backward is the fused one's
  (the gradient passes through; the bias gradient's row sum is in both). A dense layer has two
  such biases (the attention and MLP output projections, built with ``skip_bias_add``); an MoE
  layer one: ``TEGroupedMLP`` adds its experts' biases itself and returns none
  (``transformer/moe/experts.py``; :mod:`simtrain.costs.expert_epilogue`).
* ``expert_gemm: multi-stream``: Transformer Engine's ``GroupedLinear`` (tag v2.14:
  ``pytorch/module/grouped_linear.py`` calls ``general_grouped_gemm`` for the forward, the
  input gradient and the weight gradient; ``pytorch/csrc/extensions/gemm.cpp``
  ``te_general_grouped_gemm`` -> ``nvte_multi_tensor_gemm``, which on Hopper without
  ``NVTE_USE_CUTLASS_GROUPED_GEMM`` runs ``multi_stream_cublas_gemm`` in
  ``common/gemm/cublaslt_gemm.cu``: one cuBLASLt GEMM per group, round-robin on
  ``num_compute_streams = 4`` streams, ``common/util/multi_stream.cpp``). Each local expert's
  GEMM is priced at its own ``(rows, k, n)`` single-GEMM rate (the table's batch 1) and launches
  one kernel. Bound chosen: no credit for the four streams' concurrency (no public kernel-level
  measurement of it on Hopper was found), so this prices the experts' GEMMs at the upper end of
  their time; perfect concurrency would reach at most the table's batched rate of up to four
  GEMMs, which ``grouped`` prices (:func:`expert_gemm_batch`).
"""

from __future__ import annotations

ROTARY = "rotary"
BIAS_ADD = "bias_add"
ROTARY_FUSED_BYTES = (2, 2)
"""Fused rotary HBM bytes per rotated element, in units of ``e``, F and I (read and write once)."""
ROTARY_UNFUSED_BYTES = (12, 10)
"""Megatron-Core's unfused rotary, bytes per rotated element in units of ``e``, F and I."""
ROTARY_UNFUSED_KERNELS = (12, 5)
"""Its kernels per rotated tensor (queries, keys), F and I (six of them on the frequencies)."""
FREQ_BYTES_PER_ELEMENT = 4 + 4 + 4 + 4 + 4 + 2
"""Bytes per fp32 frequency element of one call's ``cos``/``sin``, ``* mscale``, ``.to`` (x 2)."""
BIAS_ADD_BYTES = 2
"""The unfused ``x + bias``: bytes per output element in units of ``e`` (F only)."""


def rotary(ctx, elements: float) -> object:
    """One layer's rotary embedding on ``elements`` query and key elements (this GPU's share).

    Args:
        ctx: the :class:`simtrain.costs.ops._Ctx` of the run (``parallel.rope_fusion``).
        elements: rotated elements of the layer's queries and keys together.

    Returns:
        The ``rotary`` :class:`simtrain.costs.ops.OpCost` with its kernels (two tensors): fused,
        F and I ``2e`` per element; unfused, the counts of the module docstring.
    """
    from .launch import KERNELS
    from .ops import _memory

    e = ctx.elem
    if ctx.parallel.rope_fusion:
        f, i = (b * e * elements for b in ROTARY_FUSED_BYTES)
        return _memory(ROTARY, f, i, ctx, kernels=KERNELS[ROTARY])
    m = ctx.model
    dim = m.mla.qk_rope_head_dim if m.mla else m.q_head_dim
    freqs = 2 * FREQ_BYTES_PER_ELEMENT * (ctx.tokens / ctx.parallel.microbatch_size) * dim  # two calls
    f, i = (b * e * elements for b in ROTARY_UNFUSED_BYTES)
    kf, ki = (2.0 * k for k in ROTARY_UNFUSED_KERNELS)
    return _memory(ROTARY, f + freqs, i, ctx, kernels=(kf, ki, 0.0))


def bias_add(ctx, moe_layer: bool) -> list:
    """The unfused bias-dropout-add's bias kernels of one layer (module docstring).

    Args:
        ctx: the per-operator context (``model.bias``, ``parallel.bias_dropout_fusion``).
        moe_layer: whether the layer is an MoE layer (one biased output projection, else two).

    Returns:
        ``[bias_add]`` (an :class:`simtrain.costs.ops.OpCost`, F bytes only, one kernel per
        bias), or ``[]`` with the fusion on or a model without biases.
    """
    from .ops import _memory

    if ctx.parallel.bias_dropout_fusion or not ctx.model.bias:
        return []
    count = 1 if moe_layer else 2
    nbytes = count * BIAS_ADD_BYTES * ctx.elem * ctx.row_tokens * ctx.model.hidden_size
    return [_memory(BIAS_ADD, nbytes, 0.0, ctx, kernels=(float(count), 0.0, 0.0))]


def expert_gemm_batch(parallel, groups: int) -> tuple[int, float]:
    """How the ``groups`` local experts' GEMMs of one pass are rated and launched.

    Args:
        parallel: the run's :class:`simtrain.parallel.ParallelConfig` (``expert_gemm``).
        groups: local experts (GEMMs per pass).

    Returns:
        ``(batch, kernels)``: the GEMM table's batch axis to rate each expert's GEMM at
        (``groups``, clamped by the table, for ``grouped``; 1 for ``multi-stream``) and the
        kernels each grouped GEMM launches per pass (1; ``groups``).
    """
    return (groups, 1.0) if parallel.expert_gemm == "grouped" else (1, float(groups))
