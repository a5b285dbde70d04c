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

import functools
from collections.abc import Callable
from dataclasses import dataclass, replace

from ..errors import SimtrainError
from ..hardware import HardwareProfile
from ..models import ModelSpec
from ..parallel import ParallelConfig, flag_name
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


def check_trainable(model: ModelSpec, parallel: ParallelConfig,
                    name: Callable[[str, object], str] = flag_name) -> None:
    """Refuse a ``--trainable`` setting the model cannot have.

    Args:
        model, parallel: the model and its settings.
        name: how a message names a setting, from its field and value (default: the flag,
            ``--trainable lora:8``; :func:`simtrain.costs.stage.check_settings`).

    Raises:
        SimtrainError: frozen layers beyond the model's layers, or LoRA / frozen layers on an MoE
            model (not modelled).
    """
    if parallel.trainable == "all":
        return
    if model.moe is not None:
        raise SimtrainError(f"{name('trainable', parallel.trainable)}: frozen weights are not modelled for MoE models "
                            f"({model.name}); use {name('trainable', 'all')}")
    beyond = sorted(x for x in parallel.frozen_layers if x >= model.num_layers)
    if beyond:
        raise SimtrainError(f"{name('trainable', parallel.trainable)}: layer {beyond[0]} does not exist; {model.name} has "
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


def without_weight_pass(op):
    """``op`` (a :class:`simtrain.costs.ops.OpCost`) of a frozen layer: its W column (FLOPs, bytes,
    seconds, kernels) is 0, since a frozen weight needs no ``dW`` (F and I unchanged)."""
    return replace(op, flops=(*op.flops[:2], 0.0), bytes=(*op.bytes[:2], 0.0), seconds=(*op.seconds[:2], 0.0),
                   kernels=(*op.kernels[:2], 0))


def adapter_ops(model: ModelSpec, layer: int, parallel: ParallelConfig, gemm, add) -> list:
    """The LoRA adapters of ``layer`` for the per-operator model as one ``lora`` row (empty without
    LoRA): each linear layer's ``X Aᵀ`` (K -> r) and ``(X Aᵀ) Bᵀ`` (r -> N) GEMMs in F, I and W
    (Hu et al. 2021 §4.1), at their local shapes under TP without a collective of their own: a
    column-parallel layer's adapter sees the whole input, so ``A`` is whole on every TP rank and
    ``B`` split like the layer's output; a row-parallel layer's ``A`` is split like its input and
    ``B`` whole. The rank ``r`` is never split, so the small dimension is priced at its real size
    (the flat model, :func:`layer_adapter`, divides the adapters' FLOPs by TP instead).

    Args:
        gemm: ``(k, n, mult) -> OpCost`` of one GEMM (:func:`simtrain.costs.ops._gemm` for the
            microbatch's tokens x ``mult``); add: sums two OpCosts.
    """
    r, tp, h = parallel.lora_rank, parallel.tp, model.hidden_size
    if r == 0:
        return []
    gemms = [gemm(a, b, mult) for k, n, mult in linear_layers(model, layer)
             for a, b in (((k, r), (r, n / tp)) if k == h else ((k / tp, r), (r, n)))]
    return [functools.reduce(add, gemms)]
