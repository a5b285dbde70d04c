"""Multi-token prediction (MTP): the modules DeepSeek-V3 trains next to its main model, priced on the
last pipeline stage (``ModelSpec.mtp_depth``).

DeepSeek-V3 report (arXiv:2412.19437) §2.2, Eq. 21-25: MTP module ``k`` (of ``D``; ``D = 1`` in
DeepSeek-V3, §4.2) takes the hidden state ``h^{k-1}`` of every position from the previous depth
(the main model's last layer for ``k = 1``) and the embedding of the token ``k`` positions ahead
from the *shared* embedding, RMS-normalises each, concatenates them and projects the ``2h``
values back to ``h`` (``M_k``), runs one Transformer block ``TRM_k`` and predicts through the
*shared* output head, with its own cross-entropy loss (weighted by lambda, a scalar). The module
layout and the head's own final RMSNorm follow vLLM's ``DeepSeekMultiTokenPredictorLayer``
(``vllm/model_executor/models/deepseek_mtp.py``: ``enorm``, ``hnorm``, ``eh_proj`` without bias,
``mtp_block``, ``shared_head`` = norm + head). §3.2.3: with DualPipe the shallowest layers (with
the embedding) and the deepest (with the output head) sit on the same pipeline rank, so the MTP
modules and the main model share the embedding and output head physically, parameters and
gradients; other schedules keep a copy of the embedding on the last stage whose gradient is
all-reduced with the first stage's, as for tied embeddings (Megatron-Core's MTP does this).

What simtrain prices, per module, for one microbatch of ``T`` tokens on one of ``tp`` GPUs:

* the Transformer block: a layer of the chunk (index ``num_layers + d``, of the deepest layers'
  kind: an MoE layer with its dispatch and combine in DeepSeek-V3), costed, stored and counted as
  every other layer (:func:`simtrain.costs.stage_costs`);
* ``mtp:embedding``: the lookup of the shifted tokens (as the main embedding's);
* ``mtp:norm``: the two RMSNorms over ``h`` (F reads and writes ``2 h`` values each, the backward
  ``3 h``);
* ``mtp:proj``: the GEMM ``[T, 2h] x [2h, h]`` (``2 x 2h x h`` FLOPs per token per pass, F, I and
  W), a linear layer: FP8 under ``--fp8 gemms`` (DeepSeek-V3 §3.3.1 keeps only the embedding,
  the output head, the MoE gating, the norms and attention in BF16/FP32), with its ``mtp:fp8_cast``;
  row-parallel over TP (no TP collective of its own is declared);
* ``mtp:head_norm``, ``mtp:lm_head``, ``mtp:cross_entropy``: the shared head, as the main head
  (its GEMM in the compute dtype).

Parameters per module: ``3 h`` norm weights and the ``2 h^2`` projection besides the block
(:meth:`simtrain.models.ModelSpec.mtp_module_params`); optimizer states, gradients and the DP
reduction follow from them as for every parameter. Stored activations: the block's as a layer's,
plus the norms' and the projection's inputs (``2h`` each) and the head's (norm input, fp32
logits). MFU counts the modules' FLOPs as model FLOPs (they are trained, forward and backward, on
every token: Eq. 25's loss), the embedding lookup none. Not modelled: the concatenation (a copy of
``2h`` values, folded into the projection's input), the lambda-scaling of the loss.
"""

from __future__ import annotations

import dataclasses

from .fp8 import fp8_cast

MTP_INPUT = ("mtp:embedding", "mtp:norm", "mtp:proj", "mtp:fp8_cast")
"""The operators of an MTP module that run before its Transformer block (the rest, the shared
head's, after it)."""
_KERNELS_AS = {"mtp:embedding": "embedding", "mtp:norm": "norm", "mtp:head_norm": "head:norm",
               "mtp:cross_entropy": "head:cross_entropy"}
"""The operator whose :data:`simtrain.costs.ops.KERNELS` each MTP operator launches (GEMMs by default)."""


def mtp_ops(ctx) -> list:
    """The MTP modules' own operators (module docstring) for one microbatch on one GPU, summed
    over the ``mtp_depth`` modules, kernels counted.

    Args:
        ctx: the per-operator context (:class:`simtrain.costs.ops._Ctx`).

    Returns:
        :class:`simtrain.costs.ops.OpCost` rows named ``mtp:...``; empty without MTP.
    """
    from .ops import _gemm, _head_ops, _kernels, _memory

    m = ctx.model
    if not m.mtp_depth:
        return []
    h, e, tp, rows = m.hidden_size, ctx.elem, ctx.parallel.tp, ctx.row_tokens
    ops = [_memory("mtp:embedding", 2 * e * h * rows, 3 * e * h * rows, ctx),
           _memory("mtp:norm", 2 * 2 * e * h * rows, 2 * 3 * e * h * rows, ctx),
           _gemm("mtp:proj", ctx.tokens, 2 * h / tp, h, ctx)]
    ops = [dataclasses.replace(o, kernels=_kernels(_KERNELS_AS.get(o.name, "gemm"))) for o in ops]
    if ctx.gemm_dtype == "fp8":
        ops.append(dataclasses.replace(fp8_cast(ctx, [(ctx.tokens, 2 * h / tp, h, 1)]), name="mtp:fp8_cast"))
    for o in _head_ops(ctx):
        name = {"head:norm": "mtp:head_norm"}.get(o.name, o.name.replace("head:", "mtp:"))
        ops.append(dataclasses.replace(o, name=name, kernels=_kernels(_KERNELS_AS.get(name, "gemm"))))
    return [o.scaled(m.mtp_depth) for o in ops]


def is_mtp_layer(model, layer: int) -> bool:
    """Whether ``layer`` is an MTP module's Transformer block (index ``num_layers`` or above)."""
    return layer >= model.num_layers
