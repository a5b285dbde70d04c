"""Calibration fits and the calibrated profile, on synthetic measurements (no torch needed)."""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from simtrain.calibration.fit import elementwise_fit, fit_alpha_beta
from simtrain.calibration.profile import build_profile, write_profile
from simtrain.calibration.predict import import_schedule, predict, torch_runtime_costs
from simtrain.calibration.validate import parse_schedules
from simtrain.calibration.workload import ValidationModel, stage_placement
from simtrain.costs import stage_costs
from simtrain.errors import SimtrainError, validate_model
from simtrain.hardware import GB, ProfileFile, load_profile, profile_from_file_model
from simtrain.schedules.ir import OverlapAction, parse_action

from conftest import reference_records


def test_alpha_beta_fit_recovers_latency_and_bandwidth():
    points = [dict(bytes=n, seconds=150e-6 + n / 2.5e9) for n in (4096, 65536, 1 << 20, 1 << 24)]
    fit = fit_alpha_beta(points)
    assert fit.latency_s == pytest.approx(150e-6, rel=1e-6)
    assert fit.bandwidth_bytes_per_s == pytest.approx(2.5e9, rel=1e-6)
    assert fit.r2 == pytest.approx(1.0)
    rec = fit.to_record()
    assert rec["latency_us"] == pytest.approx(150) and rec["bandwidth_gb_per_s"] == pytest.approx(2.5)
    assert [r["bytes"] for r in rec["residuals"]] == [4096, 65536, 1 << 20, 1 << 24]
    assert all(abs(r["error"]) < 1e-6 for r in rec["residuals"])


def test_alpha_beta_fit_weighs_small_messages_like_large_ones():
    # a 20% outlier at the largest size must not wreck the small-message latency
    points = [dict(bytes=n, seconds=100e-6 + n / 1e9) for n in (4096, 16384, 65536, 262144)]
    points.append(dict(bytes=1 << 24, seconds=1.2 * (100e-6 + (1 << 24) / 1e9)))
    fit = fit_alpha_beta(points)
    assert fit.latency_s == pytest.approx(100e-6, rel=0.25)
    assert 0 < fit.r2 <= 1


def test_alpha_beta_fit_rejects_times_that_do_not_grow():
    with pytest.raises(SimtrainError, match="do not grow with size"):
        fit_alpha_beta([dict(bytes=1000, seconds=2e-3), dict(bytes=10**6, seconds=1e-3)])
    with pytest.raises(SimtrainError, match="at least two message sizes"):
        fit_alpha_beta([dict(bytes=1000, seconds=2e-3)])


def test_elementwise_bandwidth_per_class_reproduces_the_class_total():
    points = [
        {"class": "norm", "kernel": "layernorm_F", "tokens": 256, "hidden": 256, "model_bytes": 10e6, "seconds": 1e-3},
        {"class": "norm", "kernel": "layernorm_B", "tokens": 256, "hidden": 256, "model_bytes": 30e6, "seconds": 2e-3},
        {"class": "add", "kernel": "residual_add_F", "tokens": 256, "hidden": 256, "model_bytes": 50e6, "seconds": 1e-3},
    ]
    rates, residuals = elementwise_fit(points)
    assert rates == pytest.approx({"norm": 40e6 / 3e-3, "add": 50e9})
    assert residuals[0]["gb_per_s"] == pytest.approx(10.0)
    assert residuals[0]["error"] == pytest.approx((10e6 / rates["norm"]) / 1e-3 - 1, rel=1e-3)


def _synthetic_measurements(action_s: float, message_s: float) -> dict:
    """What microbench would return on a machine that exactly follows simtrain's model."""
    lin = []
    for t, k, n in ((256, 256, 768), (256, 256, 256), (256, 256, 1024), (256, 1024, 256), (256, 256, 2048)):
        for kind, rate in (("F", 80e9), ("I", 90e9), ("W", 85e9)):
            lin.append(dict(tokens=t, fan_in=k, fan_out=n, kind=kind, seconds=2 * t * k * n / rate, cv=0.02))
    attention = [dict(seq_len=128, head_dim=64, heads=4, batch=2, kind="F", seconds=4 * 2 * 4 * 128**2 * 64 / 40e9, cv=0.0),
                 dict(seq_len=128, head_dim=64, heads=4, batch=2, kind="B", seconds=8 * 2 * 4 * 128**2 * 64 / 20e9, cv=0.0)]
    elementwise = [{"class": c, "kernel": c, "tokens": 256, "hidden": 256, "model_bytes": 1e6, "seconds": 1e6 / r,
                    "cv": 0.0} for c, r in (("norm", 15e9), ("activation", 9e9), ("add", 50e9))]
    meas = dict(
        torch_version="2.13.0+cpu", device_name="test CPU", backend="gloo", world=2, local_world=2,
        threads_per_rank=1, cpu_cores=2, dtype="fp32",
        compute=dict(linear=lin, attention=attention, elementwise=elementwise,
                     peak={"bf16": 0.01}, copy=dict(bytes=2**25, seconds=2 * 2**25 / 20e9, cv=0.01)),
        comm=dict(p2p={"intra_node": [dict(bytes=n, seconds=120e-6 + n / 3e9) for n in (4096, 65536, 1 << 20, 1 << 22)]},
                  all_reduce=[dict(bytes=n, seconds=400e-6 + n / 1e9) for n in (4096, 65536, 1 << 20)],
                  all_to_all=[dict(bytes=n, seconds=200e-6 + n / 2e9) for n in (4096, 65536, 1 << 20)], world=2),
    )
    return meas


def _with_pipeline_runs(meas: dict, slowdown: dict, optimizer_bytes_per_s: float, action_s: float,
                        message_s: float) -> dict:
    """Fill the calibration pipeline runs by simulating a 'true' profile: the kernels fitted from
    ``meas`` with the given in-situ factors, optimizer rate and overheads; every action and step
    takes exactly what that profile predicts."""
    data = build_profile(dict(meas, pipeline={}), None, quick=True)  # kernels and links only
    truth = dataclasses.replace(load_profile_from(data), layer_slowdown=slowdown, action_overhead_s=action_s,
                                message_overhead_s=message_s, optimizer_bytes_per_s=optimizer_bytes_per_s)
    runs = {}
    for name in ("gpipe", "interleaved1f1b", "zbvzerobubble"):
        placement = stage_placement(name, 2)
        for m in (4, 8):
            cfg = ValidationModel(layers=len(placement), microbatches=m)
            orders = _torch_orders(name, m)
            run = dict(schedule=name, model=dataclasses.asdict(cfg), orders=orders, stage_to_rank=placement,
                       recorded=[[str(p) for t in o for p in parse_action(t).parts] for o in orders])
            costs = torch_runtime_costs(stage_costs(cfg.spec(), cfg.parallel(2, len(placement) // 2), truth,
                                                    len(placement)), cfg.vocab)
            attr = dict(F="forward_s", B="backward_s", I="backward_input_s", W="backward_weight_s")
            run["action_compute_s"] = {f"{s}{k}": getattr(costs.chunks[s], attr[k])
                                       for o in run["recorded"] for s, k in {(int(t[0]), t[1]) for t in o}}
            held = [[s for s, r in enumerate(placement) if r == rank] for rank in range(2)]
            run["params"] = [sum(costs.chunks[s].params for s in h) for h in held]
            run["optimizer_compute_s"] = [costs.optimizer_s(h) for h in held]
            step = predict(name, run, cfg, truth, 2).report.step_time_s
            run.update(step_times_s=[step] * 3, preemption=[1.0] * 3, probe_s=[0.017] * 4)
            runs[f"{name} m={m}"] = run
    pipeline = dict(runs=runs, cpu_time_profile=True, probe_model=dataclasses.asdict(ValidationModel()))
    return dict(meas, pipeline=pipeline)


def _torch_orders(name: str, m: int) -> list[list[str]]:
    """GPipe from simtrain's generator; torch's multi-stage orders from the reference data."""
    if name == "gpipe":
        return [[f"{r}F{j}" for j in range(m)] + [f"{r}B{j}" for j in range(m)] for r in range(2)]
    torch_name = {"interleaved1f1b": "Interleaved1F1B", "zbvzerobubble": "ZBVZeroBubble"}[name]
    rec = next(r for r in reference_records(f"torch:{torch_name}") if r["p"] == 2 and r["m"] == m and r["v"] == 2)
    return [rec["orders"]["0"], rec["orders"]["1"]]


def load_profile_from(data: dict):
    """The SI profile of a profile file's contents."""
    return profile_from_file_model(validate_model(ProfileFile, data, "test"))


def test_build_profile_recovers_every_fitted_value():
    slowdown = dict(F=1.07, B=1.03, I=1.12, W=1.2)
    meas = _with_pipeline_runs(_synthetic_measurements(0, 0), slowdown, 12e9, 150e-6, 700e-6)
    data = build_profile(meas, None, quick=True)
    hw = load_profile_from(data)
    assert hw.linear_flops_per_s(256, 256, 1024, "I", "fp32") == pytest.approx(90e9, rel=1e-3)
    assert hw.linear_flops_per_s(300, 250, 1000, "W", "fp32") == pytest.approx(85e9, rel=1e-3)  # nearest shape
    assert hw.attention_flops_per_s(128, 64, "fp32", backward=True) == pytest.approx(20e9, rel=1e-3)
    assert hw.elementwise_bytes_per_s == pytest.approx({"norm": 15e9, "activation": 9e9, "add": 50e9}, rel=1e-3)
    assert hw.intra_node.latency_s == pytest.approx(120e-6, rel=1e-3)
    assert hw.intra_node.bandwidth_bytes_per_s == pytest.approx(3e9, rel=1e-3)
    assert hw.hbm_bandwidth_bytes_per_s == pytest.approx(20e9, rel=1e-3)
    assert hw.layer_slowdown == pytest.approx(slowdown, rel=2e-3)
    assert hw.optimizer_bytes_per_s == pytest.approx(12e9, rel=2e-3)
    assert hw.action_overhead_s == pytest.approx(150e-6, rel=0.03)
    assert hw.message_overhead_s == pytest.approx(700e-6, rel=0.03)
    assert hw.processors_per_node == 2 and hw.peak_flops["bf16"] == pytest.approx(0.01e12)
    rec = data["calibration"]
    assert rec["torch_version"] == "2.13.0+cpu" and rec["backend"] == "gloo" and rec["date"]
    assert rec["links"]["intra_node"]["r2"] == pytest.approx(1.0)
    assert rec["links"]["inter_node"]["measured"] is False
    assert all(abs(r["error"]) < 0.005 for r in rec["overheads"]["residuals"])
    # only middle stages (no embedding, no LM head) rate the passes
    assert {(r["stage"], r["kind"]) for r in rec["layer_slowdown"]["residuals"]} == {
        (1, "F"), (2, "F"), (1, "B"), (2, "B"), (1, "I"), (2, "I"), (1, "W"), (2, "W")}
    assert rec["speed_probe"]["seconds"] == pytest.approx(0.017) and rec["speed_probe"]["model"]["layers"] == 8
    assert "ring_model_error" in rec["collectives"]["all_reduce"]


def test_write_profile_never_overwrites_without_force(tmp_path):
    meas = _with_pipeline_runs(_synthetic_measurements(0, 0), dict(F=1.0, B=1.0), 20e9, 0.0, 300e-6)
    data = build_profile(meas, None, quick=True)
    path = tmp_path / "cpu.yaml"
    write_profile(path, data, force=False)
    assert load_profile(path).name == "cpu-calibrated"
    before = path.read_text()
    with pytest.raises(SimtrainError, match="cpu.yaml: the file exists; choose a new name or pass --force"):
        write_profile(path, data, force=False)
    assert path.read_text() == before
    write_profile(path, {**data, "name": "again"}, force=True)
    assert yaml.safe_load(path.read_text())["name"] == "again"


def test_base_profile_keeps_unmeasured_fabric(tmp_path):
    meas = _with_pipeline_runs(_synthetic_measurements(0, 0), dict(F=1.0, B=1.0), 20e9, 0.0, 0.0)
    data = build_profile(meas, "h100-sxm", quick=False)
    hw = load_profile_from(data)
    h100 = load_profile("h100-sxm")
    assert data["name"] == "h100-sxm-calibrated" and hw.hbm_bytes == h100.hbm_bytes
    # inter-node not measured: the base's bandwidth with its (per-class) efficiency folded in
    assert hw.inter_node.achieved_bandwidth_bytes_per_s == pytest.approx(h100.inter_node.achieved_bandwidth_bytes_per_s)
    assert hw.inter_node.collective_efficiency == 1.0 and hw.intra_node.collective_efficiency == 1.0
    assert hw.intra_node.bandwidth_bytes_per_s == pytest.approx(3 * GB, rel=1e-3)
    # ... and NCCL's all-to-all keeps its achieved NIC rate (0.743 x 50 GB/s), not 0.743 x the folded 47
    a2a = hw.inter_node.bandwidth_bytes_per_s * hw.inter_node.a2a_efficiency
    assert a2a == pytest.approx(h100.inter_node.bandwidth_bytes_per_s * h100.inter_node.a2a_efficiency, rel=1e-3)


@pytest.mark.parametrize("name", ["interleaved1f1b", "loopedbfs", "interleavedzerobubble", "zbvzerobubble", "dualpipev"])
def test_torch_orders_import_into_the_ir(name):
    torch_name = {"interleaved1f1b": "Interleaved1F1B", "loopedbfs": "LoopedBFS",
                  "interleavedzerobubble": "InterleavedZeroBubble", "zbvzerobubble": "ZBVZeroBubble",
                  "dualpipev": "DualPipeV"}[name]
    rec = next(r for r in reference_records(f"torch:{torch_name}") if r["p"] == 2 and r["m"] == 4 and r["v"] == 2)
    orders = [rec["orders"]["0"], rec["orders"]["1"]]
    flat = [[str(p) for t in o for p in parse_action(t).parts] for o in orders]
    placement = stage_placement(name, 2)
    assert placement == [int(rec["stage_to_rank"][str(s)]) for s in range(len(placement))]
    sched = import_schedule(name, dict(orders=orders, recorded=flat, stage_to_rank=placement), 4)
    assert sched.num_stages == 4 and sched.num_microbatches == 4
    overlapped = [a for o in sched.orders for a in o if isinstance(a, OverlapAction)]
    assert bool(overlapped) == (name == "dualpipev")
    # a rank that ran something else is reported, not simulated
    wrong = [list(reversed(flat[0])), flat[1]]
    with pytest.raises(SimtrainError, match=f"validate {name}: torch's schedule for rank 0 lists"):
        import_schedule(name, dict(orders=orders, recorded=wrong, stage_to_rank=placement), 4)


def test_torch_runtime_costs_move_the_first_stage_backward_to_w():
    cfg = ValidationModel()
    hw = load_profile("h100-sxm")
    costs = stage_costs(cfg.spec(), cfg.parallel(2, 2), hw, 4)
    adjusted = torch_runtime_costs(costs, cfg.vocab)
    first, last = adjusted.chunks[0], adjusted.chunks[-1]
    assert first.backward_input_s == 0 and first.backward_weight_s == pytest.approx(costs.chunks[0].backward_s)
    assert first.weight_grad_bytes == first.activation_bytes
    loss = costs.tokens_per_microbatch * 4 * cfg.vocab
    assert last.weight_grad_bytes == pytest.approx(last.activation_bytes - loss)
    assert adjusted.chunks[1].forward_s == costs.chunks[1].forward_s


def test_validate_schedule_names():
    assert parse_schedules("GPipe, Schedule1F1B,dualpipev") == ["gpipe", "1f1b", "dualpipev"]
    assert len(parse_schedules(None)) == 7
    # compare's names (one vocabulary) and torch's class names both work
    assert parse_schedules("interleaved-1f1b,zbv,looped-bfs,interleaved-zb") == \
        parse_schedules("Interleaved1F1B,ScheduleZBVZeroBubble,LoopedBFS,InterleavedZeroBubble") == \
        ["interleaved1f1b", "zbvzerobubble", "loopedbfs", "interleavedzerobubble"]
    with pytest.raises(SimtrainError, match="--schedules: 'zb-h1' has no torch.distributed.pipelining class"):
        parse_schedules("gpipe,zb-h1")
    with pytest.raises(SimtrainError, match="--schedules: unknown schedule 'zigzag'"):
        parse_schedules("zigzag")
    with pytest.raises(SimtrainError, match="at least one"):
        parse_schedules(" , ")


def test_validation_model_is_described_to_the_cost_model():
    cfg = ValidationModel()
    spec = cfg.spec()
    assert (spec.num_layers, spec.hidden_size, spec.ffn_hidden_size, spec.num_heads) == (8, 256, 1024, 4)
    assert spec.activation == "gelu" and spec.norm == "layernorm" and not spec.bias
    # per layer: 4 h^2 attention + 2 x h x 4h MLP weights + 2 LayerNorms (weight and bias)
    assert spec.layer_params(0) == 12 * 256**2 + 4 * 256
