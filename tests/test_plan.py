"""simtrain plan: the search finds what the simulator says is best, every backend agrees, and bad
input is one error line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from simtrain.cli import app
from simtrain.cost_models import CostChoice
from simtrain.errors import SimtrainError
from simtrain.hardware import load_profile
from simtrain.models import load_model
from simtrain.parallel import ParallelConfig
from simtrain.plan import REASONS, PlanRequest, config_of_row, enumerate_space, search, summarise
from simtrain.plan_backends import LocalBackend
from simtrain.scenario import run_schedule

ROOT = Path(__file__).resolve().parent.parent
GPT = str(ROOT / "simtrain" / "scenarios" / "models" / "gpt-174.6b.yaml")
runner = CliRunner()
ROW_KEYS = {"tp", "pp", "dp", "ep", "vp", "schedule", "microbatch_size", "microbatches", "recompute", "zero_stage",
            "step_time_s", "tokens_per_s", "mfu", "peak_memory_bytes_max", "fits_in_hbm"}
# Llama 3 8B on 16 H100s, 32 sequences of 2048 tokens: small enough to search in seconds.
SMALL = ["--model", "llama3-8b", "--hardware", "h100-sxm", "--gpus", "16", "--global-batch", "32",
         "--seq-len", "2048", "--schedules", "1f1b,interleaved-1f1b", "--recompute", "full",
         "--workers", "2", "--json"]


def invoke(*args: str):
    return runner.invoke(app, list(args))


def _exhaustive_best(req: PlanRequest) -> tuple[float, dict]:
    """The fastest fitting configuration by simulating every point that can run (no bounds), with
    the request's cost model."""
    best = (float("inf"), None)
    for cfg, reason in enumerate_space(req):
        if reason is not None:
            continue
        par = req.parallel(cfg)
        try:
            runtime = req.cost.runtime(req.model, par, req.hardware)
            rep = run_schedule(cfg.schedule, req.model, req.hardware, par, runtime=runtime).report
        except Exception:  # noqa: BLE001 - points the generators or the model refuse
            continue
        if rep.fits_in_hbm and (rep.step_time_s, cfg) < best:
            best = (rep.step_time_s, cfg)
    return best


@pytest.mark.parametrize("cost", ["flat", "ops"])
def test_branch_and_bound_finds_the_exhaustive_best(cost):
    """Pruning by the bounds never drops the configuration an exhaustive search would choose, under
    either cost model (the bounds are priced by the model the survivors are simulated with)."""
    req = PlanRequest(load_model("llama3-8b"), load_profile("h100-sxm"), gpus=8, global_batch=16, seq_len=1024,
                      schedules=("1f1b", "gpipe", "zb-h1"), recompute=("none", "full"), zero_stages=(0,), top=1,
                      cost=CostChoice(cost))
    assert req.cost.model == cost
    backend = LocalBackend(req.model, req.hardware, req.seq_len, 2)
    try:
        res = search(req, backend)
    finally:
        backend.close()
    summary = summarise(req, res)
    step, cfg = _exhaustive_best(req)
    best = summary["best"]
    assert (best["tp"], best["pp"], best["dp"], best["schedule"], best["microbatch_size"], best["recompute"]) == \
        (cfg.tp, cfg.pp, cfg.dp, cfg.schedule, cfg.microbatch_size, cfg.recompute)
    assert best["step_time_s"] == pytest.approx(step)
    assert res.pruned["step_time_bound"] > 0 and res.evaluated < res.considered
    assert res.considered == res.evaluated + sum(res.pruned.values())


def test_json_object_and_ray_gives_the_same_best():
    local = invoke("plan", *SMALL)
    assert local.exit_code == 0, local.output
    data = json.loads(local.stdout)
    assert set(data) >= {"evaluated", "pruned", "best", "top", "pareto"}
    assert set(data["pruned"]) == set(REASONS)
    for row in [data["best"], *data["top"], *data["pareto"]]:
        assert ROW_KEYS <= set(row)
    assert data["best"]["fits_in_hbm"] and data["best"] == data["top"][0]
    steps = [r["step_time_s"] for r in data["top"]]
    assert steps == sorted(steps)
    mems = [r["peak_memory_bytes_max"] for r in data["pareto"]]  # slower on the front means less memory
    assert mems == sorted(mems, reverse=True) and len(set(mems)) == len(mems)
    ray = invoke("plan", *SMALL, "--backend", "ray")
    assert ray.exit_code == 0, ray.output
    assert json.loads(ray.stdout)["best"] == data["best"]


def test_gpt_174b_on_384_a100_beats_megatron(tmp_path):
    """Megatron-LM 2021's TP 8 x PP 12 x DP 4 1F1B (b 1, full recompute) is in the searched space;
    the planner's best fits and is at least as fast under simtrain's own model."""
    out = tmp_path / "plan.html"
    res = invoke("plan", "--model", GPT, "--hardware", "a100-sxm-80gb", "--gpus", "384", "--global-batch", "1536",
                 "--seq-len", "2048", "--schedules", "1f1b", "--recompute", "full", "--zero-stages", "0",
                 "--max-tp", "8", "--top", "1", "--json", "--out", str(out))
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    best = data["best"]
    assert data["cost_model"] == "ops"  # auto: the A100 profile has kernel tables
    model, hw = load_model(GPT), load_profile("a100-sxm-80gb")
    par = ParallelConfig(tp=8, pp=12, dp=4, microbatches=384, microbatch_size=1, seq_len=2048, recompute="full")
    megatron = run_schedule("1f1b", model, hw, par, runtime=CostChoice("ops").runtime(model, par, hw)).report
    assert best["fits_in_hbm"] and best["step_time_s"] <= megatron.step_time_s
    text = out.read_text()
    assert "Pareto front" in text and "timeline" in text and "simtrain-manifest" in text


@pytest.mark.parametrize("cost,attention", [("flat", "flash"), ("ops", "flash"), ("ops", "unfused")])
def test_plan_reports_the_step_time_compare_reports(cost, attention):
    """Every configuration plan ranks has the step time and peak memory ``simtrain compare`` gives it
    under the same ``--cost-model`` and ``--attention`` (same runtime hook and parallel settings),
    and the two cost models disagree on it (the hook is applied)."""
    # recompute none: unfused attention then stores its score matrices (memory differs from flash)
    res = invoke("plan", *SMALL, "--recompute", "none", "--top", "3", "--cost-model", cost, "--attention", attention)
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["cost_model"] == cost and len(data["top"]) == 3
    for row in data["top"]:
        flags = [x for k in ("tp", "pp", "dp", "vp", "microbatches", "microbatch_size", "recompute", "zero_stage")
                 for x in (f"--{k.replace('_', '-')}", str(row[k]))]
        runs = {}
        for model in ("flat", "ops"):
            cmp = invoke("compare", "--model", "llama3-8b", "--hardware", "h100-sxm", "--seq-len", "2048",
                         "--schedules", row["schedule"], *flags, "--cost-model", model, "--attention", attention,
                         "--json")
            assert cmp.exit_code == 0, cmp.output
            runs[model] = json.loads(cmp.stdout)[0]
        assert row["step_time_s"] == runs[cost]["step_time_s"]
        assert row["peak_memory_bytes_max"] == max(runs[cost]["peak_memory_bytes"])
        assert runs["flat"]["step_time_s"] != pytest.approx(runs["ops"]["step_time_s"], rel=1e-3)


def test_fp32_gradients_are_planned_as_compare_prices_them():
    """--grad-reduce-dtype fp32 (Megatron-LM's bf16 default) reaches every simulated configuration:
    each row says it, has compare's step time and peak with the same flag, and holds more gradient
    bytes than the same configuration with the gradient's own dtype."""
    res = invoke("plan", *SMALL, "--top", "2", "--grad-reduce-dtype", "fp32")
    assert res.exit_code == 0, res.output
    for row in json.loads(res.stdout)["top"]:
        assert row["grad_reduce_dtype"] == "fp32"
        flags = [x for k in ("tp", "pp", "dp", "vp", "microbatches", "microbatch_size", "recompute", "zero_stage")
                 for x in (f"--{k.replace('_', '-')}", str(row[k]))]
        common = ["compare", "--model", "llama3-8b", "--hardware", "h100-sxm", "--seq-len", "2048",
                  "--schedules", row["schedule"], *flags, "--json"]
        fp32, own = (json.loads(invoke(*common, *extra).stdout)[0] for extra in (["--grad-reduce-dtype", "fp32"], []))
        assert row["step_time_s"] == fp32["step_time_s"]
        assert row["peak_memory_bytes_max"] == max(fp32["peak_memory_bytes"]) > max(own["peak_memory_bytes"])


def test_request_takes_compares_default_cost_model():
    """PlanRequest without ``cost`` resolves ``auto`` as compare does: per-operator where the profile
    has kernel tables (dense and MoE models alike), flat elsewhere, and the profile's attention kernel (V100:
    unfused); operator recompute lists are refused in the cost model (they are recompute modes)."""
    dense, moe = load_model("llama3-8b"), load_model("deepseek-v3")
    for model, hw, expected, kernel in ((dense, "h100-sxm", "ops", "flash"), (dense, "v100-sxm2", "flat", "unfused"),
                                        (moe, "h800", "ops", "flash")):
        req = PlanRequest(model, load_profile(hw), gpus=8, global_batch=8)
        assert (req.cost.model, req.parallel(next(enumerate_space(req))[0]).attention) == (expected, kernel)
    with pytest.raises(SimtrainError, match="the planner takes the module lists it tries in its recompute modes"):
        PlanRequest(dense, load_profile("h100-sxm"), gpus=8, global_batch=8, cost=CostChoice("ops", recompute="norm"))


@pytest.mark.parametrize("bad", ["x", 0, -5, None, True, 2.5])
def test_request_refuses_a_task_ceiling_that_is_not_a_whole_number(bad):
    """PlanRequest.max_tasks is checked as the API's max_tasks= (it failed later with a TypeError
    in search: review 8)."""
    with pytest.raises(SimtrainError, match=r"PlanRequest.max_tasks = .*expected a whole number >= 1"):
        PlanRequest(load_model("llama3-8b"), load_profile("h100-sxm"), gpus=8, global_batch=8, max_tasks=bad)


def _tiny_yaml(tmp_path, layers=2, heads=2) -> str:
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(dict(name="tiny", num_layers=layers, hidden_size=256, ffn_hidden_size=1024,
                                        num_heads=heads, vocab_size=1000, seq_len=128)))
    return str(path)


def test_bad_input_is_one_error_line(tmp_path):
    tiny = _tiny_yaml(tmp_path)
    cases = [
        (["--gpus", "7", "--global-batch", "8"], "--gpus 7: cannot be split"),
        (["--gpus", "16", "--global-batch", "7", "--max-tp", "1"], "--global-batch 7: not a multiple of dp x microbatch size"),
        (["--gpus", "4", "--global-batch", "8", "--backend", "ray", "--ray-address", "127.0.0.1:1"],
         "--ray-address = '127.0.0.1:1': cannot connect"),
        (["--gpus", "4", "--global-batch", "8", "--schedules", "nope"], "unknown schedule 'nope'"),
        (["--gpus", "4", "--global-batch", "8", "--recompute", "some"], "--recompute = 'some'"),
        (["--gpus", "4", "--global-batch", "8", "--objective", "speed"], "--objective = 'speed'"),
        (["--gpus", "4", "--global-batch", "8", "--cost-model", "fast"],
         "--cost-model = 'fast': choose auto, flat or ops"),
        (["--gpus", "4", "--global-batch", "8", "--attention", "sdpa"],
         "--attention = 'sdpa': choose flash or unfused"),
        (["--gpus", "4", "--global-batch", "8", "--cost-model", "flat", "--fp8", "gemms"],
         "--fp8 = 'gemms': needs the per-operator cost model"),
        (["--gpus", "4", "--global-batch", "8", "--hardware", "v100-sxm2", "--cost-model", "ops"],
         "the per-operator cost model has kernel tables for"),
        (["--gpus", "4", "--global-batch", "8", "--hardware", "a100-sxm-80gb", "--fp8", "gemms"],
         "--fp8 gemms: a100-sxm-80gb (sm_80) has no FP8 GEMM table"),
        (["--gpus", "4", "--global-batch", "8", "--grad-reduce-dtype", "fp64"],
         "--grad-reduce-dtype = 'fp64': choose bf16, fp16 or fp32"),
    ]
    for extra, message in cases:
        # a later flag wins (--model, --hardware in extra)
        res = invoke("plan", "--model", tiny, "--hardware", "h100-sxm", "--schedules", "1f1b", *extra)
        assert res.exit_code == 2, (extra, res.output)
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], (extra, res.stderr)


def test_ctrl_c_stops_the_workers_and_writes_nothing(tmp_path):
    out = tmp_path / "interrupted.html"
    cmd = [sys.executable, "-m", "simtrain", "plan", "--model", GPT, "--hardware", "a100-sxm-80gb", "--gpus", "384",
           "--global-batch", "1536", "--schedules", "1f1b", "--recompute", "full", "--out", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    children: list[int] = []
    deadline = time.monotonic() + 60
    while not children and proc.poll() is None and time.monotonic() < deadline:  # until the pool is up
        time.sleep(0.05)
        children = [int(p) for p in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()]
    assert proc.poll() is None, proc.communicate()
    assert children, "the local backend should have started its worker processes"
    time.sleep(0.5)  # the workers are simulating
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1].startswith("error: interrupted")
    assert list(tmp_path.iterdir()) == []  # no page, no temporary file
    time.sleep(0.5)
    for pid in children:
        assert not os.path.exists(f"/proc/{pid}") or "zombie" in Path(f"/proc/{pid}/status").read_text()


def test_configurations_above_the_task_ceiling_are_pruned_not_simulated():
    """A review: --global-batch 20000 on 8 GPUs ran for minutes, 100000000 grew memory without
    bound: every microbatch count was simulated. Above the ceiling a candidate is now pruned, as
    `compare` refuses it; when nothing else is left, one error line."""
    from simtrain.checks import estimate_tasks

    req = PlanRequest(load_model("llama3-8b"), load_profile("h100-sxm"), gpus=8, global_batch=64, seq_len=1024,
                      schedules=("1f1b",), recompute=("full",), zero_stages=(0,), top=1, max_tasks=300)
    backend = LocalBackend(req.model, req.hardware, req.seq_len, 2)
    try:
        res = search(req, backend)
    finally:
        backend.close()
    assert res.pruned["task_ceiling"] > 0 and res.evaluated > 0
    for row in res.rows:
        cfg = config_of_row(row)
        assert estimate_tasks(cfg.schedule, req.model, req.parallel(cfg)) <= 300
    res = invoke("plan", "--model", "llama3-8b", "--hardware", "h100-sxm", "--gpus", "8",
                 "--global-batch", "100000000", "--json")
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "above the ceiling of 2,000,000 simulated tasks" in lines[0], res.output


def test_a_ceiling_below_the_layers_is_named_as_such():
    """--max-tasks below the model's layers refuses every candidate whatever the batch (each
    simulation builds every layer's costs); the error says so instead of 'lower --global-batch'
    (review 8)."""
    res = invoke("plan", "--model", "llama3-8b", "--hardware", "h100-sxm", "--gpus", "8", "--global-batch", "16",
                 "--max-tasks", "10", "--json")
    lines = [ln for ln in res.output.splitlines() if ln.startswith("error:")]
    assert res.exit_code == 2 and len(lines) == 1, res.output
    assert "the model's 32 layers are above it" in lines[0] and "--global-batch" not in lines[0]
