"""Simulator wall time on the DeepSeek-V3 expert-parallel case, with the step it simulates.

Run: ``.venv/bin/python benchmarks/bench_moe.py [--schedules 1f1b,1f1b+waved-ep,dualpipe,dualpipe+waved-ep]
[--deepseek-settings] [--forward-only] [--reference-dualpipe] [--repeat 1]``.

Default case: DeepSeek-V3 on H800, PP 16 x DP 128 with EP 64, 32 microbatches (the issue's command).
``--deepseek-settings`` adds what DeepSeek-V3 reports using (§3.2-3.3): FP8 dispatch, routing to
at most 4 nodes, ZeRO-1; plus full recomputation so that the activations fit in 80 GB.
Schedules not in the registry are skipped with a note. ``--reference-dualpipe`` also runs the
imported ``deepseek:DualPipe`` order of the reference data (p = 4, m = 32) on a 19-layer slice of
DeepSeek-V3 (3 dense + 16 MoE layers, so each of its 4 stages holds 4-5 layers like a PP 16
stage, and ZeRO-1 for DualPipe's two parameter copies), against 1F1B on the same slice, each with
and without Waved-EP.

``moe block`` is the median over forward MoE blocks of the time from a block's first dispatch to
its last combine (the per-MoE-layer time DeepSeek-V4 reports speedups of).

Not part of the test suite; performance claims come from this script's output.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import pandas as pd

from simtrain.costs import stage_costs
from simtrain.engine import simulate
from simtrain.hardware import load_profile
from simtrain.lowering import lower
from simtrain.models import load_model
from simtrain.moe import resolve_waves
from simtrain.network import Topology
from simtrain.parallel import ParallelConfig
from simtrain.scenario import run_schedule
from simtrain.schedules import REGISTRY, generate, split_name


def moe_block_s(trace: pd.DataFrame) -> float:
    """Median over forward MoE blocks of (last combine end - first dispatch start)."""
    rows = trace[trace["name"].str.match(r"^(dispatch|experts|combine) \d+F\d+ L\d+")]
    if rows.empty:
        return 0.0
    key = rows["rank"].astype(str) + " " + rows["name"].str.split().str[1:3].str.join(" ")
    spans = rows.groupby(key).agg(start=("start_s", "min"), end=("end_s", "max"))
    return float((spans["end"] - spans["start"]).median())


def row(label: str, run, seconds: float) -> str:
    r = run.report
    return (f"  {label:30s} wall {seconds:5.2f} s  events {run.result.events:6d}  step {r.step_time_s * 1e3:8.1f} ms  "
            f"a2a {r.a2a_s * 1e3:7.1f} ms  exposed a2a {r.exposed_a2a_s * 1e3:7.1f} ms  EP share {r.ep_share:5.1%}  "
            f"moe block {moe_block_s(run.result.trace) * 1e3:6.2f} ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--schedules", default="1f1b,1f1b+waved-ep,dualpipe,dualpipe+waved-ep")
    ap.add_argument("--microbatches", type=int, default=32)
    ap.add_argument("--waves", type=int, default=None)
    ap.add_argument("--deepseek-settings", action="store_true")
    ap.add_argument("--reference-dualpipe", action="store_true")
    ap.add_argument("--forward-only", action="store_true")
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args()
    model, hw = load_model("deepseek-v3"), load_profile("h800")
    extra = dict(dispatch_dtype="fp8", node_limit=4, zero_stage=1, recompute="full") if args.deepseek_settings else {}
    par = ParallelConfig(pp=16, dp=128, ep=64, microbatches=args.microbatches, waves=args.waves,
                         forward_only=args.forward_only, **extra)
    print(f"deepseek-v3 on h800, PP 16 x DP 128, EP 64, m = {args.microbatches}, waves "
          f"{resolve_waves(model, par)}{', ' + str(extra) if extra else ''}{', forward only' if args.forward_only else ''}")
    for name in args.schedules.split(","):
        base, variants = split_name(name) if name.split("+")[0] in REGISTRY else (name, ())
        if base not in REGISTRY:
            print(f"  {name:34s} skipped: '{base}' is not in the schedule registry")
            continue
        sched = generate(name, par.pp, par.microbatches, par.vp)
        costs = stage_costs(model, par, hw, sched.num_chunks)
        waves = resolve_waves(model, par) if "waved-ep" in variants else 1
        walls, engine = [], []
        for _ in range(args.repeat):
            graph = lower(sched, costs, Topology(hw, par), waves=waves)
            t0 = time.perf_counter()
            simulate(graph)
            engine.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            run = run_schedule(name, model, hw, par)
            walls.append(time.perf_counter() - t0)
        print(row(name, run, statistics.median(walls)) + f"  (engine {statistics.median(engine):.2f} s)")

    if args.reference_dualpipe:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
        from conftest import reference_schedule  # the reference-data importer of the tests

        piece = model.model_copy(update={"num_layers": 19, "name": "deepseek-v3 (19-layer slice)"})
        small = par.model_copy(update={"pp": 4, "microbatches": 32, "zero_stage": 1})
        print(f"\n{piece.name}, PP 4 x DP 128, EP 64, m = 32, waves {resolve_waves(piece, small)}")
        dualpipe = reference_schedule("deepseek:DualPipe", 4, 32)
        for label, sched, waved in (
            ("1f1b", "1f1b", False), ("1f1b+waved-ep", "1f1b", True),
            ("deepseek:DualPipe (imported)", dualpipe, False), ("deepseek:DualPipe+waved-ep", dualpipe, True),
        ):
            t0 = time.perf_counter()
            run = run_schedule(sched, piece, hw, small, waved_ep=waved)
            print(row(label, run, time.perf_counter() - t0))


if __name__ == "__main__":
    main()
