"""CUDA kernels per operator and the host's share of a pass: the ``launch`` row of the per-operator
model (:mod:`simtrain.costs.ops`). Each operator of a layer launches :data:`KERNELS` kernels per
pass (operators in :data:`OWN_KERNELS` count their own); the host issues them one after another at
``host_per_kernel_s`` each (``op_data.yaml``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .cp_merge import CP_MERGE
from .expert_epilogue import EXPERT_BIAS, EXPERT_CLAMP
from .fp8 import FP8_CAST
from .unfused import BIAS_ADD, ROTARY

if TYPE_CHECKING:
    from .ops import OpCost

KERNELS = {
    "gemm": (1, 1, 1), "attn_scores": (1, 2, 0), "attn_context": (1, 2, 0), "softmax": (1, 1, 0),
    "attn_dropout": (1, 1, 0), "attention": (1, 3, 0), "norm": (2, 6, 0), "residual": (2, 2, 0),
    "dropout": (2, 2, 0), "activation": (1, 1, 0), "rotary": (2, 2, 0), "embedding": (1, 1, 0),
    "head:norm": (1, 3, 0), "head:cross_entropy": (6, 3, 0),
    "router_topk": (3, 3, 0), "permute": (1, 1, 0), "unpermute": (1, 2, 0), "expert_activation": (1, 1, 0),
    "grad_sum": (0, 1, 0),
}
"""CUDA kernels per operator per layer in F, I and W, counted from Megatron-LM's transformer
layer with its fused kernels (``megatron/model/transformer.py``, ``fused_softmax.py``,
``fused_bias_gelu.py``, ``fused_layer_norm.py``, ``tensor_parallel/cross_entropy.py``): a linear
layer is one GEMM per pass (bias added in its epilogue); the unfused attention is one
strided-batched GEMM per product in F and two in I; the scale-mask-softmax, the GeLU and each
dropout one kernel per pass; apex's LayerNorm one kernel forward and three backward (input
gradient, partial and final gamma/beta gradients), two norms per layer; two residual adds (and
their two gradient sums); FlashAttention-2 one forward and three backward kernels (pre-process,
backward, dQ conversion; ``flash_attn/flash_attn_interface.py``); the vocabulary-parallel
cross-entropy six forward kernels (max, subtract, exp, sum, log, target gather) and three backward.
MoE (Megatron-Core ``TopKRouter`` and ``moe_utils``): the router's scoring, top-k and weight
normalisation three kernels per pass; permute one gather (its backward one scatter-add); unpermute
one weighted sum forward, two backward (input and routing-weight gradients); the routed experts'
activation one per pass; a grouped GEMM one kernel per pass; separate projections' input-gradient
sum one kernel in I per row (:mod:`simtrain.costs.projections`). Every other name (GEMMs) counts as ``gemm``."""


def _kernels(name: str) -> tuple[int, int, int]:
    """:data:`KERNELS` of operator ``name`` (GEMMs by default)."""
    return KERNELS.get(name, KERNELS.get(name.removeprefix("head:"), KERNELS["gemm"]))


def _launch(ops: list, ctx) -> OpCost:
    """The host's share of a chunk's passes: each pass issues its kernels one after another, each
    costing the host ``host_per_kernel_s`` (eager dispatch + CUDA launch, ``op_data.yaml``).

    * asynchronous launches (the default): the GPU cannot end a pass before its last kernel was
      issued, so a pass lasts at least ``kernels x host_per_kernel_s``; the row is the excess
      over the kernels' own seconds (0 when the GPU is the bottleneck, as for large layers);
    * ``launch_blocking`` (``CUDA_LAUNCH_BLOCKING=1``): every launch waits for its kernel, so
      the host time adds to every kernel: ``kernels x host_per_kernel_s``.

    Args:
        ops: the chunk's :class:`~simtrain.costs.ops.OpCost` rows (kernels and seconds per pass).
        ctx: the run's per-operator context (host rate, ``launch_blocking``, ``host_bound``).

    Returns:
        The ``launch`` row: host seconds per pass beyond the GPU's, and the kernels summed.
    """
    from .ops import OpCost  # here: ops imports this module

    host = ctx.rates.host_per_kernel_s
    kernels = tuple(sum(o.kernels[p] for o in ops) for p in range(3))
    busy = tuple(sum(o.seconds[p] for o in ops) for p in range(3))
    if ctx.parallel.launch_blocking:
        secs = tuple(k * host for k in kernels)
    elif not ctx.host_bound:  # a lower bound (simtrain.plan): no excess, so sums over layers stay below
        secs = (0.0, 0.0, 0.0)
    else:
        secs = tuple(max(0.0, k * host - b) for k, b in zip(kernels, busy))
    return OpCost("launch", (0.0,) * 3, (0.0,) * 3, secs, "host", kernels)


OWN_KERNELS = (FP8_CAST, EXPERT_CLAMP, EXPERT_BIAS, ROTARY, BIAS_ADD, CP_MERGE, "expert_up", "expert_down")
"""Operators whose :class:`~simtrain.costs.ops.OpCost` carries its own kernel count (it depends on
the shape or the code path: quantized tensors, local experts, fused or not;
:mod:`simtrain.costs.unfused`), kept as built instead of :data:`KERNELS`."""
