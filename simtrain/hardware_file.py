"""The hardware-profile file format: the pydantic models a profile YAML file is validated
against, in the file's own units (``peak_tflops``, ``bandwidth_gb_per_s``, ``latency_us``);
:mod:`simtrain.hardware` converts a validated file to SI units and loads profiles."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from .errors import NumbersNotBooleans, bounded

Dtype = Literal["fp64", "fp32", "tf32", "bf16", "fp16", "fp8"]
LinkSharing = Literal["fair", "fifo"]
"""How transfers that use one link port at once behave (:mod:`simtrain.link_share`)."""


# ----------------------------------------------------------------------------- file schema
# Allowed ranges of the profile's numbers: physical sign and finiteness, and an upper bound far
# above any device (a B200 is 2.25 PFLOP/s bf16, 192 GB HBM at 8 TB/s, NVLink 5 at 900 GB/s per
# direction; latencies are µs) so that a slip of units or sign is an error, not a result.
# Lower bounds keep every simulated time finite (a rate of 1e-300 would overflow the step to inf).
Bandwidth = bounded(ge=1e-6, le=1e6)        # GB/s (1 kB/s ... 1 PB/s)
Latency = bounded(ge=0, le=1e6)             # µs (at most one second)
Rate = bounded(ge=1e-6, le=1e6)             # TFLOP/s (1 MFLOP/s ... 1 EFLOP/s)
Efficiency = bounded(ge=1e-6, le=1)         # achieved / peak; a CPU calibrated on a GPU --base gets ~1e-3
Slowdown = bounded(ge=0.1, le=100)          # in-pipeline time / kernel time


class _Strict(NumbersNotBooleans):
    model_config = ConfigDict(extra="forbid", frozen=True)


class IntraNodeLinkFile(_Strict):
    """``intra_node:`` section: the scale-up link inside a node (NVLink, Infinity Fabric).

    Attributes:
        name: the link's name (``NVLink 4``).
        latency_us: one-way latency of a message.
    """

    name: str
    bandwidth_gb_per_s: Bandwidth = Field(description="per GPU, per direction, to the switch")
    peer_bandwidth_gb_per_s: Bandwidth | None = Field(
        default=None, description="per direction to ONE peer GPU; defaults to bandwidth"
    )
    latency_us: Latency
    efficiency: float | None = Field(
        default=None, gt=0, le=1, description="achieved / nominal bandwidth of this link class in NCCL "
        "collectives (simtrain.collectives); default efficiency.link",
    )
    nvls_efficiency: float | None = Field(
        default=None, gt=0, le=1, description="NVLink SHARP (in-switch reduction) available, at this fraction "
        "of the achieved NVLink bandwidth; absent = no NVLS (NCCL needs NVSwitch and sm90+)",
    )
    sharing: LinkSharing = Field(
        default="fifo", description="transfers using one port of this link at once: fifo (one at a time, in "
        "arrival order; the default until the suite's duration checks are moved) or fair (transfers of different "
        "kinds share its bandwidth, as concurrent NCCL communicators and InfiniBand queue pairs do; simtrain.link_share)",
    )


class InterNodeLinkFile(_Strict):
    """``inter_node:`` section: the scale-out network (InfiniBand, RoCE).

    Attributes:
        name: the network's name (``InfiniBand NDR``).
        nics_per_node: NICs of one node.
        latency_us: one-way latency of a message.
    """

    name: str
    bandwidth_gb_per_s: Bandwidth = Field(description="per NIC, per direction")
    nics_per_node: int = Field(ge=1, le=1024)
    latency_us: Latency
    efficiency: float | None = Field(
        default=None, gt=0, le=1, description="achieved / nominal NIC bandwidth in NCCL collectives and "
        "DeepEP RDMA (simtrain.collectives, simtrain.deepep); default efficiency.link",
    )
    alltoall_efficiency: float | None = Field(
        default=None, gt=0, le=1, description="achieved / nominal NIC bandwidth in NCCL's all-to-all (nccl-tests "
        "alltoall_perf across nodes; simtrain.collectives, simtrain.network); default the field efficiency above",
    )
    nodes: int | None = Field(default=None, ge=1, description="nodes in the cluster; bounds group sizes (optional)")
    sharing: LinkSharing = Field(
        default="fifo", description="transfers using one port of this link at once: fifo (one at a time, in "
        "arrival order; the default until the suite's duration checks are moved) or fair (transfers of different "
        "kinds share its bandwidth, as concurrent NCCL communicators and InfiniBand queue pairs do; simtrain.link_share)",
    )


class HostLinkFile(_Strict):
    """``pcie:`` section (optional): the GPU's link to host memory that activation offload copies
    over (PCIe, or NVLink-C2C on Grace-Blackwell), per GPU and per direction (it is full duplex).

    Attributes:
        name: the link's name (``PCIe Gen5 x16``).
    """

    name: str
    bandwidth_gb_per_s: Bandwidth = Field(description="per GPU, per direction (datasheet)")
    latency_us: Latency = Field(default=0.0, description="per copy (optional; default 0)")
    efficiency: float = Field(
        default=1.0, gt=0, le=1, description="achieved / nominal bandwidth of a pinned-memory copy (from a "
        "copy microbenchmark such as nvbandwidth); default 1: the datasheet figure",
    )
    sharing: LinkSharing = Field(
        default="fifo", description="transfers using one port of this link at once: fifo (one at a time, in "
        "arrival order; the default until the suite's duration checks are moved) or fair (transfers of different "
        "kinds share its bandwidth, as concurrent NCCL communicators and InfiniBand queue pairs do; simtrain.link_share)",
    )


class EfficiencyFile(_Strict):
    """``efficiency:`` section: achieved fractions of peak, replaced by calibration."""

    matmul: Efficiency = Field(description="achieved / peak FLOP/s for large GEMMs")
    link: Efficiency = Field(description="achieved / nominal link bandwidth")


class OverlapFile(_Strict):
    """``overlap:`` section (optional): how an overlapped forward-and-backward pair (DualPipe's
    F&B) runs. Calibration replaces the defaults; see :mod:`simtrain.lowering` for the model."""

    compute_factor: bounded(ge=0.5, le=2.0) = Field(
        default=1.0,
        description="pair compute time / (F + B) run alone; units-free. Above 1 when the two "
        "halves and their communication kernels slow each other down; never below 0.5, since a "
        "pair cannot end before its longer half alone",
    )
    sends: Literal["per_half", "after_pair"] = Field(
        default="after_pair",
        description="per_half: each half's p2p sends leave when that half is done (a GPU runtime "
        "that overlaps inside the pair); after_pair: both leave when the whole pair is done "
        "(deepseek-ai/DualPipe's step(), torch's runtime)",
    )
    tp: Literal["blocking", "hidden"] = Field(
        default="blocking",
        description="tensor-parallel collectives of a pair without MoE blocks. blocking: they run "
        "between their half's layers on the compute stream, so nothing of the pair overlaps them "
        "(Megatron-Core's combined 1F1B runs attention and MLP, TP collectives inside, on the "
        "compute stream, model_chunk_schedule_plan.py TransformerLayerSchedulePlan.run; "
        "deepseek-ai/DualPipe and torch's OVERLAP_F_B run the two halves one after the other "
        "unless the model brings its own overlap); hidden: each layer's TP collectives run beside "
        "the other half's compute (a custom overlapped_forward_backward that issues them on a "
        "side stream; no public implementation is cited)",
    )
    tp_exposed_fraction: bounded(ge=0.0, le=1.0) = Field(
        default=0.0,
        description="with --tp-overlap, the share of the TP collectives that stays exposed even "
        "when the GEMMs are longer (the pipelined chunks the GEMMs cannot cover); units-free. "
        "Measured per GPU kind from kernel-level overlapped AllGather+GEMM / GEMM+ReduceScatter "
        "times (simtrain.lowering.chains.tp_seconds); 0: the overlap hides all of it",
    )


class LinearPointFile(_Strict):
    """One measured GEMM of a linear layer ``Y[tokens, fan_out] = X[tokens, fan_in] Wᵀ``.

    ``kind`` is the pass: ``F`` (``X Wᵀ``), ``I`` (input gradient ``dY W``) or ``W`` (weight
    gradient ``dYᵀ X``), in torch ``nn.Linear``'s memory layouts; each costs
    ``2 x tokens x fan_in x fan_out`` FLOPs.
    """

    tokens: int = Field(ge=1, le=2**40)
    fan_in: int = Field(ge=1, le=2**40)
    fan_out: int = Field(ge=1, le=2**40)
    kind: Literal["F", "I", "W"]
    tflops: Rate = Field(description="achieved TFLOP/s (FLOPs / median seconds)")


class AttentionPointFile(_Strict):
    """One measured causal scaled-dot-product attention, rated in the cost model's FLOP count."""

    seq_len: int = Field(ge=1, le=2**40)
    head_dim: int = Field(ge=1, le=2**40)
    forward_tflops: Rate = Field(description="4·s·d FLOPs per token per head / forward seconds")
    backward_tflops: Rate = Field(description="8·s·d FLOPs per token per head / backward seconds")


class ComputeFile(_Strict):
    """``compute:`` section (optional; ``simtrain calibrate`` writes it). Every field is optional.

    Without it a profile rates every GEMM and attention kernel at ``peak x efficiency.matmul``,
    ignores elementwise kernels and framework overhead, and gives each GPU its own processor.
    """

    linear_tflops: dict[Dtype, list[LinearPointFile]] = Field(
        default_factory=dict, description="achieved TFLOP/s per linear-layer GEMM; the nearest shape is used. "
        "At most the dtype's peak_tflops; a larger GEMM (one dimension grown, same pass) never takes less time"
    )
    attention_tflops: dict[Dtype, list[AttentionPointFile]] = Field(
        default_factory=dict, description="achieved attention TFLOP/s per (seq_len, head_dim), in the non-causal "
        "count: at most twice the dtype's peak_tflops; at one head_dim a longer sequence never takes less time "
        "per token"
    )
    elementwise_gb_per_s: dict[Literal["norm", "activation", "add"], Bandwidth] = Field(
        default_factory=dict, description="bandwidth of memory-bound kernels per class, in the bytes the cost "
        "model counts: norms, activation functions and the loss softmax, adds (residual, gradient accumulation)"
    )
    layer_slowdown: dict[Literal["F", "B", "I", "W"], Slowdown] = Field(
        default_factory=dict, description="measured time of a stage's actions inside real pipeline steps / "
        "the sum of their kernels' times, for the forward (F), a full backward (B) and a split backward's "
        "I and W (default: B's)"
    )
    action_overhead_us: Latency = Field(
        default=0.0, description="framework time added to every pipeline action (F, B, I, W)"
    )
    message_overhead_us: Latency = Field(
        default=0.0, description="processor time a p2p message costs the action that sends it and "
        "the action that receives it (posting, waiting, completing)"
    )
    processors_per_node: int | None = Field(
        default=None, ge=1, le=2**20, description="compute units the ranks of a node share (CPU cores); "
        "default one per GPU"
    )
    optimizer_gb_per_s: Bandwidth | None = Field(
        default=None, description="rate of the optimizer step in the bytes the cost model counts for "
        "it (28 per parameter, simtrain.costs.OPTIMIZER_BYTES_PER_PARAM); default the HBM bandwidth"
    )


class NcclChannelsFile(_Strict):
    """NCCL's channel counts for a large collective on this node (CTAs = SMs it occupies): within
    one node and across nodes, from NCCL_DEBUG=INFO logs or NCCL's topology search
    (:mod:`simtrain.lowering.nccl_sms`).

    Attributes:
        intra_node: channels of a collective whose group sits in one node (NVLink).
        inter_node: channels of a collective whose group spans nodes (the NICs).
    """

    intra_node: int = Field(ge=1, le=64)
    inter_node: int = Field(ge=1, le=64)


class ProfileFile(_Strict):
    """The schema of a hardware profile YAML file (units in field names).

    Attributes:
        name: the profile's name (file stem by convention).
        description: GPU and node in words; the first comma-separated part is the GPU.
        source: datasheets and measurements the numbers come from.
        peak_tflops: dense tensor-core peak per dtype (no sparsity), from the datasheet.
        hbm_gib: HBM capacity per GPU.
        hbm_tb_per_s: HBM bandwidth per GPU.
        gpus_per_node: GPUs of one node (one scale-up domain).
        sms: streaming multiprocessors per GPU (datasheet), or None.
        nccl_channels: NCCL's channels (one CTA, one SM each) for a large collective within one
            node and across nodes (:mod:`simtrain.lowering.nccl_sms`), or None.
        intra_node: the scale-up link.
        inter_node: the scale-out network.
        efficiency: achieved fractions of peak (replaced by calibration).
        overlap: how an overlapped F&B pair runs.
        pcie: the GPU-to-host link (activation offload), or None where the profile lacks it.
        fused_attention: whether a fused (FlashAttention-class) attention kernel runs on this GPU:
            the default of ``--attention`` (false: materialised scores).
        compute: measured kernel rates and overheads (``simtrain calibrate`` writes it).
        calibration: provenance of a calibrated profile (free-form, written by ``simtrain calibrate``).
    """

    name: str
    description: str
    source: str = Field(min_length=1)
    peak_tflops: dict[Dtype, Rate]
    hbm_gib: bounded(gt=0, le=1e6)
    hbm_tb_per_s: bounded(ge=1e-9, le=1e3)
    gpus_per_node: int = Field(ge=1, le=2**20)
    sms: int | None = Field(default=None, ge=1, le=4096, description="streaming multiprocessors per GPU, from the "
                            "datasheet; the share EP communication kernels take (simtrain.costs.ep_sms) needs it")
    nccl_channels: NcclChannelsFile | None = None
    intra_node: IntraNodeLinkFile
    inter_node: InterNodeLinkFile
    efficiency: EfficiencyFile
    overlap: OverlapFile = Field(default_factory=OverlapFile)
    pcie: HostLinkFile | None = None
    fused_attention: bool = True
    compute: ComputeFile | None = None
    calibration: dict | None = None

    @field_validator("peak_tflops")
    @classmethod
    def _positive_rates(cls, v: dict[str, float]) -> dict[str, float]:
        if not v:
            raise ValueError("must list at least one dtype, e.g. {bf16: 989}")
        return v

    @model_validator(mode="after")
    def _channels_below_sms(self) -> ProfileFile:
        ch = self.nccl_channels
        if ch is not None and self.sms is not None and max(ch.intra_node, ch.inter_node) >= self.sms:
            raise ValueError(f"nccl_channels {{intra_node: {ch.intra_node}, inter_node: {ch.inter_node}}}: each must "
                             f"be below sms = {self.sms} (no SM would be left for compute)")
        return self

    @model_validator(mode="after")
    def _rates_within_peak(self) -> ProfileFile:
        if self.compute is not None:
            check_rate_tables(self.peak_tflops, self.compute)
        return self

    @field_validator("calibration")
    @classmethod
    def _finite_record(cls, v: dict | None) -> dict | None:
        if v is not None:
            check_record(v)
        return v


ROUNDING = 1e-3
"""Relative slack of the checks below: ``simtrain calibrate`` writes rates to 4 significant digits
(:func:`simtrain.calibration.fit.sig`), which may move two equal times apart by up to 1e-3."""


def check_rate_tables(peak_tflops: dict[str, float], compute: ComputeFile) -> None:
    """Refuse measured kernel rates that no GPU can reach or that contradict each other.

    * A linear-layer GEMM rate above its dtype's dense ``peak_tflops``.
    * An attention rate above twice the peak: the table counts the full ``s x s`` scores (``4 s d``
      FLOPs per token and head forward, Narayanan et al. 2021) while a causal kernel computes at
      least half of them, so its rate in that count is at most 2 x peak.
    * A table for a dtype without a ``peak_tflops`` entry (the run would fail on it anyway).
    * Time that falls as the problem grows: a GEMM one of whose dimensions (tokens, fan_in,
      fan_out) grows, the other two and the pass fixed, must not take less time (``size / rate``
      non-decreasing along the axis); at one ``head_dim`` an attention over a longer sequence must
      not take less time per token (``seq_len / rate`` non-decreasing, forward and backward).
      The *rate* itself may fall as a shape grows (caches, wave quantization: torch's CPU SDPA on
      one thread measured 52 then 32 GFLOP/s at seq_len 128 then 256), so that is not refused.

    Raises:
        ValueError: naming the first bad entry (``compute.linear_tflops.bf16.3.tflops``), its
            value and what is allowed.
    """
    for table, points in (("linear_tflops", compute.linear_tflops), ("attention_tflops", compute.attention_tflops)):
        for dtype, rows in points.items():
            where = f"compute.{table}.{dtype}"
            if dtype not in peak_tflops:
                raise ValueError(f"section '{where}': no peak_tflops.{dtype} to bound its rates; add one "
                                 f"(the profile's peaks: {sorted(peak_tflops)})")
            ceiling = peak_tflops[dtype] * (1 if table == "linear_tflops" else 2)
            limit = "" if table == "linear_tflops" else "twice "
            rates = ("tflops",) if table == "linear_tflops" else ("forward_tflops", "backward_tflops")
            for i, row in enumerate(rows):
                for rate in rates:
                    if getattr(row, rate) > ceiling:
                                    raise ValueError(f"field '{where}.{i}.{rate}' = {getattr(row, rate):g}: must be at most "
                                         f"{limit}peak_tflops.{dtype} = {ceiling:g} (no kernel beats the dense peak)")
            _one_rate_per_shape(where, rows)
            axes = ("tokens", "fan_in", "fan_out") if table == "linear_tflops" else ("seq_len",)
            for axis in axes:
                for rate in rates:
                    _time_grows(where, rows, axis, rate)


def _one_rate_per_shape(where: str, rows: list) -> None:
    """Refuse two rows of one shape (every field but the rates equal: the pass and GEMM sizes, or
    seq_len and head_dim) with different rates: the nearest-shape lookup would take one of them
    silently. Raises ValueError naming both rows."""
    seen: dict[tuple, int] = {}
    for i, row in enumerate(rows):
        values = row.model_dump()
        shape = tuple((k, v) for k, v in values.items() if not k.endswith("tflops"))
        j = seen.setdefault(shape, i)
        if j != i and {k: v for k, v in values.items() if k.endswith("tflops")} != \
                {k: v for k, v in rows[j].model_dump().items() if k.endswith("tflops")}:
            raise ValueError(f"fields '{where}.{j}' and '{where}.{i}': one shape ({', '.join(f'{k} {v}' for k, v in shape)}) "
                             "with two different rates; keep one row per shape (e.g. the median of the measurements)")


def _time_grows(where: str, rows: list, axis: str, rate: str) -> None:
    """Refuse two rows equal but in ``axis`` (and ``kind``/``head_dim``) where the larger one's
    time, ``axis / rate``, is shorter (beyond :data:`ROUNDING`). Raises ValueError."""
    fixed = [f for f in ("tokens", "fan_in", "fan_out", "kind", "head_dim") if f in type(rows[0]).model_fields
             and f != axis] if rows else []
    groups: dict[tuple, list[tuple[int, int]]] = {}
    for i, row in enumerate(rows):
        groups.setdefault(tuple(getattr(row, f) for f in fixed), []).append((getattr(row, axis), i))
    for members in groups.values():
        members.sort()
        for (small, i), (large, j) in zip(members, members[1:]):
            slow, fast = getattr(rows[i], rate), getattr(rows[j], rate)
            if large > small and large / fast < small / slow * (1 - ROUNDING):
                same = ", ".join(f"{f} {getattr(rows[j], f)}" for f in fixed)
                raise ValueError(
                    f"field '{where}.{j}.{rate}' = {fast:g}: must be at most {slow * large / small:.4g}, or {axis} "
                    f"{large} takes less time than {axis} {small} at entry {i} ({slow:g}; same {same})")


def check_record(record: dict, where: str = "calibration") -> None:
    """Check the free-form ``calibration:`` record: every number finite (``.inf``/``.nan`` there
    would reach validation's speed correction and the printed tables), and the speed probe's
    ``seconds`` > 0 (validation divides by it).

    Raises:
        ValueError: naming the first bad entry's path, value and what is allowed.
    """
    stack: list[tuple[str, object]] = [(where, record)]
    while stack:
        name, value = stack.pop()
        if isinstance(value, dict):
            stack.extend((f"{name}.{k}", v) for k, v in value.items())
        elif isinstance(value, list):
            stack.extend((f"{name}[{i}]", v) for i, v in enumerate(value))
        elif isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{name} = {value}: must be a finite number")
    probe = record.get("speed_probe")
    if probe is not None:
        seconds = probe.get("seconds") if isinstance(probe, dict) else None
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not seconds > 0:
            raise ValueError(f"{where}.speed_probe.seconds = {seconds!r}: must be a number of seconds > 0")
