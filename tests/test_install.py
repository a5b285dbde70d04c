"""A clean install works anywhere: the checkout is installed with ``pip install <checkout>`` into a
fresh virtual environment (no system site-packages, dependencies from the package registry as
pip is configured), and the README's first commands run from an empty folder.

A plain (non-editable) install is the point: an editable one reads the package data from the
checkout and would hide files missing from the wheel. The checkout is first copied (tracked and
untracked-but-not-ignored files, as ``git ls-files`` lists them) so the build leaves nothing behind.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT


def _copy_checkout(dest: Path) -> None:
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for rel in filter(None, listed):
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """``(bin folder, empty working folder)`` of a fresh venv with simtrain installed from a copy."""
    if shutil.which("git") is None:
        pytest.fail("git is needed to list the checkout's files")
    base = tmp_path_factory.mktemp("install")
    src, venv, empty = base / "src", base / "venv", base / "empty"
    src.mkdir(), empty.mkdir()
    _copy_checkout(src)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    pip = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(src)],
                         capture_output=True, text=True, timeout=600)
    assert pip.returncode == 0, pip.stderr[-3000:]
    return venv / "bin", empty


def _run(installed, *args: str) -> subprocess.CompletedProcess:
    bin_dir, empty = installed
    return subprocess.run([str(bin_dir / args[0]), *args[1:]], cwd=empty, capture_output=True, text=True,
                          timeout=300)


def test_version_is_the_packages(installed):
    res = _run(installed, "simtrain", "--version")
    assert res.returncode == 0, res.stderr
    version = _run(installed, "python", "-c", "import simtrain; print(simtrain.__version__)").stdout.strip()
    assert res.stdout.strip() == f"simtrain {version}"
    assert version != "0+unknown"


def test_profiles_and_compare_run_from_an_empty_folder(installed):
    listing = _run(installed, "simtrain", "profiles")
    assert listing.returncode == 0, listing.stderr
    for name in ("h100-sxm", "a100-sxm-80gb", "mi300x"):
        assert name in listing.stdout
    res = _run(installed, "simtrain", "compare", "--model", "llama3-8b", "--hardware", "h100-sxm", "--tp", "8",
               "--schedules", "1f1b", "--json")
    assert res.returncode == 0, res.stderr
    [row] = json.loads(res.stdout)
    assert row["schedule"] == "1f1b" and row["step_time_s"] > 0
    api = _run(installed, "python", "-c", "import simtrain; print(repr(simtrain.simulate(model='llama3-8b', "
               "hardware='h100-sxm', tp=8, schedule='1f1b').step_time_s))")
    assert api.returncode == 0, api.stderr
    assert float(api.stdout) == row["step_time_s"]
