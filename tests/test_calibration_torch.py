"""Calibration and validation against real torch (CPU, gloo). Skipped only when torch is absent;
`make test` installs it, so CI runs these."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from typer.testing import CliRunner  # noqa: E402

from conftest import reference_records  # noqa: E402
from simtrain.calibration.pipeline_runs import SavedTensorMeter, _schedule_orders  # noqa: E402
from simtrain.calibration.workload import TORCH_SCHEDULES, stage_placement  # noqa: E402
from simtrain.cli import app  # noqa: E402
from simtrain.hardware import load_profile  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SIMTRAIN = [sys.executable, "-m", "simtrain"]

CI_STEP_ERROR_MEDIAN = 0.15
CI_STEP_ERROR_MAX = 0.20
CI_MEMORY_ERROR_MAX = 0.02
"""Bounds of the end-to-end test. Memory is deterministic (-0.19% to -0.23% in every run).
Step time depends on what else runs on the machine. Eight runs of exactly this test's setting
(`benchmarks/validation_spread.py --trimmed --schedules gpipe,1f1b,zbvzerobubble --steps 4
--warmup 1`, each calibrating anew) on the 2-core VM gave a median |error| per run of 1.1-2.7%
and a max of 2.7-7.6% with nothing else running (5 runs, load average 1.0-2.0), and 1.9-6.3% /
3.2-8.3% with a third process spinning on a core throughout calibration and validation (3 runs,
load average 3.4-4.2, the ranks at 0.51-0.58x speed); the bounds leave about twice the worst."""


def test_meter_counts_distinct_storages_and_returns_to_zero():
    lin = torch.nn.Linear(64, 256, bias=False)
    x = torch.randn(32, 64, requires_grad=True)
    meter = SavedTensorMeter(list(lin.parameters()))
    with torch.autograd.graph.saved_tensors_hooks(meter.pack, meter.unpack):
        h = lin(x)  # saves x (the weight is a parameter: not counted)
        y = torch.nn.functional.gelu(h)  # saves h
        z = y * y  # saves y twice: one storage
    assert meter.peak == (32 * 64 + 2 * 32 * 256) * 4
    # split backward as torch's zero-bubble runtime does it: inputs first, keeping the graph ...
    (gx,) = torch.autograd.grad(z.sum(), x, retain_graph=True)
    assert meter.current == meter.peak
    # ... then the weights; once autograd drops the graph every saved storage is released
    torch.autograd.grad(z.sum(), lin.weight)
    del z, y, h
    assert meter.current == 0


@pytest.fixture
def fake_group():
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize("name", [n for n, (_, per) in TORCH_SCHEDULES.items() if per == 2])
def test_live_torch_orders_match_the_reference(fake_group, name):
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining import schedules as torch_schedules

    cls_name, per_rank = TORCH_SCHEDULES[name]
    placement = stage_placement(name, 2)
    stages = [PipelineStage(torch.nn.Linear(4, 4), s, 4, torch.device("cpu")) for s in range(4) if placement[s] == 0]
    sched = getattr(torch_schedules, cls_name)(stages, 4, loss_fn=lambda out, tgt: out.sum())
    orders = _schedule_orders(sched, name, 2, recorded=[])
    rec = next(r for r in reference_records(f"torch:{cls_name.removeprefix('Schedule')}")
               if r["p"] == 2 and r["m"] == 4 and r["v"] == 2)
    assert orders == [rec["orders"]["0"], rec["orders"]["1"]]


runner = CliRunner()


@pytest.mark.parametrize("args,message", [
    (["calibrate", "--out", "EXISTING"], "the file exists; choose a new name or pass --force"),
    (["calibrate", "--out", "NEW", "--device", "tpu"], "--device = 'tpu': choose cpu or cuda"),
    (["calibrate", "--out", "NEW", "--dtype", "fp8"], "--dtype = 'fp8': choose fp32 or bf16"),
    (["calibrate", "--out", "NEW", "--hidden", "256,x"], "--hidden = '256,x': expected comma-separated"),
    (["calibrate", "--out", "NEW", "--base", "tpu-v9"], "unknown hardware 'tpu-v9'"),
    (["calibrate", "--out", "NEW", "--world", "1"], "--world 1 measures no link"),
    (["validate", "--profile", "h100-sxm", "--schedules", "gpipe,zb2p"], "unknown schedule 'zb2p'"),
    (["validate", "--profile", "h100-sxm", "--world", "1"], "--world = 1: a pipeline needs at least 2 ranks"),
    (["validate", "--profile", "nothere.yaml"], "nothere.yaml: hardware profile file not found"),
    (["validate", "--profile", "h100-sxm", "--steps", "0"], "--steps = 0"),
])
def test_bad_calibration_flags_exit_2(tmp_path, args, message):
    existing = tmp_path / "existing.yaml"
    existing.write_text("keep me\n")
    args = [str(existing) if a == "EXISTING" else str(tmp_path / "new.yaml") if a == "NEW" else a for a in args]
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert existing.read_text() == "keep me\n"


def test_missing_torch_is_one_clear_error(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "torch", None)
    result = runner.invoke(app, ["calibrate", "--out", str(tmp_path / "p.yaml")])
    assert result.exit_code == 2
    assert "need torch, which is not installed: install the calibration extra" in result.output


def _run(args: list[str], timeout: int) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(SIMTRAIN + args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def test_calibrate_then_validate_on_this_machine(tmp_path):
    """The CI check: a trimmed calibration, then three torch schedules on 2 ranks x 1 thread."""
    profile = tmp_path / "cpu.yaml"
    cal = _run(["calibrate", "--device", "cpu", "--quick", "--hidden", "256", "--tokens", "256",
                "--out", str(profile)], timeout=240)
    assert cal.returncode == 0, cal.stderr[-2000:]
    hw = load_profile(profile)
    assert hw.calibration["backend"] == "gloo" and hw.linear_rates and hw.processors_per_node >= 1
    # the overheads are fitted non-negative (0 where the kernels alone already account for the
    # steps, as on a loaded machine), and the fitted profile reproduces its own pipeline runs
    assert hw.action_overhead_s >= 0 and hw.message_overhead_s >= 0
    fit = hw.calibration["overheads"]["residuals"]
    assert len(fit) == 6 and max(abs(r["error"]) for r in fit) <= CI_STEP_ERROR_MAX, fit
    # what stages cost inside the calibration model's real pipeline steps: every pass rated, Adam's
    # rate, and the speed probe at the validation model's shapes as validation's reference
    assert set(hw.layer_slowdown) == {"F", "B", "I", "W"} and all(0.5 < v < 3 for v in hw.layer_slowdown.values())
    assert hw.optimizer_bytes_per_s > 0
    probe = hw.calibration["speed_probe"]
    assert probe["seconds"] > 0 and probe["model"]["layers"] == 8
    # the new profile drives the simulator
    model = tmp_path / "tiny.yaml"
    model.write_text("name: tiny\nnum_layers: 8\nhidden_size: 256\nffn_hidden_size: 1024\nnum_heads: 4\n"
                     "vocab_size: 2048\nseq_len: 128\nactivation: gelu\nnorm: layernorm\n")
    cmp = _run(["compare", "--hardware", str(profile), "--model", str(model), "--pp", "2", "--microbatches", "4",
                "--dtype", "fp32", "--json"], timeout=120)
    assert cmp.returncode == 0, cmp.stderr[-2000:]
    assert json.loads(cmp.stdout)[0]["step_time_s"] > 0

    val = _run(["validate", "--profile", str(profile), "--world", "2", "--schedules", "gpipe,1f1b,zbvzerobubble",
                "--steps", "4", "--warmup", "1", "--json"], timeout=300)
    assert val.returncode == 0, val.stderr[-2000:]
    rows = json.loads(val.stdout)
    assert [r["schedule"] for r in rows] == ["gpipe", "1f1b", "zbvzerobubble"]
    for r in rows:
        assert set(r) >= {"schedule", "measured_step_s", "predicted_step_s", "step_error",
                          "measured_activation_bytes", "predicted_activation_bytes", "memory_error"}
        assert r["step_error"] == pytest.approx(r["predicted_step_s"] / r["measured_step_s"] - 1)
        assert abs(r["memory_error"]) <= CI_MEMORY_ERROR_MAX, r
    errors = [abs(r["step_error"]) for r in rows]
    assert statistics.median(errors) <= CI_STEP_ERROR_MEDIAN, rows
    assert max(errors) <= CI_STEP_ERROR_MAX, rows
