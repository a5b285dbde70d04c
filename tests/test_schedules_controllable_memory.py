"""V-Half, V-Min (Qi et al., "Pipeline Parallelism with Controllable Memory", arXiv:2405.15362) and
Eager 1F1B: orders equal the reference implementations', the memory timeline holds the papers'
activation bounds, and bad parameters give one clear error."""

from __future__ import annotations

import json

import pytest

from conftest import DATA, SMALL, check_run, invoke, tiny_model, unit_run
from simtrain.checks import stages_and_chunks
from simtrain.hardware import load_profile
from simtrain.parallel import ParallelConfig
from simtrain.scenario import run_schedule
from simtrain.schedules import REGISTRY, ScheduleError, generate
from simtrain.schedules.common import v_placement

ORACLE = json.loads((DATA / "sailsg_v_orders.json").read_text())
"""sail-sg zbv_greedy.py's orders, written by tests/data/make_sailsg_v_orders.py."""

BOUND = {  # peak activations in 1F1B-stage microbatches, T_F = T_B = T_W (sail-sg's HF space
    # "pipeline-parallelism-with-controllable-memory", table; README: 1/3x and 1/2x of 1F1B's p)
    "v-min": lambda p: (p + 4) // 3,
    "v-half": lambda p: (p + 2) // 2,
}


# --------------------------------------------------------------------------- orders
def test_oracle_file_names_its_source_commit():
    assert "sail-sg/zero-bubble-pipeline-parallelism/blob/39f2c186a27580b7051eb51e0f651e1efd0a8170/" in ORACLE["source"]
    configs = {(r["schedule"], r["p"], r["m"]) for r in ORACLE["records"]}
    assert len(configs) == len(ORACLE["records"]) == 166
    assert {p for _, p, _ in configs} == {1, 2, 3, 4, 5, 6, 8}


@pytest.mark.parametrize("name", ["v-half", "v-min"])
def test_orders_and_placement_equal_sailsg(name):
    records = [r for r in ORACLE["records"] if r["schedule"] == name]
    assert len(records) == 83
    for rec in records:
        ours = generate(name, rec["p"], rec["m"])
        where = f"{name} p={rec['p']} m={rec['m']}"
        assert [" ".join(order) for order in ours.text_orders()] == rec["orders"], where
        assert ours.stage_to_rank == v_placement(rec["p"]), where


@pytest.mark.parametrize("name", ["v-half", "v-min"])
@pytest.mark.parametrize("p,m", [(1, 1), (2, 1), (3, 2), (4, 3), (4, 8), (5, 7), (6, 13)])
def test_simulates_with_dependencies_respected(name, p, m):
    run = unit_run(name, p, m)
    check_run(run)
    assert run.schedule.num_stages == 2 * p and stages_and_chunks(name, p, 1) == (2 * p, 2 * p)


def test_bubble_between_zbv_and_1f1b_as_the_paper_orders_them():
    """With T_F = T_I = T_W, the README's bubble rates: ZB-V 0 < V-Half ~B/2 < V-Min ~2B/3 < 1F1B B."""
    p, m = 8, 32
    span = {n: unit_run(n, p, m).report.span_bubble_ratio for n in ("zbv", "v-half", "v-min")}
    one_f_one_b = unit_run("1f1b", p, m, op_times=(2.0, 2.0, 2.0)).report.span_bubble_ratio  # a stage = 2 chunks
    assert span["zbv"] == pytest.approx(0, abs=1e-12)
    assert 0 < span["v-half"] < span["v-min"] < one_f_one_b
    assert one_f_one_b == pytest.approx((p - 1) / (m + p - 1))
    assert span["v-half"] <= one_f_one_b / 2  # README: B/2
    assert span["v-min"] / one_f_one_b == pytest.approx(2 / 3, abs=0.05)  # README: 2B/3 + O(n) overhead


# --------------------------------------------------------------------------- memory
def _held(order, frees: str) -> int:
    held = peak = 0
    for action in order:
        held += 1 if action.kind == "F" else -1 if action.kind == frees else 0
        peak = max(peak, held)
    return peak


@pytest.mark.parametrize("name", ["v-half", "v-min"])
@pytest.mark.parametrize("p", range(2, 13))
def test_peak_chunk_activations_equal_the_published_bound(name, p):
    """The worst rank holds 2 x BOUND chunk activations (a chunk is half a 1F1B stage) counted
    from F to W, as sail-sg's memory model counts them, and no more counted from F to I."""
    sched = generate(name, p, 4 * p)
    assert max(_held(order, "W") for order in sched.orders) == 2 * BOUND[name](p)
    assert max(_held(order, "I") for order in sched.orders) <= 2 * BOUND[name](p)


@pytest.mark.parametrize("p,layers", [(4, 48), (6, 48), (8, 48), (16, 96)])
def test_memory_timeline_v_min_below_v_half_below_1f1b(p, layers):
    """Peak activation bytes from the simulated memory timeline (peak minus static, worst rank),
    on one model whose layers split evenly into 2p chunks: V-Min < V-Half < 1F1B, and each V peak
    is 2 x BOUND chunks, between that many of the smallest and of the largest chunk (the last one
    carries the head) -- about 1/3 and 1/2 of 1F1B's p stages for large p."""
    model, hardware = tiny_model(layers=layers, vocab_size=16), load_profile("h100-sxm")
    peaks, chunks = {}, {}
    for name in ("1f1b", "v-half", "v-min"):
        run = run_schedule(name, model, hardware, ParallelConfig(pp=p, microbatches=2 * p),
                           op_times=(1.0, 1.0, 1.0), comm=False)
        mem = run.result.memory
        static = mem[mem["time_s"] == 0].groupby("rank")["bytes"].first()
        peaks[name] = (mem.groupby("rank")["bytes"].max() - static).max()
        chunks[name] = [c.activation_bytes for c in run.costs.chunks]
    assert peaks["v-min"] < peaks["v-half"] < peaks["1f1b"]
    assert peaks["1f1b"] == pytest.approx(p * chunks["1f1b"][0])  # rank 0 holds p activations
    for name in ("v-half", "v-min"):
        held = 2 * BOUND[name](p)
        assert held * min(chunks[name]) * (1 - 1e-9) <= peaks[name] <= held * max(chunks[name]) * (1 + 1e-9)
    if p == 16:
        assert peaks["v-min"] / peaks["1f1b"] < 0.38 and peaks["v-half"] / peaks["1f1b"] < 0.57


def test_compare_lists_them_and_their_activations_are_ordered():
    result = invoke("compare", *SMALL, "--schedules", "1f1b,v-half,v-min,eager-1f1b", "--json")
    assert result.exit_code == 0, result.output
    rows = {r["schedule"]: r for r in json.loads(result.output)}
    assert list(rows) == ["1f1b", "v-half", "v-min", "eager-1f1b"]
    act = {n: max(b["activations"] for b in r["memory_breakdown_bytes"]) for n, r in rows.items()}
    assert act["v-min"] < act["v-half"] < act["1f1b"] < act["eager-1f1b"]


# --------------------------------------------------------------------------- eager 1F1B
def _paddle_eager_1f1b(p: int, m: int) -> list[list[str]]:
    """PaddlePaddle's ``PipelineEager1F1BPass._create_job_list`` re-derived: w = 2(p-r)-1 forwards,
    then (m - w) times backward, forward, then w backwards."""
    orders = []
    for r in range(p):
        w = 2 * (p - r) - 1
        jobs = [f"{r}F{i}" for i in range(w)]
        for k in range(m - w):
            jobs += [f"{r}B{k}", f"{r}F{w + k}"]
        orders.append(jobs + [f"{r}B{k}" for k in range(m - w, m)])
    return orders


@pytest.mark.parametrize("p,m", [(1, 1), (1, 4), (2, 3), (2, 4), (3, 5), (3, 9), (4, 7), (4, 16), (8, 15), (8, 32)])
def test_eager_1f1b_equals_paddle_and_holds_2p_minus_1(p, m):
    assert generate("eager-1f1b", p, m).text_orders() == _paddle_eager_1f1b(p, m)
    run = unit_run("eager-1f1b", p, m)
    check_run(run)
    assert run.report.peak_inflight_microbatches == [2 * (p - r) - 1 for r in range(p)]
    assert run.report.step_time_s == unit_run("1f1b", p, m).report.step_time_s  # no comm: 1F1B's span


# --------------------------------------------------------------------------- bad parameters
@pytest.mark.parametrize("args,msg", [
    (("eager-1f1b", 4, 6, 1), "eager-1f1b: --microbatches = 6 with --pp 4: Eager 1F1B warms up with 2 x pp - 1 = 7"),
    (("eager-1f1b", 2, 4, 2), "eager-1f1b: --vp = 2: this schedule runs 1 stage(s) per rank"),
    (("v-half", 4, 8, 3), "v-half: --vp = 3: this schedule runs 1 or 2 stage(s) per rank"),
    (("v-min", 0, 8, 1), "v-min: --pp = 0: must be >= 1"),
    (("v-min", 4, 0, 1), "v-min: --microbatches = 0: must be >= 1"),
])
def test_generator_errors(args, msg):
    name, p, m, vp = args
    with pytest.raises(ScheduleError) as err:
        REGISTRY[name].generator(p, m, vp)
    assert msg in str(err.value)


def test_cli_refuses_too_few_microbatches_for_eager_1f1b_with_one_line():
    args = list(SMALL)
    args[args.index("--microbatches") + 1] = "6"
    result = invoke("compare", *args, "--schedules", "v-min,eager-1f1b")
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        "error: eager-1f1b: --microbatches = 6 with --pp 4: Eager 1F1B warms up with 2 x pp - 1 = 7 forwards "
        "on rank 0 and needs m >= 7"]
