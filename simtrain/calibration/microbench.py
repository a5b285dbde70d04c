"""Microbenchmarks run by every rank of a calibration job (see :mod:`.launch`).

What is measured (all times are the lower quartile of repeats (:func:`typical`), taken
round-robin over the cases so that a machine whose speed drifts shifts every case alike; compute
on a one-thread CPU rank is timed in thread CPU time, see :class:`Timer`):

* **linear layers**: the three GEMMs of ``nn.Linear`` — F ``X Wᵀ``, I ``dY W``, W ``dYᵀ X`` — for
  the transformer's QKV, attention output, FFN up/down and LM-head shapes at each hidden size and
  token count. The operand a model reads cold (the weight in F and I, the saved input in W) is
  rotated among copies larger than the cache together, since a stage's weights do not stay in
  cache between layers (reusing one weight made GEMMs look ~6% faster here). Every rank runs
  them at the same time, as in training (shared caches, power); the result per case is the
  median over ranks.
* **attention**: causal ``scaled_dot_product_attention`` forward and backward, with Q, K, V laid
  out as views of one QKV projection, rated in the cost model's FLOP count (4·s·d per token per
  head forward, twice that backward).
* **elementwise kernels** by class — norms (LayerNorm), activations (GeLU, the loss's
  log-softmax), adds (residual, gradient accumulation) — forward and backward at the
  transformer's shapes, rated in the bytes the cost model counts for them.
* **copy**: a large ``copy_`` (read + write bytes / seconds): the memory bandwidth.
* **communication** (torch.distributed): p2p send/recv ping-pong between a pair of ranks in one
  node and, with several nodes, across nodes; all-reduce and all-to-all over all ranks; for a
  range of message sizes.
* **real pipeline steps** of a calibration model (the validation transformer's architecture with
  one layer per stage, at the grid's first shape) run by three torch schedules (GPipe,
  Interleaved1F1B, ZBVZeroBubble) for two microbatch counts, with Adam, stepped round-robin with
  the speed probe before each step (:func:`pipeline_benchmark`). Kernels timed alone miss what a
  stage pays inside a step (several microbatches' activations alive, other stages' work between
  its kernels, autograd and pipelining code, and on gloo messages that wait for a busy peer), so
  :mod:`.fit` takes from these steps the per-pass factors of real actions over their kernels, the
  optimizer's rate, and the per-action and per-message times with which the simulator reproduces
  the steps.

:func:`run_rank` returns, on rank 0, a JSON-able dict of raw measurements; :mod:`.fit` turns it
into a profile.
"""

from __future__ import annotations

import math
import os
import platform
import statistics
import time
from collections.abc import Callable

from .launch import Progress, RankContext

LINEAR_LAYERS = (("qkv", 1, 3), ("attn_out", 1, 1), ("ffn_up", 1, 4), ("ffn_down", 4, 1))
"""(name, fan_in / h, fan_out / h) of a GPT layer's linear layers (Narayanan et al. 2021 §5.1)."""

DEFAULT_GRID = {
    # device: (hidden sizes, tokens per microbatch, vocab sizes, (seq_len, head_dim, heads) list)
    "cpu": ([256, 512, 1024], [256, 1024], [2048], [(128, 64, 4), (256, 64, 4), (512, 64, 4)]),
    "cuda": ([2048, 4096, 8192], [2048, 8192], [32000, 128256], [(2048, 128, 16), (4096, 128, 16), (8192, 128, 16)]),
}
QUICK_GRID = {
    "cpu": ([256, 512], [256, 512], [2048], [(128, 64, 4), (256, 64, 4)]),
    "cuda": ([4096, 8192], [4096], [32000], [(4096, 128, 16)]),
}
MESSAGE_BYTES = {
    "cpu": [2**k for k in range(12, 25, 2)],  # 4 KiB .. 16 MiB
    "cuda": [2**k for k in range(14, 29, 2)],  # 16 KiB .. 256 MiB
}
QUICK_MESSAGE_BYTES = {
    "cpu": [2**k for k in range(12, 23, 2)],  # 4 KiB .. 4 MiB
    "cuda": [2**k for k in range(16, 27, 2)],
}


def _dtype(torch, name: str):
    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[name]


class Timer:
    """Timing of callables on one device (synchronising CUDA around each sample).

    Args:
        cpu_time: measure the calling thread's CPU time instead of wall-clock time. For compute
            on a CPU rank with one torch thread this is the kernel's own cost, which other
            processes sharing the cores cannot inflate (they only delay it in wall time; a
            validation run measures that slowdown separately with its probes).
    """

    def __init__(self, torch, device, cpu_time: bool = False):
        self.torch = torch
        self.cuda = device.type == "cuda"
        self.clock = time.thread_time if cpu_time and not self.cuda else time.perf_counter

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def once(self, fn: Callable[[], object], inner: int = 1) -> float:
        """Seconds of one call of ``fn`` (averaged over ``inner`` back-to-back calls)."""
        self.sync()
        t0 = self.clock()
        for _ in range(inner):
            fn()
        self.sync()
        return (self.clock() - t0) / inner

    def round_robin(
        self, cases: list[Callable[[], object]], repeats: int, progress: Callable[[int], None] | None = None,
        min_sample_s: float = 1e-3,
    ) -> list[list[float]]:
        """Time every case ``repeats`` times, one round over all cases at a time.

        Each case is warmed up once; a case faster than ``min_sample_s`` is repeated back to back
        within a sample. Returns the samples (seconds per call) of each case.
        """
        inner = []
        for fn in cases:
            t = self.once(fn)
            inner.append(max(1, math.ceil(min_sample_s / max(t, 1e-9))))
        samples: list[list[float]] = [[] for _ in cases]
        for r in range(repeats):
            for i, fn in enumerate(cases):
                samples[i].append(self.once(fn, inner[i]))
            if progress:
                progress(r + 1)
        return samples


def _median_over_ranks(ctx: RankContext, values: list[float]) -> list[float]:
    """Element-wise median over ranks of this rank's ``values`` (identity for one rank)."""
    if ctx.world == 1:
        return values
    import torch.distributed as dist

    gathered: list = [None] * ctx.world
    dist.all_gather_object(gathered, values)
    return [statistics.median(v[i] for v in gathered) for i in range(len(values))]


# ----------------------------------------------------------------------------- compute
COLD_BYTES = {"cpu": 8 * 2**20, "cuda": 256 * 2**20}
"""Working set, per case, of the operand a model reads cold (weights in F and I, saved
activations in the backward): several copies are rotated so it does not stay in cache (several
times this machine's per-core L2 on CPU, twice an H100's L2 on GPU)."""


def _copies(make: Callable[[], object], nbytes: int, device) -> Callable[[], object]:
    """A function returning, on each call, the next of enough copies of ``make()`` that their
    total exceeds :data:`COLD_BYTES` (at most 16 copies)."""
    count = max(1, min(16, math.ceil(COLD_BYTES[device.type] / max(nbytes, 1))))
    items = [make() for _ in range(count)]
    state = {"i": -1}

    def next_item():
        state["i"] = (state["i"] + 1) % count
        return items[state["i"]]

    return next_item


def linear_cases(torch, device, dtype, hidden: list[int], tokens: list[int], vocab: list[int]):
    """The (tokens, fan_in, fan_out, kind) cases and their callables (torch nn.Linear layouts).

    F ``X Wᵀ`` and I ``dY W`` read a cold weight, W ``dYᵀ X`` a cold saved input.
    """
    shapes = sorted({(t, h * a, h * b) for h in hidden for t in tokens for _, a, b in LINEAR_LAYERS}
                    | {(t, h, v) for h in hidden for t in tokens for v in vocab})
    elem = torch.tensor([], dtype=dtype).element_size()
    keys, fns = [], []
    for t, k, n in shapes:
        x = torch.randn(t, k, device=device, dtype=dtype)
        dy = torch.randn(t, n, device=device, dtype=dtype)
        w = _copies(lambda: torch.randn(n, k, device=device, dtype=dtype), n * k * elem, device)
        xs = _copies(lambda: torch.randn(t, k, device=device, dtype=dtype), t * k * elem, device)
        for kind, fn in (
            ("F", lambda x=x, w=w: torch.mm(x, w().t())),
            ("I", lambda dy=dy, w=w: torch.mm(dy, w())),
            ("W", lambda dy=dy, xs=xs: torch.mm(dy.t(), xs())),
        ):
            keys.append((t, k, n, kind))
            fns.append(fn)
    return keys, fns


def attention_cases(torch, device, dtype, configs: list[tuple[int, int, int]], tokens: int):
    """Causal SDPA forward and backward cases: (seq_len, head_dim, heads, batch, pass).

    Q, K, V are views of one ``[b, s, 3, a, d]`` projection, as a model lays them out; the
    backward reads a cold saved forward.
    """
    import torch.nn.functional as F

    elem = torch.tensor([], dtype=dtype).element_size()
    keys, fns = [], []
    for s, d, a in configs:
        b = max(1, tokens // s)
        qkv = torch.randn(b, s, 3, a, d, device=device, dtype=dtype, requires_grad=True)

        def forward(qkv=qkv):
            q, k, v = qkv.permute(2, 0, 3, 1, 4)
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

        def saved(forward=forward, qkv=qkv):
            out = forward()
            return out, torch.randn_like(out), qkv

        graphs = _copies(saved, 4 * b * s * a * d * elem, device)

        def backward(graphs=graphs):
            out, dout, inp = graphs()
            return torch.autograd.grad(out, inp, dout, retain_graph=True)

        keys += [(s, d, a, b, "F"), (s, d, a, b, "B")]
        fns += [forward, backward]
    return keys, fns


def elementwise_cases(torch, device, dtype, hidden: list[int], tokens: list[int], vocab: list[int]):
    """Memory-bound kernels by class, with the bytes the cost model counts for each.

    ``norm``: LayerNorm forward / backward; ``activation``: GeLU forward / backward and the fp32
    log-softmax of the loss; ``add``: a residual add and the in-place gradient accumulation
    ``grad += new`` of a layer's weights. Backward cases and the accumulation read cold data.
    Returns keys ``(class, kernel, tokens, hidden, bytes)`` and callables.
    """
    import torch.nn.functional as F

    elem = torch.tensor([], dtype=dtype).element_size()
    keys, fns = [], []

    def graph(fn, inp):
        def make():
            leaf = inp.detach().clone().requires_grad_()
            out = fn(leaf)
            return out, torch.randn_like(out), leaf
        return _copies(make, 2 * inp.numel() * inp.element_size(), device)

    def backward(graphs):
        out, grad, leaf = graphs()
        return torch.autograd.grad(out, leaf, grad, retain_graph=True)

    for h in hidden:
        params = 12 * h * h  # one GPT layer's weights
        grads = _copies(lambda: torch.randn(params, device=device, dtype=dtype), params * elem, device)
        new = torch.randn(params, device=device, dtype=dtype)
        for t in tokens:
            x = torch.randn(t, h, device=device, dtype=dtype)
            u = torch.randn(t, 4 * h, device=device, dtype=dtype)
            y = torch.randn(t, h, device=device, dtype=dtype)
            ln = torch.nn.LayerNorm(h, device=device, dtype=dtype)
            cases = [
                ("norm", "layernorm_F", 2 * t * h * elem, lambda x=x, ln=ln: ln(x)),
                ("norm", "layernorm_B", 3 * t * h * elem, lambda g=graph(ln, x): backward(g)),
                ("activation", "gelu_F", 2 * t * 4 * h * elem, lambda u=u: F.gelu(u)),
                ("activation", "gelu_B", 3 * t * 4 * h * elem, lambda g=graph(F.gelu, u): backward(g)),
                ("add", "residual_add_F", 3 * t * h * elem, lambda x=x, y=y: torch.add(x, y)),
            ]
            for v in vocab:
                z = torch.randn(t, v, device=device, dtype=torch.float32)
                cases += [
                    ("activation", "log_softmax_F", 2 * t * v * 4, lambda z=z: torch.log_softmax(z, -1)),
                    ("activation", "log_softmax_B", 3 * t * v * 4,
                     lambda g=graph(lambda a: torch.log_softmax(a, -1), z): backward(g)),
                ]
            for cls, name, nbytes, fn in cases:
                keys.append((cls, name, t, h, nbytes))
                fns.append(fn)
        keys.append(("add", "grad_accumulate", 0, h, 3 * params * elem))
        fns.append(lambda grads=grads, new=new: grads().add_(new))
    return keys, fns


def transformer_layer(torch, hidden: int, heads: int, ffn: int):
    """A pre-norm GPT layer (LayerNorm, QKV, causal SDPA, output projection, GeLU MLP, no biases).

    The layer ``simtrain validate`` trains and ``calibrate`` times whole; its simtrain
    description is ``ModelSpec(activation="gelu", norm="layernorm", bias=False)``.
    """
    import torch.nn.functional as F
    from torch import nn

    d = hidden // heads

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm1, self.norm2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
            self.qkv = nn.Linear(hidden, 3 * hidden, bias=False)
            self.proj = nn.Linear(hidden, hidden, bias=False)
            self.fc1 = nn.Linear(hidden, ffn, bias=False)
            self.fc2 = nn.Linear(ffn, hidden, bias=False)

        def forward(self, x):
            b, s, _ = x.shape
            q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, heads, d).permute(2, 0, 3, 1, 4)
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # laid out [b, s, a, d]
            x = x + self.proj(o.transpose(1, 2).reshape(b, s, hidden))
            return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))

    return Block()


def compute_benchmarks(ctx: RankContext, spec: dict, progress: Progress) -> dict:
    """Linear layers, attention, elementwise kernels and a copy on this rank's device."""
    import torch

    dev, dtype = ctx.device, _dtype(torch, spec["dtype"])
    grid = (QUICK_GRID if spec["quick"] else DEFAULT_GRID)[ctx.device.type]
    hidden = spec.get("hidden") or grid[0]
    tokens = spec.get("tokens") or grid[1]
    repeats = spec["repeats"]
    timer = Timer(torch, dev, cpu_time=ctx.threads == 1)
    out: dict = {}

    groups = dict(
        linear=linear_cases(torch, dev, dtype, hidden, tokens, grid[2]),
        attention=attention_cases(torch, dev, dtype, grid[3], max(tokens)),
        elementwise=elementwise_cases(torch, dev, dtype, hidden, tokens, grid[2]),
    )
    fns = [fn for _, group in groups.values() for fn in group]
    progress(f"compute kernels|0|{repeats}")
    samples = timer.round_robin(fns, repeats, lambda r: progress(f"compute kernels|{r}|{repeats}"))
    medians = _median_over_ranks(ctx, [typical(s) for s in samples])
    spread = _median_over_ranks(ctx, [_cv(s) for s in samples])
    fields = dict(
        linear=("tokens", "fan_in", "fan_out", "kind"),
        attention=("seq_len", "head_dim", "heads", "batch", "kind"),
        elementwise=("class", "kernel", "tokens", "hidden", "model_bytes"),
    )
    start = 0
    for name, (keys, _) in groups.items():
        out[name] = [
            dict(zip(fields[name], key), seconds=sec, cv=cv)
            for key, sec, cv in zip(keys, medians[start:start + len(keys)], spread[start:start + len(keys)])
        ]
        start += len(keys)
    del groups, fns

    out["peak"] = peak_benchmarks(ctx, timer)
    nbytes = (32 if spec["quick"] else 128) * 2**20 * (16 if dev.type == "cuda" else 1)
    src = torch.empty(nbytes // 4, device=dev, dtype=torch.float32).normal_()
    dst = torch.empty_like(src)
    copy = timer.round_robin([lambda: dst.copy_(src)], max(5, repeats // 2))[0]
    out["copy"] = dict(bytes=nbytes, seconds=_median_over_ranks(ctx, [typical(copy)])[0], cv=_cv(copy))
    return out


PEAK_SHAPE = {"cpu": (256, 256, 1024), "cuda": (8192, 8192, 8192)}
"""(m, k, n) of the one GEMM that rates each dtype's peak (profile ``peak_tflops``)."""


def peak_benchmarks(ctx: RankContext, timer: Timer) -> dict:
    """TFLOP/s of one mid-size GEMM in each of fp32, bf16 and fp16 (median of 3, over ranks)."""
    import torch

    m, k, n = PEAK_SHAPE[ctx.device.type]
    rates = {}
    for name in ("fp32", "bf16", "fp16"):
        a = torch.randn(m, k, device=ctx.device).to(_dtype(torch, name))
        b = torch.randn(k, n, device=ctx.device).to(_dtype(torch, name))
        seconds = timer.round_robin([lambda a=a, b=b: torch.mm(a, b)], 3)[0]
        rates[name] = 2 * m * k * n / typical(seconds) / 1e12
    values = _median_over_ranks(ctx, list(rates.values()))
    return dict(zip(rates, values))


def typical(samples: list[float]) -> float:
    """The lower quartile of repeated timings: the machine's own speed.

    Other processes sharing the machine only ever add time to a sample, so the lower quartile
    is a steadier estimate than the median (``simtrain validate`` then measures how much slower
    the machine currently runs with its probes). Falls back to the minimum below 4 samples.
    """
    if len(samples) < 4:
        return min(samples)
    return statistics.quantiles(samples, n=4, method="inclusive")[0]


def _cv(samples: list[float]) -> float:
    """Coefficient of variation (stdev / mean) of a sample list; 0 for one sample."""
    if len(samples) < 2:
        return 0.0
    return statistics.stdev(samples) / statistics.mean(samples)


# ----------------------------------------------------------------------------- communication
def _pairs(ctx: RankContext) -> dict[str, tuple[int, int]]:
    """Rank pairs for p2p: one inside node 0 and, with several nodes, one across nodes."""
    pairs = {}
    if ctx.local_world >= 2:
        pairs["intra_node"] = (0, 1)
    if ctx.world > ctx.local_world:
        pairs["inter_node"] = (0, ctx.local_world)
    return pairs


def comm_benchmarks(ctx: RankContext, spec: dict, progress: Progress) -> dict:
    """p2p ping-pong per link class, all-reduce and all-to-all over all ranks, per message size.

    Returns ``{"p2p": {link: [{bytes, seconds}]}, "all_reduce": [...], "all_to_all": [...]}``
    with rank 0's medians (p2p: half a round trip).
    """
    import torch
    import torch.distributed as dist

    sizes = (QUICK_MESSAGE_BYTES if spec["quick"] else MESSAGE_BYTES)[ctx.device.type]
    repeats = spec["comm_repeats"]
    timer = Timer(torch, ctx.device)
    bufs = {n: torch.ones(n // 4, device=ctx.device, dtype=torch.float32) for n in sizes}
    outs = {n: torch.empty_like(b) for n, b in bufs.items()}
    out: dict = {"p2p": {}}
    steps = len(_pairs(ctx)) + 2
    step = 0
    for link, (a, b) in _pairs(ctx).items():
        step += 1
        progress(f"p2p {link}|{step}|{steps}")

        def ping(n: int, a: int = a, b: int = b) -> None:
            if ctx.rank == a:
                dist.send(bufs[n], b)
                dist.recv(bufs[n], b)
            elif ctx.rank == b:
                dist.recv(bufs[n], a)
                dist.send(bufs[n], a)

        samples = _synchronised_round_robin(ctx, timer, [lambda n=n: ping(n) for n in sizes], repeats)
        out["p2p"][link] = [dict(bytes=n, seconds=typical(s) / 2, cv=_cv(s)) for n, s in zip(sizes, samples)]
    for name, op in (("all_reduce", lambda n: dist.all_reduce(bufs[n])),
                     ("all_to_all", lambda n: dist.all_to_all_single(outs[n], bufs[n]))):
        step += 1
        progress(f"{name.replace('_', '-')}|{step}|{steps}")
        usable = [n for n in sizes if (n // 4) % ctx.world == 0]
        samples = _synchronised_round_robin(ctx, timer, [lambda n=n: op(n) for n in usable], repeats)
        out[name] = [dict(bytes=n, seconds=typical(s), cv=_cv(s)) for n, s in zip(usable, samples)]
    out["world"] = ctx.world
    return out


def _synchronised_round_robin(ctx: RankContext, timer: Timer, cases, repeats: int) -> list[list[float]]:
    """Like :meth:`Timer.round_robin` for communication: a barrier before every sample."""
    for fn in cases:  # warm-up (connections, buffers)
        fn()
    samples: list[list[float]] = [[] for _ in cases]
    for _ in range(repeats):
        for i, fn in enumerate(cases):
            ctx.barrier()
            samples[i].append(timer.once(fn))
    return samples


# ----------------------------------------------------------------------------- real pipeline steps
PIPELINE_SCHEDULES = ("gpipe", "interleaved1f1b", "zbvzerobubble")
"""torch runtimes whose steps calibrate what a pipeline stage really costs: the single-stage
runtime (GPipe) and the multi-stage one (Interleaved1F1B: full backwards on middle stages;
ZBVZeroBubble: split I/W backwards, and a V placement that passes half the activations within a
rank, which separates per-action from per-message cost). ``Schedule1F1B`` fuses a send and a
receive into one call (about half the cost per message on gloo); simtrain does not model that
fusion, so it over-estimates 1F1B's overhead slightly."""


def calibration_models(spec: dict, device: str, world: int) -> dict[str, tuple[str, object]]:
    """The calibration model's cases: label -> (torch schedule, model).

    The model is the validation transformer's architecture (:func:`transformer_layer` blocks,
    embedding, LM head and cross-entropy loss) with ONE layer per pipeline stage, at the first hidden
    size and token count of the GEMM grid (``--hidden``, ``--tokens``), the grid's first attention
    shape and vocabulary; each schedule runs it with ``world`` and ``3·world`` microbatches.
    """
    from .validate import TORCH_SCHEDULES, ValidationModel

    grid = (QUICK_GRID if spec["quick"] else DEFAULT_GRID)[device]
    h = (spec.get("hidden") or grid[0])[0]
    t = (spec.get("tokens") or grid[1])[0]
    seq_len, head_dim, _ = grid[3][0]
    cases = {}
    for name in PIPELINE_SCHEDULES:
        stages = world * TORCH_SCHEDULES[name][1]
        for m in (world, 3 * world):
            cfg = ValidationModel(layers=stages, hidden=h, heads=max(1, h // head_dim), ffn=4 * h, vocab=grid[2][0],
                                  seq_len=min(seq_len, t), microbatch_size=max(1, t // seq_len), microbatches=m)
            cases[f"{name} m={m}"] = (name, cfg)
    return cases


def pipeline_benchmark(ctx: RankContext, spec: dict, progress: Progress) -> dict:
    """Real training steps (torch pipeline schedule, Adam) of the calibration model
    (:func:`calibration_models`), measured by :func:`simtrain.calibration.validate.measure_schedules`:
    step times, every action's time in the compute clock, the optimizer step, and the speed probe
    before each step (at the validation model's shapes: validation compares its own probes with
    these).

    :mod:`.fit` takes per-pass in-situ factors from the actions (``layer_slowdown``), the optimizer
    rate from the optimizer steps, and the per-action and per-message overheads with which simtrain's
    simulation of the same orders reproduces the step times.
    """
    from .validate import default_model, measure_schedules

    cases = calibration_models(spec, ctx.device.type, ctx.world)
    probe_model = default_model(ctx.world, ctx.device.type, quick=False)
    tagged = lambda line: progress(f"pipeline steps: {line}")  # noqa: E731
    return measure_schedules(ctx, cases, probe_model, spec["pipeline_steps"], 2, tagged, memory=False)


def timed_step(ctx: RankContext, fn: Callable[[], object]) -> float:
    """Seconds from a common start (barrier) until the slowest rank finishes ``fn``."""
    import torch

    ctx.barrier()
    timer = Timer(torch, ctx.device)
    t = timer.once(fn)
    if ctx.world == 1:
        return t
    import torch.distributed as dist

    box = torch.tensor([t], dtype=torch.float64, device=ctx.device if ctx.backend == "nccl" else "cpu")
    dist.all_reduce(box, op=dist.ReduceOp.MAX)
    return float(box.item())


# ----------------------------------------------------------------------------- job
def run_rank(ctx: RankContext, spec: dict, progress: Progress) -> dict:
    """The ``calibrate`` job: all microbenchmarks on every rank; rank 0's dict is the result.

    Args:
        ctx: this rank.
        spec: ``device``, ``dtype``, ``quick``, ``repeats``, ``comm_repeats``,
            ``pipeline_steps``, optional ``hidden`` and ``tokens`` lists.
        progress: ``"phase|done|total"`` lines.
    """
    import torch

    result = dict(
        torch_version=torch.__version__,
        device_name=_device_name(torch, ctx.device),
        backend=ctx.backend,
        world=ctx.world,
        local_world=ctx.local_world,
        threads_per_rank=ctx.threads if ctx.device.type == "cpu" else None,
        cpu_cores=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        dtype=spec["dtype"],
    )
    result["compute"] = compute_benchmarks(ctx, spec, progress)
    ctx.barrier()
    result["comm"] = comm_benchmarks(ctx, spec, progress) if ctx.world > 1 else None
    ctx.barrier()
    result["pipeline"] = pipeline_benchmark(ctx, spec, progress)
    return result


def _device_name(torch, device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    name = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return name
