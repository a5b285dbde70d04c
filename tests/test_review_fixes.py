"""Findings of a fresh-eyes review of bad input: each ends in one ``error:`` line naming the file
or flag, the field, the value and what is allowed (exit 2), never a silently wrong answer."""

from __future__ import annotations

from pathlib import Path

import pytest

from test_hostile import _in_tmp, invoke, one_error  # noqa: F401 (the autouse fixture: each test in tmp_path)

DATA = Path(__file__).parent / "data"
GPIPE = [DATA / "torch_gpipe_rank0.json", DATA / "torch_gpipe_rank1.json"]
SMALL = ["--model", "llama3-8b", "--hardware", "h100-sxm", "--pp", "4", "--microbatches", "8", "--seq-len", "2048"]


# ----------------------------------------------------------------------------- A: overlay
@pytest.mark.parametrize("extra", [["--op-times", "measured"], ["--op-times", "1,1,1"],
                                   ["--hardware", "h100-sxm", "--op-times", "measured"],
                                   ["--model", "llama3-8b"]])
def test_overlay_needs_the_traced_model_and_hardware(extra):
    measured = [a for p in GPIPE for a in ("--measured", p)]
    one_error(invoke("overlay", *measured, *extra), "overlay: give the model and hardware", "--op-times fixes only")


# ----------------------------------------------------------------------------- B: importers
MEGATRON = DATA / "jobs" / "megatron_llama3_70b.txt"
TORCHTITAN = DATA / "jobs" / "torchtitan_llama3_70b.toml"


def _edited(source: Path, tmp_path: Path, old: str, new: str) -> Path:
    text = source.read_text()
    assert old in text
    path = tmp_path / source.name
    path.write_text(text.replace(old, new))
    return path


@pytest.mark.parametrize("old, new, needles", [
    ("--tensor-model-parallel-size 8", "--tensor-model-parallel-size 0",
     ["--tensor-model-parallel-size = 0", "integer >= 1"]),
    ("--global-batch-size 32", "--global-batch-size 0", ["--global-batch-size = 0", "integer >= 1"]),
    ("--nnodes 8", "--nnodes 3", ["--nnodes 3 x --nproc-per-node 8 = 24 GPUs", "TP x PP x CP = 8 x 4 x 1 = 32"]),
    ("--num-layers-per-virtual-pipeline-stage 10", "--num-layers-per-virtual-pipeline-stage 7",
     ["--num-layers-per-virtual-pipeline-stage = 7", "20 layers", "divisor of 20"]),
    ("--bf16", "--bf16 --context-parallel-size 2 --cp-comm-type a2a+p2p", ["--cp-comm-type = 'a2a+p2p'"]),
])
def test_megatron_bad_values_are_errors(tmp_path, old, new, needles):
    path = _edited(MEGATRON, tmp_path, old, new)
    one_error(invoke("compare", "--from-megatron", path, "--hardware", "h100-sxm"), f"--from-megatron {path}",
              *needles)


def test_megatron_context_parallelism_is_mapped(tmp_path):
    from simtrain.importers.megatron import read_megatron_args

    job = read_megatron_args(_edited(MEGATRON, tmp_path, "--bf16", "--bf16 --context-parallel-size 2 --cp-comm-type a2a"))
    assert (job.parallel["cp"], job.parallel["cp_kind"], job.parallel["dp"]) == (2, "ulysses", 1)  # 64 / (8 x 4 x 2)
    assert not any("context" in note for note in job.ignored)


def test_megatron_overrides_keep_the_world_and_show_in_the_summary():
    from simtrain.importers.megatron import read_megatron_args

    job = read_megatron_args(MEGATRON, {"pp": 2})
    p = job.parallel
    assert (p["tp"], p["pp"], p["dp"]) == (8, 2, 4) and p["tp"] * p["pp"] * p["dp"] == 64  # the file's 64 GPUs
    assert p["microbatches"] == 8 and p["vp"] == 4  # 32 sequences / (1 x 4); 40 layers per rank / 10
    simulating = job.summary()[1]
    assert "pp 2 (--pp)" in simulating and "dp 4," in simulating
    assert read_megatron_args(MEGATRON, {"dp": 1}).parallel["microbatches"] == 32


@pytest.mark.parametrize("old, new, needles", [
    ("tensor_parallel_degree = 8", "tensor_parallel_degree = 0", ["parallelism.tensor_parallel_degree = 0"]),
    ("local_batch_size = 8", 'local_batch_size = "8"', ["training.local_batch_size = '8'"]),
    ("pipeline_parallel_degree = 4", "pipeline_parallel_degree = true", ["parallelism.pipeline_parallel_degree"]),
    ("seq_len = 8192", 'seq_len = 8192\nmixed_precision_param = "float16"',
     ["training.mixed_precision_param = 'float16'", "bfloat16"]),
    ('mode = "full"', 'mode = "op"', ["activation_checkpoint.mode = 'op'"]),
])
def test_torchtitan_errors_name_the_toml_field(tmp_path, old, new, needles):
    path = _edited(TORCHTITAN, tmp_path, old, new)
    line = one_error(invoke("compare", "--from-torchtitan", path, "--hardware", "h100-sxm", "--dp", "2"),
                     f"--from-torchtitan {path}", *needles)
    assert "error: --tp" not in line and "error: --recompute" not in line


def test_hf_errors_name_the_config_keys(tmp_path):
    import json

    config = json.loads((DATA / "hf_configs" / "llama3-8b" / "config.json").read_text())
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**config, "num_hidden_layers": 0, "intermediate_size": -5}))
    line = one_error(invoke("compare", "--model", path, "--hardware", "h100-sxm"),
                     "field 'num_hidden_layers' = 0", "field 'intermediate_size' = -5")
    assert "num_layers" not in line and "ffn_hidden_size" not in line
    path.write_text(json.dumps({**config, "num_attention_heads": 7}))
    one_error(invoke("compare", "--model", path, "--hardware", "h100-sxm"),
              "num_key_value_heads (8) must divide num_attention_heads (7)")


# ----------------------------------------------------------------------------- C: flags that change nothing
@pytest.mark.parametrize("extra, needles", [
    (["--op-times", "1,1,1", "--recompute", "norm"], ["--recompute norm", "--op-times fixes every duration"]),
    (["--op-times", "1,1,1", "--cost-model", "flat"], ["--cost-model flat", "--op-times"]),
    (["--op-times", "1,1,1", "--fp8", "gemms"], ["--fp8 gemms", "--op-times"]),
    (["--op-times", "1,1,1", "--breakdown", "0"], ["--breakdown 0", "--op-times"]),
    (["--no-comm", "--tp", "2", "--tp-overlap"], ["--tp-overlap:", "--no-comm makes every collective free"]),
])
def test_flags_idle_under_fixed_times_or_free_comm_are_refused(extra, needles):
    one_error(invoke("compare", *SMALL, "--schedules", "1f1b", "--json", *extra), *needles)


def test_kernels_eager_still_counts_with_fixed_op_times():
    """Not refused: eager kernels change the activations autograd keeps, which --op-times does not fix."""
    import json

    rows = [json.loads(invoke("compare", *SMALL, "--schedules", "1f1b", "--json", "--op-times", "1,1,1", *k).stdout)[0]
            for k in ([], ["--kernels", "eager"])]
    assert rows[0]["step_time_s"] == rows[1]["step_time_s"]
    assert rows[1]["peak_memory_bytes"][0] > rows[0]["peak_memory_bytes"][0]


def test_vp_with_only_a_schedule_file_is_refused(tmp_path):
    csv = tmp_path / "f.csv"
    assert invoke("export-schedule", "1f1b", "--pp", "4", "--microbatches", "8", "--out", csv).exit_code == 0
    one_error(invoke("compare", "--model", "llama3-8b", "--hardware", "h100-sxm", "--seq-len", "2048",
                     "--schedule-file", csv, "--vp", "2"), "--vp 2: the schedule file places its stages itself")


EP = ["--hardware", "h800", "--ep", "64", "--tokens", "4096", "--hidden", "7168", "--topk", "8"]


@pytest.mark.parametrize("args, needles", [
    (["combine", *EP, "--dispatch-dtype", "fp8"], ["--dispatch-dtype: only for dispatch", "combine sends BF16"]),
    (["dispatch", *EP, "--sizes", "1M"], ["--sizes: only for the NCCL collectives"]),
    (["dispatch", *EP, "--algorithm", "ring"], ["--algorithm: only for the NCCL collectives"]),
    (["all-reduce", "--hardware", "h800", "--gpus", "8", "--experts", "3"], ["--experts: only for dispatch"]),
    (["all-reduce", "--hardware", "h800", "--gpus", "8", "--low-latency"], ["--low-latency: only for dispatch"]),
])
def test_collective_flags_that_change_nothing_are_refused(args, needles):
    one_error(invoke("collective", *args), *needles)


# ----------------------------------------------------------------------------- D: ranges
@pytest.mark.parametrize("args, needles", [
    (["compare", "--model", "llama3-8b", "--hardware", "h100-sxm", "--seq-len", "10000000000"],
     ["--seq-len = 10000000000", "2147483647"]),
    (["compare", "--max-tasks", "0"], ["--max-tasks", "greater than or equal to 1", "(given: 0)"]),
    (["compare", "--max-tasks", "-1"], ["--max-tasks", "(given: -1)"]),
    (["export-schedule", "1f1b", "--pp", "2", "--microbatches", "2", "--max-tasks=-1"], ["--max-tasks", "(given: -1)"]),
    (["plan", "--model", "llama3-8b", "--hardware", "h100-sxm", "--gpus", "8", "--global-batch", "16", "--workers", "0"],
     ["--workers", "(given: 0)"]),
    (["calibrate", "--out", "c.yaml", "--timeout-s", "nan"], ["--timeout-s = nan", "finite"]),
    (["validate", "--profile", "h100-sxm", "--timeout-s", "nan"], ["--timeout-s = nan", "finite"]),
    (["calibrate", "--out", "c.txt"], ["--out c.txt", ".yaml"]),
    (["export-schedule", "1f1b", "--pp", "2", "--microbatches", "2", "--out", "x.txt"], ["--out = 'x.txt'", ".csv"]),
])
def test_out_of_range_values_are_refused(args, needles):
    one_error(invoke(*args), *needles)
    assert not Path("x.txt").exists() and not Path("c.txt").exists()


def test_scenario_seq_len_has_the_same_bound(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("model: llama3-8b\nhardware: h100-sxm\nparallel:\n  seq_len: 10000000000\n")
    one_error(invoke("compare", path), "field 'parallel.seq_len' = 10000000000", "2147483647")


# ----------------------------------------------------------------------------- E: messages
def test_dtype_errors_name_the_flag_and_the_allowed_dtypes():
    one_error(invoke("compare", *SMALL, "--dtype", "fp64"), "--dtype = 'fp64'", "bf16, fp16, fp32, fp8")
    line = one_error(invoke("compare", *SMALL[:2], "--hardware", "v100-sxm2", *SMALL[4:]))
    assert "no bf16 rate, the default compute dtype" in line and "--dtype fp16" in line
    one_error(invoke("compare", *SMALL[:2], "--hardware", "v100-sxm2", *SMALL[4:], "--dtype", "fp8"),
              "--dtype = 'fp8'", "fp16, fp32")


def test_unknown_schedule_of_a_scenario_names_the_file(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("model: llama3-8b\nhardware: h100-sxm\nschedules: [1f1b, bogus]\n")
    line = one_error(invoke("compare", path), f"{path}: field 'schedules': unknown schedule 'bogus'")
    assert "--schedules" not in line


def test_rule_across_fields_names_the_flag():
    line = one_error(invoke("compare", *SMALL, "--tp-overlap-fraction", "0.5"),
                     "error: --tp-overlap-fraction = 0.5: tp_overlap_fraction applies only with tp_overlap")
    assert "command line and the flags" not in line


def test_plan_advice_names_only_settings_not_tried():
    base = ["plan", "--model", "llama3-405b", "--hardware", "h100-sxm", "--gpus", "8", "--global-batch", "16"]
    line = one_error(invoke(*base), "no configuration fits")
    assert "--recompute full" not in line and "--zero-stages 1" not in line and "use more GPUs" in line
    one_error(invoke(*base, "--recompute", "none", "--zero-stages", "0"), "allow --recompute full, --zero-stages 0,1,2,3 or")


# ----------------------------------------------------------------------------- F: profile names
def test_profiles_list_a_profile_by_the_name_results_use(tmp_path):
    from simtrain.hardware import PROFILE_DIR, load_profile, resolve_profile_path

    (tmp_path / "hardware_profiles").mkdir()
    text = (PROFILE_DIR / "h100-sxm.yaml").read_text()
    assert "name: h100-sxm" in text
    mine = tmp_path / "hardware_profiles" / "h_mine.yaml"
    mine.write_text(text.replace("name: h100-sxm", "name: mine", 1))
    res = invoke("profiles")
    assert res.exit_code == 0, res.output
    names = [line.split("│")[1].strip() for line in res.stdout.splitlines() if line.count("│") > 2]
    assert "mine" in names and "h_mine" not in names  # the name column: the name: field
    assert "listed as 'mine' (its name: field)" in res.stderr
    assert resolve_profile_path("mine").resolve() == mine.resolve() == resolve_profile_path("h_mine").resolve()
    assert load_profile("mine").name == "mine"


# ----------------------------------------------------------------------------- G: JSON
def test_ratio_noise_around_zero_is_zero():
    from simtrain.metrics import RATIO_NOISE, tidy_ratio

    assert tidy_ratio(5.55e-17) == 0.0 and tidy_ratio(-3e-16) == 0.0
    assert tidy_ratio(0.25) == 0.25 and tidy_ratio(10 * RATIO_NOISE) == 10 * RATIO_NOISE


def test_sweep_rows_are_typed_as_the_runs_rows():
    import json

    res = invoke("compare", *SMALL[:4], "--pp", "2", "--seq-len", "2048", "--microbatches", "8",
                 "--schedules", "1f1b,zb-h2", "--sweep", "microbatches=2,8", "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    ok = [r for r in doc["sweep"] if r["error_message"] is None]
    failed = [r for r in doc["sweep"] if r["error_message"] is not None]  # zb-h2 needs m >= 2p
    assert failed and all(r["step_time_s"] is None for r in failed)
    assert all(type(r["gpus"]) is int and type(r["value"]) is int for r in ok)
    at_8 = {r["schedule"]: r for r in ok if r["value"] == 8}
    for run in doc["runs"]:
        assert at_8[run["schedule"]]["step_time_s"] == run["step_time_s"]  # not rounded to 10 digits


# ----------------------------------------------------------------------------- H: README
README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_quotes_the_default_scenarios_gpipe_figures():
    import json
    import re

    text = " ".join(README.read_text().split())
    quoted = re.search(r"default scenario's GPipe: idle ([\d.]+) %, bubble ([\d.]+) %, exposed communication "
                       r"([\d.]+) % of the step", text)
    assert quoted, "README no longer quotes the default scenario's GPipe figures"
    res = invoke("compare", "--schedules", "gpipe", "--json")
    assert res.exit_code == 0, res.output
    [row] = json.loads(res.stdout)
    ran = (row["idle_ratio"], row["bubble_ratio"], row["exposed_comm_s"] / row["step_time_s"])
    assert [float(q) for q in quoted.groups()] == [round(100 * x, 1) for x in ran]


def test_readme_install_line_works_from_the_checkout():
    text = README.read_text()
    assert "pip install ./simtrain" not in text  # from a checkout ./simtrain is the package, not the project
    assert (README.parent / "pyproject.toml").is_file() and "from inside it: pip install ." in text
