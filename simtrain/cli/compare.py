"""``simtrain compare``: parse the flags, merge them into settings, run the schedules (and the
sweep), render the tables, dashboard and trace files."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Callable, Optional

import typer

from ..checks import (MAX_TASKS, check_applicable, check_dtype, check_finite, check_imported, check_simplified,
                      check_schedule_names, check_structure)
from ..engine import DeadlockError
from ..errors import SimtrainError
from ..export import check_output_path, write_chrome_trace, write_output, write_trace_csv
from ..hardware import GiB, HardwareProfile
from ..importers import read_job
from ..metrics import Report
from ..models import ModelSpec
from ..moe import resolve_waves
from ..parallel import ParallelConfig, flag_name
from ..progress import progress
from ..scenario import ScheduleRun, run_schedule
from ..schedules import Schedule, SettingsError, split_name
from ..schedules.ir import settings_named
from ..schedules.io import read_torch_csv
from ..cost_models import CostChoice, check_kernels, hfu, parse_cost_choice, recompute_modules, stage_breakdown
from ..sweep import SweepSpec, parse_sweep, run_sweep, sweep_from_mapping, sweep_records
from .app import app, err, out, user_errors
from .settings import Settings, fit_to_file, load_settings, parallel_from

if TYPE_CHECKING:
    import pandas as pd

@app.command()
@user_errors
def compare(
    scenario: Annotated[Optional[Path], typer.Argument(help="scenario YAML, or a built-in scenario name (default: 'default')")] = None,
    model: Annotated[Optional[str], typer.Option(help="model preset name or YAML file")] = None,
    hardware: Annotated[Optional[str], typer.Option(help="hardware profile name or YAML file")] = None,
    pp: Annotated[Optional[int], typer.Option(help="pipeline-parallel ranks")] = None,
    tp: Annotated[Optional[int], typer.Option(help="tensor-parallel degree")] = None,
    dp: Annotated[Optional[int], typer.Option(help="data-parallel degree")] = None,
    ep: Annotated[Optional[int], typer.Option(help="expert-parallel degree (MoE; divides dp x tp)")] = None,
    vp: Annotated[Optional[int], typer.Option(help="virtual stages per rank (interleaved schedules)")] = None,
    cp: Annotated[Optional[int], typer.Option(help="context-parallel degree (each sequence split over cp GPUs)")] = None,
    cp_kind: Annotated[Optional[str], typer.Option(
        help="context-parallel attention: ring (KV ring, overlapped), ulysses (all-to-all of heads), allgather")] = None,
    microbatches: Annotated[Optional[int], typer.Option(help="microbatches per step (m)")] = None,
    microbatch_size: Annotated[Optional[int], typer.Option(help="sequences per microbatch (b)")] = None,
    seq_len: Annotated[Optional[int], typer.Option(help="tokens per sequence (default: the model's)")] = None,
    dtype: Annotated[Optional[str], typer.Option(help="compute dtype: bf16, fp16, fp8, fp32, tf32")] = None,
    zero_stage: Annotated[Optional[int], typer.Option(help="ZeRO stage: 0, 1 (optimizer), 2 (+gradients) or 3 (+parameters, FSDP)")] = None,
    grad_reduce_dtype: Annotated[Optional[str], typer.Option(
        help="element type gradients are accumulated and DP-reduced in: bf16, fp16 or fp32 (FSDP2 reduce_dtype, "
             "DeepSpeed BF16_Optimizer) [default: the gradient's own]")] = None,
    recompute: Annotated[Optional[str], typer.Option(
        help="activation recomputation: none, selective, full, or (--cost-model ops) every-second-mm "
             "(torchtitan's selective op policy) or operators MODULE,MODULE,... "
             "e.g. norm,mla_up,swiglu (memory is then kept as for none)")] = None,
    trainable: Annotated[Optional[str], typer.Option(
        help="which weights train: all, lora:RANK, frozen-layers:LIST (e.g. 0-15,20)")] = None,
    offload: Annotated[Optional[str], typer.Option(
        help="activation offload to host memory over the profile's pcie link: none or activations[=FRACTION] "
             "(FRACTION in (0, 1], default 1)")] = None,
    tp_overlap: Annotated[bool, typer.Option(
        "--tp-overlap", help="overlap TP collectives with the neighbouring GEMMs (Megatron --tp-comm-overlap)")] = False,
    tp_overlap_fraction: Annotated[Optional[float], typer.Option(
        help="with --tp-overlap: fraction of an action's compute that hides its TP collectives (0-1, default 1)")] = None,
    hardware_queues: Annotated[Optional[int], typer.Option(
        help="CUDA_DEVICE_MAX_CONNECTIONS: hardware work queues a rank's streams share (1-32; default: one per stream)")] = None,
    cost_model: Annotated[str, typer.Option(
        help="compute cost model: auto (ops where the profile has kernel tables, else flat), flat (one GEMM "
             "efficiency) or ops (per-operator rooflines from kernel tables)")] = "auto",
    fp8: Annotated[Optional[str], typer.Option(
        help="gemms: FP8 linear-layer GEMMs, attention and memory-bound kernels in --dtype (--cost-model ops)")] = None,
    attention: Annotated[Optional[str], typer.Option(
        help="attention kernel: flash (fused; no score matrix stored) or unfused (materialised scores, stored "
             "unless recomputed; priced per operator by --cost-model ops) [default: flash, unfused where the profile has no "
             "fused kernel, e.g. V100]")] = None,
    activation_cache: Annotated[Optional[str], typer.Option(
        help="dtype of the linear layers' saved inputs: compute, or fp8 (DeepSeek-V3's FP8 activation cache; "
             "activations and deferred-W buffers) [default: compute]")] = None,
    kernels: Annotated[Optional[str], typer.Option(
        help="memory-bound operators as fused kernels, eager PyTorch ops (fp32 casts, one kernel per op, "
             "and the activations autograd saves in an eager torchtitan block) or compiled-blocks (fused blocks, "
             "eager head norm and loss); --cost-model ops [default: fused]")] = None,
    attention_kernel: Annotated[Optional[str], typer.Option(
        help="the fused attention kernel: fa2, fa3, fa4 or cudnn, priced from its measured rates (--cost-model ops) "
             "[default: the GPU's, what its common framework picks: cudnn on H100-class, fa2 on A100]")] = None,
    breakdown: Annotated[Optional[int], typer.Option(
        help="show where this stage's F, I, W time goes per operator (--cost-model ops; JSON key 'breakdown')")] = None,
    schedules: Annotated[Optional[str], typer.Option(
        help="comma-separated schedule names; '+waved-ep' adds Waved-EP, e.g. 1f1b,1f1b+waved-ep")] = None,
    schedule_file: Annotated[Optional[Path], typer.Option(
        help="simulate the per-rank actions of this torch schedule CSV (sets --pp and --microbatches)")] = None,
    waves: Annotated[Optional[int], typer.Option(help="expert waves per MoE layer for +waved-ep")] = None,
    dispatch_dtype: Annotated[Optional[str], typer.Option(help="EP dispatch element type: bf16 or fp8")] = None,
    expert_imbalance: Annotated[Optional[float], typer.Option(
        help="most loaded EP rank's tokens / mean (>= 1)")] = None,
    node_limit: Annotated[Optional[int], typer.Option(help="most nodes a token is dispatched to")] = None,
    a2a_links: Annotated[Optional[str], typer.Option(
        help="dispatch and combine on shared link ports, or separate (idealised full duplex)")] = None,
    moe_coarsen: Annotated[Optional[int], typer.Option(
        help="approximation for speed: lower K consecutive MoE layers as one block, each all-to-all "
             "wave as one task over NVLink and NICs (1 = exact, the default)")] = None,
    forward_only: Annotated[bool, typer.Option("--forward-only", help="forward passes only (inference)")] = False,
    op_times: Annotated[Optional[str], typer.Option(help="fixed seconds per action F,I,W (B = I + W)")] = None,
    no_comm: Annotated[bool, typer.Option("--no-comm", help="make all communication free")] = False,
    out_path: Annotated[Optional[Path], typer.Option("--out", help="HTML dashboard to write")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the result rows as JSON instead of a table")] = False,
    sweep: Annotated[Optional[list[str]], typer.Option(
        help="sweep one setting, e.g. microbatches=8,16,32,64 (also pp=, vp=, tp=, dp=, microbatch_size=); "
             "once per run")] = None,
    trace_path: Annotated[Optional[Path], typer.Option(
        "--trace", help="write a Chrome/Perfetto trace-event JSON file, gzipped if it ends in .json.gz "
        "(a process per rank, a thread per stream)")] = None,
    csv_path: Annotated[Optional[Path], typer.Option("--csv", help="write the trace table as CSV")] = None,
    force: Annotated[bool, typer.Option("--force", help="overwrite output files that simtrain did not write")] = False,
    from_megatron: Annotated[Optional[Path], typer.Option(
        help="take model and parallel settings from a Megatron-LM argument list (ARGS.txt or launch script)")] = None,
    from_torchtitan: Annotated[Optional[Path], typer.Option(
        help="take model and parallel settings from a torchtitan job file (JOB.toml)")] = None,
    max_tasks: Annotated[int, typer.Option(
        min=1, help="refuse runs estimated above this many simulated tasks")] = MAX_TASKS,
) -> None:
    """Simulate one training step for each schedule and compare them (table + HTML dashboard)."""
    modules = recompute_modules(recompute)
    recompute = "none" if modules else recompute
    overrides = dict(pp=pp, tp=tp, dp=dp, ep=ep, vp=vp, cp=cp, cp_kind=cp_kind, microbatches=microbatches, microbatch_size=microbatch_size,
                     seq_len=seq_len, dtype=dtype, zero_stage=zero_stage, grad_reduce_dtype=grad_reduce_dtype,
                     recompute=recompute, trainable=trainable, waves=waves,
                     dispatch_dtype=dispatch_dtype, expert_imbalance=expert_imbalance, node_limit=node_limit,
                     a2a_links=a2a_links, moe_coarsen=moe_coarsen, forward_only=True if forward_only else None,
                     attention=attention, attention_kernel=attention_kernel, activation_cache=activation_cache, kernels=kernels,
                     offload=offload,
                     tp_overlap=True if tp_overlap else None, tp_overlap_fraction=tp_overlap_fraction,
                     hardware_queues=hardware_queues)
    job = read_job(from_megatron, from_torchtitan, overrides)
    for line in job.summary() if job else []:
        err.print(line, markup=False, highlight=False, soft_wrap=True)
    st = load_settings(scenario, model, hardware, overrides, op_times, no_comm, job)
    modules = modules or st.recompute_modules
    check_simplified("--op-times" if op_times else f"{st.source}: field 'op_times'" if st.op_times else None,
                     "--no-comm" if no_comm else f"{st.source}: field 'no_comm'" if not st.comm else None,
                     {"--cost-model": None if cost_model == "auto" else cost_model, "--recompute": modules, "--fp8": fp8,
                      "--breakdown": breakdown, "--attention-kernel": attention_kernel,
                      "--kernels": kernels if kernels == "compiled-blocks" else None, "--tp-overlap": tp_overlap or None,
                      "--tp-overlap-fraction": tp_overlap_fraction})
    choice = parse_cost_choice(cost_model, modules, fp8, st.hardware.attention_kernel(st.parallel.attention),
                               st.hardware, st.name)
    if job and choice.model == "ops":  # what the job implies for the per-operator model only
        st = replace(st, parallel=job.for_cost_model(st.parallel, choice.model, st.hardware))
        choice = replace(choice, fp8=choice.fp8 or job.fp8)
    check_kernels(choice, st.parallel, {k for k, v in overrides.items() if v is not None})
    check_dtype(st.hardware, st.parallel, choice.model == "ops", "dtype" not in st.parallel.model_fields_set, st.name)
    if breakdown is not None and choice.model != "ops":
        raise SimtrainError(f"--breakdown = {breakdown}: needs the per-operator cost model (--cost-model ops)")
    plan = _plan_compare(st, schedules, schedule_file, sweep, pp, microbatches)
    _check_plan(st, plan, {k for k, v in overrides.items() if v is not None}, max_tasks)
    inputs = [p for p in (scenario, Path(model) if model else None, Path(hardware) if hardware else None,
                          schedule_file, from_megatron, from_torchtitan) if p]
    outputs = _check_outputs(st, out_path, as_json, trace_path, csv_path, inputs, force)
    plan = _at_sweep_point(st, plan)
    swept = plan.sweep.field if plan.sweep else None  # the swept field's values are the sweep's, not the file's
    namer = lambda f, v: flag_name(f, v) if f == swept else st.name(f, v)  # noqa: E731
    with settings_named(namer):
        runs, sweep_rows = _run_compare(st, plan, choice, namer)
    subtitle = (_subtitle(st.model, st.hardware, plan.parallel, st.op_times, st.comm)
                + ("" if choice.recompute else f", recompute {plan.parallel.recompute}") + _cost_note(choice))
    _write_outputs(outputs, st, plan, runs, sweep_rows, subtitle)
    reports = [r.report for r in runs]
    table = None
    if breakdown is not None:
        table = stage_breakdown(runs[0], choice.runtime(st.model, plan.parallel, st.hardware), breakdown)
    if as_json:
        rows = [r.to_row() for r in reports]
        if sweep_rows is not None or table is not None:
            rows = {"runs": rows}
            if sweep_rows is not None:
                rows["sweep"] = sweep_records(sweep_rows)
            if table is not None:
                rows["breakdown"] = table
        print(json.dumps(rows, indent=2))
    else:
        if sweep_rows is not None:
            _print_sweep(sweep_rows, plan.sweep.field)
        _print_summary(reports, subtitle)
        if table is not None:
            _print_breakdown(table, runs[0].report.schedule)
        for label, path in zip(("dashboard", "trace", "csv"), outputs):
            if path is not None:
                out.print(f"{label}: {path}")
    _check_offload(runs, plan.parallel)
    _check_fit(reports)


@dataclass
class _ComparePlan:
    """What ``compare`` simulates: the parallel config (at the swept value nearest the setting
    when sweeping), the schedule names, an imported schedule and the sweep."""

    parallel: ParallelConfig
    names: list[str]
    imported: Schedule | None
    schedule_file: Path | None
    sweep: SweepSpec | None


def _schedule_names(schedules: str | None, default: list[str], imported: Schedule | None,
                    source: str = "") -> list[str]:
    """The ``--schedules`` names (default: the scenario's, from ``source``, unless a file is
    imported), validated.

    Raises:
        SimtrainError: no schedule at all, an unknown name, or a name given twice (naming
            ``--schedules`` or the scenario's field).
    """
    names = [s.strip() for s in schedules.split(",")] if schedules is not None else ([] if imported else default)
    names = [n for n in names if n]
    if not names and imported is None:
        raise SimtrainError("--schedules: give at least one schedule name")
    where = "--schedules" if schedules is not None else f"{source}: field 'schedules'"
    check_schedule_names(names, where)
    return names


def _plan_compare(st: Settings, schedules: str | None, schedule_file: Path | None, sweep: list[str] | None,
                  pp: int | None, microbatches: int | None) -> _ComparePlan:
    """Read the schedule file and the sweep (``--sweep`` as often as it was typed), and check they
    go together (see :class:`_ComparePlan`).

    Raises:
        SimtrainError: a bad schedule file, names or sweep, ``--sweep`` given more than once (a
            run sweeps one setting, as a scenario file's ``sweep`` holds one field), or a sweep
            with a schedule file.
    """
    if sweep and len(sweep) > 1:
        raise SimtrainError(f"--sweep is given {len(sweep)} times ({', '.join(sweep)}): a run sweeps one setting; "
                            "give one --sweep (run compare once per setting)")
    sweep = sweep[0] if sweep else None
    parallel, imported = st.parallel, None
    if schedule_file is not None:
        imported = read_torch_csv(schedule_file)
        parallel = fit_to_file(parallel, imported, schedule_file, pp=pp, microbatches=microbatches)
    names = _schedule_names(schedules, st.scenario.schedules, imported, st.source)
    base = st.scenario
    spec = parse_sweep(sweep) if sweep else (sweep_from_mapping(base.sweep, st.source) if base.sweep else None)
    if spec is not None and imported is not None:
        raise SimtrainError("--sweep cannot be combined with --schedule-file: an imported schedule has fixed "
                            "ranks and microbatches")
    return _ComparePlan(parallel, names, imported, schedule_file, spec)


def _check_plan(st: Settings, plan: _ComparePlan, given: set[str], max_tasks: int) -> None:
    """The checks that run before anything is generated (:mod:`simtrain.checks`): flags that do
    not apply, stages against layers, and the estimated work against ``max_tasks``.

    Raises:
        SimtrainError: see :func:`~simtrain.checks.check_applicable`,
            :func:`~simtrain.checks.check_structure`, :func:`~simtrain.checks.check_imported`.
    """
    check_applicable(plan.names, st.model, st.hardware, plan.parallel, given, plan.imported is not None, st.name)
    if any("waved-ep" in split_name(n)[1] for n in plan.names):  # named as set, before run_schedule's check
        resolve_waves(st.model, plan.parallel, st.name)
    sweep = (plan.sweep.field, list(plan.sweep.values)) if plan.sweep is not None else None
    check_structure(plan.names, st.model, plan.parallel, max_tasks, sweep, name=st.name)
    if plan.imported is not None:
        check_imported(sum(len(order) for order in plan.imported.orders), max_tasks, str(plan.schedule_file))


def _at_sweep_point(st: Settings, plan: _ComparePlan) -> _ComparePlan:
    """When sweeping, the plan at the swept value nearest the setting (the detailed comparison is
    drawn there); else ``plan``."""
    if plan.sweep is None:
        return plan
    own = getattr(plan.parallel, plan.sweep.field)
    nearest = min(plan.sweep.values, key=lambda v: (abs(v - own), v))
    return replace(plan, parallel=parallel_from(plan.parallel.model_dump(), {plan.sweep.field: nearest}, st.source))


def _check_outputs(st: Settings, out_path: Path | None, as_json: bool, trace_path: Path | None,
                   csv_path: Path | None, inputs: list[Path], force: bool) -> tuple[Path | None, ...]:
    """The (dashboard, trace, csv) paths to write, each checked by :func:`check_output_path`."""
    html_path = out_path or (None if as_json else Path(st.scenario.out or "simtrain-compare.html"))
    where = ("--out" if out_path else f"{st.source}: field 'out'" if st.scenario.out
             else "the default dashboard (no --out given; --json writes none)")
    for path, flag, suffix in ((html_path, where, ".html"),
                               (trace_path, "--trace", (".json", ".json.gz")), (csv_path, "--csv", ".csv")):
        if path is not None:
            check_output_path(path, flag, suffix, inputs, force)
    return html_path, trace_path, csv_path


def _run_compare(st: Settings, plan: _ComparePlan, choice: CostChoice,
                 namer: Callable[[str, object], str] = flag_name) -> tuple[list[ScheduleRun], pd.DataFrame | None]:
    """Simulate every schedule (and the imported one, last) and the sweep with the cost model
    of ``choice``; each report gains its HFU. ``namer`` words a sweep point's schedule refusal
    (:meth:`simtrain.schedules.SettingsError.named`), as the compare's own refusal is worded.

    Raises:
        SimtrainError: the imported order deadlocks, no sweep point could be simulated, or a result
            holds NaN or infinity (:func:`simtrain.checks.check_finite`).
    """
    spec, hw, parallel, times, comm = st.model, st.hardware, plan.parallel, st.op_times, st.comm
    runtime = choice.runtime(spec, parallel, hw)
    steps = len(plan.names) + (plan.imported is not None) + len(plan.names) * len(plan.sweep.values if plan.sweep else [])
    with progress(err, steps, "simulating") as advance:
        runs = []
        for name in plan.names:
            runs.append(run_schedule(name, spec, hw, parallel, op_times=times, comm=comm, runtime=runtime, name=namer))
            advance(name)
        if plan.imported is not None:
            try:
                runs.append(run_schedule(plan.imported, spec, hw, parallel, op_times=times, comm=comm,
                                         runtime=runtime, name=namer))
            except DeadlockError as exc:
                raise SimtrainError(f"--schedule-file {plan.schedule_file}: the order cannot run: {exc}") from None
        runs = [replace(r, report=replace(r.report, hfu=hfu(r, spec, parallel, hw, choice))) for r in runs]
        sweep_rows = None
        if plan.sweep is not None:
            sweep_rows = run_sweep(plan.names, spec, hw, parallel, plan.sweep, op_times=times, comm=comm,
                                   on_point=advance, runtime=lambda par: choice.runtime(spec, par, hw),
                                   describe=lambda exc: exc.named(namer) if isinstance(exc, SettingsError) else str(exc))
            if sweep_rows["error_message"].notna().all():
                raise SimtrainError(f"--sweep: no point could be simulated; first reason: {sweep_rows['error_message'].iloc[0]}")
        for r in runs:
            check_finite(r.report.to_row(), r.report.schedule)
        if sweep_rows is not None:
            done = sweep_rows[sweep_rows["error_message"].isna()]  # a NaN mfu there is a None (fixed op-times)
            check_finite(done.drop(columns=["error_message", "mfu"]).assign(mfu=done["mfu"].fillna(0.0)).to_dict("records"),
                         "--sweep")
    return runs, sweep_rows


def _subtitle(spec: ModelSpec, hw: HardwareProfile, parallel: ParallelConfig,
              times: tuple[float, float, float] | None, comm: bool) -> str:
    """One line of context: model, hardware, degrees, batch, dtype and the simplifications."""
    return (
        f"{spec.name} on {hw.name}: TP {parallel.tp} x PP {parallel.pp} x DP {parallel.dp}"
        + (f" (EP {parallel.ep})" if parallel.ep > 1 else "")
        + (f" x CP {parallel.cp} ({parallel.cp_kind})" if parallel.cp > 1 else "") + ", "
        f"{parallel.microbatches} microbatches of {parallel.microbatch_size} x "
        f"{parallel.seq_len or spec.seq_len} tokens, {parallel.dtype}"
        + (f", op-times F,I,W = {times}" if times else "") + ("" if comm else ", no communication")
        + (", forward only" if parallel.forward_only else "")
        + (f", offload {parallel.offload}" if parallel.offload_fraction > 0 else "")
        + (f", TP overlap {parallel.tp_overlap_fraction:g}" if parallel.tp_overlap else "")
        + (f", {parallel.hardware_queues} hardware queues" if parallel.hardware_queues else "")
    )


def _cost_note(choice: CostChoice) -> str:
    """The subtitle's note on a non-default cost model."""
    if choice.model == "flat":
        return ""
    return (f", per-operator costs ({choice.attention} attention" + (f", recompute {choice.recompute}" if choice.recompute
            else "") + (", FP8 GEMMs" if choice.fp8 else "") + ")")


def _print_breakdown(table: dict, schedule: str) -> None:
    """The terminal table of :func:`simtrain.cost_models.stage_breakdown`: one row per operator."""
    from rich.table import Table

    t = Table(title=f"stage {table['stage']} ({schedule}): layers {table['layers'][0] if table['layers'] else '-'}"
                    f"..{table['layers'][-1] if table['layers'] else '-'}, per microbatch")
    for col in ("operator", "bound", "F GFLOP", "F MB", "I MB", "W MB", "F ms", "I ms", "W ms"):
        t.add_column(col, justify="left" if col in ("operator", "bound") else "right")
    for o in table["operators"]:
        t.add_row(o["name"], o["bound"], f"{o['flops'][0] / 1e9:,.1f}", *(f"{b / 1e6:,.1f}" for b in o["bytes"]),
                  *(f"{s * 1e3:.3f}" for s in o["seconds"]))
    t.add_row("total", "", "", "", "", "", *(f"{s * 1e3:.3f}" for s in table["total_s"]))
    step = table["per_step"]
    for label, key in (("Adam", "adam_s"), ("grad norm + clipping", "grad_norm_clip_s"),
                       ("tied-embedding sync", "tied_embedding_sync_s")):
        if step[key]:
            t.add_row(f"per step: {label}", "comm" if key.startswith("tied") else "memory", *[""] * 6,
                      f"{step[key] * 1e3:.3f}")
    out.print(t)


def _write_outputs(outputs: tuple[Path | None, ...], st: Settings, plan: _ComparePlan, runs: list[ScheduleRun],
                   sweep_rows: pd.DataFrame | None, subtitle: str) -> None:
    """Write the dashboard, Chrome trace and CSV that were asked for (None paths are skipped)."""
    html_path, trace_path, csv_path = outputs
    base = st.scenario
    if html_path is not None:
        from ..viz import Panel, Sweep, write_dashboard  # plotly: only for a dashboard

        write_output(lambda: write_dashboard(
            html_path, [Panel(r.report, r.result.tasks, r.result.memory) for r in runs],
            base.title if not st.flags_only else "simtrain comparison", subtitle, source=base.source,
            sweep=Sweep(sweep_rows, plan.sweep.field, plan.parallel.pp) if plan.sweep else None,
        ), html_path, "--out")
    if trace_path is not None:
        write_output(lambda: write_chrome_trace(trace_path, {r.report.schedule: r.result.tasks for r in runs},
                                                {r.report.schedule: r.result.memory for r in runs}),
                     trace_path, "--trace")
    if csv_path is not None:
        write_output(lambda: write_trace_csv(csv_path, {r.report.schedule: r.result.tasks for r in runs}),
                     csv_path, "--csv")


def _print_summary(reports: list[Report], subtitle: str) -> None:
    """The terminal table of :data:`simtrain.viz.tables.SUMMARY_COLUMNS`, one row per schedule."""
    from rich.table import Table

    from ..viz.tables import summary_columns

    table = Table(title=subtitle, collapse_padding=True)  # one space between columns: the EP columns fit too
    cols = [c for c in summary_columns(reports) if c.cli is not None]
    for c in cols:
        table.add_column(c.cli, justify="left" if c.key == "schedule" else "right", no_wrap=c.key == "schedule")
    for r in reports:
        table.add_row(*(c.terminal(r) for c in cols))
    out.print(table)


def _check_offload(runs: list[ScheduleRun], parallel: ParallelConfig) -> None:
    """Warn (stderr) where activation offload is on but did not lower a schedule's highest peak:
    at that instant none of the rank's activations was on the host (the copies are too slow, or
    the peak falls where nothing can be offloaded)."""
    if parallel.offload_fraction <= 0 or parallel.forward_only:
        return
    from ..memory import offloaded_at_peak

    for run in runs:
        peaks = run.report.peak_memory_bytes
        worst = max(range(len(peaks)), key=lambda i: peaks[i])
        if offloaded_at_peak(run.result)[worst] <= 0:
            err.print(f"warning: --offload {parallel.offload}: {run.report.schedule}'s highest peak (rank {worst}, "
                      f"{peaks[worst] / GiB:.1f} GiB) is not lowered: no activation of that rank is on the host "
                      "then (its copies do not end before the reloads start, or the peak holds only activations "
                      "needed soon); a smaller FRACTION may help", markup=False, highlight=False, soft_wrap=True)


def _check_fit(reports) -> None:
    """Warn (stderr) for every schedule whose peak memory overflows HBM; fail if none fits.

    Raises:
        SimtrainError: no schedule fits.
    """
    for r in reports:
        if not r.fits_in_hbm:
            worst = max(range(len(r.peak_memory_bytes)), key=lambda i: r.peak_memory_bytes[i])
            err.print(
                f"warning: {r.schedule} does not fit in HBM: rank {worst} peaks at "
                f"{r.peak_memory_bytes[worst] / GiB:.1f} GiB of {r.hbm_bytes / GiB:.0f} GiB"
            )
    if not any(r.fits_in_hbm for r in reports):
        raise SimtrainError("no schedule fits in HBM with this configuration (see the warnings above)")


def _print_sweep(rows: pd.DataFrame, field: str) -> None:
    """The terminal table of :data:`simtrain.viz.tables.SWEEP_COLUMNS`, one row per (value, schedule)."""
    from rich.table import Table

    from ..viz.tables import SWEEP_COLUMNS

    table = Table(title=f"sweep over {field}")
    for c in SWEEP_COLUMNS:
        table.add_column(c.cli.format(field=field), justify="left" if c.key == "schedule" else "right")
    for r in rows.to_dict("records"):
        if isinstance(r.get("error_message"), str):
            table.add_row(*(c.terminal(r) for c in SWEEP_COLUMNS[:2]), f"[red]not simulated: {r['error_message']}[/red]",
                          *[""] * (len(SWEEP_COLUMNS) - 3))
            continue
        table.add_row(*(c.terminal(r) for c in SWEEP_COLUMNS))
    out.print(table)


