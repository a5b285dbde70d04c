"""The FP8 quantization that every FP8 GEMM's inputs need under ``--fp8 gemms``: the ``fp8_cast``
operator of the per-operator model (:mod:`simtrain.costs.ops`), memory-bound.

What runs, from Transformer Engine's current scaling (Megatron-Bridge's ``fp8_cs`` recipes:
``Float8CurrentScalingQuantizer::quantize_impl``, NVIDIA/TransformerEngine
``transformer_engine/pytorch/csrc/quantizer.cpp``, commit ad3f651f1dad676dac5109ac20d525f54650d88d):
per tensor, ``nvte_compute_amax`` (reads the tensor), ``nvte_compute_scale_from_amax`` (one scalar)
and ``nvte_quantize_v2`` with row-wise and column-wise outputs (TE's cast-transpose: reads the
tensor once, writes the FP8 copy and its FP8 transpose). With ``e`` bytes per element of the
compute dtype that is ``e + e + 1 + 1 = 2e + 2`` bytes per element (6 for BF16; the per-tensor
scales are a few bytes) and 3 kernels per tensor. For ``Y[m,n] = X[m,k] W[k,n]``:

* F quantizes the input ``X`` (``m k`` elements; its transpose serves W's ``dW = Xᵀ dY``) and
  the weight ``W`` (``k n``; its transpose serves I's ``dX = dY Wᵀ``). The weight's FP8 copy is
  made on the first microbatch of a step and reused by the others (Megatron-Core's ``TELinear``
  passes ``is_first_microbatch``, NVIDIA/Megatron-LM ``megatron/core/extensions/transformer_engine.py``,
  commit d086a2e3b020ff78db9d29915f7cfe886e085f13), so a microbatch carries ``1 / microbatches``
  of it, bytes and kernels;
* I quantizes the output gradient ``dY`` (``m n``; its transpose serves W's ``dW``);
* W quantizes nothing (both its operands' transposes were made above).

DeepSeek-V3 (arXiv:2412.19437, §3.3.1-§3.3.2) quantizes activations per 1 x 128 tile and weights
per 128 x 128 block, and re-quantizes the backward's transposed operands; its kernels are not
public, so the same count stands for them: per-tile scaling computes each tile's amax inside the
cast kernel, so this count's amax read (``e`` bytes per element) is an upper bound there.

GEMMs that stay in the compute dtype (attention, the MoE router, the LM head) get no cast.
"""

from __future__ import annotations

FP8_CAST = "fp8_cast"
"""Operator name of the FP8 quantization in ``--breakdown``."""
FP8_ELEM_BYTES = 1
"""Bytes per FP8 element (E4M3 / E5M2)."""
KERNELS_PER_TENSOR = 3
"""amax, scale, cast-transpose (``quantize_impl``)."""


def cast_bytes_per_element(elem: int) -> int:
    """HBM bytes per element of one tensor's quantization: amax read ``elem``, cast-transpose read
    ``elem`` and two FP8 writes (module docstring): 6 for BF16."""
    return 2 * elem + 2 * FP8_ELEM_BYTES


def fp8_cast(ctx, gemms) -> object:
    """The ``fp8_cast`` operator of FP8 GEMMs ``gemms`` for one microbatch on one GPU.

    Args:
        ctx: the per-operator context (:class:`simtrain.costs.ops._Ctx`: ``elem``, ``parallel.microbatches``).
        gemms: ``(rows, k, n, weights)`` per FP8 GEMM call: ``X[rows, k]``, ``dY[rows, n]`` and
            ``weights`` weight matrices ``[k, n]`` (a grouped GEMM's experts; 1 for a linear layer).

    Returns:
        A memory-bound :class:`simtrain.costs.ops.OpCost` with F bytes ``c (X + W / microbatches)``,
        I bytes ``c dY`` (``c`` = :func:`cast_bytes_per_element`) and its kernels
        (3 per tensor; the weights' 3 per ``microbatches``).
    """
    from .ops import _memory

    c, mb = cast_bytes_per_element(ctx.elem), ctx.parallel.microbatches
    x = sum(rows * k for rows, k, _, _ in gemms)
    w = sum(weights * k * n for _, k, n, weights in gemms)
    dy = sum(rows * n for rows, _, n, _ in gemms)
    op = _memory(FP8_CAST, c * (x + w / mb), c * dy, ctx)
    t = KERNELS_PER_TENSOR * len(gemms)
    return type(op)(op.name, op.flops, op.bytes, op.seconds, op.bound, (t + t / mb, t, 0.0))
