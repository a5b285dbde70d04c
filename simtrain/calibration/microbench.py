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

import os
import platform

from .launch import Progress, RankContext
from .pipeline_runs import pipeline_benchmark
from .timing import Timer, cv_of, median_over_ranks, typical
from .workload import (
    DEFAULT_GRID,
    MESSAGE_BYTES,
    QUICK_GRID,
    QUICK_MESSAGE_BYTES,
    attention_cases,
    dtype_of,
    elementwise_cases,
    linear_cases,
)

def compute_benchmarks(ctx: RankContext, spec: dict, progress: Progress) -> dict:
    """Linear layers, attention, elementwise kernels and a copy on this rank's device."""
    import torch

    dev, dtype = ctx.device, dtype_of(torch, spec["dtype"])
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
    medians = median_over_ranks(ctx, [typical(s) for s in samples])
    spread = median_over_ranks(ctx, [cv_of(s) for s in samples])
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
    out["copy"] = dict(bytes=nbytes, seconds=median_over_ranks(ctx, [typical(copy)])[0], cv=cv_of(copy))
    return out


PEAK_SHAPE = {"cpu": (256, 256, 1024), "cuda": (8192, 8192, 8192)}
"""(m, k, n) of the one GEMM that rates each dtype's peak (profile ``peak_tflops``)."""


def peak_benchmarks(ctx: RankContext, timer: Timer) -> dict:
    """TFLOP/s of one mid-size GEMM in each of fp32, bf16 and fp16 (median of 3, over ranks)."""
    import torch

    m, k, n = PEAK_SHAPE[ctx.device.type]
    rates = {}
    for name in ("fp32", "bf16", "fp16"):
        a = torch.randn(m, k, device=ctx.device).to(dtype_of(torch, name))
        b = torch.randn(k, n, device=ctx.device).to(dtype_of(torch, name))
        seconds = timer.round_robin([lambda a=a, b=b: torch.mm(a, b)], 3)[0]
        rates[name] = 2 * m * k * n / typical(seconds) / 1e12
    values = median_over_ranks(ctx, list(rates.values()))
    return dict(zip(rates, values))


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
        out["p2p"][link] = [dict(bytes=n, seconds=typical(s) / 2, cv=cv_of(s)) for n, s in zip(sizes, samples)]
    for name, op in (("all_reduce", lambda n: dist.all_reduce(bufs[n])),
                     ("all_to_all", lambda n: dist.all_to_all_single(outs[n], bufs[n]))):
        step += 1
        progress(f"{name.replace('_', '-')}|{step}|{steps}")
        usable = [n for n in sizes if (n // 4) % ctx.world == 0]
        samples = _synchronised_round_robin(ctx, timer, [lambda n=n: op(n) for n in usable], repeats)
        out[name] = [dict(bytes=n, seconds=typical(s), cv=cv_of(s)) for n, s in zip(usable, samples)]
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
        device_name=device_name(torch, ctx.device),
        device_memory_bytes=torch.cuda.get_device_properties(ctx.device).total_memory
        if ctx.device.type == "cuda" else None,
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


def device_name(torch, device) -> str:
    """The CPU model (/proc/cpuinfo) or GPU name of ``device``, as calibration records it."""
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
