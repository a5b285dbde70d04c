"""ZeRO-2 and ZeRO-3 (FSDP) in the lowering: which actions reduce-scatter their gradients, and the
parameter all-gathers of ZeRO-3.

Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models",
§5.2-5.3 and §7.2: stage 2 shards the gradients over DP, so every backward reduce-scatters its
gradients (DeepSpeed ``stage_1_and_2.py`` and ``stage3.py`` reduce in the backward hooks of every
micro-step; torch FSDP2's default ``requires_gradient_sync``); stage 3 also shards the parameters,
so before each forward and each backward a layer's parameters are all-gathered and dropped again
after it (FSDP2 ``reshard_after_forward=True``). Per step of one microbatch that moves
``3 x (n-1)/n x Psi`` bytes against plain DP's all-reduce ``2 x (n-1)/n x Psi``: 1.5x (§7.2.2).

How simtrain lowers it:

* the gradient reduce-scatter runs after every action that produces weight gradients (each B, or
  each W when the backward is split), in ``dp_buckets`` buckets on the ``dp`` stream. Two buckets
  are in flight at most: the compute piece of bucket i waits until bucket i-2 of the rank is
  reduced (DeepSpeed reuses a fixed pair of bucket buffers, ``stage_1_and_2.py``'s double-buffered
  IPG buckets; FSDP2's ``FSDPParamGroup.post_backward`` makes the compute stream wait for the
  previous reduce-scatter before it starts the next), so a slow network shows as exposed time,
  not as unbounded memory;
* what a bucket holds unsharded is one wrapped unit's gradient, a transformer layer's (torchtitan
  ``apply_fsdp`` and Megatron-FSDP's ``fsdp_unit_modules`` wrap every block; FSDP1 likewise with a
  transformer auto-wrap policy), or the bucket's share of the chunk where a bucket is smaller:
  autograd writes it in the parameter dtype from the start of the piece; once the previous
  reduce-scatter is done (the wait above) FSDP2's ``foreach_reduce``
  (``torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py``) copies it into a reduce-scatter
  input of ``reduce_dtype`` (``grad_reduce_dtype``) and frees it, and that input lives until its
  reduce-scatter ends: simtrain makes the switch at the reduction's start
  (:func:`sharded_reduction_bytes`). So the transient gradient is about one layer in each dtype,
  not the whole model's. DeepSpeed's fixed
  ``reduce_bucket_size`` (5e8 elements by default) is not modelled apart;
* ZeRO-3 all-gathers a chunk's parameters before every F, B and I on a ``zero`` stream, one
  collective per layer (``repeat`` = layers). Timing is at chunk granularity: the gather of a
  rank's k-th such action is issued once its (k-2)-th action is done, so it runs while the
  (k-1)-th computes (FSDP2's forward/backward prefetch, one module ahead), and the action waits
  for it. Memory is at layer granularity, as in FSDP2 (each layer is its own FSDP unit, resharded
  after use): an action holds the unsharded parameters of two layers (the one computing and the
  prefetched next one) from its start to its end. W needs no parameters (it multiplies stored
  inputs by output gradients), so it gathers nothing. After the optimizer step nothing is
  gathered (the next step's forward gathers).

Schedules that keep two copies of a chunk on different ranks (DualPipe) are refused for stages
2 and 3: their copies would have to share one gradient shard per microbatch.

ZeRO-1 and 2 all-gather the updated parameter shards after the optimizer step
(:func:`zero12_gather`; :func:`simtrain.lowering.comms.add_optimizer` runs it after the step, on
the ``dp`` stream). With ``overlap_param_gather`` it moves into the next step's forwards
(:func:`add_overlapped_param_gathers`), as Megatron-Core and Apex do:

* Megatron-Core (``megatron/core/distributed/distributed_data_parallel.py``,
  ``param_and_grad_buffer.py`` at d98e8a6; the same logic in ``pipeline_parallel/schedules.py`` at
  df72712, the revision MLPerf v3.1's NeMo ran): the optimizer step skips the all-gather; a forward
  pre-hook on every module waits for the all-gather of the bucket holding its parameters
  (``finish_param_sync``), so only a chunk's first forward of the step waits, later microbatches find
  it done. With interleaving (``align_param_gather``, default True, forced False without it) the
  schedule dispatches chunks 0 and 1 at its start and chunk k + 1 at the first forward of chunk
  k, at the same moment on every pipeline rank; without interleaving the first forward's pre-hook
  dispatches the first bucket and each wait dispatches the next (one bucket ahead);
* Apex ``DistributedFusedAdam(overlap_param_sync=True)`` (``apex/contrib/optimizers/distributed_fused_adam.py``,
  2023-08 and now; NeMo passes ``param_sync_func = _try_start_bucket_param_sync`` to the same
  schedule, one bucket per virtual stage, ``megatron_gpt_model.py`` at bd0b818): ``step`` starts the
  bucket of the model's first parameters while it steps the rest; a parameter's first use waits for
  its bucket (``_param_copy``) and starts the next.

simtrain at chunk granularity: each rank's held chunks are gathered in the order of their first
forward on the rank, one all-gather per chunk on the rank's ``zero`` stream; the first two at the
step's start (in steady state the previous step's optimizer is done by then), chunk j + 1 at the
forward where Megatron's interleaved schedule dispatches it on that rank (pipeline rank r: its
forward number j x pp - r, when rank 0 begins chunk j; launched there in the rank's host order,
which ``hardware_queues`` follows); the chunk's first forward waits for its chunk. Not modelled,
each with its sign: Megatron without interleaving issues a pipeline rank's first bucket only when
its first forward's input has arrived (simtrain: at the step's start, so on ranks after the first
it hides more); the buckets within a chunk (simtrain's first forward waits for the whole
chunk, Megatron's each layer only for its bucket, so a chunk of several buckets is more exposed in
simtrain, and a one-rank run gains nothing); NeMo/Apex making the compute stream wait for chunk 0's
gather at the step's start before dispatching chunk 1.
Memory does not move: Megatron's distributed optimizer all-gathers into the parameter buffer that
holds the 16-bit parameters all step, and simtrain counts that buffer in the static memory either way.
"""

from __future__ import annotations

from ..network import Collective
from ..schedules.ir import Action, Schedule, SettingsError
from .items import Lowering, add_delta


def check_zero(schedule: Schedule, zero_stage: int, holders: dict[int, tuple[int, ...]]) -> None:
    """Refuse ZeRO stage 2 or 3 with a schedule that keeps two copies of a model chunk.

    Raises:
        SettingsError: naming the schedule, the stage and what is allowed (worded as the flag
            until the entry point words it as the user gave it, :func:`simtrain.schedules.ir.settings_named`).
    """
    if zero_stage >= 2 and any(len(h) > 1 for h in holders.values()):
        raise SettingsError(
            schedule.name, {"zero_stage": zero_stage}, "the schedule keeps two copies of each model chunk "
            "on different ranks, which ZeRO-2/3 cannot shard per microbatch; use {zero_stage} or 1, or a "
            "schedule with one copy (e.g. dualpipev, zbv, 1f1b)", hints={"zero_stage": 0})


def gradient_actions(schedule: Schedule) -> set[Action]:
    """Every action that produces weight gradients: each B and each W of every microbatch."""
    return {a for order in schedule.orders for act in order for a in act.parts if a.kind in ("B", "W")}


def sharded_reduction_bytes(chunk, costs, buckets: int) -> tuple[float, float]:
    """``(produced, reduced)``: the bytes one of a backward's ``buckets`` gradient buckets of
    ``chunk`` holds on its GPU under ZeRO-2/3, first as autograd's unsharded gradient (parameter
    dtype, ``costs.grad_bytes_per_param``), then as the reduce-scatter input (``grad_reduce_dtype``,
    ``costs.grad_reduce_bytes_per_param``). Its parameters: the bucket's share of the chunk's
    trainable ones, at most one layer's (the FSDP unit; module docstring).

    Args:
        chunk: a :class:`simtrain.costs.ChunkCost` (``params``, ``frozen_params``, ``layers``).
        costs: the :class:`simtrain.costs.StageCosts` (bytes per parameter).
        buckets: buckets per backward (``dp_buckets``, >= 1).

    Returns:
        Two byte counts (>= 0).
    """
    trainable = chunk.params - chunk.frozen_params
    unit = trainable / max(buckets, len(chunk.layers), 1)
    return unit * costs.grad_bytes_per_param, unit * costs.grad_reduce_bytes_per_param


def param_bytes(low: Lowering, chunk) -> tuple[float, float]:
    """``(dense, expert)`` bytes of a chunk's parameters on one GPU (16-bit copy, or 32-bit in
    fp32 training)."""
    per = low.costs.grad_bytes_per_param
    return (chunk.params - chunk.expert_params) * per, chunk.expert_params * per


def gather_seconds(low: Lowering, chunk, rank: int) -> float:
    """Seconds of the per-layer all-gathers of ``chunk``'s parameters on ``rank`` (dense over DP,
    routed experts over expert-DP), priced by :meth:`simtrain.network.Topology.seconds`."""
    layers = max(1, len(chunk.layers))
    dense, experts = param_bytes(low, chunk)
    seconds = low.topology.seconds(Collective("all-gather", "dp", dense / layers, repeat=layers), rank)
    if experts > 0:
        seconds += low.topology.seconds(Collective("all-gather", "expert_dp", experts / layers, repeat=layers), rank)
    return seconds


def add_param_gathers(low: Lowering) -> None:
    """ZeRO-3's pass: an all-gather of the chunk's parameters on the ``zero`` stream before every
    F, B and I, prefetched one action ahead (see the module docstring), with its memory."""
    topology = low.topology
    cache: dict[tuple[int, int], float] = {}
    for rank, order in enumerate(low.schedule.orders):
        resources = topology.route(Collective("all-gather", "dp", 0.0), rank).resources
        done: list = []  # the gathering actions of this rank so far, in order
        for act in order:
            for a in act.parts:
                if a.kind == "W" or a not in low.first:
                    continue
                chunk = low.chunk[a.stage]
                key = (a.stage, rank)
                if key not in cache:
                    cache[key] = gather_seconds(low, chunk, rank)
                nbytes = sum(param_bytes(low, chunk))
                held = nbytes * min(1.0, 2 / max(1, len(chunk.layers)))  # two layers unsharded
                gather = low.graph.add(
                    name=f"zero3 all-gather {a}", rank=rank, category="comm", kind="zero", stream="zero",
                    duration_s=cache[key], deps=[low.last[done[-2]].tid] if len(done) >= 2 else [],
                    resources=resources, stage=a.stage, microbatch=a.microbatch, nbytes=nbytes,
                )
                low.first[a].deps.append(gather.tid)
                add_delta(low.first[a], "start", rank, held)
                add_delta(low.last[a], "end", rank, -held)
                done.append(a)


def zero12_gather(low: Lowering, rank: int, chunks) -> tuple[float, tuple[str, ...], float]:
    """ZeRO-1/2's all-gather of the updated trainable parameters of ``chunks`` (chunk indices) on
    ``rank``: dense over DP, routed experts over expert-DP, in the parameter dtype
    (``costs.grad_bytes_per_param``), priced by :meth:`simtrain.network.Topology.seconds`.

    Returns:
        ``(seconds, resources, bytes)``: its duration, the engine ports of its DP route and the
        bytes it gathers on the rank.
    """
    costs, topology = low.costs, low.topology
    experts = sum(costs.chunks[c].expert_params for c in chunks) * costs.grad_bytes_per_param
    dense = sum(costs.chunks[c].params - costs.chunks[c].frozen_params for c in chunks) * costs.grad_bytes_per_param
    dense -= experts
    gather = Collective("all-gather", "dp", dense)
    seconds = topology.seconds(gather, rank)
    if experts > 0:
        seconds += topology.seconds(Collective("all-gather", "expert_dp", experts), rank)
    return seconds, topology.route(gather, rank).resources, dense + experts


def _forwards(low: Lowering, order) -> list[tuple[Action, Action | None]]:
    """``(F, the action before it)`` for every forward in ``order`` (one rank's schedule order)."""
    forwards, before = [], None
    for act in order:
        for a in act.parts:
            if a.kind == "F" and a in low.first:
                forwards.append((a, before))
            before = a
    return forwards


def add_overlapped_param_gathers(low: Lowering) -> None:
    """``overlap_param_gather``'s pass (ZeRO-1/2, dp > 1, training): one all-gather per chunk a rank
    holds, on its ``zero`` stream, the chunk's first forward waiting for it (module docstring).
    Pipeline rank r issues its first two chunks (in first-forward order) at the step's start and
    chunk j >= 2 as it begins its forward number ``(j - 1) x pp - r`` (counted from 0; Megatron's
    interleaved schedule dispatches at virtual microbatch ``v`` with ``v + r`` the first of chunk
    j - 1, the moment rank 0 begins chunk j - 1), and never after its own first forward of chunk
    j - 1. A rank without an optimizer step
    (``costs.optimizer_s`` 0) gathers nothing, as in :func:`simtrain.lowering.comms.add_optimizer`."""
    pp = low.schedule.num_ranks
    for rank, order in enumerate(low.schedule.orders):
        if low.costs.optimizer_s(low.held[rank]) <= 0:
            continue
        forwards = _forwards(low, order)
        seen: dict[int, int] = {}  # chunk -> index of its first forward in ``forwards``
        for i, (a, _) in enumerate(forwards):
            seen.setdefault(low.schedule.chunk_of(a.stage), i)
        firsts = list(seen.values())
        for j, (chunk, i) in enumerate(seen.items()):
            deps = []
            if j >= 2:
                k = min(max(0, (j - 1) * pp - rank), firsts[j - 1])
                at, before = forwards[k]
                deps = list(low.first[at].deps) + ([low.last[before].tid] if before in low.last else [])
            a = forwards[i][0]
            seconds, resources, nbytes = zero12_gather(low, rank, [chunk])
            gather = low.graph.add(
                name=f"zero param all-gather chunk {chunk}", rank=rank, category="comm", kind="zero",
                stream="zero", duration_s=seconds, deps=deps, resources=resources, stage=a.stage, nbytes=nbytes,
            )
            low.first[a].deps.append(gather.tid)
