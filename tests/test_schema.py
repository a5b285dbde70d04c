"""`simtrain schema`: JSON Schema from the pydantic models, and a field reference in docs/fields.md
that covers every field, with a unit and a description, and is current."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from simtrain.cli import app
from simtrain.schema import SCHEMAS, field_rows, markdown_reference

from conftest import ROOT

runner = CliRunner()


@pytest.mark.parametrize("kind", sorted(SCHEMAS))
def test_schema_prints_the_models_json_schema(kind):
    res = runner.invoke(app, ["schema", kind])
    assert res.exit_code == 0, res.output
    schema = json.loads(res.stdout)
    assert set(schema["properties"]) == set(SCHEMAS[kind].model_fields)
    assert set(schema.get("required", [])) == {n for n, f in SCHEMAS[kind].model_fields.items() if f.is_required()}


def test_unknown_kind_is_one_error():
    res = runner.invoke(app, ["schema", "gpu"])
    assert res.exit_code == 2 and "error: schema: kind = 'gpu'" in res.output


@pytest.mark.parametrize("kind", sorted(SCHEMAS))
def test_every_field_has_a_unit_and_a_description(kind):
    rows = field_rows(SCHEMAS[kind])
    assert len(rows) >= len(SCHEMAS[kind].model_fields)
    for path, _type, _default, unit, description in rows:
        assert unit, path
        assert description, f"{kind}: field '{path}' has no description"
    units = {path: unit for path, _t, _d, unit, _ in rows}
    if kind == "hardware":
        assert units["hbm_gib"].startswith("GiB") and units["intra_node.latency_us"] == "µs"
        assert units["intra_node.bandwidth_gb_per_s"].startswith("GB/s")


def test_the_field_reference_is_current():
    assert (ROOT / "docs" / "fields.md").read_text() == markdown_reference() + "\n"
