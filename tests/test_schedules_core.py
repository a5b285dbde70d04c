"""GPipe and 1F1B: orders equal torch's, and unit-cost bubbles and memory equal the formulas."""

from __future__ import annotations

import pytest

from conftest import reference_records, unit_run
from simtrain.schedules import ScheduleError, generate, parse_action
from simtrain.schedules.ir import Action, OverlapAction


@pytest.mark.parametrize("ref,name", [("torch:GPipe", "gpipe"), ("torch:1F1B", "1f1b")])
def test_orders_equal_torch(ref, name):
    records = reference_records(ref)
    assert len(records) == 8
    for rec in records:
        ours = generate(name, rec["p"], rec["m"]).text_orders()
        theirs = [rec["orders"][str(r)] for r in range(rec["p"])]
        assert ours == theirs, f"{name} p={rec['p']} m={rec['m']}"


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p,m", [(1, 1), (2, 1), (2, 4), (4, 8), (4, 3), (8, 32), (5, 7)])
def test_unit_bubble_equals_formula(name, p, m):
    # F = 1, B = I + W = 2: bubble time (p-1)(F+B) per rank, ratio (p-1)/(m+p-1).
    rep = unit_run(name, p, m).report
    assert rep.step_time_s == pytest.approx((m + p - 1) * 3)
    assert rep.bubble_time_s_per_rank == pytest.approx([(p - 1) * 3] * p)
    assert rep.bubble_ratio == pytest.approx((p - 1) / (m + p - 1))
    assert rep.exposed_comm_s == 0 and rep.overlap_ratio is None


@pytest.mark.parametrize("p,m", [(4, 8), (4, 2), (8, 32), (3, 3)])
def test_peak_inflight(p, m):
    assert unit_run("gpipe", p, m).report.peak_inflight_microbatches == [m] * p
    assert unit_run("1f1b", p, m).report.peak_inflight_microbatches == [min(m, p - r) for r in range(p)]


def test_1f1b_holds_less_memory_than_gpipe():
    g = unit_run("gpipe", 4, 16).report
    f = unit_run("1f1b", 4, 16).report
    assert max(f.peak_memory_bytes) < max(g.peak_memory_bytes)


@pytest.mark.parametrize("args,msg", [
    (("gpipe", 0, 4), "--pp = 0"),
    (("1f1b", 4, 0), "--microbatches = 0"),
    (("gpipe", 4, 4, 2), "--vp = 2"),
    (("nope", 4, 4), "unknown schedule 'nope'"),
])
def test_generator_errors(args, msg):
    name, p, m, *vp = args
    from simtrain.schedules import REGISTRY
    with pytest.raises(ScheduleError, match=msg.replace("-", r"\-")):
        if name in REGISTRY and vp:
            REGISTRY[name].generator(p, m, *vp)
        else:
            generate(name, p, m, *vp)


def test_action_text_roundtrip():
    assert parse_action("12I3") == Action(12, "I", 3)
    pair = parse_action("(4F4;3B0)OVERLAP_F_B")
    assert isinstance(pair, OverlapAction) and str(pair) == "(4F4;3B0)OVERLAP_F_B"
    with pytest.raises(ScheduleError, match="not an action"):
        parse_action("0X1")
