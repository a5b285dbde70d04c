"""Interleaved and Zero Bubble schedules: orders equal the reference implementations', unit-cost
bubbles and memory equal the papers' formulas, and bad parameters give one clear error."""

from __future__ import annotations

import csv
import io

import pytest

from conftest import check_run, reference_records, tiny_model, unit_run
from simtrain.hardware import load_profile
from simtrain.parallel import ParallelConfig
from simtrain.scenario import run_schedule
from simtrain.schedules import REGISTRY, ScheduleError, ScheduleWarning, generate
from simtrain.schedules.io import parse_torch_csv

GOLDEN = [  # (reference in tests/data/schedule_orders.json, our schedule, records expected)
    ("torch:Interleaved1F1B", "interleaved-1f1b", 24),
    ("sailsg:Megatron-Interleaved1F1B", "interleaved-1f1b", 16),
    ("torch:LoopedBFS", "looped-bfs", 24),
    ("torch:InterleavedZeroBubble", "interleaved-zb", 24),
    ("torch:ZBVZeroBubble", "zbv", 8),
    ("sailsg:ZB-H1", "zb-h1", 8),
    ("sailsg:ZB-H2", "zb-h2", 7),  # the 8th record is sail-sg's refusal of m < 2p, tested below
]


@pytest.mark.filterwarnings("ignore::simtrain.schedules.ScheduleWarning")  # padded ZB-V; interleaved v=1
@pytest.mark.parametrize("ref,name,count", GOLDEN)
def test_orders_and_placement_equal_the_reference(ref, name, count):
    records = reference_records(ref)
    assert len(records) == count
    for rec in records:
        ours = generate(name, rec["p"], rec["m"], rec.get("v") or 1)
        where = f"{name} p={rec['p']} m={rec['m']} v={rec.get('v')}"
        assert ours.text_orders() == [rec["orders"][str(r)] for r in range(rec["p"])], where
        assert {str(s): r for s, r in enumerate(ours.stage_to_rank)} == rec["stage_to_rank"], where


def _record_schedule(rec: dict):
    """A reference record as a torch CSV, imported the way a user would."""
    out = io.StringIO()
    writer = csv.writer(out)
    for r in range(rec["p"]):
        writer.writerow(rec["orders"][str(r)])
    return parse_torch_csv(out.getvalue(), "zbv-sailsg", "record")


@pytest.mark.filterwarnings("ignore::simtrain.schedules.ScheduleWarning")
def test_sailsg_zbv_differs_from_ours_only_in_where_w_runs():
    """sail-sg's zbv.py and torch's ZBVZeroBubble issue the same F and I on every rank; for
    m >= 2p - 1 they part only after the last forward, in the cool-down W's."""
    records = reference_records("sailsg:ZB-V(sail-sg zbv.py)")
    assert len(records) == 8
    for rec in records:
        p, m = rec["p"], rec["m"]
        ours = generate("zbv", p, m).text_orders()
        for r in range(p):
            theirs = rec["orders"][str(r)]
            assert [a for a in ours[r] if "W" not in a] == [a for a in theirs if "W" not in a]
            assert sorted(ours[r]) == sorted(theirs)
            if m >= 2 * p - 1:
                first_diff = next(i for i, (a, b) in enumerate(zip(ours[r], theirs)) if a != b)
                last_forward = max(i for i, a in enumerate(ours[r]) if "F" in a)
                assert first_diff > last_forward
        # importable and simulated: zero span bubble and 2p chunk activations for m >= 2p
        run = run_schedule(_record_schedule(rec), tiny_model(), load_profile("h100-sxm"), ParallelConfig(),
                           op_times=(1.0, 1.0, 1.0), comm=False)
        check_run(run)
        if m >= 2 * p:
            assert run.report.span_bubble_ratio == pytest.approx(0, abs=1e-12)
            assert run.report.peak_inflight_microbatches == [2 * p] * p
            assert run.report.step_time_s == unit_run("zbv", p, m).report.step_time_s


# --------------------------------------------------------------------------- formulas, unit costs
@pytest.mark.parametrize("p,m", [(2, 4), (3, 6), (4, 8), (4, 16), (8, 16), (4, 4), (4, 7)])
def test_zb_h1_bubble_and_memory(p, m):
    # Qi et al. 2024 Table 2: bubble (p-1)(T_F + T_B - T_W) per rank (T_B is our I), peak p M_B.
    rep = unit_run("zb-h1", p, m).report
    assert rep.bubble_time_s_per_rank == pytest.approx([(p - 1) * (1 + 1 - 1)] * p)
    assert rep.peak_inflight_microbatches == [p - r for r in range(p)]  # 1F1B's: max p on rank 0


@pytest.mark.parametrize("p,m", [(2, 4), (3, 6), (4, 8), (4, 16), (8, 16), (4, 9)])
def test_zb_h2_zero_span_bubble_and_memory(p, m):
    rep = unit_run("zb-h2", p, m).report
    assert rep.span_bubble_ratio == pytest.approx(0, abs=1e-12)
    assert rep.bubble_ratio > 0  # the warm-up wait still counts in simtrain's bubble ratio
    # Table 2: (2p-1) M_B at most; worker i (1-indexed) holds (2p-2i+1) activations
    assert rep.peak_inflight_microbatches == [2 * p - 2 * r - 1 for r in range(p)]


@pytest.mark.parametrize("F,I,W", [(1.0, 1.5, 0.8), (1.2, 1.0, 0.5), (1.0, 3.0, 1.0)])
def test_zb_formulas_with_unequal_times(F, I, W):
    """The Table 2 bubbles for T_W <= min(T_F, T_B): ZB-H1 (p-1)(T_F+T_B-T_W) per rank, ZB-H2 a
    per-rank span of m(T_F+T_B+T_W) + (p-1)(T_F+T_B-2T_W) (sail-sg efficiency.py asserts both)."""
    p, m = 4, 8
    h1 = unit_run("zb-h1", p, m, op_times=(F, I, W)).report
    assert h1.bubble_time_s_per_rank == pytest.approx([(p - 1) * (F + I - W)] * p)
    h2 = unit_run("zb-h2", p, m, op_times=(F, I, W)).report
    ideal = m * (F + I + W)
    assert ideal / (1 - h2.span_bubble_ratio) == pytest.approx(ideal + (p - 1) * (F + I - 2 * W))


@pytest.mark.parametrize("p,m", [(2, 4), (3, 6), (4, 8), (4, 16), (8, 16), (4, 7)])
def test_zbv_zero_span_bubble_and_memory(p, m):
    rep = unit_run("zbv", p, m).report
    assert rep.span_bubble_ratio == pytest.approx(0, abs=1e-12)
    # 2p chunk activations on every rank = p activations of a 1F1B stage (ZB paper §6)
    assert rep.peak_inflight_microbatches == [2 * p] * p


def test_zbv_with_too_few_microbatches_warns_and_pads():
    with pytest.warns(ScheduleWarning, match=r"zbv: --microbatches = 4 with --pp 4: .* m >= 2 x pp - 1 = 7"):
        run = unit_run("zbv", 4, 4)
    check_run(run)
    assert run.report.span_bubble_ratio > 0.1  # the padded pipeline never fills


@pytest.mark.filterwarnings("ignore::simtrain.schedules.ScheduleWarning")  # v = 1
@pytest.mark.parametrize("p,m,v", [(2, 4, 2), (4, 8, 2), (4, 16, 4), (3, 6, 3), (4, 4, 2), (8, 16, 2), (4, 8, 1)])
def test_interleaved_bubble_and_memory(p, m, v):
    # Megatron §2.2.2: bubble (p-1)(t_f+t_b)/v of full stages = (p-1)(F+B) of one chunk (F=1, B=2).
    rep = unit_run("interleaved-1f1b", p, m, v).report
    assert rep.bubble_time_s_per_rank == pytest.approx([(p - 1) * 3] * p)
    assert rep.step_time_s == pytest.approx(3 * (m * v + p - 1))
    # warm-up forwards (Megatron-LM get_pp_rank_microbatches) plus the one in flight
    assert rep.peak_inflight_microbatches == [min(m * v, (p - r - 1) * 2 + (v - 1) * p + 1) for r in range(p)]


def test_interleaving_beats_1f1b_and_looped_bfs_holds_everything():
    p, m, v = 4, 8, 2
    inter = unit_run("interleaved-1f1b", p, m, v).report
    plain = unit_run("1f1b", p, m, op_times=(v, v, v)).report  # one stage = v chunks
    assert inter.bubble_time_s_per_rank[0] == pytest.approx(plain.bubble_time_s_per_rank[0] / v)
    bfs = unit_run("looped-bfs", p, m, v).report
    assert bfs.peak_inflight_microbatches == [m * v] * p


@pytest.mark.filterwarnings("ignore::simtrain.schedules.ScheduleWarning")  # v = 1
@pytest.mark.parametrize("p,m,v", [(4, 8, 2), (4, 8, 1), (2, 6, 3)])
def test_interleaved_zb_runs_and_holds_less_than_interleaved_1f1b(p, m, v):
    zb = unit_run("interleaved-zb", p, m, v)
    check_run(zb)
    inter = unit_run("interleaved-1f1b", p, m, v).report
    assert zb.report.step_time_s <= inter.step_time_s
    # warm-up of (v-1)g + (p-r-1) forwards: one hop per rank instead of two
    assert zb.report.peak_inflight_microbatches[0] == min(m * v, (v - 1) * p + p - 1 + 1)


# --------------------------------------------------------------------------- split backward memory
def test_split_backward_frees_activation_at_i_and_weight_inputs_at_w():
    """Lowering: F allocates M_B; I's end frees M_B - M_W; W's end frees M_W (ZB Table 1)."""
    run = unit_run("zb-h1", 1, 1, op_times=(1.0, 2.0, 4.0), recompute="none")
    chunk = run.costs.chunks[0]
    assert 0 < chunk.weight_grad_bytes < chunk.activation_bytes
    mem = run.result.memory
    static = mem[mem["time_s"] == 0]["bytes"].iloc[0]
    level = lambda t: mem[mem["time_s"] <= t]["bytes"].iloc[-1] - static  # noqa: E731
    assert level(0.5) == pytest.approx(chunk.activation_bytes)  # during F
    assert level(2.0) == pytest.approx(chunk.activation_bytes)  # during I
    assert level(3.0) == pytest.approx(chunk.weight_grad_bytes)  # after I, during W
    assert level(7.0) == pytest.approx(0)  # after W


@pytest.mark.parametrize("name,peak", [
    ("zb-h1", lambda p, i: (p - i + 1, i - 1)),  # Table 2 / §2.3: (p-i+1) M_B + (i-1) M_W
    ("zb-h2", lambda p, i: (2 * p - 2 * i + 1, 2 * i - 2)),  # (2p-2i+1) M_B + (2i-2) M_W
])
def test_peak_memory_per_worker_matches_zero_bubble(name, peak):
    p, m = 4, 8
    # no recomputation, unfused attention (the paper's M_B = 34sbh + 5as^2b): M_W < M_B on every stage
    run = unit_run(name, p, m, recompute="none", attention="unfused")
    assert all(c.weight_grad_bytes < 0.95 * c.activation_bytes for c in run.costs.chunks)
    mem = run.result.memory
    static = mem[mem["time_s"] == 0].groupby("rank")["bytes"].first()
    top = mem.groupby("rank")["bytes"].max()
    for r in range(p):
        c = run.costs.chunks[r]
        n_b, n_w = peak(p, r + 1)
        assert top[r] - static[r] == pytest.approx(n_b * c.activation_bytes + n_w * c.weight_grad_bytes)


# --------------------------------------------------------------------------- bad parameters
@pytest.mark.parametrize("args,msg", [
    (("interleaved-1f1b", 4, 9, 2), "interleaved-1f1b: --microbatches = 9 with --pp 4: torch's ScheduleInterleaved"
                                     "1F1B runs 2 rounds of microbatches and needs m to be a multiple of 2"),
    (("interleaved-1f1b", 4, 8, 0), "interleaved-1f1b: --vp = 0: must be >= 1 stage per rank"),
    (("interleaved-zb", 4, 9, 2), "interleaved-zb: --microbatches = 9 with --pp 4: torch's ScheduleInterleaved"
                                   "ZeroBubble runs 2 rounds of microbatches and needs m to be a multiple of 2"),
    (("looped-bfs", 4, 8, -1), "looped-bfs: --vp = -1"),
    (("zb-h2", 4, 7), "zb-h2: --microbatches = 7 with --pp 4: ZB-H2 needs m >= 2 x pp = 8"),
    (("zb-h1", 4, 8, 2), "zb-h1: --vp = 2: this schedule runs 1 stage(s) per rank"),
    (("zbv", 4, 8, 3), "zbv: --vp = 3: this schedule runs 1 or 2 stage(s) per rank"),
])
def test_generator_errors(args, msg):
    name, p, m, *vp = args
    with pytest.raises(ScheduleError) as err:
        REGISTRY[name].generator(p, m, *vp)
    assert msg in str(err.value)


def test_interleaved_with_one_stage_per_rank_warns():
    with pytest.warns(ScheduleWarning, match="interleaved-1f1b: --vp = 1: one stage per rank, so nothing is"):
        sched = generate("interleaved-1f1b", 4, 8, 1)
    assert sched.num_stages == 4


def test_generate_passes_vp_only_to_schedules_that_take_it():
    assert generate("zb-h1", 4, 8, vp=2).num_stages == 4
    assert generate("zbv", 4, 8, vp=2).num_stages == 8
    assert generate("interleaved-1f1b", 4, 8, vp=3).num_stages == 12
    assert {n for n, i in REGISTRY.items() if i.uses_vp} >= {"interleaved-1f1b", "looped-bfs", "interleaved-zb"}
    with pytest.raises(ScheduleError, match="interleaved-zb: --vp = 0"):
        generate("interleaved-zb", 4, 8, vp=0)
