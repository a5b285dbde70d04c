"""--trace FILE.json.gz writes the same trace-event JSON, gzip-compressed, and simtrain recognises
it as its own when asked to overwrite it."""

from __future__ import annotations

import gzip
import json

from typer.testing import CliRunner

from simtrain.cli import app

ARGS = ["compare", "--model", "llama3-8b", "--hardware", "h100-sxm", "--pp", "4", "--microbatches", "8",
        "--schedules", "1f1b,zbv", "--json"]


def test_gzipped_trace_holds_the_plain_trace(tmp_path):
    runner = CliRunner()
    plain, packed = tmp_path / "t.json", tmp_path / "t.json.gz"
    assert runner.invoke(app, [*ARGS, "--trace", str(plain)]).exit_code == 0
    res = runner.invoke(app, [*ARGS, "--trace", str(packed)])
    assert res.exit_code == 0, res.output
    assert packed.read_bytes()[:2] == b"\x1f\x8b"  # gzip magic
    assert json.loads(gzip.decompress(packed.read_bytes())) == json.loads(plain.read_text())
    assert packed.stat().st_size < plain.stat().st_size / 5
    again = runner.invoke(app, [*ARGS, "--trace", str(packed)])  # simtrain's own file: replaced
    assert again.exit_code == 0, again.output


def test_a_users_gz_file_is_not_replaced_and_other_names_are_refused(tmp_path):
    runner = CliRunner()
    theirs = tmp_path / "theirs.json.gz"
    theirs.write_bytes(gzip.compress(b'{"mine": true}'))
    res = runner.invoke(app, [*ARGS, "--trace", str(theirs)])
    assert res.exit_code == 2 and "was not written by simtrain" in res.output
    res = runner.invoke(app, [*ARGS, "--trace", str(tmp_path / "t.gz")])
    assert res.exit_code == 2 and "expected a .json or .json.gz file name" in res.output
