"""Which compute cost model a command uses, and what the per-operator model reports about a run.

Two models price a chunk's F, I and W seconds:

* ``flat``: :mod:`simtrain.costs` (every GEMM at the profile's flat efficiency, memory-bound
  kernels free unless calibrated);
* ``ops``: :mod:`simtrain.costs.ops` (a roofline per named operator from cited kernel tables),
  plugged in as :func:`simtrain.scenario.run_schedule`'s ``runtime`` hook.

``auto`` (the commands' default) takes ``ops`` for a shipped profile with kernel tables
(:func:`simtrain.costs.kernels.has_kernel_tables`) and ``flat`` otherwise, so that a calibrated
profile keeps its own measurements.

:class:`CostChoice` holds the choice and the settings only ``ops`` understands (recomputation by
operator, FP8 GEMMs, attention kernel); :func:`stage_breakdown` lists one stage's operators (the
``--breakdown`` table and JSON key) and :func:`hfu` gives the hardware FLOPs utilisation.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable

from .costs import ops as costs_ops
from .costs import StageCosts
from .costs.kernels import flat_only_fields, has_kernel_tables
from .errors import SimtrainError
from .hardware import PROFILE_DIR, HardwareProfile
from .models import ModelSpec
from .parallel import ParallelConfig, flag_name, subject
from .scenario import ScheduleRun
from .schedules.ir import ScheduleWarning

COST_MODELS = ("auto", "flat", "ops")
RECOMPUTE_LEVELS = ("none", "selective", "full")


@dataclasses.dataclass(frozen=True)
class CostChoice:
    """The compute cost model of a command.

    Attributes:
        model: ``flat`` or ``ops``.
        recompute: a ``--recompute MODULE,...`` list (ops only); None: ``parallel.recompute``.
        fp8: ``gemms`` (ops only): FP8 linear-layer GEMMs, attention in the compute dtype.
        attention: ``flash`` (fused kernel) or ``unfused`` (materialised scores), ops only.
    """

    model: str = "flat"
    recompute: str | None = None
    fp8: str | None = None
    attention: str = "flash"
    name: Callable[[str, object], str] = dataclasses.field(default=flag_name, compare=False, repr=False)
    """How a refusal names a parallel setting (:func:`simtrain.parallel.flag_name`; a scenario
    file's loader: its field, :func:`simtrain.cli.settings.setting_name`; the Python API: its argument)."""

    def runtime(self, model: ModelSpec, parallel: ParallelConfig, hardware: HardwareProfile,
                host_bound: bool = True) -> Callable[[StageCosts], StageCosts] | None:
        """The ``runtime`` hook of :func:`simtrain.scenario.run_schedule` (None for ``flat``);
        ``host_bound=False`` leaves out the excess of asynchronous kernel launches over the GPU's
        time (a per-pass maximum, not a sum over layers), for :mod:`simtrain.plan`'s lower bounds.

        Raises:
            SimtrainError: as :func:`simtrain.costs.ops.ops_runtime` (e.g. no kernel tables).
        """
        if self.model == "flat":
            return None
        return costs_ops.ops_runtime(model, parallel, hardware, self.attention, self.recompute, self.fp8,
                                     host_bound, self.name)


def recompute_modules(recompute: str | None, name: Callable[[str, object], str] = flag_name) -> str | None:
    """The ``--recompute`` value if it is a module list (validated), None for a level
    (none/selective/full, left to :class:`simtrain.parallel.ParallelConfig`) or no flag. Every
    entry point that takes a module list parses it here: compare's flag, the API, a scenario
    file's ``parallel.recompute`` and plan's modes.

    Args:
        recompute: the value given.
        name: how a message names the setting, from its field and value (the flag, a file's
            ``s.yaml: field 'parallel.recompute'``, an API argument: :func:`simtrain.api.argument_name`).

    Raises:
        SimtrainError: an unknown module name (one line listing the allowed ones).
    """
    if recompute is None or recompute in RECOMPUTE_LEVELS:
        return None
    if not isinstance(recompute, str):
        raise SimtrainError(f"{subject(name, 'recompute', recompute)}: expected none, selective, full or a comma-separated "
                            "string of module names (e.g. 'norm,mla_up')")
    costs_ops.parse_recompute(recompute, name)
    return recompute


def parse_cost_choice(cost_model: str, modules: str | None, fp8: str | None, attention: str,
                      hardware: HardwareProfile, name: Callable[[str, object], str] = flag_name) -> CostChoice:
    """Validate ``--cost-model``, ``--fp8`` and ``--attention`` and resolve ``auto`` for ``hardware``.

    Args:
        cost_model: ``auto``, ``flat`` or ``ops``.
        modules: a ``--recompute`` module list from :func:`recompute_modules`, or None.
        fp8: None or ``gemms``.
        attention: ``flash`` or ``unfused``.
        hardware: the profile (``auto`` takes ``ops`` when it has kernel tables, for dense and
            MoE models alike: MoE layers are priced by :mod:`simtrain.costs.moe_ops`).
        name: how a message names a setting, from its field and value (the flag, a scenario
            file's field, an API argument); kept as the choice's ``name``.

    Returns:
        The :class:`CostChoice`, its ``model`` ``flat`` or ``ops``.

    Raises:
        SimtrainError: an unknown value, or a per-operator setting that resolves to the flat
            model (one line naming the setting as ``name`` words it).
    """
    if cost_model not in COST_MODELS:
        raise SimtrainError(f"{subject(name, 'cost_model', cost_model)}: choose auto, flat or ops")
    if attention not in ("flash", "unfused"):
        raise SimtrainError(f"{subject(name, 'attention', attention)}: choose flash or unfused")
    if fp8 is not None and fp8 != "gemms":
        raise SimtrainError(f"{subject(name, 'fp8', fp8)}: the only choice is gemms (FP8 GEMMs, attention in the compute dtype)")
    chosen = cost_model if cost_model != "auto" else ("ops" if has_kernel_tables(hardware) else "flat")
    user_file = hardware.path is not None and hardware.path.resolve().parent != PROFILE_DIR.resolve()
    if cost_model == "auto" and chosen == "flat" and user_file and hardware.calibration is None \
            and not flat_only_fields(hardware):
        warnings.warn(f"{hardware.name}: the flat cost model (every GEMM at efficiency.matmul = "
                      f"{hardware.matmul_efficiency}, memory-bound kernels free): its compute figures (efficiency.matmul, "
                      f"peak_tflops of bf16/fp16/fp32/fp8) are no shipped profile's, so the per-operator kernel tables "
                      f"do not apply; calibrate it (simtrain calibrate), or keep a shipped profile's figures to price "
                      f"it by operator", ScheduleWarning, stacklevel=2)
    for field, given in (("recompute", modules), ("fp8", fp8)):
        if given is not None and chosen == "flat":
            why = (f"{name('cost_model', 'flat')} was chosen" if cost_model == "flat" else
                   f"{hardware.name} has no kernel tables (a calibrated profile, or an edited copy of a shipped one, "
                   "keeps its own numbers)")
            raise SimtrainError(f"{subject(name, field, given)}: needs the per-operator cost model "
                                f"({name('cost_model', 'ops')}), and {why}")
    return CostChoice(chosen, modules, fp8, attention, name)


def check_kernels(choice: CostChoice, parallel, given: set[str] | None = None) -> None:
    """Refuse the settings that choose only the per-operator model's kernels where the flat model
    runs: ``kernels: eager`` or ``compiled-blocks`` (its memory-bound operators),
    ``attention_kernel`` (its attention kernel) and ``fused_projections: false`` (its separate
    projection GEMMs, :mod:`simtrain.costs.projections`). Every entry point checks this, CLI and
    API alike; as README's "Settings that do not apply" says, a setting typed as a flag or an API
    argument is an error, the same setting read from a scenario file a warning (the file may serve
    another cost model or profile) and then ignored.

    Args:
        choice: the cost model that runs (``choice.name`` names a setting: the flag, the API's
            argument or the file's field).
        parallel: the :class:`simtrain.parallel.ParallelConfig` that runs.
        given: the ``ParallelConfig`` fields typed as flags; None: every field was typed (the API).

    Raises:
        SimtrainError: one line naming the first such typed setting.

    Warns:
        ScheduleWarning: for each such setting from a scenario file.
    """
    if choice.model == "ops":
        return
    ops = f"({choice.name('cost_model', 'ops')}, on a profile with kernel tables)"
    for field, idle, what in (
            ("kernels", parallel.kernels != "fused", "prices the per-operator model's memory-bound operators"),
            ("attention_kernel", parallel.attention_kernel is not None,
             "prices attention from the per-operator model's measured kernel tables"),
            ("fused_projections", not parallel.fused_projections,
             "prices separate projection GEMMs and their summed input gradients by operator")):
        if not idle:
            continue
        said, why = choice.name(field, getattr(parallel, field)), f"{what}, and the flat cost model runs here {ops}"
        if given is None or field in given:
            raise SimtrainError(f"{said}: {why}")
        warnings.warn(f"{said} is ignored: {why}", ScheduleWarning, stacklevel=2)


def stage_breakdown(run: ScheduleRun, runtime, stage: int) -> dict:
    """Where one stage's time goes, per operator, for one microbatch (and per step).

    Args:
        run: a run simulated with ``runtime``.
        runtime: the :func:`simtrain.costs.ops.ops_runtime` hook it ran with.
        stage: the model chunk (pipeline stage) index.

    Returns:
        ``{"stage", "layers", "operators": [{"name", "bound", "flops", "bytes", "seconds",
        "kernels"}], "total_s", "per_step": {"optimizer_s", "adam_s", "grad_norm_clip_s",
        "tied_embedding_sync_s"}}``: ``flops``, ``bytes``, ``seconds`` and ``kernels`` are [F, I,
        W] lists; ``total_s`` is the column sum of ``seconds``, which equals the chunk's
        ``forward_s``, ``backward_input_s`` and ``backward_weight_s`` (the fixed per-kernel cost is
        the ``launch`` row). Per step: ``optimizer_s`` is the optimizer time of the chunk's
        parameters, ``adam_s`` plus ``grad_norm_clip_s``; ``tied_embedding_sync_s`` the longest
        tied-embedding gradient all-reduce task of the rank holding the stage (0 if none).

    Raises:
        SimtrainError: ``stage`` is out of range, or the costs were fixed by ``--op-times``.
    """
    costs = run.costs
    if not 0 <= stage < len(costs.chunks):
        raise SimtrainError(f"--breakdown = {stage}: choose a stage from 0 to {len(costs.chunks) - 1}")
    if costs.fixed_op_times:
        raise SimtrainError("--breakdown: the durations are fixed by --op-times; there are no operators to show")
    c = costs.chunks[stage]
    ops = costs_ops.chunk_breakdown(runtime.ctx, c.layers, c.has_embedding, c.has_head, c.params - c.frozen_params, {})
    rows = [dict(name=o.name, bound=o.bound, flops=list(o.flops), bytes=list(o.bytes), seconds=list(o.seconds),
                 kernels=list(o.kernels)) for o in ops]
    total = [sum(o.seconds[p] for o in ops) for p in range(3)]
    optimizer = costs.optimizer_s([stage])
    clip = costs_ops.grad_norm_clip_s(runtime.ctx, c.params - c.frozen_params)
    table, rank = run.result.table, run.schedule.stage_to_rank[stage]
    tied = [e - b for n, r, b, e in zip(table["name"], table["rank"], table["start_s"], table["end_s"])
            if n == "embedding grad all-reduce" and r == rank]
    return dict(stage=stage, layers=list(c.layers), operators=rows, total_s=total,
                per_step=dict(optimizer_s=optimizer, adam_s=optimizer - clip, grad_norm_clip_s=clip,
                              tied_embedding_sync_s=float(max(tied, default=0.0))))


def hfu(run: ScheduleRun, model: ModelSpec, parallel: ParallelConfig, hardware: HardwareProfile,
        choice: CostChoice) -> float | None:
    """Hardware FLOPs utilisation (recomputation counted; Korthikanti et al. 2022 §6) of a run.

    The FLOPs recomputation reruns come from the per-operator FLOP counts whichever model priced
    the time, so HFU is also given for ``flat``.

    Returns:
        HFU in [0, 1]; None when MFU is None (``--op-times``) or the GPU kind has no kernel
        tables (the recomputed FLOPs are then not counted by operator).
    """
    if run.report.mfu is None or parallel.forward_only:
        return run.report.mfu
    try:
        ops = dataclasses.replace(choice, model="ops").runtime(model, parallel, hardware)
    except SimtrainError:
        return None
    return step_hfu(run, ops)


def step_hfu(run, runtime) -> float:
    """Hardware FLOPs utilisation of a simulated step: model FLOPs plus the FLOPs recomputation
    reruns, per GPU-second, over the peak of the compute dtype (Korthikanti et al. 2022 §6: HFU
    counts recomputation, MFU does not). Equals the step's MFU when nothing is recomputed.

    Args:
        run: a :class:`simtrain.scenario.ScheduleRun` simulated with ``runtime``.
        runtime: the :func:`simtrain.costs.ops.ops_runtime` hook it was simulated with.

    Returns:
        HFU in [0, 1].
    """
    ctx, costs, sched = runtime.ctx, run.costs, run.schedule
    cache: dict = {}
    redo = [next(o for o in costs_ops.chunk_breakdown(ctx, c.layers, c.has_embedding, c.has_head,
                                                      c.params - c.frozen_params, cache)
                 if o.name == "recompute").flops[1] for c in costs.chunks]
    tp = ctx.parallel.tp_cp  # GPUs sharing one stage's microbatch
    flops = sum((costs.chunks[sched.chunk_of(s)].model_flops + redo[sched.chunk_of(s)]) * tp
                for mb in range(sched.num_microbatches) for s in sched.path(mb))
    # same step, GPUs and peak as the MFU: HFU / MFU = hardware FLOPs / model FLOPs
    return run.report.mfu * flops / (run.report.model_flops / ctx.parallel.dp)
