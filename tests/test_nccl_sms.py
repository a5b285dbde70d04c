"""The SMs a running NCCL collective takes from overlapping compute (:mod:`simtrain.lowering.nccl_sms`,
:class:`simtrain.sm_share.SmShare`): exact finish times on hand-built graphs, no change without
overlap, the lowering's choice of tasks and channel counts, and bad input."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from simtrain.costs.types import ChunkCost
from simtrain.engine import TaskGraph, simulate
from simtrain.errors import SimtrainError
from simtrain.hardware import load_profile
from simtrain.hardware_file import ProfileFile
from simtrain.lowering.nccl_sms import channels, compute_bound_share
from simtrain.models import load_model
from simtrain.parallel import ParallelConfig
from simtrain.scenario import run_schedule
from simtrain.sm_share import SmShare

A100 = load_profile("a100-sxm-80gb")
MODEL = load_model("llama3-8b")


def _graph(comm_after_s: float, compute_s: float = 1.0, comm_s: float = 0.5, pool: bool = True,
           sms: int = 100, taken: int = 20, share: float = 1.0) -> TaskGraph:
    """Rank 0 computes ``compute_s``; a collective of ``comm_s`` on rank 0's dp stream starts once
    a ``comm_after_s`` task of rank 1 is done (its start is not known when the compute starts)."""
    g = TaskGraph(num_ranks=2)
    c = g.add(name="F0", rank=0, category="compute", kind="F", duration_s=compute_s, stream="compute")
    gate = g.add(name="gate", rank=1, category="compute", kind="F", duration_s=comm_after_s, stream="compute")
    d = g.add(name="dp", rank=0, category="comm", kind="dp", duration_s=comm_s, deps=[gate.tid], stream="dp")
    if pool:
        c.pool = d.pool = "sms:0"
        g.pools["sms:0"] = SmShare(sms, {d.tid: taken}, {c.tid: share}).factory
    return g


def _ends(trace) -> dict[str, float]:
    cols = trace.columns
    return dict(zip(cols["name"].tolist(), cols["end_s"].tolist()))


def test_collective_from_the_start_slows_the_overlapped_part_exactly():
    # 20 of 100 SMs taken for 0.5 s: 0.4 s of work done then, the other 0.6 s at full speed
    ends = _ends(simulate(_graph(comm_after_s=0.0)))
    assert ends["F0"] == pytest.approx(1.1, abs=1e-12)
    assert ends["dp"] == pytest.approx(0.5, abs=1e-12)  # communication keeps its duration


def test_collective_starting_mid_compute_replans_with_the_memory_bound_share_unslowed():
    # half the seconds compute-bound: time factor 0.5 x 100/80 + 0.5 = 1.125 from 0.3 to 0.8 s
    ends = _ends(simulate(_graph(comm_after_s=0.3, share=0.5)))
    assert ends["F0"] == pytest.approx(1.0 + 0.5 * (1 - 1 / 1.125), abs=1e-12)
    assert ends["dp"] == pytest.approx(0.8, abs=1e-12)
    assert _ends(simulate(_graph(comm_after_s=0.3, share=0.0)))["F0"] == 1.0  # memory-bound: unchanged


def test_two_collectives_take_the_sum_of_their_channels():
    g = _graph(comm_after_s=0.0)
    second = g.add(name="dp2", rank=0, category="comm", kind="zero", duration_s=0.5, stream="zero", pool="sms:0")
    g.pools["sms:0"] = SmShare(100, {2: 20, second.tid: 30}, {0: 1.0}).factory
    # 50 SMs gone for 0.5 s: 0.25 s of work, then 0.75 s at full speed
    assert _ends(simulate(g))["F0"] == pytest.approx(1.25, abs=1e-12)


def test_no_overlap_gives_the_same_trace_as_no_pool():
    for after in (1.0, 2.5):  # the collective starts as the compute ends, or later
        with_pool, without = simulate(_graph(after)), simulate(_graph(after, pool=False))
        for col in ("name", "start_s", "end_s"):
            assert with_pool.columns[col].tolist() == without.columns[col].tolist()


def test_channel_counts_come_from_the_profile_and_the_route():
    par = ParallelConfig()
    assert A100.nccl_channels == (24, 16) and load_profile("h100-sxm").nccl_channels == (24, 16)
    assert load_profile("h800").nccl_channels is None  # not measured: collectives take no SMs there
    assert channels(A100, par, ("nvlink:0:out", "nvlink:0:in")) == 24
    assert channels(A100, par, ("nic:0:out", "nic:0:in")) == 16
    assert channels(A100, par.model_copy(update=dict(nccl_channels=8)), ("nic:0:out",)) == 8
    assert channels(dataclasses.replace(A100, sms=None), par, ("nic:0:out",)) == 0


def test_compute_bound_share_per_action_kind():
    chunk = ChunkCost(chunk=0, layers=(0,), has_embedding=False, has_head=False, forward_s=1.0,
                      backward_input_s=3.0, backward_weight_s=1.0, activation_bytes=0.0, weight_grad_bytes=0.0,
                      p2p_bytes=0.0, params=1.0, forward_flops=0.0, backward_input_flops=0.0,
                      backward_weight_flops=0.0, compute_bound_fraction=(0.5, 0.8, 0.4))
    assert [compute_bound_share(chunk, k) for k in ("F", "I", "W", "OPT")] == [0.5, 0.8, 0.4, 0.0]
    assert compute_bound_share(chunk, "B") == pytest.approx((0.8 * 3 + 0.4 * 1) / 4)


def _durations(run) -> dict[str, float]:
    """Seconds of each compute task, by rank, name and occurrence (an action's pieces run in order)."""
    c, seen, out = run.result.columns, {}, {}
    for r, n, cat, s, e in zip(*(c[k].tolist() for k in ("rank", "name", "category", "start_s", "end_s"))):
        if cat == "compute":
            seen[(r, n)] = seen.get((r, n), -1) + 1
            out[(r, n, seen[(r, n)])] = e - s
    return out


def _fsdp(**kw):
    par = ParallelConfig(pp=1, dp=16, microbatches=2, seq_len=2048, zero_stage=3, **kw)
    return run_schedule("1f1b", MODEL, A100, par)


def test_fsdp_compute_overlapping_gathers_takes_longer_by_at_most_the_sm_factor():
    slow, off = _fsdp(), _fsdp(nccl_channels=0)
    plain = run_schedule("1f1b", MODEL, dataclasses.replace(A100, nccl_channels=None),
                         ParallelConfig(pp=1, dp=16, microbatches=2, seq_len=2048, zero_stage=3))
    assert off.report.step_time_s == plain.report.step_time_s  # 0 channels: no SM taken
    assert off.report.step_time_s < slow.report.step_time_s < off.report.step_time_s * 108 / (108 - 16)
    on, base = (_durations(r) for r in (slow, off))
    assert on.keys() == base.keys()
    stretched = np.array([on[k] / base[k] for k in on])
    assert np.all(stretched >= 1 - 1e-12) and np.max(stretched) > 1.0
    assert np.max(stretched) <= 108 / (108 - 16) + 1e-9  # dp 16 spans nodes: 16 channels


def test_unit_cost_runs_are_unchanged():
    par = ParallelConfig(pp=2, dp=16, microbatches=4, zero_stage=3)
    runs = [run_schedule("1f1b", MODEL, hw, par, runtime=lambda c: c.with_op_times(1.0, 1.0, 1.0))
            for hw in (A100, dataclasses.replace(A100, nccl_channels=None))]
    assert runs[0].result.columns["end_s"].tolist() == runs[1].result.columns["end_s"].tolist()


def test_bad_channel_counts_are_refused():
    raw = yaml.safe_load(Path(A100.path).read_text()) | {"sms": 16}
    ProfileFile(**raw | dict(nccl_channels={"intra_node": 8, "inter_node": 4}))
    with pytest.raises(ValidationError, match="below sms = 16"):
        ProfileFile(**raw | dict(nccl_channels={"intra_node": 16, "inter_node": 4}))
    with pytest.raises(ValidationError):
        ProfileFile(**raw | dict(nccl_channels={"intra_node": 0, "inter_node": 4}))
    small = dataclasses.replace(A100, sms=32)
    with pytest.raises(SimtrainError, match="nccl_channels = 40: must leave compute some of the 32 SMs"):
        run_schedule("1f1b", MODEL, small, ParallelConfig(pp=1, dp=16, microbatches=1, zero_stage=3, nccl_channels=40))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0.0, 3.0), st.floats(0.01, 2.0), st.integers(1, 40)), min_size=1, max_size=5),
       st.lists(st.floats(0.05, 1.5), min_size=1, max_size=4), st.floats(0.0, 1.0))
def test_each_compute_task_does_exactly_its_work_at_the_rates_the_trace_implies(comms, works, share):
    """Oracle from the trace alone: integrating each compute task's rate over its own interval,
    with the SMs taken by the collectives running then, gives back its work."""
    g, sms = TaskGraph(num_ranks=2), 100
    computes = [g.add(name=f"c{i}", rank=0, category="compute", kind="F", duration_s=w, stream="compute",
                      pool="sms:0") for i, w in enumerate(works)]
    takers = {}
    for i, (after, seconds, taken) in enumerate(comms):
        gate = g.add(name=f"g{i}", rank=1, category="compute", kind="F", duration_s=after, stream=f"s{i}")
        d = g.add(name=f"d{i}", rank=0, category="comm", kind="dp", duration_s=seconds, deps=[gate.tid],
                  stream=f"dp{i}", pool="sms:0")
        takers[d.tid] = taken
    g.pools["sms:0"] = SmShare(sms, takers, {c.tid: share for c in computes}).factory
    cols = simulate(g).columns
    span = {n: (s, e) for n, s, e in zip(cols["name"].tolist(), cols["start_s"].tolist(), cols["end_s"].tolist())}
    held = [(span[f"d{i}"], taken) for i, (_, _, taken) in enumerate(comms)]
    for c in computes:
        lo, hi = span[c.name]
        cuts = sorted({lo, hi, *(t for (s, e), _ in held for t in (s, e) if lo < t < hi)})
        done = 0.0
        for a, b in zip(cuts, cuts[1:]):
            taken = min(sms - 1, sum(n for (s, e), n in held if s <= a < e))
            done += (b - a) / (share * sms / (sms - taken) + 1 - share)
        assert done == pytest.approx(c.duration_s, rel=1e-9, abs=1e-12)
        assert hi - lo >= c.duration_s * (1 - 1e-12)


def test_only_collectives_that_compute_can_overlap_join_the_pool():
    """A collective between two compute tasks it is chained to overlaps neither: it and they stay
    off the pool (fewer pool steps, the same trace); one issued beside later compute keeps its window."""
    from simtrain.lowering.nccl_sms import _overlap_windows

    g = TaskGraph(num_ranks=1)
    f0 = g.add(name="F0", rank=0, category="compute", kind="F", duration_s=1.0, stream="compute")
    tp = g.add(name="tp", rank=0, category="comm", kind="tp", duration_s=0.2, deps=[f0.tid], stream="tp")
    f1 = g.add(name="F1", rank=0, category="compute", kind="F", duration_s=1.0, deps=[tp.tid], stream="compute")
    dp = g.add(name="dp", rank=0, category="comm", kind="dp", duration_s=0.5, deps=[f1.tid], stream="dp")
    b0 = g.add(name="B0", rank=0, category="compute", kind="B", duration_s=1.0, deps=[f1.tid], stream="compute")
    opt = g.add(name="OPT", rank=0, category="compute", kind="OPT", duration_s=0.1, deps=[b0.tid, dp.tid],
                stream="compute")
    takers = {0: {tp.tid: 16, dp.tid: 16}}
    inside = _overlap_windows(g.tasks, takers)
    assert takers == {0: {dp.tid: 16}}  # the chained TP collective is dropped
    assert [inside(t) for t in (f0, f1, b0, opt)] == [False, False, True, False]


def test_channel_settings_that_cannot_apply_or_leave_no_sm_are_refused():
    """A final review: nccl_channels did nothing on a profile without sms, and DeepEP's SMs plus
    NCCL's could exceed the GPU's."""
    m = load_model("llama3-8b")
    with pytest.raises(SimtrainError, match="has no field 'sms'"):
        run_schedule("1f1b", m, load_profile("mi300x"), ParallelConfig(dp=8, zero_stage=3, nccl_channels=32))
    moe, h100 = load_model("mixtral-8x7b"), load_profile("h100-sxm")
    with pytest.raises(SimtrainError, match="with ep_comm_sms = 120"):
        run_schedule("1f1b", moe, h100, ParallelConfig(pp=4, dp=8, ep=8, microbatches=8, ep_comm_sms=120,
                                                       nccl_channels=60))
