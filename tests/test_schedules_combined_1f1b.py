"""Megatron-Core's combined 1F1B for MoE (``1f1b-overlap``, ``interleaved-1f1b-overlap``).

The expected orders were recorded from Megatron-LM's own ordering functions at commit d98e8a6
(``get_pp_rank_microbatches`` with ``overlap_moe_expert_parallel_comm=True``,
``get_schedule_table``, ``convert_schedule_table_to_order``) by
``tests/data/make_megatron_combined_orders.py``, for pp 1-4 and 8, vp 1-3 and every m from 1 to
3·pp + 1; ``orders`` is null where Megatron refuses the configuration.
"""

from __future__ import annotations

import json
import re
import warnings

import numpy as np
import pytest

from conftest import DATA, balanced_moe, check_run, invoke, tiny_model
from simtrain.hardware import load_profile
from simtrain.parallel import ParallelConfig
from simtrain.scenario import run_schedule
from simtrain.schedules import REGISTRY, ScheduleError, ScheduleWarning, generate
from simtrain.schedules.combined_1f1b import combined_phases
from simtrain.schedules.ir import Action, OverlapAction, Schedule

RECORDS = json.loads((DATA / "megatron_combined_1f1b_orders.json").read_text())
H800 = load_profile("h800")


def _generate(name: str, pp: int, m: int, vp: int) -> Schedule:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ScheduleWarning)  # interleaved with vp = 1
        return generate(name, pp, m, vp)


def test_the_recording_covers_pairs_refusals_and_every_shape():
    recs = RECORDS["records"]
    assert RECORDS["megatron_lm"].startswith("d98e8a64")
    ran = [r for r in recs if r["orders"] is not None]
    assert {(r["pp"], r["vp"]) for r in ran} >= {(p, v) for p in (2, 3, 4, 8) for v in (1, 2, 3)}
    assert any(r["orders"] is None and r["microbatches"] < r["pp"] for r in recs)  # m < pp refused
    assert all("OVERLAP_F_B" in " ".join(r["orders"][-1]) for r in ran if r["microbatches"] > 1)


@pytest.mark.parametrize("vp", [1, 2, 3])
def test_orders_equal_megatrons(vp):
    for rec in (r for r in RECORDS["records"] if r["vp"] == vp):
        p, m = rec["pp"], rec["microbatches"]
        names = ["1f1b-overlap", "interleaved-1f1b-overlap"] if vp == 1 else ["interleaved-1f1b-overlap"]
        for name in names:
            if rec["orders"] is None:
                with pytest.raises(ScheduleError, match=name):
                    _generate(name, p, m, vp)
            else:
                assert _generate(name, p, m, vp).text_orders() == rec["orders"], (name, p, m, vp)


def test_the_orders_read_like_1f1b_with_each_steady_step_one_pair():
    s = generate("1f1b-overlap", 4, 8)
    assert s.text_orders()[3] == ["3F0", *(f"(3F{i + 1};3B{i})OVERLAP_F_B" for i in range(7)), "3B7"]
    # rank r: 2(p-r-1)+1 warm-up forwards, m - that many pairs, as many cool-down backwards
    for r, order in enumerate(s.orders):
        warm = min(8, 2 * (4 - r - 1) + 1)
        assert all(isinstance(a, Action) and a.kind == "F" for a in order[:warm])
        assert all(isinstance(a, OverlapAction) for a in order[warm:8])
        assert all(isinstance(a, Action) and a.kind == "B" for a in order[8:]) and len(order) == 8 + warm
    # pp = 1 is Megatron's combined_1f1b_schedule_for_no_pipelining: F0, (F1;B0), (F2;B1), B2
    assert generate("1f1b-overlap", 1, 3).text_orders() == [
        ["0F0", "(0F1;0B0)OVERLAP_F_B", "(0F2;0B1)OVERLAP_F_B", "0B2"]]


@pytest.mark.parametrize("name,pp,m,vp,message", [
    ("1f1b-overlap", 4, 3, 1, r"1f1b-overlap: --microbatches = 3 with --pp 4: Megatron-Core's combined 1F1B "
                              r"needs at least pp = 4 microbatches"),
    ("1f1b-overlap", 2, 4, 2, r"1f1b-overlap: --vp = 2: this schedule runs 1 stage\(s\) per rank"),
    ("interleaved-1f1b-overlap", 1, 4, 2, r"--vp = 2 with --pp 1: Megatron-Core runs one model chunk"),
    ("interleaved-1f1b-overlap", 2, 7, 2, r"needs m to be a multiple of 3"),
    ("interleaved-1f1b-overlap", 4, 2, 2, r"needs at least pp = 4 microbatches"),
])
def test_bad_parameters_one_clear_error(name, pp, m, vp, message):
    with pytest.raises(ScheduleError, match=message):
        REGISTRY[name].generator(pp, m, vp)


def test_interleaved_with_one_chunk_warns_and_is_1f1b_overlap():
    with pytest.warns(ScheduleWarning, match="this is 1f1b-overlap's order"):
        one = generate("interleaved-1f1b-overlap", 4, 8, 1)
    assert one.text_orders() == generate("1f1b-overlap", 4, 8).text_orders()


# ----------------------------------------------------------------------------- unit costs
def _unit(schedule, pp: int, m: int, vp: int = 1):
    par = ParallelConfig(pp=pp, microbatches=m, vp=vp)
    return run_schedule(schedule, tiny_model(), load_profile("h100-sxm"), par, op_times=(1.0, 1.0, 1.0), comm=False)


@pytest.mark.parametrize("name,pp,m,vp", [("1f1b-overlap", 2, 4, 1), ("1f1b-overlap", 4, 8, 1),
                                          ("1f1b-overlap", 4, 16, 1), ("1f1b-overlap", 8, 16, 1),
                                          ("interleaved-1f1b-overlap", 4, 8, 2), ("interleaved-1f1b-overlap", 2, 6, 3)])
def test_unit_bubble_is_1f1bs_and_activations_are_the_warmup_plus_one(name, pp, m, vp):
    # F = I = W = 1 (B = 2), a pair = F + B (overlap factor 1), free communication: with
    # Megatron's doubled warm-up the pairs run back to back, so each rank idles (p-1)(F+B) in
    # chunk units, 1F1B's (and interleaved 1F1B's) bubble; rank r holds its warm-up's activations
    # and one more while a pair runs.
    run = _unit(name, pp, m, vp)
    check_run(run)
    F, B = 1.0, 2.0
    assert run.report.bubble_time_s_per_rank == pytest.approx([(pp - 1) * (F + B)] * pp)
    assert run.report.step_time_s == pytest.approx(m * vp * (F + B) + (pp - 1) * (F + B))
    group = pp if m % pp == 0 else m // max(1, m // pp)
    expected = [min(m * vp, 2 * (pp - r - 1) + (vp - 1) * group + 2) for r in range(pp)]
    assert run.report.peak_inflight_microbatches == expected


def test_the_doubled_warmup_is_what_lets_pairs_run_back_to_back():
    # 1F1B's own warm-up plus one forward (p - r) already makes every pair's halves independent,
    # but then rank r's pair k waits for rank r+1's pair k, which waits for rank r's pair k-1:
    # the pairs cannot follow each other, and the bubble grows far beyond 1F1B's.
    p, m = 4, 16
    orders = tuple(combined_phases([Action(r, "F", i) for i in range(m)], [Action(r, "B", i) for i in range(m)], p - r)
                   for r in range(p))
    shallow = _unit(Schedule("shallow", m, tuple(range(p)), orders), p, m).report
    megatron = _unit("1f1b-overlap", p, m).report
    assert megatron.bubble_time_s_per_rank == pytest.approx([9.0] * p)
    assert min(shallow.bubble_time_s_per_rank) > 3 * 9.0


# ----------------------------------------------------------------------------- MoE: hiding the all-to-all
def _exposed_a2a_s(trace, rank: int) -> float:
    """Time rank ``rank``'s all-to-all is in flight while its compute stream is idle (from the trace)."""
    rows = trace[trace["rank"] == rank]
    comp = rows[rows["category"] == "compute"][["start_s", "end_s"]].to_numpy()
    a2a = rows[rows["kind"] == "a2a"][["start_s", "end_s"]].to_numpy()
    edges = np.unique(np.concatenate([comp.ravel(), a2a.ravel()]))
    mids = (edges[:-1] + edges[1:]) / 2

    def covered(iv):
        return ((iv[:, :1] <= mids) & (mids < iv[:, 1:])).any(axis=0) if len(iv) else np.zeros(len(mids), bool)

    return float(np.sum(np.diff(edges) * (covered(a2a) & ~covered(comp))))


@pytest.fixture(scope="module")
def moe_runs():
    # 16 microbatches: rank 0's warm-up is 7 forwards, so it too runs 9 pairs (with 8, just one)
    par = ParallelConfig(pp=4, dp=8, ep=8, microbatches=16)
    return {name: run_schedule(name, balanced_moe(layers=9), H800, par)
            for name in ("1f1b", "1f1b-overlap", "dualpipev")}


def test_pairs_hide_the_all_to_all_on_the_trace(moe_runs):
    plain, paired = moe_runs["1f1b"], moe_runs["1f1b-overlap"]
    check_run(paired, contiguous=False)
    bytes_of = {n: r.result.trace.loc[r.result.trace["kind"] == "a2a", "bytes"].sum() for n, r in moe_runs.items()}
    assert bytes_of["1f1b-overlap"] == pytest.approx(bytes_of["1f1b"])  # the same all-to-all, hidden or not
    for r in range(4):
        exposed_plain, exposed_paired = _exposed_a2a_s(plain.result.trace, r), _exposed_a2a_s(paired.result.trace, r)
        assert exposed_paired < 0.8 * exposed_plain, r
    # the report's figure is the same measurement, averaged over ranks
    assert paired.report.exposed_a2a_s == pytest.approx(np.mean([_exposed_a2a_s(paired.result.trace, r) for r in range(4)]))
    assert paired.report.exposed_a2a_s < 0.8 * plain.report.exposed_a2a_s
    assert paired.report.step_time_s < plain.report.step_time_s
    # inside a pair, the backward half's all-to-all runs while the forward half computes
    t = paired.result.trace
    pair = next(a for a in paired.schedule.orders[3] if isinstance(a, OverlapAction))
    f, b = pair.forward, pair.backward
    on3 = t[t["rank"] == 3]
    fwd = on3[(on3["category"] == "compute") & (on3["kind"] == "F") & (on3["microbatch"] == f.microbatch)]
    bwd_a2a = on3[(on3["kind"] == "a2a") & (on3["microbatch"] == b.microbatch) & (on3["stage"] == b.stage)]
    overlap = sum(max(0.0, min(x.end_s, y.end_s) - max(x.start_s, y.start_s))
                  for x in fwd.itertuples() for y in bwd_a2a.itertuples())
    assert overlap > 0


def test_compared_with_dualpipev_and_waved_ep(moe_runs):
    # DualPipeV also pairs F and B (and splits W off to fill its bubble); Waved-EP hides the
    # all-to-all inside each MoE layer and composes with the pairs.
    paired, dual = moe_runs["1f1b-overlap"], moe_runs["dualpipev"]
    assert dual.report.exposed_a2a_s < moe_runs["1f1b"].report.exposed_a2a_s
    assert dual.report.bubble_ratio < paired.report.bubble_ratio
    par = ParallelConfig(pp=4, dp=8, ep=8, microbatches=16, waves=4)
    waved = run_schedule("1f1b-overlap+waved-ep", balanced_moe(layers=9), H800, par)
    check_run(waved, contiguous=False)
    assert waved.report.exposed_a2a_s < paired.report.exposed_a2a_s


def test_a_dense_model_runs_without_all_to_all_and_with_a_warning(tmp_path):
    res = invoke("compare", "--model", "llama3-8b", "--hardware", "h100-sxm", "--pp", "4", "--tp", "2", "--dp", "2",
                 "--microbatches", "8", "--seq-len", "1024", "--schedules", "1f1b,1f1b-overlap", "--json",
                 "--out", str(tmp_path / "d.html"))
    assert res.exit_code == 0, res.output
    assert "warning: 1f1b-overlap: Megatron-Core's combined 1F1B (--overlap-moe-expert-parallel-comm) needs " \
           "expert parallelism, and llama3-8b has no experts" in res.stderr
    rows = json.loads(res.stdout)
    rows = rows["runs"] if isinstance(rows, dict) else rows
    assert [r["schedule"] for r in rows] == ["1f1b", "1f1b-overlap"]
    assert all(r["a2a_s"] == 0 and r["exposed_a2a_s"] == 0 for r in rows)


def test_cli_compares_with_dualpipe_and_the_dashboard_shows_the_hidden_all_to_all(tmp_path):
    out = tmp_path / "moe.html"
    res = invoke("compare", "--model", "mixtral-8x7b", "--hardware", "h100-sxm", "--pp", "4", "--dp", "8",
                 "--ep", "8", "--microbatches", "8", "--seq-len", "1024", "--schedules", "1f1b,1f1b-overlap,dualpipe",
                 "--json", "--out", str(out))
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    rows = {r["schedule"]: r for r in (rows["runs"] if isinstance(rows, dict) else rows)}
    assert rows["1f1b-overlap"]["exposed_a2a_s"] < rows["1f1b"]["exposed_a2a_s"]
    assert rows["1f1b-overlap"]["a2a_s"] == pytest.approx(rows["1f1b"]["a2a_s"], rel=0.01)
    html = out.read_text()
    assert "<th>exposed all-to-all (ms)</th>" in html
    # the summary row of 1f1b-overlap carries its exposed all-to-all (13th column, after all-to-all)
    row = re.search(r"<tr><td class='[a-z]*'>1f1b-overlap</td>(.*?)</tr>", html).group(1)
    cells = re.findall(r"<td class='[a-z]*'>([^<]*)</td>", row)
    assert cells[11:13] == [f"{rows['1f1b-overlap'][k] * 1e3:,.2f}" for k in ("a2a_s", "exposed_a2a_s")]
    # and its timeline, with the all-to-all in its own lane
    assert '"text":"1f1b-overlap: timeline"' in html and "rank 3 \\u00b7 a2a" in html


@pytest.mark.parametrize("args", [
    ("--schedules", "1f1b-overlap", "--pp", "4", "--microbatches", "2"),
    ("--schedules", "interleaved-1f1b-overlap", "--pp", "1", "--vp", "2", "--microbatches", "4"),
])
def test_cli_refuses_what_megatron_refuses_with_one_error_line(args, tmp_path):
    res = invoke("compare", "--model", "mixtral-8x7b", "--hardware", "h100-sxm", "--dp", "8", "--ep", "8", *args,
                 "--out", str(tmp_path / "x.html"))
    assert res.exit_code == 2
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Megatron-Core" in lines[0], res.output
