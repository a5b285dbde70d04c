"""Fit the microbenchmarks of :mod:`.microbench` and write a NEW hardware profile.

* Links: ``t(n) = alpha + n / beta`` per link class from p2p ping-pong (one-way time), fitted by
  least squares on relative error (weights ``1 / t²``, so 4 KiB and 16 MiB messages count alike);
  R² (on the times) and the relative residual of every size are kept. The profile's link latency
  is alpha and its bandwidth beta (``efficiency.link`` = 1: the fit already is what is achieved).
  All-reduce and all-to-all get their own fits, recorded with the error of simtrain's ring model
  (:mod:`simtrain.network`) on the p2p link, so a user sees how far collectives stray from it.
* Linear layers and attention: tables of achieved TFLOP/s (FLOPs as the cost model counts them /
  median seconds), used by the cost model shape by shape.
* Elementwise kernels: one bandwidth per class (norm, activation, add), the bytes the cost model
  counts for them divided by their measured time (summed over kernels and shapes); each kernel's
  own rate is kept as a residual.
* Copy: read + write bytes / seconds, the profile's memory bandwidth.
* Real pipeline steps of the calibration model (:func:`.microbench.pipeline_benchmark`), fitted in
  this order, each with what the previous ones found:

  - ``layer_slowdown`` (:func:`in_situ_slowdown`): per pass (F, a full backward B, and torch's
    split backward I and W), the time the middle stages' actions took inside the steps over the
    cost model's sum of their kernels; the cost model applies it. Kernels inside a training step
    run slower than alone (activations of several microbatches alive, caches, allocation,
    autograd and pipelining code between kernels), and a split backward costs more than a full
    one.
  - ``optimizer_gb_per_s`` (:func:`optimizer_rate`): the Adam steps' rate in the bytes the cost
    model counts for them.
  - per-action and per-message overheads (:func:`fit_overheads`): the values with which
    simtrain's own simulation of the same runs (each in the order its ranks ran) reproduces their
    step times (non-negative least squares; the simulated step is piecewise linear in both), so
    p2p latency is not counted twice.
  - the speed probe's median over the steps: the machine's speed while all this was measured,
    which ``validate`` compares its own probes with.
"""

from __future__ import annotations

import datetime
import math
import os
import statistics
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import yaml

from ..errors import SimtrainError, load_yaml_file, validate_model
from ..hardware import GB, GiB, ProfileFile, profile_from_file_model, resolve_profile_path
from ..models import ModelSpec
from ..network import Link, ring_all_reduce_s
from ..parallel import ParallelConfig

CPU_RANKS_PER_NODE = 64
"""``gpus_per_node`` of a CPU profile: how many ranks one machine may run (link class only)."""


@dataclass(frozen=True)
class AlphaBeta:
    """A latency + bytes / bandwidth fit.

    Attributes:
        latency_s: alpha, seconds.
        bandwidth_bytes_per_s: beta, bytes/s.
        r2: coefficient of determination of the fit on the measured times.
        residuals: per message size ``(bytes, measured_s, fitted_s)``.
    """

    latency_s: float
    bandwidth_bytes_per_s: float
    r2: float
    residuals: tuple[tuple[float, float, float], ...]

    def seconds(self, nbytes: float) -> float:
        """Fitted time of an ``nbytes`` message."""
        return self.latency_s + nbytes / self.bandwidth_bytes_per_s

    def to_record(self) -> dict:
        """The ``calibration:`` entry: latency_us, bandwidth_gb_per_s, r2, residuals."""
        return dict(
            latency_us=_sig(self.latency_s * 1e6),
            bandwidth_gb_per_s=_sig(self.bandwidth_bytes_per_s / GB),
            r2=_sig(self.r2),
            residuals=[
                dict(bytes=int(n), measured_us=_sig(t * 1e6), fitted_us=_sig(f * 1e6), error=_sig(f / t - 1))
                for n, t, f in self.residuals
            ],
        )


def fit_alpha_beta(points: list[dict]) -> AlphaBeta:
    """Fit ``t = alpha + bytes / beta`` to ``[{bytes, seconds}, ...]`` (relative least squares).

    Raises:
        SimtrainError: fewer than two sizes, or times that do not grow with size (no positive
            bandwidth can be fitted).
    """
    n = np.array([p["bytes"] for p in points], dtype=float)
    t = np.array([p["seconds"] for p in points], dtype=float)
    if len(n) < 2:
        raise SimtrainError("calibration: an alpha-beta fit needs at least two message sizes")
    w = 1.0 / t
    design = np.stack([np.ones_like(n), n], axis=1) * w[:, None]
    (alpha, inv_beta), *_ = np.linalg.lstsq(design, t * w, rcond=None)
    if inv_beta <= 0:
        raise SimtrainError(
            f"calibration: message times {list(np.round(t * 1e6, 1))} us do not grow with size "
            f"{list(n.astype(int))} bytes; no bandwidth can be fitted (rerun on a quieter machine)"
        )
    alpha = max(float(alpha), 0.0)
    fitted = alpha + n * inv_beta
    ss_res = float(((t - fitted) ** 2).sum())
    ss_tot = float(((t - t.mean()) ** 2).sum())
    r2 = 1 - ss_res / ss_tot if ss_tot > 0 else 1.0
    return AlphaBeta(alpha, 1.0 / float(inv_beta), r2, tuple(zip(n.tolist(), t.tolist(), fitted.tolist())))


def _sig(x: float, digits: int = 4) -> float:
    """``x`` rounded to ``digits`` significant digits (for readable YAML)."""
    if x == 0 or not math.isfinite(x):
        return float(x)
    return float(round(x, digits - 1 - int(math.floor(math.log10(abs(x))))))


# ----------------------------------------------------------------------------- compute tables
def linear_table(points: list[dict]) -> list[dict]:
    """``compute.linear_tflops`` entries from the linear-layer measurements."""
    return [
        dict(tokens=p["tokens"], fan_in=p["fan_in"], fan_out=p["fan_out"], kind=p["kind"],
             tflops=_sig(2 * p["tokens"] * p["fan_in"] * p["fan_out"] / p["seconds"] / 1e12))
        for p in points
    ]


def attention_table(points: list[dict]) -> list[dict]:
    """``compute.attention_tflops`` entries: forward and backward rates per (seq_len, head_dim).

    FLOPs are the cost model's: ``4·b·a·s²·d`` forward (``Q·Kᵀ`` and ``softmax·V`` over the full
    ``s x s`` scores, Narayanan et al. 2021) and twice that backward.
    """
    by_shape: dict[tuple, dict] = {}
    for p in points:
        key = (p["seq_len"], p["head_dim"])
        flops = 4 * p["batch"] * p["heads"] * p["seq_len"] ** 2 * p["head_dim"] * (2 if p["kind"] == "B" else 1)
        by_shape.setdefault(key, {})[p["kind"]] = flops / p["seconds"] / 1e12
    return [
        dict(seq_len=s, head_dim=d, forward_tflops=_sig(r["F"]), backward_tflops=_sig(r["B"]))
        for (s, d), r in sorted(by_shape.items())
    ]


def elementwise_fit(points: list[dict]) -> tuple[dict[str, float], list[dict]]:
    """Bandwidth (bytes/s) per class of memory-bound kernels, and each kernel's rate against it.

    A class's bandwidth is the bytes the cost model counts for its kernels divided by their
    measured time, summed over kernels and shapes (so it predicts their total exactly).
    """
    rates = {}
    for cls in sorted({p["class"] for p in points}):
        members = [p for p in points if p["class"] == cls]
        rates[cls] = sum(p["model_bytes"] for p in members) / sum(p["seconds"] for p in members)
    residuals = [
        dict(kernel=p["kernel"], tokens=p["tokens"], hidden=p["hidden"],
             gb_per_s=_sig(p["model_bytes"] / p["seconds"] / GB),
             error=_sig((p["model_bytes"] / rates[p["class"]]) / p["seconds"] - 1))
        for p in points
    ]
    return rates, residuals


# ----------------------------------------------------------------------------- real pipeline steps
PASS_COST = dict(F="forward_s", B="backward_s", I="backward_input_s", W="backward_weight_s")
"""The :class:`simtrain.costs.ChunkCost` attribute each recorded action kind is compared with."""


def _pipeline_costs(hw, run: dict, world: int):
    """The cost model's per-chunk costs of one calibration run (torch's runtime adjustments applied)."""
    from ..costs import stage_costs
    from .validate import TORCH_SCHEDULES, ValidationModel, torch_runtime_costs

    cfg = ValidationModel(**run["model"])
    per_rank = TORCH_SCHEDULES[run["schedule"]][1]
    costs = stage_costs(cfg.spec(), cfg.parallel(world, per_rank), hw, world * per_rank)
    return torch_runtime_costs(costs, cfg.vocab)


def in_situ_slowdown(profile_data: dict, pipeline: dict, world: int) -> tuple[dict[str, float], list[dict]]:
    """Per-pass ratio of what a stage's actions took inside real pipeline steps to the cost model's
    sum of their kernels: the profile's ``layer_slowdown``.

    Every F, B, I and W that the calibration runs (:func:`simtrain.calibration.microbench.pipeline_benchmark`)
    recorded on a middle stage (no embedding, no LM head: torch computes the loss outside the
    stage's forward) is compared, in the compute clock, with the kernels the cost model counts for
    it under the profile being built without slowdown. Inside a step the kernels run with
    several microbatches' activations alive, after other stages' work, with torch's autograd and
    pipelining code in between: all of that is in the ratio. A pass's factor is its actions' total
    measured time over their total kernel time; a pass no run measured is left out (the cost model
    then uses 1 for F and B, and B's factor for I and W).

    Returns:
        ``(factors, residuals)``; residuals give per run, stage and pass the measured and kernel
        milliseconds and the ratio.
    """
    hw = replace(profile_from_file_model(validate_model(ProfileFile, profile_data, "calibrated profile")),
                 layer_slowdown={})
    sums: dict[str, list[float]] = {}
    rows = []
    for label, run in pipeline["runs"].items():
        chunks = _pipeline_costs(hw, run, world).chunks
        for key, measured in sorted(run["action_compute_s"].items()):
            stage, kind = int(key[:-1]), key[-1]
            chunk = chunks[stage]
            if chunk.has_embedding or chunk.has_head or kind not in PASS_COST:
                continue
            kernels = getattr(chunk, PASS_COST[kind])
            sums.setdefault(kind, [0.0, 0.0])
            sums[kind][0] += measured
            sums[kind][1] += kernels
            rows.append(dict(run=label, stage=stage, kind=kind, measured_ms=_sig(measured * 1e3),
                             kernels_ms=_sig(kernels * 1e3), ratio=_sig(measured / kernels)))
    factors = {k: m / p for k, (m, p) in sorted(sums.items()) if p > 0}
    return factors, rows


def optimizer_rate(pipeline: dict) -> tuple[float, list[dict]]:
    """Bytes/s of the optimizer step in the bytes the cost model counts (``OPTIMIZER_BYTES_PER_PARAM``
    per parameter), from the Adam steps of the calibration runs (all runs and ranks together).

    Returns:
        ``(bytes_per_s, residuals)`` with each run's and rank's parameters, milliseconds and rate.
    """
    from ..costs import OPTIMIZER_BYTES_PER_PARAM

    total_bytes = total_s = 0.0
    rows = []
    for label, run in pipeline["runs"].items():
        for rank, (params, seconds) in enumerate(zip(run["params"], run["optimizer_compute_s"])):
            nbytes = OPTIMIZER_BYTES_PER_PARAM * params
            total_bytes += nbytes
            total_s += seconds
            rows.append(dict(run=label, rank=rank, params=int(params), measured_ms=_sig(seconds * 1e3),
                             gb_per_s=_sig(nbytes / seconds / GB)))
    return total_bytes / total_s, rows


def fit_overheads(profile_data: dict, pipeline: dict, world: int) -> tuple[float, float, list[dict]]:
    """Per-action and per-message seconds with which the simulator reproduces the calibration runs.

    Each run of :func:`simtrain.calibration.microbench.pipeline_benchmark` is simulated in the
    order its ranks ran, with the profile being built (kernels, in-situ factors, optimizer, links),
    at the speed its steps ran (on one-thread CPU ranks: the median wall / CPU time of the ranks'
    actions, as ``validate`` predicts); the simulated step is piecewise linear in both overheads
    (``base + a·action + b·message`` near any point), so they are found by non-negative least
    squares over all runs (relative errors), linearising again around each new estimate. Inside a
    real step a message costs more than between idle ranks (on gloo a transfer from or to a rank
    that is computing waits for its communication thread to be scheduled), which is why the runs
    carry real compute and activation-sized messages.

    Returns:
        ``(action_s, message_s, residuals)``; residuals give measured and simulated steps.
    """
    from .validate import ValidationModel, at_speed, cpu_slowdown, predict

    hw = profile_from_file_model(validate_model(ProfileFile, profile_data, "calibrated profile"))
    runs = list(pipeline["runs"].items())
    speed = {}
    for label, run in runs:
        cfg = ValidationModel(**run["model"])
        speed[label] = (cpu_slowdown(run["schedule"], run, cfg, hw, world, statistics.median(run["preemption"]))
                        if pipeline.get("cpu_time_profile") else 1.0)

    def simulate(label: str, run: dict, action_s: float, message_s: float) -> float:
        probe = at_speed(replace(hw, action_overhead_s=action_s, message_overhead_s=message_s), speed[label])
        cfg = ValidationModel(**run["model"])
        return predict(run["schedule"], run, cfg, probe, world).report.step_time_s

    measured = {label: statistics.median(run["step_times_s"]) for label, run in runs}
    # The simulated step is piecewise linear in the two overheads (the critical path can change),
    # so linearise around the current estimate and solve again until it settles.
    coef = np.zeros(2)
    step_s = 1e-5
    for _ in range(4):
        rows = []
        for label, run in runs:
            base = simulate(label, run, *coef)
            a = (simulate(label, run, coef[0] + step_s, coef[1]) - base) / step_s
            b = (simulate(label, run, coef[0], coef[1] + step_s) - base) / step_s
            rows.append((measured[label], base - a * coef[0] - b * coef[1], a, b))
        y = np.array([(t - intercept) / t for t, intercept, _, _ in rows])
        design = np.array([[a / t, b / t] for t, _, a, b in rows])
        new = _nonnegative_lstsq(design, y)
        if np.allclose(new, coef, rtol=1e-4, atol=1e-9):
            break
        coef = new
    residuals = []
    for label, run in runs:
        sim = simulate(label, run, *coef)
        residuals.append(dict(run=label, measured_ms=_sig(measured[label] * 1e3), simulated_ms=_sig(sim * 1e3),
                              speed_factor=_sig(speed[label]), error=_sig(sim / measured[label] - 1)))
    return float(coef[0]), float(coef[1]), residuals


def _nonnegative_lstsq(design: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with non-negative coefficients (all free, or each alone with the others 0)."""
    best, best_err = np.zeros(design.shape[1]), float((y**2).sum())
    candidates = [np.linalg.lstsq(design, y, rcond=None)[0]]
    for j in range(design.shape[1]):
        col = design[:, j]
        c = np.zeros(design.shape[1])
        c[j] = float(col @ y / (col @ col)) if col @ col > 0 else 0.0
        candidates.append(c)
    for c in candidates:
        if (c >= 0).all():
            err = float(((design @ c - y) ** 2).sum())
            if err < best_err:
                best, best_err = c, err
    return best


# ----------------------------------------------------------------------------- the profile
def base_profile_data(base: str | None, device: str, device_name: str) -> tuple[dict, str]:
    """The file form of the profile to start from, and its name (``""`` when built from scratch).

    On ``cuda`` without ``--base`` the shipped profile whose name matches the device name
    (``H100`` -> ``h100-sxm`` ...) is used.

    Raises:
        SimtrainError: ``--base`` names no profile; a GPU that matches no shipped profile.
    """
    from ..hardware import available_profiles

    if base is None and device == "cuda":
        wanted = device_name.lower().replace(" ", "")
        for name in available_profiles():
            if name.split("-")[0] in wanted:
                base = name
                break
        if base is None:
            raise SimtrainError(
                f"--base: no shipped profile matches GPU '{device_name}'; pass --base with one of "
                f"{available_profiles()} or a profile file"
            )
    if base is None:
        return {}, ""
    path = resolve_profile_path(base)
    data = load_yaml_file(path)
    validate_model(ProfileFile, data, str(path))
    return data, path.stem


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
    data, base_name = base_profile_data(base, device, meas["device_name"])
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

    if not data:  # a CPU profile from scratch: every number is measured
        data = dict(
            name="cpu-calibrated",
            description=f"{meas['device_name']} ({device}), one rank per {threads or 1} thread(s)",
            peak_tflops={**{k: _sig(v) for k, v in compute.get("peak", {}).items()}, dtype: _sig(best_tflops)},
            hbm_gib=_sig(_physical_memory_bytes() / GiB),
            gpus_per_node=CPU_RANKS_PER_NODE,
            efficiency=dict(matmul=1.0, link=1.0),
        )
    else:
        data["name"] = f"{base_name}-calibrated"
        peak = data["peak_tflops"].get(dtype)
        eff = dict(data["efficiency"])
        if peak:
            eff["matmul"] = _sig(min(1.0, best_tflops / peak))
        else:
            data["peak_tflops"] = {**data["peak_tflops"], dtype: _sig(best_tflops)}
        data["efficiency"] = eff
        data["description"] = f"{data['description']}; calibrated on {meas['device_name']}"
    data["source"] = f"calibrated on {today} by simtrain calibrate ({setup})" + (
        f"; fabric and capacity from {base_name}" if base_name else "")
    data["hbm_tb_per_s"] = _sig(copy_bw / 1e12)
    record["linear"] = dict(cases=len(lin), best_tflops=best_tflops,
                            cv_median=_sig(float(np.median([p["cv"] for p in compute["linear"]]))))
    record["attention"] = dict(cases=len(att), cv_median=_sig(float(np.median([p["cv"] for p in compute["attention"]]))))
    record["elementwise"] = dict(gb_per_s={k: _sig(v / GB) for k, v in ew_rates.items()}, residuals=ew_res)
    record["copy"] = dict(bytes=compute["copy"]["bytes"], gb_per_s=_sig(copy_bw / GB), cv=_sig(compute["copy"]["cv"]))

    old_eff = float(data["efficiency"]["link"])
    links = {}
    comm = meas.get("comm") or {}
    for cls, points in (comm.get("p2p") or {}).items():
        links[cls] = fit_alpha_beta(points)
    for cls in ("intra_node", "inter_node"):
        section = dict(data.get(cls) or {})
        if cls in links:
            fit = links[cls]
            section.update(latency_us=_sig(fit.latency_s * 1e6), bandwidth_gb_per_s=_sig(fit.bandwidth_bytes_per_s / GB))
            section.pop("peer_bandwidth_gb_per_s", None)
            section.setdefault("name", "loopback (gloo)" if device == "cpu" else cls)
            record.setdefault("links", {})[cls] = {**fit.to_record(), "measured": True}
        elif section:  # keep the base's link, folding its efficiency into the bandwidth
            section["bandwidth_gb_per_s"] = _sig(section["bandwidth_gb_per_s"] * old_eff)
            if section.get("peer_bandwidth_gb_per_s"):
                section["peer_bandwidth_gb_per_s"] = _sig(section["peer_bandwidth_gb_per_s"] * old_eff)
            record.setdefault("links", {})[cls] = dict(measured=False, note=f"not measured: from {base_name}")
        elif cls == "inter_node" and "intra_node" in links:  # one machine: nothing crosses nodes
            fit = links["intra_node"]
            section = dict(name="not measured (copy of intra_node)", latency_us=_sig(fit.latency_s * 1e6),
                           bandwidth_gb_per_s=_sig(fit.bandwidth_bytes_per_s / GB))
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

    processors = None
    if device == "cpu":
        cores = meas.get("cpu_cores") or _cpu_cores()
        processors = max(1, cores // (threads or 1))
    compute_section = dict(
        linear_tflops={dtype: lin},
        attention_tflops={dtype: att},
        elementwise_gb_per_s={k: _sig(v / GB) for k, v in ew_rates.items()},
        action_overhead_us=0.0,
    )
    if processors is not None:
        compute_section["processors_per_node"] = processors
    data["compute"] = compute_section
    data["calibration"] = record
    pipeline = meas.get("pipeline") or {}
    action_s, message_s, overhead_res = 0.0, 0.0, []
    if pipeline.get("runs"):
        rate, rate_res = optimizer_rate(pipeline)
        compute_section["optimizer_gb_per_s"] = _sig(rate / GB)
        record["optimizer"] = dict(gb_per_s=_sig(rate / GB), residuals=rate_res)
        slowdown, slowdown_res = in_situ_slowdown(data, pipeline, meas["world"])
        if slowdown:
            compute_section["layer_slowdown"] = {k: _sig(v) for k, v in slowdown.items()}
        record["layer_slowdown"] = dict(**{k: _sig(v) for k, v in slowdown.items()}, residuals=slowdown_res)
        action_s, message_s, overhead_res = fit_overheads(data, pipeline, meas["world"])
        probes = [p for run in pipeline["runs"].values() for p in run["probe_s"]]
        # validation's reference speed (simtrain.calibration.validate.probe_reference): the probe
        # timed between these steps, at the same speed as the in-situ factors and overheads
        record["speed_probe"] = dict(seconds=statistics.median(probes), cv=_sig(float(np.std(probes) / np.mean(probes))),
                                     model=pipeline["probe_model"])
    compute_section["action_overhead_us"] = _sig(action_s * 1e6)
    compute_section["message_overhead_us"] = _sig(message_s * 1e6)
    record["overheads"] = dict(action_us=_sig(action_s * 1e6), message_us=_sig(message_s * 1e6),
                               residuals=overhead_res)
    validate_model(ProfileFile, data, "calibrated profile")
    return data


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
                dict(bytes=p["bytes"], error=_sig(ring_all_reduce_s(p["bytes"], world, link, link.bandwidth_bytes_per_s)
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
    try:
        path.write_text(header + yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=120))
    except OSError as exc:
        raise SimtrainError(f"--out {path}: cannot write the file ({exc.strerror})") from None
