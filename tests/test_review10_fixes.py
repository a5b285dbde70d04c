"""Regression tests for the defects review 10 found (items 4-12 of the hostile-fixes5 brief)."""

from __future__ import annotations

import pytest

from simtrain.errors import SimtrainError

GIB = 2**30


@pytest.mark.parametrize("device_name, memory_gib, profile", [
    ("NVIDIA H100 80GB HBM3", 79.1, "h100-sxm"),
    ("NVIDIA A100-SXM4-80GB", 79.1, "a100-sxm-80gb"),
    ("NVIDIA A100-SXM4-40GB", 39.4, None),  # was a100-sxm-80gb, calibrated as 80 GiB
    ("NVIDIA A100-PCIE-40GB", 39.4, None),
    ("Tesla V100-SXM2-16GB", 15.8, None),  # was the 32 GB profile
    ("Tesla V100-SXM2-32GB", 31.7, "v100-sxm2"),
    ("NVIDIA GH200 480GB", 94.5, None),  # was h200-sxm ('h200' inside 'gh200')
    ("NVIDIA H100 NVL", 93.1, None),  # was h100-sxm: no shipped NVL profile
    ("NVIDIA H200", 139.8, "h200-sxm"),
])
def test_calibrate_matches_a_cuda_device_by_name_form_factor_and_memory(device_name, memory_gib, profile):
    from simtrain.calibration.profile import _matching_profile
    from simtrain.hardware import available_profiles

    assert _matching_profile(device_name, available_profiles(), memory_gib * GIB) == profile


def test_calibrate_refuses_or_takes_the_devices_memory():
    from simtrain.calibration.profile import base_profile_data

    with pytest.raises(SimtrainError, match=r"--base: no shipped profile is GPU 'NVIDIA A100-SXM4-40GB' with 39.4 GiB"):
        base_profile_data(None, "cuda", "NVIDIA A100-SXM4-40GB", 39.4 * GIB)
    data, name = base_profile_data("a100-sxm-80gb", "cuda", "NVIDIA A100-SXM4-40GB", 39.4 * GIB)
    assert name == "a100-sxm-80gb" and data["hbm_gib"] == pytest.approx(39.4, rel=1e-3)
    data, _ = base_profile_data(None, "cuda", "NVIDIA A100-SXM4-80GB", 79.1 * GIB)
    assert data["hbm_gib"] == 80  # the datasheet capacity where the device is the profile


@pytest.mark.parametrize("hardware, parallel, args, needle", [
    ("h100-sxm", "{tp: 8, attention_kernel: fa4}", [],
     "error: s.yaml: field 'parallel.attention_kernel' = 'fa4': op_data.yaml has no measured rate"),
    ("h100-sxm", "{tp: 8, recompute: mla_up}", [], "error: s.yaml: field 'parallel.recompute' = 'mla_up': llama3-8b has no"),
    ("h100-sxm", "{tp: 8, attention_kernel: fa2}", ["--attention", "unfused"],
     "error: s.yaml: field 'parallel.attention_kernel' = 'fa2': names a fused-attention kernel, and attention is "
     "unfused (set --attention flash or leave the kernel out)"),
])
def test_a_scenario_files_settings_are_named_as_its_fields(tmp_path, monkeypatch, hardware, parallel, args, needle):
    """Review 10: these errors named flags the user never typed (``--attention-kernel fa4``, ...)."""
    from conftest import invoke

    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.yaml").write_text(f"model: llama3-8b\nhardware: {hardware}\nparallel: {parallel}\nschedules: [1f1b]\n")
    res = invoke("compare", "s.yaml", *args, "--json")
    assert res.exit_code == 2 and res.stderr.count("\n") == 1 and res.stderr.startswith(needle), res.output


_TOML = """[model]
name = "llama3"
flavor = "8B"
{converters}
[training]
local_batch_size = 8
seq_len = 2048
[parallelism]
data_parallel_shard_degree = 2
pipeline_parallel_degree = 2
{compile}
"""


@pytest.mark.parametrize("compile_, kernels", [
    ("", "eager"), ("[compile]\nenable = true", "fused"), ("[compile]\nenable = true\ncomponents = ['model']",
                                                           "compiled-blocks"),
    ("[compile]\nenable = false", "eager"),
])
def test_torchtitan_jobs_are_imported_as_the_published_torchtitan_cases_model_them(tmp_path, compile_, kernels):
    """Review 10: float8 became dtype fp8 (runs.yaml: fp8 gemms), compile was ignored, and the
    attention kernel stayed H100's cuDNN default (runs.yaml: torchtitan's SDPA ran FA2 there)."""
    from simtrain.hardware import load_profile
    from simtrain.importers.torchtitan import read_torchtitan_toml
    from simtrain.parallel import ParallelConfig

    path = tmp_path / "job.toml"
    path.write_text(_TOML.format(converters='converters = ["float8"]', compile=compile_))
    job = read_torchtitan_toml(path)
    assert job.parallel["dtype"] == "bf16" and job.fp8 == "gemms"
    assert job.parallel["zero_impl"] == "fsdp2" and job.parallel["zero_stage"] == 2
    par = ParallelConfig(**job.parallel)
    ops = job.for_cost_model(par, "ops", load_profile("h100-sxm"))
    assert ops.kernels == kernels and ops.attention_kernel == "fa2"
    assert job.for_cost_model(par, "ops", load_profile("b200")).attention_kernel is None  # sm_100: the kind's default
    assert job.for_cost_model(par, "flat", load_profile("h100-sxm")) == par  # the flat model refuses both
    path.write_text(_TOML.format(converters="", compile=""))
    assert read_torchtitan_toml(path).fp8 is None


def test_a_torchtitan_job_runs_with_fp8_gemms_under_compare(tmp_path):
    from conftest import invoke
    import json

    path = tmp_path / "job.toml"
    path.write_text(_TOML.format(converters='converters = ["float8"]', compile="[compile]\nenable = true"))
    res = invoke("compare", "--from-torchtitan", str(path), "--hardware", "h100-sxm", "--json")
    assert res.exit_code == 0, res.output
    assert "with the per-operator cost model: kernels fused, fused_projections False, fp8 gemms" in res.stderr
    plain = tmp_path / "bf16.toml"
    plain.write_text(_TOML.format(converters="", compile="[compile]\nenable = true"))
    bf16 = invoke("compare", "--from-torchtitan", str(plain), "--hardware", "h100-sxm", "--json")
    assert json.loads(res.stdout)[0]["step_time_s"] < json.loads(bf16.stdout)[0]["step_time_s"]
    bad = tmp_path / "bad.toml"
    bad.write_text(_TOML.format(converters="", compile="[compile]\nenable = 'yes'"))
    err = invoke("compare", "--from-torchtitan", str(bad), "--hardware", "h100-sxm", "--json")
    assert err.exit_code == 2 and "compile.enable = 'yes': expected true or false" in err.stderr


@pytest.mark.parametrize("flag", [["--attention-kernel", "fa2"], ["--kernels", "compiled-blocks"]])
def test_settings_fixed_op_times_make_idle_are_refused(flag):
    from conftest import SMALL, invoke

    res = invoke("compare", *SMALL, "--schedules", "1f1b", "--op-times", "1,1,1", *flag, "--json")
    assert res.exit_code == 2 and res.stderr.startswith(f"error: {' '.join(flag)}: changes only the compute cost "
                                                        "model's durations, and --op-times fixes every duration")


@pytest.mark.parametrize("stage, needle", [
    (1, "field 'parallel.zero_impl' = 'fsdp2' is ignored: fsdp2 prices FSDP2's copy-out"),
    (2, "warning: zero_impl fsdp2 with zero_stage 2 (FSDP2 with reshard_after_forward False)"),
    (3, None),
])
def test_fsdp2_below_zero3_is_flagged(tmp_path, monkeypatch, stage, needle):
    from conftest import invoke

    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.yaml").write_text("model: llama3-8b\nhardware: h100-sxm\nparallel: {tp: 1, pp: 2, dp: 4, "
                                     f"microbatches: 4, zero_stage: {stage}, zero_impl: fsdp2}}\nschedules: [1f1b]\n")
    res = invoke("compare", "s.yaml", "--json")
    assert res.exit_code == 0, res.output
    assert (needle in res.stderr) if needle else "zero_impl" not in res.stderr


def test_the_api_warns_at_the_callers_line_and_names_its_arguments():
    """Review 10: a step over HBM came back without a warning, warnings showed simtrain's own
    source line, and messages named CLI flags (``--tp 3``, ``--attention-kernel``)."""
    import warnings

    import simtrain

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rep = simtrain.simulate(model="llama3-8b", hardware="h100-sxm", tp=16, schedule="1f1b", seq_len=262144,
                                max_tasks=10**7)
    assert not rep.fits_in_hbm
    assert [w.filename for w in caught] == [__file__] * len(caught) and len(caught) == 3
    messages = [str(w.message) for w in caught]
    assert any(m.startswith("1f1b does not fit in HBM: rank 0 peaks at") for m in messages)
    assert any(m.startswith("tp=16 > 8 GPUs per node of h100-sxm") for m in messages)
    for kwargs, needle in [(dict(tp=3), "tp=3: must divide the model's 32 attention heads"),
                           (dict(tp=8, attention_kernel="fa4"), "attention_kernel='fa4': op_data.yaml has no"),
                           (dict(tp=8, recompute="mla_up"), "recompute='mla_up': llama3-8b has no 'mla_up'"),
                           (dict(tp=8, op_times=(1, 1, 1), attention_kernel="fa2"), "attention_kernel='fa2': changes only")]:
        with pytest.raises(SimtrainError) as exc:
            simtrain.simulate(model="llama3-8b", hardware="h100-sxm", schedule="1f1b", **kwargs)
        assert str(exc.value).startswith(needle) and "--" not in str(exc.value), exc.value


def test_the_api_takes_a_comma_list_of_schedules_and_names_force(tmp_path):
    import simtrain

    comparison = simtrain.compare(model="llama3-8b", hardware="h100-sxm", tp=8, pp=2, microbatches=4,
                                  schedules="1f1b, zbv")
    assert [r.schedule for r in comparison] == ["1f1b", "zbv"]
    mine = tmp_path / "mine.html"
    mine.write_text("a user's file")
    with pytest.raises(SimtrainError, match="pass force=True to overwrite it"):
        comparison.write_html(mine)


def test_json_keys_keep_one_meaning_and_the_csv_writes_whole_numbers(tmp_path):
    """Review 10: peak_memory_bytes was a per-rank list in compare rows but a scalar in plan and
    sweep rows; sweep's ``error`` (a message) clashed with validate's (a fraction); the CSV wrote
    stage and microbatch as 0.0; Report.trace lacked the CSV's lane column."""
    import csv
    import json

    import simtrain
    from conftest import SMALL, invoke

    res = invoke("compare", *SMALL, "--schedules", "1f1b", "--sweep", "microbatches=8,16", "--json",
                 "--csv", str(tmp_path / "t.csv"))
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert all(isinstance(r["peak_memory_bytes"], list) for r in doc["runs"])
    for row in doc["sweep"]:
        assert "peak_memory_bytes" not in row and "error" not in row and row["error_message"] is None
        assert isinstance(row["peak_memory_bytes_max"], float)
    rows = list(csv.DictReader((tmp_path / "t.csv").open()))
    assert {r["stage"] for r in rows if r["stage"]} == {"0", "1", "2", "3"}
    assert all(r["microbatch"] == "" or r["microbatch"].isdigit() for r in rows)
    rep = simtrain.simulate(model="llama3-8b", hardware="h100-sxm", tp=2, pp=4, dp=2, microbatches=8, seq_len=2048)
    assert list(rep.trace.columns) == [c for c in rows[0] if c != "schedule"]


def test_minor_messages_of_review_10(tmp_path):
    """Review 10 item 12: a sweep's task refusal named the base microbatches, not the swept ones;
    calibrate --base nope did not name --base; two rates for one GEMM shape were accepted;
    validate's table printed 14451 as 1.445e+04."""
    from conftest import invoke

    from simtrain.calibration.profile import base_profile_data
    from simtrain.hardware import PROFILE_DIR, load_profile
    from simtrain.published import _figure

    res = invoke("compare", "--model", "llama3-8b", "--hardware", "h100-sxm", "--tp", "8", "--pp", "8",
                 "--schedules", "1f1b", "--sweep", "microbatches=4,1000000", "--json")
    assert res.exit_code == 2 and "at pp 8, sweep microbatches=4,1000000 (2 points) is about" in res.stderr
    assert "lower the sweep's microbatches values or --pp" in res.stderr
    with pytest.raises(SimtrainError, match=r"^--base nope: unknown hardware 'nope'"):
        base_profile_data("nope", "cuda", "NVIDIA H100 80GB HBM3")
    row = "      - {tokens: 4096, fan_in: 4096, fan_out: 4096, kind: F, tflops: %d}\n"
    (tmp_path / "dup.yaml").write_text((PROFILE_DIR / "h100-sxm.yaml").read_text().replace("name: h100-sxm", "name: d")
                                       + "compute:\n  linear_tflops:\n    bf16:\n" + row % 600 + row % 300)
    with pytest.raises(SimtrainError, match=r"'compute.linear_tflops.bf16.0' and 'compute.linear_tflops.bf16.1': "
                                            "one shape .* with two different rates"):
        load_profile(tmp_path / "dup.yaml")
    (tmp_path / "same.yaml").write_text((tmp_path / "dup.yaml").read_text().replace("tflops: 300", "tflops: 600"))
    assert load_profile(tmp_path / "same.yaml").linear_rates  # a repeated row with the same rate is harmless
    assert [_figure(x) for x in (14451.3, 950.25, 0.91234)] == ["14,451", "950.2", "0.9123"]
