"""Ports that no other class of a run shares are plain first-come-first-served servers
(:class:`simtrain.sharing.Ports`): a run with them gives exactly the trace and memory timeline of
the same run with every class on the general per-class path, on random graphs built for ties and
contention and on real schedules (1F1B, interleaved 1F1B, ZB-V, DualPipe + Waved-EP with expert
parallelism)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import simtrain.engine as engine
from simtrain.engine import TaskGraph, simulate
from simtrain.hardware import load_profile
from simtrain.models import load_model
from simtrain.parallel import ParallelConfig
from simtrain.scenario import SCENARIO_DIR, load_scenario, run_schedule
from simtrain.sharing import Clock, Ports


def _general_ports(monkeypatch) -> None:
    """Make the engine build its ports without servers (every class on the general path)."""
    monkeypatch.setattr(engine, "Ports", lambda clock, classes=(): Ports(clock))


def _outcome(trace) -> tuple:
    """Everything a run shows: its rows in order, its memory rows, makespan and event counts."""
    return trace.rows, trace.memory_rows, trace.makespan_s, trace.events, trace.simpy_events


def test_only_classes_sharing_no_port_become_servers():
    ports = Ports(Clock(), [("nvlink:0:out", "nvlink:0:in"), ("nic:0:out", "nic:0:in"), ("nic:0:out", "nic:1:in"),
                            ("nic:0:out", "nic:0:in"), ("hwqueue-0-0",), ()])
    assert set(ports.servers) == {("nvlink:0:out", "nvlink:0:in"), ("hwqueue-0-0",)}
    assert Ports(Clock()).servers == {}


def test_a_server_grants_its_oldest_request_and_frees_its_ports_when_none_waits():
    clock = Clock()
    ports = Ports(clock, [("a", "b")])
    ports.busy.update(("a", "b"))
    ports.wait(("a", "b"), 7)
    ports.wait(("a", "b"), 3)
    assert ports.server_waits == 2
    ports.release(("a", "b"))
    assert list(clock.fifo) == [(engine.STEP_START, 7)] and ports.busy == {"a", "b"}
    ports.release(("a", "b"))
    ports.release(("a", "b"))
    assert list(clock.fifo)[-1] == (engine.STEP_START, 3) and ports.busy == set() and ports.server_waits == 0
    assert ports.queues == {} and ports.wanting == {}  # a server never enters the general bookkeeping


@st.composite
def contended(draw) -> TaskGraph:
    """Streams and stream-less transfers on ports some classes share and some own alone, with
    integer (tying) and zero durations and memory deltas."""
    ranks = draw(st.integers(1, 3))
    graph = TaskGraph(num_ranks=ranks, static_memory_bytes=[float(r) for r in range(ranks)])
    classes = [("own:0",), ("own:1", "own:2"), ("x", "y"), ("y", "z"), ("z",)]
    for tid in range(draw(st.integers(1, 60))):
        rank = draw(st.integers(0, ranks - 1))
        graph.add(name=f"t{tid}", rank=rank, category="comm", kind="p2p",
                  duration_s=float(draw(st.integers(0, 3))),
                  deps=draw(st.lists(st.integers(0, tid - 1), max_size=3)) if tid else [],
                  stream=draw(st.sampled_from([None, None, "compute", "tp"])),
                  resources=draw(st.sampled_from([(), *classes])),
                  mem_start=[(rank, float(draw(st.integers(0, 3))))], mem_end=[(rank, -1.0)])
    return graph


@settings(max_examples=80, deadline=None)
@given(contended())
def test_servers_give_the_general_paths_trace_on_random_graphs(graph):
    with_servers = _outcome(simulate(graph))
    with pytest.MonkeyPatch.context() as mp:
        _general_ports(mp)
        assert _outcome(simulate(graph)) == with_servers


DENSE = ("llama3-8b", dict(pp=4, tp=2, dp=2, microbatches=8, vp=2))
EP = ("mixtral-8x7b", dict(pp=4, dp=8, ep=8, microbatches=8))


@pytest.mark.parametrize("schedule, model, parallel", [
    ("1f1b", *DENSE), ("interleaved-1f1b", *DENSE), ("zbv", *DENSE),
    ("1f1b", *EP), ("dualpipe+waved-ep", *EP),
    ("dualpipe", "deepseek-v3", None),  # EP over NVLink and the NIC: its NVLink port pairs are servers
])
def test_servers_give_the_general_paths_trace_on_real_schedules(monkeypatch, schedule, model, parallel):
    if parallel is None:
        scenario = load_scenario(SCENARIO_DIR / f"{model}.yaml")
        args = (schedule, load_model(scenario.model), load_profile(scenario.hardware), scenario.parallel)
    else:
        args = (schedule, load_model(model), load_profile("h100-sxm"), ParallelConfig(**parallel))
    fast = run_schedule(*args)
    _general_ports(monkeypatch)
    plain = run_schedule(*args)
    assert fast.result.events > 0 and _outcome(fast.result) == _outcome(plain.result)
    assert fast.report == plain.report
