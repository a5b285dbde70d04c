"""How calibration times work on one rank: :class:`Timer` (samples of callables, wall or thread
CPU time), :class:`ComputeClock` (the clock actions and the optimizer are timed with inside real
steps), :func:`timed_step` (a step from a common start to the slowest rank's end) and the
statistics of samples (:func:`typical`, median over ranks).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable

from .launch import RankContext

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


def median_over_ranks(ctx: RankContext, values: list[float]) -> list[float]:
    """Element-wise median over ranks of this rank's ``values`` (identity for one rank)."""
    if ctx.world == 1:
        return values
    import torch.distributed as dist

    gathered: list = [None] * ctx.world
    dist.all_gather_object(gathered, values)
    return [statistics.median(v[i] for v in gathered) for i in range(len(values))]


def typical(samples: list[float]) -> float:
    """The lower quartile of repeated timings: the machine's own speed.

    Other processes sharing the machine only ever add time to a sample, so the lower quartile
    is a steadier estimate than the median (``simtrain validate`` then measures how much slower
    the machine currently runs with its probes). Falls back to the minimum below 4 samples.
    """
    if len(samples) < 4:
        return min(samples)
    return statistics.quantiles(samples, n=4, method="inclusive")[0]


def cv_of(samples: list[float]) -> float:
    """Coefficient of variation (stdev / mean) of a sample list; 0 for one sample."""
    if len(samples) < 2:
        return 0.0
    return statistics.stdev(samples) / statistics.mean(samples)


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
