"""Parallel configuration: how one training step is split over GPUs.

The GPUs of one job are ``tp x cp x pp x dp``. Rank numbering follows the Llama 3 paper's order
[TP, CP, PP, DP] (Dubey et al. 2024, arXiv:2407.21783 §3.3.2): TP is innermost, so a TP group
sits inside one node when ``tp <= gpus_per_node``; the context-parallel group is the next ``cp``
TP groups (inside one node when ``tp x cp <= gpus_per_node``: CP placed inside a node first);
consecutive pipeline stages follow; DP is outermost. GPU
``g = ((dp_idx * pp + pp_idx) * cp + cp_idx) * tp + tp_idx`` sits on node ``g // gpus_per_node``.
The CP ranks of a stage hold the same parameters, so gradients are reduced (and ZeRO states
sharded) over the ``dp x cp`` GPUs (Megatron-Core's data-parallel group "with context
parallelism", ``parallel_state.get_data_parallel_group(with_context_parallel=True)``).

With expert parallelism (``ep > 1``), or ``rank_order: tp-dp-pp``, the order is Megatron-Core's default ``tp-cp-ep-dp-pp``
(``megatron/core/parallel_state.py``, ``RankGenerator``; no CP here): PP is outermost, so the
``dp x tp`` GPUs of one pipeline stage are consecutive and an EP group (``ep`` consecutive of them,
carved out of the data-parallel ranks) fills whole nodes, as in DeepSeek-V3's EP 64 over 8 nodes
(arXiv:2412.19437 §3.1). GPU ``g = (pp_idx * dp + dp_idx) * tp + tp_idx``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from .errors import NumbersNotBooleans
from .hardware import Dtype
from .models import MAX_DIM
from .setting_strings import parse_offload, parse_trainable

MAX_COUNT = MAX_DIM
"""Largest degree, microbatch count or size and sequence length (2**31 - 1, the bound of a model's
dimensions and of its ``seq_len``): larger values can only be a mistake."""

DTYPE_BYTES = {"fp64": 8, "fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 2}
"""Bytes per stored activation / parameter element in each compute dtype (FP8 training keeps
activations and the parameter copy used by the kernels in 16-bit)."""


GroupDim = Literal["tp", "cp", "dp", "ep", "expert_dp"]
"""The parallel dimensions a collective can run over."""


@dataclass(frozen=True)
class Group:
    """A communication group of one parallel dimension, seen from one simulated GPU.

    Attributes:
        dim: the dimension (``tp``, ``dp``, ``ep``, ``expert_dp``).
        size: GPUs taking part (n of the ring formulas).
        span: lowest and highest GPU id whose placement decides the route (one node or not;
            nodes hold consecutive GPU ids, so these two decide it).
    """

    dim: str
    size: int
    span: tuple[int, int]


MAX_GPUS = 1 << 24
"""The largest world simtrain simulates (16.8 M GPUs, far above the largest training clusters, ~1e5 GPUs):
the group placements it prices hold one index per GPU of a group."""


def flag_name(field: str, value: object) -> str:
    """How an error names a :class:`ParallelConfig` setting typed as a command-line flag:
    ``flag_name("microbatch_size", 4)`` is ``"--microbatch-size 4"``. Checks that take a ``name``
    argument (e.g. :func:`simtrain.moe.check_expert_parallel`) default to it; a scenario file's
    loader passes one naming the file and field instead (:func:`simtrain.cli.settings.setting_name`)."""
    return f"--{field.replace('_', '-')} {value}"


def subject(name: Callable[[str, object], str], field: str, value: object) -> str:
    """A refused setting as the subject of its message, worded by ``name`` (:func:`flag_name`, a
    file's :func:`file_field_name`, the API's :func:`simtrain.api.argument_name`); a flag reads
    ``--cost-model = 'fast'``, the command line's form for a value it refuses."""
    said = name(field, value)
    return f"--{field.replace('_', '-')} = {value!r}" if said == flag_name(field, value) else said


def file_field_label(source: str, field: str, names: dict[str, str] | None = None) -> str:
    """How an error names a setting read from a file, without its value: ``s.yaml: field
    'parallel.ep'``; ``names`` maps a field to the file's own name of it (an imported Megatron
    job's ``--expert-model-parallel-size``)."""
    own = (names or {}).get(field, f"field 'parallel.{field}'")
    return f"{source}: {own}"


def file_field_name(source: str, names: dict[str, str] | None = None) -> Callable[[str, object], str]:
    """How an error names a setting read from a file and its value, as :func:`flag_name` names a
    flag: ``file_field_name("s.yaml")("ep", 4)`` is ``"s.yaml: field 'parallel.ep' = 4"``
    (:func:`file_field_label`)."""
    return lambda field, value: f"{file_field_label(source, field, names)} = {value!r}"


class ParallelConfig(NumbersNotBooleans):
    """Degrees of parallelism and the shape of one training step.

    Attributes:
        tp, pp, dp, ep: tensor, pipeline, data and expert parallel degrees; EP groups are carved
            out of the ``dp x tp`` GPUs of a stage (ep must divide dp x tp; checked by
            :func:`simtrain.moe.check_expert_parallel` against the model).
        cp: context-parallel degree: each sequence is split over ``cp`` GPUs (not with ep > 1).
        cp_kind: how attention sees the whole sequence (:mod:`simtrain.costs.context`): ``ring``
            (KV blocks passed around the CP ring, overlapped with blockwise attention; Liu et al.
            2023), ``ulysses`` (all-to-all of heads before and after attention; Jacobs et al.
            2023) or ``allgather`` (all-gather of K and V, Llama 3 §3.3.2).
        cp_impl: whose CP code runs: ``te`` (Megatron-Core / Transformer Engine, what ``cp_kind``
            describes) or ``torch`` (torch's ``context_parallel``, as torchtitan uses it: every
            head's K and V on the wire, partial outputs merged and dK/dV accumulated in fp32, the
            collectives overlapped with the attention calls; :mod:`simtrain.costs.context`; the
            merges: :mod:`simtrain.costs.cp_merge`, per-operator cost model only).
        vp: virtual stages (model chunks) per pipeline rank, for interleaved schedules.
        microbatches: microbatches per step per DP replica (m).
        microbatch_size: sequences per microbatch (b).
        seq_len: tokens per sequence (s); None means the model's default.
        dtype: compute dtype of the GEMMs (selects the profile's peak rate).
        zero_stage: ZeRO stage (Rajbhandari et al. 2020, "ZeRO", §5): 0 plain DP; 1 optimizer
            states sharded over DP; 2 also gradients (reduce-scattered after every backward); 3
            also parameters (FSDP: all-gathered per layer before each F and B, see
            :mod:`simtrain.lowering.zero`).
        recompute: activation recomputation (Korthikanti et al. 2022): ``none`` stores everything,
            ``selective`` reruns the attention core in the backward (Megatron's core_attn); with
            ``flash`` that costs the kernel's forward again and frees nothing (no scores are stored),
            ``full`` stores only each layer's input and reruns its forward in the backward. A
            scenario file (and the Python API) also takes ``every-second-mm`` or a module list such
            as ``norm,swiglu`` for the per-operator cost model (:mod:`simtrain.costs.recompute`, as
            ``compare --recompute``); its loader keeps that for the cost model and sets this to ``none``.
        attention: the attention kernel: ``flash`` (a fused kernel, FlashAttention; Dao 2023,
            FlashAttention-2, §3.1: the forward keeps only the softmax log-sum-exp per query row
            and head, the backward recomputes the scores, so no score matrix is stored whatever
            ``recompute`` says) or ``unfused`` (materialised scores, Megatron-LM 2021 / BLOOM:
            stored unless recomputed). The per-operator cost model also prices the kernel by it.
            None: the hardware profile's default (:meth:`simtrain.hardware.HardwareProfile.attention_kernel`).
        attention_kernel: which fused kernel a ``flash`` attention runs, priced from its measured
            rates by the per-operator model (``op_data.yaml``, :mod:`simtrain.costs.kernels`):
            ``fa2``, ``fa3``, ``fa4`` (FlashAttention-2/3/4) or ``cudnn`` (cuDNN's, Transformer
            Engine's FusedAttention); None: the GPU kind's default, what the common framework picks
            there (``cudnn`` on H100-class sm_90 GPUs, TE and torch >= 2.11 SDPA alike; ``fa2`` on A100).
        activation_cache: dtype of the activations saved for the linear layers' backward:
            ``compute`` (the compute dtype) or ``fp8`` (E4M3 with a 1 x 128-tile scale, DeepSeek-V3
            §3.3.2 "low-precision storage": the inputs of the linear layers, in the stored
            activations and in what a deferred W holds; output gradients, norms' and the
            activation function's inputs stay in the compute dtype).
        sequence_parallel: Megatron sequence parallelism with TP (activations sharded by tp).
        w_pending: what a split backward keeps from I until W: ``gemm-io``, every linear layer's
            input and the gradient of its output (Qi et al. 2023, "Zero Bubble Pipeline
            Parallelism", Table 1, M_W; their Megatron implementation); ``autograd``, the whole
            autograd graph of the stage, i.e. every stored activation, plus those output
            gradients, as torch.distributed.pipelining does (``stage_backward_input`` runs
            ``torch.autograd.grad(..., retain_graph=True)`` and keeps the graph's intermediate
            nodes and their gradients until ``stage_backward_weight``).
        dp_buckets: gradient buckets per pipeline stage for the DP all-reduce.
        overlap_param_gather: ZeRO-1/2's parameter all-gather overlapped with the next step's
            forwards instead of run after the optimizer step (Megatron-Core
            ``DistributedDataParallelConfig.overlap_param_gather``, Apex
            ``DistributedFusedAdam(overlap_param_sync=True)``; both default False): in steady state
            each held chunk's all-gather runs during the step's first forwards and the chunk's
            first forward waits for it (:func:`simtrain.lowering.zero.add_overlapped_param_gathers`).
            Not with zero_stage 0 (Megatron-LM refuses it without the distributed optimizer or
            Megatron-FSDP, ``arguments.py``); with zero_stage 3 nothing changes (ZeRO-3 gathers
            before each action).
        optimizer_impl: how the Adam step runs: ``fused``, one kernel per tensor list that
            updates in place (apex / Transformer Engine FusedAdam as Megatron-LM uses, torch's
            ``fused=True``): no temporary; ``foreach``, torch.optim.Adam/AdamW's multi-tensor
            path (``_multi_tensor_adamw``: ``exp_avg_sq_sqrt = torch._foreach_sqrt(...)``), which
            holds one fp32 temporary per parameter of the optimizer while it steps. torchtitan
            passes ``foreach = not optimizer.fused`` with ``fused`` False by default and builds
            one optimizer per pipeline stage (``OptimizersContainer``), stepped one after another.
        grad_allocation: when a rank's gradient memory exists: ``static``, all step (Megatron's
            and DDP's contiguous gradient buffers, allocated once); ``first-backward``, torch
            without a DDP/FSDP wrapper: ``param.grad`` is None until ``AccumulateGrad`` (or, for a
            split backward, ``stage_backward_weight``'s ``weight.grad = dw``) first writes it, and
            the optimizers' ``zero_grad()`` (``set_to_none=True`` by default since torch 2.0)
            drops it before every step's forwards, so each chunk's gradients are allocated at the
            end of its first B or W on the rank (:mod:`simtrain.lowering.grads`) and held to
            the step's end. Needs zero_stage 0 and dp 1.
        pp_buffers: the pipeline runtime's activation buffers: ``per-transfer``, none beyond the
            stage inputs (a receive allocates the input; a sent output is dropped, as Megatron-LM's
            ``deallocate_output_tensor``); ``per-microbatch``, torch.distributed.pipelining's
            ``PipelineStage``: one input and one output-gradient receive buffer per microbatch,
            held all step, and each forward's output kept until its backward
            (:mod:`simtrain.costs.pipelining`).
        grad_reduce_dtype: the dtype gradients are accumulated over microbatches in and reduced
            over DP (and between the tied-embedding stages) in; None: the weight-gradient dtype
            (16-bit in bf16/fp16 mixed precision). ``fp32`` is DeepSpeed's ``BF16_Optimizer``
            (``update_hp_grads`` adds each microbatch's bf16 gradient into an fp32 buffer, which
            ``get_grads_for_reduction`` hands to the DP all-reduce; ``deepspeed/runtime/bf16_optimizer.py``,
            2022) and Megatron-LM's ``--accumulate-allreduce-grads-in-fp32``; also FSDP2's
            ``MixedPrecisionPolicy(reduce_dtype=torch.float32)`` that torchtitan passes
            (``parallelize_llama.py``, ``mixed_precision_reduce`` default ``float32``), where it
            sets ZeRO-2/3's reduce-scatter and unsharded gradient buckets too.
        grad_reduce_op: the DP gradient collective: ``all-reduce`` or ``reduce-scatter``; None: by
            ZeRO stage (reduce-scatter from ZeRO-1 on). DeepSpeed's pipeline engine with the
            ``BF16_Optimizer`` all-reduces the whole gradient although the optimizer states are
            sharded (``_exec_reduce_grads`` -> ``buffered_allreduce_fallback``, then an all-gather
            of the updated bf16 partitions): ``zero_stage: 1`` with ``grad_reduce_op: all-reduce``.
        p2p_mode: ``async``: a pipeline send runs beside the sender's next compute (torch's
            ``isend``/``irecv``); ``blocking``: DeepSpeed's pipeline engine, whose ``p2p.send`` /
            ``p2p.recv`` are synchronous (``assert async_op == False``) and whose
            ``TrainSchedule`` orders each step's sends and receives so that paired ranks meet
            (:mod:`simtrain.lowering.blocking`); 1F1B training steps only (a
            ``forward_only`` step keeps ``async``).
        launch_blocking: ``CUDA_LAUNCH_BLOCKING=1`` (BLOOM-176B's training environment,
            bigscience ``train/tr11-176B-ml/README.md``): every kernel launch waits for the kernel,
            so the host's per-kernel time adds to every kernel instead of hiding behind the
            previous one (the ``launch`` row of :mod:`simtrain.costs.ops`).
        kernels: how the memory-bound operators run under the per-operator cost model: ``fused``
            (one kernel each: Megatron's fused norm, rotary and SwiGLU, or ``torch.compile``) or
            ``eager`` (PyTorch eager ops, e.g. torchtitan without ``compile``: fp32 casts and one
            kernel per op; :func:`simtrain.costs.eager.eager_factors`). ``eager`` also stores
            what autograd saves in an eager torchtitan Llama block (Python RMSNorm, k and v
            repeated to all heads, SiLU's output; :mod:`simtrain.costs.saved`) instead of
            Korthikanti et al.'s fused count (full recompute still stores only each layer's
            input); ``compare`` and the Python API refuse ``eager`` and ``compiled-blocks`` where
            the flat cost model prices the durations. ``compiled-blocks``: ``torch.compile`` on each
            transformer block alone (torchtitan's ``apply_compile`` at ``9dec370``, whose
            ``train.py`` leaves the loss uncompiled): the blocks fused, the head's norm and fp32
            cross-entropy as eager ops.
        zero_impl: how ZeRO-3's gathered parameters are laid out: ``flat`` (views into the
            all-gather's flat buffer: DeepSpeed, FSDP1's FlatParameter; nothing copied) or ``fsdp2``
            (torch ``fully_shard``: per-parameter shards, copied out of the flat buffer on the
            compute stream before each F and I; :func:`simtrain.costs.ops._fsdp2_copy_out`).
        dispatch_dtype: element type of the EP dispatch all-to-all (``fp8`` as in DeepSeek-V3
            §3.3.2; the combine always moves activations of the compute dtype, BF16 for bf16/fp8).
        expert_imbalance: load of the most loaded EP rank / the mean (>= 1; 1 = uniform routing).
        node_limit: node-limited routing, the most nodes a token is sent to (DeepSeek-V3 §2.1.2
            uses 4); None sends every token-expert pair directly.
        ep_comm_sms: SMs the EP dispatch / combine kernels occupy while they run (default 20:
            DeepEP's ``Buffer.num_sms``, deepseek-ai/DeepEP ``deep_ep/buffer.py``; DeepSeek-V3
            §3.2.2); compute overlapped with them runs on the rest (:mod:`simtrain.costs.ep_sms`).
            0: communication takes no SMs.
        nccl_channels: CTAs (SMs) of every NCCL collective, the run's ``NCCL_MAX_NCHANNELS`` /
            ``NCCL_MIN_NCHANNELS`` (or ``config.maxCTAs``); None: the profile's
            ``nccl_channels`` (:mod:`simtrain.lowering.nccl_sms`); 0: collectives take no SMs.
        ep_kernel: which kernels run the EP dispatch / combine: ``nccl`` (Megatron-Core's
            ``alltoall`` token dispatcher, ``torch.distributed.all_to_all_single``: its NIC part at
            the profile's ``inter_node.alltoall_efficiency``) or ``fused`` (DeepEP / HybridEP's
            own kernels: the NIC at ``inter_node.efficiency``, as their measurements in
            :mod:`simtrain.deepep` count it).
        expert_gemm: how the routed experts' GEMMs run (:mod:`simtrain.costs.moe_ops`):
            ``grouped``, one grouped kernel of all local experts (DeepGEMM's grouped GEMMs), at the
            GEMM table's batched rate; ``multi-stream``, Transformer Engine's ``GroupedLinear`` on
            Hopper (Megatron-Core ``TEGroupedMLP``): one cuBLAS GEMM per local expert, each at
            its own shape's single-GEMM rate, one kernel each (:mod:`simtrain.costs.unfused`).
        rope_fusion: False runs the rotary embedding as Megatron-Core's unfused eager ops
            (``_apply_rotary_pos_emb_bshd``; Megatron-Bridge turns the fusion off for YaRN;
            :mod:`simtrain.costs.unfused`). Not with ``kernels: eager``, which prices it already.
        bias_dropout_fusion: False (Megatron-Core's ``bias_dropout_fusion``) adds a linear layer's
            bias before the residual add in a kernel of its own (models with biases;
            :mod:`simtrain.costs.unfused`).
        fused_projections: True runs the Q, K, V projections as one GEMM and the SwiGLU gate and up
            projections as another (Megatron-Core's ``linear_qkv`` and ``linear_fc1``); False runs
            each as its own linear layer on the same input, as torchtitan's Llama does (``wq``,
            ``wk``, ``wv``; ``w1``, ``w3``): a GEMM at each one's shape, and in I the input
            gradients summed by a memory-bound kernel (:mod:`simtrain.costs.projections`;
            per-operator cost model only).
        a2a_links: ``shared``: dispatch and combine use the same link ports (a symmetric
            all-to-all loads both directions of every port); ``separate``: the combine gets its
            own lanes (the idealised full-duplex model of Waved-EP's flow shop).
        waves: expert waves per MoE layer for ``+waved-ep`` schedules (None: min(4, local
            experts)).
        moe_coarsen: an approximation for speed, off at 1 (the default, the exact model). ``K > 1``
            lowers each run of ``K`` consecutive MoE layers of a chunk as one block (their compute,
            then one dispatch / experts / combine carrying the ``K`` layers' bytes, latencies and
            expert time; :func:`simtrain.lowering.moe.coarsen`) and each all-to-all wave as one
            task holding the NVLink and NIC ports for as long as its slower part lasts
            (:func:`simtrain.lowering.moe.transfers`); a few times fewer tasks. A lone
            action lasts as long as the exact one; what moves is how a pair's halves and other
            traffic overlap the all-to-alls, and NVLink utilisation, reported as busy while the
            NIC part runs. Error against the exact run: ``benchmarks/bench_speed.py --coarsen 4``
            (DeepSeek-V3, K = 4: DualPipe + Waved-EP m = 64, 239k tasks exact, 43k and step time
            +2.6 %; m = 128 +3.2 %; DualPipe alone m = 64 +8.6 %, m = 128 +10.2 %, where each
            pair's halves overlap their own all-to-alls, which a block of 4 layers coarsens most).
        forward_only: simulate forward passes only (inference / RL rollout step): HBM holds the
            weights alone, no gradients and no optimizer states.
        rank_order: how GPU ids are numbered, innermost first: ``tp-pp-dp`` (Llama 3's order)
            or ``tp-dp-pp`` (PP outermost: Megatron-Core's order with EP, and DeepSpeed's
            ``PipeModelDataParallelTopology``, axes ``['pipe', 'data', 'model']``, which BLOOM's
            Megatron-DeepSpeed uses). None: ``tp-dp-pp`` when ``ep > 1``, else ``tp-pp-dp``.
            Megatron-LM, NeMo and Megatron-Bridge runs should set ``tp-dp-pp`` (their default,
            unless ``use_tp_pp_dp_mapping``); with TP < GPUs per node it decides which GPUs share one.
        trainable: which parameters train (:mod:`simtrain.costs.trainable`): ``all``;
            ``lora:RANK`` (every linear layer's base weight frozen, a rank-RANK adapter trains;
            Hu et al. 2021, "LoRA", §4); ``frozen-layers:LIST`` (the listed transformer layers,
            e.g. ``0-15,20``, frozen). Frozen parameters have no W pass, no gradient and no
            optimizer state.
        offload: activation offload (:mod:`simtrain.lowering.offload`; PipeOffload, Wan et al.,
            ICML 2025, arXiv:2503.01328; Megatron-Core's fine-grained activation offloading):
            ``none``, or ``activations[=FRACTION]``: FRACTION (default 1) of each microbatch's
            saved activation bytes is copied to host memory over the profile's ``pcie`` link after
            its forward and copied back before its backward.
        tp_overlap: Megatron's overlap of the TP collectives with the neighbouring GEMMs
            (``--tp-comm-overlap``, Transformer Engine userbuffers; see
            :func:`simtrain.lowering.chains.tp_seconds`).
        tp_overlap_fraction: with ``tp_overlap``, the fraction of an action's compute time that
            can hide its TP collectives (units-free, 0 to 1; default 1: full overlap, limited by
            the compute time and by the profile's measured ``tp_exposed_fraction``).
        hardware_queues: CUDA_DEVICE_MAX_CONNECTIONS, the hardware work queues a rank's streams
            share (CUDA C++ Programming Guide, "CUDA Environment Variables": 1 to 32, default 8).
            None: every stream on a queue of its own (simtrain's ranks use at most seven streams,
            fewer than CUDA's default 8). With fewer queues than streams, the tasks of streams
            sharing a queue start in the host's launch order, none before the task launched ahead
            of it has had its dependencies met (:func:`simtrain.lowering.queues.add_hardware_queues`).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    tp: int = Field(default=1, ge=1, le=MAX_COUNT)
    pp: int = Field(default=1, ge=1, le=MAX_COUNT)
    dp: int = Field(default=1, ge=1, le=MAX_COUNT)
    ep: int = Field(default=1, ge=1, le=MAX_COUNT)
    cp: int = Field(default=1, ge=1, le=MAX_COUNT)
    cp_kind: Literal["ring", "ulysses", "allgather"] = "ring"
    cp_impl: Literal["te", "torch"] = "te"
    vp: int = Field(default=1, ge=1, le=MAX_COUNT)
    microbatches: int = Field(default=1, ge=1, le=MAX_COUNT)
    microbatch_size: int = Field(default=1, ge=1, le=MAX_COUNT)
    seq_len: int | None = Field(default=None, ge=1, le=MAX_COUNT)
    dtype: Dtype = "bf16"
    zero_stage: Literal[0, 1, 2, 3] = 0
    recompute: Literal["none", "selective", "full"] = "selective"
    attention: Literal["flash", "unfused"] | None = None
    attention_kernel: Literal["fa2", "fa3", "fa4", "cudnn"] | None = None
    activation_cache: Literal["compute", "fp8"] = "compute"
    sequence_parallel: bool = True
    w_pending: Literal["gemm-io", "autograd"] = "gemm-io"
    dp_buckets: int = Field(default=4, ge=1)
    overlap_param_gather: bool = False
    optimizer_impl: Literal["fused", "foreach"] = "fused"
    grad_allocation: Literal["static", "first-backward"] = "static"
    pp_buffers: Literal["per-transfer", "per-microbatch"] = "per-transfer"
    grad_reduce_dtype: Literal["bf16", "fp16", "fp32"] | None = None
    grad_reduce_op: Literal["all-reduce", "reduce-scatter"] | None = None
    p2p_mode: Literal["async", "blocking"] = "async"
    launch_blocking: bool = False
    kernels: Literal["fused", "eager", "compiled-blocks"] = "fused"
    zero_impl: Literal["flat", "fsdp2"] = "flat"
    dispatch_dtype: Literal["bf16", "fp8"] = "bf16"
    expert_imbalance: float = Field(default=1.0, ge=1.0)
    node_limit: int | None = Field(default=None, ge=1)
    ep_comm_sms: int = Field(default=20, ge=0, le=4096)
    nccl_channels: int | None = Field(default=None, ge=0, le=64)
    ep_kernel: Literal["nccl", "fused"] = "nccl"
    expert_gemm: Literal["grouped", "multi-stream"] = "grouped"
    rope_fusion: bool = True
    bias_dropout_fusion: bool = True
    fused_projections: bool = True
    a2a_links: Literal["shared", "separate"] = "shared"
    waves: int | None = Field(default=None, ge=1)
    moe_coarsen: int = Field(default=1, ge=1)
    forward_only: bool = False
    rank_order: Literal["tp-pp-dp", "tp-dp-pp"] | None = None
    offload: str = "none"
    tp_overlap: bool = False
    tp_overlap_fraction: float = Field(default=1.0, ge=0.0, le=1.0)
    hardware_queues: int | None = Field(default=None, ge=1, le=32)
    trainable: str = "all"

    @property
    def offload_fraction(self) -> float:
        """Fraction of saved activation bytes offloaded to the host (0 without offload)."""
        return parse_offload(self.offload)

    @model_validator(mode="after")
    def _order_fits_ep(self) -> ParallelConfig:
        if self.tp * self.cp * self.pp * self.dp > MAX_GPUS:
            raise ValueError(f"tp x cp x pp x dp = {self.tp * self.cp * self.pp * self.dp:,} GPUs: at most "
                             f"{MAX_GPUS:,} (2^24) are simulated")
        if self.ep > 1 and self.rank_order == "tp-pp-dp":
            raise ValueError("rank_order 'tp-pp-dp' cannot carve EP groups out of a stage's GPUs; "
                             "use 'tp-dp-pp' (the default with ep > 1)")
        if self.tp_overlap_fraction != 1.0 and not self.tp_overlap:
            raise ValueError("tp_overlap_fraction applies only with tp_overlap")
        if self.grad_reduce_op == "all-reduce" and self.zero_stage >= 2:
            raise ValueError(f"grad_reduce_op 'all-reduce' with zero_stage {self.zero_stage}: ZeRO-2/3 shard the "
                             "gradients, which needs reduce-scatter (or choose zero_stage 0 or 1)")
        if self.grad_reduce_op == "reduce-scatter" and self.zero_stage == 0:
            raise ValueError("grad_reduce_op 'reduce-scatter' with zero_stage 0: a reduce-scatter leaves each rank "
                             "1/dp of the gradient, which only a sharded optimizer can step (choose zero_stage >= 1, "
                             "or grad_reduce_op 'all-reduce')")
        if self.grad_allocation == "first-backward" and (self.zero_stage or self.dp > 1):
            raise ValueError(f"grad_allocation 'first-backward' with zero_stage {self.zero_stage} and dp {self.dp}: it "
                             "is torch's param.grad without a DDP/FSDP wrapper, whose buckets or shards are allocated "
                             "up front (choose zero_stage 0 and dp 1, or grad_allocation 'static')")
        if self.p2p_mode == "blocking" and self.zero_stage >= 2:
            raise ValueError(f"p2p_mode 'blocking' with zero_stage {self.zero_stage}: DeepSpeed's pipeline engine "
                             "runs ZeRO stage 0 or 1 only (choose zero_stage 0 or 1, or p2p_mode 'async')")
        if self.overlap_param_gather and self.zero_stage == 0:
            raise ValueError("overlap_param_gather with zero_stage 0: without a sharded optimizer no parameters are "
                             "all-gathered (choose zero_stage 1 or 2, or overlap_param_gather false)")
        if not self.rope_fusion and self.kernels == "eager":
            raise ValueError("rope_fusion false with kernels 'eager': eager kernels price the rotary embedding "
                             "unfused already (keep rope_fusion true, or choose kernels 'fused')")
        return self

    @property
    def dp_reduce_op(self) -> str:
        """The DP gradient collective: ``grad_reduce_op``, else reduce-scatter from ZeRO-1 on."""
        return self.grad_reduce_op or ("reduce-scatter" if self.zero_stage >= 1 else "all-reduce")

    @field_validator("trainable", "offload")
    @classmethod
    def _parses(cls, v: str, info: ValidationInfo) -> str:
        {"trainable": parse_trainable, "offload": parse_offload}[info.field_name](v)
        return v

    @property
    def lora_rank(self) -> int:
        """The LoRA adapter rank (0 without LoRA)."""
        return parse_trainable(self.trainable)[0]

    @property
    def frozen_layers(self) -> frozenset[int]:
        """Transformer layers listed by ``frozen-layers:`` (under LoRA every base weight is frozen;
        see :mod:`simtrain.costs.trainable`)."""
        return parse_trainable(self.trainable)[1]

    @property
    def world_size(self) -> int:
        """GPUs in the job: tp x cp x pp x dp."""
        return self.tp * self.cp * self.pp * self.dp

    @property
    def dtype_bytes(self) -> int:
        """Bytes per activation element in the compute dtype."""
        return DTYPE_BYTES[self.dtype]

    def gpu_id(self, pp_rank: int, dp_rank: int = 0, tp_rank: int = 0, cp_rank: int = 0) -> int:
        """Global GPU index of (pp_rank, dp_rank, tp_rank, cp_rank): [TP, CP, PP, DP] order, or
        [TP, CP, DP, PP] when ``ep > 1`` or ``rank_order`` says so (see the module docstring)."""
        if self.ep > 1 or self.rank_order == "tp-dp-pp":
            return ((pp_rank * self.dp + dp_rank) * self.cp + cp_rank) * self.tp + tp_rank
        return ((dp_rank * self.pp + pp_rank) * self.cp + cp_rank) * self.tp + tp_rank

    @property
    def tp_cp(self) -> int:
        """GPUs sharing one stage's microbatch: ``tp x cp``."""
        return self.tp * self.cp

    @property
    def grad_reduce_bytes(self) -> int | None:
        """Bytes per element of ``grad_reduce_dtype`` (None when unset: the gradient's own type)."""
        return None if self.grad_reduce_dtype is None else DTYPE_BYTES[self.grad_reduce_dtype]

    @property
    def dp_cp(self) -> int:
        """GPUs holding the same parameters of a stage: ``dp x cp`` (the gradient-reduction and
        ZeRO-sharding group)."""
        return self.dp * self.cp

    @property
    def expert_dp(self) -> int:
        """GPUs of a stage holding the same routed experts: ``dp x tp / ep`` (Megatron-Core's
        expert-data-parallel group; 1 when ``ep == dp x tp``)."""
        return self.dp * self.tp // self.ep

    @property
    def dp_stride(self) -> int:
        """GPU-id distance between two DP replicas of one GPU: ``pp x tp``, or ``tp`` when ``ep > 1``."""
        return self.gpu_id(0, 1) - self.gpu_id(0, 0)

    def group(self, dim: GroupDim, pp_rank: int, holders: tuple[int, ...] | None = None) -> Group:
        """The communication group of dimension ``dim`` around ``pp_rank``'s simulated GPU.

        Args:
            dim: ``tp`` (consecutive GPUs), ``cp`` (``cp`` TP groups, ``tp`` apart), ``ep`` (``ep``
                consecutive GPUs of the stage), ``dp`` (the DP replicas and their CP ranks),
                ``expert_dp`` (the GPUs holding the same experts, ``ep`` apart).
            pp_rank: pipeline rank of the simulated GPU.
            holders: for ``dp`` / ``expert_dp``, the pipeline ranks holding the reduced model
                chunk (DualPipe keeps two copies: the group is all their replicas); default
                ``(pp_rank,)``.

        Returns:
            The :class:`Group`: its size and the lowest and highest GPU id whose placement decides
            its route.

        Raises:
            ValueError: an unknown ``dim``.
        """
        holders = (pp_rank,) if holders is None else holders
        first = self.gpu_id(pp_rank)
        if dim == "tp":
            return Group(dim, self.tp, (first, first + self.tp - 1))
        if dim == "cp":
            return Group(dim, self.cp, (first, self.gpu_id(pp_rank, cp_rank=self.cp - 1)))
        if dim == "ep":
            return Group(dim, self.ep, (first, first + self.ep - 1))
        if dim not in ("dp", "expert_dp"):
            raise ValueError(f"unknown group dimension {dim!r}")
        if dim == "expert_dp" and len(holders) == 1:
            return Group(dim, self.expert_dp, (first, first + self.ep * (self.expert_dp - 1)))
        span = (min(self.gpu_id(h) for h in holders),
                max(self.gpu_id(h, self.dp - 1, cp_rank=self.cp - 1) for h in holders))
        per_holder = self.dp_cp if dim == "dp" else self.expert_dp
        return Group(dim, per_holder * len(holders), span)
