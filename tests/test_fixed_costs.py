"""DeepSpeed-pipeline mechanisms and fixed costs: blocking p2p in TrainSchedule's order, the
gradient-reduction dtype and collective, fp32 gradient accumulation, per-kernel host costs, and
one error line for each bad setting."""

from __future__ import annotations

import copy

import pytest

from simtrain.costs.kernels import OP_DATA, parse_op_data, rates_for
from simtrain.costs.ops import _Ctx, chunk_breakdown, grad_norm_clip_s, ops_runtime, parse_recompute
from simtrain.costs.types import grad_accumulate_bytes_per_param
from simtrain.errors import SimtrainError, load_yaml_file, validate_model
from simtrain.hardware import load_profile
from simtrain.lowering.blocking import deepspeed_steps
from simtrain.models import load_model
from simtrain.parallel import ParallelConfig
from simtrain.scenario import run_schedule
from simtrain.schedules import generate

A100 = load_profile("a100-sxm-80gb")
GPT = load_model("llama3-8b").model_copy(update={"num_layers": 8})


def _par(**kw) -> ParallelConfig:
    return ParallelConfig(**{"tp": 2, "pp": 4, "dp": 2, "microbatches": 6, "seq_len": 1024, "zero_stage": 1, **kw})


def _trace(run):
    t = run.result.table
    return [dict(zip(t, row)) for row in zip(*t.values())]


@pytest.mark.parametrize("p,m", [(2, 1), (4, 2), (4, 8), (5, 3), (12, 24)])
def test_deepspeed_train_schedule_runs_1f1b_compute_order_and_pairs_every_transfer(p, m):
    orders = generate("1f1b", p, m).orders
    sends, recvs = set(), set()
    for s in range(p):
        steps = deepspeed_steps(p, m, s)
        compute = [(x[0], x[1]) for x in steps if x[0] in ("F", "B")]
        assert compute == [(a.kind, a.microbatch) for a in orders[s]]
        for op, kind, peer, mb in (x for x in steps if x[0] in ("send", "recv")):
            (sends if op == "send" else recvs).add((kind, s, peer, mb) if op == "send" else (kind, peer, s, mb))
    assert sends == recvs  # every send has its receive on the peer
    assert len(sends) == 2 * (p - 1) * m


def test_blocking_p2p_is_a_rendezvous_that_stalls_both_ranks():
    asyn = run_schedule("1f1b", GPT, A100, _par(), runtime=ops_runtime(GPT, _par(), A100))
    par = _par(p2p_mode="blocking")
    run = run_schedule("1f1b", GPT, A100, par, runtime=ops_runtime(GPT, par, A100))
    assert run.report.step_time_s > asyn.report.step_time_s
    rows = _trace(run)
    computes = [r for r in rows if r["category"] == "compute" and r["kind"] in ("F", "B")]
    p2p = [r for r in rows if r["kind"] == "p2p"]
    assert len(p2p) == 2 * 3 * 6
    for t in p2p:
        for rank in (t["rank"], t["peer"]):
            mine = [c for c in computes if c["rank"] == rank]
            before = [c for c in mine if c["end_s"] <= t["start_s"] + 1e-12]
            after = [c for c in mine if c["start_s"] >= t["end_s"] - 1e-12]
            # no compute of either rank overlaps the transfer
            assert len(before) + len(after) == len(mine)
    # the gradient reduction of each rank starts after its last transfer ends
    for rank in range(4):
        last = max(t["end_s"] for t in p2p if rank in (t["rank"], t["peer"]))
        dp = [r for r in rows if r["kind"] == "dp" and r["rank"] == rank]
        assert dp and min(r["start_s"] for r in dp) >= last - 1e-12


def test_blocking_p2p_refuses_a_schedule_that_is_not_deepspeeds():
    par = _par(p2p_mode="blocking")
    with pytest.raises(SimtrainError, match="TrainSchedule.*p2p_mode 'async'"):
        run_schedule("gpipe", GPT, A100, par)


def test_fp32_all_reduce_moves_four_times_the_bytes_of_a_bf16_reduce_scatter():
    base = run_schedule("1f1b", GPT, A100, _par(dp_buckets=1))
    fp32 = run_schedule("1f1b", GPT, A100, _par(dp_buckets=1, grad_reduce_dtype="fp32", grad_reduce_op="all-reduce"))

    def grad_tasks(run):
        return {r["rank"]: r for r in _trace(run) if r["name"].startswith("dp grad")}

    b, f = grad_tasks(base), grad_tasks(fp32)
    assert set(b) == set(f) == set(range(4))
    for rank in b:
        assert f[rank]["bytes"] == pytest.approx(2 * b[rank]["bytes"])  # fp32 / bf16
        assert f[rank]["end_s"] - f[rank]["start_s"] > 3 * (b[rank]["end_s"] - b[rank]["start_s"])
    tied = [r for r in _trace(fp32) if r["name"] == "embedding grad all-reduce"]
    assert not tied  # llama3 is untied


def test_fp32_accumulation_casts_and_adds_every_microbatch():
    assert grad_accumulate_bytes_per_param(2, None, 4) == pytest.approx(3 / 4 * 6)
    assert grad_accumulate_bytes_per_param(2, 2, 1) == 0.0
    assert grad_accumulate_bytes_per_param(2, 4, 1) == 2 + 16
    m, h = GPT, A100
    r = rates_for(h)
    bw = h.hbm_bandwidth_bytes_per_s * r.hbm_efficiency
    for dtype, per in ((None, 3 / 6 * 3 * 2 * 5), ("fp32", 18.0)):
        p = _par(grad_reduce_dtype=dtype)
        ctx = _Ctx(m, p, r, "flash", bw, parse_recompute(p.recompute))
        acc = next(o for o in chunk_breakdown(ctx, (0, 1), False, False, 1e9) if o.name == "grad_accum")
        assert acc.seconds[2] == pytest.approx(per * 1e9 / bw if dtype else 3 * 2 * 5 / 6 * 1e9 / bw)


def _launch(par, layers=(0,), model=GPT):
    r = rates_for(A100)
    ctx = _Ctx(model, par, r, "unfused", A100.hbm_bandwidth_bytes_per_s * r.hbm_efficiency,
               parse_recompute(par.recompute))
    ops = chunk_breakdown(ctx, layers, False, False, 1e8)
    return ops, next(o for o in ops if o.name == "launch"), r.host_per_kernel_s


def test_launch_row_is_hidden_for_large_kernels_and_whole_under_cuda_launch_blocking():
    big = _par(microbatch_size=4)
    ops, launch, host = _launch(big)
    assert host == pytest.approx(9.9e-6)  # 4.9 us launch + 5 us eager dispatch (op_data.yaml)
    assert launch.kernels[0] == sum(o.kernels[0] for o in ops if o.name != "launch") > 10
    assert launch.seconds == (0.0, 0.0, 0.0)  # GPU-bound: the host keeps ahead
    _, blocking, _ = _launch(big.model_copy(update={"launch_blocking": True}))
    assert blocking.seconds == pytest.approx(tuple(k * host for k in blocking.kernels))


def test_launch_row_bounds_a_tiny_model_by_its_host():
    tiny = load_model("llama3-8b").model_copy(update={"num_layers": 2, "hidden_size": 64, "ffn_hidden_size": 128,
                                                      "num_heads": 2, "num_kv_heads": 2, "head_dim": None})
    par = ParallelConfig(microbatches=2, seq_len=16)
    ops, launch, host = _launch(par, (0, 1), tiny)
    gpu = [sum(o.seconds[p] for o in ops if o.name != "launch") for p in range(3)]
    for p in range(3):
        assert gpu[p] + launch.seconds[p] == pytest.approx(max(gpu[p], launch.kernels[p] * host))
    assert launch.seconds[0] > 0


@pytest.mark.parametrize("settings,message", [
    ({"p2p_mode": "sync"}, "p2p_mode"),
    ({"grad_reduce_dtype": "fp8"}, "grad_reduce_dtype"),
    ({"grad_reduce_op": "broadcast"}, "grad_reduce_op"),
    ({"grad_reduce_op": "all-reduce", "zero_stage": 2}, "reduce-scatter"),
    ({"launch_blocking": "maybe"}, "launch_blocking"),
    ({"p2p_mode": "blocking", "zero_stage": 3}, "ZeRO stage 0 or 1"),
])
def test_bad_settings_give_one_error_line(settings, message):
    with pytest.raises(SimtrainError, match=message) as err:
        validate_model(ParallelConfig, {"tp": 1, **settings}, "scenario.yaml: parallel")
    assert "\n" not in str(err.value) and "scenario.yaml" in str(err.value)


@pytest.mark.parametrize("host", [{"launch_us": -1}, {"launch_us": "fast"}, {"kernel_us": 3}, {"launch_us": True}])
def test_bad_host_section_of_op_data_is_one_error(host):
    data = copy.deepcopy(load_yaml_file(OP_DATA))
    data["host"] = host
    with pytest.raises(SimtrainError, match="host"):
        parse_op_data(data, "op_data.yaml")


def test_a_published_cases_inter_node_efficiency_is_used():
    from simtrain.published import HardwareRef, _hardware_of

    link = {"name": "Omni-Path", "bandwidth_gb_per_s": 12.5, "nics_per_node": 4, "latency_us": 8}
    default = _hardware_of(HardwareRef(profile="a100-sxm-80gb", inter_node=link))
    slow = _hardware_of(HardwareRef(profile="a100-sxm-80gb", inter_node={**link, "efficiency": 0.5}))
    assert default.inter_node.achieved_efficiency == load_profile("a100-sxm-80gb").inter_node.achieved_efficiency
    assert slow.inter_node.achieved_efficiency == 0.5


def test_an_fp32_accumulation_buffer_is_the_kept_gradient():
    """grad_reduce_dtype fp32 keeps 4-byte gradients (Megatron's fp32 main_grad) under ZeRO 0-2;
    ZeRO-3's sharded gradient belongs to the fp32 master copy already counted."""
    from simtrain.costs import stage_costs
    from simtrain.models import load_model

    m, h = load_model("llama3-8b"), load_profile("h100-sxm")
    for zero, ratio in ((0, 2.0), (1, 2.0), (2, 2.0), (3, 1.0)):
        parts = [stage_costs(m, ParallelConfig(dp=4, pp=2, zero_stage=zero, grad_reduce_dtype=g), h, 2)
                 .static_parts_per_param for g in (None, "fp32")]
        assert parts[1][1] == pytest.approx(ratio * parts[0][1]) and parts[1][0] == parts[0][0]


def test_a_reduce_scatter_without_a_sharded_optimizer_is_refused():
    with pytest.raises(ValueError, match="grad_reduce_op 'reduce-scatter' with zero_stage 0"):
        ParallelConfig(dp=2, grad_reduce_op="reduce-scatter")


def test_fsdp2_casts_into_its_reduce_buffer_instead_of_accumulating():
    """ZeRO-3 with an fp32 reduce (FSDP2's reduce_dtype) moves read 2 + write 4 bytes per parameter
    per backward; DeepSpeed's fp32 accumulator (ZeRO <= 2) also reads and writes the buffer."""
    assert grad_accumulate_bytes_per_param(2, 4, 1, zero_stage=3) == 6
    assert grad_accumulate_bytes_per_param(2, 4, 1, zero_stage=1) == 18
    assert grad_accumulate_bytes_per_param(2, None, 4, zero_stage=3) == pytest.approx(0.75 * 6)


def test_grad_norm_and_clipping_run_on_the_optimizer_shard_over_dp_times_cp():
    """ZeRO-1 shards the optimizer states over DP x CP (costs.stage_costs), so the per-step
    gradient norm and clipping read 1/(dp cp) of the gradient: doubling cp halves it."""
    r = rates_for(A100)
    bw = A100.hbm_bandwidth_bytes_per_s * r.hbm_efficiency
    secs = {}
    for cp, zero in ((1, 1), (2, 1), (2, 0)):
        p = _par(cp=cp, zero_stage=zero)
        secs[cp, zero] = grad_norm_clip_s(_Ctx(GPT, p, r, "flash", bw, parse_recompute(p.recompute)), 1e9)
    assert secs[2, 1] == pytest.approx(secs[1, 1] / 2)
    assert secs[2, 0] == pytest.approx(secs[1, 1] * _par().dp)


def test_an_all_reduced_gradient_is_normed_whole_under_zero_1():
    """DeepSpeed's BF16_Optimizer all-reduces the fp32 gradient and norms and clips all of it
    (get_grads_for_norm), although its optimizer states are sharded: no 1/(dp cp) saving."""
    r = rates_for(A100)
    bw = A100.hbm_bandwidth_bytes_per_s * r.hbm_efficiency
    secs = {op: grad_norm_clip_s(_Ctx(GPT, p, r, "flash", bw, parse_recompute(p.recompute)), 1e9)
            for op, p in (("rs", _par(cp=2)), ("ar", _par(cp=2, grad_reduce_op="all-reduce")))}
    assert secs["ar"] == pytest.approx(secs["rs"] * _par(cp=2).dp_cp)
