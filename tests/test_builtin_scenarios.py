"""Built-in scenarios and profiles are package data: a scenario runs by name from any folder and
writes its dashboard there (never into the package); user profile folders are listed and found."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from simtrain.cli import app
from simtrain.errors import ConfigWarning
from simtrain.hardware import PROFILE_DIR, resolve_profile_path
from simtrain.scenario import SCENARIO_DIR, available_scenarios, load_scenario

runner = CliRunner()


def test_a_builtin_scenario_runs_by_name_and_writes_into_the_current_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert "gpipe-microbatches" in available_scenarios()
    scenario = load_scenario(Path("gpipe-microbatches"))  # no such file here: the built-in one
    assert scenario.out == "gpipe-microbatches.html"  # relative to the current folder, not the package
    res = runner.invoke(app, ["compare", "gpipe-microbatches", "--op-times", "1,1,1", "--no-comm", "--schedules",
                              "gpipe"])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "gpipe-microbatches.html").is_file()
    assert not list(SCENARIO_DIR.glob("*.html"))
    res = runner.invoke(app, ["compare", "no-such-scenario"])
    assert res.exit_code == 2 and "not one of the built-in scenarios" in res.output


def test_user_profiles_are_listed_beside_the_builtins_and_found_by_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "hardware_profiles").mkdir()
    shutil.copy(PROFILE_DIR / "h100-sxm.yaml", tmp_path / "hardware_profiles" / "my-h100.yaml")
    extra = tmp_path / "more"
    extra.mkdir()
    shutil.copy(PROFILE_DIR / "mi300x.yaml", extra / "lab-mi300x.yaml")
    res = runner.invoke(app, ["profiles", str(extra)])
    assert res.exit_code == 0, res.output
    for name in ("h100-sxm", "my-h100", "lab-mi300x"):  # the copies keep their name: field, and are warned about
        assert name in res.stdout + res.stderr
    assert "lab-mi300x.yaml: listed as 'mi300x' (its name: field)" in res.stderr
    assert resolve_profile_path("my-h100").resolve() == (tmp_path / "hardware_profiles" / "my-h100.yaml").resolve()
    with pytest.warns(ConfigWarning, match="my-h100.yaml: its profile 'h100-sxm' is shadowed by the built-in"):
        assert resolve_profile_path("h100-sxm").parent == PROFILE_DIR  # a built-in name stays the built-in
    res = runner.invoke(app, ["profiles", str(tmp_path / "missing")])
    assert res.exit_code == 2 and "no such profile file or folder" in res.output
