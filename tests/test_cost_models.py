"""The cost-model flags of ``compare`` (--cost-model, --breakdown, --recompute MODULE,..., --fp8,
HFU) and the per-rank memory breakdown."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest


from conftest import SMALL, invoke
from simtrain.cost_models import CostChoice, hfu, parse_cost_choice, recompute_modules, stage_breakdown
from simtrain.errors import SimtrainError
from simtrain.hardware import load_profile
from simtrain.memory import PARTS
from simtrain.models import load_model
from simtrain.parallel import ParallelConfig
from simtrain.scenario import run_schedule



@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)



@pytest.mark.parametrize("stage", [0, 2, 3])
def test_breakdown_adds_up_to_the_stage_seconds(stage):
    """The per-operator seconds of --breakdown sum to the F, I, W seconds the simulation used."""
    model, hw = load_model("llama3-8b"), load_profile("h100-sxm")
    par = ParallelConfig(pp=4, tp=2, dp=2, microbatches=8, seq_len=2048, recompute="full")
    choice = CostChoice("ops")
    runtime = choice.runtime(model, par, hw)
    run = run_schedule("zb-h1", model, hw, par, runtime=runtime)
    table = stage_breakdown(run, runtime, stage)
    chunk = run.costs.chunks[stage]
    sums = [sum(o["seconds"][p] for o in table["operators"]) for p in range(3)]
    for got, want in zip(sums, (chunk.forward_s, chunk.backward_input_s, chunk.backward_weight_s)):
        assert math.isclose(got, want, rel_tol=1e-12) and want > 0
    names = {o["name"] for o in table["operators"]}
    assert {"qkv", "ffn_up", "attention", "norm", "recompute"} <= names
    assert ("head:lm_head" in names) == (stage == 3) and ("embedding" in names) == (stage == 0)
    # full recomputation reruns every layer operator's forward inside I
    redo = next(o for o in table["operators"] if o["name"] == "recompute")
    layer_f = sum(o["seconds"][0] for o in table["operators"] if not o["name"].startswith("head:")
                  and o["name"] not in ("embedding", "recompute", "grad_accum"))
    assert math.isclose(redo["seconds"][1], layer_f, rel_tol=1e-12)


def test_compare_breakdown_json_key_matches_the_table():
    res = invoke("compare", *SMALL, "--schedules", "1f1b", "--cost-model", "ops", "--breakdown", "1", "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    b = data["breakdown"]
    assert b["stage"] == 1 and len(b["total_s"]) == 3 and b["per_step"]["optimizer_s"] > 0
    for p in range(3):
        assert math.isclose(sum(o["seconds"][p] for o in b["operators"]), b["total_s"][p], rel_tol=1e-12)
    assert data["runs"][0]["hfu"] >= data["runs"][0]["mfu"]
    text = invoke("compare", *SMALL, "--schedules", "1f1b", "--cost-model", "ops", "--breakdown", "1")
    assert text.exit_code == 0 and "per microbatch" in text.stdout and "HFU" in text.stdout


@pytest.mark.parametrize("args, needle", [
    (["--cost-model", "ops", "--recompute", "norm,mla_up,bogus"], "unknown module 'bogus'"),
    (["--cost-model", "flat", "--recompute", "norm,swiglu"], "--cost-model ops"),
    (["--cost-model", "flat", "--fp8", "gemms"], "--cost-model ops"),
    (["--cost-model", "ops", "--fp8", "everything"], "the only choice is gemms"),
    (["--cost-model", "flat", "--breakdown", "0"], "--cost-model ops"),
    (["--breakdown", "7"], "choose a stage from 0 to 3"),
    (["--cost-model", "roofline"], "choose auto, flat or ops"),
    (["--cost-model", "ops", "--attention", "sparse"], "--attention = 'sparse': Input should be 'flash' or 'unfused'"),
])
def test_bad_cost_flags_give_one_error_line(args, needle):
    res = invoke("compare", *SMALL, *args, "--json")
    assert res.exit_code == 2
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], res.stderr


def test_recompute_modules_and_fp8_move_the_ops_costs():
    model, hw = load_model("llama3-8b"), load_profile("h100-sxm")
    par = ParallelConfig(pp=4, tp=2, dp=2, microbatches=8, seq_len=2048, recompute="none")
    step = {}
    for key, choice in {"none": parse_cost_choice("ops", None, None, "flash", hw),
                        "norm": parse_cost_choice("ops", recompute_modules("norm,swiglu"), None, "flash", hw),
                        "fp8": parse_cost_choice("auto", None, "gemms", "flash", hw)}.items():
        run = run_schedule("1f1b", model, hw, par, runtime=choice.runtime(model, par, hw))
        step[key] = (run.costs.chunks[1].backward_input_s, run.report.step_time_s, hfu(run, model, par, hw, choice),
                     run.report.mfu)
    assert step["norm"][0] > step["none"][0]  # norms and the activation rerun inside I
    assert step["fp8"][1] < step["none"][1]  # FP8 GEMMs are faster
    assert math.isclose(step["none"][2], step["none"][3], rel_tol=1e-9)  # nothing recomputed: HFU = MFU
    assert step["norm"][2] == pytest.approx(step["norm"][3], rel=1e-9)  # memory-bound ops add no FLOPs


def test_hfu_counts_full_recompute_with_the_flat_model_too():
    model, hw = load_model("llama3-8b"), load_profile("h100-sxm")
    par = ParallelConfig(pp=4, tp=2, dp=2, microbatches=8, seq_len=2048, recompute="full")
    run = run_schedule("1f1b", model, hw, par)
    value = hfu(run, model, par, hw, CostChoice())
    # full recomputation reruns the layers' forward: 4/3 of the model FLOPs, a little less with the head
    assert 1.25 < value / run.report.mfu < 4 / 3


def test_sweep_uses_the_chosen_cost_model():
    rows = {}
    for model in ("flat", "ops"):
        res = invoke("compare", *SMALL, "--schedules", "1f1b", "--cost-model", model, "--sweep",
                     "microbatches=4,8", "--json")
        assert res.exit_code == 0, res.output
        rows[model] = [r["step_time_s"] for r in json.loads(res.stdout)["sweep"]]
    assert all(a != b for a, b in zip(rows["flat"], rows["ops"]))


@pytest.mark.parametrize("schedule", ["1f1b", "zb-h1", "interleaved-1f1b"])
def test_memory_breakdown_adds_up_to_the_peak(schedule):
    model, hw = load_model("llama3-8b"), load_profile("h100-sxm")
    par = ParallelConfig(pp=4, tp=2, dp=2, microbatches=8, seq_len=2048, vp=2 if "interleaved" in schedule else 1)
    rep = run_schedule(schedule, model, hw, par).report
    assert len(rep.memory_breakdown_bytes) == 4
    for parts, peak in zip(rep.memory_breakdown_bytes, rep.peak_memory_bytes):
        assert tuple(parts) == PARTS
        assert math.isclose(sum(parts.values()), peak, rel_tol=1e-12)
        assert parts["weights"] == parts["gradients"] > 0 and parts["optimizer_states"] > 0
        assert parts["activations"] > 0 and all(v >= 0 for v in parts.values())
    pending = [p["w_pending"] for p in rep.memory_breakdown_bytes]
    assert (max(pending) > 0) == (schedule == "zb-h1")  # only a split backward holds W-pending buffers
    assert rep.fits_in_hbm == (max(sum(p.values()) for p in rep.memory_breakdown_bytes) <= rep.hbm_bytes)


def test_auto_takes_ops_for_shipped_profiles_and_flat_for_calibrated_ones():
    hw = load_profile("h100-sxm")
    assert recompute_modules("full") is None and recompute_modules("norm,mla_up") == "norm,mla_up"
    assert parse_cost_choice("auto", None, None, "flash", hw).model == "ops"
    calibrated = dataclasses.replace(hw, calibration={"source": "a measured run"})
    assert parse_cost_choice("auto", None, None, "flash", calibrated).model == "flat"
    with pytest.raises(SimtrainError, match="needs the per-operator cost model"):
        parse_cost_choice("auto", "norm", None, "flash", calibrated)
    with pytest.raises(SimtrainError, match="unknown module"):
        recompute_modules("norm,,")


def test_default_compare_is_the_per_operator_model_and_flat_stays_reachable():
    rows = {}
    for args in ([], ["--cost-model", "ops"], ["--cost-model", "flat"]):
        res = invoke("compare", *SMALL, "--schedules", "1f1b", *args, "--json")
        assert res.exit_code == 0, res.output
        rows[tuple(args)] = json.loads(res.stdout)[0]["step_time_s"]
    assert rows[()] == rows[("--cost-model", "ops")] != rows[("--cost-model", "flat")]


@pytest.mark.parametrize("schedule, tied, op_times, synced", [
    ("1f1b", True, None, True), ("1f1b", False, None, False), ("1f1b", True, (1.0, 1.0, 1.0), False),
    ("zbv", True, None, False),  # the V shape puts the first and last chunk on rank 0: nothing to sync
])
def test_tied_embedding_gradients_are_all_reduced_between_first_and_last_stage(schedule, tied, op_times, synced):
    from conftest import tiny_model

    model, hw = tiny_model(layers=8, tied_embeddings=tied), load_profile("h100-sxm")
    par = ParallelConfig(pp=4, tp=2, dp=2, microbatches=8, vp=2 if schedule == "zbv" else 1)
    run = run_schedule(schedule, model, hw, par, op_times=op_times)
    trace = run.result.trace
    sync = trace[trace["name"] == "embedding grad all-reduce"]
    assert (not sync.empty) == synced
    if synced:
        assert sorted(sync["rank"]) == [0, 3] and sorted(sync["peer"]) == [0, 3]
        assert (sync["bytes"] == model.vocab_size * model.hidden_size / 2 * run.costs.grad_bytes_per_param).all()
        for rank, end in zip(sync["rank"], sync["end_s"]):
            opt = trace[(trace["rank"] == rank) & (trace["kind"] == "OPT")]
            assert (opt["start_s"] >= end - 1e-12).all()  # the optimizer waits for it
        # one collective: neither half starts before both ranks' DP gradient reductions are done
        # (Megatron-Core's finalize_model_grads: finish_grad_sync, then the embedding all-reduce)
        reductions = trace[trace["name"].str.startswith("dp grad") & trace["rank"].isin([0, 3])]
        assert sync["start_s"].min() == pytest.approx(sync["start_s"].max())
        assert sync["start_s"].min() >= reductions["end_s"].max() - 1e-12


def test_an_edited_copy_of_a_shipped_profile_keeps_its_own_compute_figures(tmp_path):
    """The reviewer's case: a copy of h100-sxm.yaml with an edited bf16 peak kept the name, and the
    default model priced it from H100's kernel tables (same step time, MFU of 4e10 %)."""
    from simtrain.costs.kernels import has_kernel_tables
    from simtrain.hardware import PROFILE_DIR
    text = (PROFILE_DIR / "h100-sxm.yaml").read_text()
    (tmp_path / "same.yaml").write_text(text)
    (tmp_path / "edited.yaml").write_text(text.replace("matmul: 0.75", "matmul: 0.3"))
    assert "matmul: 0.75" in text
    assert has_kernel_tables(load_profile(tmp_path / "same.yaml"))
    assert not has_kernel_tables(load_profile(tmp_path / "edited.yaml"))
    renamed = text.replace("name: h100-sxm", "name: my-h100").replace("nics_per_node: 8", "nics_per_node: 3")
    (tmp_path / "renamed.yaml").write_text(renamed)  # review 9: a renamed copy fell to the flat model silently
    assert has_kernel_tables(load_profile(tmp_path / "renamed.yaml"))
    (tmp_path / "renamed-edited.yaml").write_text(renamed.replace("matmul: 0.75", "matmul: 0.3"))
    assert not has_kernel_tables(load_profile(tmp_path / "renamed-edited.yaml"))
    args = ["compare", "--model", "llama3-8b", "--tp", "2", "--pp", "2", "--microbatches", "4", "--schedules", "1f1b",
            "--json", "--hardware"]
    same, moved = invoke(*args, "h100-sxm"), invoke(*args, str(tmp_path / "renamed.yaml"))
    assert json.loads(same.stdout)[0]["step_time_s"] == json.loads(moved.stdout)[0]["step_time_s"]
    flat = invoke(*args, str(tmp_path / "renamed-edited.yaml"))
    assert flat.exit_code == 0 and "warning: my-h100: the flat cost model" in flat.stderr
    assert "warning" not in same.stderr
    shipped = load_profile("h100-sxm")  # a published case's network edits keep the tables
    assert has_kernel_tables(dataclasses.replace(shipped, hbm_bandwidth_bytes_per_s=1e12))
    assert not has_kernel_tables(dataclasses.replace(shipped, peak_flops={**shipped.peak_flops, "bf16": 1.0}))


def test_a_compute_section_the_per_operator_model_would_ignore_is_priced_flat_or_refused(tmp_path):
    """Review 10: an h100-sxm copy with ``layer_slowdown`` and slow elementwise rates ran under
    auto/ops from H100's kernel tables, the section silently ignored."""
    from simtrain.hardware import PROFILE_DIR
    text = (PROFILE_DIR / "h100-sxm.yaml").read_text().replace("name: h100-sxm", "name: slow-h100")
    (tmp_path / "slow.yaml").write_text(text + "compute:\n  layer_slowdown: {F: 2.0, B: 2.0}\n"
                                        "  elementwise_gb_per_s: {norm: 10, activation: 10, add: 10}\n")
    args = ["compare", "--model", "llama3-8b", "--tp", "2", "--pp", "2", "--microbatches", "4", "--schedules", "1f1b",
            "--json", "--hardware", str(tmp_path / "slow.yaml")]
    steps = {}
    for cm in ("auto", "flat"):
        res = invoke(*args, "--cost-model", cm)
        assert res.exit_code == 0 and "warning" not in res.stderr, res.output
        steps[cm] = json.loads(res.stdout)[0]["step_time_s"]
    plain = json.loads(invoke(*args[:-1], "h100-sxm", "--cost-model", "flat").stdout)[0]["step_time_s"]
    assert steps["auto"] == steps["flat"] > 2 * plain  # the slowdown of 2 and the slow kernels are priced
    ops = invoke(*args, "--cost-model", "ops")
    assert ops.exit_code == 2 and ops.stderr.count("\n") == 1
    assert "compute.elementwise_gb_per_s is priced by the flat cost model only" in ops.stderr


def test_an_edit_to_a_peak_the_tables_do_not_rate_keeps_them_and_the_advice_is_true(tmp_path):
    """Review 10: a copy whose only edit was the fp64 peak fell to the flat model, and the warning's
    advice (pass --cost-model ops) then failed."""
    from simtrain.hardware import PROFILE_DIR
    text = (PROFILE_DIR / "h100-sxm.yaml").read_text().replace("name: h100-sxm", "name: my-h100")
    assert "fp64: 67.0" in text
    (tmp_path / "fp64.yaml").write_text(text.replace("fp64: 67.0", "fp64: 34.0"))
    (tmp_path / "bf16.yaml").write_text(text.replace("bf16: 989.4", "bf16: 900.0"))
    args = ["compare", "--model", "llama3-8b", "--tp", "2", "--pp", "2", "--microbatches", "4", "--schedules", "1f1b",
            "--json", "--hardware"]
    shipped, fp64 = invoke(*args, "h100-sxm"), invoke(*args, str(tmp_path / "fp64.yaml"))
    assert fp64.exit_code == 0 and "warning" not in fp64.stderr, fp64.output
    assert json.loads(fp64.stdout)[0]["step_time_s"] == json.loads(shipped.stdout)[0]["step_time_s"]
    bf16 = invoke(*args, str(tmp_path / "bf16.yaml"))
    assert "warning: my-h100: the flat cost model" in bf16.stderr and "--cost-model ops" not in bf16.stderr
