"""Findings of a fresh-eyes review of bad input: each ends in one ``error:`` line naming the file
or flag, the field, the value and what is allowed (exit 2), never a silently wrong answer."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from simtrain.cli import app
from simtrain.errors import SimtrainError

runner = CliRunner()
DATA = Path(__file__).parent / "data"
GPIPE = [DATA / "torch_gpipe_rank0.json", DATA / "torch_gpipe_rank1.json"]
SMALL = ["--model", "llama3-8b", "--hardware", "h100-sxm", "--pp", "4", "--microbatches", "8", "--seq-len", "2048"]


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


# ----------------------------------------------------------------------------- A: overlay
@pytest.mark.parametrize("extra", [["--op-times", "measured"], ["--op-times", "1,1,1"],
                                   ["--hardware", "h100-sxm", "--op-times", "measured"],
                                   ["--model", "llama3-8b"]])
def test_overlay_needs_the_traced_model_and_hardware(extra):
    measured = [a for p in GPIPE for a in ("--measured", p)]
    one_error(invoke("overlay", *measured, *extra), "overlay: give the model and hardware", "--op-times fixes only")
