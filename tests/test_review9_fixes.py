"""Findings of review 9 (fresh eyes on main): each bad input ends in one ``error:`` line naming the
file or flag, the field, the value and what is allowed (exit 2), or a ``warning:`` where the run is
right but something given is not used."""

from __future__ import annotations

import pytest
import yaml

from simtrain.hardware import PROFILE_DIR

from test_hostile import _in_tmp, invoke, one_error  # noqa: F401 (the autouse fixture: each test in tmp_path)

RUN = ["--model", "llama3-8b", "--tp", "8", "--schedules", "1f1b", "--no-comm", "--cost-model", "flat"]


# ----------------------------------------------------------------------------- 1: measured rate tables
def _profile(tmp_path, **compute) -> str:
    data = yaml.safe_load((PROFILE_DIR / "h100-sxm.yaml").read_text())
    data["compute"] = compute
    path = tmp_path / "fast.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def _linear(rates: dict[int, float], dtype: str = "bf16") -> dict:
    return {dtype: [dict(tokens=t, fan_in=4096, fan_out=4096, kind=k, tflops=r) for t, r in rates.items() for k in "FIW"]}


def _attention(rates: dict[int, float]) -> dict:
    return {"bf16": [dict(seq_len=s, head_dim=128, forward_tflops=r, backward_tflops=r) for s, r in rates.items()]}


@pytest.mark.parametrize("compute, needles", [
    (dict(linear_tflops=_linear({1024: 5000.0, 8192: 5000.0})),
     ["compute.linear_tflops.bf16.0.tflops' = 5000", "at most peak_tflops.bf16 = 989.4"]),
    (dict(linear_tflops=_linear({1024: 5000.0, 8192: 1.0})), ["bf16.0.tflops' = 5000", "peak_tflops.bf16"]),
    (dict(attention_tflops=_attention({8192: 2000.0})),  # the non-causal count: up to 2 x 989.4
     ["compute.attention_tflops.bf16.0.forward_tflops' = 2000", "at most twice peak_tflops.bf16 = 1978.8"]),
    # 8x the tokens in under 8x the time of the smaller GEMM
    (dict(linear_tflops=_linear({1024: 100.0, 8192: 900.0})),
     ["compute.linear_tflops.bf16.3.tflops' = 900", "at most 800", "tokens 8192 takes less time than tokens 1024"]),
    (dict(attention_tflops=_attention({2048: 100.0, 8192: 500.0})),
     ["attention_tflops.bf16.1.forward_tflops' = 500", "at most 400", "same head_dim 128"]),
    (dict(linear_tflops=_linear({1024: 100.0}, "fp4")), ["compute.linear_tflops.fp4", "Input should be"]),
])
def test_rate_tables_are_bounded_by_peak_and_by_time(tmp_path, compute, needles):
    one_error(invoke("compare", *RUN, "--hardware", _profile(tmp_path, **compute), "--json"), "fast.yaml", *needles)


def test_a_rate_table_needs_its_dtypes_peak(tmp_path):
    path = _profile(tmp_path, linear_tflops=_linear({1024: 100.0}, "tf32"))
    data = yaml.safe_load(open(path))
    del data["peak_tflops"]["tf32"]
    open(path, "w").write(yaml.safe_dump(data))
    one_error(invoke("compare", *RUN, "--hardware", path, "--json"), "fast.yaml",
              "section 'compute.linear_tflops.tf32'", "no peak_tflops.tf32")


def test_rate_tables_within_bounds_are_used(tmp_path):
    """A falling rate (a larger shape slower per FLOP) is physical and accepted, as are rates at the
    bounds; the table then prices the run (slower than the flat 0.75 x peak)."""
    path = _profile(tmp_path, linear_tflops=_linear({1024: 989.4, 8192: 300.0}),
                    attention_tflops=_attention({2048: 1978.8, 8192: 1000.0}))
    flat = invoke("compare", *RUN, "--hardware", "h100-sxm", "--json")
    res = invoke("compare", *RUN, "--hardware", path, "--json")
    assert res.exit_code == 0 and flat.exit_code == 0, res.output
    assert yaml.safe_load(res.stdout)[0]["step_time_s"] > yaml.safe_load(flat.stdout)[0]["step_time_s"]


def test_a_table_without_the_runs_dtype_warns(tmp_path):
    path = _profile(tmp_path, linear_tflops=_linear({1024: 1500.0}, "fp8"))
    res = invoke("compare", *RUN, "--hardware", path, "--json")
    assert res.exit_code == 0, res.output
    warned = [line for line in res.stderr.splitlines() if line.startswith("warning:")]
    assert any("compute.linear_tflops has rates for fp8 only, none for this bf16 run" in w for w in warned), res.stderr
    again = invoke("compare", *RUN, "--hardware", path, "--dtype", "fp8", "--json")
    assert again.exit_code == 0 and "compute.linear_tflops" not in again.stderr, again.stderr


# ----------------------------------------------------------------------------- 2: bytes of TP collectives
def test_tp_collectives_carry_their_bytes_in_the_csv_and_the_trace(tmp_path):
    import json

    import pandas as pd

    res = invoke("compare", "--model", "llama3-8b", "--hardware", "h100-sxm", "--tp", "2", "--pp", "2", "--dp", "2",
                 "--microbatches", "4", "--schedules", "1f1b", "--csv", tmp_path / "t.csv", "--trace",
                 tmp_path / "t.json", "--out", tmp_path / "t.html")
    assert res.exit_code == 0, res.output
    table = pd.read_csv(tmp_path / "t.csv", keep_default_na=False)
    tp = table[table["kind"] == "tp"]
    # sequence parallel: 2 all-gathers + 2 reduce-scatters per layer, each of the full
    # microbatch's hidden states (1 x 8192 tokens x 4096 x 2 bytes), 16 layers per stage
    assert len(tp) and (tp["bytes"] == 4 * 16 * 8192 * 4096 * 2).all(), tp["bytes"].unique()
    p2p = table[table["kind"] == "p2p"]
    assert len(p2p) and (p2p["stream"] == "").all() and (p2p["lane"] == "p2p").all()
    assert (table.loc[table["kind"] == "dp", "lane"] == "dp").all()
    events = [e for e in json.loads((tmp_path / "t.json").read_text())["traceEvents"] if e.get("cat") == "tp"]
    assert events and all(e["args"]["bytes"] == 4 * 16 * 8192 * 4096 * 2 for e in events)


# ----------------------------------------------------------------------------- 3: recompute module lists
def _row(res) -> dict:
    assert res.exit_code == 0, res.output
    return yaml.safe_load(res.stdout)[0]


def test_a_scenario_takes_a_recompute_module_list_as_compare_does(tmp_path):
    scenario = tmp_path / "s.yaml"
    scenario.write_text("model: llama3-8b\nhardware: h100-sxm\nparallel: {tp: 8, recompute: 'norm,swiglu'}\n"
                        "schedules: [1f1b]\n")
    flags = ["--model", "llama3-8b", "--hardware", "h100-sxm", "--tp", "8", "--schedules", "1f1b", "--json"]
    from_file, from_flag = _row(invoke("compare", scenario, "--json")), _row(invoke("compare", *flags, "--recompute",
                                                                                    "norm,swiglu"))
    plain = _row(invoke("compare", *flags, "--recompute", "none"))
    for key in ("step_time_s", "peak_memory_bytes"):
        assert from_file[key] == from_flag[key] != plain[key]
    # a flag replaces the file's list
    assert _row(invoke("compare", scenario, "--recompute", "none", "--json"))["step_time_s"] == plain["step_time_s"]
    scenario.write_text(scenario.read_text().replace("swiglu", "bogus"))
    one_error(invoke("compare", scenario, "--json"), "s.yaml: field 'parallel.recompute' = 'norm,bogus'",
              "unknown module 'bogus'")


def test_plan_tries_recompute_module_lists():
    import json

    args = ["plan", "--model", "llama3-8b", "--hardware", "h100-sxm", "--gpus", "8", "--global-batch", "16",
            "--schedules", "1f1b", "--workers", "1", "--json"]
    res = invoke(*args, "--recompute", "norm,swiglu", "--recompute", "none")
    assert res.exit_code == 0, res.output
    rows = {(r["tp"], r["pp"], r["dp"], r["microbatch_size"], r["zero_stage"], r["recompute"]): r
            for r in json.loads(res.stdout)["top"]}
    assert {k[-1] for k in rows} == {"none", "norm,swiglu"}
    pairs = [(rows[k], rows[(*k[:-1], "none")]) for k in rows if k[-1] != "none" and (*k[:-1], "none") in rows]
    assert pairs and all(m["peak_memory_bytes_max"] < n["peak_memory_bytes_max"] and m["step_time_s"] > n["step_time_s"]
                         for m, n in pairs)
    one_error(invoke(*args, "--recompute", "norm,bogus"), "--recompute = 'norm,bogus'", "unknown module 'bogus'")
    one_error(invoke(*args, "--recompute", "norm", "--cost-model", "flat"), "needs the per-operator cost model")


# ----------------------------------------------------------------------------- 4: errors name what was given
DATA = PROFILE_DIR.parent.parent / "tests" / "data"


def test_megatron_model_errors_name_the_files_flags(tmp_path):
    text = (DATA / "jobs" / "megatron_llama3_70b.txt").read_text()
    assert "--num-query-groups 8" in text
    job = tmp_path / "job.txt"
    job.write_text(text.replace("--num-query-groups 8", "--num-query-groups 7"))
    line = one_error(invoke("compare", "--from-megatron", job, "--hardware", "h100-sxm", "--json"),
                     "job.txt: --num-query-groups (7) must divide --num-attention-heads (64)")
    assert "num_kv_heads" not in line


def test_too_many_stages_name_the_scenario_field(tmp_path):
    scenario = tmp_path / "s.yaml"
    scenario.write_text("model: llama3-8b\nhardware: h100-sxm\nparallel: {pp: 64}\nschedules: [1f1b]\n")
    line = one_error(invoke("compare", scenario, "--json"), "s.yaml: field 'parallel.pp' = 64",
                     "64 pipeline stages for a model of 32 layers")
    assert "--pp" not in line
    one_error(invoke("compare", "--model", "llama3-8b", "--hardware", "h100-sxm", "--pp", "8", "--vp", "8",
                     "--schedules", "interleaved-1f1b", "--microbatches", "16", "--json"),
              "--pp 8 with --vp 8", "64 pipeline stages", "lower pp or vp")


EP = ["collective", "dispatch", "--hardware", "h100-sxm", "--tokens", "4096", "--hidden", "7168", "--topk", "8"]


def test_collective_dispatch_names_the_experts_default():
    line = one_error(invoke(*EP, "--ep", "3"), "--ep = 3", "256 by default", "give --experts")
    assert "--experts = 256" not in line
    one_error(invoke(*EP, "--ep", "3", "--experts", "256"), "--experts = 256: must be a multiple of --ep (3)")


def test_profiles_names_what_a_device_is():
    one_error(invoke("profiles", "/dev/zero"), "/dev/zero: is a device", "profile YAML file or a folder")


def test_overlay_of_one_ranks_trace_says_the_other_ranks_are_missing():
    line = one_error(invoke("overlay", "--measured", DATA / "torch_gpipe_rank0.json", "--model", "llama3-8b",
                            "--hardware", "h100-sxm"), "--measured: 1 trace file(s) with 1 pipeline rank(s)",
                     "the job had 2", "world_size 2")
    assert "HBM" not in line


# ----------------------------------------------------------------------------- 6: collectives
def test_dispatch_warns_of_a_node_limit_that_never_binds_as_compare_does():
    res = invoke(*EP, "--ep", "16", "--node-limit", "99", "--json")
    assert res.exit_code == 0, res.output
    assert "warning: --node-limit 99: an EP group of 16 GPUs spans 2 node(s) of 8 GPUs, so the limit never binds" \
        in res.stderr
    bound = invoke(*EP, "--ep", "16", "--node-limit", "1", "--json")
    assert bound.exit_code == 0 and "never binds" not in bound.stderr


# ----------------------------------------------------------------------------- 5: no folder is created
COMPARE = ["compare", "--model", "llama3-8b", "--hardware", "h100-sxm", "--pp", "2", "--schedules", "1f1b",
           "--microbatches", "4"]
NCCL_LOG = sorted((DATA / "nccl_tests").iterdir())[0]


@pytest.mark.parametrize("args, flag", [
    ([*COMPARE, "--out", "{missing}/x.html"], "--out"),
    ([*COMPARE, "--trace", "{missing}/t.json"], "--trace"),
    ([*COMPARE, "--csv", "{missing}/t.csv"], "--csv"),
    (["export-schedule", "1f1b", "--pp", "2", "--microbatches", "4", "--out", "{missing}/s.csv"], "--out"),
    (["plan", "--model", "llama3-8b", "--hardware", "h100-sxm", "--gpus", "8", "--global-batch", "16",
      "--schedules", "1f1b", "--out", "{missing}/p.html"], "--out"),
    (["calibrate", "--device", "cpu", "--out", "{missing}/p.yaml"], "--out"),
    (["calibrate", "--nccl-tests", NCCL_LOG, "--base", "h100-sxm", "--out", "{missing}/p.yaml"], "--out"),
])
def test_an_output_in_a_missing_folder_is_refused(tmp_path, args, flag):
    missing = tmp_path / "nonexist"
    res = invoke(*[str(a).format(missing=missing) for a in args])
    one_error(res, f"{flag} = '{missing}/", f"cannot write the file: {missing} does not exist")
    assert not missing.exists()


def test_the_atomic_writer_creates_no_folder(tmp_path):
    from simtrain import atomic
    from simtrain.errors import SimtrainError

    with pytest.raises(FileNotFoundError):
        atomic.write_text(tmp_path / "a" / "b.txt", "x")
    with pytest.raises(SimtrainError, match="does not exist; create it first"):
        atomic.write_text(tmp_path / "a" / "b.txt", "x", flag="--out")
    assert not (tmp_path / "a").exists()
    assert atomic.write_text(tmp_path / "b.txt", "x").read_text() == "x"


@pytest.mark.parametrize("op", ["all-reduce", "all-gather", "p2p"])
def test_a_collective_of_one_gpu_is_refused(op):
    one_error(invoke("collective", op, "--gpus", "1", "--hardware", "h100-sxm"), "--gpus = 1",
              "a collective needs at least 2 GPUs")


def test_calibrate_names_a_bad_device_before_the_missing_out():
    one_error(invoke("calibrate", "--device", "tpu"), "--device = 'tpu': choose cpu or cuda")
    one_error(invoke("calibrate"), "--out: required")


# ----------------------------------------------------------------------------- 7: minor
def test_a_config_json_with_a_repeated_key_is_refused(tmp_path):
    text = (DATA / "hf_configs" / "llama3-70b" / "config.json").read_text()
    assert '"num_hidden_layers": 80' in text
    config = tmp_path / "llama" / "config.json"
    config.parent.mkdir()
    config.write_text(text.replace('"num_hidden_layers": 80', '"num_hidden_layers": 80, "num_hidden_layers": 8'))
    one_error(invoke("compare", "--model", config, "--hardware", "h100-sxm", "--json"), "config.json",
              "field 'num_hidden_layers' is given twice (80 and 8)")


def test_a_recompute_module_named_twice_is_refused():
    one_error(invoke("compare", "--model", "llama3-8b", "--hardware", "h100-sxm", "--tp", "8", "--schedules", "1f1b",
                     "--recompute", "norm,swiglu,norm", "--json"),
              "--recompute = 'norm,swiglu,norm'", "module 'norm' is listed 2 times")


def test_a_user_profile_hidden_by_a_built_in_warns(tmp_path):
    (tmp_path / "hardware_profiles").mkdir()
    mine = tmp_path / "hardware_profiles" / "mine.yaml"  # its name: field is the built-in's
    mine.write_text((PROFILE_DIR / "h100-sxm.yaml").read_text())
    res = invoke("compare", "--model", "llama3-8b", "--hardware", "h100-sxm", "--tp", "8", "--schedules", "1f1b",
                 "--json")
    assert res.exit_code == 0, res.output
    assert "warning: hardware_profiles/mine.yaml: its profile 'h100-sxm' is shadowed by the built-in h100-sxm" \
        in res.stderr
    listed = invoke("profiles")
    assert listed.exit_code == 0 and "shadowed by the built-in h100-sxm" in listed.stderr
    mine.write_text(mine.read_text().replace("name: h100-sxm", "name: mine"))
    quiet = invoke("compare", "--model", "llama3-8b", "--hardware", "h100-sxm", "--tp", "8", "--schedules", "1f1b",
                   "--json")
    assert quiet.exit_code == 0 and "shadowed" not in quiet.stderr


@pytest.mark.parametrize("device_name, profile", [
    ("NVIDIA H100 80GB HBM3", "h100-sxm"),  # the SXM5 part's name: not the PCIe profile (sorted first)
    ("NVIDIA H100 PCIe", "h100-pcie"),
    ("NVIDIA A100-SXM4-80GB", "a100-sxm-80gb"),
    ("NVIDIA GB200", "gb200-nvl72"),  # not b200, whose name is inside it
    ("NVIDIA B200", "b200"),
    ("NVIDIA H800", "h800"),
    ("NVIDIA RTX 4090", None),
])
def test_calibrate_picks_the_shipped_profile_the_cuda_device_is(device_name, profile):
    """Without --base, calibrate starts from the profile the device name names; an H100 SXM matched
    h100-pcie (first in sorted order), whose 756 TFLOP/s peak a real SXM measurement exceeds."""
    from simtrain.calibration.profile import _matching_profile
    from simtrain.hardware import available_profiles

    assert _matching_profile(device_name, available_profiles()) == profile
