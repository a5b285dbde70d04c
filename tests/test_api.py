"""The Python API: simulate() gives the CLI's numbers, a Report carries the --json row plus the
trace and memory tables and renders in a notebook, and `import simtrain` stays light."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pandas as pd
import pytest
from typer.testing import CliRunner

import simtrain
from simtrain.cli import app


def test_simulate_equals_the_cli():
    res = CliRunner().invoke(app, ["compare", "--model", "llama3-8b", "--hardware", "h100-sxm", "--tp", "8",
                                   "--schedules", "1f1b", "--json"])
    assert res.exit_code == 0, res.output
    [row] = json.loads(res.stdout)
    report = simtrain.simulate(model="llama3-8b", hardware="h100-sxm", tp=8, schedule="1f1b")
    assert report.step_time_s == row["step_time_s"]
    assert report.to_row() == row  # every field of the row, same values
    names = {f.name for f in dataclasses.fields(report)}
    assert names == set(row) | {"trace", "memory", "run"}
    assert isinstance(report.trace, pd.DataFrame) and {"start_s", "end_s", "rank"} <= set(report.trace.columns)
    assert isinstance(report.memory, pd.DataFrame) and report.memory["bytes"].max() == max(row["peak_memory_bytes"])


def test_compare_keeps_the_order_and_options_reach_the_config():
    reports = simtrain.compare(model="llama3-8b", hardware="h100-sxm", pp=4, microbatches=8,
                               schedules=["1f1b", "gpipe"], op_times=(1.0, 1.0, 1.0), comm=False)
    assert [r.schedule for r in reports] == ["1f1b", "gpipe"]
    assert reports[1].step_time_s == pytest.approx(3 * (8 + 4 - 1))  # F + I + W per microbatch-stage
    frame = reports.to_frame()
    assert list(frame["schedule"]) == ["1f1b", "gpipe"] and "step_time_s" in frame
    full = simtrain.simulate(model="llama3-8b", hardware="h100-sxm", tp=8, recompute="full")
    plain = simtrain.simulate(model="llama3-8b", hardware="h100-sxm", tp=8, recompute="none")
    assert full.step_time_s > plain.step_time_s  # full recomputation reruns the forward


def test_bad_input_is_a_simtrain_error():
    with pytest.raises(simtrain.SimtrainError, match="field 'tp' = 0"):
        simtrain.simulate(model="llama3-8b", hardware="h100-sxm", tp=0)
    with pytest.raises(simtrain.SimtrainError, match="unknown model"):
        simtrain.simulate(model="llama9", hardware="h100-sxm")


@pytest.mark.parametrize("kwargs,needle", [
    (dict(op_times=(1, 1)), "op_times = \\(1, 1\\): expected three numbers"),
    (dict(op_times="1,1,1"), "op_times = '1,1,1'"),
    (dict(op_times=(1, 1, float("nan"))), "from 0 to"),
    (dict(op_times=(1, True, 1)), "expected three numbers"),
    (dict(comm="no"), "comm = 'no': expected True or False"),
    (dict(schedule=["1f1b"]), "schedule = \\['1f1b'\\]: expected one schedule name"),
])
def test_bad_call_arguments_are_one_simtrain_error(kwargs, needle):
    """A review found TypeError / AttributeError tracebacks, and comm='no' taken as True."""
    with pytest.raises(simtrain.SimtrainError, match=needle):
        simtrain.simulate(model="llama3-8b", hardware="h100-sxm", tp=8, **kwargs)
    with pytest.raises(simtrain.SimtrainError, match="schedules = \\['1f1b', 3\\]"):
        simtrain.compare("llama3-8b", "h100-sxm", schedules=["1f1b", 3])


def test_report_renders_in_a_notebook():
    report = simtrain.simulate(model="llama3-8b", hardware="h100-sxm", pp=2, microbatches=4, op_times=(1, 1, 1))
    page = report._repr_html_()
    assert "<table" in page and "1f1b" in page and "plotly" in page.lower()
    both = simtrain.compare(model="llama3-8b", hardware="h100-sxm", pp=2, microbatches=4, op_times=(1, 1, 1),
                            schedules=["gpipe", "1f1b"])._repr_html_()
    assert both.count("timeline") >= 2


def test_models_and_hardware_load_by_name():
    model = simtrain.load_model("mixtral-8x7b")
    assert model.activated_params < model.total_params
    assert simtrain.load_hardware("h100-sxm").hbm_bytes == 80 * 2**30


def test_import_simtrain_is_light():
    code = ("import sys, simtrain; print(simtrain.__version__); "
            "print(sorted(m for m in ('plotly', 'simpy', 'pandas', 'pydantic', 'typer') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[0] == simtrain.__version__ != "0+unknown"
    assert out[1] == "[]"


def test_the_example_runs(tmp_path):
    from conftest import ROOT

    res = subprocess.run([sys.executable, str(ROOT / "examples" / "compare_schedules.py")], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert "fastest:" in res.stdout
    page = (tmp_path / "compare_schedules.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and "<title>Llama 3 70B on 64 H100s</title>" in page


def test_a_setting_that_applies_to_no_schedule_is_refused_as_on_the_cli():
    """simulate(vp=5) with 1F1B changes nothing: refused, as `compare --vp 5 --schedules 1f1b`."""
    with pytest.raises(simtrain.SimtrainError, match="vp=5: none of 1f1b has virtual stages"):
        simtrain.simulate("llama3-8b", "h100-sxm", schedule="1f1b", vp=5)


def test_the_api_takes_and_refuses_what_compare_does(tmp_path, monkeypatch):
    """The reviewer's cases: eager kernels under the flat model ran, module recompute and fp8
    were refused, an empty schedule list returned nothing, write_html overwrote a user's file."""
    from simtrain.errors import SimtrainError
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SimtrainError, match="kernels=.eager.: prices the per-operator model"):
        simtrain.simulate("llama3-8b", "h100-sxm", tp=8, cost_model="flat", kernels="eager")
    with pytest.raises(SimtrainError, match=r"schedules = \[\]"):
        simtrain.compare("llama3-8b", "h100-sxm", tp=8, schedules=[])
    with pytest.raises(SimtrainError, match="unknown module 'nrom'"):
        simtrain.simulate("llama3-8b", "h100-sxm", tp=8, recompute="norm,nrom")
    base = simtrain.simulate("llama3-8b", "h100-sxm", tp=8, recompute="none")
    norm = simtrain.simulate("llama3-8b", "h100-sxm", tp=8, recompute="norm")
    fp8 = simtrain.simulate("llama3-8b", "h100-sxm", tp=8, recompute="none", fp8="gemms")
    assert norm.step_time_s > base.step_time_s > fp8.step_time_s
    (tmp_path / "mine.html").write_text("mine")
    comp = simtrain.compare("llama3-8b", "h100-sxm", tp=8, schedules=["1f1b"])
    with pytest.raises(SimtrainError, match="not written by simtrain"):
        comp.write_html("mine.html")
    assert (tmp_path / "mine.html").read_text() == "mine"
    assert comp.write_html("ok.html") == comp.write_html("ok.html")  # its own file it may rewrite
    assert comp.to_frame()["peak_memory_bytes_max"][0] == max(comp[0].peak_memory_bytes)


def test_the_api_checks_the_dtype_as_compare_does():
    from simtrain.errors import SimtrainError
    with pytest.raises(SimtrainError, match=r"dtype='fp64': h100-sxm can be priced in"):
        simtrain.simulate("llama3-8b", "h100-sxm", tp=8, dtype="fp64")
    with pytest.raises(SimtrainError, match=r"set the dtype to one of .*fp16.*\(e\.g\. dtype='fp16'\)"):
        simtrain.simulate("llama3-8b", "v100-sxm2", tp=8)


def test_a_schedule_given_twice_is_refused_as_on_the_cli():
    with pytest.raises(simtrain.SimtrainError, match="'1f1b' is given twice"):
        simtrain.compare("llama3-8b", "h100-sxm", tp=8, schedules=("1f1b", "1f1b"))


def test_the_api_keeps_the_task_ceiling_of_the_cli(monkeypatch):
    """A review: simulate(pp=2, microbatches=10**9) ran for ever; `compare` refuses it at once."""
    import simtrain.scenario as scenario

    monkeypatch.setattr(scenario, "generate", lambda *a, **k: pytest.fail("generated a schedule"))
    with pytest.raises(simtrain.SimtrainError, match=r"about 12,000,000,020 tasks, above the ceiling of 2,000,000.*"
                                                     r"max_tasks=12000000020"):
        simtrain.simulate("llama3-8b", "h100-sxm", pp=2, microbatches=10**9, schedule="1f1b")
    with pytest.raises(simtrain.SimtrainError, match="above the ceiling of 10 "):
        simtrain.simulate("llama3-8b", "h100-sxm", pp=2, microbatches=4, max_tasks=10)
    for bad in (0, True, 2.5, "10"):
        with pytest.raises(simtrain.SimtrainError, match="max_tasks = .*expected a whole number >= 1"):
            simtrain.simulate("llama3-8b", "h100-sxm", max_tasks=bad)


def test_the_api_checks_a_spec_op_times_sequences_types_and_sequence_parallel_shards():
    """A review's minor cases: a ModelSpec changed with model_copy was not validated again (a NaN
    width reached the cost model), a numpy op_times was refused, a dict model read as a file name,
    and seq_len 7 ran on tp 8 with sequence parallelism."""
    import numpy as np

    spec = simtrain.load_model("llama3-8b")
    with pytest.raises(simtrain.SimtrainError, match="field 'hidden_size' = nan: Input should be a finite number"):
        simtrain.simulate(spec.model_copy(update={"hidden_size": float("nan")}), "h100-sxm")
    with pytest.raises(simtrain.SimtrainError, match=r"model = \{'layers': 2\}: expected a name, a file path or a "
                                                     "ModelSpec, not dict"):
        simtrain.simulate({"layers": 2}, "h100-sxm")
    with pytest.raises(simtrain.SimtrainError, match="hardware = 3: expected a name"):
        simtrain.simulate("llama3-8b", 3)
    as_tuple = simtrain.simulate("llama3-8b", "h100-sxm", pp=2, microbatches=4, op_times=(1, 1, 1))
    as_array = simtrain.simulate("llama3-8b", "h100-sxm", pp=2, microbatches=4, op_times=np.array([1., 1., 1.]))
    assert as_array.step_time_s == as_tuple.step_time_s > 0
    with pytest.raises(simtrain.SimtrainError, match="expected three numbers"):
        simtrain.simulate("llama3-8b", "h100-sxm", op_times=np.array([1., np.nan, 1.]))
    with pytest.raises(simtrain.SimtrainError, match="seq_len = 7 with tp = 8 and sequence parallelism"):
        simtrain.simulate("llama3-8b", "h100-sxm", tp=8, seq_len=7)
    simtrain.simulate("llama3-8b", "h100-sxm", tp=8, seq_len=7, sequence_parallel=False, pp=2, microbatches=2)
