"""Shared fixtures: reference data, a tiny model, and a helper that simulates with unit costs."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from simtrain.hardware import load_profile
from simtrain.models import ModelSpec, MoESpec
from simtrain.parallel import ParallelConfig
from simtrain.scenario import SCENARIO_DIR, run_schedule
from simtrain.schedules import Schedule, parse_action

DATA = Path(__file__).parent / "data"
ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = sorted(SCENARIO_DIR.glob("*.yaml"))


@pytest.fixture(scope="session")
def rendered_scenarios(tmp_path_factory):
    """Every built-in scenario (simtrain/scenarios/) rendered once per test session by ``simtrain compare --json``.

    Returns ``{stem: (html_path, CliRunner result)}``; the dashboard and browser tests share it, so
    the slow scenarios (DeepSeek-V3) are simulated once.
    """
    from typer.testing import CliRunner

    from simtrain.cli import app

    out = tmp_path_factory.mktemp("dashboards")
    runner = CliRunner()
    done = {}
    for scenario in SCENARIOS:
        html = out / f"{scenario.stem}.html"
        done[scenario.stem] = (html, runner.invoke(app, ["compare", str(scenario), "--out", str(html), "--json"]))
    return done


def reference_records(schedule: str) -> list[dict]:
    """Records of ``schedule`` (e.g. ``torch:1F1B``) in the copied schedule_orders.json."""
    records = json.loads((DATA / "schedule_orders.json").read_text())["records"]
    return [r for r in records if r["schedule"] == schedule and "orders" in r]


def reference_schedule(name: str, p: int, m: int) -> Schedule:
    """A deepseek:DualPipe / DualPipeV order from the reference data as a Schedule."""
    rec = next(r for r in reference_records(name) if r["p"] == p and r["m"] == m)
    stages = rec["num_stages"]
    paths = [None] * m
    for group in rec["paths"]:
        for mb in group["microbatches"]:
            paths[mb] = tuple(group["stages"])
    return Schedule(
        name=name, num_microbatches=m,
        stage_to_rank=tuple(rec["stage_to_rank"][str(s)] for s in range(stages)),
        orders=tuple(tuple(parse_action(a) for a in rec["orders"][str(r)]) for r in range(p)),
        stage_chunk=tuple(s % p for s in range(stages)) if name.endswith("DualPipe") else None,
        paths=tuple(paths),
    )


def unpaired(schedule: Schedule) -> Schedule:
    """The same order with every overlapped F&B pair run as its two halves, one after the other."""
    orders = tuple(tuple(p for a in order for p in a.parts) for order in schedule.orders)
    return replace(schedule, name=schedule.name + " unpaired", orders=orders)


def tiny_model(layers: int = 64, **kw) -> ModelSpec:
    """A small dense transformer (h = 256) with enough layers for 64 stages."""
    spec = dict(name="tiny", num_layers=layers, hidden_size=256, ffn_hidden_size=1024, num_heads=4,
                vocab_size=1000, seq_len=128)
    spec.update(kw)
    return ModelSpec(**spec)


def tiny_moe(layers: int = 4, **kw) -> ModelSpec:
    """A small MoE transformer (h = 256, 16 experts of width 128, top-4, 1 shared expert, the first
    layer dense)."""
    moe = dict(num_experts=16, top_k=4, expert_ffn_hidden_size=128, num_shared_experts=1, first_dense_layers=1)
    moe.update(kw.pop("moe", {}))
    return tiny_model(layers=layers, moe=MoESpec(**moe), **kw)


def balanced_moe(layers: int = 4) -> ModelSpec:
    """An MoE model whose all-to-all over NVLink (EP 8) takes about as long as its experts and
    attention (h = 2048, 64 experts of width 1024, top-4, s = 1024), so overlap shows."""
    return tiny_moe(layers=layers, hidden_size=2048, ffn_hidden_size=4096, seq_len=1024,
                    moe=dict(num_experts=64, expert_ffn_hidden_size=1024))


@pytest.fixture(scope="session")
def h100():
    return load_profile("h100-sxm")


def unit_run(schedule: str, pp: int, m: int, vp: int = 1, op_times=(1.0, 1.0, 1.0), comm: bool = False, **par):
    """Simulate ``schedule`` with fixed op-times (default F = I = W = 1) and free communication."""
    parallel = ParallelConfig(pp=pp, microbatches=m, vp=vp, **par)
    return run_schedule(schedule, tiny_model(), load_profile("h100-sxm"), parallel, op_times=op_times, comm=comm)


def check_run(run, contiguous: bool = True) -> None:
    """Every action once, dependencies respected, memory back to static, bubble in [0, 1).

    ``contiguous``: an action's compute tasks must follow each other without gaps (False for MoE
    stages, whose sub-operations wait for all-to-alls in between).
    """
    sched, trace = run.schedule, run.result.trace
    comp = trace[(trace["category"] == "compute") & trace["stage"].notna()].copy()
    comp["dur"] = comp["end_s"] - comp["start_s"]
    spans = comp.groupby(["stage", "microbatch", "kind"]).agg(
        start=("start_s", "min"), end=("end_s", "max"), busy=("dur", "sum"))
    expected = {(a.stage, a.microbatch, a.kind) for order in sched.orders for act in order for a in act.parts}
    assert {(int(s), int(mb), k) for s, mb, k in spans.index} == expected
    # an action cut into DP-bucket pieces still runs once, without gaps; the halves of an
    # overlapped pair alternate slice by slice, so only they may have gaps (and, with
    # ``contiguous=False``, actions cut into MoE sub-operations, which wait for all-to-alls)
    paired = {(a.stage, a.microbatch, a.kind) for order in sched.orders for act in order if len(act.parts) > 1
              for a in act.parts}
    gaps = (spans["end"] - spans["start"]) - spans["busy"]
    if contiguous:
        assert (gaps[[key not in paired for key in gaps.index]].abs() < 1e-9).all()
    assert (gaps >= -1e-9).all()
    done = {(int(s), int(mb), k): (row.start, row.end) for (s, mb, k), row in spans.iterrows()}
    for _, rows in trace[trace["stream"] == "compute"].groupby("rank"):  # one GPU: no two at once
        assert (rows["start_s"].to_numpy()[1:] >= rows["end_s"].to_numpy()[:-1] - 1e-12).all()

    def bwd(stage, mb):
        return done.get((stage, mb, "B")) or done[(stage, mb, "I")]

    eps = 1e-12
    for mb in range(sched.num_microbatches):
        path = sched.path(mb)
        for i, s in enumerate(path):
            assert done[(s, mb, "F")][1] <= bwd(s, mb)[0] + eps
            if (s, mb, "W") in done:
                assert done[(s, mb, "I")][1] <= done[(s, mb, "W")][0] + eps
            if i + 1 < len(path):
                nxt = path[i + 1]
                assert done[(s, mb, "F")][1] <= done[(nxt, mb, "F")][0] + eps
                assert bwd(nxt, mb)[1] <= bwd(s, mb)[0] + eps
    mem = run.result.memory
    static = mem[mem["time_s"] == 0].groupby("rank")["bytes"].first()
    final = mem.groupby("rank")["bytes"].last()
    assert ((final - static).abs() <= 1e-6 * static.clip(lower=1)).all()
    assert 0 <= run.report.bubble_ratio < 1


SMALL = ["--model", "llama3-8b", "--hardware", "h100-sxm", "--pp", "4", "--tp", "2", "--dp", "2",
         "--microbatches", "8", "--seq-len", "2048"]
"""A small dense configuration for CLI tests (Llama 3 8B, TP 2 x PP 4 x DP 2, 8 microbatches)."""


def invoke(*args: str):
    """Run ``simtrain ARGS...`` in-process with typer's test runner; returns its Result."""
    from typer.testing import CliRunner

    from simtrain.cli import app

    return CliRunner().invoke(app, list(args))
