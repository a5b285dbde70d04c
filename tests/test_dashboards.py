"""Reference scenarios (built in, simtrain/scenarios/) and sweeps: each scenario renders, names its source, and the
GPipe microbatch sweep reproduces the bubble formula (p-1)/(m+p-1)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from simtrain.cli import app
from simtrain.errors import SimtrainError
from simtrain.scenario import SCENARIO_DIR, load_scenario
from simtrain.sweep import parse_sweep, sweep_from_mapping

from conftest import ROOT, SCENARIOS
runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(app, list(args))


def test_the_reference_scenarios_are_there():
    names = {s.stem for s in SCENARIOS}
    assert {"megatron-gpt3-175b", "zero-bubble", "llama3-405b", "gpipe-microbatches", "default", "deepseek-v3"} <= names


@pytest.mark.parametrize("path", SCENARIOS, ids=[s.stem for s in SCENARIOS])
def test_scenario_names_its_source_and_renders(path, rendered_scenarios):
    scenario = load_scenario(path)
    assert len(scenario.source) > 40 and re.search(r"arXiv:\d{4}\.\d{4,5}|(19|20)\d\d", scenario.source)  # a citation
    assert scenario.out and Path(scenario.out).name == f"{path.stem}.html"  # make dashboards writes NAME.html
    out, res = rendered_scenarios[path.stem]
    assert res.exit_code == 0, res.output
    text = out.read_text()
    assert "simtrain-manifest" in text and "Plotly.newPlot" in text and scenario.title in text
    payload = json.loads(res.stdout)
    runs = payload["runs"] if isinstance(payload, dict) else payload
    assert [r["schedule"] for r in runs] == scenario.schedules
    assert any(r["fits_in_hbm"] for r in runs)


@pytest.mark.parametrize("cost_model, slack", [("flat", 0.03), ("auto", 0.04)])
def test_gpipe_microbatch_sweep_follows_the_formula(tmp_path, cost_model, slack):
    """Cost model with communication: near (p-1)/(m+p-1), falling with m; GPipe's memory grows
    with m while 1F1B's stays put. The formula assumes balanced stages; 30 layers on 8 stages give
    the first and last stage 3 layers, so the step is as slow as the slowest stage and the first
    idles. The flat model keeps the last stage (3 layers + LM head) lighter than a 4-layer one;
    the per-operator model (default) makes it 1.2 % heavier (fp32 cross-entropy and the head
    GEMM), which adds that much idle time on every other stage: within 4 points at m = 64."""
    res = invoke("compare", str(SCENARIO_DIR / "gpipe-microbatches.yaml"), "--json",
                 "--cost-model", cost_model, "--out", str(tmp_path / "g.html"))
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)["sweep"]
    p = 8
    for schedule in ("gpipe", "1f1b"):
        mine = sorted((r for r in rows if r["schedule"] == schedule), key=lambda r: r["value"])
        assert [r["value"] for r in mine] == [1, 2, 4, 8, 16, 32, 64]
        bubbles = [r["bubble_ratio"] for r in mine]
        assert all(a > b for a, b in zip(bubbles, bubbles[1:]))
        for r in mine:
            assert r["bubble_ratio"] == pytest.approx((p - 1) / (r["value"] + p - 1), abs=slack)
        tokens = [r["tokens_per_s"] for r in mine]
        assert all(a < b for a, b in zip(tokens, tokens[1:]))
    gpipe_mem = [r["peak_memory_bytes_max"] for r in rows if r["schedule"] == "gpipe"]
    ofob_mem = [r["peak_memory_bytes_max"] for r in rows if r["schedule"] == "1f1b"]
    assert gpipe_mem[-1] > 5 * gpipe_mem[0] and max(ofob_mem[3:]) == pytest.approx(min(ofob_mem[3:]))


def test_gpipe_microbatch_sweep_is_exact_with_unit_costs(tmp_path):
    res = invoke("compare", str(SCENARIO_DIR / "gpipe-microbatches.yaml"), "--op-times", "1,1,1",
                 "--no-comm", "--json", "--out", str(tmp_path / "g.html"))
    rows = json.loads(res.stdout)["sweep"]
    for r in rows:
        assert r["bubble_ratio"] == pytest.approx(7 / (r["value"] + 7), abs=1e-9)


def test_sweep_flag_over_pp_and_the_dashboard_holds_the_sweep(tmp_path):
    out = tmp_path / "s.html"
    res = invoke("compare", "--model", "llama3-8b", "--hardware", "h100-sxm", "--microbatches", "8",
                 "--seq-len", "2048", "--sweep", "pp=2,4,8", "--out", str(out))
    assert res.exit_code == 0, res.output
    assert "sweep over pp" in res.stdout
    assert "TP 1 x PP 2 x DP 1" in res.stdout  # the detailed comparison: the swept value nearest pp = 1
    text = out.read_text()
    assert "sweep over pp" in text and "throughput per GPU (tokens" in text  # pp changes the GPUs


def test_impossible_sweep_points_are_reported_not_fatal(tmp_path):
    res = invoke("compare", "--model", "llama3-8b", "--hardware", "h100-sxm", "--pp", "4", "--sweep",
                 "pp=4,40", "--json")
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)["sweep"]
    bad = [r for r in rows if r["value"] == 40]
    assert bad and all("40 pipeline stages for a model of 32 layers" in r["error_message"] for r in bad)
    assert all(r["error_message"] is None for r in rows if r["value"] == 4)


@pytest.mark.parametrize("text,message", [
    ("microbatches", "--sweep = 'microbatches': expected FIELD=V1,V2"),
    ("seq=1,2", "cannot sweep 'seq'"),
    ("pp=2,x", "'x' is not a positive integer"),
    ("pp=0,2", "pp value 0 is not a positive integer"),
    ("pp=2,2", "pp value 2 is given twice"),
])
def test_bad_sweep_flag(text, message):
    with pytest.raises(SimtrainError, match=re.escape(message)):
        parse_sweep(text)
    res = invoke("compare", "--model", "llama3-8b", "--hardware", "h100-sxm", "--sweep", text)
    assert res.exit_code == 2 and message in res.stderr and "Traceback" not in res.output


def test_bad_sweep_in_a_scenario_file(tmp_path):
    sc = tmp_path / "s.yaml"
    sc.write_text("model: llama3-8b\nhardware: h100-sxm\nschedules: [1f1b]\nsweep: {pp: [2], vp: [1]}\n")
    res = invoke("compare", str(sc))
    assert res.exit_code == 2 and "s.yaml: field 'sweep': expected one parameter" in res.stderr
    sc.write_text("model: llama3-8b\nhardware: h100-sxm\nschedules: [1f1b]\nsweep: {pp: [two]}\n")
    res = invoke("compare", str(sc))
    assert res.exit_code == 2 and "field 'sweep.pp.0' = 'two'" in res.stderr
    with pytest.raises(SimtrainError, match="cannot sweep 'dtype'"):
        sweep_from_mapping({"dtype": [1]}, "x.yaml")


def test_scenario_resolves_a_model_file_next_to_it(tmp_path):
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "m.yaml").write_text((SCENARIO_DIR / "models" / "zb-6.2b.yaml").read_text())
    sc = tmp_path / "s.yaml"
    sc.write_text("model: models/m.yaml\nhardware: a100-sxm-80gb\nschedules: [1f1b]\nparallel: {pp: 2, microbatches: 2}\n")
    assert load_scenario(sc).model == str(tmp_path / "models" / "m.yaml")
    res = invoke("compare", str(sc), "--json")
    assert res.exit_code == 0, res.output


def test_coarsen_trace_merges_an_actions_close_subtasks_only():
    import pandas as pd

    from simtrain.trace import TRACE_COLUMNS
    from simtrain.viz import coarsen_trace

    rows = []
    for mb in range(2):  # two actions of 50 back-to-back sub-tasks each, 1 s apart
        for i in range(50):
            start = mb * 100.0 + i * 1.0
            rows.append((0, "compute", "compute", "F", f"attn {mb}.{i}", 0, mb, start, start + 1.0, 0.0, None, ""))
    rows.append((0, "compute", "compute", "F", "late", 0, 1, 400.0, 401.0, 0.0, None, ""))  # far gap: own bar
    trace = pd.DataFrame(rows, columns=TRACE_COLUMNS)
    same, tol = coarsen_trace(trace, max_bars=len(trace))
    assert tol == 0 and len(same) == len(trace)
    merged, tol = coarsen_trace(trace, max_bars=10)
    assert 0 < tol < 100 and len(merged) == 3
    assert merged[["start_s", "end_s"]].values.tolist() == [[0.0, 50.0], [100.0, 150.0], [400.0, 401.0]]
    assert merged["name"].tolist() == ["0F0: 50 tasks", "0F1: 50 tasks", "late"]


def test_a_sweep_that_changes_the_gpu_count_compares_per_gpu(tmp_path):
    """pp = 2, 4, 8 runs on 2, 4, 8 GPUs: rows, table and plot carry GPUs, tokens/s per GPU and MFU."""
    out = tmp_path / "s.html"
    res = invoke("compare", "--model", "llama3-8b", "--hardware", "h100-sxm", "--microbatches", "8",
                 "--seq-len", "2048", "--schedules", "1f1b", "--sweep", "pp=2,4,8", "--out", str(out))
    assert res.exit_code == 0, res.output
    assert "GPUs" in res.stdout and "tokens/s/GPU" in res.stdout and "MFU" in res.stdout
    res = invoke("compare", "--model", "llama3-8b", "--hardware", "h100-sxm", "--microbatches", "8",
                 "--seq-len", "2048", "--schedules", "1f1b", "--sweep", "pp=2,4,8", "--json")
    rows = json.loads(res.stdout)["sweep"]
    assert [r["gpus"] for r in rows] == [2, 4, 8]
    for r in rows:
        assert r["tokens_per_s_per_gpu"] == pytest.approx(r["tokens_per_s"] / r["gpus"])
        assert 0 < r["mfu"] < 1
    # raw tokens/s grows with the GPUs; per GPU it does not (the pipeline bubble grows with pp)
    assert rows[2]["tokens_per_s"] > rows[0]["tokens_per_s"]
    assert rows[2]["tokens_per_s_per_gpu"] < rows[0]["tokens_per_s_per_gpu"]
    text = out.read_text()
    assert "throughput per GPU (tokens" in text and "tokens/s/GPU" in text
