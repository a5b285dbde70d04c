"""The settings step of a command: a scenario file merged with the flags, validated, naming the
flag or the file's field in every error."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from ..checks import MAX_OP_TIME_S, op_times_ok
from ..errors import SimtrainError
from ..hardware import HardwareProfile, load_profile
from ..importers import ImportedJob
from ..models import ModelSpec, load_model
from ..costs.stage import check_settings
from ..parallel import ParallelConfig, file_field_label, file_field_name, flag_name
from ..scenario import DEFAULT_SCENARIO, Scenario, load_scenario
from ..schedules import Schedule

def flag_of(field: str) -> str:
    """The command-line flag of a ParallelConfig field (``microbatch_size`` -> ``--microbatch-size``)."""
    return f"--{field.replace('_', '-')}"


def _label(field: str, given: set[str] | dict, source: str, names: dict[str, str] | None) -> str:
    """A parallel setting's flag where it was typed, else the file's field (or an imported job's
    own name of it in ``names``)."""
    return flag_of(field) if field in given else file_field_label(source, field, names)


def setting_name(given: set[str], source: str, names: dict[str, str] | None = None) -> Callable[[str, object], str]:
    """How an error names a setting and its value: the flag where it was typed (``--ep 4``,
    :func:`simtrain.parallel.flag_name`), and so for every command-line-only option that is no
    :class:`ParallelConfig` field (``cost_model``, ``fp8``); else the file's field (``s.yaml: field
    'parallel.ep' = 4``, :func:`simtrain.parallel.file_field_name`; an imported job's own name of
    it in ``names``)."""
    in_file = file_field_name(source, names)
    return lambda field, value: (flag_name(field, value) if field in given or field not in ParallelConfig.model_fields
                                 else in_file(field, value))


def parallel_from(base: dict, overrides: dict, source: str, names: dict[str, str] | None = None) -> ParallelConfig:
    """Merge CLI overrides into a scenario's parallel section and validate, naming flags on error.

    Args:
        base: the file's parallel fields.
        overrides: the flags' values (None: not given).
        source: the file, for messages about its fields.
        names: the file's own name of a field (an imported job's ``--tensor-model-parallel-size``),
            default ``field 'parallel.<field>'``.

    Raises:
        SimtrainError: one clause per problem, naming the flag or the file's field, its value and
            what is allowed; a rule across fields names the flags and fields it mentions.
    """
    given = {k: v for k, v in overrides.items() if v is not None}
    merged = {**base, **given}

    def where(field: str) -> str:
        return _label(field, given, source, names)

    try:
        return ParallelConfig.model_validate(merged)
    except ValidationError as exc:
        parts = []
        for e in exc.errors():
            msg = e["msg"].removeprefix("Value error, ")
            if not e["loc"]:  # a rule across fields: its message names them
                named = [f for f in ParallelConfig.model_fields if f in merged and re.search(rf"\b{f}\b", msg)]
                settings = " and ".join(f"{where(f)} = {merged[f]!r}" for f in named) or f"parallel settings ({source})"
                parts.append(f"{settings}: {msg}")
                continue
            field = str(e["loc"][0])
            parts.append(f"{where(field)} = {e.get('input')!r}: {msg}")
        raise SimtrainError("; ".join(parts)) from None


def parse_op_times(text: str) -> tuple[float, float, float]:
    try:
        values = tuple(float(x) for x in text.split(","))
    except ValueError:
        values = ()
    if not op_times_ok(values):
        raise SimtrainError(f"--op-times = {text!r}: expected three numbers F,I,W from 0 to {MAX_OP_TIME_S:g} "
                            "seconds, at least one > 0, e.g. 1,1,1")
    return values  # type: ignore[return-value]


@dataclass
class Settings:
    """What a command simulates, after merging a scenario file with the flags."""

    scenario: Scenario
    source: str
    flags_only: bool
    model: ModelSpec
    hardware: HardwareProfile
    parallel: ParallelConfig
    op_times: tuple[float, float, float] | None
    comm: bool
    name: Callable[[str, object], str] = flag_name
    """How an error or warning names a parallel setting and its value (:func:`setting_name`)."""
    recompute_modules: str | None = None
    """The scenario file's ``parallel.recompute`` module list, unless ``--recompute`` replaces it."""


def load_settings(scenario: Path | None, model: str | None, hardware: str | None, overrides: dict,
                  op_times: str | None, no_comm: bool, job: ImportedJob | None = None) -> Settings:
    """Merge the scenario file (default: the built-in scenario 'default'), or a job imported with
    ``--from-megatron``/``--from-torchtitan``, with the flags; validate all."""
    flags_only = scenario is None and (model is not None or job is not None)  # --hardware alone: the default
    if job is not None and (scenario is not None or model is not None):
        raise SimtrainError(f"{job.source} gives the model and the parallel settings: drop the scenario file "
                            "and --model")
    if flags_only and hardware is None:
        raise SimtrainError("give both --model and --hardware (or a scenario file)")
    if job is not None:
        base = Scenario(model=job.model.name, hardware=hardware, schedules=job.schedules)
        source, file_parallel = f"{job.flag} {job.source}", job.parallel
    elif flags_only:
        base, source, file_parallel = Scenario(model=model, hardware=hardware), "command line", {}
    else:
        path = scenario or DEFAULT_SCENARIO
        base = load_scenario(path)
        source, file_parallel = str(path), base.parallel.model_dump(exclude_unset=True)
    parallel = parallel_from(file_parallel, overrides, source, job.fields if job else None)
    times = parse_op_times(op_times) if op_times else base.op_times
    spec = job.model if job is not None else _from_file(load_model, model, base.model, source, "model")
    hw = _from_file(load_profile, hardware, base.hardware, source, "hardware")
    name = flag_name if flags_only else setting_name({k for k, v in overrides.items() if v is not None}, source,
                                                      job.fields if job else None)
    check_settings(spec, parallel, hw, name)
    modules = base.recompute_modules if overrides.get("recompute") is None else None
    return Settings(base, source, flags_only, spec, hw, parallel, times, not (no_comm or base.no_comm), name, modules)


def _from_file(load: Callable, flag_value: str | None, file_value: str, source: str, field: str):
    """``load(flag_value)`` where the flag was given, else ``load(file_value)`` with a refusal
    naming the scenario file's field (``s.yaml: field 'model': unknown model 'llama9' ...``).

    Raises:
        SimtrainError: what ``load`` raises, prefixed with the file and field when they gave it.
    """
    if flag_value is not None:
        return load(flag_value)
    try:
        return load(file_value)
    except SimtrainError as exc:
        raise SimtrainError(f"{source}: field '{field}': {exc}") from None


def fit_to_file(
    parallel: ParallelConfig, schedule: Schedule, path: Path, pp: int | None, microbatches: int | None
) -> ParallelConfig:
    """The parallel config with pp and microbatches of an imported schedule.

    Raises:
        SimtrainError: ``--pp`` or ``--microbatches`` was given and disagrees with the file.
    """
    for flag, given, actual, what in (("--pp", pp, schedule.num_ranks, "ranks (rows)"),
                                      ("--microbatches", microbatches, schedule.num_microbatches, "microbatches")):
        if given is not None and given != actual:
            raise SimtrainError(f"{flag} = {given}: the schedule file {path} has {actual} {what}; "
                                f"drop {flag} or make them agree")
    return parallel.model_copy(update={"pp": schedule.num_ranks, "microbatches": schedule.num_microbatches})


