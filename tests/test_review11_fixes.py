"""Review 11's behaviour items: per-operator-only settings refused or warned about under the flat
model (item 2), the planner's ZeRO-2/3 (item 8), validate's memory columns (item 9) and the
--breakdown table's bytes and HFU (item 11)."""

from __future__ import annotations

import json
import warnings

import pytest

from simtrain.errors import SimtrainError
from simtrain.schedules import ScheduleWarning

from conftest import invoke

_SCENARIO = """model: llama3-8b
hardware: h100-sxm
parallel: {{tp: 8, pp: 1, dp: 1, microbatches: 2, seq_len: 2048, {setting}}}
schedules: [1f1b]
"""


@pytest.mark.parametrize("setting, field", [("fused_projections: false", "fused_projections"),
                                            ("attention_kernel: fa3", "attention_kernel"),
                                            ("kernels: eager", "kernels")])
def test_a_scenario_field_only_the_per_operator_model_prices_is_a_warning_under_flat(tmp_path, setting, field):
    """README "Settings that do not apply": under the flat model a scenario file's setting of the
    per-operator model is ignored with a warning naming the file's field (same mechanism for
    fused_projections, attention_kernel and kernels), and the run is the flat run without it."""
    path = tmp_path / "s.yaml"
    path.write_text(_SCENARIO.format(setting=setting))
    res = invoke("compare", str(path), "--cost-model", "flat", "--json")
    assert res.exit_code == 0, res.output
    assert f"s.yaml: field 'parallel.{field}' = " in res.stderr and " is ignored: " in res.stderr, res.stderr
    plain = tmp_path / "plain.yaml"
    plain.write_text(_SCENARIO.format(setting="").replace(", }", "}"))
    ref = invoke("compare", str(plain), "--cost-model", "flat", "--json")
    assert ref.exit_code == 0, ref.output
    assert json.loads(res.stdout)[0]["step_time_s"] == json.loads(ref.stdout)[0]["step_time_s"]
    ops = invoke("compare", str(path), "--cost-model", "ops", "--json")  # the per-operator model prices it
    assert ops.exit_code == 0 and "ignored" not in ops.stderr, ops.output


def test_on_a_profile_without_kernel_tables_the_files_setting_is_a_warning_and_the_flag_an_error(tmp_path):
    """h100-pcie has no kernel tables (auto runs the flat model): the file's ``kernels: eager`` is
    ignored with a warning naming the field (review 10 made it name the field; review 11: the
    README's rule makes a file's idle setting a warning), the same setting as a flag an error."""
    path = tmp_path / "s.yaml"
    path.write_text(_SCENARIO.format(setting="kernels: eager").replace("h100-sxm", "h100-pcie"))
    res = invoke("compare", str(path), "--json")
    assert res.exit_code == 0 and "s.yaml: field 'parallel.kernels' = 'eager' is ignored: prices the" in res.stderr
    flag = invoke("compare", str(path), "--kernels", "eager", "--json")
    assert flag.exit_code == 2 and flag.output.count("error:") == 1 and "error: --kernels eager: prices the" in flag.output


def test_the_api_refuses_fused_projections_where_nothing_prices_it():
    import simtrain

    common = dict(model="llama3-8b", hardware="h100-sxm", tp=8, schedule="1f1b", fused_projections=False)
    for extra, needle in [(dict(cost_model="flat"), "fused_projections=False: prices separate projection GEMMs"),
                          (dict(op_times=(1, 1, 1)), "fused_projections=False: changes only the compute cost")]:
        with pytest.raises(SimtrainError) as exc:
            simtrain.simulate(**common, **extra)
        assert str(exc.value).startswith(needle) and "--" not in str(exc.value).split(":")[0], exc.value
    with warnings.catch_warnings():
        warnings.simplefilter("error", ScheduleWarning)
        fused = simtrain.simulate(**{**common, "fused_projections": True})
        separate = simtrain.simulate(**common)  # the per-operator model (auto on h100-sxm) prices it
    assert separate.step_time_s > fused.step_time_s


def test_a_torchtitan_job_runs_under_the_flat_model_without_its_projection_setting(tmp_path):
    """--from-torchtitan implies separate projections for the per-operator model only (like its
    kernels), so the flat model runs the job instead of refusing a setting the user never typed."""
    from pathlib import Path

    job = Path(__file__).parent / "data" / "jobs" / "torchtitan_llama3_70b.toml"
    res = invoke("compare", "--from-torchtitan", str(job), "--hardware", "h100-sxm", "--dp", "1",
                 "--cost-model", "flat", "--json")
    assert res.exit_code == 0, res.output
    assert "flat cost model runs here" not in res.stderr  # neither its kernels nor its projections refused
    assert "with the per-operator cost model: kernels eager, fused_projections False" in res.stderr


_PLAN = ["--model", "llama3-8b", "--hardware", "h100-sxm", "--gpus", "16", "--global-batch", "32",
         "--seq-len", "2048", "--recompute", "full", "--workers", "2", "--json"]


def test_plan_searches_zero_3_with_compares_step_and_memory():
    """plan --zero-stages 2,3: every ranked row has the step time and worst-rank peak that compare
    gives the same layout (same lowering), DualPipe is pruned by the schedule rule the lowering
    applies, and ZeRO-3 holds less than ZeRO-1 on the same layout."""
    res = invoke("plan", *_PLAN, "--schedules", "1f1b,interleaved-1f1b,dualpipe", "--zero-stages", "2,3", "--top", "2")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["pruned"]["schedule_rules"] > 0 and data["pruned"]["simulation_error"] == 0
    assert {r["zero_stage"] for r in data["top"]} <= {2, 3} and any(r["zero_stage"] == 3 for r in data["top"])
    for row in data["top"]:
        flags = [x for k in ("tp", "pp", "dp", "vp", "microbatches", "microbatch_size", "recompute")
                 for x in (f"--{k.replace('_', '-')}", str(row[k]))]
        common = ["compare", "--model", "llama3-8b", "--hardware", "h100-sxm", "--seq-len", "2048",
                  "--schedules", row["schedule"], *flags, "--json"]
        same = invoke(*common, "--zero-stage", str(row["zero_stage"]))
        assert same.exit_code == 0, same.output
        cmp = json.loads(same.stdout)[0]
        assert row["step_time_s"] == cmp["step_time_s"] and row["peak_memory_bytes_max"] == max(cmp["peak_memory_bytes"])
        if row["zero_stage"] == 3:
            one = json.loads(invoke(*common, "--zero-stage", "1").stdout)[0]
            assert max(one["peak_memory_bytes"]) > row["peak_memory_bytes_max"]


@pytest.mark.parametrize("zero", [2, 3])
@pytest.mark.parametrize("name", ["1f1b", "interleaved-1f1b", "zbv", "gpipe"])
def test_planner_bounds_hold_under_zero_2_and_3(name, zero):
    """The screening and refined bounds (step and memory) stay below the simulation with sharded
    gradients (and parameters), under both cost models, so pruning ZeRO-2/3 points is safe."""
    from simtrain.cost_models import CostChoice
    from simtrain.hardware import load_profile
    from simtrain.plan import Config, PlanRequest, _Caches, _refine, _screen
    from simtrain.plan_backends import evaluate
    from simtrain.plan_bounds import memory_bound
    from simtrain.schedules import REGISTRY

    from conftest import tiny_model

    vp = 2 if REGISTRY[name].uses_vp else 1
    for cost in (CostChoice("flat"), CostChoice("ops")):
        cfg = Config(2, 2, 4, 1, vp, name, 1, 8, "none", zero)
        req = PlanRequest(tiny_model(layers=16), load_profile("h100-sxm"), gpus=cfg.gpus, global_batch=32,
                          seq_len=512, schedules=(name,), cost=cost, zero_stages=(zero,))
        caches = _Caches(req)
        reason, screen, msg = _screen(req, caches, cfg)
        assert reason is None, msg
        reason, refined, msg = _refine(req, caches, cfg)
        assert reason is None, msg
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ScheduleWarning)
            _, row, error = evaluate(req.model, req.hardware, req.seq_len, cfg, req.cost)
        assert error is None, error
        assert 0 < screen <= row["step_time_s"] * (1 + 1e-9) and 0 < refined <= row["step_time_s"] * (1 + 1e-9)
        shapes = caches.shape(cfg)
        costs = caches.aggregated(cfg, max(c for sh in shapes for c in sh.chunks) + 1)
        assert 0 < memory_bound(shapes, costs) <= row["peak_memory_bytes_max"] * (1 + 1e-9)


def test_plan_refuses_a_zero_stage_it_cannot_lower():
    res = invoke("plan", *_PLAN, "--zero-stages", "4")
    assert res.exit_code == 2 and res.output.count("error:") == 1
    assert "'4' is not one of ['0', '1', '2', '3']" in res.output


def test_a_per_rank_memory_figure_and_the_max_peak_column_are_told_apart():
    """Review 11 item 9: R3's "Interleaved1F1B rank 7" figure predicts rank 7's peak, and the row's
    memory field is the busiest rank's (named ``peak_memory_gib_max``, column ``max peak/HBM GiB``),
    so the two differ where rank 7 is not the busiest and never the other way round."""
    from rich.console import Console

    from simtrain.costs.ops import published_runtime
    from simtrain.published import rows_table, run_suite

    rows = run_suite(published_runtime, cases=["R3-torchtitan-llama3-8b-pp8"])
    memory = [r for r in rows if r.metric == "peak_memory_gib"]
    assert memory and all(r.predicted <= r.peak_memory_gib_max * (1 + 1e-12) for r in memory)
    rank7 = next(r for r in memory if r.label == "Interleaved1F1B rank 7")
    assert rank7.predicted < rank7.peak_memory_gib_max
    rank0 = next(r for r in memory if r.label == "Interleaved1F1B rank 0")
    assert rank0.peak_memory_gib_max == rank7.peak_memory_gib_max  # the same step: one busiest rank
    console = Console(record=True, width=200)
    console.print(rows_table(rows, "t"))
    assert "max peak/HBM GiB" in console.export_text()


def test_breakdown_shows_fused_attentions_bytes_and_grad_sum_is_priced_from_its_bytes(tmp_path):
    """Review 11 item 11: the fused attention kernel's row carries the bytes of the tensors it must
    move (F: Q, K, V, O and the fp32 log-sum-exp, from the shapes; its seconds still from the
    measured rate, bound compute), and separate projections' grad_sum is a memory-bound kernel
    whose I seconds are its I bytes at the HBM rate; the table prints I and W bytes."""
    from simtrain.costs.ops import ops_runtime
    from simtrain.hardware import load_profile
    from simtrain.models import load_model
    from simtrain.parallel import ParallelConfig

    path = tmp_path / "s.yaml"
    path.write_text(_SCENARIO.format(setting="fused_projections: false"))
    res = invoke("compare", str(path), "--breakdown", "0", "--json", "--out", str(tmp_path / "c.html"))
    assert res.exit_code == 0, res.output
    ops = {o["name"]: o for o in json.loads(res.stdout)["breakdown"]["operators"]}
    m = load_model("llama3-8b")
    tokens, heads, kv, d, layers = 2048, m.num_heads / 8, m.kv_heads / 8, m.hidden_size // m.num_heads, m.num_layers
    q = o = tokens * heads * d * 2  # bf16
    k_v = tokens * kv * 2 * d * 2
    att = ops["attention"]
    assert att["bound"] == "compute" and att["bytes"][0] == pytest.approx(layers * (q + k_v + o + tokens * heads * 4))
    assert att["bytes"][1] > att["bytes"][0] and att["bytes"][2] == 0
    grad_sum = ops["grad_sum"]
    hbm = ops_runtime(m, ParallelConfig(tp=8), load_profile("h100-sxm")).ctx.hbm_bytes_per_s
    # qkv's three input gradients summed into one, w1's and w3's two into one: n + 1 tensors of tokens x h
    assert grad_sum["bytes"][1] == pytest.approx(layers * (4 + 3) * tokens * m.hidden_size * 2)
    assert grad_sum["seconds"][1] == pytest.approx(grad_sum["bytes"][1] / hbm) and grad_sum["bound"] == "memory"
    text = invoke("compare", str(path), "--breakdown", "0", "--out", str(tmp_path / "d.html"))
    header = next(line for line in text.stdout.splitlines() if "F GFLOP" in line)
    assert "I MB" in header and "W MB" in header


def test_the_moe_summary_table_keeps_the_hfu_column(tmp_path):
    """Review 11 item 11: with expert parallelism the terminal summary adds the all-to-all columns
    and still shows HFU (it was dropped for width)."""
    model = tmp_path / "moe.yaml"
    model.write_text("name: tiny-moe\nnum_layers: 2\nhidden_size: 1024\nffn_hidden_size: 4096\nnum_heads: 8\n"
                     "vocab_size: 32000\nseq_len: 1024\nactivation: swiglu\nnorm: rmsnorm\n"
                     "moe: {num_experts: 8, top_k: 2, expert_ffn_hidden_size: 1024}\n")
    res = invoke("compare", "--model", str(model), "--hardware", "h100-sxm", "--ep", "8", "--dp", "8",
                 "--microbatches", "1", "--schedules", "1f1b", "--recompute", "full", "--out", str(tmp_path / "c.html"))
    assert res.exit_code == 0, res.output
    header = next(line for line in res.stdout.splitlines() if "MFU" in line)
    assert "a2a (ms)" in header and "HFU" in header


def test_every_second_mm_stores_what_torchs_selective_checkpoint_stores_under_tp_and_sp():
    """Review 11 item 10: under TP 8 with sequence parallelism torchtitan's every-second-mm policy
    frees little, because w2's mm output, saved as the 7th mm, is the row-parallel layer's unreduced
    partial sum (``Partial(sum)``, the whole hidden size per token) and its reduce-scatter output is
    saved too. torch's own selective checkpoint, run on torchtitan's block and TP plan (fake process
    group, tests/data/sac_tp_saved.py), stores exactly simtrain's count per token: the saved outputs
    plus the block input the checkpoint keeps (this rank's sequence shard)."""
    import subprocess
    import sys
    from pathlib import Path

    pytest.importorskip("torch", reason="torch is the calibrate extra, which make .venv/.test installs")
    from simtrain.costs.recompute import every_second_mm_stored_bytes
    from simtrain.models import ModelSpec

    tp, s, h, heads, kv, ffn = 8, 64, 512, 16, 8, 1024
    script = Path(__file__).parent / "data" / "sac_tp_saved.py"
    out = subprocess.run([sys.executable, str(script), *map(str, (tp, s, h, heads, kv, ffn))], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    saved = json.loads(out.stdout)
    partial = [r for r in saved if r["placement"].startswith("P")]
    assert len(partial) == 1 and partial[0]["elements_per_token"] == h  # w2's output, whole
    assert sum(r["op"].startswith("_c10d_functional.reduce_scatter") for r in saved) == 2
    elem = 4  # the script runs in fp32 (the log-sum-exp is fp32 in any dtype)
    measured = elem * (sum(r["elements_per_token"] for r in saved) + h / tp)
    model = ModelSpec(name="block", num_layers=1, hidden_size=h, ffn_hidden_size=ffn, num_heads=heads,
                      num_kv_heads=kv, vocab_size=1000, seq_len=s)
    assert every_second_mm_stored_bytes(model, 0, tp, True, elem) == pytest.approx(measured, rel=1e-12)
