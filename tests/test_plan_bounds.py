"""The planner's analytic bounds never exceed what the simulator reports (so pruning is safe)."""

from __future__ import annotations

import pytest

from simtrain.costs import stage_costs
from simtrain.hardware import load_profile
from simtrain.network import Topology
from simtrain.parallel import ParallelConfig
from simtrain.plan_bounds import (aggregate, cheap_step_bound, mean_bounds, memory_bound, schedule_shape,
                                  shape_microbatches, step_bound)
from simtrain.scenario import run_schedule
from simtrain.schedules import REGISTRY, generate

from conftest import tiny_model, tiny_moe

CASES = [(name, rc) for name in REGISTRY for rc in ("none", "full")]


@pytest.mark.parametrize("name,recompute", CASES)
@pytest.mark.parametrize("m", [8, 40])
def test_bounds_are_below_the_simulation(name, recompute, m, h100):
    vp = 2 if REGISTRY[name].uses_vp else 1
    par = ParallelConfig(tp=2, pp=4, dp=2, vp=vp, microbatches=m, microbatch_size=2, seq_len=512,
                         recompute=recompute, zero_stage=1)
    model = tiny_model(layers=16)
    run = run_schedule(name, model, h100, par)
    rep = run.report
    schedule = generate(name, par.pp, par.microbatches, par.vp)
    costs = stage_costs(model, par, h100, schedule.num_chunks)
    # the planner's shortcuts: a schedule capped to fewer microbatches (counts scaled back up), and
    # chunk costs summed from one-layer chunks built for one microbatch
    capped = generate(name, par.pp, shape_microbatches(m, par.pp), par.vp)
    per_layer = stage_costs(model, par.model_copy(update=dict(microbatches=1, pp=1, vp=1)), h100, model.num_layers)
    summed = aggregate(per_layer, schedule.num_chunks)
    for shapes in (schedule_shape(schedule), schedule_shape(capped, m)):
        for c in (costs, summed):
            step, mem = step_bound(shapes, c, Topology(h100, par)), memory_bound(shapes, c)
            assert 0 < step <= rep.step_time_s * (1 + 1e-9)
            assert 0 < mem <= max(rep.peak_memory_bytes) * (1 + 1e-9)
    assert memory_bound(schedule_shape(schedule), summed) == pytest.approx(memory_bound(schedule_shape(schedule), costs))
    means = mean_bounds(costs, Topology(h100, par), paired=name.startswith("dualpipe"))
    cheap = cheap_step_bound(means, par.microbatches, par.pp, copies=name == "dualpipe")
    assert cheap <= rep.step_time_s * (1 + 1e-9) and means.static_bytes / par.pp <= mem
    # per layer (the planner's screening costs): one layer per chunk, one microbatch of gradient accumulation
    per_layer = stage_costs(model, par.model_copy(update=dict(microbatches=1, pp=1, vp=1)), h100, model.num_layers)
    cheap = cheap_step_bound(mean_bounds(per_layer, Topology(h100, par), paired=name.startswith("dualpipe")), par.microbatches,
                             par.pp, copies=name == "dualpipe")
    assert cheap <= rep.step_time_s * (1 + 1e-9)


def test_memory_bound_is_the_simulated_peak_without_communication_buffers(h100):
    """With 1F1B the in-flight count is exact (rank 0 holds pp activations): bound == simulated peak."""
    model = tiny_model(layers=8)
    par = ParallelConfig(pp=4, microbatches=8, seq_len=256)
    run = run_schedule("1f1b", model, h100, par)
    schedule = generate("1f1b", 4, 8)
    costs = stage_costs(model, par, h100, 4)
    assert memory_bound(schedule_shape(schedule), costs) == pytest.approx(max(run.report.peak_memory_bytes))


@pytest.mark.parametrize("name", ["1f1b", "dualpipev", "zbv"])
def test_bounds_hold_for_expert_parallel_stages(name):
    hw = load_profile("h800")
    model = tiny_moe(layers=8)
    par = ParallelConfig(tp=1, pp=2, dp=8, ep=8, microbatches=8, seq_len=512, recompute="full", zero_stage=1)
    run = run_schedule(name, model, hw, par)
    schedule = generate(name, 2, 8)
    costs = stage_costs(model, par, hw, schedule.num_chunks)
    shapes = schedule_shape(schedule)
    assert step_bound(shapes, costs, Topology(hw, par)) <= run.report.step_time_s * (1 + 1e-9)
    assert memory_bound(shapes, costs) <= max(run.report.peak_memory_bytes) * (1 + 1e-9)


@pytest.mark.parametrize("name,expected", [("1f1b", (8 + 4 - 1) * 3.0), ("gpipe", (8 + 4 - 1) * 3.0),
                                           ("zb-h1", 4 - 1 + 8 * 3.0)])
def test_step_bound_is_the_bubble_formula_with_unit_costs(name, expected, h100):
    """F = I = W = 1 s, p = 4, m = 8: 1F1B and GPipe take (m + p - 1)(F + B) (Narayanan et al. 2021
    Eq. 1); a split backward keeps only the warm-up (p - 1) F before rank p-1's m (F + I + W)."""
    par = ParallelConfig(pp=4, microbatches=8)
    costs = stage_costs(tiny_model(layers=8), par, h100, 4).with_op_times(1.0, 1.0, 1.0)
    bound = step_bound(schedule_shape(generate(name, 4, 8)), costs, Topology(h100, par))
    assert bound == pytest.approx(expected)
