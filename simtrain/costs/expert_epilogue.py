"""The routed experts' eager element-wise work that Megatron-Core runs around its grouped GEMMs and
fused activation kernel, priced as memory-bound operators (HBM bytes at the profile's streaming
rate, :func:`simtrain.costs.ops._memory`) on the ``R`` token-expert rows of a GPU:

* ``expert_clamp`` (:attr:`simtrain.models.MoESpec.activation_clamp` set; GPT-OSS 7.0):
  ``weighted_bias_quick_geglu_impl`` (Megatron-LM ``megatron/core/fusions/fused_bias_geglu.py``
  at tag core_v0.17.0) clamps the gate half (``x_glu.clamp(max=c)``) and the linear half
  (``x_linear.clamp(-c, c)``) of the first grouped GEMM's ``[R, 2f]`` output as two eager
  kernels and joins them with ``torch.cat`` before its fused GLU kernel (which
  ``expert_activation`` prices). F: each clamp reads and writes ``f`` elements, the cat ``2f``:
  ``8 f e`` bytes a row. I (autograd): the cat's backward is a view; each clamp's backward
  (``where(in range, grad, 0)``) reads the gradient and its saved input and writes ``f``
  (``3 f e`` each); the two halves' gradients are joined again (the ``chunk``'s backward, a cat
  of ``2f``: ``4 f e``): ``10 f e``. Three kernels per pass. Recomputing the activation
  (``expert_activation``, Megatron-Core's ``moe_act``) reruns the clamps too: ``TEGroupedMLP``
  checkpoints the whole ``bias_act_func`` (``megatron/core/transformer/moe/experts.py``).
* ``expert_bias`` (:attr:`simtrain.models.ModelSpec.bias` on an MoE model): the second grouped
  GEMM is built with ``skip_bias_add=True`` and ``TEGroupedMLP._apply_bias`` adds each of the
  ``G`` local experts' bias scaled by the routing weight in a Python loop, ``t + b * p`` per
  expert, then ``torch.cat`` (``experts.py`` at core_v0.17.0). Per element of the ``[R, h]``
  output: F ``b * p`` writes ``e``, the add reads ``2e`` and writes ``e``, the cat reads and
  writes ``e``: ``6 e``; I the gradient of ``b`` (``grad * p``, then a sum over the expert's
  rows: ``3 e``) and of ``p`` (``grad * b``, then a sum over ``h``: ``3 e``): ``6 e``. Kernels:
  F ``2G + 1``, I ``4G``. The routing weights are taken in the compute dtype (the router runs in
  its input's dtype unless ``moe_router_dtype`` is fp32, ``megatron/core/transformer/moe/router.py``);
  fp32 weights would promote the products to fp32 and move more bytes, so this is a lower bound.
  The first grouped GEMM's bias is added inside TE's ``GroupedLinear`` (``skip_bias_add=False``)
  and costs nothing here.

Neither term counts the tensors it stores for the backward (activation memory is unchanged).
"""

from __future__ import annotations

EXPERT_CLAMP = "expert_clamp"
EXPERT_BIAS = "expert_bias"
CLAMP_BYTES_PER_ELEMENT = (8, 10)
"""``expert_clamp`` HBM bytes per element of one ``[R, f]`` half, in units of the element size
``e``, for F and I (module docstring)."""
BIAS_BYTES_PER_ELEMENT = (6, 6)
"""``expert_bias`` HBM bytes per element of the ``[R, h]`` output, in units of ``e``, F and I."""


def epilogue_ops(ctx, rows: float, width: float, groups: int) -> list:
    """The eager element-wise operators around one MoE layer's routed experts on one GPU.

    Args:
        ctx: the :class:`simtrain.costs.ops._Ctx` of the run (model, element size, HBM rate).
        rows: token-expert rows ``R`` the GPU's experts run (the most loaded rank's count).
        width: columns of one half of the gated first GEMM's output on this GPU (``f / split``).
        groups: local experts ``G`` (one ``t + b * p`` pair of kernels each).

    Returns:
        ``expert_clamp`` if the experts' gated activation is clamped, ``expert_bias`` if the
        model's linear layers carry biases; each a :class:`simtrain.costs.ops.OpCost` with its
        own kernel count (``simtrain.costs.launch.OWN_KERNELS``). Empty for neither.
    """
    from .ops import _memory

    m, e = ctx.model, ctx.elem
    ops = []
    if m.moe.activation_clamp is not None:
        f_b, i_b = (x * e * rows * width for x in CLAMP_BYTES_PER_ELEMENT)
        ops.append(_memory(EXPERT_CLAMP, f_b, i_b, ctx, kernels=(3.0, 3.0, 0.0)))
    if m.bias:
        f_b, i_b = (x * e * rows * m.hidden_size for x in BIAS_BYTES_PER_ELEMENT)
        ops.append(_memory(EXPERT_BIAS, f_b, i_b, ctx, kernels=(2.0 * groups + 1, 4.0 * groups, 0.0)))
    return ops
