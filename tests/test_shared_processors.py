"""Processor sharing in the engine, and the calibrated runtime costs the lowering adds."""

from __future__ import annotations

import dataclasses

import pytest

from conftest import tiny_model
from simtrain.engine import TaskGraph, simulate
from simtrain.hardware import load_profile
from simtrain.network import Topology
from simtrain.parallel import ParallelConfig
from simtrain.scenario import run_schedule


def _ends(graph: TaskGraph) -> dict[str, float]:
    trace = simulate(graph).trace
    return dict(zip(trace["name"], trace["end_s"]))


def test_two_tasks_on_one_processor_share_it():
    g = TaskGraph(num_ranks=2, pools={"cpu": 1.0})
    g.add(name="a", rank=0, category="compute", kind="F", duration_s=2.0, pool="cpu")
    g.add(name="b", rank=1, category="compute", kind="F", duration_s=2.0, pool="cpu")
    assert _ends(g) == pytest.approx({"a": 4.0, "b": 4.0})


def test_a_task_joining_later_slows_the_running_one():
    # a: 3 s of work from t=0; b: 1 s of work from t=1 (after c). From t=1 both run at 1/2:
    # b finishes at t=3, a has 1 s left at t=3 and ends at t=4.
    g = TaskGraph(num_ranks=2, pools={"cpu": 1.0})
    g.add(name="a", rank=0, category="compute", kind="F", duration_s=3.0, pool="cpu")
    c = g.add(name="c", rank=1, category="compute", kind="F", duration_s=1.0)
    g.add(name="b", rank=1, category="compute", kind="F", duration_s=1.0, deps=[c.tid], pool="cpu")
    assert _ends(g) == pytest.approx({"a": 4.0, "c": 1.0, "b": 3.0})


def test_pool_with_enough_processors_runs_at_full_speed():
    g = TaskGraph(num_ranks=3, pools={"cpu": 2.0})
    for r, d in enumerate((1.0, 2.0, 3.0)):
        g.add(name=f"t{r}", rank=r, category="compute", kind="F", duration_s=d, pool="cpu")
    # three tasks on two processors: rate 2/3 until t1 ends (1 s of work: t=1.5), then full speed
    ends = _ends(g)
    assert ends["t0"] == pytest.approx(1.5)
    assert ends["t1"] == pytest.approx(1.5 + (2.0 - 1.0))
    assert ends["t2"] == pytest.approx(1.5 + (3.0 - 1.0))


def _cpu_profile(**compute):
    """h100-sxm turned into a 2-processor machine with calibrated runtime costs."""
    hw = load_profile("h100-sxm")
    return dataclasses.replace(hw, **compute)


def test_topology_pools_ranks_beyond_the_processors():
    hw = _cpu_profile(processors_per_node=2)
    assign, pools = Topology(hw, ParallelConfig(pp=4)).processor_pools(4)
    assert set(assign) == {0, 1, 2, 3} and pools == {"processors:node0": 2.0}
    assert Topology(hw, ParallelConfig(pp=2)).processor_pools(2) == ({}, {})
    assert Topology(load_profile("h100-sxm"), ParallelConfig(pp=8)).processor_pools(8) == ({}, {})


def test_four_ranks_on_two_processors_take_twice_as_long_in_steady_state():
    model = tiny_model()
    par = ParallelConfig(pp=4, microbatches=16)
    own = run_schedule("gpipe", model, _cpu_profile(), par, op_times=(1.0, 1.0, 1.0), comm=False)
    shared = run_schedule("gpipe", model, _cpu_profile(processors_per_node=2), par, op_times=(1.0, 1.0, 1.0),
                          comm=False)
    # all compute (4 ranks x 16 microbatches x 3 units) on 2 processors cannot finish before 96
    assert shared.report.step_time_s >= 96 - 1e-9
    assert own.report.step_time_s == pytest.approx((16 + 3) * 3)
    assert shared.report.step_time_s > own.report.step_time_s


def test_per_action_overhead_adds_to_every_action():
    model, par = tiny_model(), ParallelConfig(pp=2, microbatches=4)
    base = run_schedule("gpipe", model, _cpu_profile(), par, op_times=(1.0, 1.0, 1.0), comm=False)
    slow = run_schedule("gpipe", model, _cpu_profile(action_overhead_s=0.5), par, op_times=(1.0, 1.0, 1.0),
                        comm=False)
    # GPipe with unit costs: (m + p - 1) x (F + B); every action 0.5 s longer
    assert base.report.step_time_s == pytest.approx((4 + 1) * 3)
    assert slow.report.step_time_s == pytest.approx((4 + 1) * (1.5 + 2.5))


def test_message_overhead_charges_sender_and_receiver():
    model, par = tiny_model(), ParallelConfig(pp=2, microbatches=1, dtype="fp32")
    hw = _cpu_profile()
    run = run_schedule("gpipe", model, dataclasses.replace(hw, message_overhead_s=0.25), par,
                       op_times=(1.0, 1.0, 1.0))
    ref = run_schedule("gpipe", model, hw, par, op_times=(1.0, 1.0, 1.0))
    compute = run.result.trace[run.result.trace["category"] == "compute"]
    durations = {(r.stage, r.kind): r.end_s - r.start_s for r in compute.itertuples()}
    # 0F sends, 1F receives, 1B sends, 0B receives: each pays 0.25 s once
    assert durations == pytest.approx({(0, "F"): 1.25, (1, "F"): 1.25, (1, "B"): 2.25, (0, "B"): 2.25})
    assert run.report.step_time_s == pytest.approx(ref.report.step_time_s + 4 * 0.25)
