"""Property-based fuzzing of the command line and of model, hardware and scenario files (issue 15).

Whatever the flags or the file fields, ``simtrain compare`` (in process, through typer's runner)
ends with exit status 0 or 2 and no other exception; exit 2 prints exactly one ``error:`` line;
``--json`` output is strict JSON (no NaN/Infinity); a run never hangs (a generous per-example
bound of :data:`HANG_S`, a hang detector, not a speed claim); and no temporary or half-written
output file is left behind. ``--max-tasks`` keeps every example small, so the whole module runs in
well under a minute (CI: the same 25 examples per property every run); set
``SIMTRAIN_FUZZ_EXAMPLES`` to try more, and ``SIMTRAIN_FUZZ_RANDOM=1`` for new random ones.
"""

from __future__ import annotations

import copy
import json
import os
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from simtrain.cli import app
from simtrain.hardware import PROFILE_DIR
from simtrain.schedules import REGISTRY

runner = CliRunner()
EXAMPLES = int(os.environ.get("SIMTRAIN_FUZZ_EXAMPLES", "25"))
HANG_S = 60.0
MAX_TASKS = "4000"
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=not os.environ.get("SIMTRAIN_FUZZ_RANDOM"),
                database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

TINY = dict(name="tiny", num_layers=8, hidden_size=256, ffn_hidden_size=1024, num_heads=4, num_kv_heads=2,
            vocab_size=2048, seq_len=256, activation="swiglu", norm="rmsnorm")
MOE = dict(TINY, name="tiny-moe", moe=dict(num_experts=8, top_k=2, expert_ffn_hidden_size=512))
H100 = yaml.safe_load((PROFILE_DIR / "h100-sxm.yaml").read_text())
H100["compute"] = dict(elementwise_gb_per_s=dict(norm=1000.0, activation=1000.0, add=1000.0),
                       layer_slowdown=dict(F=1.1, B=1.2), action_overhead_us=5.0, message_overhead_us=2.0,
                       optimizer_gb_per_s=2000.0, processors_per_node=8,
                       linear_tflops=dict(bf16=[dict(tokens=256, fan_in=256, fan_out=256, kind="F", tflops=500.0)]),
                       attention_tflops=dict(bf16=[dict(seq_len=256, head_dim=64, forward_tflops=300.0,
                                                        backward_tflops=250.0)]))

hostile_numbers = st.one_of(
    st.integers(-3, 40), st.sampled_from([0, -1, 2**31, 2**63, 10**6]),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([1e-300, 1e300, 1e308, -0.0, 0.5]))
hostile_values = st.one_of(
    hostile_numbers, st.booleans(), st.none(), st.text(max_size=8),
    st.lists(st.integers(-2, 4), max_size=3), st.dictionaries(st.sampled_from(["a", "F", "bf16"]), st.integers(), max_size=2))
flag_text = st.one_of(hostile_numbers.map(str), st.sampled_from(["", "abc", "nan", "inf", "-inf", "1e999", " 2 "]))
schedule_names = st.sampled_from([*REGISTRY, "1f1b+waved-ep", "dualpipev+waved-ep", "nope", "1f1b+x", ""])

FLAGS = {
    "--pp": st.integers(-1, 12).map(str), "--tp": st.sampled_from(["1", "2", "4", "8", "16", "3"]),
    "--dp": st.integers(0, 8).map(str), "--ep": st.sampled_from(["1", "2", "4", "8", "3"]),
    "--vp": st.integers(0, 4).map(str), "--microbatches": st.integers(-1, 24).map(str),
    "--microbatch-size": st.integers(0, 4).map(str), "--seq-len": st.sampled_from(["0", "64", "256", "4096"]),
    "--dtype": st.sampled_from(["bf16", "fp32", "fp8", "int4"]), "--zero-stage": st.sampled_from(["0", "1", "3"]),
    "--recompute": st.sampled_from(["none", "selective", "full", "some"]),
    "--schedules": st.lists(schedule_names, min_size=0, max_size=3).map(",".join),
    "--waves": st.integers(0, 9).map(str), "--node-limit": st.integers(0, 9).map(str),
    "--expert-imbalance": flag_text, "--dispatch-dtype": st.sampled_from(["bf16", "fp8", "fp4"]),
    "--a2a-links": st.sampled_from(["shared", "separate", "both"]),
    "--op-times": st.one_of(st.sampled_from(["1,1,1", "0,0,0", "1,nan,1", "1,2", "-1,1,1", "inf,1,1"]),
                            st.lists(flag_text, min_size=1, max_size=4).map(",".join)),
    "--sweep": st.sampled_from(["microbatches=4,8", "pp=1,2", "vp=1,2", "tp=1,99", "bogus=1", "microbatches=",
                                "microbatches=0,-1"]),
    "--no-comm": st.none(), "--forward-only": st.none(), "--trace": st.none(), "--csv": st.none(),
}


def _strict_json(text: str):
    def refuse(name):
        raise AssertionError(f"non-finite number {name} in JSON output")
    return json.loads(text, parse_constant=refuse)


def _run(args: list[str], folder: Path):
    """Invoke the CLI in ``folder`` and check the properties every run must have."""
    before = set(folder.iterdir())
    start = time.monotonic()
    res = runner.invoke(app, args)
    assert time.monotonic() - start < HANG_S, args
    assert res.exit_code in (0, 2), (args, res.exit_code, repr(res.exception), res.output[-2000:])
    assert res.exception is None or isinstance(res.exception, SystemExit), (args, repr(res.exception))
    assert "Traceback" not in res.output, (args, res.output[-2000:])
    if res.exit_code == 2:
        errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1, (args, res.stderr)
    if res.exit_code == 0 and "--json" in args:
        _strict_json(res.stdout)
    new = set(folder.iterdir()) - before
    assert not [p for p in new if ".tmp" in p.name], (args, new)  # no temporary file left
    for p in new:  # outputs are whole: parseable to the end
        if p.suffix == ".json":
            _strict_json(p.read_text())
        elif p.suffix == ".csv":
            assert p.read_text().endswith("\n")
        p.unlink()
    return res


@pytest.fixture
def folder(tmp_path_factory, monkeypatch):
    path = tmp_path_factory.mktemp("fuzz")
    monkeypatch.chdir(path)
    for name, spec in (("tiny.yaml", TINY), ("moe.yaml", MOE)):
        (path / name).write_text(yaml.safe_dump(spec))
    return path


@FUZZ
@given(model=st.sampled_from(["tiny.yaml", "moe.yaml"]),
       flags=st.dictionaries(st.sampled_from(sorted(FLAGS)), st.none(), max_size=6).flatmap(
           lambda chosen: st.fixed_dictionaries({k: FLAGS[k] for k in chosen})))
def test_fuzz_cli_flags(folder, model, flags):
    args = ["compare", "--model", model, "--hardware", "h100-sxm", "--json", "--max-tasks", MAX_TASKS]
    for flag, value in flags.items():
        if flag in ("--trace", "--csv"):
            args += [flag, "out" + (".json" if flag == "--trace" else ".csv")]
        elif value is None:
            args.append(flag)
        else:
            args += [flag, value]
    _run(args, folder)


def _leaves(tree, prefix=()):
    """Paths to every leaf of a nested dict/list document."""
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from _leaves(v, (*prefix, k))
    elif isinstance(tree, list) and tree:
        for i, v in enumerate(tree):
            yield from _leaves(v, (*prefix, i))
    else:
        yield prefix


def _set(tree, path, value):
    node = tree
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value


def _get(tree, path):
    for key in path:
        tree = tree[key]
    return tree


scales = st.sampled_from([0, -1, 0.5, 2, 3, 1000, 1e-9, float("nan"), float("inf")])
"""Factors applied to a numeric field's own value: near-valid edits that reach the simulation."""


def _mutations(base: dict):
    paths = list(_leaves(base))
    edit = st.one_of(st.tuples(st.just("set"), hostile_values), st.tuples(st.just("scale"), scales))
    return st.lists(st.tuples(st.sampled_from(paths), edit), min_size=1, max_size=3)


def _write_mutated(folder: Path, name: str, base: dict, edits) -> Path:
    doc = copy.deepcopy(base)
    for path, (how, value) in edits:
        old = _get(doc, path)
        if how == "scale" and isinstance(old, (int, float)) and not isinstance(old, bool):
            new = old * value
            value = int(new) if isinstance(old, int) and float(new).is_integer() else new
        elif how == "scale":
            continue
        _set(doc, path, value)
    path = folder / name
    path.write_text(yaml.safe_dump(doc, allow_unicode=True))
    return path


@FUZZ
@given(base=st.sampled_from([TINY, MOE]), edits=st.data())
def test_fuzz_model_fields(folder, base, edits):
    chosen = edits.draw(_mutations(base))
    path = _write_mutated(folder, "m.yaml", base, chosen)
    extra = ["--ep", "2", "--dp", "2"] if base is MOE else []
    _run(["compare", "--model", str(path), "--hardware", "h100-sxm", "--pp", "2", "--microbatches", "4",
          "--schedules", "1f1b,zbv", "--json", "--max-tasks", MAX_TASKS, *extra], folder)


@FUZZ
@given(edits=_mutations(H100))
def test_fuzz_hardware_fields(folder, edits):
    path = _write_mutated(folder, "hw.yaml", H100, edits)
    _run(["compare", "--model", "tiny.yaml", "--hardware", str(path), "--pp", "2", "--microbatches", "4",
          "--tp", "2", "--schedules", "1f1b,dualpipev", "--json", "--max-tasks", MAX_TASKS], folder)


SCENARIO = dict(title="fuzz", model="tiny.yaml", hardware="h100-sxm",
                parallel=dict(pp=2, tp=1, dp=2, vp=2, microbatches=4, microbatch_size=1, seq_len=256,
                              zero_stage=1, recompute="full", dp_buckets=2),
                schedules=["1f1b", "interleaved-1f1b"], op_times=[1.0, 1.0, 1.0], no_comm=False,
                sweep=dict(microbatches=[2, 4]))


@FUZZ
@given(edits=_mutations(SCENARIO))
def test_fuzz_scenario_fields(folder, edits):
    path = _write_mutated(folder, "s.yaml", SCENARIO, edits)
    _run(["compare", str(path), "--json", "--max-tasks", MAX_TASKS], folder)
