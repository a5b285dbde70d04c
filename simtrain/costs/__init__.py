"""Cost model: seconds, FLOPs and bytes of each pipeline stage (model chunk) for one microbatch.

Everything here is per microbatch (``b`` sequences of ``s`` tokens) and per GPU of a TP group.

FLOPs (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters
Using Megatron-LM", §5.1 / Appendix; split into F, I, W as in Qi et al. 2024, "Zero Bubble
Pipeline Parallelism", Table 1): each linear layer of fan-in K and fan-out N costs ``2·K·N`` FLOPs
per token in the forward pass (F), the same again for the input gradient (I) and again for the
weight gradient (W). Attention scores (``Q·Kᵀ`` and ``softmax·V``) cost ``2·s·d`` FLOPs per token
each in F, twice that in I, and nothing in W (so for GPT: F = sbh(24h+4s), I = sbh(24h+8s),
W = sbh·24h, the Zero Bubble paper's Table 1). Durations divide each GEMM's FLOPs by the profile's
achieved FLOP/s for that linear layer's pass and shape, and attention's by the attention rate
(peak x efficiency unless calibrated). Calibrated profiles add memory-bound kernels (norms,
activation function, residual adds, the loss softmax, gradient accumulation over microbatches:
bytes moved / the measured bandwidth of their class) and scale every pass by the measured ratio of
a stage's actions inside real pipeline steps to the sum of their kernels (``layer_slowdown``: F; a
full backward B; and I and W as the runtime splits the backward, which may cost more than B).

Activation memory (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
Transformer Models", §4): the tensors each layer stores for its backward, counted element by
element so that GPT-3 reproduces the paper's ``sbh(34 + 5as/h)`` bytes per layer; divided by tp
under sequence parallelism, else all but the norm and first-GEMM inputs and dropout masks
(§4.2.1: ``sbh(10 + 24/t + 5as/(ht))``). ``selective`` recomputation drops the ``5as/h`` term,
``full`` stores only the layer input (``2sbh``). Memory that W still needs after I (Zero Bubble
Table 1, ``M_W`` = 32sbh for GPT): the input of every linear layer plus the gradient of its output.

Static memory per parameter (Rajbhandari et al. 2020, "ZeRO", §3.1): mixed-precision Adam keeps
a 16-bit parameter and gradient (2 + 2 bytes) and fp32 master weights, momentum and variance
(K = 12 bytes); ZeRO stage 1 divides the K bytes by the DP degree, stage 2 also the gradient and
stage 3 also the parameter (§5, :func:`~simtrain.costs.types.static_bytes_per_param`). In fp32 training the parameter
and gradient take 4 bytes each and the optimizer 8.

Tensor parallelism (Megatron-LM, Shoeybi et al. 2019; sequence parallelism, Korthikanti et al.
2022 §4.2.2) divides every weight matrix, FLOP and (with sequence parallelism) activation by tp
and adds, per layer, two all-gathers and two reduce-scatters of the ``s·b·h`` hidden states in F
and again in I (two all-reduces each without sequence parallelism).

Layers are split over stages as evenly as possible; when they do not divide evenly the extra
layers go to the middle stages first, since the first stage also holds the embedding and the last
the LM head and loss (the Llama 3 405B layout: 126 layers on 16 stages gives 7 layers to the first
and last stage and 8 to the others, Dubey et al. 2024 §3.3.2).

Multi-token prediction (``ModelSpec.mtp_depth``, DeepSeek-V3 §2.2): the MTP modules sit on the last
stage, their Transformer blocks as its layers ``num_layers + d`` and their norms, projection and
shared head as its own terms (:mod:`~simtrain.costs.mtp`).

Expert parallelism (ep > 1) is modelled in :mod:`simtrain.moe`: routed experts sharded over EP
instead of TP, the all-to-all bytes, and each MoE chunk cut into segments around its MoE blocks
(``ChunkCost.moe``).

The package: :mod:`~simtrain.costs.types` (ChunkCost, StageCosts), :mod:`~simtrain.costs.layers`
(per-token FLOPs and bytes of one layer's operators), :mod:`~simtrain.costs.stage` (a chunk's costs
as the sum of named per-layer terms plus the embedding / head terms).
"""

from __future__ import annotations

from .stage import split_layers, stage_costs
from .types import OPTIMIZER_BYTES_PER_PARAM, ChunkCost, StageCosts

__all__ = ["OPTIMIZER_BYTES_PER_PARAM", "ChunkCost", "StageCosts", "split_layers", "stage_costs"]
