"""Speed of ``simtrain plan``: a whole search, pruning included, and how many configurations each
stage of the branch and bound settles.

Default: Llama 3 405B on 16,384 H100s with a 16M-token batch (2,048 sequences of 8,192 tokens; the
Llama 3 paper's §3.3.2 setting), every registered schedule, three recompute modes, ZeRO 0 and 1,
on the local process pool. The reference timed in the same run is one simulation of the paper's
own layout (TP 8 x PP 16 x DP 128, interleaved 1F1B vp 2, 16 microbatches) under the search's
cost model (``--cost-model``, default ``auto`` as ``simtrain plan``), so the search time is also given
in "simulations of the published configuration"; the flat model's simulation is timed too.

Run: ``.venv/bin/python benchmarks/bench_plan.py [--model llama3-405b] [--gpus 16384]
[--global-batch 2048] [--seq-len 8192] [--workers 2] [--schedules all] [--cost-model auto]``.
Not part of the test suite.
"""

from __future__ import annotations

import argparse
import os
import time

from simtrain.cost_models import parse_cost_choice
from simtrain.hardware import load_profile
from simtrain.models import load_model
from simtrain.parallel import ParallelConfig
from simtrain.plan import PlanRequest, search, summarise
from simtrain.plan_backends import LocalBackend
from simtrain.scenario import run_schedule
from simtrain.schedules import REGISTRY
from simtrain.viz.plan import config_label


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="llama3-405b")
    ap.add_argument("--hardware", default="h100-sxm")
    ap.add_argument("--gpus", type=int, default=16384)
    ap.add_argument("--global-batch", type=int, default=2048)
    ap.add_argument("--seq-len", type=int, default=8192)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--schedules", default="all")
    ap.add_argument("--cost-model", default="auto", choices=["auto", "flat", "ops"])
    args = ap.parse_args()
    model, hw = load_model(args.model), load_profile(args.hardware)
    schedules = tuple(REGISTRY) if args.schedules == "all" else tuple(args.schedules.split(","))
    cost = parse_cost_choice(args.cost_model, None, None, hw.attention_kernel(None), hw, model)
    req = PlanRequest(model, hw, args.gpus, args.global_batch, args.seq_len, schedules, cost=cost)
    print(f"load before: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f} "
          f"(1/5/15 min) on {os.cpu_count()} CPUs")

    par = ParallelConfig(tp=8, pp=16, dp=128, vp=2, microbatches=16, seq_len=args.seq_len, zero_stage=1)
    times = {}
    for name, runtime in (("flat", None), (cost.model, cost.runtime(model, par, hw))):
        t0 = time.perf_counter()
        ref = run_schedule("interleaved-1f1b", model, hw, par, runtime=runtime).report
        times[name] = time.perf_counter() - t0
        print(f"reference ({name}): one simulation of TP 8 x PP 16 x DP 128 interleaved vp 2: {times[name]:.2f} s "
              f"(step {ref.step_time_s:.2f} s, MFU {ref.mfu:.1%})")
    t_ref = times[cost.model]

    t0 = time.perf_counter()
    backend = LocalBackend(model, hw, args.seq_len, args.workers)
    try:
        res = search(req, backend)
    finally:
        backend.close()
    t_search = time.perf_counter() - t0
    summary = summarise(req, res)
    print(f"considered {res.considered:,}; simulated {res.evaluated:,}; pruned by reason:")
    for reason, n in res.pruned.items():
        print(f"  {reason:20s} {n:8,}")
    print(f"search ({cost.model} cost model): {t_search:.1f} s with {args.workers} workers = "
          f"{t_search / t_ref:.1f} reference simulations ({cost.model}), {t_search / times['flat']:.1f} (flat)")
    best = summary["best"]
    print(f"best: {config_label(best)}: step {best['step_time_s']:.2f} s, MFU {best['mfu']:.1%}, "
          f"peak {best['peak_memory_bytes_max'] / 2**30:.1f} GiB")
    print(f"load after: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")


if __name__ == "__main__":
    main()
