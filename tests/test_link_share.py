"""Bandwidth sharing on link ports (simtrain.link_share): hand-computed cases, an independent fluid
reference on random graphs, the FIFO fast path where no two transfers overlap, and the profile's
``sharing`` setting through the lowering."""

from __future__ import annotations

from collections import Counter

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import tiny_model
from engine_reference import simulate_reference
from simtrain.engine import TaskGraph, simulate
from simtrain.errors import SimtrainError
from simtrain.hardware import PROFILE_DIR, load_profile
from simtrain.network import Topology
from simtrain.parallel import ParallelConfig
from simtrain.scenario import run_schedule
from simtrain.sm_share import SmShare

DP0 = ("nic:0:out", "nic:0:in")  # a rank's DP collective: both directions of its port
P2P01 = ("nic:0:out", "nic:1:in")  # a send from rank 0 to rank 1


def _times(graph: TaskGraph) -> dict[str, tuple[float, float]]:
    trace = simulate(graph).trace
    return {n: (s, e) for n, s, e in zip(trace["name"], trace["start_s"], trace["end_s"])}


def _transfer(graph: TaskGraph, name: str, seconds: float, ports: tuple[str, ...], deps=(), kind=None, **kw):
    """A transfer on rank 0; its kind (its communicator) is its name unless given."""
    return graph.add(name=name, rank=0, category="comm", kind=kind or name, duration_s=seconds, resources=ports,
                     deps=list(deps), **kw)


def test_two_equal_transfers_starting_together_both_end_at_twice_their_time():
    fair = TaskGraph(num_ranks=2, shared_links=frozenset({"nic"}))
    fifo = TaskGraph(num_ranks=2)
    for g in (fair, fifo):
        _transfer(g, "dp", 3.0, DP0)
        _transfer(g, "send", 3.0, P2P01)
    assert _times(fair) == {"dp": (0.0, 6.0), "send": (0.0, 6.0)}
    assert _times(fifo) == {"dp": (0.0, 3.0), "send": (3.0, 6.0)}  # capacity-1 ports: one after the other


def test_a_short_send_during_a_bulk_transfer_takes_twice_its_time_and_delays_the_bulk_by_its_time():
    g = TaskGraph(num_ranks=2, shared_links=frozenset({"nic"}))
    b = g.add(name="B", rank=0, category="compute", kind="B", duration_s=1.0, stream="compute")
    _transfer(g, "bucket", 10.0, DP0)
    _transfer(g, "send", 2.0, P2P01, deps=[b.tid])
    assert _times(g) == {"B": (0.0, 1.0), "bucket": (0.0, 12.0), "send": (1.0, 5.0)}


def test_transfers_of_one_kind_keep_their_order_and_share_with_other_kinds():
    # two all-to-all waves issued at once (one communicator: NCCL runs them in order) beside a DP
    # reduction: wave 1 and the reduction share the port (wave 1 ends at 4), then wave 2 and the
    # reduction's last 2 s share it (both end at 8)
    g = TaskGraph(num_ranks=1, shared_links=frozenset({"nic"}))
    _transfer(g, "w1", 2.0, DP0, kind="a2a")
    _transfer(g, "w2", 2.0, DP0, kind="a2a")
    _transfer(g, "dp", 4.0, DP0)
    assert _times(g) == {"w1": (0.0, 4.0), "w2": (4.0, 8.0), "dp": (0.0, 8.0)}


def test_a_transfer_goes_at_the_share_of_its_most_shared_port():
    # x, y, z share port nic:0:out (3 users, 1/3 each); w shares nic:1:in with x only (2 users):
    # w runs at 1/2 and ends at 6; x keeps 1/3 (its most shared port) and ends with y and z at 9.
    # (A max-min fair allocation would give w 2/3 and end it at 4.5: the module docstring.)
    g = TaskGraph(num_ranks=2, shared_links=frozenset({"nic"}))
    _transfer(g, "x", 3.0, P2P01)
    _transfer(g, "y", 3.0, ("nic:0:out",))
    _transfer(g, "z", 3.0, ("nic:0:out",))
    _transfer(g, "w", 3.0, ("nic:1:in",))
    ends = {name: end for name, (_, end) in _times(g).items()}
    assert ends == pytest.approx({"x": 9.0, "y": 9.0, "z": 9.0, "w": 6.0})


def test_links_not_named_shared_keep_fifo_ports():
    g = TaskGraph(num_ranks=2, shared_links=frozenset({"nvlink"}))
    _transfer(g, "a", 2.0, DP0)
    _transfer(g, "b", 2.0, P2P01)
    assert _times(g) == {"a": (0.0, 2.0), "b": (2.0, 4.0)}


def test_a_transfer_takes_its_hardware_queue_as_a_capacity_1_resource_before_it_shares_its_ports():
    # one hardware queue (simtrain.lowering.queues): the DP collective waits for the compute task
    # holding it, then runs alone on its port; the send, on no queue, ran meanwhile
    g = TaskGraph(num_ranks=2, shared_links=frozenset({"nic"}))
    g.add(name="c", rank=0, category="compute", kind="F", duration_s=2.0, stream="compute", resources=("hwqueue-0-0",))
    _transfer(g, "dp", 3.0, (*DP0, "hwqueue-0-0"), stream="dp")
    _transfer(g, "send", 1.0, P2P01)
    g.add(name="c2", rank=0, category="compute", kind="F", duration_s=1.0, stream="compute", resources=("hwqueue-0-0",))
    assert _times(g) == {"c": (0.0, 2.0), "dp": (2.0, 5.0), "send": (0.0, 1.0), "c2": (5.0, 6.0)}


def test_a_collective_taking_sms_is_stretched_by_sharing_and_ends_once():
    # the DP collective takes 1 of 4 SMs and shares its port with a 1 s send from t = 1 (both at
    # 1/2: the send ends at 3, the collective has 2 s left then and ends at 5); the compute task
    # beside it runs at 3/4 while the collective's SMs count as taken, for its 4 s unshared
    # duration (SmShare.take): from t = 1 to 4 it does 2.25 s of its 3 s, the rest by 4.75
    g = TaskGraph(num_ranks=2, shared_links=frozenset({"nic"}))
    c = g.add(name="c", rank=0, category="compute", kind="F", duration_s=1.0, stream="compute")
    dp = _transfer(g, "dp", 4.0, DP0, pool="sms")
    _transfer(g, "send", 1.0, P2P01, deps=[c.tid])
    f = g.add(name="f", rank=0, category="compute", kind="F", duration_s=3.0, stream="compute", pool="sms")
    g.pools["sms"] = SmShare(4, {dp.tid: 1}, {f.tid: 1.0}).factory
    trace = simulate(g).trace
    assert sorted(trace["name"]) == ["c", "dp", "f", "send"]  # every task ran and ended once
    times = _times(g)
    assert times["send"] == pytest.approx((1.0, 3.0))
    assert times["dp"] == pytest.approx((0.0, 5.0))
    assert times["f"] == pytest.approx((1.0, 4.75))


def test_a_transfer_on_a_processor_pool_and_a_shared_link_is_refused():
    g = TaskGraph(num_ranks=1, pools={"cpu": 1.0}, shared_links=frozenset({"nic"}))
    _transfer(g, "x", 1.0, DP0, pool="cpu")
    _transfer(g, "y", 1.0, DP0)  # (a port only one kind uses is not shared: LinkShare.split)
    with pytest.raises(SimtrainError, match=r"task x \(rank 0\): on processor pool 'cpu' and on shared link ports"):
        simulate(g)


# ------------------------------------------------------------------ random graphs
PORTS = [f"l:{r}:{d}" for r in range(3) for d in ("out", "in")]


@st.composite
def transfer_graphs(draw, shared: bool = True) -> TaskGraph:
    """Stream tasks and transfers (stream-less or on a ``comm`` stream) on a few ports of link
    ``l``, with integer and zero durations so that many things happen at the same instant. Each
    task has a kind of its own: no two transfers share a communicator's lane (the hand case
    test_transfers_of_one_kind_keep_their_order_and_share_with_other_kinds covers lanes)."""
    ranks = draw(st.integers(1, 3))
    graph = TaskGraph(num_ranks=ranks, shared_links=frozenset({"l"}) if shared else frozenset())
    for tid in range(draw(st.integers(1, 30))):
        rank = draw(st.integers(0, ranks - 1))
        moves = draw(st.booleans())
        graph.add(name=f"t{tid}", rank=rank, category="comm" if moves else "compute", kind=f"k{tid}",
                  duration_s=float(draw(st.integers(0, 3))),
                  deps=draw(st.lists(st.integers(0, tid - 1), max_size=3)) if tid else [],
                  stream=draw(st.sampled_from([None, "compute", "comm"])),
                  resources=tuple(draw(st.lists(st.sampled_from(PORTS), min_size=1, max_size=2, unique=True)))
                  if moves else ())
    return graph


def fluid_reference(graph: TaskGraph) -> dict[str, tuple[float, float]]:
    """Start and end of every task by a direct fluid simulation (independent of the engine): at
    each instant every ready task starts (dependencies and stream predecessor ended); between
    events each running task progresses at 1 / the most users of its ports (1 without ports)."""
    tasks = graph.tasks
    prev: dict[int, int] = {}
    last: dict[tuple, int] = {}
    for t in tasks:
        if t.stream is not None:
            key = (t.rank, t.stream)
            if key in last:
                prev[t.tid] = last[key]
            last[key] = t.tid
    start: dict[int, float] = {}
    end: dict[int, float] = {}
    left: dict[int, float] = {}
    now = 0.0
    while True:
        changed = True
        while changed:  # start every ready task (zero-duration ones end at once, and may release more)
            changed = False
            for t in tasks:
                if t.tid not in start and all(d in end for d in t.deps) and (t.tid not in prev or prev[t.tid] in end):
                    start[t.tid] = now
                    if t.duration_s > 0:
                        left[t.tid] = t.duration_s
                    else:
                        end[t.tid] = now
                    changed = True
        if not left:
            break
        users = Counter(p for tid in left for p in tasks[tid].resources)
        rate = {tid: 1.0 / max((users[p] for p in tasks[tid].resources), default=1) for tid in left}
        step = min(left[tid] / rate[tid] for tid in left)
        now += step
        for tid in list(left):
            left[tid] -= rate[tid] * step
            if left[tid] <= 1e-9:
                del left[tid]
                end[tid] = now
    return {t.name: (start[t.tid], end[t.tid]) for t in tasks}


@settings(max_examples=200, deadline=None)
@given(transfer_graphs())
def test_the_engine_with_shared_ports_equals_a_direct_fluid_simulation(graph: TaskGraph) -> None:
    expected = fluid_reference(graph)
    got = _times(graph)
    assert got.keys() == expected.keys()
    for name, (s, e) in expected.items():
        assert got[name] == pytest.approx((s, e), abs=1e-9), name


@settings(max_examples=200, deadline=None)
@given(transfer_graphs(shared=False))
def test_where_no_transfer_waits_for_a_port_sharing_changes_nothing(graph: TaskGraph) -> None:
    rows, _, _ = simulate_reference(graph)  # FIFO ports, the generator engine
    fifo = {row[4]: (row[7], row[8]) for row in rows}  # name -> (start_s, end_s), TRACE_COLUMNS
    tasks = {t.name: t for t in graph.tasks}
    ready = {}
    for t in graph.tasks:  # when each task could start: its dependencies' and stream predecessor's ends
        ready[t.name] = max((fifo[graph.tasks[d].name][1] for d in t.deps), default=0.0)
    for name, t in tasks.items():
        same = [u for u in graph.tasks[:t.tid] if t.stream is not None and (u.rank, u.stream) == (t.rank, t.stream)]
        if same:
            ready[name] = max(ready[name], fifo[same[-1].name][1])
    waited = any(fifo[n][0] > ready[n] for n in fifo)
    graph.shared_links = frozenset({"l"})
    if not waited:  # the fast path: every transfer found its ports free, so the same times as FIFO
        assert _times(graph) == fifo


# ------------------------------------------------------------------ the profile's setting
def _profile(tmp_path, **sharing):
    data = yaml.safe_load((PROFILE_DIR / "h100-sxm.yaml").read_text())
    for section, value in sharing.items():
        data[section]["sharing"] = value
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_profile(path)


def test_the_profile_says_which_links_share(tmp_path):
    par = ParallelConfig(pp=4, dp=2, microbatches=8)
    assert Topology(load_profile("h100-sxm"), par).shared_links() == set()  # fifo, the default for now
    fair = _profile(tmp_path, intra_node="fair", inter_node="fair", pcie="fair")
    assert Topology(fair, par).shared_links() == {"nvlink", "nvlink-combine", "nic", "nic-combine", "pcie"}
    assert Topology(_profile(tmp_path, intra_node="fair"), par).shared_links() == {"nvlink", "nvlink-combine"}
    with pytest.raises(SimtrainError, match=r"p.yaml: field 'intra_node.sharing' = 'fast'.*'fair'.*'fifo'"):
        _profile(tmp_path, intra_node="fast")


def test_a_pipeline_send_no_longer_waits_for_a_whole_dp_reduction(tmp_path):
    # one stage per node (TP 8 fills a node), DP 2 across nodes, one gradient bucket: under FIFO
    # ports each send of the drain waits behind its stage's whole DP reduction on the NIC; shared,
    # it runs beside it, so the step is shorter and no send starts later than its backward allows
    model = tiny_model(layers=8, hidden_size=2048, ffn_hidden_size=8192, num_heads=16, seq_len=2048)
    par = ParallelConfig(pp=4, tp=8, dp=2, microbatches=8, dp_buckets=1)
    fair = run_schedule("1f1b", model, _profile(tmp_path, inter_node="fair"), par)
    fifo = run_schedule("1f1b", model, load_profile("h100-sxm"), par)
    sends = fifo.result.trace[fifo.result.trace["kind"] == "p2p"]
    assert sends["resources"].str.startswith("nic").all()  # the sends cross nodes, on the NIC
    assert fair.report.step_time_s < fifo.report.step_time_s
