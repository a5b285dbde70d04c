"""Validate simtrain against real pipeline-parallel training with ``torch.distributed.pipelining``.

A small GPT-style transformer (:class:`ValidationModel`, described to simtrain as a
:class:`~simtrain.models.ModelSpec` so the cost model predicts exactly it) is cut into pipeline
stages with :func:`simtrain.costs.split_layers` and trained for a few steps with each of torch's
schedules (:data:`TORCH_SCHEDULES`). Per schedule the ranks measure:

* **step time**: from a barrier until the slowest rank has finished ``schedule.step()``, the
  optimizer step and ``zero_grad`` (median over steps after warm-up);
* **activation peak** per rank: on CPU, the bytes of distinct tensor storages autograd holds for
  the backward, counted by saved-tensor hooks (parameters excluded) during one extra step; on
  GPU, ``torch.cuda.max_memory_allocated`` minus what was allocated before the step;
* **torch's own action order**: ``pipeline_order`` of multi-stage schedules (with their
  overlapped F&B actions), or, for single-stage ones, the order the stages actually ran
  (recorded by wrapping the stage's forward/backward calls); both are checked against the
  recorded execution;
* the speed probe before each step, and each action's and optimizer step's time.

``calibrate`` runs the same measurement (:func:`measure_schedules`) on its own calibration model
(one layer per stage) to learn what stages cost inside real steps; it never sees these runs.

The parent process then imports each order into simtrain's IR, simulates it with the profile and
compares (:func:`compare`). The costs get two adjustments that describe torch's runtime rather
than the schedule (:func:`torch_runtime_costs`): the first stage's I is empty and its W runs the
whole backward, and an I keeps the autograd graph (every stored activation but the loss's) until
its W.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

from ..costs import StageCosts, split_layers
from ..errors import SimtrainError
from ..hardware import HardwareProfile
from ..models import ModelSpec
from ..parallel import ParallelConfig
from ..schedules.ir import Schedule, parse_action
from .launch import Progress, RankContext

TORCH_SCHEDULES: dict[str, tuple[str, int]] = {
    "gpipe": ("ScheduleGPipe", 1),
    "1f1b": ("Schedule1F1B", 1),
    "interleaved1f1b": ("ScheduleInterleaved1F1B", 2),
    "loopedbfs": ("ScheduleLoopedBFS", 2),
    "interleavedzerobubble": ("ScheduleInterleavedZeroBubble", 2),
    "zbvzerobubble": ("ScheduleZBVZeroBubble", 2),
    "dualpipev": ("ScheduleDualPipeV", 2),
}
"""Schedule name (torch's class name without ``Schedule``, lower case) -> (class, stages per rank)."""

V_SHAPED = ("zbvzerobubble", "dualpipev")


@dataclass(frozen=True)
class ValidationModel:
    """The transformer trained by ``simtrain validate`` (pre-norm GPT block, GeLU MLP, no biases).

    Attributes:
        layers, hidden, heads, ffn, vocab, seq_len: its shape.
        microbatch_size: sequences per microbatch (b).
        microbatches: microbatches per step (m).
    """

    layers: int = 8
    hidden: int = 256
    heads: int = 4
    ffn: int = 1024
    vocab: int = 2048
    seq_len: int = 128
    microbatch_size: int = 2
    microbatches: int = 4

    def spec(self) -> ModelSpec:
        """The same model as a simtrain :class:`ModelSpec`."""
        return ModelSpec(
            name=f"validation transformer ({self.layers} x h{self.hidden})",
            description="the model simtrain validate trains with torch",
            source="simtrain.calibration.validate.ValidationModel",
            num_layers=self.layers, hidden_size=self.hidden, ffn_hidden_size=self.ffn, num_heads=self.heads,
            vocab_size=self.vocab, seq_len=self.seq_len, activation="gelu", norm="layernorm", bias=False,
        )

    def parallel(self, world: int, stages_per_rank: int) -> ParallelConfig:
        """The simtrain parallel configuration of a run on ``world`` ranks (fp32, no recomputation
        of anything but attention scores, which torch's fused attention never stores)."""
        return ParallelConfig(
            pp=world, vp=stages_per_rank, microbatches=self.microbatches, microbatch_size=self.microbatch_size,
            seq_len=self.seq_len, dtype="fp32", recompute="selective", sequence_parallel=False,
        )


def default_model(world: int, device: str, quick: bool) -> ValidationModel:
    """The validation model for ``world`` ranks: 4 layers per rank, 2 microbatches per rank."""
    base = ValidationModel(layers=4 * world, microbatches=2 * world)
    if device == "cuda":
        base = replace(base, hidden=2048, heads=16, ffn=8192, vocab=32000, seq_len=2048, microbatch_size=1)
    return base


# ----------------------------------------------------------------------------- torch model
def _build_stage_module(torch, cfg: ValidationModel, stage: int, num_stages: int, device, dtype):
    """The ``nn.Module`` of one pipeline stage: its layers (split as simtrain splits them), plus
    the embedding on the first stage and the final norm and LM head on the last."""
    from torch import nn

    from .microbench import transformer_layer

    class Stage(nn.Module):
        def __init__(self, n_layers: int, first: bool, last: bool):
            super().__init__()
            h = cfg.hidden
            self.embed = nn.Embedding(cfg.vocab, h) if first else None
            self.blocks = nn.ModuleList(transformer_layer(torch, h, cfg.heads, cfg.ffn) for _ in range(n_layers))
            self.norm = nn.LayerNorm(h) if last else None
            self.head = nn.Linear(h, cfg.vocab, bias=False) if last else None

        def forward(self, x):
            if self.embed is not None:
                x = self.embed(x)
            for block in self.blocks:
                x = block(x)
            if self.head is not None:
                x = self.head(self.norm(x))
            return x

    counts = split_layers(cfg.layers, num_stages)
    torch.manual_seed(1234 + stage)
    return Stage(counts[stage], stage == 0, stage == num_stages - 1).to(device=device, dtype=dtype)


def stage_placement(name: str, world: int) -> list[int]:
    """``stage_to_rank`` torch uses: linear, looped (``s % world``) or V-shaped."""
    per_rank = TORCH_SCHEDULES[name][1]
    n = world * per_rank
    if per_rank == 1:
        return list(range(n))
    if name in V_SHAPED:
        return [s if s < world else n - 1 - s for s in range(n)]
    return [s % world for s in range(n)]


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
    built by the calibration's own case builders, so the profile predicts the probe's time
    (:func:`probe_seconds`). Returns ``(keys, callables)`` grouped as ``linear``, ``attention``,
    ``elementwise``.
    """
    from .microbench import attention_cases, elementwise_cases, linear_cases

    tokens = cfg.microbatch_size * cfg.seq_len
    lin = linear_cases(torch, device, dtype, [cfg.hidden], [tokens], [])
    att = attention_cases(torch, device, dtype, [(cfg.seq_len, cfg.hidden // cfg.heads, cfg.heads)], tokens)
    ew = elementwise_cases(torch, device, dtype, [cfg.hidden], [tokens], [])
    keys = dict(linear=lin[0], attention=att[0], elementwise=ew[0])
    return keys, lin[1] + att[1] + ew[1]


def probe_seconds(keys: dict, hardware: HardwareProfile, dtype: str = "fp32") -> float:
    """Seconds the profile predicts for the probe of :func:`probe_cases`."""
    total = 0.0
    for t, k, n, kind in keys["linear"]:
        total += 2 * t * k * n / hardware.linear_flops_per_s(t, k, n, kind, dtype)
    for s, d, a, b, kind in keys["attention"]:
        flops = 4 * b * a * s * s * d
        if kind == "B":
            total += 2 * flops / hardware.attention_flops_per_s(s, d, dtype, backward=True)
        else:
            total += flops / hardware.attention_flops_per_s(s, d, dtype, backward=False)
    rates = hardware.elementwise_bytes_per_s
    total += sum(nbytes / rates[cls] for cls, *_, nbytes in keys["elementwise"] if cls in rates)
    return total


def at_speed(hardware: HardwareProfile, factor: float) -> HardwareProfile:
    """``hardware`` with every compute time (kernels, memory, per-action overhead) x ``factor``.

    Links are unchanged. ``factor`` > 1 means the machine currently runs slower than when it was
    calibrated.
    """
    return replace(
        hardware,
        peak_flops={k: v / factor for k, v in hardware.peak_flops.items()},
        linear_rates={k: tuple((*r[:3], r[3] / factor) for r in v) for k, v in hardware.linear_rates.items()},
        attention_rates={
            k: tuple((*r[:2], r[2] / factor, r[3] / factor) for r in v) for k, v in hardware.attention_rates.items()
        },
        elementwise_bytes_per_s={k: v / factor for k, v in hardware.elementwise_bytes_per_s.items()},
        hbm_bandwidth_bytes_per_s=hardware.hbm_bandwidth_bytes_per_s / factor,
        optimizer_bytes_per_s=hardware.optimizer_bytes_per_s / factor if hardware.optimizer_bytes_per_s else None,
        action_overhead_s=hardware.action_overhead_s * factor,
    )


class ComputeClock:
    """The clock calibration times compute with, on one rank.

    Thread CPU time on a CPU rank with one torch thread (other processes sharing the cores cannot
    inflate it; validation measures that slowdown separately), wall time on a CPU rank with more
    threads, and CUDA events on a GPU (the GPU time of the work queued between ``start`` and
    ``stop``, without synchronising in between).
    """

    def __init__(self, torch, device, threads: int):
        self.torch = torch
        self.cuda = device.type == "cuda"
        self.cpu_time = not self.cuda and threads == 1

    def start(self):
        """A mark before some work: pass it to :meth:`stop`."""
        if self.cuda:
            event = self.torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.thread_time() if self.cpu_time else time.perf_counter()

    def stop(self, mark):
        """A pending duration since ``mark``: :meth:`seconds` resolves it."""
        if self.cuda:
            event = self.torch.cuda.Event(enable_timing=True)
            event.record()
            return (mark, event)
        return (time.thread_time() if self.cpu_time else time.perf_counter()) - mark

    def seconds(self, pending) -> float:
        """Seconds of a :meth:`stop` result (synchronises with the GPU first)."""
        if self.cuda:
            start, end = pending
            end.synchronize()
            return start.elapsed_time(end) / 1e3
        return pending


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
        self.modules = [_build_stage_module(torch, cfg, s, n_stages, ctx.device, torch.float32) for s in mine]
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
        """One timed step (:func:`simtrain.calibration.microbench.timed_step`), recording its actions."""
        from .microbench import timed_step

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
                      steps: int, warmup: int, progress: Progress, memory: bool) -> dict:
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
    import torch.distributed as dist

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

    out: dict = {}
    for label, run in runs:
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
        out[label] = dict(
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
    return dict(runs=out, probe_keys={k: [list(x) for x in v] for k, v in probe_keys.items()},
                probe_model=asdict(probe_model),
                cpu_time_profile=clock.cpu_time)


def run_rank(ctx: RankContext, spec: dict, progress: Progress) -> dict:
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
    return dict(schedules=measured["runs"], world=ctx.world, model=spec["model"],
                cpu_time_profile=measured["cpu_time_profile"], probe_keys=measured["probe_keys"])


# ----------------------------------------------------------------------------- prediction
def import_schedule(name: str, measured: dict, microbatches: int) -> Schedule:
    """torch's per-rank orders of one run, as a validated simtrain :class:`Schedule`.

    Raises:
        SimtrainError: the imported order differs from what the ranks actually ran.
    """
    orders = tuple(tuple(parse_action(t) for t in rank) for rank in measured["orders"])
    for rank, (order, ran) in enumerate(zip(orders, measured["recorded"])):
        flat = [str(p) for a in order for p in a.parts]
        if flat != ran:
            raise SimtrainError(
                f"validate {name}: torch's schedule for rank {rank} lists {flat[:6]}..., "
                f"but the rank ran {ran[:6]}..."
            )
    schedule = Schedule(f"torch:{name}", microbatches, tuple(measured["stage_to_rank"]), orders)
    schedule.validate()
    return schedule


def torch_runtime_costs(costs: StageCosts, vocab: int) -> StageCosts:
    """Adjust per-chunk costs to how ``torch.distributed.pipelining`` runs a split backward.

    * Chunk 0 (the first stage): its I computes nothing (its input needs no gradient) and its W
      runs the whole backward (torch 2.13 ``PipelineStage.backward_weight_one_chunk``), and I
      frees nothing.
    * Other chunks: I (``stage_backward_input``) keeps the autograd graph for W, so every stored
      activation but the loss's softmax (above the last linear layer, freed with the stage
      output) stays until W.

    Args:
        costs: the cost model's per-chunk costs (fp32 loss, tp = 1).
        vocab: vocabulary size (the loss's fp32 softmax holds ``tokens x vocab x 4`` bytes).

    Full backwards (B) are unaffected.
    """
    chunks = []
    for c in costs.chunks:
        if c.chunk == 0:
            c = replace(c, backward_input_s=0.0, backward_weight_s=c.backward_s, weight_grad_bytes=c.activation_bytes)
        else:
            loss_bytes = costs.tokens_per_microbatch * 4 * vocab if c.has_head else 0.0
            c = replace(c, weight_grad_bytes=c.activation_bytes - loss_bytes)
        chunks.append(c)
    return replace(costs, chunks=tuple(chunks))


@dataclass(frozen=True)
class Row:
    """One line of the validation table (seconds, bytes, signed fractions)."""

    schedule: str
    speed_factor: float
    measured_step_s: float
    predicted_step_s: float
    step_error: float
    measured_activation_bytes: float
    predicted_activation_bytes: float
    memory_error: float


def predict(name: str, measured: dict, cfg: ValidationModel, hardware: HardwareProfile, world: int):
    """Simulate torch's order of ``name`` with ``hardware``; returns the :class:`ScheduleRun`."""
    from ..scenario import run_schedule

    schedule = import_schedule(name, measured, cfg.microbatches)
    parallel = cfg.parallel(world, TORCH_SCHEDULES[name][1])
    return run_schedule(schedule, cfg.spec(), hardware, parallel,
                        runtime=lambda costs: torch_runtime_costs(costs, cfg.vocab))


def _self_sharing(name: str, measured: dict, cfg: ValidationModel, hardware: HardwareProfile, world: int,
                  preemption: float) -> float:
    """How much longer the simulated actions take because ranks share processors (1 if they do not).

    The simulated counterpart of the measured wall / CPU time: the actions' total duration with the
    profile's processor sharing over their total without it, at the speed ``preemption`` / that
    ratio (found by a few fixed-point steps).
    """
    if hardware.processors_per_node is None or world <= hardware.processors_per_node:
        return 1.0

    def busy(hw: HardwareProfile) -> float:
        trace = predict(name, measured, cfg, hw, world).result.trace
        actions = trace[trace["kind"].isin(["F", "B", "I", "W"])]
        return float((actions["end_s"] - actions["start_s"]).sum())

    ratio = 1.0
    for _ in range(3):
        hw = at_speed(hardware, max(1.0, preemption / ratio))
        ratio = busy(hw) / busy(replace(hw, processors_per_node=None))
    return ratio


def cpu_slowdown(name: str, measured: dict, cfg: ValidationModel, hardware: HardwareProfile, world: int,
                 preemption: float) -> float:
    """How much slower than their CPU time one-thread CPU ranks ran a step's actions because other
    processes took their cores: the measured wall / CPU time ``preemption`` without the part the
    profile's processor sharing already simulates (ranks beyond the cores delaying each other);
    at least 1."""
    return max(1.0, preemption / _self_sharing(name, measured, cfg, hardware, world, preemption))


def probe_reference(result: dict, hardware: HardwareProfile) -> float:
    """Seconds the speed probe took when ``hardware`` was calibrated.

    The probe calibration recorded (``calibration.speed_probe``) when it was built for this
    validation model; otherwise the time the profile predicts for it (:func:`probe_seconds`).
    """
    recorded = (hardware.calibration or {}).get("speed_probe") or {}
    if recorded.get("model") == result["model"]:
        return float(recorded["seconds"])
    keys = {k: [tuple(x) for x in v] for k, v in result["probe_keys"].items()}
    return probe_seconds(keys, hardware)


def compare(result: dict, hardware: HardwareProfile, correct_speed: bool = True) -> list[Row]:
    """Rows of measured against predicted step time and activation peak (max over ranks).

    Args:
        result: rank 0's result of the ``validate`` job.
        hardware: the profile.
        correct_speed: predict each step at the speed the machine ran it and report the median
            prediction; otherwise predict at the profile's speed (factor 1). The machine's speed
            while a step ran is the speed probe's time around it (the median over the schedules of
            the probes before and after that round of steps) over its time at calibration
            (:func:`probe_reference`): a VM's speed drifts between calibration and validation. On a
            one-thread CPU rank, whose profile and probe are in CPU time, the factor is further
            multiplied by the step's wall / CPU time of the ranks' actions, i.e. how much other
            processes delayed them (divided by how much the simulated ranks delay each other when
            they outnumber the cores; at least 1). ``speed_factor`` is the median factor.
    """
    cfg = ValidationModel(**result["model"])
    reference = probe_reference(result, hardware)
    names = list(result["schedules"])
    rounds = [statistics.median(probes) / reference
              for probes in zip(*(result["schedules"][n]["probe_s"] for n in names))]
    rows = []
    for name, measured in result["schedules"].items():
        steps = range(len(measured["step_times_s"]))
        if not correct_speed:
            factors = [1.0 for _ in steps]
        else:
            factors = [(rounds[i] + rounds[i + 1]) / 2 for i in steps]
            if result.get("cpu_time_profile"):
                # ranks beyond the cores delay each other too, which processor sharing already
                # simulates, so that part of the wall / CPU ratio is divided out
                factors = [f * cpu_slowdown(name, measured, cfg, hardware, result["world"], measured["preemption"][i])
                           for i, f in zip(steps, factors)]
        cache: dict[float, object] = {}
        for f in factors:
            key = round(f, 3)
            if key not in cache:
                cache[key] = predict(name, measured, cfg, at_speed(hardware, key), result["world"])
        run = cache[round(factors[0], 3)]
        mem = run.result.memory
        static = mem[mem["time_s"] == 0].groupby("rank")["bytes"].first()
        predicted_act = float((mem.groupby("rank")["bytes"].max() - static).max())
        measured_step = statistics.median(measured["step_times_s"])
        measured_act = float(max(measured["activation_peak_bytes"]))
        predicted_step = statistics.median(cache[round(f, 3)].report.step_time_s for f in factors)
        factor = statistics.median(factors)
        rows.append(Row(
            schedule=name, speed_factor=factor, measured_step_s=measured_step, predicted_step_s=predicted_step,
            step_error=predicted_step / measured_step - 1,
            measured_activation_bytes=measured_act, predicted_activation_bytes=predicted_act,
            memory_error=predicted_act / measured_act - 1 if measured_act > 0 else 0.0,
        ))
    return rows


def parse_schedules(text: str | None) -> list[str]:
    """``--schedules`` (comma-separated, case-insensitive, optional ``Schedule`` prefix) -> names.

    Raises:
        SimtrainError: an unknown name, or none at all.
    """
    if text is None:
        return list(TORCH_SCHEDULES)
    names = []
    for raw in text.split(","):
        key = raw.strip().lower().removeprefix("schedule").replace("-", "").replace("_", "")
        if not key:
            continue
        if key not in TORCH_SCHEDULES:
            raise SimtrainError(f"--schedules: unknown torch schedule '{raw.strip()}'; choose from {list(TORCH_SCHEDULES)}")
        names.append(key)
    if not names:
        raise SimtrainError("--schedules: give at least one schedule name")
    return names
