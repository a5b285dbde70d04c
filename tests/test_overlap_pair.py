"""Lowering of an overlapped forward-and-backward pair (DualPipe's F&B): hand-computed times.

A hand-made schedule on two ranks with three stages (0 and 2 on rank 0, 1 on rank 1) puts one
pair on rank 1: ``(1F1;1B0)``. Every chunk has 2 layers, F = 2 s, I = 3 s, W = 1 s (B = 4 s) and
TP collectives of 1 s inside F and 2 s inside the backward; messages are empty (zero-time p2p).
The hand times of the layer-sliced overlap are those of ``overlap.tp: hidden``; the default,
``blocking``, is tested at the end.
"""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from conftest import check_run, tiny_model
from simtrain.costs import stage_costs
from simtrain.engine import simulate
from simtrain.errors import SimtrainError
from simtrain.hardware import PROFILE_DIR, load_profile
from simtrain.lowering import lower
from simtrain.network import Collective, Topology
from simtrain.parallel import ParallelConfig
from simtrain.schedules.ir import Schedule, parse_action

def approx(times):
    """Hand-computed times up to NCCL's microsecond latencies (simtrain.collectives)."""
    return pytest.approx(times, abs=1e-3)


ORDERS = [
    "0F0 0F1 2F0 2B0 2F1 2B1 0B0 0B1",
    "1F0 (1F1;1B0)OVERLAP_F_B 1B1",
]


def _simulate(factor: float = 1.0, sends: str = "per_half", nccl_sms: bool = False, tp: str = "hidden"):
    schedule = Schedule(
        "hand", 2, (0, 1, 0), tuple(tuple(parse_action(a) for a in o.split()) for o in ORDERS),
    )
    schedule.validate()
    hw = dataclasses.replace(load_profile("h100-sxm"), overlap_compute_factor=factor, overlap_sends=sends,
                             overlap_tp=tp)
    if not nccl_sms:  # hand times without the SMs NCCL takes (simtrain.lowering.nccl_sms; tested below)
        hw = dataclasses.replace(hw, nccl_channels=None)
    parallel = ParallelConfig(pp=2, microbatches=2)
    costs = stage_costs(tiny_model(layers=6), parallel, hw, 3)
    # TP collectives of 1 s (F) and 2 s (B): a ring all-reduce over 2 GPUs of M bytes on a link
    # of 1 B/s takes 2 x 1/2 x M / 1 = M seconds, plus NCCL's ~15 us latency (hence approx()).
    hw = dataclasses.replace(hw, intra_node=dataclasses.replace(
        hw.intra_node, latency_s=0.0, efficiency=1.0, achieved_efficiency=1.0, nvls_efficiency=None,
        bandwidth_bytes_per_s=1.0))
    chunks = tuple(
        dataclasses.replace(c, forward_s=2.0, backward_input_s=3.0, backward_weight_s=1.0, p2p_bytes=0.0,
                            tp_forward=(Collective("all-reduce", "tp", 1.0),),
                            tp_backward=(Collective("all-reduce", "tp", 2.0),))
        for c in costs.chunks
    )
    costs = dataclasses.replace(costs, chunks=chunks, optimizer_s_per_param=0.0)
    topology = Topology(hw, parallel.model_copy(update={"tp": 2}))
    trace = simulate(lower(schedule, costs, topology)).trace
    return {row.name: (row.start_s, row.end_s) for row in trace.itertuples()}


def test_halves_alternate_and_each_hides_the_others_communication():
    t = _simulate()
    # rank 1: 1F0 at 3-5 (after 0F0 and its TP), its TP 5-6; the pair starts at 6.
    # F slice 1 at 6-7 (its TP 7-7.5); B slice 1 waits for 2B0's TP (ends 15): 15-17, TP 17-18;
    # F slice 2 waits for the stream: 17-18, TP 18-18.5 (behind B's compute, not exposed);
    # B slice 2 at 18-20, TP 20-21.
    assert t["1F1 (1/2)"] == approx((6, 7)) and t["tp 1F1 (1/2)"] == approx((7, 7.5))
    assert t["1B0 (1/2)"] == approx((15, 17)) and t["tp 1B0 (1/2)"] == approx((17, 18))
    assert t["1F1 (2/2)"] == approx((17, 18)) and t["tp 1F1 (2/2)"] == approx((18, 18.5))
    assert t["1B0 (2/2)"] == approx((18, 20)) and t["tp 1B0 (2/2)"] == approx((20, 21))
    # per_half: 1F1's output leaves when its half is done (18.5), while 1B0's slice still runs
    assert t["p2p 1F1 -> 2F1"] == approx((18.5, 18.5)) and t["2F1"] == approx((18.5, 20.5))
    # then 2F1's TP 20.5-21.5, 2B1 21.5-25.5, its TP 25.5-27.5, and 1B1 can start
    assert t["1B1"][0] == approx(27.5)
    # 1B0's gradient is ready at 21 but waits for rank 0's NVLink port, busy with 2F1's TP
    assert t["tp 2F1"] == approx((20.5, 21.5)) and t["p2p 1B0 -> 0B0"] == approx((21.5, 21.5))


def test_a_tp_collective_takes_its_sms_from_the_other_halfs_compute():
    # 1B0's first TP collective (17-18, intra-node: 24 of the H100's 132 SMs) runs beside F slice
    # 2 (17-18 without it): 108/132 of its 1 s is done by 18, the rest after: it ends at 18 + 24/132
    t = _simulate(nccl_sms=True)
    assert t["tp 1B0 (1/2)"] == approx((17, 18))
    assert t["1F1 (2/2)"] == approx((17, 18 + 24 / 132))
    assert t["1F1 (1/2)"] == approx((6, 7))  # its own TP runs after it: no overlap, no change


def test_after_pair_sends_wait_for_the_whole_pair():
    t = _simulate(sends="after_pair")
    assert t["p2p 1F1 -> 2F1"] == approx((21, 21)) and t["2F1"] == approx((21, 23))
    assert t["1B1"][0] == approx(30)  # everything downstream 2.5 s later
    assert t["p2p 1B0 -> 0B0"] == approx((21, 21))


def test_interference_factor_scales_the_pairs_compute_only():
    t = _simulate(factor=1.5)
    assert t["1F0"] == approx((3, 5))  # plain actions keep their time
    assert t["1F1 (1/2)"] == approx((6, 7.5)) and t["tp 1F1 (1/2)"] == approx((7.5, 8))
    assert t["1B0 (1/2)"] == approx((15, 18)) and t["tp 1B0 (1/2)"] == approx((18, 19))
    assert t["1F1 (2/2)"] == approx((18, 19.5)) and t["tp 1F1 (2/2)"] == approx((19.5, 20))
    assert t["1B0 (2/2)"] == approx((19.5, 22.5)) and t["tp 1B0 (2/2)"] == approx((22.5, 23.5))
    assert t["p2p 1F1 -> 2F1"] == approx((20, 20))


def test_pair_with_dp_and_tp_simulates_consistently():
    from simtrain.scenario import run_schedule

    for name in ("dualpipe", "dualpipev"):
        run = run_schedule(name, tiny_model(num_heads=8), load_profile("h100-sxm"),
                           ParallelConfig(pp=4, tp=2, dp=2, microbatches=8, seq_len=64))
        check_run(run)
        assert (run.result.trace["kind"] == "tp").any() and (run.result.trace["kind"] == "dp").any()


def _profile(tmp_path, overlap):
    data = yaml.safe_load((PROFILE_DIR / "h100-sxm.yaml").read_text())
    data["overlap"] = overlap
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_profile_overlap_section(tmp_path):
    hw = load_profile("h100-sxm")
    assert (hw.overlap_compute_factor, hw.overlap_sends, hw.overlap_tp) == (1.0, "after_pair", "blocking")  # defaults
    hw = load_profile(_profile(tmp_path, {"compute_factor": 1.2, "sends": "after_pair", "tp": "hidden"}))
    assert (hw.overlap_compute_factor, hw.overlap_sends, hw.overlap_tp) == (1.2, "after_pair", "hidden")


@pytest.mark.parametrize("overlap,pattern", [
    ({"compute_factor": 0.3}, r"p.yaml: field 'overlap.compute_factor' = 0.3: must be a finite number >= 0.5 and <= 2"),
    ({"compute_factor": 2.5}, r"field 'overlap.compute_factor' = 2.5: must be a finite number >= 0.5 and <= 2"),
    ({"sends": "sometimes"}, r"field 'overlap.sends' = 'sometimes': Input should be 'per_half' or 'after_pair'"),
    ({"factor": 1.0}, r"field 'overlap.factor' is not a known field"),
    ({"tp": "overlapped"}, r"field 'overlap.tp' = 'overlapped': Input should be 'blocking' or 'hidden'"),
])
def test_bad_overlap_fields(tmp_path, overlap, pattern):
    with pytest.raises(SimtrainError, match=pattern):
        load_profile(_profile(tmp_path, overlap))


def test_blocking_tp_collectives_hold_the_compute_stream_for_both_halves():
    # overlap.tp: blocking (the default): the pair's items run one after another, each slice's
    # TP collective before the other half's next slice. 1F1 (1/2) 6-7, TP 7-7.5; 1B0 (1/2) after
    # 2B0's gradient (15): 15-17, TP 17-18; 1F1 (2/2) 18-19, TP 19-19.5; 1B0 (2/2) 19.5-21.5, TP
    # 21.5-22.5 (hidden: the pair ends at 21, tested above).
    t = _simulate(tp="blocking")
    assert t["1F1 (1/2)"] == approx((6, 7)) and t["tp 1F1 (1/2)"] == approx((7, 7.5))
    assert t["1B0 (1/2)"] == approx((15, 17)) and t["tp 1B0 (1/2)"] == approx((17, 18))
    assert t["1F1 (2/2)"] == approx((18, 19)) and t["tp 1F1 (2/2)"] == approx((19, 19.5))
    assert t["1B0 (2/2)"] == approx((19.5, 21.5)) and t["tp 1B0 (2/2)"] == approx((21.5, 22.5))
    # per_half: 1F1's output leaves at 19.5; 2F1 19.5-21.5, its TP 21.5-22.5, 2B1 22.5-26.5 and
    # its TP 26.5-28.5, after which 1B1 starts
    assert t["2F1"] == approx((19.5, 21.5)) and t["1B1"][0] == approx(28.5)


def test_blocking_tp_collectives_take_no_sms_from_the_pair():
    # nothing of the pair runs beside its TP collectives, so NCCL's SM share changes no time
    assert _simulate(tp="blocking", nccl_sms=True) == _simulate(tp="blocking")


def test_dense_dualpipe_pays_its_tp_collectives_by_default():
    from simtrain.scenario import run_schedule

    model, parallel = tiny_model(num_heads=8), ParallelConfig(pp=4, tp=2, dp=2, microbatches=8, seq_len=64)
    base = load_profile("h100-sxm")
    for name in ("dualpipe", "dualpipev"):
        blocking = run_schedule(name, model, base, parallel)
        hidden = run_schedule(name, model, dataclasses.replace(base, overlap_tp="hidden"), parallel)
        check_run(blocking)
        assert blocking.report.step_time_s > hidden.report.step_time_s
        assert blocking.report.exposed_comm_s > hidden.report.exposed_comm_s
