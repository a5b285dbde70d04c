"""The other commands: ``export-schedule``, ``overlay``, ``profiles``, ``models``, the
torch-based ``calibrate`` and ``validate`` (:mod:`simtrain.calibration.commands`), and
``collective`` (:mod:`simtrain.collective_cli`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from ..calibration.commands import calibrate, validate
from ..atomic import check_writable
from ..checks import MAX_TASKS, check_export, check_finite, check_structure
from ..collective_cli import collective
from ..errors import SimtrainError
from ..export import check_output_path, write_output
from ..hardware import GB, GiB, TFLOPS, available_profiles, load_profile, profile_files, shadow_note
from ..models import available_models, load_model
from ..scenario import run_schedule
from ..schedules import REGISTRY, generate
from ..schedules.io import format_torch_csv, write_torch_csv
from .app import app, err, out, user_errors
from .settings import load_settings

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
    max_tasks: Annotated[int, typer.Option(
        min=1, help="refuse schedules of more than this many actions")] = MAX_TASKS,
) -> None:
    """Write a schedule's per-rank actions in torch.distributed.pipelining's CSV layout."""
    if fmt != "torch-csv":
        raise SimtrainError(f"--format = {fmt!r}: the only format is 'torch-csv'")
    if pp < 1 or microbatches < 1 or vp < 1:
        raise SimtrainError(f"--pp {pp}, --microbatches {microbatches}, --vp {vp}: each must be >= 1")
    check_export(name, pp, microbatches, vp, max_tasks)
    if out_path is not None:
        if out_path.suffix.lower() != ".csv":  # torch's schedule CSV layout
            raise SimtrainError(f"--out = {str(out_path)!r}: expected a .csv file name (torch's schedule CSV layout)")
        check_writable(out_path, "--out")
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
    max_tasks: Annotated[int, typer.Option(
        min=1, help="refuse runs estimated above this many simulated tasks")] = MAX_TASKS,
    out_path: Annotated[Path, typer.Option("--out", help="HTML page to write")] = Path("simtrain-overlay.html"),
    as_json: Annotated[bool, typer.Option("--json", help="print the per-action differences as JSON")] = False,
    force: Annotated[bool, typer.Option("--force", help="overwrite --out if simtrain did not write it")] = False,
) -> None:
    """Draw a measured torch pipeline step and its simulation on one timeline, rank by rank."""
    from ..measured import read_torch_trace  # pandas and plotly: only for this command
    from ..overlay import action_differences, measured_op_times, overlay_summary, schedule_from_measured
    from ..viz import write_overlay

    inputs = [*measured, *(p for p in (scenario, Path(model) if model else None,
                                       Path(hardware) if hardware else None) if p)]
    if scenario is None and (model is None or hardware is None):
        raise SimtrainError("overlay: give the model and hardware that produced the traces (--model and --hardware, "
                            "or a scenario file); --op-times fixes only the compute, communication and memory are "
                            "still priced from them, and without them simtrain would price the default scenario's "
                            "model, not the traced one")
    check_output_path(out_path, "--out", ".html", inputs, force)
    actions = read_torch_trace(measured, step)
    taken = schedule_from_measured(actions, "measured order")
    from_trace = op_times is not None and op_times.strip() == "measured"
    overrides = dict(pp=taken.num_ranks, microbatches=taken.num_microbatches, tp=tp, dp=dp,
                     microbatch_size=microbatch_size, seq_len=seq_len, dtype=dtype)
    st = load_settings(scenario, model, hardware, overrides, None if from_trace else op_times, no_comm)
    world, pipeline = actions.attrs.get("world_size"), st.parallel.tp * st.parallel.dp * st.parallel.cp
    if world is not None and world % pipeline == 0 and world // pipeline > taken.num_ranks:
        raise SimtrainError(f"--measured: {len(measured)} trace file(s) with {taken.num_ranks} pipeline rank(s), and "
                            f"the job had {world // pipeline} (distributedInfo.world_size {world} / (tp {st.parallel.tp} "
                            f"x dp {st.parallel.dp} x cp {st.parallel.cp})); give one trace per pipeline rank "
                            "(repeat --measured), or the tp and dp the job ran with")
    if st.recompute_modules:
        raise SimtrainError(f"{st.source}: field 'parallel.recompute' = {st.recompute_modules!r}: a module list is "
                            "priced by compare's per-operator cost model, which overlay does not run; give a level "
                            "(none, selective, full)")
    times = measured_op_times(actions) if from_trace else st.op_times
    if schedule is not None and schedule not in REGISTRY:
        raise SimtrainError(f"--schedule: unknown schedule '{schedule}'; choose from {sorted(REGISTRY)}")
    check_structure([schedule] if schedule else [], st.model, st.parallel, max_tasks)  # as compare: before any cost
    run = run_schedule(schedule or taken, st.model, st.hardware, st.parallel, op_times=times, comm=st.comm)
    trace = run.result.trace
    diffs = action_differences(actions, trace)
    summary = overlay_summary(actions, trace, diffs)
    check_finite(summary, "overlay")
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
def profiles(
    paths: Annotated[Optional[list[Path]], typer.Argument(help="your own profile files or folders to list too")] = None,
) -> None:
    """List the built-in hardware profiles, then yours (./hardware_profiles/ and PATHS)."""
    table = Table(title="hardware profiles")
    for col in ("name", "where", "GPU", "bf16 TFLOP/s", "HBM GiB", "HBM TB/s", "GPUs/node", "intra GB/s/dir", "inter GB/s/dir/NIC"):
        table.add_column(col)
    for _, path, built_in in profile_files(paths or []):
        p = load_profile(path)
        if not built_in and p.name in available_profiles():
            err.print(f"warning: {shadow_note(path, p.name)}", markup=False, highlight=False, soft_wrap=True)
        if p.name != path.stem:  # results, errors and the cost model call it by its name: field
            err.print(f"warning: {path}: listed as '{p.name}' (its name: field), the name its results and errors "
                      f"use; rename the file {p.name}{path.suffix} or change name: to '{path.stem}' to make them "
                      "agree", markup=False, highlight=False, soft_wrap=True)
        table.add_row(
            p.name, "built-in" if built_in else str(path), p.description, f"{p.peak_flops.get('bf16', 0) / TFLOPS:.0f}",
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
            str(m.seq_len), f"{m.total_params / 1e9:.2f}B", f"{m.activated_params / 1e9:.2f}B", published,
        )
    out.print(table)


@app.command()
@user_errors
def schema(
    kind: Annotated[Optional[str], typer.Argument(help="model, hardware or scenario")] = None,
    markdown: Annotated[bool, typer.Option("--markdown", help="print the field reference of every kind (Markdown)")] = False,
) -> None:
    """Print the JSON Schema of a model, hardware profile or scenario file (from its pydantic model)."""
    from ..schema import SCHEMAS, json_schema, markdown_reference

    if markdown:
        print(markdown_reference())
        return
    if kind not in SCHEMAS:
        raise SimtrainError(f"schema: kind = {kind!r}: choose one of {sorted(SCHEMAS)} (or --markdown)")
    print(json.dumps(json_schema(kind), indent=2))


# torch-based commands (the optional `calibrate` extra; torch is imported only when they run)
app.command()(user_errors(calibrate))
app.command()(user_errors(validate))
app.command()(user_errors(collective))
