"""Sweeps: simulate the same comparison for several values of one parallel setting.

``simtrain compare ... --sweep microbatches=8,16,32,64`` (or a scenario's ``sweep:`` mapping,
``sweep: {microbatches: [8, 16, 32, 64]}``) runs every schedule at every value and gives one row
per (schedule, value): bubble ratio, tokens/s, peak memory and step time. A point that cannot be
simulated (a schedule that does not take that value, static memory over HBM, ...) becomes a row
with its ``error`` and no numbers, so one impossible point does not hide the others.

A sweep over pp, tp or dp changes the GPU count, so every row also carries its GPUs, tokens/s per
GPU and MFU, which compare points of different sizes fairly (the table shows them; the plot draws
tokens/s per GPU when the GPU count varies).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pydantic import ValidationError

from .errors import SimtrainError
from .hardware import HardwareProfile
from .models import ModelSpec
from .parallel import ParallelConfig
from .scenario import run_schedule

if TYPE_CHECKING:
    import pandas as pd

SWEEPABLE = ("microbatches", "pp", "vp", "tp", "dp", "microbatch_size")
"""ParallelConfig fields a sweep may vary."""

ROW_COLUMNS = ["schedule", "field", "value", "gpus", "step_time_s", "bubble_ratio", "tokens_per_s",
               "tokens_per_s_per_gpu", "mfu",
               "peak_memory_bytes_max", "hbm_bytes", "fits_in_hbm", "error_message"]
"""Columns of :func:`run_sweep`'s table (SI units; ``peak_memory_bytes_max`` is the worst rank's
peak, a compare row's per-rank ``peak_memory_bytes`` maximised; ``error_message`` is None, or why
the point could not be simulated)."""


@dataclass(frozen=True)
class SweepSpec:
    """One parameter and the values it takes.

    Attributes:
        field: a name of :data:`SWEEPABLE`.
        values: distinct positive integers, in the order given.
    """

    field: str
    values: tuple[int, ...]


def _check(field: str, values: list, where: str) -> SweepSpec:
    if field not in SWEEPABLE:
        raise SimtrainError(f"{where}: cannot sweep '{field}'; choose one of {list(SWEEPABLE)}")
    if not values:
        raise SimtrainError(f"{where}: give at least one value for '{field}'")
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise SimtrainError(f"{where}: {field} value {v!r} is not a positive integer")
        if v in out:
            raise SimtrainError(f"{where}: {field} value {v} is given twice")
        out.append(v)
    return SweepSpec(field, tuple(out))


def parse_sweep(text: str, flag: str = "--sweep") -> SweepSpec:
    """Parse ``"microbatches=8,16,32"``.

    Raises:
        SimtrainError: no ``=``, an unknown field, or a value that is not a positive integer
            (the message names the flag and the value).
    """
    field, sep, rest = text.partition("=")
    where = f"{flag} = {text!r}"
    if not sep:
        raise SimtrainError(f"{where}: expected FIELD=V1,V2,..., e.g. microbatches=8,16,32")
    if field.strip() not in SWEEPABLE:  # before the values, which only a sweepable field gives meaning
        raise SimtrainError(f"{where}: cannot sweep '{field.strip()}'; choose one of {list(SWEEPABLE)}")
    values: list = []
    for part in rest.split(","):
        part = part.strip()
        try:
            values.append(int(part))
        except ValueError:
            raise SimtrainError(f"{where}: '{part}' is not a positive integer") from None
    return _check(field.strip(), values, where)


def sweep_from_mapping(data: dict, source: str) -> SweepSpec:
    """Validate a scenario file's ``sweep`` mapping (one field -> list of values).

    Raises:
        SimtrainError: naming the file, the field ``sweep`` and what is wrong.
    """
    where = f"{source}: field 'sweep'"
    if not isinstance(data, dict) or len(data) != 1:
        raise SimtrainError(f"{where}: expected one parameter and its values, e.g. {{microbatches: [8, 16, 32]}}")
    (field, values), = data.items()
    if not isinstance(values, list):
        raise SimtrainError(f"{where}: the values of '{field}' must be a list")
    return _check(str(field), values, where)


def run_sweep(
    schedules: list[str],
    model: ModelSpec,
    hardware: HardwareProfile,
    parallel: ParallelConfig,
    spec: SweepSpec,
    op_times: tuple[float, float, float] | None = None,
    comm: bool = True,
    on_point: Callable[[str], None] | None = None,
    runtime: Callable[[ParallelConfig], Callable | None] | None = None,
    describe: Callable[[SimtrainError], str] = str,
) -> pd.DataFrame:
    """Simulate every schedule at every value of ``spec``.

    Args:
        schedules: registry names.
        model, hardware: what runs where.
        parallel: the settings the swept field replaces.
        spec: the swept field and its values.
        op_times, comm: as in :func:`simtrain.scenario.run_schedule`.
        on_point: called with ``"<schedule> at <field>=<value>"`` after each point (progress).
        runtime: builds run_schedule's ``runtime`` hook for each point's parallel config (e.g.
            the per-operator cost model, :meth:`simtrain.cost_models.CostChoice.runtime`); None: none.
        describe: the ``error`` text of a point that could not be simulated (default ``str``;
            ``compare`` names a scenario file's settings as its fields).

    Returns:
        DataFrame with :data:`ROW_COLUMNS`, one row per (value, schedule) in that order; rows of
        points that could not be simulated have ``error`` set and NaN numbers.
    """
    rows = []
    for value in spec.values:
        try:
            par = ParallelConfig.model_validate({**parallel.model_dump(), spec.field: value})
        except ValidationError as exc:  # pragma: no cover - _check already keeps values positive
            raise SimtrainError(f"--sweep {spec.field}={value}: {exc.errors()[0]['msg']}") from None
        hook = runtime(par) if runtime is not None else None
        for name in schedules:
            try:
                report = run_schedule(name, model, hardware, par, op_times=op_times, comm=comm, runtime=hook).report
            except SimtrainError as exc:
                rows.append(dict(schedule=name, field=spec.field, value=value, error_message=describe(exc)))
                continue
            finally:
                if on_point is not None:
                    on_point(f"{name} at {spec.field}={value}")
            rows.append(dict(
                schedule=name, field=spec.field, value=value, step_time_s=report.step_time_s,
                bubble_ratio=report.bubble_ratio, tokens_per_s=report.tokens_per_s, mfu=report.mfu,
                gpus=report.gpus, tokens_per_s_per_gpu=report.tokens_per_s / report.gpus,
                peak_memory_bytes_max=max(report.peak_memory_bytes), hbm_bytes=report.hbm_bytes,
                fits_in_hbm=report.fits_in_hbm, error_message=None,
            ))
    import pandas as pd

    return pd.DataFrame(rows, columns=ROW_COLUMNS)


INT_COLUMNS = ("value", "gpus")
"""Sweep columns that hold whole numbers (pandas turns them to floats when a row failed)."""


def sweep_records(rows) -> list[dict]:
    """The rows of :func:`run_sweep` as JSON-ready dicts, typed as the ``runs`` rows are: full
    float precision (pandas' ``to_json`` rounds to 10 digits), whole numbers as ints, and None
    for what a failed point lacks (NaN)."""
    import math

    records = []
    for r in rows.to_dict("records"):
        rec = {k: None if isinstance(v, float) and math.isnan(v) else v.item() if hasattr(v, "item") else v
               for k, v in r.items()}
        records.append({k: int(v) if k in INT_COLUMNS and isinstance(v, float) else v for k, v in rec.items()})
    return records
