"""``parallel.moe_coarsen``: the speed approximation that lowers K MoE layers as one block and each
all-to-all wave as one task over NVLink and the NICs. Off (exact) by default; a lone action keeps
its duration; a DualPipe step moves by a little (its error is measured by benchmarks/bench_speed.py)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from conftest import check_run, tiny_moe
from simtrain.cli import app
from simtrain.costs import stage_costs
from simtrain.hardware import load_profile
from simtrain.lowering.moe import coarsen
from simtrain.parallel import ParallelConfig
from simtrain.scenario import run_schedule

H800 = load_profile("h800")


def moe_model():
    """Six MoE layers after one dense layer, 4 local experts at EP 16; all-to-all across two nodes."""
    return tiny_moe(layers=7, hidden_size=1024, seq_len=512, moe=dict(num_experts=64, expert_ffn_hidden_size=512))


@pytest.mark.parametrize("layers", [2, 3, 4, 6, 10])
def test_merged_segments_keep_every_second_byte_and_latency(layers):
    par = ParallelConfig(pp=1, dp=16, ep=16, recompute="full")
    moe = stage_costs(moe_model(), par, H800, 1).chunks[0].moe
    exact, coarse = coarsen(moe, 1), coarsen(moe, layers)
    assert [s for s, _ in exact] == list(moe.segments) and all(last is None for _, last in exact)
    blocks = len(moe.blocks)
    assert len(coarse) == -(-blocks // layers) + 1 and coarse[-1] == (moe.segments[-1], None)
    for name in ("forward_s", "backward_input_s", "backward_weight_s", "recompute_s"):
        assert sum(getattr(s, name) for s, _ in coarse) == pytest.approx(sum(getattr(s, name) for s in moe.segments))
    for name in ("expert_forward_s", "expert_backward_input_s", "expert_backward_weight_s"):
        assert sum(getattr(s.block, name) for s, _ in coarse[:-1]) == pytest.approx(
            sum(getattr(b, name) for b in moe.blocks))
    for way in ("dispatch", "combine"):
        for attr in ("nbytes", "latency_s", "transfer_s"):
            for i, link in enumerate(p.link for p in getattr(moe.blocks[0], way).parts):
                merged = sum(getattr(getattr(s.block, way).parts[i], attr) for s, _ in coarse[:-1])
                assert merged == pytest.approx(sum(getattr(getattr(b, way).parts[i], attr) for b in moe.blocks)), link
    first = [s.block.layer for s, _ in coarse[:-1]]
    assert first == [b.layer for b in moe.blocks][::layers]
    assert coarse[0][1] == (moe.blocks[min(layers, blocks) - 1].layer if min(layers, blocks) > 1 else None)


@pytest.mark.parametrize("waves", [1, 4])
def test_a_lone_action_lasts_as_long_as_the_exact_one_with_far_fewer_tasks(waves):
    """Forward-only on one stage: every action is one serial chain, so merging its layers and link
    parts moves nothing but rounding."""
    par = ParallelConfig(pp=1, dp=16, ep=16, microbatches=3, forward_only=True, waves=waves)
    name = "1f1b+waved-ep" if waves > 1 else "1f1b"
    exact = run_schedule(name, moe_model(), H800, par)
    coarse = run_schedule(name, moe_model(), H800, par.model_copy(update={"moe_coarsen": 3}))
    assert coarse.report.step_time_s == pytest.approx(exact.report.step_time_s, rel=1e-12)
    assert coarse.report.a2a_s == pytest.approx(exact.report.a2a_s, rel=1e-12)
    t, e = coarse.result.trace, exact.result.trace
    assert t.loc[t["kind"] == "a2a", "bytes"].sum() == pytest.approx(e.loc[e["kind"] == "a2a", "bytes"].sum())
    # 6 blocks of two link parts each way become 2 blocks of one task each way
    assert (t["kind"] == "a2a").sum() * 6 == (e["kind"] == "a2a").sum()
    merged = t[t["kind"] == "a2a"]
    assert merged["name"].str.endswith(" links").all() and merged["name"].str.contains(" L1-3 ").any()
    assert merged["resources"].str.contains("nvlink:0:out").all() and merged["resources"].str.contains("nic:0:in").all()


def test_default_is_exact_and_dualpipe_moves_only_a_little():
    model = moe_model()
    par = ParallelConfig(pp=2, dp=16, ep=16, microbatches=8, waves=4, recompute="full")
    assert par.moe_coarsen == 1
    exact = run_schedule("dualpipe+waved-ep", model, H800, par)
    coarse = run_schedule("dualpipe+waved-ep", model, H800, par.model_copy(update={"moe_coarsen": 2}))
    check_run(coarse, contiguous=False)
    assert coarse.result.events < 0.5 * exact.result.events
    assert coarse.report.peak_memory_bytes == exact.report.peak_memory_bytes
    assert abs(coarse.report.step_time_s / exact.report.step_time_s - 1) < 0.05


def test_cli_flag_and_its_errors():
    runner = CliRunner()
    res = runner.invoke(app, ["compare", "--model", "deepseek-v3", "--hardware", "h800", "--pp", "16",
                              "--moe-coarsen", "0", "--json"])
    assert res.exit_code == 2 and "--moe-coarsen = 0" in res.output and "Traceback" not in res.output
    res = runner.invoke(app, ["compare", "--model", "llama3-8b", "--hardware", "h100-sxm", "--moe-coarsen", "2",
                              "--json"])
    assert res.exit_code == 2 and "--moe-coarsen" in res.output and "MoE all-to-all only" in res.output
