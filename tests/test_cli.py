"""The CLI as a user meets it: JSON rows, tables, and one clear error (exit 2) per bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import SMALL, invoke


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    """Run every CLI test in a fresh folder, so default outputs never land in the repository."""
    monkeypatch.chdir(tmp_path)



def test_compare_json_rows_have_the_documented_keys(tmp_path):
    res = invoke("compare", *SMALL, "--json")
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    assert [r["schedule"] for r in rows] == ["gpipe", "1f1b"]
    for r in rows:
        for key in ("step_time_s", "bubble_ratio", "exposed_comm_s", "overlap_ratio", "peak_memory_bytes",
                    "peak_inflight_microbatches", "fits_in_hbm", "mfu", "tokens_per_s", "span_bubble_ratio"):
            assert key in r
        assert len(r["peak_memory_bytes"]) == 4 and 0 < r["mfu"] < 1 and 0 <= r["bubble_ratio"] < 1
    assert rows[0]["peak_inflight_microbatches"] == [8, 8, 8, 8]
    assert rows[1]["peak_inflight_microbatches"] == [4, 3, 2, 1]


def test_compare_writes_html_and_prints_a_table(tmp_path):
    out = tmp_path / "cmp.html"
    res = invoke("compare", *SMALL, "--out", str(out))
    assert res.exit_code == 0, res.output
    assert "1f1b" in res.stdout and str(out) in res.stdout.replace("\n", "")
    text = out.read_text()
    assert "plotly" in text and "gpipe: timeline" in text and "1f1b: memory per rank" in text


def test_op_times_no_comm_gives_the_formula():
    res = invoke("compare", *SMALL, "--op-times", "1,1,1", "--no-comm", "--json")
    rows = json.loads(res.stdout)
    for r in rows:
        assert r["step_time_s"] == pytest.approx((8 + 3) * 3)
        assert r["bubble_ratio"] == pytest.approx(3 / 11)
        assert r["mfu"] is None  # fixed op-times: MFU is meaningless


def test_scenario_file_and_flag_override(tmp_path):
    sc = tmp_path / "s.yaml"
    sc.write_text("model: llama3-8b\nhardware: a100-sxm-80gb\nparallel: {pp: 2, microbatches: 4, seq_len: 1024}\n"
                  "schedules: [1f1b]\nout: s.html\n")
    res = invoke("compare", str(sc), "--microbatches", "6", "--json")
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    assert len(rows) == 1 and rows[0]["peak_inflight_microbatches"] == [2, 1]
    assert rows[0]["tokens_per_s"] * rows[0]["step_time_s"] == pytest.approx(6 * 1024)


@pytest.mark.parametrize("args,message", [
    (["--model", "gpt5", "--hardware", "h100-sxm"], "unknown model 'gpt5'"),
    (["--model", "llama3-8b", "--hardware", "tpu"], "unknown hardware 'tpu'"),
    (["--model", "llama3-8b", "--hardware", "missing.yaml"], "missing.yaml: hardware profile file not found"),
    (["--model", "llama3-8b", "--hardware", "h100-sxm", "--pp", "0"], "--pp = 0: Input should be greater than or equal to 1"),
    (["--model", "llama3-8b", "--hardware", "h100-sxm", "--microbatches", "0"], "--microbatches = 0"),
    (["--model", "llama3-8b", "--hardware", "h100-sxm", "--schedules", "gpipe,zz"], "unknown schedule 'zz'"),
    (["--model", "llama3-8b", "--hardware", "h100-sxm", "--pp", "40"], "40 pipeline stages for a model of 32 layers"),
    (["--model", "gpt3-175b", "--hardware", "a100-sxm-80gb"], "does not fit in HBM: pipeline rank 0 needs 2601.8 GiB"),
    (["--model", "llama3-8b", "--hardware", "h100-sxm", "--op-times", "1,x,1"], "--op-times = '1,x,1'"),
    (["--model", "llama3-8b", "--hardware", "h100-sxm", "--dtype", "int4"], "--dtype = 'int4'"),
    (["--model", "llama3-8b"], "give both --model and --hardware"),
    (["--model", "llama3-70b", "--hardware", "h100-sxm", "--tp", "8", "--pp", "2", "--microbatches", "64",
      "--recompute", "none"], "no schedule fits in HBM"),
])
def test_bad_input_one_clear_error(args, message):
    res = invoke("compare", *args)
    assert res.exit_code == 2
    assert message in res.stderr.replace("\n", " ")
    assert "Traceback" not in res.output


def test_bad_scenario_files(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: llama3-8b\nhardware: h100-sxm\nschedules: [1f1b]\nparallel: {pp: -1}\n")
    res = invoke("compare", str(bad))
    assert res.exit_code == 2 and "bad.yaml: field 'parallel.pp' = -1: Input should be greater than or equal to 1" in res.stderr
    bad.write_text("model: [llama\n")
    res = invoke("compare", str(bad))
    assert res.exit_code == 2 and "malformed YAML" in res.stderr
    res = invoke("compare", str(tmp_path / "none.yaml"))
    assert res.exit_code == 2 and "none.yaml: file not found" in res.stderr


def test_listing_commands():
    res = invoke("profiles")
    assert res.exit_code == 0 and "h800" in res.stdout and "mi300x" in res.stdout
    res = invoke("models")
    assert res.exit_code == 0 and "deepseek-v3" in res.stdout and "671.03B" in res.stdout


# ----------------------------------------------------------------------------- outputs and edge input
def test_outputs_never_overwrite_inputs_or_user_files(tmp_path):
    sc = tmp_path / "s.yaml"
    sc.write_text("model: llama3-8b\nhardware: h100-sxm\nparallel: {pp: 2, microbatches: 4, seq_len: 1024}\n")
    res = invoke("compare", str(sc), "--out", str(sc))
    assert res.exit_code == 2 and "expected a .html file name" in res.stderr
    mine = tmp_path / "keep.html"
    mine.write_text("<html>my notes</html>")
    res = invoke("compare", str(sc), "--out", str(mine))
    assert res.exit_code == 2 and "the file exists and was not written by simtrain" in res.stderr.replace("\n", " ")
    assert mine.read_text() == "<html>my notes</html>"
    assert invoke("compare", str(sc), "--out", str(mine), "--force").exit_code == 0
    assert invoke("compare", str(sc), "--out", str(mine)).exit_code == 0  # now simtrain's own output
    csv = tmp_path / "order.csv"
    csv.write_text("0F0,0B0\n1F0,1B0\n")
    res = invoke("compare", "--model", "llama3-8b", "--hardware", "h100-sxm", "--seq-len", "1024",
                 "--schedule-file", str(csv), "--csv", str(csv), "--json")
    assert res.exit_code == 2 and "is an input of this command" in res.stderr
    assert csv.read_text() == "0F0,0B0\n1F0,1B0\n"


def test_unwritable_output_is_one_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    res = invoke("compare", *SMALL, "--out", str(blocker / "x.html"))
    assert res.exit_code == 2 and "cannot write the file" in res.stderr and "Traceback" not in res.output


def test_json_still_fails_when_nothing_fits():
    res = invoke("compare", "--model", "llama3-70b", "--hardware", "h100-sxm", "--pp", "8", "--tp", "8",
                 "--dp", "4", "--microbatches", "32", "--schedules", "gpipe", "--json")
    assert res.exit_code == 2
    assert json.loads(res.stdout)[0]["fits_in_hbm"] is False  # the rows are still printed
    assert "gpipe does not fit in HBM" in res.stderr and "no schedule fits" in res.stderr


def test_schedule_file_and_sweep_do_not_combine(tmp_path):
    csv = tmp_path / "o.csv"
    csv.write_text("0F0,0B0\n1F0,1B0\n")
    res = invoke("compare", "--model", "llama3-8b", "--hardware", "h100-sxm", "--schedule-file", str(csv),
                 "--sweep", "microbatches=4,8", "--json")
    assert res.exit_code == 2 and "--sweep cannot be combined with --schedule-file" in res.stderr


def test_sweep_given_twice_is_a_usage_error():
    """A review: the second --sweep silently replaced the first; a scenario's two-field sweep is refused."""
    res = invoke("compare", "--model", "llama3-8b", "--hardware", "h100-sxm", "--pp", "2", "--sweep", "microbatches=4",
                 "--sweep", "pp=2", "--json")
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert res.exit_code == 2 and len(errors) == 1 and res.stdout == "", res.output
    assert "--sweep is given 2 times (microbatches=4, pp=2): a run sweeps one setting" in errors[0]


@pytest.mark.parametrize("text", ["nan,1,1", "inf,1,1", "1,-1,1", "0,0,0"])
def test_op_times_must_be_finite_and_non_negative(text):
    res = invoke("compare", *SMALL, "--op-times", text, "--json")
    assert res.exit_code == 2 and f"--op-times = '{text}'" in res.stderr


def test_scenario_field_errors_name_the_file(tmp_path):
    sc = tmp_path / "s.yaml"
    sc.write_text("model: llama3-8b\nhardware: h100-sxm\nop_times: [1, -1, 1]\n")
    res = invoke("compare", str(sc), "--json")
    assert res.exit_code == 2 and "s.yaml: field 'op_times' = [1, -1, 1]" in res.stderr.replace("\n", " ")
    sc.write_text("model: llama3-8b\nhardware: h100-sxm\nparallel: {microbatches: true}\n")
    res = invoke("compare", str(sc), "--json")
    assert res.exit_code == 2 and "field 'parallel.microbatches' = True: expected a number, not true/false" in res.stderr
    sc.write_text("model: llama3-8b\nhardware: h100-sxm\nparallel: {pp: 2, seq_len: 1024}\n")  # no schedules listed
    res = invoke("compare", str(sc), "--schedules", "1f1b", "--json")
    assert res.exit_code == 0 and [r["schedule"] for r in json.loads(res.stdout)] == ["1f1b"]


def test_expert_parallel_errors_name_the_scenario_field_or_the_flag(tmp_path):
    """A review: an ep set in a scenario file was reported as `--ep 4`, a flag nobody typed."""
    sc = tmp_path / "s_ep4.yaml"
    sc.write_text("model: mixtral-8x7b\nhardware: h100-sxm\nschedules: [1f1b]\n"
                  "parallel: {tp: 2, dp: 3, ep: 4, pp: 2, microbatches: 4, seq_len: 1024}\n")
    res = invoke("compare", str(sc), "--json")
    assert res.exit_code == 2 and "error: " + str(sc) + ": field 'parallel.ep' = 4: must divide dp x tp = 3 x 2 = 6" \
        in res.stderr.replace("\n", " "), res.stderr
    res = invoke("compare", str(sc), "--ep", "4", "--json")  # typed: the flag, as before
    assert res.exit_code == 2 and "error: --ep 4: must divide dp x tp = 3 x 2 = 6" in res.stderr, res.stderr
    sc.write_text("model: mixtral-8x7b\nhardware: h100-sxm\nschedules: [1f1b]\n"
                  "parallel: {dp: 8, ep: 8, pp: 2, microbatches: 4, seq_len: 1024, expert_imbalance: 9}\n")
    res = invoke("compare", str(sc), "--json")
    assert res.exit_code == 2 and "field 'parallel.expert_imbalance' = 9.0: at most ep = 8" in res.stderr, res.stderr


def _one_error(res, needle: str) -> None:
    """Exit 2 with exactly one `error:` line, holding ``needle`` (the line may wrap on stderr)."""
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert res.exit_code == 2 and len(lines) == 1, res.stderr
    assert needle in res.stderr.replace("\n", " "), res.stderr


@pytest.mark.parametrize("fields, flags, field_msg, flag_msg", [
    ("tp: 3", ["--tp", "3"], "field 'parallel.tp' = 3: must divide the model's 32 attention heads",
     "--tp 3: must divide the model's 32 attention heads"),
    ("cp: 3", ["--cp", "3"], "field 'parallel.cp' = 3: 2 x cp = 6 must divide the sequence length 1024",
     "--cp 3: 2 x cp = 6 must divide the sequence length 1024"),
    ("cp: 4, tp: 4, cp_kind: ulysses", ["--cp", "4", "--tp", "4", "--cp-kind", "ulysses"],
     "field 'parallel.cp' = 4 with {sc}: field 'parallel.cp_kind' = 'ulysses': tp x cp = 16 must divide",
     "--cp 4 with --cp-kind ulysses: tp x cp = 16 must divide"),
    ("trainable: 'frozen-layers:40'", ["--trainable", "frozen-layers:40"],
     "field 'parallel.trainable' = 'frozen-layers:40': layer 40 does not exist",
     "--trainable frozen-layers:40: layer 40 does not exist"),
])
def test_stage_setting_errors_name_the_scenario_field_or_the_flag(tmp_path, fields, flags, field_msg, flag_msg):
    """tp over the heads, CP and --trainable set in a scenario file were reported as flags nobody typed."""
    sc = tmp_path / "s_stage.yaml"
    sc.write_text(f"model: llama3-8b\nhardware: h100-sxm\nschedules: [1f1b]\n"
                  f"parallel: {{{fields}, pp: 2, microbatches: 4, seq_len: 1024}}\n")
    _one_error(invoke("compare", str(sc), "--json"), f"error: {sc}: " + field_msg.format(sc=sc))
    _one_error(invoke("compare", str(sc), *flags, "--json"), "error: " + flag_msg)  # typed: the flag, as before


def test_waves_error_names_the_scenario_field_or_the_flag(tmp_path):
    """--waves (and the ep it needs) set in a scenario file were reported as flags nobody typed."""
    sc = tmp_path / "s_waves.yaml"
    sc.write_text("model: mixtral-8x7b\nhardware: h100-sxm\nschedules: [1f1b+waved-ep]\n"
                  "parallel: {dp: 8, ep: 8, pp: 2, microbatches: 4, seq_len: 1024, waves: 2}\n")
    _one_error(invoke("compare", str(sc), "--json"),
               f"error: {sc}: field 'parallel.waves' = 2: waves partition each rank's 1 local experts")
    _one_error(invoke("compare", str(sc), "--waves", "2", "--json"),  # typed: the flag, as before
               "error: --waves 2: waves partition each rank's 1 local experts")
    sc.write_text("model: mixtral-8x7b\nhardware: h100-sxm\nschedules: [1f1b+waved-ep]\n"
                  "parallel: {dp: 8, ep: 1, pp: 2, microbatches: 4, seq_len: 1024}\n")
    _one_error(invoke("compare", str(sc), "--json"), f"got model 'mixtral-8x7b' with {sc}: field 'parallel.ep' = 1")
    _one_error(invoke("compare", str(sc), "--ep", "1", "--json"), "got model 'mixtral-8x7b' with --ep 1")


def test_tp_warnings_name_the_scenario_field_or_the_flag(tmp_path):
    """A TP group over nodes set in a scenario file was reported as `--tp 16`, a flag nobody typed."""
    sc = tmp_path / "s_tp16.yaml"
    sc.write_text("model: llama3-8b\nhardware: h100-sxm\nschedules: [1f1b]\n"
                  "parallel: {tp: 16, pp: 2, microbatches: 4, seq_len: 1024}\n")
    res = invoke("compare", str(sc), "--json")
    text = res.stderr.replace("\n", " ")
    assert res.exit_code == 0 and f"warning: {sc}: field 'parallel.tp' = 16 > 8 GPUs per node of h100-sxm" in text, text
    assert f"warning: {sc}: field 'parallel.tp' = 16 > the 8 KV heads" in text and "--tp 16" not in text, text
    res = invoke("compare", str(sc), "--tp", "16", "--json")  # typed: the flag, as before
    assert res.exit_code == 0 and "warning: --tp 16 > 8 GPUs per node of h100-sxm" in res.stderr.replace("\n", " ")


def test_schedule_constraints_name_the_scenario_field_or_the_flag(tmp_path):
    """A review: `dualpipev: --microbatches = 2 with --pp 4` named flags nobody typed when both
    came from the scenario file; the zbv warning too."""
    sc = tmp_path / "s_dpv.yaml"
    sc.write_text("model: llama3-8b\nhardware: h100-sxm\nschedules: [dualpipev]\n"
                  "parallel: {pp: 4, microbatches: 2, seq_len: 1024}\n")
    _one_error(invoke("compare", str(sc), "--json"), f"error: dualpipev: {sc}: field 'parallel.microbatches' = 2 "
               f"with {sc}: field 'parallel.pp' = 4: DualPipeV needs at least as many microbatches as stages")
    _one_error(invoke("compare", str(sc), "--microbatches", "2", "--json"),  # one typed, one from the file
               f"error: dualpipev: --microbatches = 2 with {sc}: field 'parallel.pp' = 4: ")
    _one_error(invoke("compare", str(sc), "--microbatches", "2", "--pp", "4", "--json"),  # typed: as before
               "error: dualpipev: --microbatches = 2 with --pp 4: DualPipeV needs")
    sc.write_text("model: llama3-8b\nhardware: h100-sxm\nschedules: [zbv]\n"
                  "parallel: {pp: 4, microbatches: 4, seq_len: 1024}\n")
    res = invoke("compare", str(sc), "--json")
    text = res.stderr.replace("\n", " ")
    assert res.exit_code == 0 and f"warning: zbv: {sc}: field 'parallel.microbatches' = 4 with {sc}: field " \
        "'parallel.pp' = 4: ZB-V fills its pipeline only with m >= 2 x pp - 1 = 7" in text and "--pp" not in text, text
    res = invoke("compare", str(sc), "--pp", "4", "--microbatches", "4", "--json")
    assert res.exit_code == 0 and "warning: zbv: --microbatches = 4 with --pp 4: ZB-V" in res.stderr, res.stderr


def test_sweep_error_rows_name_the_scenario_field_and_the_swept_flag(tmp_path):
    """A sweep point a schedule refuses keeps its row's error; pp from the scenario file is named
    as its field there, the swept microbatches as the sweep's flag (review 8: the row said --pp 4)."""
    sc = tmp_path / "s_dpv.yaml"
    sc.write_text("model: llama3-8b\nhardware: h100-sxm\nschedules: [dualpipev]\n"
                  "parallel: {pp: 4, microbatches: 8, seq_len: 1024}\n")
    res = invoke("compare", str(sc), "--sweep", "microbatches=2,8", "--json")
    assert res.exit_code == 0, res.stderr
    errors = [row["error_message"] for row in json.loads(res.stdout)["sweep"]]
    assert errors[1] is None and errors[0].startswith(
        f"dualpipev: --microbatches = 2 with {sc}: field 'parallel.pp' = 4: DualPipeV needs"), errors
    res = invoke("compare", str(sc), "--pp", "4", "--sweep", "microbatches=2,8", "--json")  # typed: the flag
    assert json.loads(res.stdout)["sweep"][0]["error_message"].startswith("dualpipev: --microbatches = 2 with --pp 4:")


def test_binary_file_given_as_yaml(tmp_path):
    png = tmp_path / "p.yaml"
    png.write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff\xfe")
    res = invoke("compare", "--model", "llama3-8b", "--hardware", str(png))
    assert res.exit_code == 2 and "not a text (UTF-8) YAML file" in res.stderr


def test_cross_field_errors_stay_short(tmp_path):
    m = tmp_path / "m.yaml"
    m.write_text("name: x\nnum_layers: 2\nhidden_size: 64\nffn_hidden_size: 64\nnum_heads: 30\nnum_kv_heads: 8\n"
                 "vocab_size: 10\nseq_len: 8\n")
    res = invoke("compare", "--model", str(m), "--hardware", "h100-sxm")
    assert res.exit_code == 2
    assert res.stderr.strip() == f"error: {m}: num_kv_heads (8) must divide num_heads (30)"


def test_memory_hint_only_suggests_what_applies():
    res = invoke("compare", "--model", "llama3-70b", "--hardware", "h100-sxm", "--pp", "2")
    assert res.exit_code == 2 and "raise the TP or PP degree (--tp 1, --pp 2)" in res.stderr and "zero-stage" not in res.stderr
    res = invoke("compare", "--model", "llama3-70b", "--hardware", "h100-sxm", "--pp", "2", "--dp", "8")
    assert res.exit_code == 2 and "or use --zero-stage 1" in res.stderr.replace("\n", " ")


def test_compare_json_imports_neither_plotly_nor_pandas():
    """Start-up: ``compare --json`` needs no dashboard and no tables, so it loads neither library."""
    code = ("import sys\nfrom simtrain.cli import main\nsys.argv = ['simtrain', 'compare', *sys.argv[1:]]\n"
            "try:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'plotly', 'pandas', 'torch', 'rich'}),"
            " sorted(m for m in sys.modules if m.startswith(('simtrain.plan', 'simtrain.calibration',"
            " 'simtrain.cli.commands'))))")
    proc = subprocess.run([sys.executable, "-c", code, *SMALL, "--json"], capture_output=True, text=True, check=True)
    rows, loaded = proc.stdout.rsplit("\n", 2)[:2]
    assert json.loads(rows)[0]["step_time_s"] > 0
    assert loaded == "[] []"  # nor rich, nor the other commands' modules


def test_main_knows_which_module_registers_each_command():
    """``main`` imports only the named command's module; the map covers the full app exactly."""
    import typer.main

    import simtrain.cli as cli

    assert set(typer.main.get_command(cli.app).commands) == set(cli.COMMAND_MODULE)
    assert set(cli.COMMAND_MODULE.values()) == set(cli.MODULES)
