"""Cost of the per-operator model: one step simulated with the shipped cost model and with
:func:`simtrain.costs.ops.ops_runtime`, timed in the same run (ratio ops / shipped).

Run: ``.venv/bin/python benchmarks/bench_costs_per_operator.py [--repeat 3]``. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import statistics
import time

from simtrain.costs.ops import ops_runtime
from simtrain.hardware import load_profile
from simtrain.models import load_model
from simtrain.parallel import ParallelConfig
from simtrain.scenario import run_schedule

CASES = [
    ("llama3-405b", "h100-sxm", dict(tp=8, pp=16, dp=8, vp=2, microbatches=64, seq_len=8192), "interleaved-1f1b"),
    ("gpt3-175b", "a100-sxm-80gb", dict(tp=8, pp=12, dp=4, microbatches=96, recompute="full"), "1f1b"),
    ("llama3-8b", "h100-sxm", dict(tp=1, pp=8, microbatches=32, seq_len=2048), "zbv"),
    # the deepseek-v3 scenario's layout: MoE segments priced by operator (simtrain.costs.moe_ops)
    ("deepseek-v3", "h800", dict(tp=1, pp=16, dp=128, ep=64, microbatches=32, seq_len=4096, zero_stage=1,
                                 recompute="full", dispatch_dtype="fp8", activation_cache="fp8", node_limit=4),
     "dualpipe"),
]


def _alternate(fns, repeat: int) -> list[tuple[float, int]]:
    """Median seconds and engine events of each function, run in turn (A B A B ...) so that drift
    of a shared machine hits both alike."""
    times = [[] for _ in fns]
    events = [0] * len(fns)
    for _ in range(repeat):
        for i, fn in enumerate(fns):
            t0 = time.perf_counter()
            run = fn()
            times[i].append(time.perf_counter() - t0)
            events[i] = run.result.events
    return [(statistics.median(t), e) for t, e in zip(times, events)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    for model_name, hw_name, par, sched in CASES:
        model, hw, p = load_model(model_name), load_profile(hw_name), ParallelConfig(**par)
        (shipped, ev_s), (ops, ev_o) = _alternate(
            [lambda: run_schedule(sched, model, hw, p),
             lambda: run_schedule(sched, model, hw, p, runtime=ops_runtime(model, p, hw))], args.repeat)
        print(f"{model_name:12s} {sched:17s} shipped {shipped:6.3f} s ({ev_s} events)  per-operator {ops:6.3f} s "
              f"({ev_o} events)  ratio {ops / shipped:5.3f}")


if __name__ == "__main__":
    main()
