"""Hostile input (issue 15): every bad file, flag or number ends in one `error:` line and exit 2,
odd but legal settings in a warning, never a traceback, a NaN, a hang or a half-written file."""

from __future__ import annotations

import json
import re
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from simtrain import atomic
from simtrain.checks import MAX_TASKS, check_finite, estimate_tasks
from simtrain.cli import app
from simtrain.errors import SimtrainError
from simtrain.hardware import PROFILE_DIR, load_profile
from simtrain.loading import parse_yaml, read_text
from simtrain.models import load_model
from simtrain.parallel import ParallelConfig
from simtrain.schedules import generate

runner = CliRunner()
H100 = (PROFILE_DIR / "h100-sxm.yaml").read_text()
SMALL = ["--model", "llama3-8b", "--pp", "4", "--microbatches", "8", "--seq-len", "2048"]


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def one_error(res, *needles: str) -> str:
    """The result is exit 2 with exactly one `error:` line holding every needle; returns it."""
    assert res.exit_code == 2, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    lines = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in res.output, res.stderr
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


# ----------------------------------------------------------------------------- files and YAML
def test_duplicate_key_is_refused():
    text = "name: m\nnum_layers: 80\nhidden_size: 8\nnum_layers: 2\n"
    with pytest.raises(SimtrainError, match=r"m.yaml: key 'num_layers' is given twice \(lines 2 and 4\)"):
        parse_yaml(text, "m.yaml")


def test_alias_bomb_is_refused_before_it_expands(tmp_path):
    levels = ['a: &a ["x","x","x","x","x","x","x","x","x"]']
    for prev, cur in zip("abcdefgh", "bcdefghi"):
        levels.append(f"{cur}: &{cur} [" + ",".join([f"*{prev}"] * 9) + "]")
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("\n".join(levels) + "\nname: *i\nnum_layers: 2\n")
    one_error(invoke("compare", "--model", bomb, "--hardware", "h100-sxm"), "bomb.yaml", "expands", "aliases")
    # a few aliases are fine
    assert parse_yaml("a: &x [1, 2]\nb: *x\n", "ok") == {"a": [1, 2], "b": [1, 2]}


def test_node_limit_holds_without_aliases_too():
    flat = "[" + "1, " * 20 + "1]"  # 22 nodes, no alias: counted by the tree walk
    with pytest.raises(SimtrainError, match="more than 10 values"):
        parse_yaml(flat, "m.yaml", max_nodes=10)
    assert parse_yaml(flat, "m.yaml", max_nodes=22) == [1] * 21
    with pytest.raises(SimtrainError, match="more than 21 values"):
        parse_yaml(flat, "m.yaml", max_nodes=21)
    comment = "# y = 2*x (an asterisk, no alias)\nb: [*x, {c: *x}]\n"  # shared nodes counted once per use
    assert parse_yaml("a: &x [1, 2]\n" + comment, "m.yaml", max_nodes=15)["b"] == [[1, 2], {"c": [1, 2]}]
    with pytest.raises(SimtrainError, match="more than 14 values"):
        parse_yaml("a: &x [1, 2]\n" + comment, "m.yaml", max_nodes=14)


@pytest.mark.parametrize("text", ["&a [*a]", "&a {k: [1, *a]}", "a: &b\n  c: *b\n"])
def test_a_recursive_alias_is_refused_not_expanded_forever(text):
    """A node inside itself expands without end: one error (it hung in the expansion count)."""
    with pytest.raises(SimtrainError, match="m.yaml: the YAML expands .* to more than 1,000,000 values"):
        parse_yaml(text, "m.yaml")


def test_libyaml_and_pyyaml_parsers_read_every_shipped_file_alike():
    from simtrain import loading

    if loading._FAST_LOADER is None:
        pytest.skip("PyYAML built without libyaml: only the pure-Python parser runs")
    root = Path(loading.__file__).resolve().parent.parent
    files = sorted({*root.glob("simtrain/**/*.yaml"), *root.glob("dashboards/*.yaml"), *root.glob("tests/**/*.yaml")})
    assert len(files) > 10
    for f in files:
        text = f.read_text()
        slow = loading._load(loading._UniqueKeyLoader, text, f.name, loading.MAX_YAML_NODES)
        fast = loading._load(loading._FAST_LOADER, text, f.name, loading.MAX_YAML_NODES)
        assert repr(fast) == repr(slow), f  # repr: floats, ints and key order too


@pytest.mark.parametrize("text, needle", [
    ("a: [1, 2\n", "m.yaml: malformed YAML at line 2, column 1: expected ',' or ']', but got '<stream end>'"),
    ("a: 1\n\tb: 2\n", "m.yaml: malformed YAML at line 2, column 1: found character '\\t' that cannot start any token"),
    ("[" * 1500 + "]" * 1500, "m.yaml: the YAML is nested too deeply"),  # beyond libyaml's 1,000 levels
])
def test_messages_are_pyyaml_s_whichever_parser_runs(text, needle):
    with pytest.raises(SimtrainError) as info:
        parse_yaml(text, "m.yaml")
    assert str(info.value) == needle


@pytest.mark.parametrize("kind", ["device", "fifo", "folder", "big"])
def test_files_that_are_not_files_are_refused_before_reading(tmp_path, kind):
    if kind == "device":
        path, needle = Path("/dev/zero"), "is a device"
    elif kind == "fifo":
        path, needle = tmp_path / "pipe.yaml", "is a FIFO"
        os.mkfifo(path)  # reading it would block forever
    elif kind == "folder":
        path, needle = tmp_path, "is a folder"
    else:
        path, needle = tmp_path / "big.yaml", "may be at most 16 MiB"
        with open(path, "wb") as f:
            f.truncate(17 * 2**20)  # sparse: nothing is written
    one_error(invoke("compare", "--model", path, "--hardware", "h100-sxm"), str(path), needle)


def test_read_text_bounds_the_read_too(tmp_path):
    f = tmp_path / "a.csv"
    f.write_text("x" * 100)
    with pytest.raises(SimtrainError, match="may be at most"):
        read_text(f, "a CSV", 50)


def test_csv_with_a_byte_order_mark_imports(tmp_path):
    plain = invoke("export-schedule", "zbv", "--pp", 2, "--microbatches", 4)
    assert plain.exit_code == 0
    bom = tmp_path / "excel.csv"
    bom.write_bytes(b"\xef\xbb\xbf" + plain.stdout.encode())
    res = invoke("compare", "--model", "llama3-8b", "--hardware", "h100-sxm", "--tp", 4, "--schedule-file", bom,
                 "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)[0]["schedule"] == "excel"


# ----------------------------------------------------------------------------- profile numbers
@pytest.mark.parametrize("edit, field, allowed", [
    ("compute:\n  layer_slowdown: {F: -1}\n", "compute.layer_slowdown.F' = -1", ">= 0.1 and <= 100"),
    ("compute:\n  layer_slowdown: {B: .nan}\n", "compute.layer_slowdown.B' = nan", ">= 0.1 and <= 100"),
    ("compute:\n  action_overhead_us: .inf\n", "compute.action_overhead_us' = inf", ">= 0 and <= 1e+06"),
    ("compute:\n  message_overhead_us: -3\n", "compute.message_overhead_us' = -3", ">= 0"),
    ("compute:\n  elementwise_gb_per_s: {norm: 0}\n", "compute.elementwise_gb_per_s.norm' = 0", ">= 1e-06"),
    ("compute:\n  optimizer_gb_per_s: .inf\n", "compute.optimizer_gb_per_s' = inf", ">= 1e-06"),
    ("compute:\n  linear_tflops: {bf16: [{tokens: 8, fan_in: 8, fan_out: 8, kind: F, tflops: .nan}]}\n",
     "compute.linear_tflops.bf16.0.tflops' = nan", ">= 1e-06 and <= 1e+06"),
    ("calibration: {speed_probe: {seconds: .nan}}\n", "calibration", "must be a finite number"),
    ("calibration: {speed_probe: {seconds: 0}}\n", "speed_probe.seconds = 0", "> 0"),
    ("overlap:\n  compute_factor: .inf\n", "overlap.compute_factor' = inf", ">= 0.5 and <= 2"),
])
def test_every_profile_section_is_range_checked(tmp_path, edit, field, allowed):
    bad = tmp_path / "bad.yaml"
    head = edit.split("\n")[0]  # a section the profile already has gets the bad field inside it
    bad.write_text(re.sub(f"^{re.escape(head)}\n", lambda _: edit, H100, count=1, flags=re.M)
                   if head in H100.splitlines() else H100 + edit)
    one_error(invoke("compare", *SMALL, "--hardware", bad, "--json"), "bad.yaml", field, allowed)


@pytest.mark.parametrize("old, new, field", [
    ("hbm_gib: 80", "hbm_gib: .inf", "hbm_gib' = inf"),
    ("  matmul: 0.75", "  matmul: 1.0e-12", "efficiency.matmul' = 1e-12"),
    ("  latency_us: 3", "  latency_us: .inf", "intra_node.latency_us' = inf"),
    ("  bandwidth_gb_per_s: 50", "  bandwidth_gb_per_s: .nan", "inter_node.bandwidth_gb_per_s' = nan"),
    ("bf16: 989.4", "bf16: -989.4", "peak_tflops.bf16' = -989.4"),
])
def test_datasheet_fields_are_range_checked(tmp_path, old, new, field):
    bad = tmp_path / "bad.yaml"
    assert old in H100
    bad.write_text(H100.replace(old, new, 1))
    one_error(invoke("compare", *SMALL, "--hardware", bad), "bad.yaml", field, "must be a finite number")


def test_results_are_checked_for_nan():
    with pytest.raises(SimtrainError, match=r"1f1b: the simulation produced bubble_ratio_per_rank\[1\] = nan"):
        check_finite({"step_time_s": 1.0, "bubble_ratio_per_rank": [0.1, float("nan")], "mfu": None}, "1f1b")
    check_finite({"step_time_s": 1.0, "mfu": None, "name": "x"}, "ok")


# ----------------------------------------------------------------------------- cheap checks first
def test_huge_pipeline_is_refused_before_generating(monkeypatch):
    import simtrain.scenario as scenario

    monkeypatch.setattr(scenario, "generate", lambda *a, **k: pytest.fail("generated a schedule"))
    one_error(invoke("compare", "--model", "llama3-405b", "--hardware", "h100-sxm", "--pp", 512,
                     "--microbatches", 100000), "512 pipeline stages for a model of 126 layers")
    one_error(invoke("compare", "--model", "llama3-405b", "--hardware", "h100-sxm", "--pp", 16,
                     "--microbatches", 100000, "--schedules", "1f1b"), "tasks, above the ceiling", "--max-tasks")


def test_export_is_refused_before_generating():
    one_error(invoke("export-schedule", "1f1b", "--pp", 512, "--microbatches", 100000),
              "about 102,400,000 tasks, above the ceiling of 2,000,000")
    one_error(invoke("export-schedule", "1f1b", "--pp", 4, "--microbatches", 8, "--vp", 2), "--vp 2", "1f1b")
    assert invoke("export-schedule", "1f1b", "--pp", 4, "--microbatches", 8, "--max-tasks", 64).exit_code == 0
    one_error(invoke("export-schedule", "1f1b", "--pp", 4, "--microbatches", 8, "--max-tasks", 63), "about 64")


def test_max_tasks_overrides_the_ceiling():
    args = ["compare", *SMALL, "--hardware", "h100-sxm", "--tp", 2, "--schedules", "1f1b", "--json"]
    one_error(invoke(*args, "--max-tasks", 10), "--max-tasks")
    assert invoke(*args).exit_code == 0


@pytest.mark.parametrize("name, kw", [
    ("1f1b", dict(pp=4, tp=2, dp=2, microbatches=8)),
    ("interleaved-1f1b", dict(pp=4, tp=2, dp=2, microbatches=8, vp=2)),
    ("zbv", dict(pp=4, tp=8, dp=2, microbatches=8)),
    ("dualpipev", dict(pp=4, tp=8, microbatches=8)),
])
def test_task_estimate_bounds_the_engine(name, kw):
    """The estimate is an upper bound of what the engine simulates, within a small factor."""
    from simtrain.scenario import run_schedule

    spec, par = load_model("llama3-8b"), ParallelConfig(seq_len=1024, **kw)
    tasks = len(run_schedule(name, spec, load_profile("h100-sxm"), par).result.trace)
    assert tasks <= estimate_tasks(name, spec, par) <= 6 * tasks


@pytest.mark.parametrize("layers", [3_000_000, 2**31 - 1])
def test_a_model_of_millions_of_layers_is_refused_before_its_costs(tmp_path, monkeypatch, layers):
    """A review: num_layers 3,000,000 (or 2^31 - 1, which the field allows) hung building every
    layer's costs before the static-memory check; now one error naming the field, CLI and API."""
    import simtrain
    import simtrain.scenario as scenario

    monkeypatch.setattr(scenario, "stage_costs", lambda *a, **k: pytest.fail("built the per-layer costs"))
    text = (Path(simtrain.__file__).parent / "model_presets" / "llama3-8b.yaml").read_text()
    (tmp_path / "m.yaml").write_text(text.replace("num_layers: 32", f"num_layers: {layers}"))
    one_error(invoke("compare", "--model", tmp_path / "m.yaml", "--hardware", "h100-sxm", "--json"),
              f"field 'num_layers' = {layers}", "above the ceiling of 2,000,000", "--max-tasks")
    with pytest.raises(SimtrainError, match=f"field 'num_layers' = {layers}: .*max_tasks="):
        simtrain.simulate(str(tmp_path / "m.yaml"), "h100-sxm")


@pytest.mark.parametrize("schedule", [[], ["--schedule", "1f1b"]])
def test_overlay_refuses_a_model_of_millions_of_layers_before_its_costs(tmp_path, monkeypatch, schedule):
    """A review: overlay ran without checks.check_structure, so a huge model was not refused early."""
    import simtrain
    import simtrain.scenario as scenario

    monkeypatch.setattr(scenario, "stage_costs", lambda *a, **k: pytest.fail("built the per-layer costs"))
    text = (Path(simtrain.__file__).parent / "model_presets" / "llama3-8b.yaml").read_text()
    (tmp_path / "m.yaml").write_text(text.replace("num_layers: 32", "num_layers: 3000000"))
    data = Path(__file__).parent / "data"
    args = ["overlay", "--measured", data / "torch_gpipe_rank0.json", "--measured", data / "torch_gpipe_rank1.json",
            "--model", tmp_path / "m.yaml", "--hardware", "h100-sxm", "--out", tmp_path / "o.html", *schedule]
    one_error(invoke(*args), "field 'num_layers' = 3000000", "above the ceiling of 2,000,000", "--max-tasks 3000000")
    args[args.index(tmp_path / "m.yaml")] = "llama3-8b"  # the ceiling is overlay's own --max-tasks
    one_error(invoke(*args, "--max-tasks", 10), "field 'num_layers' = 32", "above the ceiling of 10")


def test_ceiling_is_documented():
    assert f"{MAX_TASKS:,}" in (Path(__file__).parent.parent / "README.md").read_text()


# ----------------------------------------------------------------------------- atomic outputs
def test_failed_write_leaves_the_previous_file(tmp_path, monkeypatch):
    target = tmp_path / "out.html"
    target.write_text("previous")

    def full_disk(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(SimtrainError, match="No space left on device"):
        atomic.write_text(target, "new" * 1000, flag="--out")
    assert target.read_text() == "previous" and sorted(p.name for p in tmp_path.iterdir()) == ["out.html"]


def test_no_overwrite_is_atomic(tmp_path):
    target = tmp_path / "s.csv"
    atomic.write_text(target, "first", overwrite=False)
    with pytest.raises(SimtrainError, match="the file exists"):
        atomic.write_text(target, "second", overwrite=False, flag="--out")
    assert target.read_text() == "first" and len(list(tmp_path.iterdir())) == 1


def test_compare_checks_output_folders_before_simulating(tmp_path, monkeypatch):
    import simtrain.cli.compare as cli

    monkeypatch.setattr(cli, "run_schedule", lambda *a, **k: pytest.fail("simulated before checking --trace"))
    (tmp_path / "file").write_text("x")
    one_error(invoke("compare", *SMALL, "--hardware", "h100-sxm", "--trace", tmp_path / "file" / "t.json"),
              "--trace", "cannot write the file", "is not a folder")


def test_calibrate_out_unwritable_fails_before_measuring(tmp_path, monkeypatch):
    import simtrain.calibration.commands as commands

    monkeypatch.setattr(commands, "_run", lambda *a, **k: pytest.fail("measured before checking --out"))
    real = atomic._temp_in

    def read_only(folder, name, suffix):
        if Path(folder) == tmp_path / "ro":
            raise PermissionError(13, "Permission denied")
        return real(folder, name, suffix)

    monkeypatch.setattr(atomic, "_temp_in", read_only)
    (tmp_path / "ro").mkdir()
    one_error(invoke("calibrate", "--out", tmp_path / "ro" / "cpu.yaml"), "--out", "Permission denied")


def test_outputs_leave_no_temporary_files(tmp_path):
    res = invoke("compare", *SMALL, "--hardware", "h100-sxm", "--out", "a.html", "--trace", "a.json", "--csv", "a.csv")
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.csv", "a.html", "a.json"]
    json.loads((tmp_path / "a.json").read_text())


# ----------------------------------------------------------------------------- nothing ignored
@pytest.mark.parametrize("args, needles", [
    (["--vp", 2, "--schedules", "gpipe,1f1b"], ["--vp", "none of gpipe, 1f1b has virtual stages"]),
    (["--waves", 2, "--schedules", "1f1b"], ["--waves", "+waved-ep"]),
    (["--node-limit", 2], ["--node-limit", "llama3-8b has no experts"]),
    (["--expert-imbalance", 1.5], ["--expert-imbalance", "has no experts"]),
    (["--schedules", ""], ["--schedules: give at least one schedule name"]),
    (["--schedules", " , "], ["--schedules: give at least one schedule name"]),
])
def test_flags_that_cannot_apply_are_errors(args, needles):
    one_error(invoke("compare", *SMALL, "--hardware", "h100-sxm", *args), *needles)


def test_scenario_setting_that_does_not_apply_is_a_warning(tmp_path):
    sc = tmp_path / "s.yaml"
    sc.write_text("model: llama3-8b\nhardware: h100-sxm\nparallel: {pp: 4, vp: 2, microbatches: 8, seq_len: 2048}\n"
                  "schedules: [interleaved-1f1b, 1f1b]\n")
    assert invoke("compare", sc, "--json").exit_code == 0
    res = invoke("compare", sc, "--schedules", "1f1b", "--json")  # harmless: the file's vp is for the others
    assert res.exit_code == 0 and "field 'parallel.vp' = 2 is ignored" in res.stderr


@pytest.mark.parametrize("model, field, value, needle", [
    ("llama3-8b", "expert_gemm", "multi-stream", "llama3-8b has no experts"),
    ("llama3-8b", "bias_dropout_fusion", "false", "llama3-8b has no linear biases"),
    ("gpt3-175b", "rope_fusion", "false", "gpt3-175b has learned positions"),
])
def test_a_kernel_setting_the_model_has_no_kernel_for_is_a_warning(tmp_path, model, field, value, needle):
    """expert_gemm, rope_fusion and bias_dropout_fusion on a model without experts, rotary or
    biases change nothing: a scenario file's is named as ignored (review 8), and a model that has
    the kernel gets no warning."""
    sc = tmp_path / "s.yaml"
    sc.write_text(f"model: {model}\nhardware: h100-sxm\nparallel: {{tp: 8, pp: 8, microbatches: 8, {field}: {value}}}\n"
                  "schedules: [1f1b]\n")
    res = invoke("compare", sc, "--json")
    assert res.exit_code == 0 and f"field 'parallel.{field}' = " in res.stderr and f"is ignored: {needle}" in res.stderr
    fitting = "mixtral-8x7b" if field == "expert_gemm" else ("gpt3-175b" if field == "bias_dropout_fusion" else "llama3-8b")
    sc.write_text(sc.read_text().replace(f"model: {model}", f"model: {fitting}"))
    res = invoke("compare", sc, "--json")
    assert res.exit_code == 0 and f"field 'parallel.{field}'" not in res.stderr


@pytest.mark.parametrize("args, needle", [
    (["--model", "llama3-70b", "--tp", 16, "--pp", 8], "each TP group spans 2 nodes"),
    (["--model", "llama3-8b", "--tp", 16, "--pp", 2], "> the 8 KV heads of llama3-8b"),
    (["--model", "mixtral-8x7b", "--pp", 4, "--dp", 8, "--ep", 8, "--node-limit", 1000], "the limit never binds"),
])
def test_odd_but_legal_configurations_warn(args, needle):
    res = invoke("compare", *args, "--hardware", "h100-sxm", "--microbatches", 8, "--seq-len", 1024,
                 "--schedules", "1f1b", "--json")
    assert res.exit_code == 0, res.output
    assert any(line.startswith("warning:") and needle in line for line in res.stderr.splitlines()), res.stderr
    json.loads(res.stdout)


def test_overlay_without_a_model_is_an_error():
    data = Path(__file__).parent / "data"
    one_error(invoke("overlay", "--measured", data / "torch_gpipe_rank0.json", "--measured",
                     data / "torch_gpipe_rank1.json"), "overlay: give the model and hardware")


# ----------------------------------------------------------------------------- one error format
@pytest.mark.parametrize("args, needle", [
    (["compare", "--pp", "abc"], "Invalid value for '--pp'"),
    (["compare", "--no-such-flag"], "No such option: --no-such-flag"),
    (["export-schedule", "1f1b"], "Missing option '--pp'"),
    (["no-such-command"], "No such command 'no-such-command'"),
])
def test_usage_errors_are_one_line(args, needle):
    line = one_error(runner.invoke(app, args), needle)
    assert "╭" not in runner.invoke(app, args).output and line.startswith("error: ")


# ----------------------------------------------------------------------------- validation can fail
def test_validate_refuses_a_profile_not_calibrated_here():
    pytest.importorskip("torch")
    one_error(invoke("validate", "--profile", "h100-sxm", "--world", 2, "--schedules", "gpipe,1f1b"),
              "cannot correct for this machine's speed", "no calibration: section", "--no-speed-correction")


def test_speed_reference_only_accepts_this_machine(tmp_path):
    from dataclasses import asdict, replace

    from simtrain.calibration.predict import speed_reference
    from simtrain.calibration.workload import default_model

    model = asdict(default_model(2, "cpu", quick=False))
    hw = replace(load_profile("h100-sxm"), calibration=dict(
        device_name="CPU A", backend="gloo", speed_probe=dict(seconds=0.02, model=dict(model, layers=16))))
    assert speed_reference(hw, "cpu", "CPU A", model) == 0.02  # another world size: same probe shapes
    with pytest.raises(SimtrainError, match="calibrated on CPU A .gloo. and this machine is CPU B"):
        speed_reference(hw, "cpu", "CPU B", model)
    with pytest.raises(SimtrainError, match="other shapes"):
        speed_reference(hw, "cpu", "CPU A", dict(model, hidden=512))
    with pytest.raises(SimtrainError, match="no speed_probe"):
        speed_reference(replace(hw, calibration=dict(device_name="CPU A", backend="gloo")), "cpu", "CPU A", model)


def test_generators_unchanged_by_checks():
    """The export check refuses nothing a small schedule needs."""
    res = invoke("export-schedule", "interleaved-1f1b", "--pp", 4, "--microbatches", 8, "--vp", 2)
    assert res.exit_code == 0
    assert len(res.stdout.splitlines()) == generate("interleaved-1f1b", 4, 8, 2).num_ranks


def test_imported_schedule_is_sized_too(tmp_path):
    csv = tmp_path / "big.csv"
    res = invoke("export-schedule", "1f1b", "--pp", 4, "--microbatches", 64, "--out", csv)
    assert res.exit_code == 0
    one_error(invoke("compare", "--model", "llama3-8b", "--hardware", "h100-sxm", "--tp", 4, "--schedule-file", csv,
                     "--max-tasks", 1000), "--schedule-file", "512 actions", "--max-tasks 1536")


@pytest.mark.parametrize("text, needle", [
    ("", "the file is empty"),
    ("[" * 100000 + "]" * 100000, "nested too deeply"),
    ("- 1\n- 2\n", "expected a mapping of fields, got list"),
])
def test_degenerate_yaml(tmp_path, text, needle):
    f = tmp_path / "m.yaml"
    f.write_text(text)
    one_error(invoke("compare", "--model", f, "--hardware", "h100-sxm"), "m.yaml", needle)


def test_op_times_are_bounded():
    one_error(invoke("compare", *SMALL, "--hardware", "h100-sxm", "--op-times", "1e308,1,1"),
              "--op-times", "from 0 to 1e+06 seconds")


# ----------------------------------------------------------------------------- huge worlds
def test_a_world_beyond_the_simulated_maximum_is_one_error_and_a_large_one_runs():
    """A hundred million GPUs is refused at once (no hang); a million-way DP group is placed by
    numpy in well under the task ceiling's time (the placement had been quadratic in the group)."""
    one_error(invoke("compare", "--model", "llama3-8b", "--hardware", "h100-sxm", "--tp", "8", "--dp", 100_000_000, "--schedules", "1f1b",
                     "--json"), "tp x cp x pp x dp = 800,000,000 GPUs", "16,777,216")
    one_error(invoke("plan", "--model", "llama3-8b", "--hardware", "h100-sxm", "--gpus", 1_000_000_000,
                     "--global-batch", 8), "--gpus", "16777216")
    res = invoke("compare", "--model", "llama3-8b", "--hardware", "h100-sxm", "--tp", "8", "--dp", 1_000_000,
                 "--schedules", "1f1b", "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)[0]["step_time_s"] > 0


def test_divisors_are_every_divisor_in_order():
    from simtrain.plan_bounds import divisors
    for n in (1, 2, 12, 36, 97, 360, 1024):
        assert divisors(n) == [d for d in range(1, n + 1) if n % d == 0]
    assert len(divisors(10**9)) == 100


def test_the_cluster_node_count_bounds_compare_and_the_api_as_collective(tmp_path):
    """A review: a profile with inter_node.nodes 1 refused `collective --gpus 32` but `compare --tp 8
    --dp 4` ran on 4 nodes; now the same check (HardwareProfile.check_nodes) refuses both."""
    import simtrain

    text = H100.replace("name: h100-sxm", "name: one-node").replace("  nics_per_node: 8", "  nics_per_node: 8\n  nodes: 1")
    assert "nodes: 1" in text
    (tmp_path / "one.yaml").write_text(text)
    args = ["compare", "--model", "llama3-8b", "--hardware", tmp_path / "one.yaml", "--seq-len", 1024, "--tp", 8,
            "--schedules", "1f1b", "--json"]
    one_error(invoke(*args, "--dp", 4), "tp x cp x pp x dp = 32 GPUs: needs 4 nodes of 8 GPUs", "has 1 nodes")
    one_error(invoke("collective", "all-reduce", "--hardware", tmp_path / "one.yaml", "--gpus", 32),
              "--gpus = 32: needs 4 nodes of 8 GPUs", "has 1 nodes (inter_node.nodes)")
    assert invoke(*args).exit_code == 0  # 8 GPUs: one node
    with pytest.raises(SimtrainError, match="needs 4 nodes of 8 GPUs, but 'one-node' has 1 nodes"):
        simtrain.simulate("llama3-8b", str(tmp_path / "one.yaml"), tp=8, dp=4, seq_len=1024)
