"""A degree or size of 0 is refused wherever a configuration comes from: the ParallelConfig itself,
a CLI flag, a scenario file, a sweep. One ``error:`` line, exit 2, never a report with 0 tokens/s."""

from __future__ import annotations

import pydantic
import pytest
from typer.testing import CliRunner

from simtrain.cli import app
from simtrain.parallel import ParallelConfig

FIELDS = ["dp", "tp", "pp", "vp", "ep", "microbatches", "microbatch_size"]
SMALL = ["--model", "llama3-8b", "--hardware", "h100-sxm", "--schedules", "1f1b", "--json"]
runner = CliRunner()


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


def _one_error_line(res, *needles: str) -> None:
    assert res.exit_code == 2, res.output
    assert res.stdout == ""
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    for needle in needles:
        assert needle in lines[0]


@pytest.mark.parametrize("field", FIELDS)
def test_parallel_config_refuses_zero(field):
    with pytest.raises(pydantic.ValidationError, match=field):
        ParallelConfig(**{field: 0})
    assert getattr(ParallelConfig(**{field: 1}), field) == 1


@pytest.mark.parametrize("field", FIELDS)
def test_cli_flag_zero_is_one_error_line(field):
    flag = "--" + field.replace("_", "-")
    _one_error_line(runner.invoke(app, ["compare", *SMALL, flag, "0"]), f"{flag} = 0", "greater than or equal to 1")


@pytest.mark.parametrize("field", ["dp", "tp", "vp", "microbatch_size"])
def test_scenario_file_zero_is_one_error_line(tmp_path, field):
    sc = tmp_path / "s.yaml"
    sc.write_text(f"model: llama3-8b\nhardware: h100-sxm\nschedules: [1f1b]\nparallel:\n  {field}: 0\n")
    _one_error_line(runner.invoke(app, ["compare", str(sc), "--json"]), str(sc), f"parallel.{field}' = 0")


@pytest.mark.parametrize("field", ["dp", "tp", "microbatch_size"])
def test_sweep_value_zero_is_one_error_line(field):
    _one_error_line(runner.invoke(app, ["compare", *SMALL, "--sweep", f"{field}=0,1"]), "--sweep", f"{field} value 0")
