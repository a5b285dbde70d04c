"""Memory-bound operators run as eager PyTorch ops (``ParallelConfig.kernels = "eager"``): their HBM
bytes against the fused kernels' that :mod:`simtrain.costs.ops` counts. What the same setting
stores for the backward is :mod:`simtrain.costs.saved`.
"""

from __future__ import annotations


def eager_factors(name: str, elem: int, activation: str = "swiglu") -> tuple[float, float]:
    """HBM bytes of an operator run as eager PyTorch ops / the fused kernel's bytes, for F and I
    (``ParallelConfig.kernels = "eager"``; 1 for operators not listed). Counted per element from
    torchtitan's eager model code (``torchtitan/models/norms.py`` ``RMSNorm``: ``x.float()``, ``pow``,
    ``mean``, ``x * rsqrt``, ``type_as``, ``* weight``; ``models/llama/model.py``
    ``apply_rotary_emb``: cast to fp32, complex multiply, cast back, and ``FeedForward``:
    ``silu(w1 x) * w3 x``; the loss on ``pred.float()``), each op reading its inputs and writing
    its output once, autograd's backward of each op likewise; a cast to fp32 costs nothing in fp32
    training. The fused counts are :mod:`simtrain.costs.ops`'s (norm F 2e / I 3e bytes per element, rotary 2e /
    2e, SwiGLU 3e / 5e, fp32 cross-entropy 8 / 12), e = ``elem``.
    """
    e = elem
    c = e + 4 if e < 4 else 0  # one cast between the compute dtype and fp32
    key = name.removeprefix("head:")
    if key == "norm":  # F: cast, pow, mean, mul, cast, weight; I: their backwards + the two dx summed
        return (c + 8 + 4 + 8 + c + 2 * e) / (2 * e), (4 * e + c + 16 + 8 + 12 + c) / (3 * e)
    if key == "rotary":
        return (c + 8 + c) / (2 * e), (c + 8 + c) / (2 * e)
    if key == "activation" and activation == "swiglu":  # silu, then the product; backward: 2 + 1 ops
        return 5 / 3, 9 / 5
    if key == "cross_entropy":  # cast, log-softmax (nll negligible); backward: nll, log-softmax, cast
        return (c + 8) / 8, (4 + 12 + c) / 12
    return 1.0, 1.0
