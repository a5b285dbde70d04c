"""The fast paths of the lowering, trace, metrics and CLI give what the plain ones give: the two-sort
interval order is lexsort's, trace columns built on demand equal the eager ones (and their kept
masks the comparisons), a graph kept until the next run changes no report, a bulk-built
transfer's shared empty memory deltas never take a delta, an action (a named tuple) hashes, sorts
and prints as the dataclass it replaced, p2p finds each microbatch's path from one table, the lazy
console answers "not a terminal" without making rich's console, and the console-script entry ends
the process with the command's output, status and atexit handlers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simtrain.cli.app import LazyConsole
from simtrain.costs import stage_costs
from simtrain.engine import Task
from simtrain.hardware import load_profile
from simtrain.lowering import lower
from simtrain.lowering.items import NO_DELTAS, add_delta
from simtrain.metrics import _by_owner_then_start
from simtrain.models import load_model
from simtrain.network import Topology
from simtrain.parallel import ParallelConfig
from simtrain.schedules import generate
from simtrain.schedules.ir import Action, parse_action
from simtrain.trace import TRACE_COLUMNS, Trace

SMALL = ["--model", "llama3-8b", "--hardware", "h100-sxm", "--pp", "2", "--microbatches", "4", "--schedules", "1f1b"]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.sampled_from([0.0, 0.5, 1.0, 1.5, 2.0])), max_size=40),
       st.booleans())
def test_two_stable_sorts_give_lexsorts_order(pairs, sort_first):
    """Sorted by owner then start, ties in index order: exactly ``np.lexsort((start, owner))``,
    whether the starts come sorted (a trace) or not; ranks outside 16 bits take lexsort itself."""
    if sort_first:
        pairs = sorted(pairs, key=lambda p: p[1])
    owner = np.array([p[0] for p in pairs], dtype=np.int64)
    start = np.array([p[1] for p in pairs], dtype=float)
    assert _by_owner_then_start(owner, start).tolist() == np.lexsort((start, owner)).tolist()
    big = owner + (1 << 16)
    assert _by_owner_then_start(big, start).tolist() == np.lexsort((start, big)).tolist()


def _trace() -> Trace:
    source = {name: [] for name in TRACE_COLUMNS}
    rows = [(1, "dp", "comm", "dp", "dp", None, None, 2.0, 3.0, 1e6, None, "nic:1:out,nic:0:in"),
            (0, "compute", "compute", "F", "0F0", 0, 0, 0.0, 1.0, 0.0, None, ""),
            (0, "", "comm", "p2p", "p2p", 0, 0, 1.0, 2.0, 2, 1, "nvlink:0:out,nvlink:1:in")]
    for row in rows:
        for name, value in zip(TRACE_COLUMNS, row):
            source[name].append(value)
    return Trace(source=source, order=np.array([1, 2, 0]), memory_rows=[(0, 0.0, 1.0)], makespan_s=3.0, events=3)


def test_columns_built_on_demand_equal_the_eager_ones():
    trace = _trace()
    cols = trace.columns
    assert list(cols) == TRACE_COLUMNS and len(cols) == len(TRACE_COLUMNS)
    assert cols["rank"].dtype == np.int64 and cols["rank"].tolist() == [0, 0, 1]
    assert cols["peer"].tolist()[1] == 1.0 and np.isnan(cols["peer"][[0, 2]]).all()  # None -> NaN
    assert cols["bytes"].dtype == float and cols["bytes"].tolist() == [0.0, 2.0, 1e6]
    assert cols["kind"].dtype == object and cols["kind"].tolist() == ["F", "p2p", "dp"]
    assert cols["start_s"] is cols["start_s"]  # built once
    for name in TRACE_COLUMNS:  # the same as converting the object column
        eager = trace.table[name] if cols[name].dtype == object else trace.table[name].astype(cols[name].dtype)
        assert np.array_equal(cols[name], eager, equal_nan=cols[name].dtype != object)
    code, distinct = trace.codes("resources")
    assert [list(distinct)[list(distinct.values()).index(c)] for c in code] == trace.table["resources"].tolist()


def test_a_kept_column_mask_is_the_comparison_and_cannot_be_changed():
    cols = _trace().columns
    for name, value in (("kind", "F"), ("category", "comm"), ("kind", "OPT"), ("stream", "")):
        mask = cols.equal(name, value)
        assert mask.dtype == bool and mask.tolist() == (cols[name] == value).tolist()
        assert cols.equal(name, value) is mask  # computed once
        with pytest.raises(ValueError):
            mask[0] = not mask[0]  # shared by every reader: read-only
    assert cols.equal("kind", "p2p").tolist() == [False, True, False]
    with pytest.raises(KeyError):
        cols.equal("no such column", "F")


@settings(max_examples=100, deadline=None)
@given(st.lists(st.sampled_from(["F", "B", "a2a", "", None]), min_size=1, max_size=30),
       st.sampled_from(["F", "B", "a2a", "", None, "OPT"]), st.booleans())
def test_a_mask_from_the_columns_codes_is_the_element_by_element_comparison(kinds, value, ordered):
    n = len(kinds)
    source = {name: [0] * n for name in TRACE_COLUMNS}
    source.update(kind=kinds, start_s=[float(i % 3) for i in range(n)], end_s=[3.0] * n)
    order = None if ordered else np.arange(n)[::-1].copy()
    cols = Trace(source=source, order=order, memory_rows=[], makespan_s=3.0, events=n).columns
    assert cols.equal("kind", value).tolist() == [k == value for k in cols["kind"].tolist()]


def test_a_kept_graph_lives_until_the_next_run_begins(monkeypatch):
    """keep_last_graph: the last run's graph is kept (at most one) and what the run left is
    frozen, the one before is freed as the next run begins; the reports are those of a run that
    frees its graph."""
    import gc
    import weakref

    import simtrain.scenario as scenario
    from simtrain.hardware import load_profile
    from simtrain.models import load_model
    from simtrain.parallel import ParallelConfig

    graphs = []
    lower = scenario.lower
    monkeypatch.setattr(scenario, "lower", lambda *a, **k: graphs.append(weakref.ref(g := lower(*a, **k))) or g)
    model, hw, par = load_model("llama3-8b"), load_profile("h100-sxm"), ParallelConfig(pp=2, microbatches=4)
    gc.collect()
    plain = scenario.run_schedule("1f1b", model, hw, par).report
    assert graphs[-1]() is None  # freed as the run returned
    frozen = gc.get_freeze_count()
    try:
        scenario.keep_last_graph()
        first = scenario.run_schedule("1f1b", model, hw, par).report
        assert graphs[-1]() is not None and gc.get_freeze_count() > frozen
        second = scenario.run_schedule("gpipe", model, hw, par).report
        assert graphs[-2]() is None and graphs[-1]() is not None  # a frozen graph is freed all the same
    finally:
        scenario.keep_last_graph(False)
        gc.unfreeze()
    assert scenario.run_schedule("gpipe", model, hw, par).report == second and first == plain
    assert graphs[-2]() is None and graphs[-1]() is None


def test_a_bulk_built_transfer_takes_a_delta_in_a_list_of_its_own():
    a = Task(0, "dispatch", 0, "comm", "a2a", 1.0, [], None, (), None, None, 0.0, None, NO_DELTAS, NO_DELTAS)
    b = Task(1, "dispatch", 0, "comm", "a2a", 1.0, [], None, (), None, None, 0.0, None, NO_DELTAS, NO_DELTAS)
    add_delta(a, "end", 0, -5.0)
    add_delta(a, "end", 1, 2.0)
    add_delta(b, "start", 0, 3.0)
    assert a.mem_end == [(0, -5.0), (1, 2.0)] and a.mem_start == () and b.mem_start == [(0, 3.0)]
    assert NO_DELTAS == () and b.mem_end is NO_DELTAS


def test_the_lazy_console_knows_a_pipe_is_no_terminal_without_rich(monkeypatch):
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    monkeypatch.delenv("TTY_COMPATIBLE", raising=False)
    console = LazyConsole()  # pytest's captured stdout is no tty
    assert console.is_terminal is False and console._console is None
    monkeypatch.setenv("FORCE_COLOR", "1")  # rich's override: now rich answers
    assert console.is_terminal is True and console._console is not None


def _cli(entry: str, *args: str) -> subprocess.CompletedProcess:
    code = ("import atexit, sys\natexit.register(lambda: print('atexit ran', file=sys.stderr))\n"
            f"from simtrain.cli import {entry}\nsys.argv = ['simtrain', *sys.argv[1:]]\n{entry}()")
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True)


def test_the_console_script_ends_like_main_with_the_same_output_and_status():
    for args in (["compare", *SMALL, "--json"], ["compare", "--model", "llama3-8b", "--json"]):
        fast, plain = _cli("run", *args), _cli("main", *args)
        assert (fast.returncode, fast.stdout, fast.stderr) == (plain.returncode, plain.stdout, plain.stderr)
        assert fast.stderr.endswith("atexit ran\n")
    assert fast.returncode == 2 and fast.stderr.startswith("error: ")
    assert plain.stdout == "" and _cli("run", "compare", *SMALL, "--json").stdout.startswith("[")


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs Linux's /dev/full (every write fails: ENOSPC)")
def test_an_output_that_cannot_be_written_is_one_error_line_not_a_traceback():
    """stdout on a full disk (review 8): one ``error:`` line, exit status 1, the atexit handlers run."""
    code = ("import atexit, sys\natexit.register(lambda: print('atexit ran', file=sys.stderr))\n"
            "from simtrain.cli import run\nsys.argv = ['simtrain', *sys.argv[1:]]\nrun()")
    for args in (["--version"], ["compare", *SMALL, "--json"]):
        with open("/dev/full", "w") as full:
            res = subprocess.run([sys.executable, "-c", code, *args], stdout=full, stderr=subprocess.PIPE, text=True)
        assert res.returncode == 1
        assert res.stderr == "error: the output could not be written: [Errno 28] No space left on device\natexit ran\n"


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.sampled_from("FBIW"), st.integers(0, 300)), max_size=30))
def test_an_action_hashes_orders_and_prints_as_the_frozen_dataclass_it_replaced(fields):
    """Action is a named tuple (hash and equality in C) with the frozen dataclass's behaviour: its
    hash is the hash of its fields' tuple (what the dataclass's ``__hash__`` returned, so sets and
    dicts of actions iterate in the order they did), it sorts by (stage, kind, microbatch), prints
    and reprs as before, and cannot be changed."""
    actions = [Action(*f) for f in fields]
    assert [hash(a) for a in actions] == [hash(f) for f in fields]
    assert list(dict.fromkeys(actions)) == [Action(*f) for f in dict.fromkeys(fields)]
    assert sorted(actions) == [Action(*f) for f in sorted(fields)]
    for a, (stage, kind, mb) in zip(actions, fields):
        assert str(a) == f"{stage}{kind}{mb}" and parse_action(str(a)) == a and a.parts == (a,)
        assert repr(a) == f"Action(stage={stage}, kind={kind!r}, microbatch={mb})"
        with pytest.raises(AttributeError):
            a.stage = stage + 1


def test_p2p_follows_each_microbatchs_own_path():
    """add_p2p finds an action's place on its microbatch's path from a table built once per
    microbatch: on DualPipe (two directions) every forward after the first of its path waits for
    the transfer from the stage before it on that path, and every backward but the last for the
    one from the stage after it."""
    parallel = ParallelConfig(pp=4, tp=1, dp=1, microbatches=8)
    hw = load_profile("h100-sxm")
    schedule = generate("dualpipe", 4, 8, 1)
    graph = lower(schedule, stage_costs(load_model("llama3-8b"), parallel, hw, schedule.num_chunks),
                  Topology(hw, parallel))
    by_name = {t.name: t for t in graph.tasks}
    checked = 0
    for mb in range(8):
        path = schedule.path(mb)
        for i in range(1, len(path)):
            a, b = Action(path[i - 1], "F", mb), Action(path[i], "F", mb)
            send = by_name[f"p2p {a} -> {b}"]
            assert send.rank == schedule.stage_to_rank[a.stage] and send.peer == schedule.stage_to_rank[b.stage]
            assert any(send.tid in t.deps for t in graph.tasks if t.stage == b.stage and t.microbatch == mb)
            checked += 1
    assert checked == 8 * 3 and len({schedule.path(mb) for mb in range(8)}) == 2
