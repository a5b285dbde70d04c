"""Fit the microbenchmarks of :mod:`.microbench` (:mod:`.profile` assembles and writes the NEW
hardware profile from these fits).

* Links: ``t(n) = alpha + n / beta`` per link class from p2p ping-pong (one-way time), fitted by
  least squares on relative error (weights ``1 / t²``, so 4 KiB and 16 MiB messages count alike);
  R² (on the times) and the relative residual of every size are kept. The profile's link latency
  is alpha and its bandwidth beta (``efficiency.link`` = 1: the fit already is what is achieved).
  All-reduce and all-to-all get their own fits, recorded with the error of simtrain's ring model
  (:mod:`simtrain.network`) on the p2p link, so a user sees how far collectives stray from it.
* Linear layers and attention: tables of achieved TFLOP/s (FLOPs as the cost model counts them /
  median seconds), used by the cost model shape by shape.
* Elementwise kernels: one bandwidth per class (norm, activation, add), the bytes the cost model
  counts for them divided by their measured time (summed over kernels and shapes); each kernel's
  own rate is kept as a residual.
* Copy: read + write bytes / seconds, the profile's memory bandwidth.
* Real pipeline steps of the calibration model (:func:`.pipeline_runs.pipeline_benchmark`), fitted in
  this order, each with what the previous ones found:

  - ``layer_slowdown`` (:func:`in_situ_slowdown`): per pass (F, a full backward B, and torch's
    split backward I and W), the time the middle stages' actions took inside the steps over the
    cost model's sum of their kernels; the cost model applies it. Kernels inside a training step
    run slower than alone (activations of several microbatches alive, caches, allocation,
    autograd and pipelining code between kernels), and a split backward costs more than a full
    one.
  - ``optimizer_gb_per_s`` (:func:`optimizer_rate`): the Adam steps' rate in the bytes the cost
    model counts for them.
  - per-action and per-message overheads (:func:`fit_overheads`): the values with which
    simtrain's own simulation of the same runs (each in the order its ranks ran) reproduces their
    step times (non-negative least squares; the simulated step is piecewise linear in both), so
    p2p latency is not counted twice.
  - the speed probe's median over the steps: the machine's speed while all this was measured,
    which ``validate`` compares its own probes with.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace

import numpy as np

from ..errors import SimtrainError, validate_model
from ..hardware import GB, ProfileFile, profile_from_file_model
from .measurements import PipelineMeasurements, PipelineRun
from .predict import at_speed, cpu_slowdown, predict, torch_runtime_costs
from .workload import TORCH_SCHEDULES, ValidationModel


@dataclass(frozen=True)
class AlphaBeta:
    """A latency + bytes / bandwidth fit.

    Attributes:
        latency_s: alpha, seconds.
        bandwidth_bytes_per_s: beta, bytes/s.
        r2: coefficient of determination of the fit on the measured times.
        residuals: per message size ``(bytes, measured_s, fitted_s)``.
    """

    latency_s: float
    bandwidth_bytes_per_s: float
    r2: float
    residuals: tuple[tuple[float, float, float], ...]

    def seconds(self, nbytes: float) -> float:
        """Fitted time of an ``nbytes`` message."""
        return self.latency_s + nbytes / self.bandwidth_bytes_per_s

    def to_record(self) -> dict:
        """The ``calibration:`` entry: latency_us, bandwidth_gb_per_s, r2, residuals."""
        return dict(
            latency_us=sig(self.latency_s * 1e6),
            bandwidth_gb_per_s=sig(self.bandwidth_bytes_per_s / GB),
            r2=sig(self.r2),
            residuals=[
                dict(bytes=int(n), measured_us=sig(t * 1e6), fitted_us=sig(f * 1e6), error=sig(f / t - 1))
                for n, t, f in self.residuals
            ],
        )


def fit_alpha_beta(points: list[dict]) -> AlphaBeta:
    """Fit ``t = alpha + bytes / beta`` to ``[{bytes, seconds}, ...]`` (relative least squares).

    Raises:
        SimtrainError: fewer than two sizes, or times that do not grow with size (no positive
            bandwidth can be fitted).
    """
    n = np.array([p["bytes"] for p in points], dtype=float)
    t = np.array([p["seconds"] for p in points], dtype=float)
    if len(n) < 2:
        raise SimtrainError("calibration: an alpha-beta fit needs at least two message sizes")
    w = 1.0 / t
    design = np.stack([np.ones_like(n), n], axis=1) * w[:, None]
    (alpha, inv_beta), *_ = np.linalg.lstsq(design, t * w, rcond=None)
    if inv_beta <= 0:
        raise SimtrainError(
            f"calibration: message times {list(np.round(t * 1e6, 1))} us do not grow with size "
            f"{list(n.astype(int))} bytes; no bandwidth can be fitted (rerun on a quieter machine)"
        )
    alpha = max(float(alpha), 0.0)
    fitted = alpha + n * inv_beta
    ss_res = float(((t - fitted) ** 2).sum())
    ss_tot = float(((t - t.mean()) ** 2).sum())
    r2 = 1 - ss_res / ss_tot if ss_tot > 0 else 1.0
    return AlphaBeta(alpha, 1.0 / float(inv_beta), r2, tuple(zip(n.tolist(), t.tolist(), fitted.tolist())))


def sig(x: float, digits: int = 4) -> float:
    """``x`` rounded to ``digits`` significant digits (for readable YAML)."""
    if x == 0 or not math.isfinite(x):
        return float(x)
    return float(round(x, digits - 1 - int(math.floor(math.log10(abs(x))))))


# ----------------------------------------------------------------------------- compute tables
def linear_table(points: list[dict]) -> list[dict]:
    """``compute.linear_tflops`` entries from the linear-layer measurements."""
    return [
        dict(tokens=p["tokens"], fan_in=p["fan_in"], fan_out=p["fan_out"], kind=p["kind"],
             tflops=sig(2 * p["tokens"] * p["fan_in"] * p["fan_out"] / p["seconds"] / 1e12))
        for p in points
    ]


def attention_table(points: list[dict]) -> list[dict]:
    """``compute.attention_tflops`` entries: forward and backward rates per (seq_len, head_dim).

    FLOPs are the cost model's: ``4·b·a·s²·d`` forward (``Q·Kᵀ`` and ``softmax·V`` over the full
    ``s x s`` scores, Narayanan et al. 2021) and twice that backward.
    """
    by_shape: dict[tuple, dict] = {}
    for p in points:
        key = (p["seq_len"], p["head_dim"])
        flops = 4 * p["batch"] * p["heads"] * p["seq_len"] ** 2 * p["head_dim"] * (2 if p["kind"] == "B" else 1)
        by_shape.setdefault(key, {})[p["kind"]] = flops / p["seconds"] / 1e12
    return [
        dict(seq_len=s, head_dim=d, forward_tflops=sig(r["F"]), backward_tflops=sig(r["B"]))
        for (s, d), r in sorted(by_shape.items())
    ]


def elementwise_fit(points: list[dict]) -> tuple[dict[str, float], list[dict]]:
    """Bandwidth (bytes/s) per class of memory-bound kernels, and each kernel's rate against it.

    A class's bandwidth is the bytes the cost model counts for its kernels divided by their
    measured time, summed over kernels and shapes (so it predicts their total exactly).
    """
    rates = {}
    for cls in sorted({p["class"] for p in points}):
        members = [p for p in points if p["class"] == cls]
        rates[cls] = sum(p["model_bytes"] for p in members) / sum(p["seconds"] for p in members)
    residuals = [
        dict(kernel=p["kernel"], tokens=p["tokens"], hidden=p["hidden"],
             gb_per_s=sig(p["model_bytes"] / p["seconds"] / GB),
             error=sig((p["model_bytes"] / rates[p["class"]]) / p["seconds"] - 1))
        for p in points
    ]
    return rates, residuals


# ----------------------------------------------------------------------------- real pipeline steps
PASS_COST = dict(F="forward_s", B="backward_s", I="backward_input_s", W="backward_weight_s")
"""The :class:`simtrain.costs.ChunkCost` attribute each recorded action kind is compared with."""


def _pipeline_costs(hw, run: PipelineRun, world: int):
    """The cost model's per-chunk costs of one calibration run (torch's runtime adjustments applied)."""
    from ..costs import stage_costs

    cfg = ValidationModel(**run["model"])
    per_rank = TORCH_SCHEDULES[run["schedule"]][1]
    costs = stage_costs(cfg.spec(), cfg.parallel(world, per_rank), hw, world * per_rank)
    return torch_runtime_costs(costs, cfg.vocab)


def in_situ_slowdown(profile_data: dict, pipeline: PipelineMeasurements, world: int) -> tuple[dict[str, float], list[dict]]:
    """Per-pass ratio of what a stage's actions took inside real pipeline steps to the cost model's
    sum of their kernels: the profile's ``layer_slowdown``.

    Every F, B, I and W that the calibration runs (:func:`simtrain.calibration.pipeline_runs.pipeline_benchmark`)
    recorded on a middle stage (no embedding, no LM head: torch computes the loss outside the
    stage's forward) is compared, in the compute clock, with the kernels the cost model counts for
    it under the profile being built without slowdown. Inside a step the kernels run with
    several microbatches' activations alive, after other stages' work, with torch's autograd and
    pipelining code in between: all of that is in the ratio. A pass's factor is its actions' total
    measured time over their total kernel time; a pass no run measured is left out (the cost model
    then uses 1 for F and B, and B's factor for I and W).

    Returns:
        ``(factors, residuals)``; residuals give per run, stage and pass the measured and kernel
        milliseconds and the ratio.
    """
    hw = replace(profile_from_file_model(validate_model(ProfileFile, profile_data, "calibrated profile")),
                 layer_slowdown={})
    sums: dict[str, list[float]] = {}
    rows = []
    for label, run in pipeline["runs"].items():
        chunks = _pipeline_costs(hw, run, world).chunks
        for key, measured in sorted(run["action_compute_s"].items()):
            stage, kind = int(key[:-1]), key[-1]
            chunk = chunks[stage]
            if chunk.has_embedding or chunk.has_head or kind not in PASS_COST:
                continue
            kernels = getattr(chunk, PASS_COST[kind])
            sums.setdefault(kind, [0.0, 0.0])
            sums[kind][0] += measured
            sums[kind][1] += kernels
            rows.append(dict(run=label, stage=stage, kind=kind, measured_ms=sig(measured * 1e3),
                             kernels_ms=sig(kernels * 1e3), ratio=sig(measured / kernels)))
    factors = {k: m / p for k, (m, p) in sorted(sums.items()) if p > 0}
    return factors, rows


def optimizer_rate(pipeline: PipelineMeasurements) -> tuple[float, list[dict]]:
    """Bytes/s of the optimizer step in the bytes the cost model counts (``OPTIMIZER_BYTES_PER_PARAM``
    per parameter), from the Adam steps of the calibration runs (all runs and ranks together).

    Returns:
        ``(bytes_per_s, residuals)`` with each run's and rank's parameters, milliseconds and rate.
    """
    from ..costs import OPTIMIZER_BYTES_PER_PARAM

    total_bytes = total_s = 0.0
    rows = []
    for label, run in pipeline["runs"].items():
        for rank, (params, seconds) in enumerate(zip(run["params"], run["optimizer_compute_s"])):
            nbytes = OPTIMIZER_BYTES_PER_PARAM * params
            total_bytes += nbytes
            total_s += seconds
            rows.append(dict(run=label, rank=rank, params=int(params), measured_ms=sig(seconds * 1e3),
                             gb_per_s=sig(nbytes / seconds / GB)))
    return total_bytes / total_s, rows


def fit_overheads(profile_data: dict, pipeline: PipelineMeasurements, world: int) -> tuple[float, float, list[dict]]:
    """Per-action and per-message seconds with which the simulator reproduces the calibration runs.

    Each run of :func:`simtrain.calibration.pipeline_runs.pipeline_benchmark` is simulated in the
    order its ranks ran, with the profile being built (kernels, in-situ factors, optimizer, links),
    at the speed its steps ran (on one-thread CPU ranks: the median wall / CPU time of the ranks'
    actions, as ``validate`` predicts); the simulated step is piecewise linear in both overheads
    (``base + a·action + b·message`` near any point), so they are found by non-negative least
    squares over all runs (relative errors), linearising again around each new estimate. Inside a
    real step a message costs more than between idle ranks (on gloo a transfer from or to a rank
    that is computing waits for its communication thread to be scheduled), which is why the runs
    carry real compute and activation-sized messages.

    Returns:
        ``(action_s, message_s, residuals)``; residuals give measured and simulated steps.
    """
    hw = profile_from_file_model(validate_model(ProfileFile, profile_data, "calibrated profile"))
    runs = list(pipeline["runs"].items())
    speed = {}
    for label, run in runs:
        cfg = ValidationModel(**run["model"])
        speed[label] = (cpu_slowdown(run["schedule"], run, cfg, hw, world, statistics.median(run["preemption"]))
                        if pipeline.get("cpu_time_profile") else 1.0)

    def simulate(label: str, run: PipelineRun, action_s: float, message_s: float) -> float:
        probe = at_speed(replace(hw, action_overhead_s=action_s, message_overhead_s=message_s), speed[label])
        cfg = ValidationModel(**run["model"])
        return predict(run["schedule"], run, cfg, probe, world).report.step_time_s

    measured = {label: statistics.median(run["step_times_s"]) for label, run in runs}
    # The simulated step is piecewise linear in the two overheads (the critical path can change),
    # so linearise around the current estimate and solve again until it settles.
    coef = np.zeros(2)
    step_s = 1e-5
    for _ in range(4):
        rows = []
        for label, run in runs:
            base = simulate(label, run, *coef)
            a = (simulate(label, run, coef[0] + step_s, coef[1]) - base) / step_s
            b = (simulate(label, run, coef[0], coef[1] + step_s) - base) / step_s
            rows.append((measured[label], base - a * coef[0] - b * coef[1], a, b))
        y = np.array([(t - intercept) / t for t, intercept, _, _ in rows])
        design = np.array([[a / t, b / t] for t, _, a, b in rows])
        new = _nonnegative_lstsq(design, y)
        if np.allclose(new, coef, rtol=1e-4, atol=1e-9):
            break
        coef = new
    residuals = []
    for label, run in runs:
        sim = simulate(label, run, *coef)
        residuals.append(dict(run=label, measured_ms=sig(measured[label] * 1e3), simulated_ms=sig(sim * 1e3),
                              speed_factor=sig(speed[label]), error=sig(sim / measured[label] - 1)))
    return float(coef[0]), float(coef[1]), residuals


def _nonnegative_lstsq(design: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with non-negative coefficients (all free, or each alone with the others 0)."""
    best, best_err = np.zeros(design.shape[1]), float((y**2).sum())
    candidates = [np.linalg.lstsq(design, y, rcond=None)[0]]
    for j in range(design.shape[1]):
        col = design[:, j]
        c = np.zeros(design.shape[1])
        c[j] = float(col @ y / (col @ col)) if col @ col > 0 else 0.0
        candidates.append(c)
    for c in candidates:
        if (c >= 0).all():
            err = float(((design @ c - y) ** 2).sum())
            if err < best_err:
                best, best_err = c, err
    return best


# ----------------------------------------------------------------------------- the profile


