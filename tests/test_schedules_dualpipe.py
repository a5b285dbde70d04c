"""DualPipe and DualPipeV: orders equal the reference implementations', the configurations they
reject are rejected, and with unit costs the bubble, activations and parameters equal the
DualPipe README's table (deepseek-ai/DualPipe, "Pipeline Bubbles and Memory Usage Comparison").

README notation: PP = pipeline *stages* of one pipeline (DualPipe: one per rank and direction, so
PP = ranks; DualPipeV: two per rank, so PP = 2 x ranks); F, B (full backward), W and F&B (an
overlapped pair) are the times of one microbatch through one such stage.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from conftest import DATA, check_run, reference_records, tiny_model, unit_run
from simtrain.hardware import load_profile
from simtrain.parallel import ParallelConfig
from simtrain.scenario import run_schedule
from simtrain.schedules import REGISTRY, ScheduleError, generate
from simtrain.schedules.ir import OverlapAction

NAMES = {"deepseek:DualPipe": "dualpipe", "deepseek:DualPipeV": "dualpipev", "torch:DualPipeV": "dualpipev"}


@pytest.mark.parametrize("ref", sorted(NAMES))
def test_orders_and_placement_equal_the_reference(ref):
    records = reference_records(ref)
    assert len(records) >= 7
    for rec in records:
        ours = generate(NAMES[ref], rec["p"], rec["m"])
        assert ours.text_orders() == [rec["orders"][str(r)] for r in range(rec["p"])], f"{ref} {rec}"
        assert list(ours.stage_to_rank) == [rec["stage_to_rank"][str(s)] for s in range(rec["num_stages"])]
        if isinstance(rec["paths"], list):  # explicit microbatch paths (the deepseek records)
            for group in rec["paths"]:
                for mb in group["microbatches"]:
                    assert list(ours.path(mb)) == group["stages"]


def test_rejects_the_configurations_the_reference_rejects():
    records = json.loads((DATA / "schedule_orders.json").read_text())["records"]
    rejected = [r for r in records if r["schedule"] in NAMES and "error" in r]
    assert rejected  # torch: DualPipeV with p = 4, m = 4
    for rec in rejected:
        with pytest.raises(ScheduleError, match="at least as many microbatches as stages"):
            generate(NAMES[rec["schedule"]], rec["p"], rec["m"])


@pytest.mark.parametrize("name,pp,m,vp,message", [
    ("dualpipe", 3, 12, 1, r"dualpipe: --pp = 3: DualPipe needs an even number of pipeline ranks"),
    ("dualpipe", 4, 9, 1, r"dualpipe: --microbatches = 9 with --pp 4: DualPipe needs an even number of "
                          r"microbatches, at least 2 x pp = 8"),
    ("dualpipe", 4, 6, 1, r"--microbatches = 6 with --pp 4: .* at least 2 x pp = 8"),
    ("dualpipe", 2, 4, 2, r"dualpipe: --vp = 2: this schedule runs 1 stage\(s\) per rank"),
    ("dualpipev", 4, 7, 1, r"dualpipev: --microbatches = 7 with --pp 4: DualPipeV needs at least as many "
                           r"microbatches as stages, 2 x pp = 8"),
    ("dualpipev", 2, 4, 3, r"dualpipev: --vp = 3: this schedule runs 1 or 2 stage\(s\) per rank"),
    ("dualpipev", 0, 4, 1, r"dualpipev: --pp = 0"),
])
def test_bad_parameters_one_clear_error(name, pp, m, vp, message):
    with pytest.raises(ScheduleError, match=message):
        REGISTRY[name].generator(pp, m, vp)


def test_placement_chunks_and_paths():
    s = generate("dualpipe", 4, 8)
    assert s.stage_to_rank == (0, 1, 2, 3, 3, 2, 1, 0)
    assert [s.chunk_of(st) for st in range(8)] == [0, 1, 2, 3, 0, 1, 2, 3] and s.num_chunks == 4
    assert s.path(3) == (0, 1, 2, 3) and s.path(4) == (4, 5, 6, 7)
    assert [sorted(s.chunk_of(st) for st in s.stages_of(r)) for r in range(4)] == [[0, 3], [1, 2], [1, 2], [0, 3]]
    v = generate("dualpipev", 4, 8)
    assert v.stage_to_rank == (0, 1, 2, 3, 3, 2, 1, 0) and v.num_chunks == 8 and v.path(5) == tuple(range(8))
    assert generate("dualpipev", 4, 8, 2).text_orders() == v.text_orders()  # vp = 2 is the V itself
    pairs = [a for order in s.orders for a in order if isinstance(a, OverlapAction)]
    assert pairs and all(p.forward.kind == "F" and p.backward.kind == "B" for p in pairs)


# ----------------------------------------------------------------------------- unit costs
def _pp_stages(name: str, ranks: int) -> int:
    """The README's PP (stages of one pipeline) for a schedule on ``ranks`` ranks."""
    return ranks if name == "dualpipe" else 2 * ranks


def _run(name, pp, m, sends, layers=64, **par):
    """Unit op-times (F = I = W = 1), free communication, the given pair send policy."""
    hw = dataclasses.replace(load_profile("h100-sxm"), overlap_sends=sends)
    parallel = ParallelConfig(pp=pp, microbatches=m, **par)
    return run_schedule(name, tiny_model(layers), hw, parallel, op_times=(1.0, 1.0, 1.0), comm=False)


CONFIGS = [("dualpipe", 2, 4), ("dualpipe", 4, 8), ("dualpipe", 4, 10), ("dualpipe", 6, 24), ("dualpipe", 8, 20),
           ("dualpipe", 8, 32), ("dualpipev", 1, 2), ("dualpipev", 2, 4), ("dualpipev", 2, 8),
           ("dualpipev", 3, 12), ("dualpipev", 4, 10), ("dualpipev", 4, 16)]


@pytest.mark.parametrize("name,pp,m", CONFIGS)
def test_unit_bubble_equals_readme_when_pairs_send_at_their_end(name, pp, m):
    # The README's bubble is the idle time of every device over the step: its figures (8 ranks,
    # 20 microbatches; DualPipeV 4 ranks, 10 microbatches) have 6 idle cells per row out of 66.
    # That holds when a pair's outputs leave at the end of the pair, as its figures draw it and
    # as deepseek-ai/DualPipe's step() sends them.
    F, B, W = 1.0, 2.0, 1.0
    FB = F + B  # overlap factor 1: the pair takes both chunks' compute
    PP = _pp_stages(name, pp)
    rep = _run(name, pp, m, "after_pair").report
    bubble = (PP / 2 - 1) * (FB + B - 3 * W)
    assert rep.bubble_time_s_per_rank == pytest.approx([bubble] * pp)
    assert rep.step_time_s == pytest.approx(m * (F + B) * (2 if name == "dualpipev" else 1) + bubble)


@pytest.mark.parametrize("name,pp,m", [("dualpipe", 8, 20), ("dualpipev", 4, 10)])
def test_unit_step_equals_the_readme_figures(name, pp, m):
    # images/dualpipe.png and images/dualpipev.png (deepseek-ai/DualPipe @ 3da1bbe) are 66 cells
    # wide (one cell = F = I = W; a pair is 3 cells) and every row has 6 white cells.
    rep = _run(name, pp, m, "after_pair").report
    assert rep.step_time_s == pytest.approx(66)
    assert rep.bubble_time_s_per_rank == pytest.approx([6] * pp)


@pytest.mark.parametrize("name,pp,m", [c for c in CONFIGS if _pp_stages(c[0], c[1]) > 2])
def test_unit_bubble_when_each_half_sends_when_done(name, pp, m):
    # overlap.sends: per_half: a pair's halves alternate slice by slice (one per layer) and each
    # half's output leaves when its last slice ends, which can be up to one slice of the other
    # half before the pair ends. Each of the PP/2-1 bubble steps can shrink by at most that.
    PP = _pp_stages(name, pp)
    layers_per_chunk = 64 // _run(name, pp, m, "per_half").schedule.num_chunks
    early = _run(name, pp, m, "per_half").report
    late = _run(name, pp, m, "after_pair").report
    readme = (PP / 2 - 1) * 2.0
    for got in early.bubble_time_s_per_rank:
        assert readme - (PP / 2 - 1) * 2.0 / layers_per_chunk - 1e-9 <= got < readme
    assert early.step_time_s < late.step_time_s


@pytest.mark.parametrize("name,pp,m", CONFIGS)
def test_peak_activations_pp_plus_one(name, pp, m):
    # README "Activation Per Device": PP + 1 microbatch activations of one stage, on every rank.
    rep = _run(name, pp, m, "per_half").report
    assert rep.peak_inflight_microbatches == [_pp_stages(name, pp) + 1] * pp


def test_activation_bytes_follow_the_order():
    # Every rank of DualPipe holds PP + 1 chunk activations of equal size at its peak.
    run = _run("dualpipe", 4, 16, "per_half")
    act = run.costs.chunks[1].activation_bytes
    static = run.result.memory[run.result.memory["time_s"] == 0].groupby("rank")["bytes"].first()
    peak = run.result.memory.groupby("rank")["bytes"].max()
    assert (peak - static)[1] == pytest.approx(5 * act)  # rank 1 holds chunks 1 and 2 (no embedding/head)


def test_parameters_twice_1f1b_for_dualpipe_not_for_dualpipev():
    def static(name, pp, m):
        run = unit_run(name, pp, m)
        return run.result.memory[run.result.memory["time_s"] == 0].groupby("rank")["bytes"].first().tolist()

    one = static("1f1b", 4, 8)
    dual = static("dualpipe", 4, 8)
    # rank r holds chunk r and chunk pp-1-r: 1F1B's rank r plus 1F1B's rank pp-1-r
    assert dual == pytest.approx([one[r] + one[3 - r] for r in range(4)])
    assert sum(dual) == pytest.approx(2 * sum(one))
    v = static("dualpipev", 4, 8)
    assert sum(v) == pytest.approx(sum(one))  # two half-size chunks per rank: 1x in all
    assert max(v) < 1.2 * max(one)


def test_two_copies_reduce_their_gradients_together():
    # DualPipe holds each chunk on ranks k and pp-1-k; their gradients are summed every step, so
    # even with dp = 1 each stage's gradients are all-reduced over the 2 copies (and with dp = 2
    # over 4 GPUs), each bucket starting once both copies have produced it.
    from simtrain.collectives import estimate_group
    from simtrain.network import Topology

    hw = load_profile("h100-sxm")
    for dp in (1, 2):
        par = ParallelConfig(pp=4, dp=dp, tp=8, microbatches=8, seq_len=64)
        run = run_schedule("dualpipe", tiny_model(num_heads=8), hw, par)
        t = run.result.trace
        red = t[t["name"].str.startswith("dp grad")]
        assert sorted(red["stage"].unique()) == list(range(8))
        assert len(red) == 8 * par.dp_buckets
        topo = Topology(hw, par)
        finisher = {}  # stage -> its last B or W (the action that completes its weight gradients)
        for order in run.schedule.orders:
            for act in order:
                for a in act.parts:
                    if a.kind in ("B", "W"):
                        finisher[a.stage] = a
        for row in red.itertuples():
            twin = 3 - row.rank
            route = topo.gradient_route(row.rank, tuple(sorted((row.rank, twin))))
            assert route.link.name == hw.inter_node.name  # tp 8: every pipeline rank is its own node
            holders = tuple(sorted((row.rank, twin)))
            group = topo.placement("dp", row.rank, holders)
            assert (group.gpus, group.per_node, group.nodes) == (2 * dp, 1, 2 * dp)
            assert row.end_s - row.start_s == pytest.approx(estimate_group("all-reduce", row.bytes, hw, group).time_s)
            # bucket i waits for piece i of both copies' finishing backward
            bucket = int(row.name.rsplit(" ", 1)[1])
            for stage in (row.stage % 4, 4 + row.stage % 4):
                f = finisher[stage]
                pieces = t[(t["name"] == str(f)) & (t["stage"] == stage)].sort_values("start_s")
                assert len(pieces) == par.dp_buckets
                assert pieces["end_s"].iloc[bucket] <= row.start_s + 1e-12
        check_run(run)
    one = run_schedule("1f1b", tiny_model(num_heads=8), hw, ParallelConfig(pp=4, tp=8, microbatches=8, seq_len=64))
    assert not one.result.trace["name"].str.startswith("dp grad").any()


def test_a_copy_waits_for_the_other_copys_gradients():
    # Two ranks each compute the same chunk for different microbatches (a hand-made schedule);
    # rank 1 has twice the work, so rank 0's reduction of bucket i must wait for rank 1's.
    from simtrain.costs import stage_costs
    from simtrain.engine import simulate
    from simtrain.lowering import lower
    from simtrain.network import Topology
    from simtrain.schedules.ir import Schedule, parse_action

    orders = ["0F0 0B0", "1F1 1B1 1F2 1B2"]
    schedule = Schedule("copies", 3, (0, 1), tuple(tuple(parse_action(a) for a in o.split()) for o in orders),
                        stage_chunk=(0, 0), paths=((0,), (1,), (1,)))
    schedule.validate()
    hw = load_profile("h100-sxm")
    par = ParallelConfig(pp=2, microbatches=3, seq_len=64)
    t = simulate(lower(schedule, stage_costs(tiny_model(), par, hw, 1), Topology(hw, par))).trace
    for i in range(par.dp_buckets):
        mine = t[t["name"] == f"dp grad stage 0 bucket {i}"].iloc[0]
        theirs = t[t["name"] == "1B2"].sort_values("start_s").iloc[i]
        assert mine["start_s"] >= theirs["end_s"] > t[t["name"] == "0B0"]["end_s"].max()


def test_cli_reproduces_the_readme_bubble_and_rejects_bad_configs(tmp_path):
    from typer.testing import CliRunner

    from simtrain.cli import app

    # the shipped profile (default overlap.sends: after_pair) reproduces the README's bubble
    common = ["compare", "--model", "llama3-8b", "--hardware", "h100-sxm", "--seq-len", "1024", "--microbatches", "16",
              "--op-times", "1,1,1", "--no-comm", "--json"]
    res = CliRunner().invoke(app, common + ["--pp", "8", "--schedules", "dualpipe"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)[0]["bubble_time_s_per_rank"] == pytest.approx([(8 / 2 - 1) * 2.0] * 8)
    res = CliRunner().invoke(app, common + ["--pp", "4", "--schedules", "dualpipev"])
    assert json.loads(res.stdout)[0]["bubble_time_s_per_rank"] == pytest.approx([(8 / 2 - 1) * 2.0] * 4)
    res = CliRunner().invoke(app, common + ["--pp", "6", "--microbatches", "10", "--schedules", "dualpipe"])
    assert res.exit_code == 2 and "at least 2 x pp = 12" in res.stderr.replace("\n", " ")


def test_pairs_hide_tensor_parallel_communication_only_when_told_to():
    # Llama 3 8B, TP 8 (one node per stage), PP 4, 16 microbatches of 4096 tokens: the TP
    # collectives dominate communication. 1F1B waits for each action's collectives. A pair's
    # collectives block its compute stream by default (overlap.tp: blocking, as Megatron-Core's
    # combined 1F1B runs them), so they stay exposed; with overlap.tp: hidden they run while the
    # other half computes.
    from simtrain.models import load_model

    par = ParallelConfig(pp=4, tp=8, microbatches=16, seq_len=4096)
    hw = load_profile("h100-sxm")
    hidden = dataclasses.replace(hw, overlap_tp="hidden")
    reports = {n: run_schedule(n, load_model("llama3-8b"), hw, par).report for n in ("1f1b", "dualpipe", "dualpipev")}
    assert reports["1f1b"].overlap_ratio < 0.1
    for name in ("dualpipe", "dualpipev"):
        assert reports[name].overlap_ratio < 0.1
        assert reports[name].exposed_comm_s > 0.9 * reports["1f1b"].exposed_comm_s
        told = run_schedule(name, load_model("llama3-8b"), hidden, par).report
        assert told.exposed_comm_s < 0.6 * reports["1f1b"].exposed_comm_s
        assert told.overlap_ratio > 0.5
        assert told.step_time_s < reports[name].step_time_s < reports["1f1b"].step_time_s
