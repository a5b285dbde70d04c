"""The calibrated hardware profile: assembled from the fits of :mod:`.fit` on rank 0's
measurements (:func:`build_profile`, file form with units in field names and a ``calibration:``
record of every fit and its residuals) and written to a NEW YAML file (:func:`write_profile`).
"""

from __future__ import annotations

import datetime
import os
import re
import statistics
from pathlib import Path

import numpy as np
import yaml

from .. import atomic
from ..errors import SimtrainError, load_yaml_file, validate_model
from ..hardware import GB, GiB, ProfileFile, resolve_profile_path
from ..network import Link, ring_all_reduce_s
from .fit import (
    AlphaBeta,
    attention_table,
    elementwise_fit,
    fit_alpha_beta,
    fit_overheads,
    in_situ_slowdown,
    linear_table,
    optimizer_rate,
    sig,
)

CPU_RANKS_PER_NODE = 64
"""``gpus_per_node`` of a CPU profile: how many ranks one machine may run (link class only)."""


HBM_MATCH_TOLERANCE = 0.1
"""Largest relative gap between a CUDA device's memory (``torch.cuda.get_device_properties().total_memory``,
a little below the datasheet capacity: ECC and reserved memory) and a shipped profile's ``hbm_gib``
for the profile to stand for the device. Every pair of capacities one GPU name is sold with is
further apart (V100 16/32 GB, A100 40/80 GB, H100 80/94/96 GB, H200 141 GB / GH200 96 GB)."""


def base_profile_data(base: str | None, device: str, device_name: str,
                      memory_bytes: float | None = None) -> tuple[dict, str]:
    """The file form of the profile to start from, and its name (``""`` when built from scratch).

    On ``cuda`` without ``--base`` the shipped profile the device is (:func:`_matching_profile`:
    its GPU and form factor by name, its ``hbm_gib`` by ``memory_bytes``) is used. With
    ``--base``, a base whose ``hbm_gib`` is not the device's memory (beyond
    :data:`HBM_MATCH_TOLERANCE`) takes the device's.

    Args:
        base: ``--base`` (a profile name or file), or None.
        device: ``cuda`` or ``cpu``.
        device_name: ``torch.cuda.get_device_name()`` (cuda).
        memory_bytes: the device's memory in bytes (cuda), or None (not measured).

    Raises:
        SimtrainError: ``--base`` names no profile; a GPU that matches no shipped profile.
    """
    from ..hardware import available_profiles

    if base is None and device == "cuda":
        base = _matching_profile(device_name, available_profiles(), memory_bytes)
        if base is None:
            memory = f" with {memory_bytes / GiB:.1f} GiB of memory" if memory_bytes else ""
            raise SimtrainError(
                f"--base: no shipped profile is GPU '{device_name}'{memory} (by GPU name, form factor and "
                f"hbm_gib); pass --base with a profile file of this GPU, or one of {available_profiles()}"
            )
    if base is None:
        return {}, ""
    try:
        path = resolve_profile_path(base)
    except SimtrainError as exc:
        raise SimtrainError(f"--base {base}: {exc}") from None
    data = load_yaml_file(path)
    validate_model(ProfileFile, data, str(path))
    if device == "cuda" and memory_bytes and not _same_memory(data["hbm_gib"], memory_bytes):
        data = {**data, "hbm_gib": sig(memory_bytes / GiB)}
    return data, path.stem


def _same_memory(hbm_gib: float, memory_bytes: float) -> bool:
    """Whether a device of ``memory_bytes`` is a profile of ``hbm_gib`` (:data:`HBM_MATCH_TOLERANCE`)."""
    return abs(memory_bytes / GiB - hbm_gib) <= HBM_MATCH_TOLERANCE * hbm_gib


_FORM_FACTORS = ("pcie", "nvl", "sxm")


def _matching_profile(device_name: str, names: list[str], memory_bytes: float | None = None) -> str | None:
    """The shipped profile ``torch.cuda.get_device_name()`` is: among those whose GPU (the name's
    first part, ``h100`` of ``h100-sxm``) begins a word of the device name (``h200`` is not
    ``NVIDIA GH200``, ``b200`` not ``NVIDIA GB200``), whose name has the device name's form factor
    (``NVIDIA H100 NVL`` is no shipped profile) and, given ``memory_bytes``, whose ``hbm_gib`` is
    the device's (:func:`_same_memory`: ``A100-SXM4-40GB`` is not ``a100-sxm-80gb``): the one with
    most of its other parts in the device name (``NVIDIA H100 PCIe`` -> ``h100-pcie``,
    ``NVIDIA A100-SXM4-80GB`` -> ``a100-sxm-80gb``); on a tie the SXM form factor (``NVIDIA H100
    80GB HBM3``, the SXM5 part's name, -> ``h100-sxm``), then the shortest name. None when none
    qualifies."""
    from ..hardware import load_profile

    words = [w for w in re.split(r"[^a-z0-9]+", device_name.lower()) if w]
    wanted = "".join(words)
    forms = {f for f in _FORM_FACTORS if any(w.startswith(f) for w in words)}

    def qualifies(name: str) -> bool:
        gpu = name.split("-")[0]
        return (any(w.startswith(gpu) for w in words)
                and all(f in name for f in forms)
                and (memory_bytes is None or _same_memory(load_profile(name).hbm_bytes / GiB, memory_bytes)))

    scored = [(sum(part in wanted for part in name.split("-")[1:]), "sxm" in name, -len(name), name)
              for name in names if qualifies(name)]
    return max(scored)[-1] if scored else None


def build_profile(meas: dict, base: str | None, quick: bool) -> dict:
    """Assemble a profile (file form, units in field names) from rank 0's measurements.

    Args:
        meas: :func:`simtrain.calibration.microbench.run_rank`'s result.
        base: ``--base`` profile name or path, or None.
        quick: whether ``--quick`` was used (recorded).

    Returns:
        A dict that validates as :class:`simtrain.hardware.ProfileFile`, with a ``compute:``
        section and a ``calibration:`` record.
    """
    device = "cuda" if meas["backend"] == "nccl" else "cpu"
    dtype = meas["dtype"]
    data, base_name = base_profile_data(base, device, meas["device_name"], meas.get("device_memory_bytes"))
    data = dict(data)
    today = datetime.date.today().isoformat()
    compute = meas["compute"]
    lin = linear_table(compute["linear"])
    att = attention_table(compute["attention"])
    ew_rates, ew_res = elementwise_fit(compute["elementwise"])
    copy_bw = 2 * compute["copy"]["bytes"] / compute["copy"]["seconds"]
    best_tflops = max(p["tflops"] for p in lin)
    threads = meas.get("threads_per_rank")
    setup = (f"{meas['backend']}, torch {meas['torch_version']}, {meas['world']} ranks"
             + (f" x {threads} thread(s)" if threads else ""))
    record: dict = dict(
        date=today, torch_version=meas["torch_version"], device_name=meas["device_name"], backend=meas["backend"],
        world=meas["world"], ranks_per_node=meas["local_world"], threads_per_rank=threads, dtype=dtype,
        quick=quick, base=base_name or None,
    )
    if meas.get("device_memory_bytes"):
        record["device_memory_gib"] = sig(meas["device_memory_bytes"] / GiB)

    data = _identity(data, base_name, meas, best_tflops, today, setup)
    data["hbm_tb_per_s"] = sig(copy_bw / 1e12)
    record["linear"] = dict(cases=len(lin), best_tflops=best_tflops,
                            cv_median=sig(float(np.median([p["cv"] for p in compute["linear"]]))))
    record["attention"] = dict(cases=len(att), cv_median=sig(float(np.median([p["cv"] for p in compute["attention"]]))))
    record["elementwise"] = dict(gb_per_s={k: sig(v / GB) for k, v in ew_rates.items()}, residuals=ew_res)
    record["copy"] = dict(bytes=compute["copy"]["bytes"], gb_per_s=sig(copy_bw / GB), cv=sig(compute["copy"]["cv"]))

    _fit_links(data, meas, base_name, record)

    processors = None
    if device == "cpu":
        cores = meas.get("cpu_cores") or _cpu_cores()
        processors = max(1, cores // (threads or 1))
    compute_section = dict(
        linear_tflops={dtype: lin},
        attention_tflops={dtype: att},
        elementwise_gb_per_s={k: sig(v / GB) for k, v in ew_rates.items()},
        action_overhead_us=0.0,
    )
    if processors is not None:
        compute_section["processors_per_node"] = processors
    data["compute"] = compute_section
    data["calibration"] = record
    _fit_pipeline(data, meas, compute_section, record)
    validate_model(ProfileFile, data, "calibrated profile")
    return data


def _identity(data: dict, base_name: str, meas: dict, best_tflops: float, today: str, setup: str) -> dict:
    """The profile's name, description, peak and efficiency: from scratch (CPU without ``--base``,
    every number measured) or the base profile's with the measured matmul efficiency; plus its
    ``source`` line. Returns the profile dict (file form)."""
    device = "cuda" if meas["backend"] == "nccl" else "cpu"
    dtype, threads, compute = meas["dtype"], meas.get("threads_per_rank"), meas["compute"]
    if not data:  # a CPU profile from scratch: every number is measured
        data = dict(
            name="cpu-calibrated",
            description=f"{meas['device_name']} ({device}), one rank per {threads or 1} thread(s)",
            peak_tflops={**{k: sig(v) for k, v in compute.get("peak", {}).items()}, dtype: sig(best_tflops)},
            hbm_gib=sig(_physical_memory_bytes() / GiB),
            gpus_per_node=CPU_RANKS_PER_NODE,
            efficiency=dict(matmul=1.0, link=1.0),
        )
    else:
        data["name"] = f"{base_name}-calibrated"
        peak = data["peak_tflops"].get(dtype)
        eff = dict(data["efficiency"])
        if peak:
            eff["matmul"] = sig(min(1.0, best_tflops / peak))
        else:
            data["peak_tflops"] = {**data["peak_tflops"], dtype: sig(best_tflops)}
        data["efficiency"] = eff
        data["description"] = f"{data['description']}; calibrated on {meas['device_name']}"
    data["source"] = f"calibrated on {today} by simtrain calibrate ({setup})" + (
        f"; fabric and capacity from {base_name}" if base_name else "")
    return data


def _fit_links(data: dict, meas: dict, base_name: str, record: dict) -> None:
    """Fill the profile's ``intra_node`` and ``inter_node`` links from the p2p alpha-beta fits
    (or the base profile's, efficiency folded into bandwidth), and record the fits and the
    collectives' fits in ``record``.

    Raises:
        SimtrainError: a link class neither measured nor in a base profile.
    """
    device = "cuda" if meas["backend"] == "nccl" else "cpu"
    old_eff = float(data["efficiency"]["link"])
    links = {}
    comm = meas.get("comm") or {}
    for cls, points in (comm.get("p2p") or {}).items():
        links[cls] = fit_alpha_beta(points)
    for cls in ("intra_node", "inter_node"):
        section = dict(data.get(cls) or {})
        if cls in links:
            fit = links[cls]
            section.update(latency_us=sig(fit.latency_s * 1e6), bandwidth_gb_per_s=sig(fit.bandwidth_bytes_per_s / GB))
            section.pop("peer_bandwidth_gb_per_s", None)
            section.pop("efficiency", None)  # the measured bandwidth is the achieved one
            section.pop("alltoall_efficiency", None)  # ... for NCCL's all-to-all too (the base's: another cluster)
            section.setdefault("name", "loopback (gloo)" if device == "cpu" else cls)
            record.setdefault("links", {})[cls] = {**fit.to_record(), "measured": True}
        elif section:  # keep the base's link, folding its (per-class, else link) efficiency into the bandwidth
            eff = section.pop("efficiency", old_eff)
            section["bandwidth_gb_per_s"] = sig(section["bandwidth_gb_per_s"] * eff)
            if section.get("alltoall_efficiency"):  # still the same achieved all-to-all rate
                section["alltoall_efficiency"] = sig(min(1.0, section["alltoall_efficiency"] / eff))
            if section.get("peer_bandwidth_gb_per_s"):
                section["peer_bandwidth_gb_per_s"] = sig(section["peer_bandwidth_gb_per_s"] * eff)
            record.setdefault("links", {})[cls] = dict(measured=False, note=f"not measured: from {base_name}")
        elif cls == "inter_node" and "intra_node" in links:  # one machine: nothing crosses nodes
            fit = links["intra_node"]
            section = dict(name="not measured (copy of intra_node)", latency_us=sig(fit.latency_s * 1e6),
                           bandwidth_gb_per_s=sig(fit.bandwidth_bytes_per_s / GB))
            record.setdefault("links", {})[cls] = dict(measured=False, note="one machine: copy of intra_node")
        else:
            raise SimtrainError(
                f"calibration: no {cls} link measured and no --base profile to take it from "
                "(run with 2 or more ranks, or pass --base)"
            )
        if cls == "inter_node":
            section.setdefault("nics_per_node", 1)
        data[cls] = section
    data["efficiency"] = {**data["efficiency"], "link": 1.0}
    if "intra_node" in links:
        record["collectives"] = _collective_records(comm, links["intra_node"], meas["world"])


def _fit_pipeline(data: dict, meas: dict, compute_section: dict, record: dict) -> None:
    """From the real pipeline steps of the calibration (if any): the optimizer rate, the per-pass
    in-situ factors, the speed-probe reference and the per-action and per-message overheads, into
    ``compute_section`` and ``record``."""
    pipeline = meas.get("pipeline") or {}
    action_s, message_s, overhead_res = 0.0, 0.0, []
    if pipeline.get("runs"):
        rate, rate_res = optimizer_rate(pipeline)
        compute_section["optimizer_gb_per_s"] = sig(rate / GB)
        record["optimizer"] = dict(gb_per_s=sig(rate / GB), residuals=rate_res)
        slowdown, slowdown_res = in_situ_slowdown(data, pipeline, meas["world"])
        if slowdown:
            compute_section["layer_slowdown"] = {k: sig(v) for k, v in slowdown.items()}
        record["layer_slowdown"] = dict(**{k: sig(v) for k, v in slowdown.items()}, residuals=slowdown_res)
        action_s, message_s, overhead_res = fit_overheads(data, pipeline, meas["world"])
        probes = [p for run in pipeline["runs"].values() for p in run["probe_s"]]
        # validation's reference speed (simtrain.calibration.predict.speed_reference): the probe
        # timed between these steps, at the same speed as the in-situ factors and overheads
        record["speed_probe"] = dict(seconds=statistics.median(probes), cv=sig(float(np.std(probes) / np.mean(probes))),
                                     model=pipeline["probe_model"])
    compute_section["action_overhead_us"] = sig(action_s * 1e6)
    compute_section["message_overhead_us"] = sig(message_s * 1e6)
    record["overheads"] = dict(action_us=sig(action_s * 1e6), message_us=sig(message_s * 1e6),
                               residuals=overhead_res)


def _collective_records(comm: dict, p2p: AlphaBeta, world: int) -> dict:
    """Alpha-beta fits of all-reduce and all-to-all, with the ring model's error on the p2p link."""
    link = Link("p2p fit", p2p.bandwidth_bytes_per_s, p2p.latency_s, 1.0, p2p.bandwidth_bytes_per_s)
    out = {}
    for name in ("all_reduce", "all_to_all"):
        points = comm.get(name) or []
        if len(points) < 2:
            continue
        try:
            rec = fit_alpha_beta(points).to_record()
        except SimtrainError as exc:
            rec = dict(error=str(exc))
        if name == "all_reduce":
            rec["ring_model_error"] = [
                dict(bytes=p["bytes"], error=sig(ring_all_reduce_s(p["bytes"], world, link, link.bandwidth_bytes_per_s)
                                                  / p["seconds"] - 1))
                for p in points
            ]
        out[name] = rec
    return out


def _physical_memory_bytes() -> float:
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 16 * GiB


def _cpu_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def write_profile(path: Path, data: dict, force: bool) -> None:
    """Write ``data`` as YAML to a NEW file ``path``.

    Raises:
        SimtrainError: ``path`` exists and ``force`` is False, or it cannot be written.
    """
    if path.exists() and not force:
        raise SimtrainError(f"--out {path}: the file exists; choose a new name or pass --force to overwrite it")
    header = (
        f"# Calibrated hardware profile written by `simtrain calibrate` on {data['calibration']['date']}.\n"
        "# compute.* and the links are measured; `calibration:` records each fit and its residuals.\n"
    )
    atomic.write_text(path, header + yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=120),
                      overwrite=force, flag="--out")
