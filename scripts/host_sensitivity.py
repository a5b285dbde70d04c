"""How far the host would have to fall behind for a published row to be host-bound: a
sensitivity analysis of the ``launch`` row (:mod:`simtrain.costs.launch`), not a price.

simtrain charges the host ``host_per_kernel_s`` per kernel (``op_data.yaml`` ``host:``, 9.9 us),
and a pass lasts at least its kernels times that. This script

1. prints, for one layer chunk of each figure (the second chunk, else the first), the GPU seconds
   and kernels of F, I and W per microbatch and the host time per kernel at which that pass would
   become host-bound (GPU seconds / kernels);
2. re-runs the figures with every kernel's host time set to each ``--host-us`` value and prints
   the published-vs-predicted rows.

No default changes: the shipped rate is the only one ``simtrain`` uses. A per-kernel host time
that closes a row is a what-if, never a measurement (docs/published_validation.md, "Host time per
Transformer Engine / Megatron module call").

    .venv/bin/python scripts/host_sensitivity.py --host-us 9.9,40,70 megatron-bridge-h100-2509-moe-fp8
"""

from __future__ import annotations

import argparse
import dataclasses
from unittest import mock

from simtrain.cost_models import stage_breakdown
from simtrain.costs import ops as costs_ops
from simtrain.costs.kernels import has_kernel_tables
from simtrain.hardware import US
from simtrain.published import _figures, _hardware_of, _model_of, _parallel_of, load_suite, run_suite
from simtrain.scenario import run_schedule


def bind_points(cases: list[str]) -> list[dict]:
    """One layer chunk per figure of ``cases``: GPU seconds, kernels and the host seconds per kernel
    at which each pass would be host-bound (``gpu_s / kernels``; None for a pass without kernels)."""
    out = []
    for case, fig, where in _figures(load_suite().cases, cases):
        hw, model, par = _hardware_of(case.hardware), _model_of(case, fig, where), _parallel_of(case, fig, where)
        rt = costs_ops.published_runtime(model, par, hw, case.attention, fig.recompute_ops, case.fp8)
        run = run_schedule(fig.schedule or case.schedule, model, hw, par, runtime=rt)
        chunk = 1 if len(run.costs.chunks) > 2 else 0
        table = stage_breakdown(run, rt, chunk)
        launch = next(o for o in table["operators"] if o["name"] == "launch")
        gpu = [table["total_s"][p] - launch["seconds"][p] for p in range(3)]
        out.append(dict(case=case.name, label=fig.label, layers=len(table["layers"]), gpu_s=gpu,
                        kernels=launch["kernels"],
                        bind_s=[g / k if k else None for g, k in zip(gpu, launch["kernels"])]))
    return out


def rows_at(host_s: float, cases: list[str]) -> list:
    """The published rows of ``cases`` with every kernel's host time set to ``host_s`` seconds."""
    real = costs_ops.rates_for

    def rates(hardware):
        return dataclasses.replace(real(hardware), host_per_kernel_s=host_s)

    runtime = lambda m, p, hw, *rest: costs_ops.published_runtime(m, p, hw, *rest) if has_kernel_tables(hw) else None
    with mock.patch.object(costs_ops, "rates_for", rates):
        return run_suite(runtime, cases=cases)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cases", nargs="+", help="published case names (simtrain/published/runs.yaml)")
    ap.add_argument("--host-us", default="9.9,40,70", help="host microseconds per kernel, comma-separated")
    args = ap.parse_args()
    print("| case | figure | layers | GPU ms F / I / W | kernels F / I / W | host us/kernel to bind F / I / W |")
    print("|---|---|---:|---|---|---|")
    for b in bind_points(args.cases):
        fmt = lambda xs, scale, nd: " / ".join("-" if x is None else f"{x * scale:.{nd}f}" for x in xs)
        print(f"| {b['case']} | {b['label']} | {b['layers']} | {fmt(b['gpu_s'], 1e3, 2)} | "
              f"{fmt(b['kernels'], 1, 0)} | {fmt(b['bind_s'], 1e6, 1)} |")
    print("\n| host us/kernel | case | figure | published | predicted | error |")
    print("|---:|---|---|---:|---:|---:|")
    for host_us in (float(x) for x in args.host_us.split(",")):
        for r in rows_at(host_us * US, args.cases):
            print(f"| {host_us:g} | {r.case} | {r.label} | {r.published:g} | {r.predicted:.1f} | {r.error:+.1%} |")


if __name__ == "__main__":
    main()
