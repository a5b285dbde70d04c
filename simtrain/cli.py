"""Command line: ``simtrain compare``, ``simtrain export-schedule``, ``simtrain overlay``,
``simtrain profiles``, ``simtrain models``, and the torch-based ``simtrain calibrate`` and
``simtrain validate`` (:mod:`simtrain.calibration.commands`).

Every user error ends as one line ``error: ...`` on stderr and exit status 2, never a traceback
(commands are wrapped by :func:`user_errors`; typer reports unknown flags and bad types with 2).
Units are converted here, at the edge: tables print ms, GiB, TFLOP/s and GB/s.
"""

from __future__ import annotations

import functools
import json
import math
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Optional

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from .engine import DeadlockError
from .calibration.commands import calibrate, validate
from .errors import SimtrainError
from .export import check_output_path, write_chrome_trace, write_output, write_trace_csv
from .hardware import GB, GiB, TFLOPS, HardwareProfile, available_profiles, load_profile
from .measured import read_torch_trace
from .models import ModelSpec, available_models, load_model
from .overlay import action_differences, measured_op_times, overlay_summary, schedule_from_measured
from .parallel import ParallelConfig
from .scenario import DEFAULT_SCENARIO, Scenario, load_scenario, run_schedule
from .schedules import REGISTRY, Schedule, ScheduleWarning, generate, split_name
from .schedules.io import format_torch_csv, read_torch_csv, write_torch_csv
from .sweep import parse_sweep, run_sweep, sweep_from_mapping
from .viz import Panel, Sweep, write_dashboard, write_overlay

app = typer.Typer(
    add_completion=False,
    pretty_exceptions_enable=False,
    no_args_is_help=True,
    help="Simulate pipeline-parallel training schedules on real models and hardware.",
)
out = Console(width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True, width=None if sys.stderr.isatty() else 160)

_FLAG_OF = {"microbatches": "--microbatches", "microbatch_size": "--microbatch-size", "seq_len": "--seq-len",
            "zero_stage": "--zero-stage"}


def _parallel_from(base: dict, overrides: dict, source: str) -> ParallelConfig:
    """Merge CLI overrides into a scenario's parallel section and validate, naming flags on error."""
    merged = {**base, **{k: v for k, v in overrides.items() if v is not None}}
    try:
        return ParallelConfig.model_validate(merged)
    except ValidationError as exc:
        parts = []
        for e in exc.errors():
            field = str(e["loc"][0]) if e["loc"] else "?"
            flag = _FLAG_OF.get(field, f"--{field.replace('_', '-')}")
            where = flag if overrides.get(field) is not None else f"{source}: field 'parallel.{field}'"
            parts.append(f"{where} = {e.get('input')!r}: {e['msg'].removeprefix('Value error, ')}")
        raise SimtrainError("; ".join(parts)) from None


def _parse_op_times(text: str) -> tuple[float, float, float]:
    try:
        values = tuple(float(x) for x in text.split(","))
    except ValueError:
        values = ()
    if len(values) != 3 or not all(math.isfinite(v) and v >= 0 for v in values) or sum(values) <= 0:
        raise SimtrainError(f"--op-times = {text!r}: expected three finite numbers F,I,W >= 0 seconds, "
                            "at least one > 0, e.g. 1,1,1")
    return values  # type: ignore[return-value]


def _print_warnings(caught: list[warnings.WarningMessage]) -> None:
    """Print schedule warnings as ``warning: ...`` lines on stderr; pass other warnings on."""
    for w in caught:
        if issubclass(w.category, ScheduleWarning):
            err.print(f"warning: {w.message}", markup=False, highlight=False, soft_wrap=True)
        else:
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)


def user_errors(command: Callable[..., None]) -> Callable[..., None]:
    """Decorate a command so a :class:`SimtrainError` prints ``error: ...`` and exits with 2, and
    schedule warnings print as ``warning: ...``."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs) -> None:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ScheduleWarning)
            try:
                command(*args, **kwargs)
            except SimtrainError as exc:
                _print_warnings(caught)
                err.print(f"error: {exc}", markup=False, highlight=False, soft_wrap=True)
                raise typer.Exit(2) from None
        _print_warnings(caught)

    return wrapper


def _fmt_pct(x: float | None) -> str:
    return "–" if x is None else f"{x:.1%}"


@dataclass
class _Settings:
    """What a command simulates, after merging a scenario file with the flags."""

    scenario: Scenario
    source: str
    flags_only: bool
    model: ModelSpec
    hardware: HardwareProfile
    parallel: ParallelConfig
    op_times: tuple[float, float, float] | None
    comm: bool


def _settings(scenario: Path | None, model: str | None, hardware: str | None, overrides: dict,
              op_times: str | None, no_comm: bool) -> _Settings:
    """Merge the scenario file (default: dashboards/default.yaml) with the flags; validate all."""
    flags_only = scenario is None and model is not None  # --hardware alone: the default scenario on it
    if flags_only:
        if hardware is None:
            raise SimtrainError("give both --model and --hardware (or a scenario file)")
        base = Scenario(model=model, hardware=hardware)
        source = "command line"
    else:
        path = scenario or DEFAULT_SCENARIO
        base = load_scenario(path)
        source = str(path)
    parallel = _parallel_from(base.parallel.model_dump(exclude_unset=True), overrides, source)
    times = _parse_op_times(op_times) if op_times else base.op_times
    return _Settings(base, source, flags_only, load_model(model or base.model), load_profile(hardware or base.hardware),
                     parallel, times, not (no_comm or base.no_comm))


def _print_sweep(rows, field: str) -> None:
    table = Table(title=f"sweep over {field}")
    for col in (field, "schedule", "step time (ms)", "bubble", "tokens/s", "peak mem (GiB)", "fits HBM"):
        table.add_column(col, justify="left" if col == "schedule" else "right")
    for r in rows.itertuples():
        if isinstance(r.error, str):
            table.add_row(str(r.value), r.schedule, f"[red]not simulated: {r.error}[/red]", "", "", "", "")
            continue
        table.add_row(str(r.value), r.schedule, f"{r.step_time_s * 1e3:.2f}", _fmt_pct(r.bubble_ratio),
                      f"{r.tokens_per_s:,.0f}", f"{r.peak_memory_bytes / GiB:.1f}",
                      "yes" if r.fits_in_hbm else "[red]NO[/red]")
    out.print(table)


def _fit_to_file(
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


@app.command()
@user_errors
def compare(
    scenario: Annotated[Optional[Path], typer.Argument(help="scenario YAML (default: dashboards/default.yaml)")] = None,
    model: Annotated[Optional[str], typer.Option(help="model preset name or YAML file")] = None,
    hardware: Annotated[Optional[str], typer.Option(help="hardware profile name or YAML file")] = None,
    pp: Annotated[Optional[int], typer.Option(help="pipeline-parallel ranks")] = None,
    tp: Annotated[Optional[int], typer.Option(help="tensor-parallel degree")] = None,
    dp: Annotated[Optional[int], typer.Option(help="data-parallel degree")] = None,
    ep: Annotated[Optional[int], typer.Option(help="expert-parallel degree (MoE; divides dp x tp)")] = None,
    vp: Annotated[Optional[int], typer.Option(help="virtual stages per rank (interleaved schedules)")] = None,
    microbatches: Annotated[Optional[int], typer.Option(help="microbatches per step (m)")] = None,
    microbatch_size: Annotated[Optional[int], typer.Option(help="sequences per microbatch (b)")] = None,
    seq_len: Annotated[Optional[int], typer.Option(help="tokens per sequence (default: the model's)")] = None,
    dtype: Annotated[Optional[str], typer.Option(help="compute dtype: bf16, fp16, fp8, fp32, tf32")] = None,
    zero_stage: Annotated[Optional[int], typer.Option(help="ZeRO stage: 0 or 1")] = None,
    recompute: Annotated[Optional[str], typer.Option(help="activation recomputation: none, selective, full")] = None,
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
    forward_only: Annotated[bool, typer.Option("--forward-only", help="forward passes only (inference)")] = False,
    op_times: Annotated[Optional[str], typer.Option(help="fixed seconds per action F,I,W (B = I + W)")] = None,
    no_comm: Annotated[bool, typer.Option("--no-comm", help="make all communication free")] = False,
    out_path: Annotated[Optional[Path], typer.Option("--out", help="HTML dashboard to write")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the result rows as JSON instead of a table")] = False,
    sweep: Annotated[Optional[str], typer.Option(
        help="sweep one setting, e.g. microbatches=8,16,32,64 (also pp=, vp=, tp=, dp=, microbatch_size=)")] = None,
    trace_path: Annotated[Optional[Path], typer.Option(
        "--trace", help="write a Chrome/Perfetto trace-event JSON file (a process per rank, a thread per stream)")] = None,
    csv_path: Annotated[Optional[Path], typer.Option("--csv", help="write the trace table as CSV")] = None,
    force: Annotated[bool, typer.Option("--force", help="overwrite output files that simtrain did not write")] = False,
) -> None:
    """Simulate one training step for each schedule and compare them (table + HTML dashboard)."""
    overrides = dict(pp=pp, tp=tp, dp=dp, ep=ep, vp=vp, microbatches=microbatches, microbatch_size=microbatch_size,
                     seq_len=seq_len, dtype=dtype, zero_stage=zero_stage, recompute=recompute, waves=waves,
                     dispatch_dtype=dispatch_dtype, expert_imbalance=expert_imbalance, node_limit=node_limit,
                     a2a_links=a2a_links, forward_only=True if forward_only else None)
    st = _settings(scenario, model, hardware, overrides, op_times, no_comm)
    spec, hw, parallel, times, comm, base = st.model, st.hardware, st.parallel, st.op_times, st.comm, st.scenario
    imported = None
    if schedule_file is not None:
        imported = read_torch_csv(schedule_file)
        parallel = _fit_to_file(parallel, imported, schedule_file, pp=pp, microbatches=microbatches)
    if schedules:
        names = [s.strip() for s in schedules.split(",")]
    else:
        names = [] if imported else base.schedules
    names = [n for n in names if n]
    if not names and imported is None:
        raise SimtrainError("--schedules: give at least one schedule name")
    for n in names:
        try:
            split_name(n)
        except SimtrainError as exc:
            raise SimtrainError(f"--schedules: {exc}") from None
    twice = [n for n in names if names.count(n) > 1]
    if twice:
        raise SimtrainError(f"--schedules: '{twice[0]}' is given twice")
    sweep_spec = parse_sweep(sweep) if sweep else (sweep_from_mapping(base.sweep, st.source) if base.sweep else None)
    if sweep_spec is not None and imported is not None:
        raise SimtrainError("--sweep cannot be combined with --schedule-file: an imported schedule has fixed "
                            "ranks and microbatches")
    inputs = [p for p in (scenario, Path(model) if model else None, Path(hardware) if hardware else None,
                          schedule_file) if p]
    html_path = out_path or (None if as_json else Path(base.out or "simtrain-compare.html"))
    if html_path is not None:
        check_output_path(html_path, "--out" if out_path else f"{st.source}: field 'out'", ".html", inputs, force)
    if trace_path is not None:
        check_output_path(trace_path, "--trace", ".json", inputs, force)
    if csv_path is not None:
        check_output_path(csv_path, "--csv", ".csv", inputs, force)

    if sweep_spec is not None:  # the detailed comparison is drawn at the swept value nearest the setting
        own = getattr(parallel, sweep_spec.field)
        nearest = min(sweep_spec.values, key=lambda v: (abs(v - own), v))
        parallel = _parallel_from(parallel.model_dump(), {sweep_spec.field: nearest}, st.source)
    runs = [run_schedule(n, spec, hw, parallel, op_times=times, comm=comm) for n in names]
    if imported is not None:
        try:
            runs.append(run_schedule(imported, spec, hw, parallel, op_times=times, comm=comm))
        except DeadlockError as exc:
            raise SimtrainError(f"--schedule-file {schedule_file}: the order cannot run: {exc}") from None
    reports = [r.report for r in runs]
    sweep_rows = None
    if sweep_spec is not None:
        sweep_rows = run_sweep(names, spec, hw, parallel, sweep_spec, op_times=times, comm=comm)
        if sweep_rows["error"].notna().all():
            raise SimtrainError(f"--sweep: no point could be simulated; first reason: {sweep_rows['error'].iloc[0]}")
    subtitle = (
        f"{spec.name} on {hw.name}: TP {parallel.tp} x PP {parallel.pp} x DP {parallel.dp}"
        + (f" (EP {parallel.ep})" if parallel.ep > 1 else "") + ", "
        f"{parallel.microbatches} microbatches of {parallel.microbatch_size} x "
        f"{parallel.seq_len or spec.seq_len} tokens, {parallel.dtype}"
        + (f", op-times F,I,W = {times}" if times else "") + ("" if comm else ", no communication")
        + (", forward only" if parallel.forward_only else "")
    )
    if html_path is not None:
        write_output(lambda: write_dashboard(
            html_path, [Panel(r.report, r.result.trace, r.result.memory) for r in runs],
            base.title if not st.flags_only else "simtrain comparison", subtitle, source=base.source,
            sweep=Sweep(sweep_rows, sweep_spec.field, parallel.pp) if sweep_spec else None,
        ), html_path, "--out")
    if trace_path is not None:
        write_output(lambda: write_chrome_trace(trace_path, {r.report.schedule: r.result.trace for r in runs},
                                                {r.report.schedule: r.result.memory for r in runs}),
                     trace_path, "--trace")
    if csv_path is not None:
        write_output(lambda: write_trace_csv(csv_path, {r.report.schedule: r.result.trace for r in runs}),
                     csv_path, "--csv")
    if as_json:
        rows = [r.to_row() for r in reports]
        if sweep_rows is not None:
            rows = {"runs": rows, "sweep": json.loads(sweep_rows.to_json(orient="records"))}
        print(json.dumps(rows, indent=2))
        _check_fit(reports)
        return

    if sweep_rows is not None:
        _print_sweep(sweep_rows, sweep_spec.field)
    table = Table(title=subtitle)
    ep_cols = any(r.a2a_s > 0 for r in reports)
    for col in ("schedule", "step time (ms)", "bubble", "span bubble", "exposed comm (ms)", "overlap",
                "peak mem (GiB)", "fits HBM", "in-flight", "MFU", "tokens/s") + (
                    ("a2a (ms)", "exposed a2a (ms)", "EP share") if ep_cols else ()):
        table.add_column(col, justify="left" if col == "schedule" else "right", no_wrap=col == "schedule")
    for r in reports:
        table.add_row(
            r.schedule, f"{r.step_time_s * 1e3:.2f}", _fmt_pct(r.bubble_ratio), _fmt_pct(r.span_bubble_ratio),
            f"{r.exposed_comm_s * 1e3:.2f}",
            _fmt_pct(r.overlap_ratio), f"{max(r.peak_memory_bytes) / GiB:.1f} / {r.hbm_bytes / GiB:.0f}",
            "yes" if r.fits_in_hbm else "[red]NO[/red]", str(max(r.peak_inflight_microbatches)),
            _fmt_pct(r.mfu), f"{r.tokens_per_s:,.0f}",
            *((f"{r.a2a_s * 1e3:.2f}", f"{r.exposed_a2a_s * 1e3:.2f}", _fmt_pct(r.ep_share)) if ep_cols else ()),
        )
    out.print(table)
    for label, path in (("dashboard", html_path), ("trace", trace_path), ("csv", csv_path)):
        if path is not None:
            out.print(f"{label}: {path}")
    _check_fit(reports)


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


@app.command("export-schedule")
@user_errors
def export_schedule(
    name: Annotated[str, typer.Argument(help="schedule name (see --schedules of compare)")],
    pp: Annotated[int, typer.Option(help="pipeline-parallel ranks")],
    microbatches: Annotated[int, typer.Option(help="microbatches per step (m)")],
    vp: Annotated[int, typer.Option(help="stages per rank (interleaved schedules)")] = 1,
    fmt: Annotated[str, typer.Option("--format", help="output format: torch-csv")] = "torch-csv",
    out_path: Annotated[Optional[Path], typer.Option("--out", help="file to write (default: standard output)")] = None,
    force: Annotated[bool, typer.Option("--force", help="overwrite --out if it exists")] = False,
) -> None:
    """Write a schedule's per-rank actions in torch.distributed.pipelining's CSV layout."""
    if fmt != "torch-csv":
        raise SimtrainError(f"--format = {fmt!r}: the only format is 'torch-csv'")
    schedule = generate(name, pp, microbatches, vp)
    if out_path is None:
        sys.stdout.write(format_torch_csv(schedule))
        return
    write_torch_csv(schedule, out_path, force=force)
    err.print(f"wrote {name} ({schedule.num_ranks} ranks, {schedule.num_stages} stages, "
              f"{schedule.num_microbatches} microbatches) to {out_path}", markup=False, highlight=False)


@app.command()
@user_errors
def overlay(
    measured: Annotated[list[Path], typer.Option(
        help="torch profiler trace (Chrome JSON) of one pipeline step; repeat once per rank")],
    scenario: Annotated[Optional[Path], typer.Argument(help="scenario YAML for model, hardware and degrees")] = None,
    model: Annotated[Optional[str], typer.Option(help="model preset name or YAML file")] = None,
    hardware: Annotated[Optional[str], typer.Option(help="hardware profile name or YAML file")] = None,
    tp: Annotated[Optional[int], typer.Option(help="tensor-parallel degree")] = None,
    dp: Annotated[Optional[int], typer.Option(help="data-parallel degree")] = None,
    microbatch_size: Annotated[Optional[int], typer.Option(help="sequences per microbatch (b)")] = None,
    seq_len: Annotated[Optional[int], typer.Option(help="tokens per sequence")] = None,
    dtype: Annotated[Optional[str], typer.Option(help="compute dtype")] = None,
    schedule: Annotated[Optional[str], typer.Option(
        help="simulate this registry schedule instead of the order the trace shows")] = None,
    op_times: Annotated[Optional[str], typer.Option(
        help="fixed seconds per action F,I,W, or 'measured' for the trace's median F, I, W")] = None,
    no_comm: Annotated[bool, typer.Option("--no-comm", help="make all communication free")] = False,
    step: Annotated[Optional[int], typer.Option(help="the trace's ProfilerStep#N to take (default: the last)")] = None,
    out_path: Annotated[Path, typer.Option("--out", help="HTML page to write")] = Path("simtrain-overlay.html"),
    as_json: Annotated[bool, typer.Option("--json", help="print the per-action differences as JSON")] = False,
    force: Annotated[bool, typer.Option("--force", help="overwrite --out if simtrain did not write it")] = False,
) -> None:
    """Draw a measured torch pipeline step and its simulation on one timeline, rank by rank."""
    inputs = [*measured, *(p for p in (scenario, Path(model) if model else None,
                                       Path(hardware) if hardware else None) if p)]
    check_output_path(out_path, "--out", ".html", inputs, force)
    actions = read_torch_trace(measured, step)
    taken = schedule_from_measured(actions, "measured order")
    from_trace = op_times is not None and op_times.strip() == "measured"
    overrides = dict(pp=taken.num_ranks, microbatches=taken.num_microbatches, tp=tp, dp=dp,
                     microbatch_size=microbatch_size, seq_len=seq_len, dtype=dtype)
    st = _settings(scenario, model, hardware, overrides, None if from_trace else op_times, no_comm)
    times = measured_op_times(actions) if from_trace else st.op_times
    if schedule is not None and schedule not in REGISTRY:
        raise SimtrainError(f"--schedule: unknown schedule '{schedule}'; choose from {sorted(REGISTRY)}")
    run = run_schedule(schedule or taken, st.model, st.hardware, st.parallel, op_times=times, comm=st.comm)
    trace = run.result.trace
    diffs = action_differences(actions, trace)
    summary = overlay_summary(actions, trace, diffs)
    subtitle = (f"{len(measured)} trace file(s), {taken.num_ranks} ranks, {taken.num_stages} stages, "
                f"{taken.num_microbatches} microbatches; simulated {run.schedule.name} with "
                + (f"op-times F,I,W = {tuple(round(t * 1e3, 3) for t in times)} ms" if times
                   else f"{st.model.name} on {st.hardware.name}") + ("" if st.comm else ", no communication"))
    write_output(lambda: write_overlay(out_path, actions, trace, diffs, summary, "measured vs simulated", subtitle),
                 out_path, "--out")
    if as_json:
        print(json.dumps({"summary": summary, "actions": json.loads(diffs.to_json(orient="records"))}, indent=2))
        return
    table = Table(title=subtitle)
    for col in ("kind", "actions", "mean measured (ms)", "mean simulated (ms)", "mean |diff| (ms)"):
        table.add_column(col, justify="left" if col == "kind" else "right")
    for kind, v in summary["per_kind"].items():
        table.add_row(kind, str(v["count"]), f"{v['measured_s'] * 1e3:.3f}", f"{v['simulated_s'] * 1e3:.3f}",
                      f"{v['mean_abs_diff_s'] * 1e3:.3f}")
    out.print(table)
    out.print(f"step: measured {summary['measured_span_s'] * 1e3:.3f} ms, simulated "
              f"{summary['simulated_span_s'] * 1e3:.3f} ms ({summary['span_error']:+.1%})")
    out.print(f"overlay: {out_path}")


@app.command()
@user_errors
def profiles() -> None:
    """List the hardware profiles shipped in hardware_profiles/."""
    table = Table(title="hardware profiles")
    for col in ("name", "GPU", "bf16 TFLOP/s", "HBM GiB", "HBM TB/s", "GPUs/node", "intra GB/s/dir", "inter GB/s/dir/NIC"):
        table.add_column(col)
    for name in available_profiles():
        p = load_profile(name)
        table.add_row(
            name, p.description.split(",")[0], f"{p.peak_flops.get('bf16', 0) / TFLOPS:.0f}",
            f"{p.hbm_bytes / GiB:.0f}", f"{p.hbm_bandwidth_bytes_per_s / 1e12:.2f}", str(p.gpus_per_node),
            f"{p.intra_node.bandwidth_bytes_per_s / GB:.0f}", f"{p.inter_node.bandwidth_bytes_per_s / GB:.0f}",
        )
    out.print(table)


@app.command()
@user_errors
def models() -> None:
    """List the model presets with their total and activated parameter counts."""
    table = Table(title="model presets")
    for col in ("name", "layers", "hidden", "heads/kv", "vocab", "seq", "total params", "active params", "published"):
        table.add_column(col)
    for name in available_models():
        m = load_model(name)
        published = f"{m.published_total_params / 1e9:.1f}B" if m.published_total_params else "–"
        if m.published_active_params:
            published += f" / {m.published_active_params / 1e9:.1f}B active"
        table.add_row(
            name, str(m.num_layers), str(m.hidden_size), f"{m.num_heads}/{m.kv_heads}", str(m.vocab_size),
            str(m.seq_len), f"{m.total_params() / 1e9:.2f}B", f"{m.active_params() / 1e9:.2f}B", published,
        )
    out.print(table)


# torch-based commands (the optional `calibrate` extra; torch is imported only when they run)
app.command()(user_errors(calibrate))
app.command()(user_errors(validate))


def main() -> None:
    """Console-script entry point (``simtrain``)."""
    app(prog_name="simtrain")
