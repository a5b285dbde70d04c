"""What simtrain predicts for a measured torch pipeline run (no torch needed): torch's orders
imported into simtrain's IR (:func:`import_schedule`), the costs adjusted to how torch's runtime
runs a split backward (:func:`torch_runtime_costs`), the simulated step (:func:`predict`), the
profile at the machine's current speed (:func:`at_speed`, :func:`probe_seconds`) and the slowdown
of CPU ranks that share cores (:func:`cpu_slowdown`).
"""

from __future__ import annotations

from dataclasses import replace

from ..costs import StageCosts
from ..errors import SimtrainError
from ..hardware import HardwareProfile
from ..schedules.ir import Schedule, parse_action
from .measurements import PipelineRun, ValidationResult
from .workload import TORCH_SCHEDULES, ValidationModel

def probe_seconds(keys: dict, hardware: HardwareProfile, dtype: str = "fp32") -> float:
    """Seconds the profile predicts for the probe of :func:`probe_cases`."""
    total = 0.0
    for t, k, n, kind in keys["linear"]:
        total += 2 * t * k * n / hardware.linear_flops_per_s(t, k, n, kind, dtype)
    for s, d, a, b, kind in keys["attention"]:
        flops = 4 * b * a * s * s * d
        if kind == "B":
            total += 2 * flops / hardware.attention_flops_per_s(s, d, dtype, backward=True)
        else:
            total += flops / hardware.attention_flops_per_s(s, d, dtype, backward=False)
    rates = hardware.elementwise_bytes_per_s
    total += sum(nbytes / rates[cls] for cls, *_, nbytes in keys["elementwise"] if cls in rates)
    return total


def probe_reference(result: ValidationResult, hardware: HardwareProfile) -> float:
    """Seconds the speed probe took when ``hardware`` was calibrated.

    The probe calibration recorded (``calibration.speed_probe``) when it was built for this
    validation model; otherwise the time the profile predicts for it (:func:`probe_seconds`).
    """
    recorded = (hardware.calibration or {}).get("speed_probe") or {}
    if recorded.get("model") == result["model"]:
        return float(recorded["seconds"])
    keys = {k: [tuple(x) for x in v] for k, v in result["probe_keys"].items()}
    return probe_seconds(keys, hardware)


def at_speed(hardware: HardwareProfile, factor: float) -> HardwareProfile:
    """``hardware`` with every compute time (kernels, memory, per-action overhead) x ``factor``.

    Links are unchanged. ``factor`` > 1 means the machine currently runs slower than when it was
    calibrated.
    """
    return replace(
        hardware,
        peak_flops={k: v / factor for k, v in hardware.peak_flops.items()},
        linear_rates={k: tuple((*r[:3], r[3] / factor) for r in v) for k, v in hardware.linear_rates.items()},
        attention_rates={
            k: tuple((*r[:2], r[2] / factor, r[3] / factor) for r in v) for k, v in hardware.attention_rates.items()
        },
        elementwise_bytes_per_s={k: v / factor for k, v in hardware.elementwise_bytes_per_s.items()},
        hbm_bandwidth_bytes_per_s=hardware.hbm_bandwidth_bytes_per_s / factor,
        optimizer_bytes_per_s=hardware.optimizer_bytes_per_s / factor if hardware.optimizer_bytes_per_s else None,
        action_overhead_s=hardware.action_overhead_s * factor,
    )


def import_schedule(name: str, measured: PipelineRun, microbatches: int) -> Schedule:
    """torch's per-rank orders of one run, as a validated simtrain :class:`Schedule`.

    Raises:
        SimtrainError: the imported order differs from what the ranks actually ran.
    """
    orders = tuple(tuple(parse_action(t) for t in rank) for rank in measured["orders"])
    for rank, (order, ran) in enumerate(zip(orders, measured["recorded"])):
        flat = [str(p) for a in order for p in a.parts]
        if flat != ran:
            raise SimtrainError(
                f"validate {name}: torch's schedule for rank {rank} lists {flat[:6]}..., "
                f"but the rank ran {ran[:6]}..."
            )
    schedule = Schedule(f"torch:{name}", microbatches, tuple(measured["stage_to_rank"]), orders)
    schedule.validate()
    return schedule


def torch_runtime_costs(costs: StageCosts, vocab: int) -> StageCosts:
    """Adjust per-chunk costs to how ``torch.distributed.pipelining`` runs a split backward.

    * Chunk 0 (the first stage): its I computes nothing (its input needs no gradient) and its W
      runs the whole backward (torch 2.13 ``PipelineStage.backward_weight_one_chunk``), and I
      frees nothing.
    * Other chunks: I (``stage_backward_input``) keeps the autograd graph for W, so every stored
      activation but the loss's softmax (above the last linear layer, freed with the stage
      output) stays until W.

    Args:
        costs: the cost model's per-chunk costs (fp32 loss, tp = 1).
        vocab: vocabulary size (the loss's fp32 softmax holds ``tokens x vocab x 4`` bytes).

    Full backwards (B) are unaffected.
    """
    chunks = []
    for c in costs.chunks:
        if c.chunk == 0:
            c = replace(c, backward_input_s=0.0, backward_weight_s=c.backward_s, weight_grad_bytes=c.activation_bytes)
        else:
            loss_bytes = costs.tokens_per_microbatch * 4 * vocab if c.has_head else 0.0
            c = replace(c, weight_grad_bytes=c.activation_bytes - loss_bytes)
        chunks.append(c)
    return replace(costs, chunks=tuple(chunks))


def predict(name: str, measured: PipelineRun, cfg: ValidationModel, hardware: HardwareProfile, world: int):
    """Simulate torch's order of ``name`` with ``hardware``; returns the :class:`ScheduleRun`."""
    from ..scenario import run_schedule

    schedule = import_schedule(name, measured, cfg.microbatches)
    parallel = cfg.parallel(world, TORCH_SCHEDULES[name][1])
    return run_schedule(schedule, cfg.spec(), hardware, parallel,
                        runtime=lambda costs: torch_runtime_costs(costs, cfg.vocab))


def _self_sharing(name: str, measured: PipelineRun, cfg: ValidationModel, hardware: HardwareProfile, world: int,
                  preemption: float) -> float:
    """How much longer the simulated actions take because ranks share processors (1 if they do not).

    The simulated counterpart of the measured wall / CPU time: the actions' total duration with the
    profile's processor sharing over their total without it, at the speed ``preemption`` / that
    ratio (found by a few fixed-point steps).
    """
    if hardware.processors_per_node is None or world <= hardware.processors_per_node:
        return 1.0

    def busy(hw: HardwareProfile) -> float:
        trace = predict(name, measured, cfg, hw, world).result.trace
        actions = trace[trace["kind"].isin(["F", "B", "I", "W"])]
        return float((actions["end_s"] - actions["start_s"]).sum())

    ratio = 1.0
    for _ in range(3):
        hw = at_speed(hardware, max(1.0, preemption / ratio))
        ratio = busy(hw) / busy(replace(hw, processors_per_node=None))
    return ratio


def cpu_slowdown(name: str, measured: PipelineRun, cfg: ValidationModel, hardware: HardwareProfile, world: int,
                 preemption: float) -> float:
    """How much slower than their CPU time one-thread CPU ranks ran a step's actions because other
    processes took their cores: the measured wall / CPU time ``preemption`` without the part the
    profile's processor sharing already simulates (ranks beyond the cores delaying each other);
    at least 1."""
    return max(1.0, preemption / _self_sharing(name, measured, cfg, hardware, world, preemption))
