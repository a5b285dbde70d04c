"""`simtrain calibrate --nccl-tests`: parse nccl-tests output, fit the link efficiencies, round-trip
the fixtures generated from a known profile, reject bad logs with one error line."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from simtrain.cli import app
from simtrain.errors import SimtrainError
from simtrain.hardware import load_profile
from simtrain.nccl_tests import fit_profile, format_log, parse_log

runner = CliRunner()
FIXTURES = Path(__file__).parent / "data" / "nccl_tests"
LOGS = sorted(FIXTURES.glob("*_perf_*.txt"))
KNOWN = FIXTURES / "known-h100.yaml"  # NVLink efficiency 0.79, NIC efficiency 0.91


def test_fixtures_are_what_the_writer_makes_from_the_known_profile(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("make_fixtures", FIXTURES / "make_fixtures.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setattr(mod, "HERE", tmp_path)
    (tmp_path / "known-h100.yaml").write_text(KNOWN.read_text())
    mod.main()
    assert len(LOGS) == len(mod.CASES) == 6
    for log in LOGS:
        assert (tmp_path / log.name).read_text() == log.read_text()


def test_parse_reads_op_group_and_both_columns():
    log = parse_log(FIXTURES / "all_reduce_perf_16gpus_4nodes.txt")
    assert (log.op, log.gpus, log.per_node, log.nodes) == ("all-reduce", 16, 4, 4)
    assert [r.nbytes for r in log.rows] == [2**20 * 2**i for i in range(14)]
    assert all(r.times_s[0] > 0 and r.times_s[1] > 0 for r in log.rows)
    assert {parse_log(p).op for p in LOGS} == {"all-reduce", "all-gather", "reduce-scatter", "all-to-all", "p2p"}


def test_round_trip_fits_the_known_profile_back_within_2_percent():
    base = load_profile("h100-sxm")  # starts from 0.824 / 0.94
    fitted, record = fit_profile(base, [parse_log(p) for p in LOGS])
    assert fitted.intra_node.collective_efficiency == pytest.approx(0.79, rel=0.02)
    assert fitted.inter_node.collective_efficiency == pytest.approx(0.91, rel=0.02)
    assert base.inter_node.alltoall_efficiency is not None  # the shipped 4-node DGX H100 figure ...
    assert fitted.inter_node.alltoall_efficiency is None  # ... gives way to the fitted NIC (alltoall log)
    assert record["intra_node_rows"] > 10 and record["inter_node_rows"] > 10
    big = [r for r in record["residuals"] if r["bytes"] >= 2**26]
    assert max(abs(r["error"]) for r in big) < 0.02


def test_calibrate_cli_writes_a_new_profile_with_a_calibration_record(tmp_path):
    out = tmp_path / "fitted.yaml"
    res = runner.invoke(app, ["calibrate", "--nccl-tests", *map(str, LOGS), "--base", "h100-sxm", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "nccl-tests fit" in res.stdout and "8589934592" in res.stdout  # residuals per size
    hw = load_profile(out)
    assert hw.name == "fitted" and hw.intra_node.collective_efficiency == pytest.approx(0.79, rel=0.02)
    assert hw.inter_node.alltoall_efficiency is None  # the written profile prices all-to-all at the fitted NIC
    rec = yaml.safe_load(out.read_text())["calibration"]
    assert rec["method"] == "nccl-tests" and len(rec["files"]) == 6 and rec["residuals"]
    again = runner.invoke(app, ["calibrate", "--nccl-tests", str(LOGS[0]), "--base", "h100-sxm", "--out", str(out)])
    assert again.exit_code == 2 and again.stderr.startswith("error: --out") and "exists" in again.stderr


def _broken(tmp_path, name: str, edit) -> Path:
    text = (FIXTURES / "all_reduce_perf_8gpus_1nodes.txt").read_text()
    path = tmp_path / name
    path.write_text(edit(text))
    return path


@pytest.mark.parametrize("name,edit,match", [
    ("truncated_all_reduce_perf.txt", lambda t: t[: t.index("  536870912")], "truncated"),
    ("garbage_all_reduce_perf.txt", lambda t: t.replace("  268435456 ", "  268435456 xx ", 1), "malformed result row"),
    ("wrong_all_reduce_perf.txt", lambda t: t.replace("      0\n", "      3\n", 1), "wrong results"),
    ("norank_all_reduce_perf.txt", lambda t: "\n".join(l for l in t.splitlines() if "Rank" not in l), "no '#  Rank"),
    ("unknown.txt", lambda t: t.replace("# Collective test starting: all_reduce_perf", "#"), "cannot tell which test"),
])
def test_bad_logs_are_one_error_line_exit_2(tmp_path, name, edit, match):
    path = _broken(tmp_path, name, edit)
    with pytest.raises(SimtrainError, match=match):
        parse_log(path)
    res = runner.invoke(app, ["calibrate", "--nccl-tests", str(path), "--base", "h100-sxm",
                              "--out", str(tmp_path / "x.yaml")])
    assert res.exit_code == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and match in lines[0]
    assert not (tmp_path / "x.yaml").exists()


def test_a_log_whose_group_does_not_fit_the_base_is_an_error(tmp_path):
    hw = load_profile(KNOWN)
    path = tmp_path / "all_reduce_perf_16.txt"
    path.write_text(format_log("all-reduce", hw, 16, 8, [2**20, 2**30]))
    res = runner.invoke(app, ["calibrate", "--nccl-tests", str(path), "--base", "mi300x", "--out",
                              str(tmp_path / "x.yaml")])
    assert res.exit_code == 0, res.output  # mi300x also has 8 GPUs per node
    small = tmp_path / "four.yaml"
    small.write_text(KNOWN.read_text().replace("gpus_per_node: 8", "gpus_per_node: 4"))
    res = runner.invoke(app, ["calibrate", "--nccl-tests", str(path), "--base", str(small), "--out",
                              str(tmp_path / "y.yaml")])
    assert res.exit_code == 2 and "--gpus-per-node = 8: must be 1 to 4" in res.stderr


def test_calibrate_nccl_tests_needs_base(tmp_path):
    res = runner.invoke(app, ["calibrate", "--nccl-tests", str(LOGS[0]), "--out", str(tmp_path / "x.yaml")])
    assert res.exit_code == 2 and res.stderr.startswith("error: --nccl-tests: --base")
