"""Measured fused-attention rates by sequence length and head dim (``attention:`` of ``op_data.yaml``).

Each kernel of a GPU kind lists causal forward TFLOP/s points at one or more head dims and, per
head dim, measured (forward, backward) pairs or a scalar backward/forward ratio. A rate between the
points is linear in log2(seq_len) along each measured head dim, then linear in log2(head_dim)
between the two nearest measured head dims; outside the measured range of either axis the
nearest end's rate is kept (no extrapolation), so a kernel measured at one head dim prices every
head dim at that one's rates. :func:`check_attention` refuses a table whose interpolated time
would fall as the sequence or the head dim grows; :func:`check_within_peak` one faster than the
dense peak.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np

from ..errors import SimtrainError
from ..hardware import TFLOPS

ATTENTION_KERNELS = ("fa2", "fa3", "fa4", "cudnn")
"""Fused-attention kernels ``op_data.yaml`` may rate: FlashAttention-2 (Dao 2023), -3 (Shah et al.
2024, Hopper), -4 (Blackwell) and cuDNN's fused flash attention (Transformer Engine's
FusedAttention, torch SDPA's ``CUDNN_ATTENTION``)."""
BACKWARD_FLOPS_PER_FORWARD = 2.5
"""Backward FLOPs of a fused attention kernel per forward FLOP in FlashAttention's count: five
matrix products (S and dP recomputed/formed, dV, dQ, dK) against the forward's two
(flash-attention ``benchmarks/benchmark_flash_attention.py`` and ``hopper/benchmark_attn.py``,
``flops(mode="bwd") = 2.5 * f``); the backward TFLOP/s of the cited benchmarks are in this count."""

Points = tuple[tuple[float, float], ...]
Curves = tuple[tuple[int, Points], ...]
"""Per measured head dim (ascending), the (seq_len, value) points at that head dim (ascending)."""


@dataclasses.dataclass(frozen=True)
class AttentionKernel:
    """Measured rates of one fused-attention kernel on one GPU kind, in the 16-bit dtypes.

    Attributes:
        name: the kernel (:data:`ATTENTION_KERNELS`).
        forward: per head dim, (seq_len, causal forward FLOP/s in FlashAttention's count, causal
            work halved) points (:data:`Curves`).
        backward_ratio: per head dim, (seq_len, backward FLOP/s / forward FLOP/s) points, both in
            FlashAttention's count (backward = :data:`BACKWARD_FLOPS_PER_FORWARD` x forward FLOPs).
    """

    name: str
    forward: Curves
    backward_ratio: Curves

    def forward_flops_per_s(self, seq_len: float, head_dim: float) -> float:
        """Causal forward FLOP/s at ``seq_len`` and ``head_dim`` (:func:`interp2`)."""
        return interp2(self.forward, seq_len, head_dim)

    def backward_flops_per_s(self, seq_len: float, head_dim: float) -> float:
        """Causal backward FLOP/s at ``seq_len`` and ``head_dim`` (FlashAttention's count): the
        forward rate times the measured backward/forward ratio there (the ratio measured without a
        causal mask where the source has no causal backward, the same transfer Dao 2023 §4.1's
        73 % / 63 % makes)."""
        return self.forward_flops_per_s(seq_len, head_dim) * interp2(self.backward_ratio, seq_len, head_dim)

    def knots(self) -> list[tuple[int, float]]:
        """Every measured (head_dim, seq_len) of the forward and backward tables."""
        return sorted({(hd, s) for curves in (self.forward, self.backward_ratio) for hd, pts in curves for s, _ in pts})


def log_interp(points: Points, x: float) -> float:
    """``points`` (ascending x, y) at ``x``, linear in log2 x, clamped at both ends."""
    return float(np.interp(math.log2(x), [math.log2(s) for s, _ in points], [v for _, v in points]))


@functools.lru_cache(maxsize=4096)
def interp2(curves: Curves, seq_len: float, head_dim: float) -> float:
    """``curves`` at (``seq_len``, ``head_dim``): each measured head dim's points linear in
    log2(seq_len), then linear in log2(head_dim) between the two nearest measured head dims,
    each clamped to its measured range (module docstring). Cached: the planner asks for the same
    few (kernel, length, head dim) again for every candidate layout."""
    return log_interp(tuple((hd, log_interp(pts, seq_len)) for hd, pts in curves), head_dim)


def build_kernel(name: str, spec: dict, causal_ratio: float) -> AttentionKernel:
    """One kernel of ``op_data.yaml``'s ``attention.kernels`` (validated by :func:`check_attention`)
    in SI units. Per head dim: its causal forward points where the source has them, else its
    non-causal ones times ``causal_ratio``; its backward/forward ratio from the measured
    (forward, backward) pairs at that head dim where given, else the scalar ``backward_ratio`` at
    every forward point."""
    forward = []
    for hd in sorted({p["head_dim"] for p in spec["points"]}):
        at = [p for p in spec["points"] if p["head_dim"] == hd]
        causal = [p for p in at if p["causal"]]
        forward.append((hd, tuple(sorted((p["seq_len"], p["forward_tflops"] * TFLOPS * (1.0 if p["causal"] else causal_ratio))
                                         for p in causal or at))))
    pairs = spec.get("backward", [])
    ratio = tuple((hd, tuple(sorted((p["seq_len"], p["backward_tflops"] / p["forward_tflops"])
                                    for p in pairs if p["head_dim"] == hd)))
                  for hd in sorted({p["head_dim"] for p in pairs})) \
        or tuple((hd, tuple((s, float(spec["backward_ratio"])) for s, _ in pts)) for hd, pts in forward)
    return AttentionKernel(name, tuple(forward), ratio)


def _positive(p: object, keys: tuple[str, ...]) -> bool:
    return isinstance(p, dict) and all(isinstance(p.get(k), (int, float)) and not isinstance(p.get(k), bool)
                                       and p[k] > 0 for k in keys)


def _time_rises(a: tuple[float, float], b: tuple[float, float], power: int) -> bool:
    """Whether the time of work proportional to x**power at rate r, linear in log2 x between the
    points ``a`` = (x1, r1) and ``b`` = (x2, r2) (x1 < x2), never falls between them: the rate's
    growth per log2 unit is at most ``power`` ln 2 times its value at the lower end."""
    (x1, r1), (x2, r2) = a, b
    return r2 - r1 <= power * math.log(2) * r1 * math.log2(x2 / x1) * (1 + 1e-9)


def check_attention(kind: str, att: dict, source: str, causal_ratio: float = 1.0) -> None:
    """Validate one kind's ``attention:`` section (non-causal points scaled by ``causal_ratio``).

    Raises:
        SimtrainError: an unknown kernel or default; a point without a positive seq_len, head_dim
            and forward_tflops or a causal flag; a (head_dim, seq_len, causal) given twice; a
            backward pair without positive fields; no backward data; a table under which a longer
            sequence (work ~ seq_len**2) or a larger head dim (work ~ head_dim) takes less time.
    """
    where = f"{source}: kinds.{kind}.attention"
    kernels = att.get("kernels", {})
    unknown = sorted(set(kernels) - set(ATTENTION_KERNELS))
    if unknown:
        raise SimtrainError(f"{where}.kernels: {unknown[0]!r} is not a fused-attention kernel; "
                            f"choose from {', '.join(ATTENTION_KERNELS)}")
    if kernels and att.get("default") not in kernels:
        raise SimtrainError(f"{where}.default = {att.get('default')!r}: must name one of its kernels "
                            f"({', '.join(sorted(kernels))})")
    for name, k in kernels.items():
        here = f"{where}.kernels.{name}"
        points = k.get("points") or [None]
        for i, p in enumerate(points):
            if not _positive(p, ("seq_len", "head_dim", "forward_tflops")) or not isinstance(p.get("causal"), bool):
                raise SimtrainError(f"{here}.points[{i}] = {p!r}: one or more points, each with seq_len, head_dim "
                                    "and forward_tflops > 0 and causal true or false")
        keys = [(p["head_dim"], p["seq_len"], p["causal"]) for p in points]
        twice = next((key for key in keys if keys.count(key) > 1), None)
        if twice:
            raise SimtrainError(f"{here}.points: head_dim {twice[0]}, seq_len {twice[1]}, causal {twice[2]} given twice")
        for i, p in enumerate(k.get("backward", [])):
            if not _positive(p, ("seq_len", "head_dim", "forward_tflops", "backward_tflops")):
                raise SimtrainError(f"{here}.backward[{i}] = {p!r}: seq_len, head_dim, forward_tflops and "
                                    "backward_tflops must be > 0")
        if not k.get("backward") and not _positive(k, ("backward_ratio",)):
            raise SimtrainError(f"{here}: needs backward (measured pairs) or a backward_ratio > 0")
        _check_time_rises(here, build_kernel(name, k, causal_ratio), k.get("backward", []))


def _check_time_rises(here: str, kernel: AttentionKernel, pairs: list[dict]) -> None:
    """:func:`check_attention`'s monotonicity rule on the causal forward curves and on the measured
    backward rates: exact at the knots and, the curves being piecewise linear in log2, between them."""
    backward = tuple((hd, tuple(sorted((p["seq_len"], p["backward_tflops"] * TFLOPS) for p in pairs if p["head_dim"] == hd)))
                     for hd in sorted({p["head_dim"] for p in pairs}))
    for what, curves in (("forward", kernel.forward), ("backward", backward)):
        for hd, pts in curves:
            for a, b in zip(pts, pts[1:]):
                if not _time_rises(a, b, 2):
                    raise SimtrainError(f"{here}: {what} {b[1] / TFLOPS:g} TFLOP/s at seq_len {b[0]} against "
                                        f"{a[1] / TFLOPS:g} at {a[0]} (head_dim {hd}): a longer sequence would take "
                                        "less time")
        for (h1, c1), (h2, c2) in zip(curves, curves[1:]):
            for s in sorted({s for s, _ in c1 + c2}):
                a, b = (h1, log_interp(c1, s)), (h2, log_interp(c2, s))
                if not _time_rises(a, b, 1):
                    raise SimtrainError(f"{here}: {what} {b[1] / TFLOPS:g} TFLOP/s at head_dim {h2} against "
                                        f"{a[1] / TFLOPS:g} at {h1} (seq_len {s}): a larger head dim would take "
                                        "less time")


def check_within_peak(kind: str, kernel: AttentionKernel, peak_flops_per_s: float) -> None:
    """Refuse a kernel whose forward or backward rate at a measured (head_dim, seq_len) exceeds
    the dense 16-bit peak (the tables are 16-bit; interpolation never exceeds its knots' range).

    Raises:
        SimtrainError: naming the kind, kernel, point and both rates.
    """
    for hd, s in kernel.knots():
        for what, rate in (("forward", kernel.forward_flops_per_s(s, hd)), ("backward", kernel.backward_flops_per_s(s, hd))):
            if rate > peak_flops_per_s * (1 + 1e-9):
                raise SimtrainError(f"op_data.yaml: kinds.{kind}.attention.kernels.{kernel.name}: {what} "
                                    f"{rate / TFLOPS:g} TFLOP/s at head_dim {hd}, seq_len {s} is above the dense "
                                    f"bf16 peak of {peak_flops_per_s / TFLOPS:g} TFLOP/s")
