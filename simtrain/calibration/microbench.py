"""Microbenchmarks run by every rank of a calibration job (see :mod:`.launch`).

What is measured (all times are medians over repeats, taken round-robin over the cases so that
a machine whose speed drifts shifts every case alike):

* **linear layers**: the three GEMMs of ``nn.Linear`` — F ``X Wᵀ``, I ``dY W``, W ``dYᵀ X`` — for
  the transformer's QKV, attention output, FFN up/down and LM-head shapes at each hidden size and
  token count. Every rank runs them at the same time, as in training (shared caches, power);
  the result per case is the median over ranks.
* **attention**: causal ``scaled_dot_product_attention`` forward and backward, with Q, K, V laid
  out as views of one QKV projection, rated in the cost model's FLOP count (4·s·d per token per
  head forward, twice that backward).
* **elementwise kernels**: LayerNorm, GeLU and a residual add, forward and backward, at the
  transformer's activation shapes, rated in the bytes the cost model counts for them.
* **copy**: a large ``copy_`` (read + write bytes / seconds): the memory bandwidth used for the
  optimizer step.
* **communication** (torch.distributed): p2p send/recv ping-pong between a pair of ranks in one
  node and, with several nodes, across nodes; all-reduce and all-to-all over all ranks; for a
  range of message sizes.
* **per-action overhead**: steps of a trivial ``ScheduleGPipe`` pipeline (one tiny linear layer
  per rank) for two microbatch counts; :mod:`.fit` finds the per-action time with which the
  simulator reproduces them.

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
OVERHEAD_MICROBATCHES = (4, 16)


def _dtype(torch, name: str):
    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[name]


class Timer:
    """Wall-clock timing of callables on one device (synchronising CUDA around each sample)."""

    def __init__(self, torch, device):
        self.torch = torch
        self.cuda = device.type == "cuda"

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def once(self, fn: Callable[[], object], inner: int = 1) -> float:
        """Seconds of one call of ``fn`` (averaged over ``inner`` back-to-back calls)."""
        self.sync()
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        self.sync()
        return (time.perf_counter() - t0) / inner

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
def linear_cases(torch, device, dtype, hidden: list[int], tokens: list[int], vocab: list[int]):
    """The (tokens, fan_in, fan_out, kind) cases and their callables (torch nn.Linear layouts)."""
    shapes = sorted({(t, h * a, h * b) for h in hidden for t in tokens for _, a, b in LINEAR_LAYERS}
                    | {(t, h, v) for h in hidden for t in tokens for v in vocab})
    keys, fns = [], []
    for t, k, n in shapes:
        x = torch.randn(t, k, device=device, dtype=dtype)
        w = torch.randn(n, k, device=device, dtype=dtype)
        dy = torch.randn(t, n, device=device, dtype=dtype)
        for kind, fn in (
            ("F", lambda x=x, w=w: torch.mm(x, w.t())),
            ("I", lambda dy=dy, w=w: torch.mm(dy, w)),
            ("W", lambda dy=dy, x=x: torch.mm(dy.t(), x)),
        ):
            keys.append((t, k, n, kind))
            fns.append(fn)
    return keys, fns


def attention_cases(torch, device, dtype, configs: list[tuple[int, int, int]], tokens: int):
    """Causal SDPA forward and backward cases: (seq_len, head_dim, heads, batch, pass)."""
    import torch.nn.functional as F

    keys, fns = [], []
    for s, d, a in configs:
        b = max(1, tokens // s)
        qkv = torch.randn(b, s, 3, a, d, device=device, dtype=dtype, requires_grad=True)

        def forward(qkv=qkv):
            q, k, v = qkv.permute(2, 0, 3, 1, 4)
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

        out = forward()
        dout = torch.randn_like(out)

        def backward(out=out, dout=dout, qkv=qkv):
            return torch.autograd.grad(out, qkv, dout, retain_graph=True)

        keys += [(s, d, a, b, "F"), (s, d, a, b, "B")]
        fns += [forward, backward]
    return keys, fns


def elementwise_cases(torch, device, dtype, hidden: list[int], tokens: list[int]):
    """LayerNorm, GeLU and residual-add cases with the bytes the cost model counts for each."""
    import torch.nn.functional as F

    elem = torch.tensor([], dtype=dtype).element_size()
    keys, fns = [], []
    for h in hidden:
        for t in tokens:
            x = torch.randn(t, h, device=device, dtype=dtype, requires_grad=True)
            u = torch.randn(t, 4 * h, device=device, dtype=dtype, requires_grad=True)
            y = torch.randn(t, h, device=device, dtype=dtype)
            ln = torch.nn.LayerNorm(h, device=device, dtype=dtype)
            ln_out, gelu_out = ln(x), F.gelu(u)
            dx, du = torch.randn_like(x), torch.randn_like(u)
            cases = [
                ("layernorm_F", 2 * t * h, lambda x=x, ln=ln: ln(x)),
                ("layernorm_B", 3 * t * h, lambda o=ln_out, x=x, g=dx: torch.autograd.grad(o, x, g, retain_graph=True)),
                ("gelu_F", 2 * t * 4 * h, lambda u=u: F.gelu(u)),
                ("gelu_B", 3 * t * 4 * h, lambda o=gelu_out, u=u, g=du: torch.autograd.grad(o, u, g, retain_graph=True)),
                ("add_F", 3 * t * h, lambda x=x, y=y: torch.add(x.detach(), y)),
            ]
            for name, elements, fn in cases:
                keys.append((name, t, h, elements * elem))
                fns.append(fn)
    return keys, fns


def compute_benchmarks(ctx: RankContext, spec: dict, progress: Progress) -> dict:
    """Linear layers, attention, elementwise kernels and a copy on this rank's device."""
    import torch

    dev, dtype = ctx.device, _dtype(torch, spec["dtype"])
    grid = (QUICK_GRID if spec["quick"] else DEFAULT_GRID)[ctx.device.type]
    hidden = spec.get("hidden") or grid[0]
    tokens = spec.get("tokens") or grid[1]
    repeats = spec["repeats"]
    timer = Timer(torch, dev)
    out: dict = {}

    lin_keys, lin_fns = linear_cases(torch, dev, dtype, hidden, tokens, grid[2])
    att_keys, att_fns = attention_cases(torch, dev, dtype, grid[3], max(tokens))
    ew_keys, ew_fns = elementwise_cases(torch, dev, dtype, hidden, tokens)
    fns = lin_fns + att_fns + ew_fns
    progress(f"compute kernels|0|{repeats}")
    samples = timer.round_robin(fns, repeats, lambda r: progress(f"compute kernels|{r}|{repeats}"))
    medians = _median_over_ranks(ctx, [statistics.median(s) for s in samples])
    spread = _median_over_ranks(ctx, [_cv(s) for s in samples])
    n_lin, n_att = len(lin_fns), len(att_fns)
    out["linear"] = [
        dict(tokens=t, fan_in=k, fan_out=n, kind=kind, seconds=sec, cv=cv)
        for (t, k, n, kind), sec, cv in zip(lin_keys, medians[:n_lin], spread[:n_lin])
    ]
    out["attention"] = [
        dict(seq_len=s, head_dim=d, heads=a, batch=b, kind=kind, seconds=sec, cv=cv)
        for (s, d, a, b, kind), sec, cv in zip(att_keys, medians[n_lin:n_lin + n_att], spread[n_lin:n_lin + n_att])
    ]
    out["elementwise"] = [
        dict(kernel=name, tokens=t, hidden=h, model_bytes=nbytes, seconds=sec, cv=cv)
        for (name, t, h, nbytes), sec, cv in zip(ew_keys, medians[n_lin + n_att:], spread[n_lin + n_att:])
    ]
    del lin_fns, att_fns, ew_fns, fns

    out["peak"] = peak_benchmarks(ctx, timer)
    nbytes = (32 if spec["quick"] else 128) * 2**20 * (16 if dev.type == "cuda" else 1)
    src = torch.empty(nbytes // 4, device=dev, dtype=torch.float32).normal_()
    dst = torch.empty_like(src)
    copy = timer.round_robin([lambda: dst.copy_(src)], max(5, repeats // 2))[0]
    out["copy"] = dict(bytes=nbytes, seconds=_median_over_ranks(ctx, [statistics.median(copy)])[0], cv=_cv(copy))
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
        rates[name] = 2 * m * k * n / statistics.median(seconds) / 1e12
    values = _median_over_ranks(ctx, list(rates.values()))
    return dict(zip(rates, values))


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
        out["p2p"][link] = [dict(bytes=n, seconds=statistics.median(s) / 2, cv=_cv(s)) for n, s in zip(sizes, samples)]
    for name, op in (("all_reduce", lambda n: dist.all_reduce(bufs[n])),
                     ("all_to_all", lambda n: dist.all_to_all_single(outs[n], bufs[n]))):
        step += 1
        progress(f"{name.replace('_', '-')}|{step}|{steps}")
        usable = [n for n in sizes if (n // 4) % ctx.world == 0]
        samples = _synchronised_round_robin(ctx, timer, [lambda n=n: op(n) for n in usable], repeats)
        out[name] = [dict(bytes=n, seconds=statistics.median(s), cv=_cv(s)) for n, s in zip(usable, samples)]
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


# ----------------------------------------------------------------------------- per-action overhead
def overhead_benchmark(ctx: RankContext, spec: dict, progress: Progress) -> dict:
    """Step times of a trivial GPipe pipeline (a 64-wide linear layer per rank) for several m.

    Returns ``{"width": 64, "batch_per_microbatch": 2, "steps": [{microbatches, seconds}]}``
    (median step time over ranks' maxima). Compute is negligible, so the step is framework
    overhead and p2p latency; :func:`simtrain.calibration.fit.fit_action_overhead` separates them.
    """
    import torch
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    width, per_mb = 64, 2
    results = []
    steps = spec["overhead_steps"]
    for i, m in enumerate(OVERHEAD_MICROBATCHES):
        progress(f"per-action overhead|{i}|{len(OVERHEAD_MICROBATCHES)}")
        torch.manual_seed(0)
        mod = torch.nn.Linear(width, width, device=ctx.device)
        stage = PipelineStage(mod, ctx.rank, ctx.world, ctx.device)
        sched = ScheduleGPipe(stage, m, loss_fn=lambda out, tgt: ((out - tgt) ** 2).mean())
        x = torch.randn(m * per_mb, width, device=ctx.device)
        tgt = torch.randn(m * per_mb, width, device=ctx.device)
        times = []
        for _ in range(steps + 2):
            times.append(timed_step(ctx, lambda: _run_step(ctx, sched, x, tgt)))
        results.append(dict(microbatches=m, seconds=statistics.median(times[2:]), cv=_cv(times[2:])))
    progress(f"per-action overhead|{len(OVERHEAD_MICROBATCHES)}|{len(OVERHEAD_MICROBATCHES)}")
    return dict(width=width, batch_per_microbatch=per_mb, steps=results)


def _run_step(ctx: RankContext, sched, x, target) -> None:
    """One ``step()`` of a single-stage-per-rank schedule: rank 0 feeds inputs, the last rank targets."""
    first, last = ctx.rank == 0, ctx.rank == ctx.world - 1
    if first and last:
        sched.step(x, target=target)
    elif first:
        sched.step(x)
    elif last:
        sched.step(target=target)
    else:
        sched.step()


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
            ``overhead_steps``, optional ``hidden`` and ``tokens`` lists.
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
    result["overhead"] = overhead_benchmark(ctx, spec, progress)
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
