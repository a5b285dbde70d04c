"""The JSON Schema (`simtrain schema scenario`) accepts what the scenario loader accepts (review 11,
item 3): every shipped scenario, every scenario snippet of the README, and the loader's wider
``parallel.recompute`` values; docs/fields.md shows the real defaults."""

from __future__ import annotations

import re
from pathlib import Path

import jsonschema
import pytest
import yaml

from simtrain.errors import SimtrainError
from simtrain.scenario import SCENARIO_DIR, load_scenario
from simtrain.schema import json_schema

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = json_schema("scenario")


def _schema_accepts(data: dict) -> bool:
    try:
        jsonschema.validate(data, SCHEMA)
    except jsonschema.ValidationError:
        return False
    return True


def _loader_accepts(tmp_path: Path, data: dict) -> bool:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(data))
    try:
        load_scenario(path)
    except SimtrainError:
        return False
    return True


@pytest.mark.parametrize("path", sorted(SCENARIO_DIR.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_shipped_scenario_validates_against_the_schema(path):
    """The built-in scenarios (what `make dashboards` renders) are valid by the schema too."""
    data = yaml.safe_load(path.read_text())
    load_scenario(path)
    jsonschema.validate(data, SCHEMA)


def _readme_snippets() -> list[str]:
    """The README's inline scenario fragments, e.g. ``parallel: {recompute: "norm,swiglu"}``, that
    are YAML with concrete values (not a list of field names such as ``{tp, pp, ...}``)."""
    text = (ROOT / "README.md").read_text()
    found = []
    for snippet in re.findall(r"`((?:parallel|sweep|schedules|op_times): [^`]+)`", text):
        try:
            data = yaml.safe_load(snippet)
        except yaml.YAMLError:
            continue
        section = next(iter(data.values())) if isinstance(data, dict) else None
        if isinstance(section, dict) and any(v is None for v in section.values()):
            continue  # a list of names ({tp, pp, ...}), not values
        found.append(snippet)
    return found


def test_the_readme_has_scenario_snippets():
    assert any("recompute" in s for s in _readme_snippets())


@pytest.mark.parametrize("snippet", _readme_snippets())
def test_every_readme_scenario_snippet_validates_and_loads(tmp_path, snippet):
    data = {"model": "llama3-8b", "hardware": "h100-sxm", **yaml.safe_load(snippet)}
    assert _schema_accepts(data), snippet
    assert _loader_accepts(tmp_path, data), snippet


@pytest.mark.parametrize("recompute, valid", [
    ("none", True), ("selective", True), ("full", True), ("every-second-mm", True),
    ("norm,swiglu", True), ("norm, mla_up", True), ("attn_core", True),
    ("bogus", False), ("norm,", False), ("every-third-mm", False), ("norm,every-second-mm", False),
])
def test_schema_and_loader_agree_on_recompute(tmp_path, recompute, valid):
    """parallel.recompute takes a level, every-second-mm or a module list, by the loader and the
    schema alike (the schema used to say none|selective|full only)."""
    data = {"model": "llama3-8b", "hardware": "h100-sxm", "parallel": {"recompute": recompute}}
    assert _loader_accepts(tmp_path, data) is valid
    assert _schema_accepts(data) is valid


def test_schema_and_fields_md_give_the_schedules_default():
    assert SCHEMA["properties"]["schedules"]["default"] == ["gpipe", "1f1b"]
    row = next(line for line in (ROOT / "docs" / "fields.md").read_text().splitlines()
               if line.startswith("| `schedules` |"))
    assert '["gpipe", "1f1b"]' in row and "{}" not in row
    row = next(line for line in (ROOT / "docs" / "fields.md").read_text().splitlines()
               if line.startswith("| `parallel.recompute` |"))
    assert "every-second-mm" in row and "module names" in row


def test_the_readme_compare_synopsis_names_every_compare_flag():
    """Every option `simtrain compare --help` lists appears in the README's compare synopsis
    (review 11, item 7: it lacked --grad-reduce-dtype, --max-tasks and --moe-coarsen)."""
    import typer

    from simtrain import cli

    command = typer.main.get_command(cli.app).commands["compare"]
    flags = {opt for p in command.params for opt in (*p.opts, *p.secondary_opts) if opt.startswith("--")} - {"--help"}
    text = (ROOT / "README.md").read_text()
    synopsis = text[text.index(".venv/bin/simtrain compare [SCENARIO.yaml]"):text.index(".venv/bin/simtrain export-schedule")]
    named = set(re.findall(r"--[a-z0-9-]+", synopsis))
    assert flags and flags <= named, sorted(flags - named)
