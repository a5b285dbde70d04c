"""What simtrain predicts for a measured torch pipeline run (no torch needed): torch's orders
imported into simtrain's IR (:func:`import_schedule`), the costs adjusted to how torch's runtime
runs a split backward (:func:`torch_runtime_costs`), the simulated step (:func:`predict`), the
profile at the machine's current speed (:func:`at_speed`, :func:`speed_reference`) and the slowdown
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

PROBE_SHAPE = ("hidden", "heads", "ffn", "seq_len", "microbatch_size")
"""The :class:`ValidationModel` fields the speed probe's kernels depend on (``probe_cases``)."""


def speed_reference(hardware: HardwareProfile, device: str, device_name: str, probe_model: dict) -> float:
    """Seconds the speed probe took when ``hardware`` was calibrated, if it was calibrated on this
    machine kind at these shapes; the speed correction divides by it.

    The correction may only remove drift of one machine's speed between its calibration and now.
    Any other reference (a datasheet profile's predicted probe time, another machine's probe)
    would rescale the prediction by whatever the profile gets wrong, so that validation could
    never fail.

    Args:
        hardware: the profile.
        device: ``"cpu"`` or ``"cuda"``; device_name: this machine's CPU model or GPU name (as
            calibration records it, :func:`simtrain.calibration.microbench.device_name`).
        probe_model: the :class:`ValidationModel` fields of this validation.

    Returns:
        The recorded probe seconds (``calibration.speed_probe.seconds``).

    Raises:
        SimtrainError: the profile was not calibrated here, or its probe ran at other shapes.
    """
    record = hardware.calibration or {}
    probe = record.get("speed_probe") or {}
    backend = "nccl" if device == "cuda" else "gloo"
    where = str(hardware.path or hardware.name)
    if not record:
        reason = "it has no calibration: section (a datasheet profile)"
    elif (record.get("device_name"), record.get("backend")) != (device_name, backend):
        reason = (f"it was calibrated on {record.get('device_name')} ({record.get('backend')}) and this machine is "
                  f"{device_name} ({backend})")
    elif not probe:
        reason = "its calibration: section records no speed_probe"
    elif any((probe.get("model") or {}).get(k) != probe_model.get(k) for k in PROBE_SHAPE):
        reason = "its speed probe ran at other shapes than this validation model's (another --device?)"
    else:
        return float(probe["seconds"])
    raise SimtrainError(
        f"--profile {where}: cannot correct for this machine's speed: {reason}. The correction only removes "
        "drift since calibration on this machine; calibrate here (simtrain calibrate --out FILE), or pass "
        "--no-speed-correction to report the uncorrected error")


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
