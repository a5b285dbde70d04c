"""Linear layers that read one input: one fused GEMM, or one GEMM each
(``ParallelConfig.fused_projections``).

Megatron-Core fuses an attention block's Q, K and V projections into ``linear_qkv`` and a gated
FFN's gate and up projections into ``linear_fc1``: one GEMM each. torchtitan's Llama runs them as
separate ``nn.Linear`` layers on the same input (``torchtitan/models/llama3/model.py`` at
``820504e``: ``xq, xk, xv = self.wq(x), self.wk(x), self.wv(x)`` and
``self.w2(F.silu(self.w1(x)) * self.w3(x))``; ``models/llama/model.py`` at ``9dec370`` alike).
Two costs differ from the fused layer:

* each GEMM is priced at its own shape (:func:`simtrain.costs.ops._gemm`: the kernel table's
  rate and the roofline). Under TP 8, Llama 3's ``wk`` and ``wv`` (8 KV heads x 128) are
  ``N = 128`` GEMMs, which read the whole ``K = h`` input for a sixth of the work of the
  768-wide fused one;
* autograd sums the input gradients of the ``n`` layers sharing the input, where the fused
  layer's data-gradient GEMM yields the sum itself. Compiled (``torch.compile``: inductor fuses
  the adds of the extern GEMMs' outputs into one pointwise kernel) it reads ``n`` gradients and
  writes one, ``n + 1`` tensors of ``rows x k`` elements; eager (``kernels: eager``) the autograd
  engine adds each further gradient into its input buffer (``InputBuffer::accumulate``,
  ``torch/csrc/autograd/input_buffer.cpp``), a kernel reading two tensors and writing one for
  each of the ``n - 1`` further gradients.

The FP8 casts (:func:`simtrain.costs.fp8.fp8_cast`) keep the fused layer's shapes: torchao casts
each layer's input, and the identical casts of one input are one after ``torch.compile``'s CSE.
"""

from __future__ import annotations

from ..models import ModelSpec

GRAD_SUM = "grad_sum"
"""The operator summing the input gradients of separate projections (one kernel per pass I)."""


def projection_widths(model: ModelSpec, name: str, n: float, layer: int) -> tuple[float, ...]:
    """Output widths of the separate linear layers that fused operator ``name`` of output width
    ``n`` in ``layer`` stands for: Q, K and V for ``qkv`` (not MLA), gate and up for a SwiGLU
    ``ffn_up`` of a dense layer; ``(n,)`` for any other (one layer; an MoE layer's FFN operators
    are :mod:`simtrain.costs.moe_ops`'s, its experts' GEMMs as they price them). Units: elements
    per token."""
    if name == "qkv" and model.mla is None:
        return (model.num_heads * model.q_head_dim, model.kv_heads * model.q_head_dim,
                model.kv_heads * model.v_head_dim)
    if name == "ffn_up" and model.activation == "swiglu" and not model.is_moe_layer(layer):
        return (n / 2, n / 2)
    return (n,)


def projection_ops(ctx, name: str, layer: int, rows: float, k: float, n: float) -> list:
    """The operators of linear layer ``name`` of transformer ``layer`` on this GPU:
    ``Y[rows, n] = X[rows, k] W[k, n]`` with ``n`` this TP rank's output width (elements).

    Args:
        ctx: :mod:`simtrain.costs.ops`'s ``_Ctx`` (model, parallel settings, rates, HBM rate).
        name: the operator (``qkv``, ``ffn_up``, ...); ``layer`` its layer index; ``rows`` its
            tokens (times the FFN's multiplicity), ``k`` and ``n`` its fan-in and fan-out on this
            rank.

    Returns:
        A list of ``OpCost``: the one GEMM with ``fused_projections`` (or a single layer);
        otherwise one GEMM per separate layer, named ``name`` (the column split over TP applies to
        each alike), then the :data:`GRAD_SUM` kernels of I (module docstring), all for one
        microbatch of one layer.
    """
    from .ops import _gemm, _memory

    widths = projection_widths(ctx.model, name, n, layer)
    if ctx.parallel.fused_projections or len(widths) == 1:
        return [_gemm(name, rows, k, n, ctx)]
    total = sum(widths)
    ops = [_gemm(name, rows, k, n * w / total, ctx) for w in widths]
    tensor = ctx.elem * rows * k  # one input gradient, bytes
    if ctx.parallel.kernels == "eager":
        return ops + [_memory(GRAD_SUM, 0.0, 3 * tensor, ctx) for _ in widths[1:]]
    return ops + [_memory(GRAD_SUM, 0.0, (len(widths) + 1) * tensor, ctx)]
