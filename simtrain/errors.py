"""The one error type simtrain shows to users, and helpers that build its messages.

Every mistake in user input (a profile file, a model spec, a scenario, a CLI flag, schedule
parameters) and every impossible configuration raises :class:`SimtrainError`. The CLI prints its
message on one line and exits with status 2; nothing else reaches the user as a traceback.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError, ValidationInfo, field_validator


class SimtrainError(Exception):
    """A user-facing error: bad input or an impossible configuration.

    Args:
        message: one sentence that names the file or flag, the field, the value and what is allowed.
    """


_NUMBER_TYPES = (int, float, int | None, float | None)


class NumbersNotBooleans(BaseModel):
    """Base for user-facing schemas: a YAML ``true``/``false`` given for a number is an error
    (pydantic would silently read it as 1/0)."""

    @field_validator("*", mode="before")
    @classmethod
    def _no_booleans_for_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        field = cls.model_fields.get(info.field_name) if info.field_name else None
        if isinstance(value, bool) and field is not None and field.annotation in _NUMBER_TYPES:
            raise ValueError("expected a number, not true/false")
        return value


def describe_validation_error(err: ValidationError, source: str) -> str:
    """Turn a pydantic ``ValidationError`` into one readable message.

    Args:
        err: the error pydantic raised.
        source: where the data came from (a file path, or e.g. ``"command line"``).

    Returns:
        ``"<source>: field 'a.b' = <value>: <what is allowed>"``, one such clause per problem,
        joined by ``"; "``.
    """
    parts = []
    for e in err.errors():
        field = ".".join(str(x) for x in e["loc"]) or "(top level)"
        msg = e["msg"]
        if e["type"] == "missing":
            parts.append(f"field '{field}' is missing (required)")
        elif e["type"] == "extra_forbidden":
            parts.append(f"field '{field}' is not a known field")
        elif not e["loc"] or isinstance(e.get("input"), dict):  # a check across fields
            text = msg.removeprefix("Value error, ")
            parts.append(f"section '{field}': {text}" if e["loc"] else text)
        else:
            parts.append(f"field '{field}' = {e.get('input')!r}: {msg.removeprefix('Value error, ')}")
    return f"{source}: " + "; ".join(parts)


_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_yaml_file(path: Path) -> Any:
    """Read a YAML file, turning every I/O or syntax problem into a :class:`SimtrainError`.

    Args:
        path: the file to read.

    Returns:
        The parsed document (usually a dict).

    Raises:
        SimtrainError: the file is missing, unreadable, or not valid YAML.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SimtrainError(f"{path}: file not found") from None
    except IsADirectoryError:
        raise SimtrainError(f"{path}: is a folder, expected a YAML file") from None
    except UnicodeDecodeError:
        raise SimtrainError(f"{path}: not a text (UTF-8) YAML file") from None
    except OSError as exc:
        raise SimtrainError(f"{path}: cannot read the file ({exc.strerror})") from None
    try:
        return yaml.load(text, Loader=_SAFE_LOADER)  # safe_load's loader, in C where libyaml is built in
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise SimtrainError(f"{path}: malformed YAML{where}: {problem}") from None


def validate_model(cls: type[BaseModel], data: Any, source: str) -> Any:
    """Validate ``data`` against a pydantic model, with simtrain's error message on failure.

    Args:
        cls: the pydantic model class.
        data: the parsed input (a dict).
        source: where it came from, for the message.

    Returns:
        The validated instance of ``cls``.

    Raises:
        SimtrainError: ``data`` is not a mapping or does not validate.
    """
    if not isinstance(data, dict):
        raise SimtrainError(f"{source}: expected a mapping of fields, got {type(data).__name__}")
    try:
        return cls.model_validate(data)
    except ValidationError as err:
        raise SimtrainError(describe_validation_error(err, source)) from None


class ConfigWarning(UserWarning):
    """A field of a user's config (HuggingFace, Megatron-LM, torchtitan) that simtrain reads but does
    not represent; the CLI prints it as one ``warning: ...`` line."""
