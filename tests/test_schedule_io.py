"""Import and export in torch's CSV layout, and the action-level errors of a schedule that cannot run."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from conftest import tiny_model
from simtrain.cli import app
from simtrain.engine import DeadlockError
from simtrain.hardware import load_profile
from simtrain.parallel import ParallelConfig
from simtrain.scenario import run_schedule
from simtrain.schedules import REGISTRY, Action, Schedule, ScheduleError, generate, parse_action
from simtrain.schedules.io import format_torch_csv, parse_torch_csv

runner = CliRunner()
UNIT = ["--model", "llama3-8b", "--hardware", "h100-sxm", "--seq-len", "1024", "--op-times", "1,1,1", "--no-comm", "--json"]


def invoke(*args: str):
    return runner.invoke(app, [str(a) for a in args])


@pytest.mark.filterwarnings("ignore::simtrain.schedules.ScheduleWarning")
@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_export_then_import_gives_the_same_schedule(name):
    done = 0
    for p, m, v in [(2, 4, 2), (4, 8, 2), (3, 6, 3), (4, 8, 1)]:
        if name == "dualpipe" and p % 2:
            continue  # DualPipe needs an even number of ranks
        sched = generate(name, p, m, v)
        done += 1
        if name == "dualpipe":  # two directions sharing chunks: torch's layout cannot say it
            with pytest.raises(ScheduleError, match="cannot be exported"):
                format_torch_csv(sched)
            continue
        text = format_torch_csv(sched)
        assert text.splitlines()[0] == ",".join(sched.text_orders()[0])  # one row per rank, torch's cells
        back = parse_torch_csv(text, name, "x.csv")
        assert back.orders == sched.orders and back.stage_to_rank == sched.stage_to_rank
        assert back.num_microbatches == m
    assert done >= 3


def test_export_command_writes_and_never_overwrites(tmp_path):
    res = invoke("export-schedule", "zb-h1", "--pp", 2, "--microbatches", 2, "--format", "torch-csv")
    assert res.exit_code == 0, res.output
    assert res.stdout.splitlines() == ["0F0,0F1,0I0,0W0,0I1,0W1", "1F0,1I0,1F1,1I1,1W0,1W1"]
    out = tmp_path / "s.csv"
    res = invoke("export-schedule", "interleaved-1f1b", "--pp", 4, "--microbatches", 8, "--vp", 2, "--out", out)
    assert res.exit_code == 0, res.output
    assert parse_torch_csv(out.read_text(), "s", "s.csv").orders == generate("interleaved-1f1b", 4, 8, 2).orders
    assert out.read_bytes().count(b"\r\n") == 4  # csv.writer's line ends, as torch's _dump_csv writes them
    out.write_text("mine")
    res = invoke("export-schedule", "zbv", "--pp", 4, "--microbatches", 8, "--out", out)
    assert res.exit_code == 2 and f"--out {out}: the file exists; pass --force to overwrite it" in res.stderr
    assert out.read_text() == "mine"
    res = invoke("export-schedule", "zbv", "--pp", 4, "--microbatches", 8, "--out", out, "--force")
    assert res.exit_code == 0 and out.read_text().startswith("0F0,0F1,0F2")


@pytest.mark.parametrize("args,message", [
    (["zbv", "--pp", 4, "--microbatches", 8, "--format", "json"], "--format = 'json': the only format is 'torch-csv'"),
    (["zb-h2", "--pp", 4, "--microbatches", 4], "zb-h2: --microbatches = 4 with --pp 4: ZB-H2 needs m >= 2 x pp = 8"),
    (["nope", "--pp", 4, "--microbatches", 4], "unknown schedule 'nope'"),
])
def test_export_bad_input(args, message):
    res = invoke("export-schedule", *args)
    assert res.exit_code == 2 and message in res.stderr.replace("\n", " ")
    assert "Traceback" not in res.output


def test_export_warns_for_padded_zbv():
    res = invoke("export-schedule", "zbv", "--pp", 4, "--microbatches", 4)
    assert res.exit_code == 0
    assert "warning: zbv: --microbatches = 4 with --pp 4" in res.stderr.replace("\n", " ")


def test_compare_imports_a_torch_file_with_idle_slots_and_comm_actions(tmp_path):
    # torch writes idle slots as empty cells and, in its compute_comms form, send/recv actions
    f = tmp_path / "mine.csv"
    f.write_text("0F0,0F1,,0I0,0W0,0SEND_F1,0I1,0W1\n,1RECV_F0,1F0,1I0,1F1,1I1,1W0,1W1\n\n")
    res = invoke("compare", "--schedule-file", f, "--schedules", "zb-h1", *UNIT)
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    assert [r["schedule"] for r in rows] == ["zb-h1", "mine"]
    assert rows[1]["step_time_s"] == rows[0]["step_time_s"] == pytest.approx(7.0)
    assert rows[1]["peak_inflight_microbatches"] == [2, 1]


def test_compare_imports_overlapped_pairs(tmp_path):
    f = tmp_path / "pairs.csv"
    f.write_text("0F0,0F1,(0F2;0B0)OVERLAP_F_B,0B1,0B2\n1F0,1B0,1F1,1B1,1F2,1B2\n")
    res = invoke("compare", "--schedule-file", f, *UNIT)
    assert res.exit_code == 0, res.output
    row = json.loads(res.stdout)[0]
    assert row["schedule"] == "pairs" and row["step_time_s"] > 0


def test_imported_sail_sg_style_v_placement_is_derived(tmp_path):
    f = tmp_path / "v.csv"
    sched = generate("zbv", 2, 4)
    f.write_text(format_torch_csv(sched))
    res = invoke("compare", "--schedule-file", f, *UNIT)
    row = json.loads(res.stdout)[0]
    assert row["span_bubble_ratio"] == pytest.approx(0, abs=1e-12) and row["peak_inflight_microbatches"] == [4, 4]


GOOD = ["0F0,0F1,0B0,0B1", "1F0,1B0,1F1,1B1"]


@pytest.mark.parametrize("rows,message", [
    (["0F0,0F1,0B0", "1F0,1B0,1F1,1B1"], "rank 0 is missing action 0B1"),
    (["0F0,0F1,0B0,0B1,0F1", "1F0,1B0,1F1,1B1"], "rank 0 runs action 0F1 2 times (once allowed)"),
    (["0F0,0F1,0B0,0B1,1F2", "1F0,1B0,1F1,1B1"], "stage 1 appears on rank 0 (1F2) and on rank 1 (1F0); a stage runs on one rank"),
    (["0F0,0F1,0B0,0B1", "2F0,2B0,2F1,2B1"], "no rank runs stage 1, but stages up to 2 appear"),
    (["0F0,0X1,0B0,0B1", "1F0,1B0,1F1,1B1"], "row 1 (rank 0), column 2: '0X1' is not an action"),
    (["0F0,0F1,0B0,0B1", ",,", "1F0,1B0,1F1,1B1"], "row 2 (rank 1) has no compute action"),
    (["0F0,0F2,0B0,0B2", "1F0,1B0,1F2,1B2"], "rank 0 is missing action 0F1"),
    (["0F0,0F1,0I0,0B1", "1F0,1B0,1F1,1B1"], "rank 0 is missing action 0W0"),
    ([], "no rows; expected one row of actions per pipeline rank"),
])
def test_import_rejects_what_cannot_run(tmp_path, rows, message):
    f = tmp_path / "bad.csv"
    f.write_text("\n".join(rows) + "\n")
    res = invoke("compare", "--schedule-file", f, *UNIT)
    assert res.exit_code == 2
    assert f"{f}: " in res.stderr.replace("\n", "") and message in res.stderr.replace("\n", " ")
    assert "Traceback" not in res.output


@pytest.mark.parametrize("comm", [[], ["--no-comm"]])
def test_import_of_a_deadlocking_order_names_ranks_and_actions(tmp_path, comm):
    f = tmp_path / "dead.csv"
    f.write_text("0F0,0B0,0F1,0B1\n1F1,1B1,1F0,1B0\n")  # rank 1 wants microbatch 1 first
    args = ["--model", "llama3-8b", "--hardware", "h100-sxm", "--json", *comm]
    res = invoke("compare", "--schedule-file", f, *args)
    assert res.exit_code == 2 and "Traceback" not in res.output
    text = res.stderr.replace("\n", " ")
    assert f"--schedule-file {f}: the order cannot run: deadlock" in text
    assert "rank 0 (compute) cannot run 0B0: it waits for 1B0 (rank 1)" in text
    assert "rank 1 (compute) cannot run 1F1: it waits for 0F1 (rank 0)" in text


@pytest.mark.parametrize("args,message", [
    (["--pp", "4"], "--pp = 4: the schedule file {f} has 2 ranks (rows); drop --pp or make them agree"),
    (["--microbatches", "3"], "--microbatches = 3: the schedule file {f} has 2 microbatches"),
])
def test_flags_must_agree_with_the_file(tmp_path, args, message):
    f = tmp_path / "ok.csv"
    f.write_text("\n".join(GOOD) + "\n")
    res = invoke("compare", "--schedule-file", f, *UNIT, *args)
    assert res.exit_code == 2 and message.format(f=f) in res.stderr.replace("\n", "")


def test_missing_schedule_file(tmp_path):
    res = invoke("compare", "--schedule-file", tmp_path / "none.csv", *UNIT)
    assert res.exit_code == 2 and "none.csv: file not found" in res.stderr.replace("\n", "")


def test_schedule_validate_names_rank_and_action():
    bad = Schedule("s", 1, (0, 1), ((Action(0, "F", 0), Action(0, "B", 0), Action(5, "F", 0)),
                                    (Action(1, "F", 0), Action(1, "B", 0))))
    with pytest.raises(ScheduleError, match="rank 0 has action 5F0 of unknown stage 5"):
        bad.validate()
    dead = Schedule("dead", 2, (0, 1), tuple(
        tuple(map(parse_action, row.split(","))) for row in ("0F0,0B0,0F1,0B1", "1F1,1B1,1F0,1B0")))
    dead.validate()  # complete and well placed: only running it shows the deadlock
    with pytest.raises(DeadlockError, match="rank 0 \\(compute\\) cannot run 0B0: it waits for 1B0 \\(rank 1\\)"):
        run_schedule(dead, tiny_model(), load_profile("h100-sxm"), ParallelConfig(), op_times=(1, 1, 1))



def test_the_issue_comparison_runs_all_five(tmp_path):
    out = tmp_path / "cmp.html"
    res = invoke("compare", "--model", "llama3-70b", "--hardware", "h100-sxm", "--pp", 8, "--tp", 8,
                 "--microbatches", 32, "--vp", 2, "--schedules", "1f1b,interleaved-1f1b,zb-h1,zb-h2,zbv",
                 "--json", "--out", out)
    assert res.exit_code == 0, res.output
    rows = {r["schedule"]: r for r in json.loads(res.stdout)}
    assert list(rows) == ["1f1b", "interleaved-1f1b", "zb-h1", "zb-h2", "zbv"]
    # in-flight chunk activations depend on the schedule only: p, 2(p-1)+(v-1)p+1, p, 2p-1, 2p
    assert {n: max(r["peak_inflight_microbatches"]) for n, r in rows.items()} == {
        "1f1b": 8, "interleaved-1f1b": 23, "zb-h1": 8, "zb-h2": 15, "zbv": 16}
    slowest = rows["1f1b"]["step_time_s"]
    assert all(r["step_time_s"] < slowest for n, r in rows.items() if n != "1f1b")
    assert rows["zb-h2"]["step_time_s"] < rows["zb-h1"]["step_time_s"]
    text = out.read_text()
    assert all(f"{n}: timeline" in text for n in rows)


def test_an_imported_file_never_takes_a_builtin_name(tmp_path):
    f = tmp_path / "1f1b.csv"
    res = invoke("export-schedule", "1f1b", "--pp", 2, "--microbatches", 4, "--out", f)
    assert res.exit_code == 0, res.output
    res = invoke("compare", "--schedule-file", f, "--schedules", "1f1b", *UNIT)
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    assert [r["schedule"] for r in rows] == ["1f1b", "1f1b.csv"]
    assert rows[0]["step_time_s"] == rows[1]["step_time_s"]  # the same order, told apart by name
