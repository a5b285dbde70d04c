"""Reading real torch profiler traces of a pipeline step and overlaying the simulation on them.

The fixtures tests/data/torch_{gpipe,interleaved}_rank{0,1}.json are real torch.profiler traces of
one step of torch.distributed.pipelining on 2 CPU ranks (gloo), trimmed to torch's user
annotations; tests/data/make_torch_traces.py recorded them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from simtrain.cli import app
from simtrain.errors import SimtrainError
from simtrain.measured import parse_label, read_torch_trace
from simtrain.overlay import action_differences, measured_op_times, schedule_from_measured
from simtrain.schedules import ScheduleError

from conftest import reference_records, unit_run

DATA = Path(__file__).parent / "data"
runner = CliRunner()


def files(kind: str) -> list[Path]:
    return [DATA / f"torch_{kind}_rank{r}.json" for r in (0, 1)]


@pytest.mark.parametrize("label,expected", [
    ("PP:2F1", ("compute", "F", "2F1", 2, 1)),
    ("PP:3I0", ("compute", "I", "3I0", 3, 0)),
    ("PP:3W0", ("compute", "W", "3W0", 3, 0)),
    ("PP:(4F4;3B0)OVERLAP_F_B", ("compute", "F&B", "(4F4;3B0)OVERLAP_F_B", 4, 4)),
    ("PP:1SEND_F0", ("comm", "p2p", "1SEND_F0", 1, 0)),
    ("PP:2RECV_B3", ("comm", "p2p", "2RECV_B3", 2, 3)),
    ("PP:0REDUCE_GRAD", ("comm", "dp", "0REDUCE_GRAD", 0, None)),
    ("Forward 3", ("compute", "F", "1F3", 1, 3)),
    ("Backward 0", ("compute", "B", "1B0", 1, 0)),
])
def test_torch_labels(label, expected):
    row = parse_label(label, rank=1)
    assert (row["category"], row["kind"], row["name"], row["stage"], row["microbatch"]) == expected


@pytest.mark.parametrize("label", ["gloo:send", "ProfilerStep#1", "aten::mm", "PP:bogus", "Forward x"])
def test_other_events_are_not_actions(label):
    assert parse_label(label, rank=0) is None


def test_measured_orders_are_the_orders_torch_runs():
    """The order read back from a real profiled step equals the order recorded from torch's own
    schedule logic (tests/data/schedule_orders.json) for both fixtures."""
    for kind, ref_name, v in (("gpipe", "torch:GPipe", 1), ("interleaved", "torch:Interleaved1F1B", 2)):
        measured = read_torch_trace(files(kind))
        schedule = schedule_from_measured(measured)
        ref = next(r for r in reference_records(ref_name) if r["p"] == 2 and r["m"] == 4 and r["v"] == v)
        assert schedule.text_orders() == [ref["orders"][str(r)] for r in range(2)]
        assert list(schedule.stage_to_rank) == [ref["stage_to_rank"][str(s)] for s in range(ref["num_stages"])]
        assert measured["start_s"].min() == 0.0 and (measured["end_s"] > measured["start_s"]).all()


def test_interleaved_trace_has_sends_receives_and_ranks_overlap_in_time():
    measured = read_torch_trace(files("interleaved"))
    comm = measured[measured["category"] == "comm"]
    assert set(comm["kind"]) == {"p2p", "dp"} and comm["name"].str.contains("SEND_F").any()
    spans = measured.groupby("rank").agg(start=("start_s", "min"), end=("end_s", "max"))
    assert spans.loc[1, "start"] < spans.loc[0, "end"]  # both ranks on one clock: their steps overlap


def test_measured_op_times_and_differences_with_exact_simulation():
    measured = read_torch_trace(files("gpipe"))
    f, i, w = measured_op_times(measured)
    comp = measured[measured["category"] == "compute"]
    dur = comp["end_s"] - comp["start_s"]
    assert f == pytest.approx(dur[comp["kind"] == "F"].median())
    assert i + w == pytest.approx(dur[comp["kind"] == "B"].median()) and i == w
    # a simulation with F = 1 s, B = 2 s: every matched action differs by exactly measured - 1 or - 2
    run = unit_run("gpipe", pp=2, m=4)
    diffs = action_differences(measured, run.result.trace)
    assert len(diffs) == 16
    for r in diffs.itertuples():
        assert r.simulated_s == pytest.approx(1.0 if r.kind == "F" else 2.0)
        assert r.duration_diff_s == pytest.approx(r.measured_s - r.simulated_s)


def test_overlay_command(tmp_path):
    out = tmp_path / "o.html"
    res = runner.invoke(app, ["overlay", "--measured", str(files("interleaved")[0]), "--measured",
                              str(files("interleaved")[1]), "--model", "llama3-8b", "--hardware", "h100-sxm",
                              "--op-times", "measured", "--no-comm", "--out", str(out), "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["summary"]["matched"] == 32 and set(doc["summary"]["per_kind"]) == {"F", "B"}
    assert doc["summary"]["measured_span_s"] > 0 and doc["summary"]["simulated_span_s"] > 0
    text = out.read_text()
    assert "measured vs simulated" in text and "per-action differences" in text
    # a registry schedule can be simulated instead of the measured order
    res = runner.invoke(app, ["overlay", "--measured", str(files("gpipe")[0]), "--measured", str(files("gpipe")[1]),
                              "--model", "llama3-8b", "--hardware", "h100-sxm", "--op-times", "0.001,0.001,0.001",
                              "--schedule", "1f1b", "--out", str(tmp_path / "p.html")])
    assert res.exit_code == 0, res.output
    assert "simulated 1f1b" in res.stdout.replace("\n", " ")


def test_bad_measured_input(tmp_path):
    with pytest.raises(SimtrainError, match="none.json: file not found .expected a measured trace"):
        read_torch_trace([tmp_path / "none.json"])
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(SimtrainError, match="not a JSON trace"):
        read_torch_trace([bad])
    bad.write_text(json.dumps({"traceEvents": [{"ph": "X", "name": "aten::mm", "ts": 1, "dur": 2}]}))
    with pytest.raises(SimtrainError, match="no torch.distributed.pipelining actions found"):
        read_torch_trace([bad])
    with pytest.raises(SimtrainError, match="rank 0 was already read"):
        read_torch_trace([files("gpipe")[0], files("gpipe")[0]])
    twice = json.loads(files("gpipe")[0].read_text())
    twice["traceEvents"] = [e for e in twice["traceEvents"] if not e["name"].startswith("ProfilerStep")]
    twice["traceEvents"] += [dict(e, ts=e["ts"] + 1e6) for e in twice["traceEvents"] if e["ph"] == "X"]
    bad.write_text(json.dumps(twice))
    with pytest.raises(SimtrainError, match="occurs 2 times on rank 0"):
        read_torch_trace([bad])
    with pytest.raises(SimtrainError, match="profiler steps \\[1\\]"):
        read_torch_trace(files("gpipe"), step=7)
    with pytest.raises(ScheduleError, match="rank 0 has no compute actions"):
        schedule_from_measured(read_torch_trace([files("gpipe")[1]]))
    res = runner.invoke(app, ["overlay", "--measured", str(files("gpipe")[0]), "--model", "llama3-8b",
                              "--hardware", "h100-sxm", "--out", str(files("gpipe")[0])])
    assert res.exit_code == 2 and "--out" in res.stderr and "expected a .html file name" in res.stderr
