"""Speed of the simulator on a fixed set of configurations (issue: a DeepSeek-V3 step in under a
second, a dense step in half a second including start-up).

Run: ``.venv/bin/python benchmarks/bench_speed.py [--repeat 3] [--cases NAME,...] [--fit-repeat 11]``
(``--cases ""``: the cost-exponent fit alone; ``--no-fit``: without it).

For each configuration it prints tasks, SimPy events, wall and CPU seconds (whole step, and the
cost / lower / engine / metrics split), tasks per CPU second through the engine, peak RSS, and
the CPU time as a ratio to a fixed pure-Python reference workload timed in the same run (these
machines are shared and noisy: compare ratios, not seconds). It then fits the cost exponent: the
slope of log CPU seconds (costs, lowering, engine, metrics; no start-up) against log m and log p
for dense 1F1B (Llama 3 70B, TP8 DP4) at m = 64, 128, 256 (p = 16) and p = 4, 8, 16 (m = 256),
sizes at which the step's fixed costs (the costs, the optimizer, a run's set-up: ~5 ms) are a
few per cent, not a third as at m = 32. Each axis runs in one child process (:func:`fit_axis`)
that runs its three sizes in turn (smallest or largest first, alternately) ``--fit-repeat`` times
after one untimed warm-up, collecting garbage before each run, and keeps each size's least CPU
time: a load change on the shared machine then hits every size alike instead of whichever size
ran at that moment, and no size pays a fresh process's first-touch costs that another does not.
It prints the exponent of the whole run and of each part, of the tasks, and of the CPU time per
task (a simulator linear in tasks has 0 there). The tasks themselves grow faster than p (1.047
from p = 4 to 16): a step has 2 (p - 1) m p2p sends beside its 2 p m actions and their TP
collectives. Every other in-process case runs in its
own child process (clean RSS); the ``e2e`` cases time a whole ``simtrain compare ... --json``
from process start to JSON, with Python's bytecode cache as an installed package has it (pip
compiles it at install time): each runs once untimed first, with ``PYTHONDONTWRITEBYTECODE``
unset and ``PYTHONPYCACHEPREFIX`` pointing to a temporary folder, so nothing is written to the
checkout. ``e2e-llama70b-1f1b-source`` is the same run with ``PYTHONDONTWRITEBYTECODE=1`` and
the usual cache folders: the libraries' bytecode as pip wrote it, simtrain compiled from source on
every run unless the checkout has ``__pycache__`` folders. With torch installed it also times torch's own unit-time
``_simulate_comms_compute`` on the same 1F1B orders, as a peer ratio. Each figure is the
minimum over ``--repeat`` runs. ``--coarsen K,...`` also runs every DeepSeek-V3 case (and the
DeepSeek-V3 ``e2e`` case) with ``parallel.moe_coarsen = K`` (an approximation, never the default)
and prints its step time's error against the exact run of the same case. ``--startup`` times
the start-up floor of an ``e2e`` run: fresh processes (the ``e2e`` bytecode cache, each the least
CPU of ``--repeat`` runs after one untimed run) that start Python alone, import each library the
``compare --json`` path imports (numpy, pydantic with one model class, typer, PyYAML, SimPy),
all of them, and ``simtrain.cli.compare`` (everything the command imports): what start-up costs
before any simulation, and how much of it is the libraries'. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # benchmark this checkout's simtrain
DEEPSEEK = ROOT / "simtrain" / "scenarios" / "deepseek-v3.yaml"

CASES = {
    # name: (model, hardware, schedule, parallel overrides) -- in-process run_schedule
    "dense-1f1b-p16-m128": ("llama3-405b", "h100-sxm", "1f1b", dict(pp=16, tp=8, dp=8, microbatches=128)),
    "llama405b-zbv-p16-m128": ("llama3-405b", "h100-sxm", "zbv", dict(pp=16, tp=8, dp=8, microbatches=128)),
    "llama405b-dualpipev-p16-m128": ("llama3-405b", "h100-sxm", "dualpipev", dict(pp=16, tp=8, dp=8, microbatches=128)),
    "dsv3-dualpipe-m64": ("scenario", "", "dualpipe", dict(microbatches=64)),
    "dsv3-dualpipe-waved-m64": ("scenario", "", "dualpipe+waved-ep", dict(microbatches=64)),
    "dsv3-dualpipe-m128": ("scenario", "", "dualpipe", dict(microbatches=128)),
    "dsv3-dualpipe-waved-m128": ("scenario", "", "dualpipe+waved-ep", dict(microbatches=128)),
}
FIT = {
    # the cost exponent: dense 1F1B (Llama 3 70B, TP8 DP4, it fits from p = 4) over m at p = 16 and over p at m = 256
    "m": {m: ("llama3-70b", "h100-sxm", "1f1b", dict(pp=16, tp=8, dp=4, microbatches=m)) for m in (64, 128, 256)},
    "p": {p: ("llama3-70b", "h100-sxm", "1f1b", dict(pp=p, tp=8, dp=4, microbatches=256)) for p in (4, 8, 16)},
}
LLAMA70B_E2E = ["compare", "--model", "llama3-70b", "--hardware", "h100-sxm", "--tp", "8", "--pp", "8", "--dp", "4",
                "--microbatches", "32", "--schedules", "1f1b", "--json"]
E2E = {
    "e2e-llama70b-1f1b": LLAMA70B_E2E,
    "e2e-llama70b-1f1b-source": LLAMA70B_E2E,
    "e2e-dsv3-dualpipe-waved-m64": ["compare", str(DEEPSEEK), "--schedules", "dualpipe+waved-ep",
                                    "--microbatches", "64", "--json"],
}


def reference_workload() -> float:
    """CPU seconds of a fixed pure-Python workload (heap, dict and float arithmetic, the
    operations a discrete-event simulator is made of)."""
    import heapq

    t0 = time.process_time()
    heap: list[tuple[float, int]] = []
    seen: dict[int, float] = {}
    x = 0.0
    for i in range(300_000):
        heapq.heappush(heap, ((i * 7919) % 1000 * 1e-3, i))
        seen[i % 4096] = x
        x += i * 1e-9
        if len(heap) > 64:
            heapq.heappop(heap)
    return time.process_time() - t0


def _timed(module, name: str, split: dict[str, float]) -> None:
    """Wrap ``module.name`` so that its CPU seconds add up in ``split[name]``."""
    fn = getattr(module, name)

    def wrapper(*args, **kwargs):
        t0 = time.process_time()
        try:
            return fn(*args, **kwargs)
        finally:
            split[name] = split.get(name, 0.0) + time.process_time() - t0

    setattr(module, name, wrapper)


_SPLIT: dict[str, float] = {}
"""CPU seconds of each timed part (``stage_costs``, ``lower``, ``simulate``, ``compute_report``) of
the run in progress, added up by the wrappers :func:`_instrument` installs."""


def _instrument():
    """Import :mod:`simtrain.scenario` and wrap its parts so that they add up in :data:`_SPLIT`
    (once per process); returns the module."""
    import simtrain.scenario as scenario

    if not getattr(scenario, "_bench_speed_timed", False):
        for name in ("stage_costs", "lower", "simulate", "compute_report"):
            if hasattr(scenario, name):
                _timed(scenario, name, _SPLIT)
        scenario._bench_speed_timed = True
    return scenario


def _measure(spec: tuple, coarsen: int = 1) -> dict:
    """Run one configuration ``(model, hardware, schedule, parallel overrides)`` of :data:`CASES`
    in this process (with ``parallel.moe_coarsen = coarsen``) and return its measurements; the
    run's objects are freed when it returns."""
    scenario = _instrument()
    from simtrain.hardware import load_profile
    from simtrain.models import load_model
    from simtrain.parallel import ParallelConfig

    model_name, hw_name, schedule, overrides = spec
    if model_name == "scenario":
        sc = scenario.load_scenario(DEEPSEEK)
        model, hw = load_model(sc.model), load_profile(sc.hardware)
        parallel = sc.parallel.model_copy(update={**overrides, "moe_coarsen": coarsen})
    else:
        model, hw = load_model(model_name), load_profile(hw_name)
        parallel = ParallelConfig(**overrides)
    _SPLIT.clear()
    w0, c0 = time.perf_counter(), time.process_time()
    run = scenario.run_schedule(schedule, model, hw, parallel)
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    tasks = run.result.events
    engine = _SPLIT.get("simulate", float("nan"))
    return {
        "step_time_s": run.report.step_time_s, "tasks": tasks, "simpy_events": getattr(run.result, "simpy_events", None),
        "wall_s": wall, "cpu_s": cpu, "split_cpu_s": dict(_SPLIT),
        "engine_tasks_per_cpu_s": tasks / engine if engine else None,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def run_one(case: str, coarsen: int = 1) -> dict:
    """Run one in-process case of :data:`CASES` (in this process, a fresh one, with
    ``parallel.moe_coarsen = coarsen``) and return its measurements, with the CPU seconds of
    importing simtrain's simulation path."""
    t_import = time.process_time()
    _instrument()
    import simtrain.hardware, simtrain.models, simtrain.parallel  # noqa: F401, E401

    import_s = time.process_time() - t_import
    return {"case": case, **_measure(CASES[case], coarsen), "import_cpu_s": import_s}


def fit_axis(axis: str, repeat: int) -> dict[int, dict]:
    """The best (least CPU) measurements of each size of ``FIT[axis]``, run in this process: one
    untimed warm-up run of the smallest size, then ``repeat`` rounds that run every size in turn
    (smallest first, then largest first, alternately), each run after ``gc.collect()`` (a run
    pauses the collector itself, :func:`simtrain.engine.gc_paused`)."""
    import gc

    series = FIT[axis]
    _measure(series[min(series)])
    best: dict[int, dict] = {}
    for round_ in range(repeat):
        for size in sorted(series, reverse=bool(round_ % 2)):  # every other round largest first
            gc.collect()
            run = _measure(series[size])
            if size not in best or run["cpu_s"] < best[size]["cpu_s"]:
                best[size] = run
    return best


_PYC = tempfile.TemporaryDirectory(prefix="bench-speed-pyc-")
"""The ``e2e`` runs' bytecode cache (removed at exit)."""
_WARMED: set[tuple[str, int]] = set()


def _e2e_env(case: str) -> dict[str, str]:
    """The environment of an ``e2e`` run: bytecode cached in :data:`_PYC` (see the module's
    docstring), or, for a ``-source`` case, the usual folders with ``PYTHONDONTWRITEBYTECODE=1``."""
    env = dict(os.environ)
    if case.endswith("-source"):
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env.pop("PYTHONPYCACHEPREFIX", None)  # site-packages keep pip's bytecode; the checkout has none
        return env
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = _PYC.name
    return env


def run_e2e(case: str, coarsen: int = 1) -> dict:
    """Time a whole ``simtrain compare`` process (start-up included; ``--moe-coarsen coarsen``
    when above 1), after one untimed run that fills the bytecode cache (not for ``-source``)."""
    extra = ["--moe-coarsen", str(coarsen)] if coarsen > 1 else []
    argv, env = [sys.executable, "-c", _E2E_MAIN, *E2E[case], *extra], _e2e_env(case)
    if (case, coarsen) not in _WARMED and not case.endswith("-source"):
        subprocess.run(argv, capture_output=True, cwd=ROOT, env=env, check=True)
        _WARMED.add((case, coarsen))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    w0 = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env=env)
    wall = time.perf_counter() - w0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    rows = json.loads(proc.stdout)  # it printed its rows
    rss_kib = int(proc.stderr.rsplit("peak rss kib ", 1)[1].split()[0])
    return {"case": case, "wall_s": wall, "step_time_s": rows[0]["step_time_s"],
            "cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
            "peak_rss_mib": rss_kib / 1024}


_E2E_MAIN = """import atexit, resource, sys
atexit.register(lambda: sys.stderr.write(f"\\npeak rss kib {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}\\n"))
from simtrain.cli import run
run()"""
"""The ``e2e`` child: the CLI as the ``simtrain`` console script runs it (:func:`simtrain.cli.run`),
then its own peak RSS on stderr (an ``atexit`` handler, which ``run`` runs before it ends the
process; RUSAGE_CHILDREN's is the largest of every child so far)."""


STARTUP = {
    # name: the statement a fresh process runs (its CPU time is the start-up floor of that much)
    "python": "pass",
    "numpy": "import numpy",
    "pydantic": "from pydantic import BaseModel\nclass _M(BaseModel):\n    x: int = 0",
    "typer": "import typer",
    "yaml": "import yaml",
    "simpy": "import simpy",
    "libraries": "import numpy, typer, yaml, simpy\nfrom pydantic import BaseModel\nclass _M(BaseModel):\n    x: int = 0",
    "simtrain.cli.compare": "import simtrain.cli.compare",
}


def startup_floor(repeat: int) -> dict[str, float]:
    """The least CPU seconds of ``repeat`` fresh processes running each statement of
    :data:`STARTUP` (after one untimed run that fills the ``e2e`` bytecode cache), with the
    ``e2e`` runs' environment and ``OPENBLAS_NUM_THREADS=1`` (what :func:`simtrain.cli.run` sets)."""
    env = {**_e2e_env("startup"), "OPENBLAS_NUM_THREADS": "1"}
    best: dict[str, float] = {}
    for name, statement in STARTUP.items():
        argv = [sys.executable, "-c", statement]
        subprocess.run(argv, capture_output=True, cwd=ROOT, env=env, check=True)
        for _ in range(repeat):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            subprocess.run(argv, capture_output=True, cwd=ROOT, env=env, check=True)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
            best[name] = min(best.get(name, cpu), cpu)
    return best


def torch_peer() -> dict | None:
    """CPU seconds of torch's ``_simulate_comms_compute`` on 1F1B p=16, m=128 (with its sends
    and receives added by ``_add_send_recv``), or None without torch."""
    try:
        from torch.distributed.pipelining import schedules as ts
    except ImportError:
        return None
    from simtrain.schedules import generate

    sched = generate("1f1b", 16, 128, 1)
    compute = {r: [ts._Action.from_str(str(a)) for a in order] for r, order in enumerate(sched.orders)}
    c0 = time.process_time()
    comms = ts._add_send_recv(compute, stage_to_rank=lambda s: s, num_stages=16)
    ts._simulate_comms_compute(comms, stage_to_rank=lambda s: s, num_stages=16)
    return {"case": "torch-simulate-comms-compute-1f1b-p16-m128", "cpu_s": time.process_time() - c0,
            "actions": sum(len(v) for v in comms.values())}


def _best(case: str, repeat: int, coarsen: int = 1) -> dict:
    """The run with the least CPU time of ``repeat`` runs of ``case`` (each in-process case in a
    fresh child process), with ``parallel.moe_coarsen = coarsen``."""
    runs = []
    for _ in range(repeat):
        if case in E2E:
            runs.append(run_e2e(case, coarsen))
        else:
            out = subprocess.run([sys.executable, __file__, "--one", case, "--coarsen", str(coarsen)],
                                 capture_output=True, text=True, cwd=ROOT, check=True)
            runs.append(json.loads(out.stdout))
    return min(runs, key=lambda r: r["cpu_s"])


def cost_exponent(sizes: list[float], cpu_s: list[float]) -> float:
    """Least-squares slope of log(CPU seconds) against log(size): cost grows as size**slope."""
    import numpy as np

    return float(np.polyfit(np.log(sizes), np.log(cpu_s), 1)[0])


def _fit_child(axis: str, repeat: int) -> dict[int, dict]:
    """:func:`fit_axis` of ``axis`` in a fresh child process."""
    out = subprocess.run([sys.executable, __file__, "--fit", axis, "--fit-repeat", str(repeat)],
                         capture_output=True, text=True, cwd=ROOT, check=True)
    return {int(size): run for size, run in json.loads(out.stdout).items()}


def _show_fit(axis: str, best: dict[int, dict]) -> None:
    """Print the cost exponents of one axis: the whole run's CPU, each part's, the tasks', and
    the CPU per task's."""
    sizes = sorted(best)
    runs = [best[v] for v in sizes]
    cpu, tasks = [r["cpu_s"] for r in runs], [r["tasks"] for r in runs]
    parts = " ".join(f"{name} {cost_exponent(sizes, [r['split_cpu_s'][name] for r in runs]):.3f}"
                     for name in runs[0]["split_cpu_s"])
    per_task = [c / t for c, t in zip(cpu, tasks)]
    print(f"cost exponent in {axis} (dense 1F1B, {axis} = {sizes}): {cost_exponent(sizes, cpu):.3f} "
          f"[{parts}]; tasks {cost_exponent(sizes, tasks):.3f}; CPU per task {cost_exponent(sizes, per_task):+.3f}  "
          f"(CPU s {', '.join(f'{c:.3f}' for c in cpu)}; tasks {', '.join(map(str, tasks))}; "
          f"us per task {', '.join(f'{1e6 * x:.2f}' for x in per_task)})", flush=True)


def _show(label: str, best: dict, ref: float, exact_step_s: float | None = None) -> None:
    """Print one case's line (with its step time's error against ``exact_step_s`` if given)."""
    extra = ""
    if "tasks" in best:
        split = " ".join(f"{k} {v:.3f}" for k, v in best["split_cpu_s"].items())
        rate = best["engine_tasks_per_cpu_s"]
        extra = (f"tasks {best['tasks']:7d} simpy events {best['simpy_events']}  engine "
                 f"{rate:,.0f} tasks/CPU s  [{split}]  import {best['import_cpu_s']:.2f} s")
    if exact_step_s is not None:
        extra += f"  step time {best['step_time_s'] / exact_step_s - 1:+.3%} vs exact"
    print(f"{label:30s} cpu {best['cpu_s']:7.3f} s (x{best['cpu_s'] / ref:6.2f} ref) wall {best['wall_s']:7.3f} s "
          f"rss {best['peak_rss_mib']:6.0f} MiB  {extra}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cases", default=",".join([*CASES, *E2E]))
    ap.add_argument("--no-fit", action="store_true", help="skip the cost-exponent fit")
    ap.add_argument("--coarsen", default="", help="also run the DeepSeek-V3 cases with these moe_coarsen values, e.g. 2,4")
    ap.add_argument("--fit-repeat", type=int, default=11, help="rounds of the cost-exponent fit (least CPU kept)")
    ap.add_argument("--startup", action="store_true", help="also time the start-up floor (Python, each library, simtrain's imports)")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--fit", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(run_one(args.one, int(args.coarsen or 1))))
        return
    if args.fit:
        print(json.dumps(fit_axis(args.fit, args.fit_repeat)))
        return
    ref = min(reference_workload() for _ in range(args.repeat))
    print(f"reference workload: {ref:.3f} CPU s (min of {args.repeat}); ratios below are CPU s / reference")
    coarsen = [int(k) for k in args.coarsen.split(",") if k]
    for case in [c for c in args.cases.split(",") if c]:  # (--cases "": the fit alone)
        best = _best(case, args.repeat)
        _show(case, best, ref)
        for k in coarsen if "dsv3" in case else ():
            _show(f"{case} coarsen {k}", _best(case, args.repeat, k), ref, best["step_time_s"])
    if args.startup:
        floor = startup_floor(args.repeat)
        print("start-up floor (CPU s, fresh process; ratio to the reference): " + ", ".join(
            f"{name} {cpu:.3f} (x{cpu / ref:.2f})" for name, cpu in floor.items()), flush=True)
    if not args.no_fit:
        for axis in FIT:
            _show_fit(axis, _fit_child(axis, args.fit_repeat))
    peer = torch_peer()
    if peer:
        print(f"{peer['case']:30s} cpu {peer['cpu_s']:7.3f} s (x{peer['cpu_s'] / ref:6.2f} ref), "
              f"{peer['actions']} actions with comms")


if __name__ == "__main__":
    main()
