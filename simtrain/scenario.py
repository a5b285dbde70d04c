"""Scenarios: what to simulate (model, hardware, parallelism, schedules), and running one schedule
end to end: generate -> cost -> lower -> simulate -> report.

A scenario file has the fields of :class:`Scenario`; the CLI's flags override them. The reference
scenarios ship inside the package (``simtrain/scenarios/<name>.yaml``, read with
:mod:`importlib.resources`) and can be named instead of given by path.
"""

from __future__ import annotations

from importlib import resources

from collections.abc import Callable
import dataclasses
import gc
from dataclasses import dataclass, replace
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator

from .checks import MAX_OP_TIME_S, op_times_ok
from .costs import StageCosts, stage_costs
from .engine import SimResult, gc_paused, simulate
from .errors import SimtrainError, load_yaml_file, validate_model
from .hardware import GiB, HardwareProfile
from .lowering import lower
from .memory import memory_breakdown
from .metrics import Report, compute_report
from .models import ModelSpec
from .network import Topology
from .parallel import ParallelConfig, file_field_name, flag_name
from .moe import resolve_waves
from .schedules import Schedule, generate, split_name

SCENARIO_DIR = Path(str(resources.files("simtrain").joinpath("scenarios")))
"""The built-in scenarios (package data)."""
DEFAULT_SCENARIO = SCENARIO_DIR / "default.yaml"


def available_scenarios() -> list[str]:
    """Names of the built-in scenarios, sorted."""
    return sorted(p.stem for p in SCENARIO_DIR.glob("*.yaml"))


def resolve_scenario_path(path: Path) -> Path:
    """A scenario file path, or the built-in scenario of that name when no such file exists.

    Raises:
        SimtrainError: neither a file nor a built-in scenario name.
    """
    if path.exists() or path.suffix in (".yaml", ".yml"):
        return path
    if (SCENARIO_DIR / f"{path}.yaml").is_file():
        return SCENARIO_DIR / f"{path}.yaml"
    raise SimtrainError(f"{path}: no such scenario file, and not one of the built-in scenarios "
                        f"{available_scenarios()}")


class Scenario(BaseModel):
    """A scenario file.

    Attributes:
        title: heading of the dashboard.
        source: where the setting comes from (paper, report).
        model: preset name or model YAML path.
        hardware: profile name or profile YAML path.
        parallel: the :class:`ParallelConfig` fields.
        schedules: registry names to compare (default gpipe and 1f1b; ``--schedules`` overrides).
        op_times: fixed (F, I, W) seconds per action instead of the cost model.
        no_comm: make all communication free.
        out: HTML file to write (relative paths are relative to the scenario file).
        sweep: optional ``{field: [values]}`` to sweep (see :mod:`simtrain.sweep`).
    """

    model_config = ConfigDict(extra="forbid")

    title: str = "simtrain comparison"
    source: str = ""
    model: str
    hardware: str
    parallel: ParallelConfig = Field(default_factory=ParallelConfig)
    schedules: list[str] = Field(default=["gpipe", "1f1b"], min_length=1)  # (pydantic copies it per instance)
    op_times: tuple[float, float, float] | None = None

    @field_validator("op_times")
    @classmethod
    def _op_times_valid(cls, v: tuple[float, float, float] | None) -> tuple[float, float, float] | None:
        if v is not None and not op_times_ok(v):
            raise ValueError(f"each of F, I, W must be a number from 0 to {MAX_OP_TIME_S:g} seconds, at least one > 0")
        return v
    no_comm: bool = False
    out: str | None = None
    sweep: dict[str, list[int]] | None = None
    _recompute_modules: str | None = PrivateAttr(default=None)

    @property
    def recompute_modules(self) -> str | None:
        """``parallel.recompute`` when the file gives a module list (``norm,swiglu``, as ``compare
        --recompute`` takes it, for the per-operator cost model; ``parallel.recompute`` is then
        ``none``), else None."""
        return self._recompute_modules


def load_scenario(path: Path) -> Scenario:
    """Read and validate a scenario YAML file (or a built-in scenario, by name); a relative
    ``out`` is resolved against the file's folder (against the current directory for a built-in
    scenario: the package folder is not the user's), and so is a relative ``model`` or
    ``hardware`` YAML file that exists there.

    Raises:
        SimtrainError: missing file, malformed YAML, or an invalid field.
    """
    from .cost_models import recompute_modules  # (it imports this module)

    path = resolve_scenario_path(path)
    data = load_yaml_file(path)
    section = data.get("parallel") if isinstance(data, dict) else None
    modules = None
    if isinstance(section, dict) and isinstance(section.get("recompute"), str):
        modules = recompute_modules(section["recompute"], file_field_name(str(path)))
        if modules:  # a module list: the cost model's, so the parallel config recomputes none (as compare)
            data = {**data, "parallel": {**section, "recompute": "none"}}
    scenario = validate_model(Scenario, data, str(path))
    scenario._recompute_modules = modules
    built_in = path.resolve().parent == SCENARIO_DIR.resolve()
    if scenario.out and not Path(scenario.out).is_absolute() and not built_in:
        scenario.out = str(path.parent / scenario.out)
    for field in ("model", "hardware"):
        value = Path(getattr(scenario, field))
        if value.suffix in (".yaml", ".yml") and not value.is_absolute() and (path.parent / value).exists():
            setattr(scenario, field, str(path.parent / value))
    return scenario


@dataclass
class ScheduleRun:
    """Everything one schedule's simulation produced.

    Attributes:
        schedule: the generated schedule.
        costs: the per-chunk costs used.
        result: the engine's trace and memory timeline.
        report: the metrics.
    """

    schedule: Schedule
    costs: StageCosts
    result: SimResult
    report: Report


def check_static_memory(costs: StageCosts, schedule: Schedule, hardware: HardwareProfile, where: str,
                        parallel: ParallelConfig | None = None,
                        name: Callable[[str, object], str] = flag_name) -> None:
    """Refuse a configuration whose parameters, gradients and optimizer states alone overflow HBM.

    Args:
        costs, schedule, hardware: what runs where; where: the run, for the message.
        parallel: its settings, for the hint (None: no hint naming them).
        name: how the hint names a setting, from its field and value (the flag, a scenario
            file's field, an API argument).

    Raises:
        SimtrainError: naming the rank, the bytes it needs and the HBM it has.
    """
    for rank in range(schedule.num_ranks):
        need = costs.static_bytes({schedule.chunk_of(s) for s in schedule.stages_of(rank)})
        if need > hardware.hbm_bytes:
            hint = "raise the TP or PP degree"
            if parallel is not None:
                hint += f" ({name('tp', parallel.tp)}, {name('pp', parallel.pp)})"
            if parallel is not None and parallel.zero_stage < 3 and parallel.dp > 1:
                hint += f", or use {name('zero_stage', parallel.zero_stage + 1)}"
            raise SimtrainError(
                f"{where}: does not fit in HBM: pipeline rank {rank} needs {need / GiB:.1f} GiB for "
                f"parameters, gradients and optimizer states alone, and {hardware.name} has "
                f"{hardware.hbm_bytes / GiB:.0f} GiB; {hint}"
            )


_kept_graph: list | None = None
"""The last simulated task graph, held here (at most one) once :func:`keep_last_graph` was
called; None: a run frees its graph as it returns."""


def keep_last_graph(keep: bool = True) -> None:
    """Keep the task graph of the last :func:`run_schedule` alive until the next one begins,
    instead of freeing it as the run returns, and put what each run leaves out of the cyclic
    garbage collector's sight (``gc.freeze``); ``keep=False``: neither (the default).

    For a process that ends soon without freeing what is left (``simtrain compare`` run by the
    console script, :func:`simtrain.cli.run`): its last graph is then never freed, which saves
    what freeing it costs (~0.07 s of CPU here for a DeepSeek-V3 step of 243k tasks, ~10^6
    objects with their lists), and the collector's next collection does not scan the objects the
    run left (~0.1 s with the graph kept, ~0.03 s without: a run pauses the collector, so all of
    them would still be in its youngest generation; measured on ``benchmarks/bench_speed.py``'s
    DeepSeek-V3 case). At most one graph is kept, and it is freed when the next run begins,
    before that run builds its own, so peak memory is what it was. Frozen objects are still freed
    when their last reference goes; only cyclic garbage among them stays (~25 objects a run,
    measured with ``gc.collect()`` after DeepSeek-V3 and Llama 3 70B steps). Nothing that is
    computed depends on it."""
    global _kept_graph
    _kept_graph = [] if keep else None


def run_schedule(
    schedule: str | Schedule,
    model: ModelSpec,
    hardware: HardwareProfile,
    parallel: ParallelConfig,
    op_times: tuple[float, float, float] | None = None,
    comm: bool = True,
    waved_ep: bool = False,
    runtime: Callable[[StageCosts], StageCosts] | None = None,
    name: Callable[[str, object], str] = flag_name,
) -> ScheduleRun:
    """Simulate one training step of ``schedule``.

    Args:
        schedule: a registry name (with variants such as ``1f1b+waved-ep``), or a ready
            :class:`Schedule` (e.g. imported from a file).
        model, hardware, parallel: what runs where.
        op_times: fixed (F, I, W) seconds per action, replacing the cost model's durations.
        comm: False makes communication free.
        waved_ep: run MoE layers with Waved-EP (implied by a ``+waved-ep`` name).
        runtime: adjusts the costs to a particular runtime before lowering (e.g. how torch
            splits a backward, :func:`simtrain.calibration.predict.torch_runtime_costs`).
        name: how a refusal names a setting, from its field and value (default the flag; a
            scenario file's field, :func:`simtrain.cli.settings.setting_name`; the Python API's
            argument, :func:`simtrain.api.argument_name`).

    Returns:
        The :class:`ScheduleRun`.

    Raises:
        SimtrainError: invalid schedule parameters, a job on more nodes than the profile's cluster
            (``inter_node.nodes``, :meth:`HardwareProfile.check_nodes`), a model/parallel mismatch,
            static memory that does not fit in HBM, or a schedule that deadlocks.
    """
    with gc_paused():  # the graph's objects die before collection is back on (see gc_paused)
        if _kept_graph is not None:
            _kept_graph.clear()  # the last run's graph, freed before this run builds its own
        run = _run_schedule(schedule, model, hardware, parallel, op_times, comm, waved_ep, runtime, name)
        if _kept_graph is not None:
            gc.freeze()  # (see keep_last_graph)
        return run


def _run_schedule(
    schedule: str | Schedule,
    model: ModelSpec,
    hardware: HardwareProfile,
    parallel: ParallelConfig,
    op_times: tuple[float, float, float] | None,
    comm: bool,
    waved_ep: bool,
    runtime: Callable[[StageCosts], StageCosts] | None,
    name: Callable[[str, object], str],
) -> ScheduleRun:
    """:func:`run_schedule` (with the garbage collector off)."""
    gpn = hardware.gpus_per_node  # the job's GPUs fill whole nodes, consecutive ids per node
    hardware.check_nodes(-(-parallel.world_size // gpn), f"tp x cp x pp x dp = {parallel.world_size:,} GPUs",
                         min(gpn, parallel.world_size))
    if isinstance(schedule, str):
        base, variants = split_name(schedule)  # the name edge: "1f1b+waved-ep" = 1F1B run with Waved-EP
        waved_ep = waved_ep or "waved-ep" in variants
        generated = generate(base, parallel.pp, parallel.microbatches, parallel.vp)
        schedule = replace(generated, name=schedule.strip()) if variants else generated
    else:
        schedule.validate()
        parallel = parallel.model_copy(
            update={"pp": schedule.num_ranks, "microbatches": schedule.num_microbatches}
        )
    waves = resolve_waves(model, parallel, name) if waved_ep else 1
    costs = stage_costs(model, parallel, hardware, schedule.num_chunks)
    if op_times is not None:
        costs = costs.with_op_times(*op_times)
    if runtime is not None:
        costs = runtime(costs)
    check_static_memory(costs, schedule, hardware, f"{model.name} on {hardware.name} with {schedule.name}", parallel, name)
    topology = Topology(hardware, parallel)
    graph = lower(schedule, costs, topology, comm=comm, waves=waves)
    result = simulate(graph)
    if _kept_graph is not None:
        _kept_graph.append(graph)  # (see keep_last_graph)
    tp = parallel.tp_cp  # GPUs sharing one stage's microbatch

    def flops_of(c) -> float:
        return c.forward_flops if parallel.forward_only else c.model_flops

    flops = sum(
        flops_of(costs.chunks[schedule.chunk_of(s)]) * tp
        for mb in range(schedule.num_microbatches)
        for s in schedule.path(mb)
    )
    report = compute_report(
        schedule.name,
        result,
        hbm_bytes=hardware.hbm_bytes,
        model_flops_per_replica=flops,
        peak_flops=hardware.peak_flops[parallel.dtype],
        gpus_per_replica=tp * schedule.num_ranks,
        dp=parallel.dp,
        tokens_per_replica=schedule.num_microbatches * costs.tokens_per_microbatch,
        mfu_valid=not costs.fixed_op_times,
    )
    parts = memory_breakdown(result, costs, schedule)
    report = dataclasses.replace(report, memory_breakdown_bytes=parts,
                                 fits_in_hbm=max(sum(p.values()) for p in parts) <= hardware.hbm_bytes)
    return ScheduleRun(schedule, costs, result, report)
