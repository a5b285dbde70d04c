"""Validate simtrain against real pipeline-parallel training with ``torch.distributed.pipelining``.

A small GPT-style transformer (:class:`ValidationModel`, described to simtrain as a
:class:`~simtrain.models.ModelSpec` so the cost model predicts exactly it) is cut into pipeline
stages with :func:`simtrain.costs.split_layers` and trained for a few steps with each of torch's
schedules (:data:`TORCH_SCHEDULES`). Per schedule the ranks measure:

* **step time**: from a barrier until the slowest rank has finished ``schedule.step()``, the
  optimizer step and ``zero_grad`` (median over steps after warm-up);
* **activation peak** per rank: on CPU, the bytes of distinct tensor storages autograd holds for
  the backward, counted by saved-tensor hooks (parameters excluded) during one extra step; on
  GPU, ``torch.cuda.max_memory_allocated`` minus what was allocated before the step;
* **torch's own action order**: ``pipeline_order`` of multi-stage schedules (with their
  overlapped F&B actions), or, for single-stage ones, the order the stages actually ran
  (recorded by wrapping the stage's forward/backward calls); both are checked against the
  recorded execution;
* the speed probe before each step, and each action's and optimizer step's time.

``calibrate`` runs the same measurement (:func:`measure_schedules`) on its own calibration model
(one layer per stage) to learn what stages cost inside real steps; it never sees these runs.

The parent process then imports each order into simtrain's IR, simulates it with the profile and
compares (:func:`compare`). The costs get two adjustments that describe torch's runtime rather
than the schedule (:func:`torch_runtime_costs`): the first stage's I is empty and its W runs the
whole backward, and an I keeps the autograd graph (every stored activation but the loss's) until
its W.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from ..errors import SimtrainError
from ..hardware import HardwareProfile
from ..schedules.names import TORCH_ALIASES, canonical_schedule
from .measurements import ValidationResult
from .predict import at_speed, cpu_slowdown, predict
from .workload import TORCH_SCHEDULES, ValidationModel

@dataclass(frozen=True)
class Row:
    """One line of the validation table (seconds, bytes, signed fractions)."""

    schedule: str
    speed_factor: float
    measured_step_s: float
    predicted_step_s: float
    step_error: float
    measured_activation_bytes: float
    predicted_activation_bytes: float
    memory_error: float


def compare(result: ValidationResult, hardware: HardwareProfile, reference_s: float | None = None) -> list[Row]:
    """Rows of measured against predicted step time and activation peak (max over ranks).

    Args:
        result: rank 0's result of the ``validate`` job.
        hardware: the profile.
        reference_s: the speed probe's seconds at calibration
            (:func:`simtrain.calibration.predict.speed_reference`): predict each step at the speed
            the machine ran it and report the median prediction; None predicts at the profile's
            speed (factor 1: ``--no-speed-correction``). The machine's speed while a step ran is
            the speed probe's time around it (the median over the schedules of the probes before
            and after that round of steps) over ``reference_s``: a VM's speed drifts between
            calibration and validation. On a
            one-thread CPU rank, whose profile and probe are in CPU time, the factor is further
            multiplied by the step's wall / CPU time of the ranks' actions, i.e. how much other
            processes delayed them (divided by how much the simulated ranks delay each other when
            they outnumber the cores; at least 1). ``speed_factor`` is the median factor.
    """
    cfg = ValidationModel(**result["model"])
    names = list(result["schedules"])
    rounds = [statistics.median(probes) / (reference_s or 1.0)
              for probes in zip(*(result["schedules"][n]["probe_s"] for n in names))]
    rows = []
    for name, measured in result["schedules"].items():
        steps = range(len(measured["step_times_s"]))
        if reference_s is None:
            factors = [1.0 for _ in steps]
        else:
            factors = [(rounds[i] + rounds[i + 1]) / 2 for i in steps]
            if result.get("cpu_time_profile"):
                # ranks beyond the cores delay each other too, which processor sharing already
                # simulates, so that part of the wall / CPU ratio is divided out
                factors = [f * cpu_slowdown(name, measured, cfg, hardware, result["world"], measured["preemption"][i])
                           for i, f in zip(steps, factors)]
        cache: dict[float, object] = {}
        for f in factors:
            key = round(f, 3)
            if key not in cache:
                cache[key] = predict(name, measured, cfg, at_speed(hardware, key), result["world"])
        run = cache[round(factors[0], 3)]
        mem = run.result.memory
        static = mem[mem["time_s"] == 0].groupby("rank")["bytes"].first()
        predicted_act = float((mem.groupby("rank")["bytes"].max() - static).max())
        measured_step = statistics.median(measured["step_times_s"])
        measured_act = float(max(measured["activation_peak_bytes"]))
        predicted_step = statistics.median(cache[round(f, 3)].report.step_time_s for f in factors)
        factor = statistics.median(factors)
        rows.append(Row(
            schedule=name, speed_factor=factor, measured_step_s=measured_step, predicted_step_s=predicted_step,
            step_error=predicted_step / measured_step - 1,
            measured_activation_bytes=measured_act, predicted_activation_bytes=predicted_act,
            memory_error=predicted_act / measured_act - 1 if measured_act > 0 else 0.0,
        ))
    return rows


def parse_schedules(text: str | None) -> list[str]:
    """``--schedules`` (comma-separated) -> the keys of :data:`TORCH_SCHEDULES`.

    Takes ``compare``'s names (``interleaved-1f1b``, ``zbv``) and torch's class names
    (``ScheduleZBVZeroBubble``, ``Interleaved1F1B``), through :func:`simtrain.schedules.names.canonical_schedule`.

    Raises:
        SimtrainError: an unknown name, a schedule torch has no class for, or none at all.
    """
    if text is None:
        return list(TORCH_SCHEDULES)
    key_of = {name: key for key, name in TORCH_ALIASES.items()}
    names = []
    for raw in text.split(","):
        if not raw.strip():
            continue
        name = canonical_schedule(raw, "--schedules")
        if key_of.get(name) not in TORCH_SCHEDULES:
            raise SimtrainError(f"--schedules: '{raw.strip()}' has no torch.distributed.pipelining class; validate "
                                f"runs {sorted(TORCH_ALIASES[k] for k in TORCH_SCHEDULES)}")
        names.append(key_of[name])
    if not names:
        raise SimtrainError("--schedules: give at least one schedule name")
    return names
