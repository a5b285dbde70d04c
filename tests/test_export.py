"""Chrome/Perfetto trace-event JSON and CSV export of simulated steps."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from simtrain.cli import app
from simtrain.scenario import SCENARIO_DIR, load_scenario
from simtrain.export import chrome_trace
from simtrain.trace import lane_of

from conftest import unit_run

ROOT = Path(__file__).resolve().parent.parent
runner = CliRunner()


def test_scenario_trace_is_valid_trace_event_json(tmp_path):
    trace = tmp_path / "t.json"
    csv = tmp_path / "t.csv"
    res = runner.invoke(app, ["compare", str(SCENARIO_DIR / "default.yaml"), "--trace", str(trace),
                              "--csv", str(csv), "--json", "--out", str(tmp_path / "d.html")])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    doc = json.loads(trace.read_text())
    assert doc["displayTimeUnit"] == "ms"
    events = doc["traceEvents"]
    assert events
    for e in events:
        for key in ("name", "ph", "ts", "dur", "pid", "tid"):
            assert key in e, (key, e)
        assert e["ph"] in ("X", "M", "C")
        assert isinstance(e["ts"], (int, float)) and isinstance(e["dur"], (int, float)) and e["dur"] >= 0
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int)
    processes = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    scenario = load_scenario(SCENARIO_DIR / "default.yaml")
    assert sorted(processes.values()) == sorted(f"{s} · rank {r}" for s in scenario.schedules
                                                for r in range(scenario.parallel.pp))
    threads = {(e["pid"], e["args"]["name"]) for e in events if e["name"] == "thread_name"}
    assert {name for _, name in threads} == {"compute", "p2p", "tp", "dp"}
    # times in microseconds: each schedule's last event ends at its step time
    for row in rows:
        pids = {p for p, n in processes.items() if n.startswith(row["schedule"] + " ")}
        end = max(e["ts"] + e["dur"] for e in events if e["ph"] == "X" and e["pid"] in pids)
        assert end == pytest.approx(row["step_time_s"] * 1e6, rel=1e-9)
    table = pd.read_csv(csv)
    n_x = sum(1 for e in events if e["ph"] == "X")
    assert len(table) == n_x and list(table.columns[:3]) == ["schedule", "rank", "stream"]
    assert set(table["schedule"]) == set(scenario.schedules) and "resources" in table.columns


def test_unit_costs_trace_has_exact_times():
    run = unit_run("1f1b", pp=2, m=2, comm=False)
    doc = chrome_trace({"1f1b": run.result.trace}, {"1f1b": run.result.memory})
    compute = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] in ("F", "B")]
    # F = 1 s, B = I + W = 2 s. Rank 1: 1F0 [1,2], 1B0 [2,4], 1F1 [4,5], 1B1 [5,7];
    # rank 0: 0F0 [0,1], 0F1 [1,2], 0B0 [4,6] after 1B0, 0B1 [7,9] after 1B1.
    rank0 = sorted((e["ts"], e["dur"], e["name"]) for e in compute if e["pid"] == 1)
    assert rank0 == [(0.0, 1e6, "0F0"), (1e6, 1e6, "0F1"), (4e6, 2e6, "0B0"), (7e6, 2e6, "0B1")]
    rank1 = sorted((e["ts"], e["dur"], e["name"]) for e in compute if e["pid"] == 2)
    assert rank1 == [(1e6, 1e6, "1F0"), (2e6, 2e6, "1B0"), (4e6, 1e6, "1F1"), (5e6, 2e6, "1B1")]
    counters = [e for e in doc["traceEvents"] if e["ph"] == "C"]
    assert counters and all("GiB" in e["args"] for e in counters)


def test_lanes():
    assert lane_of("compute", "compute", "F") == "compute"
    assert lane_of("comm", "", "p2p") == "p2p"
    assert lane_of("comm", "tp", "tp") == "tp"
    assert lane_of("comm", None, "a2a") == "a2a"


@pytest.mark.parametrize("flag,value,message", [
    ("--trace", "t.txt", "--trace = 't.txt': expected a .json file name"),
    ("--csv", "t.json", "--csv = 't.json': expected a .csv file name"),
])
def test_bad_export_paths(tmp_path, flag, value, message):
    res = runner.invoke(app, ["compare", "--model", "llama3-8b", "--hardware", "h100-sxm", "--pp", "2",
                              flag, str(tmp_path / value), "--json"])
    assert res.exit_code == 2 and message.split("=")[0] in res.stderr and "expected a" in res.stderr


def test_export_refuses_to_overwrite_an_input(tmp_path):
    sc = tmp_path / "s.json"  # a scenario is YAML, and YAML reads JSON: a .json scenario is possible
    sc.write_text(json.dumps({"model": "llama3-8b", "hardware": "h100-sxm", "schedules": ["1f1b"],
                              "parallel": {"pp": 2, "microbatches": 2}}))
    before = sc.read_text()
    res = runner.invoke(app, ["compare", str(sc), "--trace", str(sc), "--json"])
    assert res.exit_code == 2 and "is an input of this command; refusing to overwrite it" in res.stderr
    assert sc.read_text() == before


def test_plotting_export_and_trace_reading_do_not_load_the_engine():
    code = ("import sys, simtrain.trace, simtrain.metrics, simtrain.viz, simtrain.export, simtrain.measured, "
            "simtrain.overlay; "
            "print('simpy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "False"
