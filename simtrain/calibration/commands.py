"""``simtrain calibrate`` and ``simtrain validate`` (registered by :mod:`simtrain.cli`).

Both run their measurements as a distributed job (:mod:`.launch`): spawned locally, or in place
when the CLI itself was started by ``torchrun`` (then rank 0 writes and prints). Units are
converted here, at the edge.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import statistics
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from ..atomic import check_writable
from ..checks import check_finite
from ..collective_cli import calibrate_nccl_tests
from ..errors import SimtrainError
from ..hardware import load_profile
from . import launch, require_torch

out = Console(width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True, width=None if sys.stderr.isatty() else 160)

REPEATS = {True: dict(repeats=9, comm_repeats=15, pipeline_steps=10),
           False: dict(repeats=15, comm_repeats=25, pipeline_steps=16)}
"""Repeats per case for --quick (True) and full runs."""


def _ints(flag: str, text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        values = []
    if not values or any(v < 1 for v in values):
        raise SimtrainError(f"{flag} = {text!r}: expected comma-separated positive integers, e.g. 256,512")
    return values


def _check_device_name(device: str) -> None:
    """Refuse a ``--device`` other than cpu or cuda (before torch is imported, before ``--out``)."""
    if device not in ("cpu", "cuda"):
        raise SimtrainError(f"--device = {device!r}: choose cpu or cuda")


def _check_device(device: str, world: int | None, torch) -> int:
    """Validate --device and --world; return the world size (torchrun's, or the ranks to spawn)."""
    _check_device_name(device)
    if launch.under_torchrun():
        return int(os.environ["WORLD_SIZE"])
    if device == "cuda":
        if not torch.cuda.is_available():
            raise SimtrainError("--device cuda: torch sees no CUDA GPU on this machine; use --device cpu")
        gpus = torch.cuda.device_count()
        world = gpus if world is None else world
        if world > gpus:
            raise SimtrainError(f"--world = {world}: this machine has {gpus} GPU(s); use torchrun for more nodes")
    world = 2 if world is None else world
    if world < 1:
        raise SimtrainError(f"--world = {world}: must be >= 1 rank")
    return world


def _run(job: str, spec: dict, world: int, timeout_s: float, title: str) -> dict | None:
    """Run ``job`` in place (torchrun) or on spawned local ranks, with a progress bar."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn  # only when a job runs

    columns = (TextColumn(f"{title}: {{task.description}}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
               TimeElapsedColumn())
    quiet = launch.under_torchrun() and os.environ.get("RANK") != "0"  # one progress bar per job
    with Progress(*columns, console=err, transient=True, disable=quiet) as bar:
        task = bar.add_task("starting", total=None)

        def progress(line: str) -> None:
            phase, _, rest = line.partition("|")
            done, _, total = rest.partition("|")
            try:
                bar.update(task, description=phase, completed=int(done), total=int(total))
            except ValueError:
                bar.update(task, description=line)

        if launch.under_torchrun():
            try:
                return launch.run_rank_job(job, spec, progress)
            finally:
                launch.finish_torchrun()
        return launch.spawn(job, spec, world, timeout_s, progress)


def _check_timeout(timeout_s: float) -> None:
    """Raises SimtrainError unless ``timeout_s`` is a finite number of seconds > 0 (NaN passes a
    plain ``<= 0`` test)."""
    if not (math.isfinite(timeout_s) and timeout_s > 0):
        raise SimtrainError(f"--timeout-s = {timeout_s}: must be a finite number of seconds > 0")


def calibrate(
    out_path: Annotated[Optional[Path], typer.Option(
        "--out", help="calibrated profile YAML to write (a new file) [required]", show_default=False)] = None,
    base: Annotated[Optional[str], typer.Option(help="profile to take capacity and unmeasured links from")] = None,
    device: Annotated[str, typer.Option(help="cpu or cuda")] = "cpu",
    dtype: Annotated[Optional[str], typer.Option(help="fp32 or bf16 (default: fp32 on cpu, bf16 on cuda)")] = None,
    quick: Annotated[bool, typer.Option("--quick", help="fewer shapes and repeats (about a minute)")] = False,
    force: Annotated[bool, typer.Option("--force", help="overwrite --out if it exists")] = False,
    world: Annotated[Optional[int], typer.Option(help="local ranks to spawn (default: 2 on cpu, all GPUs)")] = None,
    threads: Annotated[int, typer.Option(help="torch threads per rank on cpu")] = 1,
    hidden: Annotated[Optional[str], typer.Option(help="hidden sizes of the GEMM grid, e.g. 4096,8192")] = None,
    tokens: Annotated[Optional[str], typer.Option(help="tokens per microbatch of the GEMM grid, e.g. 4096")] = None,
    timeout_s: Annotated[float, typer.Option("--timeout-s", help="stop the measurement after this many seconds")] = 900,
    nccl_tests: Annotated[Optional[Path], typer.Option(
        "--nccl-tests", help="fit the link model to nccl-tests output files instead of measuring (needs --base)")] = None,
    more_logs: Annotated[Optional[list[Path]], typer.Argument(help="further nccl-tests files", show_default=False)] = None,
) -> None:
    """Measure this machine with torch, or fit nccl-tests logs, and write a NEW calibrated hardware profile."""
    from .profile import base_profile_data, build_profile, write_profile

    _check_device_name(device)  # the flags' values first, then the missing --out
    if out_path is None:
        raise SimtrainError("--out: required: the calibrated profile YAML to write (a new file)")
    if nccl_tests is not None or more_logs:
        if nccl_tests is None:
            raise SimtrainError(f"unexpected argument {str(more_logs[0])!r}: files are read only after --nccl-tests")
        return calibrate_nccl_tests([nccl_tests, *(more_logs or [])], base, out_path, force)

    if out_path.suffix not in (".yaml", ".yml"):
        raise SimtrainError(f"--out {out_path}: expected a .yaml (or .yml) file name: the calibrated profile is YAML")
    if out_path.exists() and not force:
        raise SimtrainError(f"--out {out_path}: the file exists; choose a new name or pass --force to overwrite it")
    check_writable(out_path, "--out")  # before minutes of measuring
    dtype = dtype or ("bf16" if device == "cuda" else "fp32")
    if dtype not in ("fp32", "bf16"):
        raise SimtrainError(f"--dtype = {dtype!r}: choose fp32 or bf16")
    if threads < 1:
        raise SimtrainError(f"--threads = {threads}: must be >= 1")
    _check_timeout(timeout_s)
    grid = dict(hidden=_ints("--hidden", hidden), tokens=_ints("--tokens", tokens))
    if base is not None:
        base_profile_data(base, device, "")  # a bad --base fails before measuring
    torch = require_torch()
    world = _check_device(device, world, torch)
    if world < 2 and base is None and not launch.under_torchrun():
        raise SimtrainError("--world 1 measures no link; use 2 or more ranks, or pass --base to take links from")
    spec = dict(device=device, dtype=dtype, quick=quick, threads=threads, **REPEATS[quick], **grid)
    meas = _run("calibrate", spec, world, timeout_s, "calibrate")
    if meas is None:  # a torchrun rank other than 0
        return
    data = build_profile(meas, base, quick)
    write_profile(out_path, data, force)
    _print_calibration(data, out_path)


def _print_calibration(data: dict, path: Path) -> None:
    rec, comp = data["calibration"], data["compute"]
    table = Table(title=f"{data['name']}: {data['source']}")
    table.add_column("measured")
    table.add_column("value", justify="right")
    table.add_column("fit / spread")
    lin = rec["linear"]
    table.add_row("linear-layer GEMMs", f"{lin['cases']} shapes, best {lin['best_tflops'] * 1e3:.1f} GFLOP/s",
                  f"median CV {lin['cv_median']:.0%}")
    for dtype, rows in comp["attention_tflops"].items():
        for r in rows:
            table.add_row(f"attention s={r['seq_len']} d={r['head_dim']} ({dtype})",
                          f"F {r['forward_tflops'] * 1e3:.1f} / B {r['backward_tflops'] * 1e3:.1f} GFLOP/s", "")
    table.add_row("elementwise kernels", ", ".join(f"{k} {v:.1f}" for k, v in comp["elementwise_gb_per_s"].items())
                  + " GB/s", "bytes the cost model counts")
    if "layer_slowdown" in rec:
        slow = rec["layer_slowdown"]
        passes = [k for k in "FBIW" if k in slow]
        spread = {k: [r["ratio"] for r in slow["residuals"] if r["kind"] == k] for k in passes}
        table.add_row("in-pipeline actions / sum of kernels", ", ".join(f"{k} {slow[k]:.3f}" for k in passes),
                      f"{len(slow['residuals'])} actions, ratios " + ", ".join(
                          f"{k} {min(v):.2f}-{max(v):.2f}" for k, v in spread.items()))
    if "optimizer" in rec:
        table.add_row("optimizer step (Adam)", f"{rec['optimizer']['gb_per_s']:.1f} GB/s",
                      f"{len(rec['optimizer']['residuals'])} rank steps, cost-model bytes")
    table.add_row("copy (memory bandwidth)", f"{rec['copy']['gb_per_s']:.1f} GB/s", f"CV {rec['copy']['cv']:.0%}")
    for cls, link in rec.get("links", {}).items():
        if link.get("measured"):
            worst = max(abs(r["error"]) for r in link["residuals"])
            table.add_row(f"p2p {cls}", f"{link['latency_us']:.1f} us + bytes / {link['bandwidth_gb_per_s']:.2f} GB/s",
                          f"R² {link['r2']:.3f}, worst size {worst:.0%}")
        else:
            table.add_row(f"p2p {cls}", "–", link["note"])
    for name, fit in rec.get("collectives", {}).items():
        if "latency_us" in fit:
            table.add_row(name.replace("_", "-"), f"{fit['latency_us']:.1f} us + bytes / {fit['bandwidth_gb_per_s']:.2f} GB/s",
                          f"R² {fit['r2']:.3f} (recorded, not used)")
    ov = rec["overheads"]
    worst = max(ov["residuals"], key=lambda r: abs(r["error"]), default=None)
    table.add_row("per-action / per-message overhead", f"{ov['action_us']:.0f} us / {ov['message_us']:.0f} us",
                  f"{len(ov['residuals'])} pipeline runs" + (
                      f", worst {worst['run']} {worst['error']:+.1%}" if worst else ""))
    if comp.get("processors_per_node"):
        table.add_row("processors per node", str(comp["processors_per_node"]), "ranks beyond this share them")
    out.print(table)
    out.print(f"profile: {path}")


_TORCH_RUN_OPTIONS = ("profile", "schedules", "world", "device", "steps", "warmup", "threads", "no_speed_correction",
                      "timeout_s")
"""The options of validate's torch run (``--published`` takes none of them)."""


def validate(
    ctx: typer.Context,
    profile: Annotated[Optional[str], typer.Option(help="calibrated profile (name or YAML file)")] = None,
    schedules: Annotated[Optional[str], typer.Option(help="schedules, comma-separated: compare's names or torch's class names (default: all seven torch has)")] = None,
    world: Annotated[Optional[int], typer.Option(help="pipeline ranks (default: 2 on cpu, all GPUs)")] = None,
    device: Annotated[str, typer.Option(help="cpu or cuda")] = "cpu",
    steps: Annotated[int, typer.Option(help="measured training steps per schedule")] = 10,
    warmup: Annotated[int, typer.Option(help="warm-up steps per schedule")] = 2,
    threads: Annotated[int, typer.Option(help="torch threads per rank on cpu")] = 1,
    no_speed_correction: Annotated[bool, typer.Option(
        "--no-speed-correction", help="predict at the profile's speed, ignoring how much the machine was slowed")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print the rows as JSON")] = False,
    timeout_s: Annotated[float, typer.Option("--timeout-s", help="stop the runs after this many seconds")] = 900,
    published: Annotated[bool, typer.Option(
        "--published", help="compare with the published real-cluster runs shipped in simtrain/published/runs.yaml")] = False,
    cost_model: Annotated[str, typer.Option(
        "--cost-model", help="with --published: auto (as compare: ops where the profile has kernel tables), "
                             "flat (alias shipped) or ops (per-operator)")] = "auto",
) -> None:
    """Train a small transformer with torch's pipeline schedules (or, with --published, take published
    real-cluster runs); compare with simtrain's prediction."""
    from .microbench import device_name
    from .predict import speed_reference
    from .validate import compare, parse_schedules
    from .workload import default_model

    def given(name: str) -> bool:  # typed by the user, not the signature's default (click's ParameterSource)
        source = ctx.get_parameter_source(name)
        return source is not None and source.name != "DEFAULT"

    if published:
        torch_run = [f"--{name.replace('_', '-')}" for name in _TORCH_RUN_OPTIONS if given(name)]
        if torch_run:
            raise SimtrainError(f"{', '.join(torch_run)}: options of the torch run, not of --published "
                                "(which takes only --cost-model and --json)")
        _validate_published(cost_model, as_json)
        return
    if given("cost_model"):
        raise SimtrainError(f"--cost-model = {cost_model!r}: applies only with --published "
                            "(the torch run predicts with the calibrated --profile)")
    if profile is None:
        raise SimtrainError("--profile is required (a calibrated profile), unless --published is given")
    hw = load_profile(profile)
    names = parse_schedules(schedules)
    _check_timeout(timeout_s)
    if steps < 1 or warmup < 0:
        raise SimtrainError(f"--steps = {steps}, --warmup = {warmup}: need steps >= 1 and warmup >= 0")
    if threads < 1:
        raise SimtrainError(f"--threads = {threads}: must be >= 1")
    torch = require_torch()
    world = _check_device(device, world, torch)
    if world < 2:
        raise SimtrainError(f"--world = {world}: a pipeline needs at least 2 ranks")
    cfg = default_model(world, device, quick=False)
    reference_s = None if no_speed_correction else speed_reference(
        hw, device, device_name(torch, torch.device(device)), dataclasses.asdict(cfg))
    spec = dict(device=device, schedules=names, model=dataclasses.asdict(cfg), steps=steps, warmup=warmup,
                threads=threads)
    result = _run("validate", spec, world, timeout_s, "validate")
    if result is None:
        return
    rows = compare(result, hw, reference_s)
    check_finite([dataclasses.asdict(r) for r in rows], "validate")
    factors = [r.speed_factor for r in rows]
    err.print(("speed correction: none (--no-speed-correction): predicted at the profile's speed" if reference_s is None
               else f"speed correction: this machine ran {statistics.median(factors):.2f}x the calibration's time "
               f"(probe {reference_s * 1e3:.2f} ms then; range {min(factors):.2f}x-{max(factors):.2f}x over the "
               "schedules); predictions are scaled by it"), markup=False, highlight=False)
    if as_json:
        print(json.dumps([dataclasses.asdict(r) for r in rows], indent=2))
        return
    spec_model = cfg.spec()
    table = Table(title=(
        f"simtrain vs torch: {spec_model.name}, {cfg.microbatches} microbatches of {cfg.microbatch_size} x "
        f"{cfg.seq_len} tokens, {world} ranks ({device}); profile {hw.name}"))
    for col in ("schedule", "measured step (ms)", "predicted (ms)", "error", "measured act. peak (MiB)",
                "predicted (MiB)", "error", "machine speed"):
        table.add_column(col, justify="left" if col == "schedule" else "right")
    for r in rows:
        table.add_row(r.schedule, f"{r.measured_step_s * 1e3:.1f}", f"{r.predicted_step_s * 1e3:.1f}",
                      f"{r.step_error:+.1%}", f"{r.measured_activation_bytes / 2**20:.2f}",
                      f"{r.predicted_activation_bytes / 2**20:.2f}", f"{r.memory_error:+.1%}",
                      f"{1 / r.speed_factor:.2f}x")
    out.print(table)
    errors = [abs(r.step_error) for r in rows]
    out.print(f"step-time error: median |e| = {statistics.median(errors):.1%}, max |e| = {max(errors):.1%} "
              f"over {len(rows)} schedule(s); activation-peak error: max |e| = "
              f"{max(abs(r.memory_error) for r in rows):.1%}")



def _validate_published(cost_model: str, as_json: bool) -> None:
    """``simtrain validate --published``: predict every figure of the published suite."""
    from ..published import over_hbm, rows_table, run_suite, summarise

    from ..costs.kernels import has_kernel_tables
    from ..costs.ops import published_runtime

    if cost_model not in ("auto", "flat", "shipped", "ops"):
        raise SimtrainError(f"--cost-model = {cost_model!r}: choose auto, flat (alias shipped) or ops")
    runtime = {"ops": published_runtime, "auto": lambda m, p, hw, *rest: published_runtime(m, p, hw, *rest)
               if has_kernel_tables(hw) else None}.get(cost_model)
    rows = run_suite(runtime)
    if as_json:
        print(json.dumps([r.to_row() for r in rows], indent=2))
        return
    out.print(rows_table(rows, f"simtrain ({cost_model} cost model) vs published real-cluster runs"))
    parts = [("training steps and memory", [r for r in rows if r.kind == "training"]),
             ("collectives", [r for r in rows if r.kind == "collective"])]
    for what, subset in [p for p in parts if p[1] and len(p[1]) < len(rows)] + [("all", rows)]:
        s = summarise(subset)
        left_out = f" ({s['excluded']} excluded)" if s["excluded"] else ""
        out.print(f"{what}: median |error| = {s['median_abs_error']:.1%}, max |error| = {s['max_abs_error']:.1%} "
                  f"over {s['figures']} figures from {s['cases']} cases{left_out}")
    if s["speed_figures"]:  # s: the last line's summary, of all rows
        out.print(f"speed: predicted faster than published on {s['too_fast']} and slower on {s['too_slow']} of "
                  f"{s['speed_figures']} judged speed figures; median signed speed error "
                  f"{s['median_speed_error']:+.1%} (> 0: optimistic)", markup=False, highlight=False)
    training = [r for r in rows if r.kind == "training" and r.excluded is None]
    over = over_hbm(training)
    out.print(f"memory: {len(over)} of {len(training)} judged training figures peak above their GPU's HBM "
              "(the runs ran, so each is a memory-model error)", markup=False, highlight=False)
    for r in over:
        out.print(f"  over HBM: {r.case}, {r.label}: {r.peak_memory_gib_max:.1f} of {r.hbm_gib:.0f} GiB",
                  markup=False, highlight=False)
    for r in rows:
        if r.excluded:
            out.print(f"excluded from the statistics: {r.case}, {r.label} ({r.error:+.1%}): {r.excluded}")
