"""The input formats, described by the pydantic models that validate them: JSON Schema for tools
(``simtrain schema model|hardware|scenario``) and a field reference for people (``docs/fields.md``,
written by ``simtrain schema --markdown``).

Units follow the field-name convention of the files (:mod:`simtrain.hardware`): a suffix names the
unit (``_gib``, ``_tb_per_s``, ``_gb_per_s``, ``_us``, ``_tflops``, ``_s``); a field without one is a
count, a flag or a name.
"""

from __future__ import annotations

import inspect
import json
import re
import types
import typing
from typing import Annotated, Any, Literal, get_args, get_origin

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from .hardware import ProfileFile
from .models import ModelSpec
from .scenario import Scenario

SCHEMAS: dict[str, type[BaseModel]] = {"model": ModelSpec, "hardware": ProfileFile, "scenario": Scenario}
"""Document kind -> the pydantic model that validates it."""

_UNITS = (("_tb_per_s", "TB/s (1e12 bytes/s)"), ("_gb_per_s", "GB/s (1e9 bytes/s)"), ("_gib", "GiB (2^30 bytes)"),
          ("_us", "µs"), ("tflops", "TFLOP/s (1e12 FLOP/s)"), ("_bytes", "bytes"), ("_s", "s"))
_SPECIAL_UNITS = {"op_times": "s (F, I, W)", "seq_len": "tokens", "microbatch_size": "sequences",
                  "expert_imbalance": "ratio (max / mean)", "efficiency.matmul": "fraction of peak",
                  "efficiency.link": "fraction of nominal", "overlap.compute_factor": "ratio",
                  "overlap.tp_exposed_fraction": "fraction of the TP collectives"}


def _recompute_values() -> tuple[str, dict[str, Any]]:
    """What a scenario file's ``parallel.recompute`` takes, as :func:`simtrain.scenario.load_scenario`
    reads it (through :func:`simtrain.cost_models.recompute_modules`): a level, torchtitan's
    ``every-second-mm``, or a comma-separated list of operator and group names
    (:mod:`simtrain.costs.recompute`). Returns the type as fields.md shows it and the JSON Schema."""
    from .costs.recompute import ALIASES, EVERY_SECOND_MM, LAYER_OPS

    levels = ["none", "selective", "full", EVERY_SECOND_MM]
    module = "(" + "|".join(re.escape(n) for n in sorted((*LAYER_OPS, *ALIASES), key=lambda n: (-len(n), n))) + ")"
    pattern = rf"^\s*{module}\s*(,\s*{module}\s*)*$"
    text = " \\| ".join(json.dumps(v) for v in levels) + " \\| str (comma-separated module names)"
    return text, {"anyOf": [{"enum": levels}, {"type": "string", "pattern": pattern}], "default": "selective",
                  "title": "Recompute"}


_LOADER_FIELDS = {"scenario": {"parallel.recompute": _recompute_values}}
"""Fields whose file loader takes more than the pydantic model's annotation says (the loader turns
the value into the model's before validating it): per document kind, dotted path -> (type text,
JSON Schema)."""


def _property(schema: dict[str, Any], path: str) -> dict[str, Any]:
    """The properties mapping that holds ``path``'s last field, following ``$ref``s into ``$defs``."""
    node = schema
    *sections, _ = path.split(".")
    for part in sections:
        node = node["properties"][part]
        ref = node.get("$ref") or next((a["$ref"] for a in node.get("allOf", []) if "$ref" in a), None)
        if ref:
            node = schema["$defs"][ref.rsplit("/", 1)[-1]]
    return node["properties"]


def json_schema(kind: str) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12, as pydantic emits it) of one document kind, widened where
    its file loader takes more than the model's annotation (:data:`_LOADER_FIELDS`).

    Raises:
        KeyError: ``kind`` is not one of :data:`SCHEMAS`.
    """
    schema = SCHEMAS[kind].model_json_schema()
    for path, values in _LOADER_FIELDS.get(kind, {}).items():
        _property(schema, path)[path.rsplit(".", 1)[-1]] = values()[1]
    return schema


def _unit(path: str, annotation: Any) -> str:
    if path in _SPECIAL_UNITS:
        return _SPECIAL_UNITS[path]
    leaf = path.rsplit(".", 1)[-1]
    for suffix, unit in _UNITS:
        if leaf.endswith(suffix):
            return unit
    base = [a for a in get_args(annotation) if a is not type(None)] or [annotation]
    if base[0] in (int, float):
        return "count" if base[0] is int else "number"
    return "–"


def _type_name(annotation: Any) -> str:
    origin = get_origin(annotation)
    if origin is Annotated:  # a bounded number (simtrain.errors.bounded): the type, not its checks
        return _type_name(get_args(annotation)[0])
    if origin is Literal:
        return " \\| ".join(json.dumps(a) for a in get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(_type_name(a) for a in get_args(annotation))
    if origin is not None:
        return f"{getattr(origin, '__name__', str(origin))}[{', '.join(_type_name(a) for a in get_args(annotation))}]"
    return "null" if annotation is type(None) else getattr(annotation, "__name__", str(annotation))


def _nested(annotation: Any) -> type[BaseModel] | None:
    for a in (annotation, *get_args(annotation)):
        if isinstance(a, type) and issubclass(a, BaseModel):
            return a
    return None


def attribute_docs(cls: type) -> dict[str, str]:
    """Field descriptions from a class docstring's Google-style ``Attributes:`` section
    (``name: text`` or ``a, b, c: text`` entries, continued on more deeply indented lines)."""
    doc = inspect.getdoc(cls) or ""
    match = re.search(r"^Attributes[^:\n]*:\n", doc, flags=re.M)
    if not match:
        return {}
    entries: list[str] = []
    for line in doc[match.end():].splitlines():
        if re.match(r"^ {4}\S", line):
            entries.append(line.strip())
        elif line.startswith(" " * 8) and entries:
            entries[-1] += " " + line.strip()
        else:
            break
    docs = {}
    for entry in entries:
        head, sep, text = entry.partition(": ")
        if sep and re.fullmatch(r"\w+(, \w+)*", head):
            docs.update({name: text.replace("``", "`") for name in head.split(", ")})
    return docs


def field_rows(model: type[BaseModel], prefix: str = "", wider: dict | None = None) -> list[tuple[str, str, str, str, str]]:
    """``(path, type, default, unit, description)`` for every field of ``model``, sections
    flattened with dotted paths (``intra_node.latency_us``); ``wider``: dotted path -> the
    :data:`_LOADER_FIELDS` entry whose type text replaces the annotation's."""
    rows = []
    docs = attribute_docs(model)
    for name, info in model.model_fields.items():
        path = f"{prefix}{name}"
        nested = _nested(info.annotation)
        factory = info.default is PydanticUndefined and info.default_factory is not None
        default = ("required" if info.is_required() else
                   "(section defaults)" if factory and nested is not None else
                   json.dumps(info.default_factory()) if factory else
                   json.dumps(info.default) if info.default is not PydanticUndefined else "")
        kind = (wider or {})[path]()[0] if path in (wider or {}) else _type_name(info.annotation)
        rows.append((path, kind, default, _unit(path, info.annotation),
                     (info.description or docs.get(name, "")).replace("|", "\\|")))
        if nested is not None:
            rows += field_rows(nested, f"{path}.", wider)
    return rows


def markdown_reference() -> str:
    """The field reference of every document kind as Markdown (what ``docs/fields.md`` holds)."""
    parts = ["# Input formats: every field and its unit", "",
             "Generated by `simtrain schema --markdown` from the pydantic models that validate the files; "
             "`simtrain schema model|hardware|scenario` prints the JSON Schema. A unit suffix in a field's name "
             "gives its unit; descriptions, where the model has one, follow.", ""]
    for kind, model in SCHEMAS.items():
        doc = (model.__doc__ or "").strip().split("\n")[0]
        parts += [f"## {kind} (`{model.__module__}.{model.__name__}`)", "", doc, "",
                  "| field | type | default | unit | description |", "|---|---|---|---|---|"]
        parts += [f"| `{p}` | {t} | {d} | {u} | {desc} |"
                  for p, t, d, u, desc in field_rows(model, wider=_LOADER_FIELDS.get(kind))]
        parts.append("")
    return "\n".join(parts)
