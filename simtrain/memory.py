"""Per-rank memory breakdown at each rank's peak: what the simulated peak HBM is made of.

The memory timeline (:mod:`simtrain.engine`) holds each rank's static bytes (parameters,
gradients, optimizer states) plus what its actions allocate: F stores the chunk's activations,
I frees them but for what W still needs (the W-pending buffers), W frees the rest
(:func:`simtrain.lowering.chains.memory`). :func:`memory_breakdown` splits the peak of every rank
into those parts:

* ``weights``, ``gradients``: one copy per held parameter (gradients: per trainable one) in the weight dtype (16-bit in mixed
  precision, else 4 bytes; :func:`simtrain.costs.stage_costs`), divided by DP where the ZeRO
  stage shards them (gradients from stage 2, parameters from stage 3; Rajbhandari et al. 2020
  §5.2-5.3); with ``grad_allocation: first-backward`` only the gradients of the chunks whose
  first B or W on the rank has ended by the peak (:mod:`simtrain.lowering.grads`);
* ``optimizer_states``: the rest of the static bytes, i.e. Adam's fp32 moments (and the fp32
  master weights in mixed precision), divided by DP under ZeRO-1 (Rajbhandari et al. 2020 §5.1),
  plus, when the peak falls inside the optimizer step, the temporary of torch's foreach Adam
  (``ParallelConfig.optimizer_impl``);
* ``w_pending``: at the peak instant, the inputs and output gradients held for W by every
  (stage, microbatch) whose I has ended and whose W has not (Qi et al. 2023, zero bubble);
* ``activations``: the rest of the peak above the static bytes;
* ``comm_buffers``: the pipeline runtime's receive buffers held all step (``pp_buffers:
  per-microbatch``, :mod:`simtrain.costs.pipelining`), else 0. NCCL's internal buffers
  (``NCCL_BUFFSIZE``, 4 MiB per channel and peer by default, NCCL environment-variable docs)
  are not in it: they depend on the channel count NCCL picks at run time;
* ``allocator_reserve``: 0. The caching allocator's reserved-but-unallocated bytes were
  measured from about 2 % (vllm-project/compressed-tensors#587: 1.83 of 78.09 GiB) to 21 %
  (meta-pytorch/torchrec#4584: 93 GiB reserved for 77 GiB allocated) of the peak: no single
  measurement gives a default, so none is added (see :data:`ALLOCATOR_RESERVE_FRACTION`). Its
  block rounding (``c10/cuda/CUDACachingAllocator.cpp``: 512 B, and 2 MiB multiples above
  10 MiB) adds almost nothing to layer-sized tensors, and the rest is fragmentation, which
  depends on the tensor-by-tensor allocation order that the per-action timeline does not hold.

The parts add up to the rank's peak of the timeline; ``fits_in_hbm`` compares their sum with HBM.
"""

from __future__ import annotations

import numpy as np

from .costs import StageCosts
from .schedules import Schedule
from .trace import Trace

PARTS = ("weights", "gradients", "optimizer_states", "activations", "w_pending", "comm_buffers",
         "allocator_reserve")
"""Keys of one rank's breakdown, in stacking order."""

ALLOCATOR_RESERVE_FRACTION = 0.0
"""Allocator headroom as a fraction of the allocated peak: 0, for want of one measurement that
applies (the module docstring gives the measured range)."""


def _w_pending_at(split: dict[str, np.ndarray], rank: int, t: float, costs: StageCosts, schedule: Schedule) -> float:
    """Bytes held for W at time ``t`` on ``rank``: the (stage, microbatch) pairs whose last I ended
    at or before ``t`` and whose W has not ended (``split``: the I and W tasks' columns)."""
    mine = split["rank"] == rank
    ends: dict[tuple[int, int], dict[str, float]] = {}
    for stage, mb, kind, end in zip(split["stage"][mine], split["microbatch"][mine], split["kind"][mine],
                                    split["end_s"][mine]):
        key = ends.setdefault((int(stage), int(mb)), {})
        key[kind] = max(key.get(kind, -np.inf), float(end))
    return float(sum(costs.chunks[schedule.chunk_of(stage)].weight_grad_bytes
                     for (stage, _), e in sorted(ends.items())
                     if "I" in e and e["I"] <= t and not e.get("W", np.inf) <= t))


def _before_first_backward(backward: dict[str, np.ndarray], rank: int, t: float, held: list[int],
                           schedule: Schedule) -> list[int]:
    """The chunks of ``held`` none of whose B or W actions on ``rank`` has ended by ``t`` (its last
    compute task): with ``grad_allocation: first-backward`` their gradients are not allocated yet
    (``backward``: the columns of the B and W compute tasks of a stage)."""
    mine = backward["rank"] == rank
    ends: dict[tuple, float] = {}
    for stage, mb, kind, end in zip(backward["stage"][mine], backward["microbatch"][mine], backward["kind"][mine],
                                    backward["end_s"][mine]):
        ends[(int(stage), mb, kind)] = max(ends.get((int(stage), mb, kind), -np.inf), float(end))
    done = {schedule.chunk_of(stage) for (stage, _, _), end in ends.items() if end <= t}
    return [c for c in held if c not in done]


def memory_breakdown(result: Trace, costs: StageCosts, schedule: Schedule) -> list[dict[str, float]]:
    """Split every rank's peak memory into :data:`PARTS` (bytes).

    Args:
        result: the simulated step (its tasks and memory tables).
        costs: the costs it was simulated with.
        schedule: the schedule it ran (which chunks each rank holds).

    Returns:
        One dict per pipeline rank, keys :data:`PARTS`, values in bytes; the values of a rank sum
        to its peak of the memory timeline plus the allocator reserve.
    """
    cols, mem = result.columns, result.memory_columns
    staged, is_w = ~np.isnan(cols["stage"]), cols.equal("kind", "W")  # (np.isin would sort an object column)
    keep = (cols.equal("kind", "I") | is_w) & staged
    split = {name: cols[name][keep] for name in ("rank", "stage", "microbatch", "kind", "end_s")}
    keep = cols.equal("category", "compute") & (cols.equal("kind", "B") | is_w) & staged
    backward = {name: cols[name][keep] for name in ("rank", "stage", "microbatch", "kind", "end_s")}
    optimizer = np.flatnonzero(cols.equal("kind", "OPT"))
    opt_rank, opt_start, opt_end = cols["rank"][optimizer], cols["start_s"][optimizer], cols["end_s"][optimizer]
    rows = []
    for rank in range(schedule.num_ranks):
        held = sorted({schedule.chunk_of(s) for s in schedule.stages_of(rank)})
        static, buffers = costs.static_bytes(held), costs.recv_buffer_bytes(held)
        params = costs.held_params(held)
        trainable = costs.held_params(held, trainable=True)  # frozen weights have no gradient
        per = costs.static_parts_per_param or (costs.grad_bytes_per_param,) * 2
        weights, grads = params * per[0], trainable * per[1]
        peak, t = _first_peak(mem, rank)
        unallocated = (costs.lazy_grad_bytes(_before_first_backward(backward, rank, t, held, schedule))
                       if costs.lazy_grad_bytes_per_param else 0.0)  # (0 bytes per parameter: static gradients)
        static, grads = static - unallocated, grads - unallocated
        dynamic = max(peak - static - buffers, 0.0)
        pending = min(_w_pending_at(split, rank, t, costs, schedule), dynamic)
        stepping = (opt_rank == rank) & (opt_start <= t) & (t < opt_end)
        temp = min(costs.optimizer_temp_bytes(held), dynamic - pending) if stepping.any() else 0.0
        rows.append(dict(weights=weights, gradients=grads, optimizer_states=static - weights - grads + temp,
                         activations=dynamic - pending - temp, w_pending=pending, comm_buffers=buffers,
                         allocator_reserve=ALLOCATOR_RESERVE_FRACTION * peak))
    return rows


def offloaded_at_peak(result: Trace) -> list[float]:
    """Per rank (in rank order), the activation bytes on the host at the first instant of the
    rank's memory peak: offload copies ended by then, less the reloads started by then
    (:mod:`simtrain.lowering.offload`; a reload starts after its copy ends); 0 without offload. A
    rank whose value is 0 while offload is on did not have its peak lowered by it."""
    cols, mem = result.columns, result.memory_columns
    copies = cols.equal("kind", "offload")
    offloads, reloads = copies & cols.equal("stream", "offload"), copies & cols.equal("stream", "reload")
    out = []
    for rank in sorted(set(int(r) for r in mem["rank"])):
        _, t = _first_peak(mem, rank)
        mine = cols["rank"] == rank
        gone = offloads & mine & (cols["end_s"] <= t)
        back = reloads & mine & (cols["start_s"] <= t)
        out.append(max(0.0, float(cols["bytes"][gone].sum() - cols["bytes"][back].sum())))
    return out


def _first_peak(mem: dict[str, np.ndarray], rank: int) -> tuple[float, float]:
    """``(bytes, time_s)`` of ``rank``'s memory peak, at its first row (as pandas' idxmax)."""
    where = np.flatnonzero(mem["rank"] == rank)
    first = where[np.argmax(mem["bytes"][where])]
    return float(mem["bytes"][first]), float(mem["time_s"][first])
