"""Frozen weights and LoRA adapters (``--trainable``).

A frozen parameter needs no weight gradient: its layer runs no W pass (the ``dW = dYᵀ X`` GEMMs),
stores nothing for one (``M_W`` of Zero Bubble Table 1), keeps no gradient and no optimizer state
(2 bytes per parameter instead of 16 in mixed-precision Adam) and is not reduced over DP. The input
gradient (I) still runs, since layers below may train.

LoRA (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models", §4.1): every linear
layer ``W`` (fan-in K, fan-out N) is frozen and gains a trainable pair ``A`` (K x r) and ``B``
(r x N), ``Y = X Wᵀ + X Aᵀ Bᵀ``: ``r (K + N)`` parameters and ``2 r (K + N)`` FLOPs per token in
each of F, I and W (the adapter's two small GEMMs, counted like any linear layer, Narayanan et al.
2021 §5.1), sharded over TP like the layer they adapt; F stores the ``r``-wide intermediate for
the backward. The embedding and LM head are frozen too (PEFT's default target modules are the
linear layers of the transformer blocks).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import SimtrainError
from ..hardware import HardwareProfile
from ..models import ModelSpec
from ..parallel import ParallelConfig
from .layers import gemm_seconds, linear_layers


@dataclass(frozen=True)
class Adapter:
    """The LoRA adapters of one layer for one microbatch on one GPU.

    Attributes:
        params: adapter parameters on this GPU.
        flops: forward FLOPs (the same again in I and in W).
        forward_s, backward_input_s, backward_weight_s: seconds of the adapter GEMMs per pass.
        activation_bytes: the stored ``r``-wide intermediates.
    """

    params: float = 0.0
    flops: float = 0.0
    forward_s: float = 0.0
    backward_input_s: float = 0.0
    backward_weight_s: float = 0.0
    activation_bytes: float = 0.0


def check_trainable(model: ModelSpec, parallel: ParallelConfig) -> None:
    """Refuse a ``--trainable`` setting the model cannot have.

    Raises:
        SimtrainError: frozen layers beyond the model's layers, or LoRA / frozen layers on an MoE
            model (not modelled).
    """
    if parallel.trainable == "all":
        return
    if model.moe is not None:
        raise SimtrainError(f"--trainable {parallel.trainable}: frozen weights are not modelled for MoE models "
                            f"({model.name}); use --trainable all")
    beyond = sorted(x for x in parallel.frozen_layers if x >= model.num_layers)
    if beyond:
        raise SimtrainError(f"--trainable {parallel.trainable}: layer {beyond[0]} does not exist; {model.name} has "
                            f"layers 0-{model.num_layers - 1}")


def is_frozen(parallel: ParallelConfig, layer: int) -> bool:
    """Whether ``layer``'s own weights are frozen (all layers under LoRA)."""
    return parallel.lora_rank > 0 or layer in parallel.frozen_layers


def layer_adapter(model: ModelSpec, layer: int, parallel: ParallelConfig, tokens: float,
                  hardware: HardwareProfile) -> Adapter:
    """The :class:`Adapter` of ``layer`` for ``tokens`` tokens (empty without LoRA)."""
    r, tp, h = parallel.lora_rank, parallel.tp, model.hidden_size
    if r == 0:
        return Adapter()
    gemms = [g for k, n, m in linear_layers(model, layer) for g in ((k, r, m), (r, n, m))]
    f, i, w = gemm_seconds(gemms, tokens, tp, h, hardware, parallel.dtype)
    per_token = sum(2 * m * k * n for k, n, m in gemms) / tp
    params = sum(r * (k + n) for k, n, _ in linear_layers(model, layer)) / tp
    inter = sum(m * r for _, _, m in linear_layers(model, layer)) * parallel.dtype_bytes / tp
    return Adapter(params, per_token * tokens, f, i, w, inter * tokens)
