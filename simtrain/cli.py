"""Command line: ``simtrain compare``, ``simtrain profiles``, ``simtrain models``, and the
torch-based ``simtrain calibrate`` and ``simtrain validate`` (:mod:`simtrain.calibration.commands`).

Every user error ends as one line ``error: ...`` on stderr and exit status 2, never a traceback
(commands are wrapped by :func:`user_errors`; typer reports unknown flags and bad types with 2).
Units are converted here, at the edge: tables print ms, GiB, TFLOP/s and GB/s.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Optional

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from .calibration.commands import calibrate, validate
from .errors import SimtrainError
from .hardware import GB, GiB, TFLOPS, available_profiles, load_profile
from .models import available_models, load_model
from .parallel import ParallelConfig
from .scenario import DEFAULT_SCENARIO, Scenario, load_scenario, run_schedule
from .schedules import REGISTRY
from .viz import Panel, write_dashboard

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
            parts.append(f"{where} = {e.get('input')!r}: {e['msg']}")
        raise SimtrainError("; ".join(parts)) from None


def _parse_op_times(text: str) -> tuple[float, float, float]:
    try:
        values = tuple(float(x) for x in text.split(","))
    except ValueError:
        values = ()
    if len(values) != 3:
        raise SimtrainError(f"--op-times = {text!r}: expected three numbers F,I,W in seconds, e.g. 1,1,1")
    return values  # type: ignore[return-value]


def user_errors(command: Callable[..., None]) -> Callable[..., None]:
    """Decorate a command so a :class:`SimtrainError` prints ``error: ...`` and exits with 2."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs) -> None:
        try:
            command(*args, **kwargs)
        except SimtrainError as exc:
            err.print(f"error: {exc}", markup=False, highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None

    return wrapper


def _fmt_pct(x: float | None) -> str:
    return "–" if x is None else f"{x:.1%}"


@app.command()
@user_errors
def compare(
    scenario: Annotated[Optional[Path], typer.Argument(help="scenario YAML (default: dashboards/default.yaml)")] = None,
    model: Annotated[Optional[str], typer.Option(help="model preset name or YAML file")] = None,
    hardware: Annotated[Optional[str], typer.Option(help="hardware profile name or YAML file")] = None,
    pp: Annotated[Optional[int], typer.Option(help="pipeline-parallel ranks")] = None,
    tp: Annotated[Optional[int], typer.Option(help="tensor-parallel degree")] = None,
    dp: Annotated[Optional[int], typer.Option(help="data-parallel degree")] = None,
    vp: Annotated[Optional[int], typer.Option(help="virtual stages per rank (interleaved schedules)")] = None,
    microbatches: Annotated[Optional[int], typer.Option(help="microbatches per step (m)")] = None,
    microbatch_size: Annotated[Optional[int], typer.Option(help="sequences per microbatch (b)")] = None,
    seq_len: Annotated[Optional[int], typer.Option(help="tokens per sequence (default: the model's)")] = None,
    dtype: Annotated[Optional[str], typer.Option(help="compute dtype: bf16, fp16, fp8, fp32, tf32")] = None,
    zero_stage: Annotated[Optional[int], typer.Option(help="ZeRO stage: 0 or 1")] = None,
    recompute: Annotated[Optional[str], typer.Option(help="activation recomputation: none, selective, full")] = None,
    schedules: Annotated[Optional[str], typer.Option(help="comma-separated schedule names")] = None,
    op_times: Annotated[Optional[str], typer.Option(help="fixed seconds per action F,I,W (B = I + W)")] = None,
    no_comm: Annotated[bool, typer.Option("--no-comm", help="make all communication free")] = False,
    out_path: Annotated[Optional[Path], typer.Option("--out", help="HTML dashboard to write")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the result rows as JSON instead of a table")] = False,
) -> None:
    """Simulate one training step for each schedule and compare them (table + HTML dashboard)."""
    flags_only = scenario is None and model is not None  # --hardware alone: default scenario on it
    if flags_only:
        if hardware is None:
            raise SimtrainError("give both --model and --hardware (or a scenario file)")
        base = Scenario(model=model, hardware=hardware, schedules=["gpipe", "1f1b"])
        source = "command line"
    else:
        path = scenario or DEFAULT_SCENARIO
        base = load_scenario(path)
        source = str(path)
    overrides = dict(pp=pp, tp=tp, dp=dp, vp=vp, microbatches=microbatches, microbatch_size=microbatch_size,
                     seq_len=seq_len, dtype=dtype, zero_stage=zero_stage, recompute=recompute)
    parallel = _parallel_from(base.parallel.model_dump(exclude_unset=True), overrides, source)
    spec = load_model(model or base.model)
    hw = load_profile(hardware or base.hardware)
    names = [s.strip() for s in schedules.split(",")] if schedules else base.schedules
    names = [n for n in names if n]
    if not names:
        raise SimtrainError("--schedules: give at least one schedule name")
    unknown = [n for n in names if n not in REGISTRY]
    if unknown:
        raise SimtrainError(f"--schedules: unknown schedule '{unknown[0]}'; choose from {sorted(REGISTRY)}")
    times = _parse_op_times(op_times) if op_times else base.op_times
    comm = not (no_comm or base.no_comm)

    runs = [run_schedule(n, spec, hw, parallel, op_times=times, comm=comm) for n in names]
    reports = [r.report for r in runs]
    subtitle = (
        f"{spec.name} on {hw.name}: TP {parallel.tp} x PP {parallel.pp} x DP {parallel.dp}, "
        f"{parallel.microbatches} microbatches of {parallel.microbatch_size} x "
        f"{parallel.seq_len or spec.seq_len} tokens, {parallel.dtype}"
        + (f", op-times F,I,W = {times}" if times else "") + ("" if comm else ", no communication")
    )
    html_path = out_path or (None if as_json else Path(base.out or "simtrain-compare.html"))
    if html_path is not None:
        write_dashboard(html_path, [Panel(r.report, r.result.trace, r.result.memory) for r in runs],
                        base.title if not flags_only else "simtrain comparison", subtitle)
    if as_json:
        print(json.dumps([r.to_row() for r in reports], indent=2))
        return

    table = Table(title=subtitle)
    for col in ("schedule", "step time (ms)", "bubble", "exposed comm (ms)", "overlap", "peak mem (GiB)",
                "fits HBM", "in-flight", "MFU", "tokens/s"):
        table.add_column(col, justify="left" if col == "schedule" else "right")
    for r in reports:
        table.add_row(
            r.schedule, f"{r.step_time_s * 1e3:.2f}", _fmt_pct(r.bubble_ratio), f"{r.exposed_comm_s * 1e3:.2f}",
            _fmt_pct(r.overlap_ratio), f"{max(r.peak_memory_bytes) / GiB:.1f} / {r.hbm_bytes / GiB:.0f}",
            "yes" if r.fits_in_hbm else "[red]NO[/red]", str(max(r.peak_inflight_microbatches)),
            _fmt_pct(r.mfu), f"{r.tokens_per_s:,.0f}",
        )
    out.print(table)
    for r in reports:
        if not r.fits_in_hbm:
            worst = max(range(len(r.peak_memory_bytes)), key=lambda i: r.peak_memory_bytes[i])
            err.print(
                f"warning: {r.schedule} does not fit in HBM: rank {worst} peaks at "
                f"{r.peak_memory_bytes[worst] / GiB:.1f} GiB of {r.hbm_bytes / GiB:.0f} GiB"
            )
    if html_path is not None:
        out.print(f"dashboard: {html_path}")
    if not any(r.fits_in_hbm for r in reports):
        raise SimtrainError("no schedule fits in HBM with this configuration (see the warnings above)")


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
