"""Parsers of the string-valued settings of :class:`simtrain.parallel.ParallelConfig`: ``offload``
(``--offload``) and ``trainable`` (``--trainable``). Each returns the parsed value or raises a
``ValueError`` saying what is allowed (pydantic turns it into the setting's error line)."""

from __future__ import annotations


def parse_offload(text: str) -> float:
    """Parse ``--offload``: ``none`` or ``activations[=FRACTION]`` (FRACTION in (0, 1], default 1).

    Returns:
        The fraction of each microbatch's saved activation bytes copied to host memory after its
        forward (0 for ``none``; see :mod:`simtrain.lowering.offload`).

    Raises:
        ValueError: anything else, saying what is allowed.
    """
    kind, eq, arg = text.partition("=")
    if text == "none":
        return 0.0
    if kind == "activations":
        try:
            fraction = float(arg) if eq else 1.0
        except ValueError:
            fraction = float("nan")
        if 0.0 < fraction <= 1.0:
            return fraction
    raise ValueError("expected none or activations[=FRACTION] with FRACTION in (0, 1], e.g. activations=0.5")


def parse_trainable(text: str) -> tuple[int, frozenset[int]]:
    """Parse ``--trainable``: ``all``, ``lora:RANK`` or ``frozen-layers:LIST`` (LIST: comma-separated
    layer indices or ``a-b`` ranges, inclusive).

    Returns:
        ``(lora_rank, frozen_layers)``: rank 0 without LoRA; the listed layers for
        ``frozen-layers`` (empty otherwise: under LoRA every base weight is frozen).

    Raises:
        ValueError: anything else, saying what is allowed.
    """
    allowed = "expected all, lora:RANK (an integer >= 1) or frozen-layers:LIST (e.g. 0-15,20)"
    kind, _, arg = text.partition(":")
    if text == "all":
        return 0, frozenset()
    try:
        if kind == "lora" and int(arg) >= 1:
            return int(arg), frozenset()
        if kind == "frozen-layers" and arg:
            layers: set[int] = set()
            for part in arg.split(","):
                lo, dash, hi = part.partition("-")
                first, last = int(lo), int(hi) if dash else int(lo)
                if first < 0 or last < first:
                    raise ValueError
                layers.update(range(first, last + 1))
            return 0, frozenset(layers)
    except ValueError:
        pass
    raise ValueError(allowed)
