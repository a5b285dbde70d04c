"""Real pipeline-parallel training steps with ``torch.distributed.pipelining``, measured on every
rank: used by ``validate`` (the validation model, :func:`run_rank`) and by ``calibrate`` (its
calibration model, :func:`pipeline_benchmark`).

Per schedule the ranks measure the step time (from a barrier until the slowest rank has finished
``schedule.step()``, the optimizer step and ``zero_grad``), the activation peak per rank (on CPU
the bytes of distinct tensor storages autograd holds for the backward, counted by saved-tensor
hooks, parameters excluded; on GPU ``torch.cuda.max_memory_allocated`` minus what was allocated
before the step), torch's own action order (``pipeline_order`` of multi-stage schedules, or the
order single-stage ones actually ran, recorded by wrapping the stage's forward/backward calls),
the speed probe before each step, and each action's and optimizer step's time.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict

from ..schedules.ir import parse_action
from .launch import Progress, RankContext
from .measurements import PipelineMeasurements, PipelineRun, ValidationResult
from .timing import ComputeClock, timed_step
from .workload import (
    TORCH_SCHEDULES,
    ValidationModel,
    attention_cases,
    build_stage_module,
    calibration_models,
    default_model,
    elementwise_cases,
    linear_cases,
    stage_placement,
)

class SavedTensorMeter:
    """Peak bytes of distinct storages autograd saves for the backward (saved-tensor hooks).

    Parameters (and views of them) are not counted. A storage counts from the first time a
    saved tensor refers to it until the last such reference is released by autograd.
    """

    def __init__(self, parameters):
        self.skip = {p.untyped_storage().data_ptr() for p in parameters}
        self.live: dict[int, list[int]] = {}
        self.current = 0
        self.peak = 0

    def pack(self, tensor):
        storage = tensor.untyped_storage()
        key = storage.data_ptr()
        if key in self.skip or storage.nbytes() == 0:
            return tensor
        entry = self.live.get(key)
        if entry is None:
            self.live[key] = [1, storage.nbytes()]
            self.current += storage.nbytes()
            self.peak = max(self.peak, self.current)
        else:
            entry[0] += 1
        # a detached alias: holding a saved *output* with its grad_fn would make a reference
        # cycle through the autograd node that keeps it alive after a split (I/W) backward
        return _Held(tensor.detach(), key, self)

    @staticmethod
    def unpack(held):
        return held.tensor if isinstance(held, _Held) else held

    def release(self, key: int) -> None:
        entry = self.live[key]
        entry[0] -= 1
        if entry[0] == 0:
            self.current -= entry[1]
            del self.live[key]


class _Held:
    """A saved tensor whose release (when autograd drops it) the meter is told about."""

    __slots__ = ("tensor", "key", "meter")

    def __init__(self, tensor, key, meter):
        self.tensor, self.key, self.meter = tensor, key, meter

    def __del__(self):
        self.meter.release(self.key)


def probe_cases(torch, cfg: ValidationModel, device, dtype):
    """The speed probe: one transformer layer's kernels at the model's shapes.

    Its linear-layer GEMMs (F, I, W), attention forward and backward and elementwise kernels,
    built by the calibration's own case builders. Returns ``(keys, callables)`` grouped as ``linear``, ``attention``,
    ``elementwise``.
    """
    tokens = cfg.microbatch_size * cfg.seq_len
    lin = linear_cases(torch, device, dtype, [cfg.hidden], [tokens], [])
    att = attention_cases(torch, device, dtype, [(cfg.seq_len, cfg.hidden // cfg.heads, cfg.heads)], tokens)
    ew = elementwise_cases(torch, device, dtype, [cfg.hidden], [tokens], [])
    keys = dict(linear=lin[0], attention=att[0], elementwise=ew[0])
    return keys, lin[1] + att[1] + ew[1]


class Recorder:
    """Wraps a stage's forward/backward calls to record the actions it runs: ``(action text, wall
    start, wall end, thread CPU seconds, compute-clock pending duration)`` (:class:`ComputeClock`)."""

    def __init__(self, clock: ComputeClock | None = None):
        self.clock = clock
        self.events: list[tuple] = []

    def wrap(self, stage) -> None:
        def wrapped(method, kind_of: Callable[..., str]):
            def call(chunk, *args, **kwargs):
                mark = self.clock.start() if self.clock else None
                c0, t0 = time.thread_time(), time.perf_counter()
                out = method(chunk, *args, **kwargs)
                t1, c1 = time.perf_counter(), time.thread_time()
                pending = self.clock.stop(mark) if self.clock else None
                self.events.append((f"{stage.stage_index}{kind_of(kwargs)}{chunk}", t0, t1, c1 - c0, pending))
                return out
            return call

        stage.forward_one_chunk = wrapped(stage.forward_one_chunk, lambda kw: "F")
        stage.backward_one_chunk = wrapped(
            stage.backward_one_chunk, lambda kw: "B" if kw.get("full_backward", True) else "I")
        stage.backward_weight_one_chunk = wrapped(stage.backward_weight_one_chunk, lambda kw: "W")


def _schedule_orders(sched, name: str, world: int, recorded: list[list[str]]) -> list[list[str]]:
    """torch's per-rank compute orders as action text (``pipeline_order`` or the recorded runs)."""
    per_rank = TORCH_SCHEDULES[name][1]
    if per_rank == 1:
        return recorded  # Schedule1F1B.pipeline_order is wrong for ranks > 0 in torch 2.13
    orders = []
    for rank in range(world):
        orders.append([str(a) for a in sched.pipeline_order[rank] if a is not None and a.is_compute_op])
    return orders


class _TorchRun:
    """One torch schedule on this rank: its stages, optimizer, recorder, and one training step."""

    def __init__(self, torch, ctx: RankContext, name: str, cfg: ValidationModel, clock: ComputeClock):
        import torch.nn.functional as F
        from torch.distributed.pipelining import PipelineStage
        from torch.distributed.pipelining import schedules as torch_schedules

        cls_name, per_rank = TORCH_SCHEDULES[name]
        self.torch, self.ctx, self.name, self.cfg, self.clock = torch, ctx, name, cfg, clock
        self.placement = stage_placement(name, ctx.world)
        n_stages = len(self.placement)
        mine = [s for s in range(n_stages) if self.placement[s] == ctx.rank]
        self.modules = [build_stage_module(torch, cfg, s, n_stages, ctx.device, torch.float32) for s in mine]
        stages = [PipelineStage(mod, s, n_stages, ctx.device) for mod, s in zip(self.modules, mine)]
        self.recorder = Recorder(clock)
        for st in stages:
            self.recorder.wrap(st)

        def loss_fn(logits, tgt):
            return F.cross_entropy(logits.flatten(0, 1), tgt.flatten())

        cls = getattr(torch_schedules, cls_name)
        self.sched = cls(stages[0] if per_rank == 1 else stages, cfg.microbatches, loss_fn=loss_fn)
        self.params = [p for mod in self.modules for p in mod.parameters()]
        self.opt = torch.optim.Adam(self.params, lr=1e-4)
        g = torch.Generator().manual_seed(0)
        shape = (cfg.microbatch_size * cfg.microbatches, cfg.seq_len)
        tokens = torch.randint(0, cfg.vocab, shape, generator=g).to(ctx.device)
        target = torch.randint(0, cfg.vocab, shape, generator=g).to(ctx.device)
        self.args = (tokens,) if 0 in mine else ()
        self.kwargs = dict(target=target) if n_stages - 1 in mine else {}
        self.times: list[float] = []
        self.probes: list[float] = []
        self.busy: list[tuple[float, float]] = []  # per step: (wall, thread CPU) seconds in actions
        self.optimizer: list = []  # per step: the optimizer step's pending compute-clock duration
        self.actions: dict[str, list] = {}  # per stage and kind: pending compute-clock durations

    def train_step(self) -> None:
        """``schedule.step()``, the optimizer step (timed with the compute clock) and ``zero_grad``."""
        self.sched.step(*self.args, **self.kwargs)
        mark = self.clock.start()
        self.opt.step()
        self.optimizer.append(self.clock.stop(mark))
        self.opt.zero_grad(set_to_none=self.ctx.device.type != "cuda")

    def measured_step(self) -> float:
        """One timed step (:func:`simtrain.calibration.timing.timed_step`), recording its actions."""
        self.recorder.events.clear()
        self.times.append(timed_step(self.ctx, self.train_step))
        events = self.recorder.events
        self.busy.append((sum(e[2] - e[1] for e in events), sum(e[3] for e in events)))
        for e in events:
            act = parse_action(e[0])
            self.actions.setdefault(f"{act.stage}{act.kind}", []).append(e[4])
        return self.times[-1]

    def activation_peak(self) -> float:
        """Activation bytes this rank holds at its peak during one (untimed) step."""
        torch = self.torch
        dev = self.ctx.device
        if dev.type == "cuda":
            torch.cuda.synchronize()
            before = torch.cuda.memory_allocated(dev)
            torch.cuda.reset_peak_memory_stats(dev)
            self.train_step()
            torch.cuda.synchronize()
            return float(torch.cuda.max_memory_allocated(dev) - before)
        from torch.autograd.graph import saved_tensors_hooks

        meter = SavedTensorMeter(self.params)
        with saved_tensors_hooks(meter.pack, meter.unpack):
            self.train_step()
        return float(meter.peak)


def measure_schedules(ctx: RankContext, cases: dict[str, tuple[str, ValidationModel]], probe_model: ValidationModel,
                      steps: int, warmup: int, progress: Progress, memory: bool) -> PipelineMeasurements:
    """Train each case (a torch schedule and a model) for a few steps on this rank; measure them.

    Used by ``validate`` (the validation model) and by ``calibrate`` (its calibration model). The
    cases are stepped round-robin (after ``warmup`` steps each, ``steps`` rounds of one step of
    every case), each step preceded by the speed probe (:func:`probe_cases` at ``probe_model``'s
    shapes; the last step also followed by one), so that a machine whose speed drifts affects all
    cases alike and each step's speed is known.

    Args:
        cases: label -> (schedule name, model).
        memory: also measure each rank's activation peak (one extra, untimed step per case).

    Returns:
        label -> ``{schedule, model, step_times_s, probe_s, preemption, orders, recorded,
        stage_to_rank, action_s, action_compute_s, optimizer_compute_s, params,
        activation_peak_bytes}``: step times (seconds from a common start until the slowest
        rank is done), the probe's seconds before each step (median over ranks), per step the
        ranks' wall / thread CPU time in actions, torch's orders and what the ranks ran, the
        placement, per stage and kind the median wall and compute-clock seconds of an action
        (:class:`ComputeClock`), per rank the median compute-clock seconds of the optimizer step
        and its parameter count, and per rank the activation peak (0 unless ``memory``).
    """
    import torch

    dev = ctx.device
    clock = ComputeClock(torch, dev, ctx.threads)
    probe_keys, probe_fns = probe_cases(torch, probe_model, dev, torch.float32)

    def probe() -> float:
        ctx.barrier()
        total = 0.0
        for fn in probe_fns:
            mark = clock.start()
            fn()
            total += clock.seconds(clock.stop(mark))
        return total

    for fn in probe_fns:  # warm-up
        fn()
    total = len(cases) * (warmup + steps)
    runs = []
    for label, (name, cfg) in cases.items():
        run = _TorchRun(torch, ctx, name, cfg, clock)
        for w in range(warmup):
            run.train_step()
            progress(f"warm-up {label}|{len(runs) * warmup + w + 1}|{total}")
        run.optimizer.clear()
        runs.append((label, run))
    for step in range(steps):
        for i, (label, run) in enumerate(runs):
            progress(f"step {step + 1}/{steps}: {label}|{len(cases) * (warmup + step) + i + 1}|{total}")
            run.probes.append(probe())
            run.measured_step()
    for _, run in runs:  # the probe after each case's last step
        run.probes.append(probe())

    out = {label: _gathered(ctx, run, clock, memory) for label, run in runs}
    return PipelineMeasurements(runs=out, probe_keys={k: [list(x) for x in v] for k, v in probe_keys.items()},
                probe_model=asdict(probe_model),
                cpu_time_profile=clock.cpu_time)


def _gathered(ctx: RankContext, run: _TorchRun, clock: ComputeClock, memory: bool) -> PipelineRun:
    """One case's measurements, gathered from every rank (see :func:`measure_schedules`)."""
    import torch.distributed as dist

    executed = [e[0] for e in run.recorder.events]  # the last measured step
    wall: dict[str, list[float]] = {}
    for text, t0, t1, *_ in run.recorder.events:
        act = parse_action(text)
        wall.setdefault(f"{act.stage}{act.kind}", []).append(t1 - t0)
    mine = dict(
        executed=executed, probes=run.probes, busy=run.busy,
        wall={k: statistics.median(v) for k, v in wall.items()},
        compute={k: statistics.median(clock.seconds(p) for p in v) for k, v in run.actions.items()},
        optimizer=statistics.median(clock.seconds(p) for p in run.optimizer),
        params=sum(p.numel() for p in run.params),
        peak=0.0,
    )
    if memory:
        ctx.barrier()
        mine["peak"] = run.activation_peak()
        ctx.barrier()
    gathered: list = [mine]
    if ctx.world > 1:
        gathered = [None] * ctx.world
        dist.all_gather_object(gathered, mine)
    recorded = [r["executed"] for r in gathered]
    return PipelineRun(
        schedule=run.name, model=asdict(run.cfg),
        step_times_s=run.times,
        activation_peak_bytes=[r["peak"] for r in gathered],
        orders=_schedule_orders(run.sched, run.name, ctx.world, recorded), recorded=recorded,
        stage_to_rank=run.placement,
        action_s={k: v for r in gathered for k, v in r["wall"].items()},
        action_compute_s={k: v for r in gathered for k, v in r["compute"].items()},
        optimizer_compute_s=[r["optimizer"] for r in gathered],
        params=[r["params"] for r in gathered],
        probe_s=[statistics.median(step) for step in zip(*(r["probes"] for r in gathered))],
        # per step, wall / thread CPU time of all ranks' actions: how much other processes
        # delayed the compute (1 when the ranks had their cores to themselves)
        preemption=[sum(b[0] for b in step) / sum(b[1] for b in step)
                    for step in zip(*(r["busy"] for r in gathered))],
    )


def run_rank(ctx: RankContext, spec: dict, progress: Progress) -> ValidationResult:
    """The ``validate`` job on one rank: every requested schedule on the validation model,
    measured by :func:`measure_schedules`; rank 0 returns all.

    Args:
        spec: ``device``, ``schedules`` (names), ``model`` (:class:`ValidationModel` fields),
            ``steps``, ``warmup``.

    Returns:
        ``{"schedules": {name: {...}}, "world", "model", "probe_keys", "cpu_time_profile"}`` with
        :func:`measure_schedules`' measurements per schedule.
    """
    cfg = ValidationModel(**spec["model"])
    cases = {name: (name, cfg) for name in spec["schedules"]}
    measured = measure_schedules(ctx, cases, cfg, spec["steps"], spec["warmup"], progress, memory=True)
    total = len(cases) * (spec["warmup"] + spec["steps"])
    progress(f"done|{total}|{total}")
    return ValidationResult(schedules=measured["runs"], world=ctx.world, model=spec["model"],
                cpu_time_profile=measured["cpu_time_profile"], probe_keys=measured["probe_keys"])


def pipeline_benchmark(ctx: RankContext, spec: dict, progress: Progress) -> PipelineMeasurements:
    """Real training steps (torch pipeline schedule, Adam) of the calibration model
    (:func:`calibration_models`), measured by :func:`measure_schedules`:
    step times, every action's time in the compute clock, the optimizer step, and the speed probe
    before each step (at the validation model's shapes: validation compares its own probes with
    these).

    :mod:`.fit` takes per-pass in-situ factors from the actions (``layer_slowdown``), the optimizer
    rate from the optimizer steps, and the per-action and per-message overheads with which simtrain's
    simulation of the same orders reproduces the step times.
    """
    cases = calibration_models(spec, ctx.device.type, ctx.world)
    probe_model = default_model(ctx.world, ctx.device.type, quick=False)
    tagged = lambda line: progress(f"pipeline steps: {line}")  # noqa: E731
    return measure_schedules(ctx, cases, probe_model, spec["pipeline_steps"], 2, tagged, memory=False)
