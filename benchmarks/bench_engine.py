"""Speed of the simulator itself: wall time and engine events per second.

Run: ``.venv/bin/python benchmarks/bench_engine.py [--pp 16] [--microbatches 128] [--repeat 3]``.
Not part of the test suite; performance claims in notes come from this script's output.
"""

from __future__ import annotations

import argparse
import statistics
import time

from simtrain.engine import simulate
from simtrain.hardware import load_profile
from simtrain.lowering import lower
from simtrain.models import load_model
from simtrain.network import Topology
from simtrain.parallel import ParallelConfig
from simtrain.scenario import run_schedule
from simtrain.costs import stage_costs
from simtrain.schedules import generate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--pp", type=int, default=16)
    ap.add_argument("--microbatches", type=int, default=128)
    ap.add_argument("--schedules", default="gpipe,1f1b")
    ap.add_argument("--model", default="llama3-405b")
    ap.add_argument("--hardware", default="h100-sxm")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    model, hw = load_model(args.model), load_profile(args.hardware)
    par = ParallelConfig(pp=args.pp, tp=8, dp=8, microbatches=args.microbatches)
    print(f"{args.model} on {args.hardware}, pp={args.pp} m={args.microbatches} tp=8 dp=8")
    for name in args.schedules.split(","):
        sched = generate(name, par.pp, par.microbatches, par.vp)
        costs = stage_costs(model, par, hw, sched.num_chunks)
        sim_times, total_times, events = [], [], 0
        for _ in range(args.repeat):
            graph = lower(sched, costs, Topology(hw, par))
            t0 = time.perf_counter()
            res = simulate(graph)
            sim_times.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            run_schedule(name, model, hw, par)
            total_times.append(time.perf_counter() - t0)
            events = res.events
        sim = statistics.median(sim_times)
        print(f"  {name:8s} events {events:7d}  engine {sim:6.3f} s ({events / sim:,.0f} events/s)  "
              f"end-to-end (cost+lower+engine+metrics) {statistics.median(total_times):6.3f} s")


if __name__ == "__main__":
    main()
