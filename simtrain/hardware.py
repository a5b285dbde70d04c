"""Hardware profiles: one GPU kind and its cluster fabric, in SI units.

Built-in profiles ship inside the package (``simtrain/hardware_profiles/<name>.yaml``, read with
:mod:`importlib.resources`); a user's own profile is any YAML file of the same schema, given by path,
or by name when it sits in a ``hardware_profiles/`` folder of the current directory. Files say
their units in field names
(``peak_tflops``, ``hbm_gib``, ``bandwidth_gb_per_s``, ``latency_us``). :func:`load_profile`
validates a file against :class:`ProfileFile` and converts it to a :class:`HardwareProfile` whose
fields are SI base units (FLOP/s, bytes, bytes/s, seconds). Nothing past the loader sees a TFLOPS
or a GB/s.

Conventions (stated once, used everywhere):

* ``GB`` and ``TB`` are decimal (1e9, 1e12 bytes), as vendors quote link and HBM bandwidth;
  ``GiB`` is binary (2**30 bytes), as HBM capacity is physically built.
* Link bandwidth is per GPU (NVLink) or per NIC (InfiniBand/RoCE), **per direction**.
* Peak FLOP/s are dense (no structured sparsity) tensor-core rates from the vendor datasheet.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Literal

from .errors import ConfigWarning, SimtrainError, load_yaml_file, validate_model
from .hardware_file import ComputeFile, Dtype, InterNodeLinkFile, LinkSharing, ProfileFile  # noqa: F401 (Dtype and the file models re-exported)

PROFILE_DIR = Path(str(resources.files("simtrain").joinpath("hardware_profiles")))
"""The built-in profiles (package data)."""
USER_PROFILE_DIR = Path("hardware_profiles")
"""A user's own profiles, relative to the current directory: found by name after the built-ins."""


GB = 1e9
TB = 1e12
GiB = 2**30
US = 1e-6
TFLOPS = 1e12


# ----------------------------------------------------------------------------- SI objects
@dataclass(frozen=True)
class Link:
    """One class of link, in SI units.

    Attributes:
        name: human name (e.g. ``"NVLink 4"``).
        bandwidth_bytes_per_s: nominal bandwidth per GPU (or per NIC), per direction.
        latency_s: one-way latency of a message (the alpha of an alpha-beta model).
        efficiency: achieved / nominal bandwidth (from the profile's ``efficiency.link``).
        peer_bandwidth_bytes_per_s: bandwidth to a single peer GPU, per direction (equals
            ``bandwidth_bytes_per_s`` behind a switch; lower for point-to-point meshes).
        nics_per_node: NICs in one node (inter-node links only; 0 for intra-node links).
        achieved_efficiency: achieved / nominal bandwidth of this link class in collectives, used
            by :mod:`simtrain.collectives` and :mod:`simtrain.deepep` (``intra_node.efficiency`` /
            ``inter_node.efficiency``; defaults to ``efficiency``).
        nvls_efficiency: NVLink SHARP efficiency relative to the achieved NVLink bandwidth, or
            None where the fabric has no NVLS (intra-node links only).
        nodes: nodes in the cluster, or None when the profile does not bound it (inter-node only).
        alltoall_efficiency: achieved / nominal NIC bandwidth in NCCL's all-to-all (its send/recv
            pairs, one connection per peer), or None to use :attr:`collective_efficiency`
            (inter-node only; ``inter_node.alltoall_efficiency``, see :attr:`a2a_efficiency`).
        sharing: how transfers that use one of this link's ports at once behave: ``"fifo"`` (one
            at a time, in arrival order; the default for now) or ``"fair"`` (transfers of different
            kinds share its bandwidth, :mod:`simtrain.link_share`: NCCL's communicators and
            InfiniBand's queue pairs do).
    """

    name: str
    bandwidth_bytes_per_s: float
    latency_s: float
    efficiency: float
    peer_bandwidth_bytes_per_s: float
    nics_per_node: int = 0
    achieved_efficiency: float | None = None
    nvls_efficiency: float | None = None
    nodes: int | None = None
    alltoall_efficiency: float | None = None
    sharing: LinkSharing = "fifo"

    @property
    def collective_efficiency(self) -> float:
        """The link class's achieved efficiency in collectives (``achieved_efficiency``, else ``efficiency``)."""
        return self.efficiency if self.achieved_efficiency is None else self.achieved_efficiency

    @property
    def a2a_efficiency(self) -> float:
        """The link class's achieved efficiency in NCCL's all-to-all (``alltoall_efficiency``, else
        :attr:`collective_efficiency`)."""
        return self.collective_efficiency if self.alltoall_efficiency is None else self.alltoall_efficiency

    @property
    def achieved_bandwidth_bytes_per_s(self) -> float:
        """Nominal per-direction bandwidth x :attr:`collective_efficiency` (bytes/s)."""
        return self.bandwidth_bytes_per_s * self.collective_efficiency

    def transfer_s(self, nbytes: float, bandwidth_bytes_per_s: float | None = None) -> float:
        """Alpha-beta time of one message: ``latency + bytes / (bandwidth * efficiency)``.

        Args:
            nbytes: message size in bytes (>= 0).
            bandwidth_bytes_per_s: override the nominal bandwidth (e.g. a per-GPU NIC share).

        Returns:
            Seconds; 0 for an empty message.
        """
        if nbytes <= 0:
            return 0.0
        bw = self.bandwidth_bytes_per_s if bandwidth_bytes_per_s is None else bandwidth_bytes_per_s
        return self.latency_s + nbytes / (bw * self.efficiency)


@dataclass(frozen=True)
class HardwareProfile:
    """A GPU kind and its fabric, SI units throughout. Build it with :func:`load_profile`.

    Attributes:
        name, description, source: identification; ``source`` names the datasheet or calibration.
        peak_flops: dense peak FLOP/s per dtype.
        hbm_bytes: HBM capacity per GPU, bytes.
        hbm_bandwidth_bytes_per_s: HBM bandwidth per GPU, bytes/s.
        gpus_per_node: GPUs sharing one intra-node fabric.
        intra_node, inter_node: the two link classes.
        matmul_efficiency: achieved / peak FLOP/s used for every GEMM and attention kernel
            without a calibrated rate.
        overlap_compute_factor: compute time of an overlapped F&B pair / (F + B) (units-free).
        overlap_sends: ``"per_half"`` or ``"after_pair"``: when a pair's p2p sends leave.
        overlap_tp: ``"blocking"`` or ``"hidden"``: whether a dense pair's TP collectives hold
            its compute stream or run beside the other half (``overlap.tp``; :mod:`simtrain.lowering.chains`).
        tp_exposed_fraction: with ``tp_overlap``, the share of an action's TP collectives the
            overlapped GEMMs never hide (``overlap.tp_exposed_fraction``; units-free, 0 to 1;
            :func:`simtrain.lowering.chains.tp_seconds`).
        sms: streaming multiprocessors per GPU (datasheet), or None where the profile does not
            say (then EP communication kernels take no SMs from compute: :mod:`simtrain.costs.ep_sms`).
        nccl_channels: ``(within one node, across nodes)``: the CTAs (SMs) of one large NCCL
            collective, or None where the profile does not say (then collectives take no SMs
            from compute: :mod:`simtrain.lowering.nccl_sms`).
        path: the file it was loaded from, if any.
        calibration: the raw ``calibration:`` section of a calibrated profile, if any.
        linear_rates: per dtype and pass (F, I, W), measured ``(tokens, fan_in, fan_out,
            FLOP/s)`` linear-layer GEMMs (``compute.linear_tflops``).
        attention_rates: per dtype, measured ``(seq_len, head_dim, forward FLOP/s, backward
            FLOP/s)`` causal attention kernels (``compute.attention_tflops``).
        elementwise_bytes_per_s: bandwidth of memory-bound kernels per class (``norm``,
            ``activation``, ``add``); empty leaves them out of the cost model
            (``compute.elementwise_gb_per_s``).
        layer_slowdown: in-pipeline action time / kernel-sum time per pass ``F``, ``B``, ``I``,
            ``W``; 1 when absent, I and W default to B (``compute.layer_slowdown``).
        action_overhead_s: framework seconds added to every pipeline action
            (``compute.action_overhead_us``).
        message_overhead_s: seconds a p2p message adds to its sending and its receiving action
            (``compute.message_overhead_us``).
        processors_per_node: compute units shared by the ranks of one node, or None for one
            processor per GPU (``compute.processors_per_node``).
        optimizer_bytes_per_s: rate of the optimizer step in the bytes the cost model counts, or
            None for the HBM bandwidth (``compute.optimizer_gb_per_s``).
        host_link: the GPU-to-host link (``pcie:``), or None where the profile has no figure.
        fused_attention: whether a fused attention kernel runs here (the ``--attention`` default).
    """

    name: str
    description: str
    source: str
    peak_flops: dict[str, float]
    hbm_bytes: float
    hbm_bandwidth_bytes_per_s: float
    gpus_per_node: int
    intra_node: Link
    inter_node: Link
    matmul_efficiency: float
    overlap_compute_factor: float = 1.0
    overlap_sends: Literal["per_half", "after_pair"] = "after_pair"
    overlap_tp: Literal["blocking", "hidden"] = "blocking"
    tp_exposed_fraction: float = 0.0
    sms: int | None = None
    nccl_channels: tuple[int, int] | None = None
    path: Path | None = None
    calibration: dict | None = field(default=None, compare=False)
    linear_rates: dict[tuple[str, str], tuple[tuple[int, int, int, float], ...]] = field(default_factory=dict)
    attention_rates: dict[str, tuple[tuple[int, int, float, float], ...]] = field(default_factory=dict)
    elementwise_bytes_per_s: dict[str, float] = field(default_factory=dict)
    layer_slowdown: dict[str, float] = field(default_factory=dict)
    action_overhead_s: float = 0.0
    message_overhead_s: float = 0.0
    processors_per_node: int | None = None
    optimizer_bytes_per_s: float | None = None
    host_link: Link | None = None
    fused_attention: bool = True

    def attention_kernel(self, requested: str | None) -> str:
        """The attention kernel a run uses: ``requested`` (``flash`` or ``unfused``), or when None
        the profile's default: ``flash`` where a fused kernel runs (:attr:`fused_attention`),
        else ``unfused``."""
        return requested or ("flash" if self.fused_attention else "unfused")

    def linear_flops_per_s(self, tokens: float, fan_in: float, fan_out: float, kind: str, dtype: str) -> float:
        """Achieved FLOP/s of the ``kind`` (F, I or W) GEMM of a linear layer in ``dtype``.

        The rate of the measured layer of that pass nearest in ``(log tokens, log fan_in,
        log fan_out)`` when the profile has ``compute.linear_tflops`` for ``dtype``; otherwise
        :meth:`achieved_flops` (peak x matmul efficiency).

        Raises:
            SimtrainError: no rate at all for ``dtype``.
        """
        table = self.linear_rates.get((dtype, kind))
        if not table:
            return self.achieved_flops(dtype)
        return _nearest(table, (tokens, fan_in, fan_out))[3]

    def attention_flops_per_s(self, seq_len: int, head_dim: int, dtype: str, backward: bool) -> float:
        """Achieved FLOP/s of causal attention (forward, or its backward) in ``dtype``.

        The measured ``(seq_len, head_dim)`` nearest in log space when the profile has
        ``compute.attention_tflops`` for ``dtype``; otherwise :meth:`achieved_flops`.
        """
        table = self.attention_rates.get(dtype)
        if not table:
            return self.achieved_flops(dtype)
        point = _nearest(table, (seq_len, head_dim))
        return point[3] if backward else point[2]

    def achieved_flops(self, dtype: str) -> float:
        """Achieved FLOP/s of a large GEMM in ``dtype``: peak x matmul efficiency.

        Raises:
            SimtrainError: the profile lists no peak rate for ``dtype``.
        """
        if dtype not in self.peak_flops:
            raise SimtrainError(
                f"hardware profile '{self.name}': no peak_tflops for dtype '{dtype}'; "
                f"it has {sorted(self.peak_flops)}"
            )
        return self.peak_flops[dtype] * self.matmul_efficiency

    def check_nodes(self, nodes: int, what: str, per_node: int | None = None) -> None:
        """Refuse a placement on more nodes than the cluster has (``inter_node.nodes``; None: no bound).

        Args:
            nodes: nodes the placement spans.
            what: the flag or setting that asks for them, for the message (``--gpus = 32``).
            per_node: GPUs of the placement on each node, if the message should say it.

        Raises:
            SimtrainError: ``nodes`` above ``inter_node.nodes``.
        """
        cluster = self.inter_node.nodes
        if cluster is not None and nodes > cluster:
            of = f" of {per_node} GPUs" if per_node is not None else ""
            raise SimtrainError(f"{what}: needs {nodes} nodes{of}, but '{self.name}' has {cluster} nodes "
                                "(inter_node.nodes)")

    @property
    def nic_bandwidth_per_gpu_bytes_per_s(self) -> float:
        """Inter-node bandwidth one GPU gets, per direction: NIC bandwidth x min(1, NICs/GPUs)."""
        share = min(1.0, self.inter_node.nics_per_node / self.gpus_per_node)
        return self.inter_node.bandwidth_bytes_per_s * share


def _nearest(table, shape: tuple[float, ...]) -> tuple:
    """The row of ``table`` whose leading ``len(shape)`` entries are nearest ``shape`` in log space."""
    logs = [math.log(max(x, 1.0)) for x in shape]
    return min(table, key=lambda row: sum((math.log(row[i]) - x) ** 2 for i, x in enumerate(logs)))


def profile_from_file_model(pf: ProfileFile, path: Path | None = None) -> HardwareProfile:
    """Convert a validated :class:`ProfileFile` to SI units.

    Raises:
        SimtrainError: the peer bandwidth exceeds the total per-GPU bandwidth.
    """
    intra = pf.intra_node
    peer = intra.peer_bandwidth_gb_per_s or intra.bandwidth_gb_per_s
    where = path if path is not None else pf.name
    if peer > intra.bandwidth_gb_per_s:
        raise SimtrainError(
            f"{where}: field 'intra_node.peer_bandwidth_gb_per_s' = {peer}: must not exceed "
            f"intra_node.bandwidth_gb_per_s ({intra.bandwidth_gb_per_s})"
        )
    eff = pf.efficiency
    comp = pf.compute or ComputeFile()
    return HardwareProfile(
        name=pf.name,
        description=pf.description,
        source=pf.source,
        peak_flops={k: v * TFLOPS for k, v in pf.peak_tflops.items()},
        hbm_bytes=pf.hbm_gib * GiB,
        hbm_bandwidth_bytes_per_s=pf.hbm_tb_per_s * TB,
        gpus_per_node=pf.gpus_per_node,
        intra_node=Link(
            name=intra.name,
            bandwidth_bytes_per_s=intra.bandwidth_gb_per_s * GB,
            latency_s=intra.latency_us * US,
            efficiency=eff.link,
            peer_bandwidth_bytes_per_s=peer * GB,
            achieved_efficiency=intra.efficiency,
            nvls_efficiency=intra.nvls_efficiency,
            sharing=intra.sharing,
        ),
        inter_node=Link(
            name=pf.inter_node.name,
            bandwidth_bytes_per_s=pf.inter_node.bandwidth_gb_per_s * GB,
            latency_s=pf.inter_node.latency_us * US,
            efficiency=eff.link,
            peer_bandwidth_bytes_per_s=pf.inter_node.bandwidth_gb_per_s * GB,
            nics_per_node=pf.inter_node.nics_per_node,
            achieved_efficiency=pf.inter_node.efficiency,
            nodes=pf.inter_node.nodes,
            alltoall_efficiency=pf.inter_node.alltoall_efficiency,
            sharing=pf.inter_node.sharing,
        ),
        matmul_efficiency=eff.matmul,
        overlap_compute_factor=pf.overlap.compute_factor,
        overlap_sends=pf.overlap.sends,
        overlap_tp=pf.overlap.tp,
        tp_exposed_fraction=pf.overlap.tp_exposed_fraction,
        sms=pf.sms,
        nccl_channels=None if pf.nccl_channels is None else (pf.nccl_channels.intra_node, pf.nccl_channels.inter_node),
        path=path,
        calibration=pf.calibration,
        linear_rates={
            (d, kind): tuple((g.tokens, g.fan_in, g.fan_out, g.tflops * TFLOPS) for g in pts if g.kind == kind)
            for d, pts in comp.linear_tflops.items() for kind in ("F", "I", "W")
        },
        attention_rates={
            d: tuple((a.seq_len, a.head_dim, a.forward_tflops * TFLOPS, a.backward_tflops * TFLOPS) for a in pts)
            for d, pts in comp.attention_tflops.items()
        },
        elementwise_bytes_per_s={k: v * GB for k, v in comp.elementwise_gb_per_s.items()},
        layer_slowdown=dict(comp.layer_slowdown),
        action_overhead_s=comp.action_overhead_us * US,
        message_overhead_s=comp.message_overhead_us * US,
        processors_per_node=comp.processors_per_node,
        optimizer_bytes_per_s=comp.optimizer_gb_per_s * GB if comp.optimizer_gb_per_s else None,
        host_link=None if pf.pcie is None else Link(
            name=pf.pcie.name, bandwidth_bytes_per_s=pf.pcie.bandwidth_gb_per_s * GB, latency_s=pf.pcie.latency_us * US,
            efficiency=pf.pcie.efficiency, peer_bandwidth_bytes_per_s=pf.pcie.bandwidth_gb_per_s * GB,
            sharing=pf.pcie.sharing),
        fused_attention=pf.fused_attention,
    )


def available_profiles() -> list[str]:
    """Names of the built-in profiles (file stems of the package's ``hardware_profiles/``), sorted."""
    return sorted(p.stem for p in PROFILE_DIR.glob("*.yaml"))


def profile_files(extra: list[Path] | tuple[Path, ...] = ()) -> list[tuple[str, Path, bool]]:
    """Every profile file simtrain can find: the built-ins, then the YAML files of the current
    directory's ``hardware_profiles/`` folder, then ``extra`` (files, or folders of YAML files).

    Returns:
        ``(name, path, built_in)`` triples, built-ins first, each group sorted by name.

    Raises:
        SimtrainError: an ``extra`` path does not exist, or is neither a file nor a folder (a device).
    """
    found = [(p.stem, p, True) for p in sorted(PROFILE_DIR.glob("*.yaml"))]
    user = [USER_PROFILE_DIR] if USER_PROFILE_DIR.is_dir() else []
    for entry in [*user, *extra]:
        if entry.is_dir():
            found += [(p.stem, p, False) for p in sorted([*entry.glob("*.yaml"), *entry.glob("*.yml")])]
        elif entry.is_file():
            found.append((entry.stem, entry, False))
        elif entry.exists():  # a device, a pipe: loading's one check says which
            from .loading import MAX_YAML_BYTES, check_regular_file

            check_regular_file(entry, "a profile YAML file or a folder of them", MAX_YAML_BYTES)
        else:
            raise SimtrainError(f"{entry}: no such profile file or folder")
    return found


def _name_field(path: Path) -> str | None:
    """The ``name:`` field of a profile file, or None when it cannot be read."""
    try:
        data = load_yaml_file(path)
    except SimtrainError:
        return None
    return data.get("name") if isinstance(data, dict) and isinstance(data.get("name"), str) else None


def shadowed(name: str) -> list[Path]:
    """The user's profiles (``./hardware_profiles/``) that the built-in profile ``name`` hides: a
    file of that stem or with that ``name:`` field (a name is looked up among the built-ins first)."""
    return [path for stem, path, built_in in profile_files() if not built_in
            and (stem == name or _name_field(path) == name)]


def shadow_note(path: Path, name: str) -> str:
    """The warning for a user profile ``path`` hidden by the built-in ``name`` (:func:`shadowed`)."""
    return (f"{path}: its profile '{name}' is shadowed by the built-in {name}, which a run naming '{name}' "
            f"takes; give the path {path} (or rename the file and its name: field) to use yours")


def resolve_profile_path(name_or_path: str) -> Path:
    """Map a profile name (``h100-sxm``) or a path to a YAML file path.

    A name is looked up among the built-ins, then in ``./hardware_profiles/`` by file name, then by
    the files' ``name:`` field (the name results, errors and the cost model use). A built-in that
    hides a user's profile of the same name warns (:class:`~simtrain.errors.ConfigWarning`).

    Raises:
        SimtrainError: neither a profile name nor an existing file.
    """
    candidate = Path(name_or_path)
    if candidate.suffix in (".yaml", ".yml") or candidate.exists():
        if not candidate.exists():
            raise SimtrainError(f"{candidate}: hardware profile file not found")
        return candidate
    for folder in (PROFILE_DIR, USER_PROFILE_DIR):
        for suffix in (".yaml", ".yml"):
            if (folder / f"{name_or_path}{suffix}").is_file():
                if folder == PROFILE_DIR and USER_PROFILE_DIR.is_dir():
                    for path in shadowed(name_or_path):
                        warnings.warn(ConfigWarning(shadow_note(path, name_or_path)), stacklevel=2)
                return folder / f"{name_or_path}{suffix}"
    user = [path for _, path, built_in in profile_files() if not built_in]
    for path in user:  # a user profile by its `name:` field, the name results and errors use
        if _name_field(path) == name_or_path:
            return path
    names = sorted({name for name, _, _ in profile_files()} | {n for n in map(_name_field, user) if n})
    raise SimtrainError(f"unknown hardware '{name_or_path}': not a file, and not one of {names}")


def load_profile(name_or_path: str | Path) -> HardwareProfile:
    """Load and validate a hardware profile by name or path.

    Args:
        name_or_path: a shipped profile name (see :func:`available_profiles`) or a YAML path.

    Returns:
        The profile in SI units.

    Raises:
        SimtrainError: unknown name, missing file, malformed YAML, or a missing / out-of-range
            field (the message names the file, the field, the value and what is allowed).
    """
    path = resolve_profile_path(str(name_or_path))
    data = load_yaml_file(path)
    pf = validate_model(ProfileFile, data, str(path))
    return profile_from_file_model(pf, path)
