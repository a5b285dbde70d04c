"""The Python API: simulate one schedule, or compare several, from a notebook or a script.

Everything here is a thin layer over :func:`simtrain.scenario.run_schedule`, the same call
``simtrain compare`` makes, so a :class:`Report` carries exactly the numbers of the CLI's ``--json``
row. Units are SI: seconds, bytes, FLOP/s; ratios in [0, 1].
"""

from __future__ import annotations

import dataclasses
import html
import sys
import warnings
from numbers import Real
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from pydantic import ValidationError

from .errors import SimtrainError, describe_validation_error
from .hardware import HardwareProfile, load_profile
from .metrics import Report as _MetricsReport
from .models import ModelSpec
from .models import load_model as _load_model
from .parallel import ParallelConfig
from .checks import (MAX_OP_TIME_S, MAX_TASKS, check_applicable, check_max_tasks, check_dtype, check_schedule_names,
                     check_simplified, check_structure, op_times_ok)
from .cost_models import check_kernels, hfu, parse_cost_choice, recompute_modules
from .costs.stage import check_settings
from .schedules.ir import ScheduleWarning, settings_named
from .export import check_output_path, with_lanes
from .scenario import ScheduleRun, run_schedule

__all__ = ["simulate", "compare", "load_model", "load_hardware", "Report", "Comparison"]


def load_model(name_or_path: str | Path) -> ModelSpec:
    """A model by preset name (``llama3-8b``), model YAML file, or HuggingFace ``config.json``.

    Returns:
        The :class:`~simtrain.models.ModelSpec`; ``.total_params`` and ``.activated_params`` count
        its parameters.

    Raises:
        SimtrainError: unknown name, missing or malformed file, an invalid field, or an HF
            ``model_type`` simtrain does not map.
    """
    return _load_model(name_or_path)


def load_hardware(name_or_path: str | Path) -> HardwareProfile:
    """A hardware profile by built-in name (``h100-sxm``) or YAML file path, in SI units.

    Raises:
        SimtrainError: unknown name, missing or malformed file, or an invalid field.
    """
    return load_profile(name_or_path)


@dataclass
class Report(_MetricsReport):
    """One schedule's simulated step: every field of the ``simtrain compare --json`` row (see
    :class:`simtrain.metrics.Report` for their definitions), plus

    Attributes:
        trace: the task table (one row per compute/communication task; ``start_s``, ``end_s`` in s),
            with the CSV's ``lane`` column (:func:`simtrain.export.with_lanes`).
        memory: the memory table (``rank``, ``time_s``, ``bytes``).
        run: the :class:`~simtrain.scenario.ScheduleRun` (schedule, costs, engine result).

    In a notebook the report shows as its summary table and timeline (:meth:`_repr_html_`).
    """

    trace: pd.DataFrame | None = field(default=None, repr=False, compare=False)
    memory: pd.DataFrame | None = field(default=None, repr=False, compare=False)
    run: ScheduleRun | None = field(default=None, repr=False, compare=False)

    @classmethod
    def from_run(cls, run: ScheduleRun) -> Report:
        """Wrap a :class:`ScheduleRun` (its metrics report, trace and memory)."""
        row = {name: getattr(run.report, name) for name in run.report.__dataclass_fields__}
        return cls(**row, trace=with_lanes(run.result.trace), memory=run.result.memory, run=run)

    def to_row(self) -> dict:
        """The ``--json`` row: a JSON-serialisable dict without the trace and memory tables."""
        return self.run.report.to_row() if self.run is not None else {
            k: v for k, v in super().to_row().items() if k not in ("trace", "memory", "run")}

    def _repr_html_(self) -> str:
        """Summary table and timeline as HTML (for Jupyter; plotly.js as the notebook renders it)."""
        from .viz import summary_table_html, timeline_figure

        fig = timeline_figure(self.trace, title=f"{self.schedule}: timeline")
        return summary_table_html([self.run.report]) + fig._repr_html_()


class Comparison(list):
    """The :class:`Report` of each schedule compared, in the order asked for."""

    def to_frame(self) -> pd.DataFrame:
        """One row per schedule with the scalar fields of the ``--json`` row, plus
        ``peak_memory_bytes_max``: the worst rank's peak (the row's per-rank ``peak_memory_bytes``, maximised)."""
        rows = [{**{k: v for k, v in r.to_row().items() if not isinstance(v, (list, dict))},
                 "peak_memory_bytes_max": max(r.peak_memory_bytes)} for r in self]
        return pd.DataFrame(rows)

    def write_html(self, path: str | Path, title: str = "simtrain comparison", force: bool = False) -> Path:
        """Write the comparison dashboard (the page ``simtrain compare --out`` writes: summary,
        bars, and per schedule a timeline, memory and link use; self-contained, opens offline),
        atomically.

        Args:
            path: an ``.html`` file name; an existing file simtrain did not write is kept unless
                ``force`` (as ``compare --out``).

        Returns:
            The path written.

        Raises:
            SimtrainError: not an ``.html`` name, a folder, or a user's file without ``force``.
        """
        from .viz import Panel, write_dashboard

        path = check_output_path(Path(path), "write_html(path)", ".html", force=force, force_name="force=True")
        write_dashboard(path, [Panel(r.run.report, r.trace, r.memory) for r in self], title)
        return path

    def _repr_html_(self) -> str:
        """The summary table of every schedule, then each timeline."""
        from .viz import summary_table_html, timeline_figure

        parts = [summary_table_html([r.run.report for r in self])]
        parts += [timeline_figure(r.trace, title=f"{html.escape(r.schedule)}: timeline")._repr_html_() for r in self]
        return "".join(parts)


def _inputs(model, hardware, parallel: dict[str, Any]) -> tuple[ModelSpec, HardwareProfile, ParallelConfig]:
    """The model, profile and parallel config of a call, each checked.

    A ModelSpec is validated again (``model_copy(update=...)`` skips pydantic's checks), so a
    bad field is named as in a model file.

    Raises:
        SimtrainError: a model or hardware that is neither a name, a path nor a spec/profile, or
            an invalid field (naming it).
    """
    for arg, value, kind in (("model", model, ModelSpec), ("hardware", hardware, HardwareProfile)):
        if not isinstance(value, (str, Path, kind)):
            raise SimtrainError(f"{arg} = {value!r}: expected a name, a file path or a {kind.__name__}, "
                                f"not {type(value).__name__}")
    try:
        spec = ModelSpec.model_validate(model.model_dump(warnings=False)) if isinstance(model, ModelSpec) else load_model(model)
    except ValidationError as exc:
        raise SimtrainError(describe_validation_error(exc, f"simtrain.simulate(model={model.name!r})")) from None
    hw = hardware if isinstance(hardware, HardwareProfile) else load_hardware(hardware)
    try:
        config = ParallelConfig.model_validate({k: v for k, v in parallel.items() if v is not None})
    except ValidationError as exc:
        raise SimtrainError(describe_validation_error(exc, "simtrain.simulate()")) from None
    return spec, hw, config


def argument_name(field: str, value: object) -> str:
    """How the Python API's refusals and warnings name a setting: as its argument, ``tp=3``
    (the CLI's :func:`simtrain.parallel.flag_name` says ``--tp 3``)."""
    return f"{field}={value!r}"


_PACKAGE = Path(__file__).resolve().parent


class _warnings_at_caller:
    """Re-issue the warnings of the block at the first frame outside simtrain (the user's call
    of :func:`compare` / :func:`simulate`), so Python's default format shows the user's line,
    not simtrain's own source."""

    def __enter__(self):
        self._catch = warnings.catch_warnings(record=True)
        self._caught = self._catch.__enter__()
        warnings.simplefilter("always")
        return self

    def __exit__(self, *exc) -> None:
        self._catch.__exit__(*exc)
        frame, level = sys._getframe(1), 2  # level 1 is this function's warnings.warn line
        while frame is not None and Path(frame.f_code.co_filename).resolve().is_relative_to(_PACKAGE):
            frame, level = frame.f_back, level + 1
        for w in self._caught:
            warnings.warn(w.message, w.category, stacklevel=level)


def _call_arguments(schedules: Any, op_times: Any, comm: Any) -> tuple[list[str], tuple[float, float, float] | None, bool]:
    """:func:`compare`'s ``schedules`` (one name or a non-empty list of names), ``op_times``
    (any sequence of three numbers F, I, W in seconds, as ``--op-times``: a tuple, a list, a
    numpy array) and ``comm`` (a bool), checked.

    Raises:
        SimtrainError: one line naming the argument, its value and what is allowed.
    """
    if isinstance(schedules, str):  # one name, or a comma-separated list as compare --schedules takes
        schedules = [n.strip() for n in schedules.split(",")]
    if not isinstance(schedules, (list, tuple)) or not schedules or not all(isinstance(n, str) for n in schedules):
        raise SimtrainError(f"schedules = {schedules!r}: expected a schedule name or a non-empty list of names "
                            "(e.g. ['1f1b'])")
    check_schedule_names(list(schedules), "schedules")
    if op_times is not None:
        values = None if isinstance(op_times, (str, bytes, dict)) or not hasattr(op_times, "__iter__") \
            else list(op_times)
        numbers = values is not None and all(isinstance(t, Real) and not isinstance(t, bool) for t in values)
        if not numbers or not op_times_ok([float(t) for t in values]):
            raise SimtrainError(f"op_times = {op_times!r}: expected three numbers F, I, W from 0 to "
                                f"{MAX_OP_TIME_S:g} seconds, at least one > 0, e.g. (1, 1, 1)")
        op_times = tuple(float(t) for t in values)
    if not isinstance(comm, bool):
        raise SimtrainError(f"comm = {comm!r}: expected True or False")
    return list(schedules), op_times, comm


def compare(
    model: str | Path | ModelSpec,
    hardware: str | Path | HardwareProfile,
    *,
    schedules: list[str] | tuple[str, ...] = ("gpipe", "1f1b"),
    tp: int | None = None, pp: int | None = None, dp: int | None = None, ep: int | None = None,
    vp: int | None = None, microbatches: int | None = None, microbatch_size: int | None = None,
    seq_len: int | None = None, op_times: tuple[float, float, float] | None = None, comm: bool = True,
    cost_model: str = "auto", max_tasks: int = MAX_TASKS,
    **options: Any,
) -> Comparison:
    """Simulate one training step per schedule, as ``simtrain compare --model ... --hardware ...``.

    Args:
        model: preset name, model YAML or HF ``config.json`` path, or a ModelSpec.
        hardware: profile name or YAML path, or a HardwareProfile.
        schedules: schedule names as ``compare --schedules`` takes them (``1f1b+waved-ep`` too).
        tp, pp, dp, ep, vp, microbatches, microbatch_size, seq_len: the ParallelConfig degrees and
            step shape (None: its default, as when the CLI flag is left out; seq_len in tokens).
        op_times: fixed (F, I, W) seconds per action instead of the cost model.
        comm: False makes all communication free (``--no-comm``).
        cost_model: ``auto`` (the per-operator model where the profile has kernel tables),
            ``flat`` or ``ops``, as ``compare --cost-model`` (:mod:`simtrain.cost_models`).
        max_tasks: the ceiling on the estimated simulated tasks of all schedules, as ``compare
            --max-tasks`` (default :data:`simtrain.checks.MAX_TASKS`; a run above it is refused
            before anything is generated, :func:`simtrain.checks.check_structure`).
        **options: any other :class:`~simtrain.parallel.ParallelConfig` field (``dtype``,
            ``zero_stage``, ``recompute``, ``waves``, ``expert_imbalance``, ...); ``recompute`` also
            takes compare's module lists (``"norm,mla_up"``) and ``fp8="gemms"`` compare's ``--fp8``
            (both for the per-operator model).

    Returns:
        A :class:`Comparison` (a list of :class:`Report`).

    Raises:
        SimtrainError: bad input, an unknown schedule, a setting that applies to none of the
            schedules (e.g. ``vp`` without an interleaved one, as the CLI refuses), a run estimated
            above ``max_tasks``, or a configuration that cannot run (static memory over HBM, a
            model/parallel mismatch).
    """
    schedules, op_times, comm = _call_arguments(schedules, op_times, comm)
    check_max_tasks(max_tasks)
    fp8 = options.pop("fp8", None)
    with _warnings_at_caller():
        modules = recompute_modules(options.get("recompute"), argument_name)  # a module list, as compare --recompute
        if modules:
            options["recompute"] = "none"
        spec, hw, config = _inputs(model, hardware, dict(
            tp=tp, pp=pp, dp=dp, ep=ep, vp=vp, microbatches=microbatches, microbatch_size=microbatch_size,
            seq_len=seq_len, **options))
        given = {k for k, v in dict(tp=tp, pp=pp, dp=dp, ep=ep, vp=vp, microbatches=microbatches,
                                   microbatch_size=microbatch_size, seq_len=seq_len, **options).items() if v is not None}
        check_settings(spec, config, hw, argument_name)  # as the CLI's loader: heads vs tp, EP, CP, trainable
        check_applicable(list(schedules), spec, hw, config, given, name=argument_name)  # a setting that changes nothing
        check_structure(schedules, spec, config, max_tasks, api=True, name=argument_name)  # stages vs layers, tasks
        check_simplified("op_times" if op_times else None, None if comm else "comm=False",
                         {"--cost-model": None if cost_model == "auto" else cost_model, "--recompute": modules,
                          "--fp8": fp8, "--attention-kernel": options.get("attention_kernel"),
                          "--fused-projections": False if options.get("fused_projections") is False else None,
                          "--kernels": "compiled-blocks" if options.get("kernels") == "compiled-blocks" else None,
                          "--tp-overlap": options.get("tp_overlap") or None,
                          "--tp-overlap-fraction": options.get("tp_overlap_fraction")}, argument_name)
        choice = parse_cost_choice(cost_model, modules, fp8, hw.attention_kernel(config.attention), hw, argument_name)
        check_kernels(choice, config)
        check_dtype(hw, config, choice.model == "ops", "dtype" not in options, argument_name)
        runtime = choice.runtime(spec, config, hw)
        with settings_named(argument_name):  # a schedule's refusal of pp, microbatches, vp: as arguments
            runs = [run_schedule(s, spec, hw, config, op_times=op_times, comm=comm, runtime=runtime, name=argument_name)
                    for s in schedules]
        runs = [dataclasses.replace(r, report=dataclasses.replace(r.report, hfu=hfu(r, spec, config, hw, choice)))
                for r in runs]
        for r in runs:
            if not r.report.fits_in_hbm:  # as compare's warning (the CLI also fails when no schedule fits)
                peak = max(r.report.peak_memory_bytes)
                warnings.warn(f"{r.report.schedule} does not fit in HBM: rank {r.report.peak_memory_bytes.index(peak)} "
                              f"peaks at {peak / 2**30:.1f} GiB of {r.report.hbm_bytes / 2**30:.0f} GiB",
                              ScheduleWarning, stacklevel=2)
    return Comparison(Report.from_run(r) for r in runs)


def simulate(
    model: str | Path | ModelSpec,
    hardware: str | Path | HardwareProfile,
    *,
    schedule: str = "1f1b",
    **kwargs: Any,
) -> Report:
    """Simulate one training step of one schedule; the arguments are :func:`compare`'s, with one
    ``schedule`` name instead of a list.

    Returns:
        The :class:`Report`; ``simulate(model="llama3-8b", hardware="h100-sxm", tp=8,
        schedule="1f1b").step_time_s`` is the ``step_time_s`` of ``simtrain compare --model
        llama3-8b --hardware h100-sxm --tp 8 --schedules 1f1b --json``.

    Raises:
        SimtrainError: as :func:`compare`.
    """
    if not isinstance(schedule, str):
        raise SimtrainError(f"schedule = {schedule!r}: expected one schedule name (compare() takes a list)")
    return compare(model, hardware, schedules=[schedule], **kwargs)[0]
