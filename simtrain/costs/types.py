"""The cost records: :class:`ChunkCost` (one model chunk, one microbatch, one GPU) and
:class:`StageCosts` (every chunk plus per-parameter rates). See :mod:`simtrain.costs`."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ..errors import SimtrainError
from ..moe import MoEChunkCost
from ..network import Collective

OPTIMIZER_BYTES_PER_PARAM = 28
"""HBM bytes an Adam step reads and writes per parameter it updates (grad, master weight, m, v
read; master weight, m, v, 16-bit weight written): the step is memory-bound, at the HBM bandwidth
or a calibrated profile's measured optimizer rate (``compute.optimizer_gb_per_s``)."""


def static_parts_per_param(weight_bytes: float, optimizer_bytes: float, zero_stage: int,
                           shard: int, grad_bytes: float | None = None) -> tuple[float, float, float]:
    """HBM bytes per parameter of (the parameter, its gradient, its optimizer states).

    Rajbhandari et al. 2020, "ZeRO", §5.1-5.3 (Figure 1): with ``Psi`` parameters, a 16-bit
    parameter and gradient (2 + 2 bytes) and ``K`` optimizer bytes, stage 0 keeps ``2+2+K``,
    stage 1 ``2+2+K/N``, stage 2 ``2+(2+K)/N`` and stage 3 ``(2+2+K)/N`` per parameter for a
    shard group of N GPUs. (Unsharded buffers of stages 2 and 3, gathered parameters and the
    gradient of one backward, are transient memory: :mod:`simtrain.lowering.zero`.)

    Args:
        weight_bytes: bytes of a parameter (and of its gradient) in the compute copy.
        optimizer_bytes: optimizer bytes per parameter (K; 12 for mixed-precision Adam).
        zero_stage: 0 to 3.
        shard: GPUs the sharded states are split over (the DP degree, or expert-DP).
        grad_bytes: bytes of the kept gradient when it is wider than the parameter (an fp32
            accumulation buffer, ``ParallelConfig.grad_reduce_dtype``: Megatron-LM's fp32
            ``main_grad``; DeepSpeed's BF16_Optimizer also keeps the 16-bit gradient, not
            counted); None: ``weight_bytes``. Not under ZeRO-3, whose sharded gradient
            belongs to the fp32 master parameter the optimizer bytes already count.

    Returns:
        ``(parameter, gradient, optimizer)`` bytes per parameter.
    """
    n = shard if zero_stage >= 1 else 1
    params = weight_bytes / n if zero_stage >= 3 else weight_bytes
    kept = weight_bytes if grad_bytes is None or zero_stage >= 3 else max(grad_bytes, weight_bytes)
    grads = kept / n if zero_stage >= 2 else kept
    return params, grads, optimizer_bytes / n


def static_bytes_per_param(weight_bytes: float, optimizer_bytes: float, zero_stage: int, shard: int,
                           grad_bytes: float | None = None) -> float:
    """The sum of :func:`static_parts_per_param`: parameter + gradient + optimizer bytes per
    parameter (same arguments)."""
    return sum(static_parts_per_param(weight_bytes, optimizer_bytes, zero_stage, shard, grad_bytes))


def grad_accumulate_bytes_per_param(weight_bytes: int, reduce_bytes: int | None, microbatches: int,
                                    zero_stage: int = 0) -> float:
    """HBM bytes per trainable parameter per microbatch that gradient accumulation moves (in W).

    * Gradients accumulated in the weight dtype (``reduce_bytes`` None or equal): ``grad += new``
      after the first microbatch: read both, write one, ``(m-1)/m x 3 x weight_bytes`` on average.
    * A wider accumulator (``reduce_bytes`` > ``weight_bytes``, e.g. fp32 for bf16): every
      microbatch casts the new gradient (read ``weight_bytes``, write ``reduce_bytes``) and adds
      it (read two, write one of ``reduce_bytes``), as DeepSpeed's ``BF16_Optimizer.update_hp_grads``
      does (``hp_grad.add_(lp.grad.to(hp_grad.dtype))`` after each microbatch's backward;
      ``deepspeed/runtime/bf16_optimizer.py``, 2022): ``weight_bytes + 4 x reduce_bytes``.
    * ZeRO-3 with a wider reduce type (FSDP2's ``reduce_dtype``): no unsharded accumulator; each
      backward's gradient is cast into the reduce-scatter's input buffer (read ``weight_bytes``,
      write ``reduce_bytes``; torch FSDP2 ``foreach_reduce``): ``weight_bytes + reduce_bytes``.

    Args:
        weight_bytes: bytes of the 16- or 32-bit gradient a backward writes.
        reduce_bytes: bytes per element of the accumulator, or None (the weight dtype).
        microbatches: microbatches per step (>= 1).
        zero_stage: the ZeRO stage (3: the reduce-scatter cast above).

    Returns:
        Bytes per parameter per microbatch.
    """
    if reduce_bytes is None or reduce_bytes <= weight_bytes:
        return (microbatches - 1) / microbatches * 3 * weight_bytes
    return weight_bytes + reduce_bytes if zero_stage >= 3 else weight_bytes + 4 * reduce_bytes


@dataclass(frozen=True)
class ChunkCost:
    """Costs of one model chunk (a pipeline stage) for one microbatch on one GPU.

    Attributes:
        chunk: model chunk index (0 = holds the embedding).
        layers: transformer layer indices in this chunk.
        has_embedding, has_head: whether it holds the input embedding / the LM head and loss.
        forward_s, backward_input_s, backward_weight_s: compute seconds of F, I and W
            (I includes recomputation when enabled); B = I + W.
        tp_forward, tp_backward: the tensor-parallel collectives F and I (or B) issue, declared,
            not priced (:meth:`simtrain.network.Topology.seconds` prices them).
        forward_flops, backward_input_flops, backward_weight_flops: model FLOPs on this GPU
            (no recomputation), for MFU.
        activation_bytes: bytes stored by F and held until the backward.
        weight_grad_bytes: bytes of that which W still needs after I (freed by W).
        p2p_bytes: bytes of the activation this chunk sends on (= the gradient it receives).
        params: parameters held by this GPU for this chunk.
        expert_params: how many of ``params`` are routed-expert parameters sharded over EP
            (reduced over the expert-data-parallel group; 0 when ep = 1).
        frozen_params: how many of ``params`` are frozen: no gradient, no optimizer state, no DP
            reduction (:mod:`simtrain.costs.trainable`).
        moe: the chunk cut around its MoE blocks (ep > 1 and at least one MoE layer), else None.
        full_backward_s: seconds of a full backward B when it differs from I + W (a runtime whose
            split backward costs more than a full one, see ``layer_slowdown``); None means I + W.
        cp_forward, cp_backward: the context-parallel collectives of F and of I (or B), declared
            (:mod:`simtrain.costs.context`).
        cp_hide_forward_s, cp_hide_backward_s: attention seconds of F / I that can hide them (ring
            attention); the lowering exposes only what they do not hide.
        gemm_s: seconds of F, I (with what recomputation reruns) and W spent in the transformer
            layers' linear GEMMs, the GEMMs next to the TP collectives that ``--tp-overlap`` hides
            behind (:func:`simtrain.lowering.chains.tp_seconds`); None where unknown (the action's
            whole compute is then the window).
        compute_bound_fraction: share of the seconds of F, I and W spent in compute-bound
            operators (the per-operator model's ``bound == "compute"`` rows), the share a kernel
            taking SMs slows (:mod:`simtrain.lowering.nccl_sms`); 1 under the flat model, where
            every second is GEMM-rated.
        recv_buffer_bytes: receive buffers the pipeline runtime holds all step for this chunk
            (``ParallelConfig.pp_buffers``, :mod:`simtrain.costs.pipelining`); 0 by default.
    """

    chunk: int
    layers: tuple[int, ...]
    has_embedding: bool
    has_head: bool
    forward_s: float
    backward_input_s: float
    backward_weight_s: float
    forward_flops: float
    backward_input_flops: float
    backward_weight_flops: float
    activation_bytes: float
    weight_grad_bytes: float
    p2p_bytes: float
    params: float
    expert_params: float = 0.0
    frozen_params: float = 0.0
    moe: MoEChunkCost | None = None
    full_backward_s: float | None = None
    tp_forward: tuple[Collective, ...] = ()
    tp_backward: tuple[Collective, ...] = ()
    cp_forward: tuple[Collective, ...] = ()
    cp_backward: tuple[Collective, ...] = ()
    cp_hide_forward_s: float = 0.0
    cp_hide_backward_s: float = 0.0
    gemm_s: tuple[float, float, float] | None = None
    compute_bound_fraction: tuple[float, float, float] = (1.0, 1.0, 1.0)
    recv_buffer_bytes: float = 0.0

    @property
    def backward_s(self) -> float:
        """Full backward compute seconds: B = I + W (unless ``full_backward_s`` says otherwise)."""
        if self.full_backward_s is not None:
            return self.full_backward_s
        return self.backward_input_s + self.backward_weight_s

    @property
    def model_flops(self) -> float:
        """Model FLOPs of F + I + W for one microbatch on this GPU."""
        return self.forward_flops + self.backward_input_flops + self.backward_weight_flops


@dataclass(frozen=True)
class StageCosts:
    """Costs of every model chunk plus what is per parameter.

    Attributes:
        chunks: one :class:`ChunkCost` per model chunk, in model order.
        static_bytes_per_param: parameter + gradient + optimizer bytes per parameter held.
        grad_bytes_per_param: bytes per parameter of the gradient (and of the parameter copy
            ZeRO-3 gathers).
        optimizer_temp_bytes_per_param: bytes per held parameter of one chunk's optimizer that
            the optimizer step allocates for its duration (``ParallelConfig.optimizer_impl``
            ``foreach``: 4, divided by the ZeRO shard; 0 when fused).
        static_parts_per_param: (parameter, gradient, optimizer) bytes per dense parameter held
            (:func:`static_parts_per_param`, sharded as the ZeRO stage says), for the memory
            breakdown; None: one unsharded copy each of parameter and gradient.
        optimizer_s_per_param: seconds of the optimizer step per parameter held.
        tokens_per_microbatch: b x s.
        fixed_op_times: True when durations were replaced by ``--op-times``.
        expert_static_bytes_per_param, expert_optimizer_s_per_param: the same for routed-expert
            parameters, whose optimizer states ZeRO-1 shards over the expert-DP group (None: as
            for the other parameters).
        tied_embedding_params: parameters per GPU of a word-embedding matrix that the first and
            the last chunk both hold (tied embeddings, or MTP modules embedding the next tokens,
            with more than one chunk), whose gradients the two all-reduce every step; 0 when the
            last chunk needs no copy. A rank holding both chunks (DualPipe, V-shape schedules)
            keeps one physical matrix (DeepSeek-V3 §3.2.3): counted once (:meth:`held_params`).
        tied_embedding_frozen: that matrix is frozen (LoRA).
        frozen_static_bytes_per_param: bytes per frozen parameter (the weight alone; sharded
            under ZeRO-3); frozen parameters take no optimizer time.
        lazy_grad_bytes_per_param: gradient bytes per trainable parameter held from the start of
            its chunk's first B or W on the rank rather than all step (``grad_allocation:
            first-backward``); 0: every gradient is static.
        grad_reduce_bytes: bytes per gradient element the DP reduction (all-reduce, or ZeRO-2/3's
            reduce-scatter and unsharded buckets) and the tied-embedding sync move
            (``ParallelConfig.grad_reduce_dtype``); None: ``grad_bytes_per_param``.
    """

    chunks: tuple[ChunkCost, ...]
    static_bytes_per_param: float
    grad_bytes_per_param: float
    optimizer_s_per_param: float
    tokens_per_microbatch: int
    fixed_op_times: bool = False
    expert_static_bytes_per_param: float | None = None
    expert_optimizer_s_per_param: float | None = None
    tied_embedding_params: float = 0.0
    tied_embedding_frozen: bool = False
    frozen_static_bytes_per_param: float = 0.0
    static_parts_per_param: tuple[float, float, float] | None = None
    optimizer_temp_bytes_per_param: float = 0.0
    grad_reduce_bytes: float | None = None
    lazy_grad_bytes_per_param: float = 0.0

    def lazy_grad_bytes(self, chunks: set[int] | list[int]) -> float:
        """Of :meth:`static_bytes`, the gradient bytes of ``chunks`` that a rank allocates only at
        each chunk's first B or W (``ParallelConfig.grad_allocation``; 0 when static)."""
        return sum(self.chunks[c].params - self.chunks[c].frozen_params for c in chunks) * self.lazy_grad_bytes_per_param

    def recv_buffer_bytes(self, chunks: set[int] | list[int]) -> float:
        """Pipeline receive buffers a rank holding ``chunks`` keeps all step (bytes)."""
        return sum(self.chunks[c].recv_buffer_bytes for c in chunks)

    def optimizer_temp_bytes(self, chunks: set[int] | list[int]) -> float:
        """Transient bytes of the optimizer step of a rank holding ``chunks``: the largest chunk's
        (one optimizer per chunk, stepped in turn; trainable parameters only)."""
        return max((self.chunks[c].params - self.chunks[c].frozen_params for c in chunks), default=0.0) \
            * self.optimizer_temp_bytes_per_param

    @property
    def grad_reduce_bytes_per_param(self) -> float:
        """Bytes per parameter that the DP gradient reduction and the tied-embedding sync move."""
        return self.grad_bytes_per_param if self.grad_reduce_bytes is None else self.grad_reduce_bytes

    def _shared_copy(self, chunks) -> float:
        """Parameters of ``chunks`` counted twice: the last chunk's copy of the embedding matrix when
        the first chunk is among them too (one matrix on the rank, DeepSeek-V3 §3.2.3); else 0."""
        last = len(self.chunks) - 1
        held = set(chunks)
        return self.tied_embedding_params if last > 0 and 0 in held and last in held else 0.0

    def held_params(self, chunks: set[int] | list[int], trainable: bool = False) -> float:
        """Parameters one GPU holds for ``chunks`` (a shared embedding matrix counted once);
        ``trainable``: only those that have gradients (frozen ones left out)."""
        copy = self._shared_copy(chunks)
        if trainable:
            return sum(self.chunks[c].params - self.chunks[c].frozen_params for c in chunks) \
                - (0.0 if self.tied_embedding_frozen else copy)
        return sum(self.chunks[c].params for c in chunks) - copy

    def _per_param(self, chunks, dense_rate: float, expert_rate: float | None, frozen_rate: float = 0.0) -> float:
        """Sum over ``chunks`` of trainable dense parameters x ``dense_rate`` + routed-expert
        parameters x ``expert_rate`` (``dense_rate`` when None) + frozen ones x ``frozen_rate``
        (a shared embedding matrix counted once)."""
        expert_rate = dense_rate if expert_rate is None else expert_rate
        total = -self._shared_copy(chunks) * (frozen_rate if self.tied_embedding_frozen else dense_rate)
        for c in chunks:
            ch = self.chunks[c]
            total += (ch.params - ch.expert_params - ch.frozen_params) * dense_rate + ch.expert_params * expert_rate
            if ch.frozen_params:
                total += ch.frozen_params * frozen_rate
        return total

    def static_bytes(self, chunks: set[int] | list[int]) -> float:
        """Parameter + gradient + optimizer bytes of the given chunks on one GPU."""
        return self._per_param(chunks, self.static_bytes_per_param, self.expert_static_bytes_per_param,
                               self.frozen_static_bytes_per_param)

    def optimizer_s(self, chunks: set[int] | list[int]) -> float:
        """Seconds of the optimizer step for the given chunks on one GPU."""
        return self._per_param(chunks, self.optimizer_s_per_param, self.expert_optimizer_s_per_param)

    def with_op_times(self, forward_s: float, backward_input_s: float, backward_weight_s: float) -> StageCosts:
        """Copy with every chunk's F, I, W replaced by fixed seconds (TP and optimizer time 0).

        This is the papers' analysis setting: one action (one microbatch through one chunk) takes
        a fixed time, with no MoE sub-operations. Memory and message sizes keep coming from the
        model.

        Raises:
            SimtrainError: a time is negative, or all three are zero.
        """
        times = (forward_s, backward_input_s, backward_weight_s)
        if not all(math.isfinite(t) and t >= 0 for t in times) or sum(times) <= 0:
            raise SimtrainError(
                f"op-times F,I,W = {','.join(map(str, times))}: each must be a finite number >= 0 "
                "seconds and at least one > 0"
            )
        chunks = tuple(
            replace(
                c,
                forward_s=forward_s,
                backward_input_s=backward_input_s,
                backward_weight_s=backward_weight_s,
                tp_forward=(),
                tp_backward=(),
                cp_forward=(),
                cp_backward=(),
                moe=None,
                full_backward_s=None,
            )
            for c in self.chunks
        )
        return replace(self, chunks=chunks, optimizer_s_per_param=0.0, fixed_op_times=True)
