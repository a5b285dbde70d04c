"""Every refusal and warning names the input the user gave (review 11, items 4 and 5): the flag
for a flag, ``FILE: field 'parallel.x'`` for a scenario file's value, the keyword argument for
the Python API. One case per place, a scenario file and an API call each; a message worded for
the CLI (``--zero-stage``, ``--ep 1``) would fail them."""

from __future__ import annotations

import re
import warnings

import pytest

import simtrain
from conftest import invoke
from simtrain.errors import SimtrainError
from simtrain.schedules import ScheduleWarning

FLAG = re.compile(r"(?<![\w-])--[a-z]")
"""A command-line flag in a message (``--ep``), not a word with a dash."""

CASES = [
    # (what, model, hardware, parallel settings, schedules, file's wording, API's wording)
    ("MoE every-second-mm", "mixtral-8x7b", "h100-sxm", {"recompute": "every-second-mm", "tp": 8, "ep": 8, "dp": 8},
     ["1f1b"], "field 'parallel.recompute' = 'every-second-mm': defined for dense blocks",
     "recompute='every-second-mm': defined for dense blocks"),
    ("ep on a dense model", "llama3-8b", "h100-sxm", {"ep": 2, "dp": 2}, ["1f1b"],
     "field 'parallel.ep' = 2: model 'llama3-8b' is dense", "use ep=1"),
    ("cp with ep", "mixtral-8x7b", "h100-sxm", {"cp": 2, "ep": 2, "dp": 2}, ["1f1b"],
     "field 'parallel.cp' = 2 with", "use cp=1 or ep=1"),
    ("LoRA on MoE", "mixtral-8x7b", "h100-sxm", {"trainable": "lora:8", "tp": 8}, ["1f1b"],
     "field 'parallel.trainable' = 'lora:8': frozen weights are not modelled", "use trainable='all'"),
    ("offload without pcie", "llama3-8b", "b300", {"offload": "activations", "pp": 2, "microbatches": 4},
     ["1f1b"], "field 'parallel.offload' = 'activations': hardware profile b300 has no field 'pcie'",
     "or use offload='none'"),
    ("ZeRO-2 with DualPipe", "llama3-8b", "h100-sxm", {"zero_stage": 2, "pp": 2, "dp": 2, "microbatches": 4},
     ["dualpipe"], "dualpipe: {file}: field 'parallel.zero_stage' = 2: the schedule keeps two copies",
     "dualpipe: zero_stage=2: the schedule keeps two copies of each model chunk on different ranks, which "
     "ZeRO-2/3 cannot shard per microbatch; use zero_stage=0 or 1"),
    ("static memory over HBM", "llama3-70b", "h100-sxm", {"pp": 2, "dp": 8}, ["gpipe"],
     "raise the TP or PP degree ({file}: field 'parallel.tp' = 1, {file}: field 'parallel.pp' = 2), "
     "or use {file}: field 'parallel.zero_stage' = 1", "raise the TP or PP degree (tp=1, pp=2), or use zero_stage=1"),
    ("default dtype without a rate", "llama3-8b", "v100-sxm2", {"pp": 4, "microbatches": 4}, ["1f1b"],
     "the default compute dtype; set the dtype to one of fp16, fp32, fp64 (e.g. {file}: field 'parallel.dtype' = 'fp16')",
     "(e.g. dtype='fp16')"),
]


def _scenario(tmp_path, model, hardware, parallel, schedules):
    import yaml

    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"model": model, "hardware": hardware, "parallel": parallel,
                                    "schedules": schedules}))
    return str(path)


@pytest.mark.parametrize("what, model, hardware, parallel, schedules, in_file, in_api", CASES,
                         ids=[c[0] for c in CASES])
def test_a_scenario_files_value_is_named_as_its_field(tmp_path, what, model, hardware, parallel, schedules,
                                                      in_file, in_api):
    path = _scenario(tmp_path, model, hardware, parallel, schedules)
    res = invoke("compare", path, "--json")
    line = res.stderr.strip()
    assert res.exit_code == 2 and line.startswith("error: ") and "\n" not in line, res.output
    assert in_file.format(file=path) in line, line
    assert not FLAG.search(line), line


@pytest.mark.parametrize("what, model, hardware, parallel, schedules, in_file, in_api", CASES,
                         ids=[c[0] for c in CASES])
def test_an_api_argument_is_named_as_the_argument(what, model, hardware, parallel, schedules, in_file, in_api):
    with pytest.raises(SimtrainError) as exc, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        simtrain.compare(model, hardware, schedules=schedules, **parallel)
    assert in_api in str(exc.value), str(exc.value)
    assert not FLAG.search(str(exc.value)), str(exc.value)


def test_the_flat_model_refusal_names_where_each_setting_came_from(tmp_path):
    """A module list from the file with `--cost-model flat` typed: each named as given (the
    message used to say `--recompute MODULE,... = 'norm'`)."""
    path = _scenario(tmp_path, "llama3-8b", "h100-sxm", {"recompute": "norm", "pp": 2, "microbatches": 4}, ["1f1b"])
    res = invoke("compare", path, "--cost-model", "flat", "--json")
    assert res.exit_code == 2
    assert (f"error: {path}: field 'parallel.recompute' = 'norm': needs the per-operator cost model "
            "(--cost-model ops), and --cost-model flat was chosen") == res.stderr.strip()
    with pytest.raises(SimtrainError) as exc:
        simtrain.simulate("llama3-8b", "h100-sxm", pp=2, microbatches=4, recompute="norm", cost_model="flat")
    assert str(exc.value) == ("recompute='norm': needs the per-operator cost model (cost_model='ops'), and "
                              "cost_model='flat' was chosen")


def test_fp8_without_a_table_is_named_as_the_argument():
    """`fp8` is an API argument and a flag (no scenario field): named as the argument."""
    with pytest.raises(SimtrainError, match=r"^fp8='gemms': a100-sxm-80gb \(") as exc:
        simtrain.simulate("llama3-8b", "a100-sxm-80gb", pp=4, microbatches=4, fp8="gemms")
    assert not FLAG.search(str(exc.value))
    res = invoke("compare", "--model", "llama3-8b", "--hardware", "a100-sxm-80gb", "--pp", "4", "--microbatches", "4",
                 "--fp8", "gemms", "--json")
    assert res.exit_code == 2 and res.stderr.startswith("error: --fp8 gemms: a100-sxm-80gb ("), res.stderr


def test_interleaving_nothing_is_warned_in_the_inputs_own_words(tmp_path):
    """interleaved-1f1b with vp 1: the warning's setting and its advice name the file's field,
    the API's argument, the flag."""
    path = _scenario(tmp_path, "llama3-8b", "h100-sxm", {"pp": 2, "microbatches": 4, "tp": 8}, ["interleaved-1f1b"])
    res = invoke("compare", path, "--json")
    assert res.exit_code == 0, res.output
    assert (f"interleaved-1f1b: {path}: field 'parallel.vp' = 1: one stage per rank" in res.stderr
            and f"pass {path}: field 'parallel.vp' = 2 or more to interleave" in res.stderr), res.stderr
    with pytest.warns(ScheduleWarning) as caught:
        simtrain.simulate("llama3-8b", "h100-sxm", schedule="interleaved-1f1b", pp=2, microbatches=4, tp=8)
    said = [str(w.message) for w in caught if "interleaved" in str(w.message)]
    assert said and said[0].startswith("interleaved-1f1b: vp=1: one stage per rank") and "pass vp=2 or more" in said[0]
    res = invoke("compare", "--model", "llama3-8b", "--hardware", "h100-sxm", "--pp", "2", "--microbatches", "4",
                 "--tp", "8", "--vp", "1", "--schedules", "interleaved-1f1b", "--json")
    assert "interleaved-1f1b: --vp = 1: one stage per rank" in res.stderr and "pass --vp 2 or more" in res.stderr


def test_a_setting_that_applies_to_nothing_is_named_as_given(tmp_path):
    path = _scenario(tmp_path, "llama3-8b", "h100-sxm", {"pp": 2, "microbatches": 4, "tp": 8, "grad_reduce_op":
                                                         "all-reduce"}, ["1f1b"])
    res = invoke("compare", path, "--json")
    assert res.exit_code == 0
    assert (f"warning: {path}: field 'parallel.grad_reduce_op' = 'all-reduce' is ignored: there is no DP "
            f"gradient reduction with {path}: field 'parallel.dp' = 1") in res.stderr, res.stderr
    with pytest.raises(SimtrainError) as exc:
        simtrain.simulate("llama3-8b", "h100-sxm", pp=2, microbatches=4, tp=8, grad_reduce_op="all-reduce")
    assert str(exc.value) == ("grad_reduce_op='all-reduce': there is no DP gradient reduction with dp=1")


@pytest.mark.parametrize("field, value, needle", [
    ("model", "llama9", "unknown model 'llama9'"),
    ("hardware", "h100x", "unknown hardware 'h100x'"),
])
def test_an_unknown_model_or_hardware_names_the_file_and_field(tmp_path, field, value, needle):
    data = {"model": "llama3-8b", "hardware": "h100-sxm", field: value}
    path = tmp_path / "s.yaml"
    path.write_text(f"model: {data['model']}\nhardware: {data['hardware']}\n")
    res = invoke("compare", str(path), "--json")
    assert res.exit_code == 2 and res.stderr.startswith(f"error: {path}: field '{field}': {needle}"), res.stderr
    # the same name typed as a flag is the flag's problem, not the file's
    res = invoke("compare", _scenario(tmp_path, "llama3-8b", "h100-sxm", {}, ["1f1b"]), f"--{field}", value, "--json")
    assert res.exit_code == 2 and res.stderr.startswith(f"error: {needle}"), res.stderr
