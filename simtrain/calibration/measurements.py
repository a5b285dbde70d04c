"""The shapes of what the ranks measure, as they travel from the ranks to the parent process (JSON)
and on to the fits and the validation: typed dictionaries, so the JSON files and the code that
reads them agree on one definition. All times in seconds, memory in bytes.

Action keys (``"2F"``, ``"0W"``) are a stage and an action kind (F, B, I, W).
"""

from __future__ import annotations

from typing import TypedDict


class PipelineRun(TypedDict):
    """One torch schedule on one model, measured on every rank (:mod:`.pipeline_runs`)."""

    schedule: str
    """torch schedule name (a key of :data:`simtrain.calibration.workload.TORCH_SCHEDULES`)."""
    model: dict
    """The :class:`simtrain.calibration.workload.ValidationModel` fields."""
    step_times_s: list[float]
    """Per measured step: from a common start until the slowest rank is done."""
    activation_peak_bytes: list[float]
    """Per rank: activation peak of one extra step (0 when not measured)."""
    orders: list[list[str]]
    """Per rank: torch's compute order, action text (``pipeline_order`` or what ran)."""
    recorded: list[list[str]]
    """Per rank: the actions it ran in the last measured step."""
    stage_to_rank: list[int]
    """Placement of stages on ranks."""
    action_s: dict[str, float]
    """Per stage and kind: median wall seconds of an action."""
    action_compute_s: dict[str, float]
    """Per stage and kind: median compute-clock seconds of an action."""
    optimizer_compute_s: list[float]
    """Per rank: median compute-clock seconds of the optimizer step."""
    params: list[int]
    """Per rank: parameters its stages hold."""
    probe_s: list[float]
    """Per probe (one before each step and one after the last): median over ranks."""
    preemption: list[float]
    """Per step: wall / thread-CPU time of all ranks' actions (1 when no other process delayed them)."""


class PipelineMeasurements(TypedDict):
    """:func:`simtrain.calibration.pipeline_runs.measure_schedules`' result."""

    runs: dict[str, PipelineRun]
    """Case label -> its measurements."""
    probe_keys: dict[str, list[list]]
    """The speed probe's kernel shapes, grouped as ``linear``, ``attention``, ``elementwise``."""
    probe_model: dict
    """The model whose shapes the probe uses (ValidationModel fields)."""
    cpu_time_profile: bool
    """Whether the compute clock was thread CPU time (one-thread CPU ranks)."""


class ValidationResult(TypedDict):
    """The ``validate`` job's result (:func:`simtrain.calibration.pipeline_runs.run_rank`)."""

    schedules: dict[str, PipelineRun]
    world: int
    model: dict
    cpu_time_profile: bool
    probe_keys: dict[str, list[list]]
