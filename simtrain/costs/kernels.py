"""Kernel-level measurements of each GPU kind for the per-operator cost model (:mod:`simtrain.costs.ops`).

``op_data.yaml`` (next to this module) holds, per GPU kind, the measured (batch, m, n, k) GEMM
FLOP/s tables by dtype (or a borrowed kind's shape curve scaled to a measured maximum rate), the
forward rates by sequence length and head dim of each measured fused-attention kernel
(FlashAttention-2/3/4, cuDNN's; :mod:`simtrain.costs.attention_rates`) with their backward/forward ratios and the kernel the common framework picks on that GPU
(``default``), and the achieved HBM bandwidth of memory-bound kernels; every number is cited in
the file. :func:`rates_for` gives the :class:`KernelRates` of a hardware profile (read and
validated once per process).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from pathlib import Path

import numpy as np

from ..errors import SimtrainError, load_yaml_file
from ..hardware import PROFILE_DIR, TFLOPS, US, HardwareProfile, load_profile
from .attention_rates import AttentionKernel, build_kernel, check_attention, check_within_peak

OP_DATA = Path(__file__).resolve().parent / "op_data.yaml"
@dataclasses.dataclass(frozen=True)
class KernelRates:
    """Measured rates of one GPU kind, in SI units (FLOP/s, bytes/s).

    Attributes:
        kind: GPU kind (``sm_90``, ``sm_80``, ...).
        dims: GEMM table sizes (ascending).
        batches: GEMM table batch counts (ascending).
        gemm: per dtype, the (batch, m, n, k) table of achieved FLOP/s.
        attention: the measured fused-attention kernels by name; empty when none is measured.
        attention_default: the kernel a run gets when it names none (``op_data.yaml``'s
            ``attention.default``: what the common framework picks on this GPU); None when none.
        hbm_efficiency: achieved / datasheet HBM bandwidth of memory-bound kernels.
        host_per_kernel_s: host seconds to issue one kernel (PyTorch eager dispatch + CUDA launch,
            ``host:`` of ``op_data.yaml``).
    """

    kind: str
    dims: tuple[int, ...]
    batches: tuple[int, ...]
    gemm: dict[str, np.ndarray]
    attention: dict[str, AttentionKernel]
    attention_default: str | None
    hbm_efficiency: float
    host_per_kernel_s: float = 0.0

    def gemm_flops_per_s(self, m: float, n: float, k: float, dtype: str, batch: float = 1) -> float:
        """Achieved FLOP/s of ``batch`` (m, n, k) GEMMs in one call in ``dtype``: multilinear in
        log2 of (batch, m, n, k), clamped to the table, with the tile-quantization factor below
        ``dims[0]`` (module docstring)."""
        table = self.gemm.get(dtype)
        if table is None:
            raise SimtrainError(f"op_data.yaml: GPU kind {self.kind} has no GEMM table for dtype {dtype}; "
                                f"it has {sorted(self.gemm)}")
        scale = math.prod(d / self.dims[0] for d in (m, n, k) if d < self.dims[0])
        axes = [(self.batches, batch), (self.dims, m), (self.dims, n), (self.dims, k)]
        idx, weights = [], []
        for grid, value in axes:
            logs = np.log2(grid)
            x = float(np.clip(math.log2(max(value, 1.0)), logs[0], logs[-1]))
            i = min(int(np.searchsorted(logs, x, side="right")) - 1, len(logs) - 2)
            idx.append(i)
            weights.append((x - logs[i]) / (logs[i + 1] - logs[i]))
        rate = 0.0
        for corner in range(16):
            bits = [(corner >> a) & 1 for a in range(4)]
            w = math.prod(weights[a] if bits[a] else 1 - weights[a] for a in range(4))
            if w:
                rate += w * table[tuple(i + bit for i, bit in zip(idx, bits))]
        return float(rate * scale)  # a Python float: numpy scalars slow every sum the simulator does with them

    def attention_kernel(self, kernel: str | None = None, where: str | None = None) -> AttentionKernel:
        """The rates of fused-attention ``kernel`` (None: :attr:`attention_default`).

        Args:
            kernel: a name of :data:`ATTENTION_KERNELS`, or None.
            where: how a refusal names the setting (``--attention-kernel fa4``, a scenario file's
                field); default ``attention kernel NAME``.

        Raises:
            SimtrainError: this kind has no measured rate for that kernel (the message lists those it has).
        """
        name = kernel or self.attention_default
        if name not in self.attention:
            raise SimtrainError(f"{where or f'attention kernel {name}'}: op_data.yaml has no measured rate of that fused-attention "
                                f"kernel on GPU kind {self.kind}; measured: {', '.join(sorted(self.attention)) or 'none'}")
        return self.attention[name]

    def attention_flops_per_s(self, seq_len: int, head_dim: float, dtype: str = "bf16", kernel: str | None = None,
                              backward: bool = False) -> float:
        """Causal fused-attention FLOP/s (FlashAttention's count: causal work halved, a backward
        of :data:`~simtrain.costs.attention_rates.BACKWARD_FLOPS_PER_FORWARD` x the forward's FLOPs) of ``kernel`` (None: the
        kind's default) at ``seq_len`` queries and ``head_dim`` (the mean of the query/key and
        value head dims where they differ, MLA), forward or ``backward``; interpolated and clamped
        as :func:`~simtrain.costs.attention_rates.interp2`.

        The tables are measured in 16-bit (FlashAttention-2 runs fp16 and bf16 only: Dao 2023,
        README). In a dtype whose GEMMs are slower (fp32: torch's SDPA then takes its
        memory-efficient kernel) the rate falls by the ratio of the two dtypes' best GEMM rates in
        this table, so no attention kernel beats the dtype's peak; a faster dtype (fp8) keeps the
        16-bit rate.

        Raises:
            SimtrainError: as :meth:`attention_kernel`.
        """
        k = self.attention_kernel(kernel)
        rate = k.backward_flops_per_s(seq_len, head_dim) if backward else k.forward_flops_per_s(seq_len, head_dim)
        if dtype in self.gemm and "bf16" in self.gemm:
            rate *= min(1.0, float(self.gemm[dtype].max() / self.gemm["bf16"].max()))
        return rate


def _check_table(kind: str, dtype: str, table: np.ndarray, shape: tuple[int, ...]) -> None:
    if table.shape != shape:
        raise SimtrainError(f"op_data.yaml: kinds.{kind}.gemm.tflops.{dtype}: expected a table of shape {shape} "
                            f"(batches x dims x dims x dims), got {table.shape}")
    if not np.all(np.isfinite(table)) or np.any(table <= 0):
        raise SimtrainError(f"op_data.yaml: kinds.{kind}.gemm.tflops.{dtype}: every entry must be a positive "
                            f"TFLOP/s, got {float(table.min())}")
    for axis in range(4):
        if np.any(np.diff(table, axis=axis) < 0):
            raise SimtrainError(f"op_data.yaml: kinds.{kind}.gemm.tflops.{dtype}: rates must not fall as a "
                                f"dimension grows (axis {'bmnk'[axis]} is non-monotone)")


def parse_op_data(data: dict, source: str = "op_data.yaml") -> dict[str, dict]:
    """Validate the parsed ``op_data.yaml`` and return its kinds and profile map.

    Raises:
        SimtrainError: a missing section, a table of the wrong shape, a non-positive or
            non-monotone entry, a borrow of an unknown kind or a dtype without a rate.
    """
    try:
        dims, batches, kinds = data["dims"], data["batches"], data["kinds"]
        data["profiles"]
    except (KeyError, TypeError):
        raise SimtrainError(f"{source}: needs the sections 'dims', 'batches', 'kinds' and 'profiles'") from None
    for name, grid in (("dims", dims), ("batches", batches)):
        if len(grid) < 2 or sorted(set(grid)) != list(grid) or any(d <= 0 for d in grid):
            raise SimtrainError(f"{source}: field '{name}' = {grid}: must be two or more positive, ascending sizes")
    host = data.get("host", {})
    for key in host if isinstance(host, dict) else ["(section)"]:
        value = host[key] if isinstance(host, dict) else host
        if key not in ("launch_us", "framework_op_us") or isinstance(value, bool) or \
                not isinstance(value, (int, float)) or value < 0:
            raise SimtrainError(f"{source}: host.{key} = {value!r}: host takes launch_us and framework_op_us, "
                                "each a number of microseconds >= 0")
    for kind, spec in kinds.items():
        gemm = spec.get("gemm", {})
        if "borrow" in gemm and gemm["borrow"] not in kinds:
            raise SimtrainError(f"{source}: kinds.{kind}.gemm.borrow = {gemm['borrow']!r}: not a kind")
        for dtype, table in gemm.get("tflops", {}).items():
            _check_table(kind, dtype, np.asarray(table, dtype=float), (len(batches),) + (len(dims),) * 3)
        for dtype, rate in gemm.get("mamf_tflops", {}).items():
            if not (isinstance(rate, (int, float)) and rate > 0):
                raise SimtrainError(f"{source}: kinds.{kind}.gemm.mamf_tflops.{dtype} = {rate!r}: must be > 0")
        if gemm.get("mamf_tflops") and "borrow" not in gemm and "bf16" not in gemm.get("tflops", {}):
            raise SimtrainError(f"{source}: kinds.{kind}.gemm.mamf_tflops: scales the kind's bf16 table, "
                                "which it does not have (give gemm.tflops.bf16 or gemm.borrow)")
        check_attention(kind, spec.get("attention", {}), source, data.get("causal_ratio", 1.0))
    return data


@functools.lru_cache(maxsize=None)
def _op_data(path: Path) -> dict:
    """``op_data.yaml``, read and validated once per process."""
    return parse_op_data(load_yaml_file(path), str(path))


@functools.lru_cache(maxsize=None)
def kernel_rates(kind: str, path: Path = OP_DATA) -> KernelRates:
    """The rates of GPU ``kind`` from ``op_data.yaml`` (cached).

    Raises:
        SimtrainError: as :func:`parse_op_data`, or ``kind`` is not in the file.
    """
    data = _op_data(path)
    if kind not in data["kinds"]:
        raise SimtrainError(f"{path}: no kernel tables for GPU kind {kind!r}; kinds: {sorted(data['kinds'])}")
    spec = data["kinds"][kind]
    gemm = spec["gemm"]
    if "borrow" in gemm:
        base = kernel_rates(gemm["borrow"], path)
        tables = {}
        for d, r in gemm["mamf_tflops"].items():
            src = base.gemm.get(d, base.gemm.get("bf16"))
            tables[d] = src / src[0].max() * r * TFLOPS  # MAMF is a single (b = 1) GEMM
    else:
        tables = {d: np.asarray(t, dtype=float) * TFLOPS for d, t in gemm["tflops"].items()}
        for d, r in gemm.get("mamf_tflops", {}).items():  # a dtype without a valid sweep of its own
            tables[d] = tables["bf16"] / tables["bf16"][0].max() * r * TFLOPS
    if "bf16" in tables:
        tables.setdefault("fp16", tables["bf16"])
    att = spec.get("attention", {})
    kernels = {name: build_kernel(name, k, data.get("causal_ratio", 1.0)) for name, k in att.get("kernels", {}).items()}
    host = data.get("host", {})
    host_s = (host.get("launch_us", 0.0) + host.get("framework_op_us", 0.0)) * US
    return KernelRates(kind, tuple(data["dims"]), tuple(data["batches"]), tables, kernels,
                       att.get("default") if kernels else None, spec.get("hbm_efficiency", 1.0), host_s)


FLAT_ONLY_COMPUTE = (("compute.linear_tflops", "linear_rates"), ("compute.attention_tflops", "attention_rates"),
                     ("compute.elementwise_gb_per_s", "elementwise_bytes_per_s"),
                     ("compute.layer_slowdown", "layer_slowdown"))
"""``compute:`` fields of a profile (and their :class:`HardwareProfile` attributes) that only the
flat model prices: the per-operator model takes its GEMM, attention and memory-bound rates from
``op_data.yaml`` and sums kernels without an in-pipeline slowdown, so it would ignore them."""


def flat_only_fields(hardware: HardwareProfile) -> list[str]:
    """The :data:`FLAT_ONLY_COMPUTE` fields ``hardware``'s file sets (``compute.layer_slowdown``, ...);
    empty for a profile without such measurements."""
    return [name for name, attr in FLAT_ONLY_COMPUTE if any(getattr(hardware, attr).values())]


def rates_for(hardware: HardwareProfile) -> KernelRates:
    """The kernel rates of ``hardware``'s GPU kind (:func:`gpu_kind_of`).

    Raises:
        SimtrainError: the profile's GPU kind has no tables (neither its name is in ``profiles:``
            nor its compute figures are a listed profile's), or the profile has measured rates
            only the flat model prices (:func:`flat_only_fields`), which the tables would silently
            override.
    """
    ignored = flat_only_fields(hardware)
    if ignored:
        raise SimtrainError(f"{hardware.path or hardware.name}: {ignored[0]} is priced by the flat cost model only; "
                            "the per-operator model takes its kernel rates from op_data.yaml and would ignore it "
                            "(run it with the flat or auto cost model, or remove the field)")
    kind = gpu_kind_of(hardware)
    if kind is None:
        raise SimtrainError(f"hardware {hardware.name!r}: the per-operator cost model has kernel tables for "
                            f"{sorted(_op_data(OP_DATA)['profiles'])} and for copies of them with the same compute "
                            f"figures (efficiency.matmul, and peak_tflops of the dtypes the tables rate) only")
    return _within_peaks(kind, tuple(sorted(hardware.peak_flops.items())))


def gpu_kind_of(hardware: HardwareProfile) -> str | None:
    """The GPU kind of ``op_data.yaml`` whose tables price ``hardware``: its name's entry in
    ``profiles:``, else that of a listed shipped profile with the same compute figures
    (:func:`_same_compute`) -- a renamed copy, e.g. with other links or HBM -- , else None."""
    profiles = _op_data(OP_DATA)["profiles"]
    if hardware.name in profiles:
        return profiles[hardware.name]
    return next((profiles[name] for name in sorted(profiles)
                 if _same_compute(hardware, _shipped(name), profiles[name])), None)


def _same_compute(a: HardwareProfile, b: HardwareProfile, kind: str) -> bool:
    """Whether ``a`` and ``b`` have the same compute figures that GPU ``kind``'s tables stand for:
    ``matmul_efficiency`` and the peak of every dtype the kind has a GEMM table for (a peak caps
    that table, :func:`_within_peaks`). The peak of another dtype (fp64, tf32) prices nothing the
    per-operator model runs, so a copy that edits only that one keeps the tables."""
    dtypes = set(kernel_rates(kind).gemm)
    peaks = [{d: v for d, v in p.peak_flops.items() if d in dtypes} for p in (a, b)]
    return peaks[0] == peaks[1] and a.matmul_efficiency == b.matmul_efficiency


@functools.lru_cache(maxsize=None)
def _within_peaks(kind: str, peaks: tuple[tuple[str, float], ...]) -> KernelRates:
    """``kind``'s rates with every GEMM entry at most the profile's dense peak FLOP/s for its dtype.

    A dense GEMM cannot run faster than the datasheet's dense tensor-core peak. The OpenXLA sm_90
    table's ``f8e4m3fn`` entries reach 2621 TFLOP/s (2424 at 4096^3), above H100 SXM's dense FP8
    peak of 1978.9 (NVIDIA H100 datasheet; 3958 is the 2:4-sparse figure), and its ``f32`` entries
    403 TFLOP/s, a TF32 rate, above the FP32 peak of 67 (PyTorch runs fp32 matmuls without TF32
    by default, ``torch.backends.cuda.matmul.allow_tf32 = False``). Entries within the peak are
    unchanged; dtypes the profile lists no peak for are left as measured. A fused-attention
    rate above the bf16 peak is refused instead (:func:`check_within_peak`): its tables are
    measured points, not a sweep with noise.

    Raises:
        SimtrainError: an attention rate above the profile's dense bf16 peak.
    """
    rates = kernel_rates(kind)
    peak = dict(peaks)
    for k in rates.attention.values() if "bf16" in peak else ():
        check_within_peak(kind, k, peak["bf16"])
    gemm = {d: np.minimum(t, peak[d]) if d in peak else t for d, t in rates.gemm.items()}
    return dataclasses.replace(rates, gemm=gemm)


def has_kernel_tables(hardware: HardwareProfile) -> bool:
    """Whether ``hardware`` is an uncalibrated profile with a shipped profile's compute figures
    (:func:`_same_compute`): the shipped profile itself or a copy of it, renamed or with other
    links or HBM, which the tables honour (the per-operator model is then the default).
    A calibrated profile keeps its own measurements, and so do a copy with edited compute figures,
    which the tables of a GPU kind would otherwise override, and one with measured rates only the
    flat model prices (:func:`flat_only_fields`)."""
    if hardware.calibration is not None or flat_only_fields(hardware):
        return False
    profiles = _op_data(OP_DATA)["profiles"]
    if hardware.name in profiles:
        return _same_compute(hardware, _shipped(hardware.name), profiles[hardware.name])
    return gpu_kind_of(hardware) is not None


@functools.lru_cache(maxsize=None)
def _shipped(name: str) -> HardwareProfile:
    """The shipped profile ``name`` (for :func:`has_kernel_tables`)."""
    return load_profile(PROFILE_DIR / f"{name}.yaml")
