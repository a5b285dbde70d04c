"""Waved-EP in the engine: the flow shop of dispatch, expert compute and combine waves.

The cases come from the reference data (tests/data/waved_ep_model.json, see its README): per MoE
layer and EP rank, dispatch D, expert compute L = L1 + A + L2, combine C, w waves. With dispatch and
combine on independent resources the makespan is (D+L+C)/w + (w-1)/w * max(D, L, C); when they
share one link it is at least max(D+C, L).
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import DATA
from simtrain.engine import TaskGraph, simulate
from simtrain.lowering.items import Transfer
from simtrain.lowering.moe import add_block, flow_shop_makespan
from simtrain.network import A2APart

CASES = json.loads((DATA / "waved_ep_model.json").read_text())["cases"]
WAVES = (1, 2, 3, 4, 8, 16, 64)


def link(latency_s: float, transfer_s: float, nbytes: float, port: str) -> list[Transfer]:
    return [Transfer(A2APart("x", nbytes, latency_s, transfer_s), (port,))]


def block_makespan(d: float, l: float, c: float, waves: int, shared: bool) -> float:
    """Simulate one MoE block on one rank: the lowering's own wave builder, no latency."""
    g = TaskGraph(num_ranks=1)
    port_d, port_c = ("link", "link") if shared else ("dispatch", "combine")
    add_block(g, 0, waves=waves, after=[], expert_s=l, to_experts=link(0.0, d, 0.0, port_d),
              back=link(0.0, c, 0.0, port_c))
    res = simulate(g)
    assert len(res.trace) == 3 * waves
    return res.makespan_s


@pytest.mark.parametrize("case", CASES, ids=[c["case"] for c in CASES])
@pytest.mark.parametrize("waves", WAVES)
def test_reference_cases_full_and_half_duplex(case, waves):
    d, l, c = case["D"], case["L1"] + case["A"] + case["L2"], case["C"]
    full = block_makespan(d, l, c, waves, shared=False)
    half = block_makespan(d, l, c, waves, shared=True)
    # the reference rounds to 6 decimals
    assert full == pytest.approx(case[f"T_wave_fullduplex_w{waves}"], abs=1e-6)
    assert half == pytest.approx(case[f"T_wave_halfduplex_w{waves}"], abs=1e-6)
    assert full == pytest.approx(flow_shop_makespan(d, l, c, waves), rel=1e-12)
    assert half >= max(d + c, l) - 1e-12
    if waves == 1:
        assert full == half == pytest.approx(case["T_naive"], rel=1e-12)


@settings(max_examples=60, deadline=None)
@given(
    d=st.floats(0.01, 10), l=st.floats(0.01, 10), c=st.floats(0.01, 10), waves=st.integers(1, 12),
)
def test_flow_shop_formula_holds_exactly_for_any_times(d, l, c, waves):
    full = block_makespan(d, l, c, waves, shared=False)
    assert full == pytest.approx((d + l + c) / waves + (waves - 1) / waves * max(d, l, c), rel=1e-9)
    half = block_makespan(d, l, c, waves, shared=True)
    assert max(d + c, l) - 1e-9 <= half <= d + l + c + 1e-9
    assert full <= half + 1e-9


def test_one_wave_is_serial_and_waves_pay_latency_each():
    # latency 1 per wave on each transfer: w waves pay it w times
    g = TaskGraph(num_ranks=1)
    add_block(g, 0, waves=4, after=[], expert_s=8.0, to_experts=link(1.0, 4.0, 400.0, "d"),
              back=link(1.0, 4.0, 400.0, "c"))
    res = simulate(g)
    a2a = res.trace[res.trace["kind"] == "a2a"]
    assert len(a2a) == 8 and (a2a["end_s"] - a2a["start_s"]).tolist() == [2.0] * 8
    assert a2a["bytes"].tolist() == [100.0] * 8
    # D = C = 4 + 4 latency = 8 in all, L = 8: w = 4 equal stages of 2 -> (8+8+8)/4 + 3/4*8
    assert res.makespan_s == pytest.approx(12.0)


def test_waves_wait_for_what_precedes_the_block():
    g = TaskGraph(num_ranks=1)
    attn = g.add(name="attention", rank=0, category="compute", kind="F", duration_s=3.0, stream="compute")
    experts, sent, back = add_block(g, 0, waves=2, after=[attn.tid], expert_s=2.0,
                                    to_experts=link(0.0, 2.0, 0.0, "d"), back=link(0.0, 2.0, 0.0, "c"))
    rows = simulate(g).trace.set_index("name")
    assert min(rows.loc[t.name, "start_s"] for t in sent) == 3.0
    for e, s, b in zip(experts, sent, back):
        assert rows.loc[e.name, "start_s"] >= rows.loc[s.name, "end_s"]
        assert rows.loc[b.name, "start_s"] >= rows.loc[e.name, "end_s"]
    assert max(rows["end_s"]) == pytest.approx(3.0 + flow_shop_makespan(2.0, 2.0, 2.0, 2))
