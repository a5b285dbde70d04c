"""``simtrain plan``: the command around :mod:`simtrain.plan` (flags -> request -> search on a
backend -> table / JSON / HTML page), registered on the app on import.

Outputs are written atomically (a temporary file in the same folder, then ``os.replace``), so
Ctrl-C or an error never leaves a partial page; Ctrl-C also stops the backend's workers.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ..checks import MAX_TASKS
from ..cost_models import parse_cost_choice, recompute_modules
from ..errors import SimtrainError
from ..export import check_output_path, write_output
from ..hardware import GiB, load_profile
from ..models import load_model
from ..parallel import MAX_GPUS
from ..plan import PlanRequest, config_of_row, search, summarise
from ..plan_backends import make_backend
from ..scenario import run_schedule
from ..schedules import REGISTRY, split_name
from .app import app, user_errors
from .app import err as _err
from .app import out as _out
from .compare import _cost_note


def _split_list(text: str, flag: str, allowed: list[str]) -> tuple[str, ...]:
    items = tuple(dict.fromkeys(s.strip() for s in text.split(",") if s.strip()))
    if not items:
        raise SimtrainError(f"{flag} = {text!r}: give at least one of {allowed}")
    for s in items:
        if s not in allowed:
            raise SimtrainError(f"{flag} = {text!r}: '{s}' is not one of {allowed}")
    return items


def _recompute_modes(values: list[str]) -> tuple[str, ...]:
    """The ``--recompute`` modes: each value a comma-separated list of levels (none, selective, full)
    or one module list as ``compare --recompute`` takes it (:func:`simtrain.cost_models.recompute_modules`
    checks it), in order, without repeats.

    Raises:
        SimtrainError: no mode, or a bad module list."""
    levels = ["none", "selective", "full"]
    modes: list[str] = []
    for text in values:
        items = [s.strip() for s in text.split(",") if s.strip()]
        if items and all(s in levels for s in items):
            modes += items
        elif items:
            recompute_modules(text)
            modes.append(text)
    if not modes:
        raise SimtrainError(f"--recompute = {' '.join(values)!r}: give at least one of {levels} or a module list")
    return tuple(dict.fromkeys(modes))


def _schedules(text: str) -> tuple[str, ...]:
    if text.strip() == "all":
        return tuple(REGISTRY)
    names = tuple(dict.fromkeys(s.strip() for s in text.split(",") if s.strip()))
    if not names:
        raise SimtrainError(f"--schedules = {text!r}: give schedule names or 'all'")
    for n in names:
        try:
            split_name(n)
        except SimtrainError as exc:
            raise SimtrainError(f"--schedules: {exc}") from None
    return names


def _print_tables(summary: dict, subtitle: str) -> None:
    from ..viz.plan import config_label  # plotly: only for the tables and the page

    for title, rows in ((f"top {len(summary['top'])}: {subtitle}", summary["top"]),
                        ("Pareto front: step time against peak memory", summary["pareto"])):
        table = Table(title=title)
        for col in ("configuration", "GPUs", "step time (s)", "tokens/s/GPU", "MFU", "peak mem (GiB)", "fits"):
            table.add_column(col, justify="left" if col == "configuration" else "right")
        for r in rows:
            table.add_row(config_label(r), str(r["gpus"]), f"{r['step_time_s']:.3f}",
                          f"{r['tokens_per_s_per_gpu']:,.0f}", f"{r['mfu']:.1%}",
                          f"{r['peak_memory_bytes_max'] / GiB:.1f}", "yes" if r["fits_in_hbm"] else "[red]NO[/red]")
        _out.print(table)
    pruned = ", ".join(f"{k} {v:,}" for k, v in summary["pruned"].items() if v)
    _out.print(f"{summary['considered']:,} configurations considered, {summary['evaluated']:,} simulated; "
               f"pruned: {pruned}")


@app.command()
@user_errors
def plan(
    model: Annotated[str, typer.Option(help="model preset name or YAML file")],
    hardware: Annotated[str, typer.Option(help="hardware profile name or YAML file")],
    gpus: Annotated[int, typer.Option(help="GPUs available (N)", min=1, max=MAX_GPUS)],
    global_batch: Annotated[int, typer.Option(help="sequences per optimizer step (B)", min=1)],
    seq_len: Annotated[Optional[int], typer.Option(help="tokens per sequence (default: the model's)", min=1)] = None,
    schedules: Annotated[str, typer.Option(help="comma-separated schedule names, or 'all'")] = "all",
    objective: Annotated[str, typer.Option(
        help="step-time (on exactly N GPUs) or tokens-per-gpu (on any divisor of N GPUs)")] = "step-time",
    max_tp: Annotated[Optional[int], typer.Option(help="largest tensor-parallel degree (default: GPUs per node)",
                                                  min=1)] = None,
    recompute: Annotated[list[str], typer.Option(
        help="recompute modes to try: levels none, selective, full (comma-separated), or a module list as "
             "simtrain compare takes it (norm,swiglu; per-operator cost model); repeat the flag to try "
             "several lists")] = ["none,selective,full"],
    zero_stages: Annotated[str, typer.Option(help="ZeRO stages to try, comma-separated: 0, 1, 2, 3")] = "0,1",
    top: Annotated[int, typer.Option(help="how many of the best to show (K)", min=1)] = 5,
    cost_model: Annotated[str, typer.Option(
        help="compute cost model, as simtrain compare's: auto (ops where the profile has kernel tables, else "
             "flat), flat (one GEMM efficiency) or ops (per-operator rooflines from kernel tables)")] = "auto",
    attention: Annotated[Optional[str], typer.Option(
        help="attention kernel, as simtrain compare's: flash (fused; no score matrix stored) or unfused "
             "(materialised scores) [default: flash, unfused where the profile has no fused kernel]")] = None,
    fp8: Annotated[Optional[str], typer.Option(
        help="gemms: FP8 linear-layer GEMMs, attention and memory-bound kernels in the compute dtype "
             "(--cost-model ops)")] = None,
    backend: Annotated[str, typer.Option(help="where simulations run: local (process pool) or ray")] = "local",
    workers: Annotated[int, typer.Option(min=1, help="simulations at once")] = 2,
    ray_address: Annotated[Optional[str], typer.Option(
        help="join this Ray cluster (HOST:PORT, ray://HOST:PORT or auto); default: start a local one")] = None,
    out_path: Annotated[Optional[Path], typer.Option("--out", help="HTML page to write")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the result object as JSON")] = False,
    force: Annotated[bool, typer.Option("--force", help="overwrite --out if simtrain did not write it")] = False,
    max_tasks: Annotated[int, typer.Option(
        min=1, help="skip configurations estimated above this many simulated tasks (as compare refuses them)")] = MAX_TASKS,
    grad_reduce_dtype: Annotated[Optional[str], typer.Option(
        help="element type gradients are accumulated and DP-reduced in, as simtrain compare's: bf16, fp16 or "
             "fp32 (Megatron-LM's default in bf16) [default: the gradient's own]")] = None,
) -> None:
    """Search the parallel configurations of N GPUs for the fastest that fits (branch and bound + simulation)."""
    if objective not in ("step-time", "tokens-per-gpu"):
        raise SimtrainError(f"--objective = {objective!r}: choose step-time or tokens-per-gpu")
    spec, hw = load_model(model), load_profile(hardware)
    modes = _recompute_modes(recompute)
    req = PlanRequest(
        model=spec, hardware=hw, gpus=gpus, global_batch=global_batch,
        seq_len=seq_len, schedules=_schedules(schedules), objective=objective, max_tp=max_tp,
        recompute=modes,
        zero_stages=tuple(int(z) for z in _split_list(zero_stages, "--zero-stages", ["0", "1", "2", "3"])), top=top,
        cost=replace(parse_cost_choice(cost_model, next(filter(None, map(recompute_modules, modes)), None), fp8,
                                       hw.attention_kernel(attention), hw), recompute=None), max_tasks=max_tasks,
        grad_reduce_dtype=grad_reduce_dtype)
    if out_path is not None:
        check_output_path(out_path, "--out", ".html", [Path(p) for p in (model, hardware) if Path(p).is_file()], force)
    runner = make_backend(backend, req.model, req.hardware, seq_len, workers, ray_address)
    progress = Progress(TextColumn("planning"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        console=_err, transient=True, disable=not _err.is_terminal)
    try:
        with progress:
            task = progress.add_task("plan", total=None)
            result = search(req, runner, lambda done, total: progress.update(task, completed=done, total=total))
        runner.close()
        _report(req, summarise(req, result), result.rows, out_path, as_json)
    except KeyboardInterrupt:
        _err.print("error: interrupted; workers stopped, nothing written", markup=False, highlight=False)
        raise typer.Exit(130) from None
    finally:
        runner.close()


def _report(req: PlanRequest, summary: dict, rows: list[dict], out_path: Path | None, as_json: bool) -> None:
    """Print the tables or the JSON object and write the page (the best configuration re-simulated)."""
    gpus, seq_len, global_batch, objective = req.gpus, req.seq_len, req.global_batch, req.objective
    subtitle = (f"{req.model.name} on {gpus} x {req.hardware.name}, global batch {global_batch} x "
                f"{seq_len or req.model.seq_len} tokens, objective {objective}" + _cost_note(req.cost)
                + (f", gradients in {req.grad_reduce_dtype}" if req.grad_reduce_dtype else ""))
    if out_path is not None:
        from ..viz import Panel
        from ..viz.plan import write_plan_page

        best = summary["best"]
        par = req.parallel(config_of_row(best))
        runtime = req.cost_of(config_of_row(best)).runtime(req.model, par, req.hardware)
        cfg_run = run_schedule(best["schedule"], req.model, req.hardware, par, runtime=runtime)
        panel = Panel(cfg_run.report, cfg_run.result.tasks, cfg_run.result.memory)
        write_output(lambda: write_plan_page(out_path, summary, rows, panel, req.hardware.hbm_bytes, "simtrain plan",
                                             subtitle), out_path, "--out")
    if as_json:
        print(json.dumps(summary, indent=2))
    else:
        _print_tables(summary, subtitle)
        if out_path is not None:
            _out.print(f"page: {out_path}")
