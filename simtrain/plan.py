"""``simtrain plan``: search the parallel configurations of N GPUs for the fastest one that fits.

The space is every (tp, pp, dp, ep, vp, microbatch size, schedule, recompute, ZeRO stage) with
``tp x pp x dp = N`` (with ``--objective tokens-per-gpu``, every divisor of N: the job may leave
GPUs to another one when that runs each GPU better); the microbatches per DP replica follow from
the global batch, ``m = B / (dp x b)``. Each schedule's generator decides what it can run.

The search is best-first branch and bound (Land & Doig 1960): candidates are ordered by a lower
bound of their objective (:mod:`simtrain.plan_bounds`); the schedule-free bound is refined with the
generated schedule when a candidate comes first; a candidate whose bound is worse than the K-th
best simulated configuration is never simulated (nor is anything after it). Pruned candidates are
counted by reason (:data:`REASONS`). The survivors are simulated by a backend
(:mod:`simtrain.plan_backends`: a local process pool or Ray) with :func:`simtrain.scenario.run_schedule`
and the cost model ``simtrain compare`` would use (:attr:`PlanRequest.cost`), which also prices the
bounds' costs. Ties are broken by the configuration's key, so every backend returns the same ranking.
"""

from __future__ import annotations

import heapq
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Literal

from .checks import MAX_TASKS, check_max_tasks, check_sequence_parallel, check_work
from .cost_models import CostChoice, parse_cost_choice, recompute_modules
from .costs import StageCosts, split_layers, stage_costs
from .errors import SimtrainError
from .hardware import HardwareProfile
from .models import ModelSpec
from .network import Topology
from .parallel import ParallelConfig
from .plan_bounds import (MeanBounds, aggregate, cheap_step_bound, mean_bounds, memory_bound, schedule_shape,
                          scale_shape, shape_microbatches, step_bound)
from .plan_space import MICROBATCH_SIZES, VIRTUAL_STAGES, Config, enumerate_space
from .schedules import REGISTRY, Schedule, ScheduleError, ScheduleWarning, split_name

__all__ = ["MICROBATCH_SIZES", "VIRTUAL_STAGES", "REASONS", "Config", "PlanRequest", "PlanResult", "enumerate_space",
           "search", "summarise", "row_of", "config_of_row"]

REASONS = ("batch_divisibility", "redundant", "model_rules", "schedule_rules", "task_ceiling", "static_memory",
           "activation_memory", "step_time_bound", "simulation_error")
"""Why a configuration was not simulated, in the order tried: the global batch is not ``dp x b x m``; redundant
(ZeRO-1, 2 or 3 over one replica is ZeRO-0, interleaving on one pipeline rank runs its chunks in turn, Megatron's combined
1F1B without EP has nothing to overlap, on one pipeline rank every pipeline order is one sequence: 1F1B's stands
for them); the model cannot be split so (heads, layers, experts); the schedule's
generator refuses (pp, m, vp); its simulation is estimated above the task ceiling (``max_tasks``, as ``compare``
refuses it: :func:`simtrain.checks.check_work`); static or static + in-flight activation memory exceeds HBM (analytic bound); the
step-time lower bound cannot beat the K-th best found; the simulation failed (e.g. deadlock)."""

Objective = Literal["step-time", "tokens-per-gpu"]


@dataclass(frozen=True)
class PlanRequest:
    """What to plan.

    Attributes:
        model, hardware: what to train on what.
        gpus: GPUs available (N).
        global_batch: sequences per optimizer step (B).
        seq_len: tokens per sequence (None: the model's).
        schedules: registry names to try.
        objective: ``step-time`` (minimise seconds per step on exactly N GPUs) or
            ``tokens-per-gpu`` (maximise tokens/s per GPU on any divisor of N GPUs).
        max_tp: largest tensor-parallel degree (default: GPUs per node).
        recompute: recomputation modes to try: levels (none, selective, full) or module lists, as
            ``compare --recompute`` takes them (a module list needs the per-operator cost model).
        zero_stages: ZeRO stages to try (0 to 3; 2 and 3 shard gradients, and 3 parameters, as
            ``compare --zero-stage`` lowers them: :mod:`simtrain.lowering.zero`). A stage above 0
            over one data-parallel replica is ``redundant``; 2 and 3 with a schedule that keeps two
            copies of a chunk (DualPipe) break ``schedule_rules``.
        top: how many of the best to keep (K).
        cost: the compute cost model of the simulations and the bounds; None: compare's default, ``auto``.
        max_tasks: a configuration estimated above this many simulated tasks is pruned
            (``task_ceiling``), as ``compare --max-tasks`` refuses it.
        grad_reduce_dtype: the element type gradients are accumulated and DP-reduced in, for every
            configuration (``ParallelConfig.grad_reduce_dtype``: bf16, fp16, fp32; None: the
            gradient's own, compare's default). Megatron-LM accumulates bf16 gradients in fp32
            unless ``--grad-reduce-in-bf16`` (``megatron/training/arguments.py``).

    Raises:
        SimtrainError: ``cost`` cannot run on ``model`` / ``hardware``, or sets ``recompute`` (give
            module lists in ``recompute``); a bad module list, or one on the flat cost model;
            ``max_tasks`` is not a whole number >= 1; ``grad_reduce_dtype`` is none of those;
            ``zero_stages`` is empty or has a stage outside 0-3.
    """

    model: ModelSpec
    hardware: HardwareProfile
    gpus: int
    global_batch: int
    seq_len: int | None = None
    schedules: tuple[str, ...] = ("1f1b",)
    objective: Objective = "step-time"
    max_tp: int | None = None
    recompute: tuple[str, ...] = ("none", "selective", "full")
    zero_stages: tuple[int, ...] = (0, 1)
    top: int = 5
    cost: CostChoice | None = None
    max_tasks: int = MAX_TASKS
    grad_reduce_dtype: str | None = None

    def __post_init__(self) -> None:
        check_max_tasks(self.max_tasks, "PlanRequest.max_tasks")
        if not self.zero_stages or not set(self.zero_stages) <= {0, 1, 2, 3}:
            raise SimtrainError(f"--zero-stages = {','.join(map(str, self.zero_stages))!r}: give ZeRO stages from 0 to 3")
        if self.grad_reduce_dtype not in (None, "bf16", "fp16", "fp32"):
            raise SimtrainError(f"--grad-reduce-dtype = {self.grad_reduce_dtype!r}: choose bf16, fp16 or fp32")
        cost = self.cost or parse_cost_choice("auto", None, None, self.hardware.attention_kernel(None),
                                              self.hardware)
        if cost.recompute is not None:
            raise SimtrainError(f"--recompute = {cost.recompute!r}: the planner takes the module lists it tries in "
                                "its recompute modes, not in the cost model")
        for modules in [None, *filter(None, map(recompute_modules, self.recompute))]:
            parse_cost_choice(cost.model, modules, cost.fp8, cost.attention, self.hardware)
            replace(cost, recompute=modules).runtime(self.model, ParallelConfig(), self.hardware)  # as the workers
        object.__setattr__(self, "cost", cost)

    def cost_of(self, cfg: Config) -> CostChoice:
        """The cost model that prices ``cfg``: the request's, with ``cfg``'s recompute module list if it has one."""
        modules = recompute_modules(cfg.recompute)
        return self.cost if modules is None else replace(self.cost, recompute=modules)

    @property
    def fit_advice(self) -> str:
        """When nothing fits: allow the memory-saving settings not tried yet (not the defaults), or more GPUs."""
        stages = sorted({*self.zero_stages, 1, 2, 3})
        untried = ["--recompute full"] * ("full" not in self.recompute) + \
            [f"--zero-stages {','.join(map(str, stages))}"] * (len(stages) > len(set(self.zero_stages)))
        return (f"allow {', '.join(untried)} or " if untried else "") + "use more GPUs"

    def parallel(self, cfg: Config) -> ParallelConfig:
        """``cfg``'s :class:`ParallelConfig` with this request's sequence length and attention kernel."""
        return cfg.parallel(self.seq_len, self.cost.attention)


@dataclass
class PlanResult:
    """What the search found.

    Attributes:
        considered, evaluated: points of the space; configurations simulated.
        pruned: reason (:data:`REASONS`) -> configurations not simulated for it.
        rows: one result row per simulated configuration (see :func:`row_of`).
        errors: the first message per reason that came from an exception (for error lines).
    """

    considered: int = 0
    evaluated: int = 0
    pruned: dict[str, int] = field(default_factory=lambda: {r: 0 for r in REASONS})
    rows: list[dict] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)


def row_of(cfg: Config, report, hbm_bytes: float) -> dict:
    """A result row: the configuration, then step time (s), tokens/s, tokens/s per GPU, MFU, the
    worst rank's peak memory (bytes) and whether it fits; ``report`` is a :class:`simtrain.metrics.Report`."""
    peak = max(report.peak_memory_bytes)
    return {**asdict(cfg), "gpus": cfg.gpus, "step_time_s": report.step_time_s, "tokens_per_s": report.tokens_per_s,
            "tokens_per_s_per_gpu": report.tokens_per_s / cfg.gpus, "mfu": report.mfu,
            "peak_memory_bytes_max": peak, "fits_in_hbm": bool(report.fits_in_hbm and peak <= hbm_bytes)}


class _Caches:
    """Costs per parallel setting and schedule summaries per (name, pp, m, vp), built on demand."""

    def __init__(self, req: PlanRequest) -> None:
        self.req = req
        self.costs: dict[tuple, StageCosts | SimtrainError] = {}
        self.shapes: dict[tuple, tuple | SimtrainError] = {}
        self.chunks_per_rank: dict[tuple[str, int], tuple[int, bool]] = {}
        self.topologies: dict[tuple, Topology] = {}
        self.means: dict[tuple[int, bool, int], MeanBounds] = {}

    def schedule(self, cfg: Config) -> Schedule:
        """Generate ``cfg``'s schedule (its warnings, e.g. ZB-V padding, are the simulation's to give)."""
        info = REGISTRY[split_name(cfg.schedule)[0]]
        with warnings.catch_warnings():  # validated when simulated (Schedule.validate is as slow as generating)
            warnings.simplefilter("ignore", ScheduleWarning)
            return info.generator(cfg.pp, cfg.microbatches, cfg.vp if info.uses_vp else 1)

    def per_rank(self, name: str, vp: int) -> tuple[int, bool]:
        """Model chunks per pipeline rank of a schedule, and whether it keeps two copies of a chunk
        (DualPipe), read off a small instance of it."""
        key = (name, vp)
        if key not in self.chunks_per_rank:
            small = self.schedule(Config(1, 4, 1, 1, vp, name, 1, 16, "none", 0))
            self.chunks_per_rank[key] = (small.num_chunks // small.num_ranks,
                                         len({(small.chunk_of(s), r) for s, r in enumerate(small.stage_to_rank)})
                                         > small.num_chunks)
        return self.chunks_per_rank[key]

    def topology(self, cfg: Config) -> Topology:
        """Placement and routes of ``cfg`` (for pricing its TP collectives)."""
        key = (cfg.tp, cfg.pp, cfg.dp, cfg.ep)
        if key not in self.topologies:
            self.topologies[key] = Topology(self.req.hardware, self.req.parallel(cfg))
        return self.topologies[key]

    def _cached(self, key: tuple, model: ModelSpec, par: ParallelConfig, num_chunks: int) -> StageCosts:
        if key not in self.costs:
            try:
                self.costs[key] = stage_costs(model, par, self.req.hardware, num_chunks)
            except SimtrainError as exc:
                self.costs[key] = exc
        hit = self.costs[key]
        if isinstance(hit, SimtrainError):
            raise hit
        return hit

    def _priced(self, costs: StageCosts, cfg: Config, parallel: Callable[[], ParallelConfig], *key) -> StageCosts:
        """``costs`` priced for ``parallel()`` by ``cfg``'s cost model, once per ``costs`` and ``key``."""
        full = ("priced", id(costs), *key)  # costs live in self.costs, so their ids are stable
        if full not in self.costs:
            runtime = self.req.cost_of(cfg).runtime(self.req.model, parallel(), self.req.hardware, host_bound=False)
            self.costs[full] = costs if runtime is None else runtime(costs)
        return self.costs[full]

    def stage_costs(self, cfg: Config, num_chunks: int) -> StageCosts:
        """The exact costs of ``cfg`` cut into ``num_chunks`` chunks, as its simulation prices them."""
        key = (replace(cfg, schedule="", vp=0), num_chunks)  # the schedule only sets num_chunks
        flat = self._cached(key, self.req.model, self.req.parallel(cfg), num_chunks)
        return self._priced(flat, cfg, lambda: self.req.parallel(cfg))

    def _flat_reference(self, cfg: Config) -> StageCosts:
        """:meth:`reference` before the cost model's hook (the flat model's costs; no ``pp_buffers``: a lower bound)."""
        moe = self.req.model.moe is not None
        par = self.req.parallel(cfg).model_copy(update=dict(pp=1, vp=1, microbatches=1, pp_buffers="per-transfer"))
        layers = self.req.model.num_layers
        base = par.model_copy(update=dict(dp=par.dp if moe else 1, zero_stage=par.zero_stage if moe else 0))
        ref = self._cached(("ref", cfg.tp, cfg.ep, cfg.microbatch_size, cfg.recompute, base.dp, base.zero_stage),
                           self.req.model, base, layers)
        if moe:
            return ref
        one = self.req.model.model_copy(update=dict(num_layers=1))
        rates = self._cached(("rates", cfg.tp, cfg.dp, cfg.zero_stage), one, par.model_copy(
            update=dict(recompute="full", microbatch_size=1)), 1)
        key = ("ref+rates", id(ref), id(rates))  # both live in self.costs, so their ids are stable
        if key not in self.costs:
            self.costs[key] = replace(ref, static_bytes_per_param=rates.static_bytes_per_param,
                                      expert_static_bytes_per_param=rates.expert_static_bytes_per_param,
                                      optimizer_s_per_param=rates.optimizer_s_per_param,
                                      expert_optimizer_s_per_param=rates.expert_optimizer_s_per_param)
        return self.costs[key]

    def reference(self, cfg: Config) -> StageCosts:
        """Costs of one layer per chunk with one microbatch per step (no gradient accumulation) and
        the static rates of ``cfg``'s ZeRO stage: the sums over chunks of F, B and parameters do
        not depend on how layers are grouped (the tied-embedding copy aside, see :func:`_screen`),
        so one computation serves every pp, vp and m; with m = 1 the accumulation term is 0, so the
        work is a lower bound. Dense models: dp only sets static rates, computed on a 1-layer copy.
        Then priced by the cost model for ``cfg``'s microbatches: per-operator chunk seconds are
        sums of per-layer terms (embedding, head, W's accumulation linear in the parameters), so
        the sums are the chunks' own (tests/test_plan_bounds.py)."""
        return self._priced(self._flat_reference(cfg), cfg, lambda: self.req.parallel(cfg).model_copy(
            update=dict(pp=1, vp=1)), cfg.microbatches)

    def aggregated(self, cfg: Config, num_chunks: int) -> StageCosts:
        """:func:`simtrain.plan_bounds.aggregate` of :meth:`reference` (dense models)."""
        ref = self.reference(cfg)
        key = ("aggregated", id(ref), num_chunks)
        if key not in self.costs:
            self.costs[key] = aggregate(ref, num_chunks)
        return self.costs[key]

    def shape(self, cfg: Config) -> tuple:
        """The bounds' summary of ``cfg``'s schedule, read off a capped one
        (:func:`shape_microbatches`) and scaled to ``cfg.microbatches``."""
        capped = replace(cfg, microbatches=shape_microbatches(cfg.microbatches, cfg.pp, cfg.paired))
        key = (cfg.schedule, cfg.pp, capped.microbatches, cfg.vp)
        if key not in self.shapes:
            try:
                try:
                    schedule = self.schedule(capped)
                except ScheduleError:  # the schedule's rules are judged on the real microbatches
                    schedule = self.schedule(cfg)
                    key = (cfg.schedule, cfg.pp, cfg.microbatches, cfg.vp)
                self.shapes[key] = (schedule_shape(schedule), schedule.num_microbatches)
            except ScheduleError as exc:
                self.shapes[key] = exc
        hit = self.shapes[key]
        if isinstance(hit, SimtrainError):
            raise hit
        shapes, m = hit
        return scale_shape(shapes, cfg.microbatches / m)


def _score(req: PlanRequest, step_s: float, gpus: int) -> float:
    """What the search minimises: seconds per step, or minus tokens/s per GPU."""
    tokens = req.global_batch * (req.seq_len or req.model.seq_len)  # B x s
    return step_s if req.objective == "step-time" else -tokens / (max(step_s, 1e-30) * gpus)


def _screen(req: PlanRequest, caches: _Caches, cfg: Config) -> tuple[str | None, float, str]:
    """The schedule-free checks: ``(reason or None, score bound, message)``."""
    try:
        per_rank, copies = caches.per_rank(cfg.schedule, cfg.vp)
    except ScheduleError as exc:
        return "schedule_rules", 0.0, str(exc)
    num_chunks = cfg.pp * per_rank
    if copies and cfg.zero_stage >= 2:  # as the lowering refuses it (simtrain.lowering.zero.check_zero)
        return "schedule_rules", 0.0, (f"ZeRO-{cfg.zero_stage} with {cfg.schedule}: the schedule keeps two copies "
                                       "of each model chunk, which ZeRO-2/3 cannot shard per microbatch")
    try:
        if num_chunks > req.model.num_layers:
            split_layers(req.model.num_layers, num_chunks)  # raises the model's own message
        check_sequence_parallel(req.model, req.parallel(cfg))
    except SimtrainError as exc:
        return "model_rules", 0.0, str(exc)
    try:
        check_work([cfg.schedule], req.model, req.parallel(cfg), req.max_tasks)
    except SimtrainError as exc:
        return "task_ceiling", 0.0, str(exc)
    try:
        costs = caches.reference(cfg) if num_chunks > 1 else caches.stage_costs(cfg, 1)
    except SimtrainError as exc:
        return "model_rules", 0.0, str(exc)
    key = (id(costs), cfg.paired, cfg.tp)
    if key not in caches.means:
        caches.means[key] = mean_bounds(costs, caches.topology(cfg), cfg.paired)
    means = caches.means[key]
    if means.static_bytes / cfg.pp > req.hardware.hbm_bytes:
        return "static_memory", 0.0, ""
    if num_chunks == 1:  # one chunk: costs are exact, not per layer
        return None, _score(req, cheap_step_bound(replace(means, layers=1), cfg.microbatches, 1, copies),
                            cfg.gpus), ""
    return None, _score(req, cheap_step_bound(means, cfg.microbatches, cfg.pp, copies, num_chunks), cfg.gpus), ""


def _refine(req: PlanRequest, caches: _Caches, cfg: Config) -> tuple[str | None, float, str]:
    """The schedule's own bounds: ``(reason or None, score bound, message)``."""
    try:
        shapes = caches.shape(cfg)
        num_chunks = max(c for sh in shapes for c in sh.chunks) + 1
        if req.model.moe is None and num_chunks > 1:  # sums of the per-layer costs (a lower bound)
            costs = caches.aggregated(cfg, num_chunks)
        else:
            costs = caches.stage_costs(cfg, num_chunks)
    except ScheduleError as exc:
        return "schedule_rules", 0.0, str(exc)
    except SimtrainError as exc:
        return "model_rules", 0.0, str(exc)
    if memory_bound(shapes, costs) > req.hardware.hbm_bytes:
        return "activation_memory", 0.0, ""
    return None, _score(req, step_bound(shapes, costs, caches.topology(cfg)), cfg.gpus), ""


def search(req: PlanRequest, backend, progress: Callable[[int, int], None] | None = None) -> PlanResult:
    """Branch and bound over the space of ``req``, simulating survivors on ``backend``.

    Args:
        req: the request.
        backend: a :class:`simtrain.plan_backends.Backend` (``submit``, ``next_result``, ``workers``).
        progress: called with ``(done, total)`` as candidates are settled.

    Returns:
        The :class:`PlanResult` (rows unsorted).
    """
    res, caches = PlanResult(), _Caches(req)
    heap: list[tuple[float, Config, bool]] = []
    for cfg, reason in enumerate_space(req):
        res.considered += 1
        msg = ""
        if reason is None:
            reason, bound, msg = _screen(req, caches, cfg)
        if reason is not None:
            res.pruned[reason] += 1
            res.errors.setdefault(reason, msg)
            continue
        heap.append((bound, cfg, False))
    heapq.heapify(heap)
    total, done = len(heap), 0
    ranked: list[tuple[float, Config]] = []  # fitting simulated configurations, best first
    in_flight = 0

    def incumbent() -> tuple[float, Config] | None:
        return ranked[req.top - 1] if len(ranked) >= req.top else None

    while heap or in_flight:
        while heap and in_flight < backend.workers:
            bound, cfg, refined = heap[0]
            cut = incumbent()
            if cut is not None and (bound, cfg) > cut:
                res.pruned["step_time_bound"] += len(heap)
                done += len(heap)
                heap.clear()
                break
            heapq.heappop(heap)
            if not refined:
                reason, new_bound, msg = _refine(req, caches, cfg)
                if reason is not None:
                    res.pruned[reason] += 1
                    res.errors.setdefault(reason, msg)
                    done += 1
                else:
                    heapq.heappush(heap, (max(bound, new_bound), cfg, True))
                continue
            backend.submit(cfg, req.cost_of(cfg))
            in_flight += 1
        if progress is not None:
            progress(done, total)
        if in_flight:
            cfg, row, error = backend.next_result()
            in_flight -= 1
            done += 1
            if error is not None:
                res.pruned["simulation_error"] += 1
                res.errors.setdefault("simulation_error", error)
                continue
            res.evaluated += 1
            res.rows.append(row)
            if row["fits_in_hbm"]:
                ranked.append((_score(req, row["step_time_s"], cfg.gpus), cfg))
                ranked.sort()
    if progress is not None:
        progress(done, total)
    return res


def summarise(req: PlanRequest, res: PlanResult) -> dict:
    """The ``--json`` object: ``evaluated``, ``pruned`` (reason -> count), ``best``, ``top`` (the K
    best that fit) and ``pareto`` (fitting rows not beaten in both step time and peak memory, by
    step time), plus ``considered`` and ``cost_model`` (``flat`` or ``ops``, ``auto`` resolved).

    Raises:
        SimtrainError: nothing could be simulated or nothing simulated fits (naming the reason).
    """
    if not res.rows:
        _raise_nothing(req, res)
    fitting = [r for r in res.rows if r["fits_in_hbm"]]
    if not fitting:
        raise SimtrainError(f"--gpus {req.gpus}: no simulated configuration fits in {req.hardware.name}'s HBM "
                            f"({res.evaluated} simulated); {req.fit_advice}")
    key = (lambda r: (_score(req, r["step_time_s"], r["gpus"]), config_of_row(r)))
    fitting.sort(key=key)
    pareto, best_mem = [], float("inf")
    for r in sorted(fitting, key=lambda r: (r["step_time_s"], r["peak_memory_bytes_max"], config_of_row(r))):
        if r["peak_memory_bytes_max"] < best_mem:
            pareto.append(r)
            best_mem = r["peak_memory_bytes_max"]
    return {"considered": res.considered, "evaluated": res.evaluated, "pruned": dict(res.pruned),
            "cost_model": req.cost.model, "best": fitting[0], "top": fitting[:req.top], "pareto": pareto}


def config_of_row(row: dict) -> Config:
    """The :class:`Config` of a result row."""
    return Config(**{k: row[k] for k in Config.__dataclass_fields__})


def _raise_nothing(req: PlanRequest, res: PlanResult) -> None:
    """Explain why no configuration was simulated, naming the flag of the main cause.

    Raises:
        SimtrainError: always.
    """
    p = res.pruned
    rules = p["model_rules"] + p["schedule_rules"]
    first = res.errors.get("model_rules") or res.errors.get("schedule_rules") or res.errors.get("simulation_error", "")
    if p["task_ceiling"] and not p["static_memory"] + p["activation_memory"] + rules:
        if req.model.num_layers > req.max_tasks:  # checks.check_work: the per-layer costs alone
            raise SimtrainError(f"--max-tasks {req.max_tasks:,}: the model's {req.model.num_layers:,} layers are "
                                "above it (every simulation builds each layer's costs), whatever the batch; "
                                "raise --max-tasks")
        raise SimtrainError(f"--global-batch {req.global_batch}: every configuration that can run is estimated above "
                            f"the ceiling of {req.max_tasks:,} simulated tasks ({p['task_ceiling']:,} pruned; "
                            "the microbatches grow with the batch); lower --global-batch, or raise --max-tasks")
    if p["static_memory"] + p["activation_memory"]:
        raise SimtrainError(f"--gpus {req.gpus}: no configuration fits in {req.hardware.name}'s HBM "
                            f"(analytic memory bound); {req.fit_advice}")
    if p["batch_divisibility"] > rules:
        raise SimtrainError(
            f"--global-batch {req.global_batch}: not a multiple of dp x microbatch size for any split of --gpus "
            f"{req.gpus} that the model allows (microbatch sizes {list(MICROBATCH_SIZES)})"
            + (f"; the other splits fail: {first}" if first else ""))
    raise SimtrainError(f"--gpus {req.gpus}: cannot be split into a valid tp x pp x dp configuration of "
                        f"{req.model.name} with schedules {list(req.schedules)}; first reason: {first}")
