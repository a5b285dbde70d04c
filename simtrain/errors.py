"""The one error type simtrain shows to users, and helpers that build its messages.

Every mistake in user input (a profile file, a model spec, a scenario, a CLI flag, schedule
parameters) and every impossible configuration raises :class:`SimtrainError`. The CLI prints its
message on one line and exits with status 2; nothing else reaches the user as a traceback.
"""

from __future__ import annotations

from pathlib import Path
import math
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator


class SimtrainError(Exception):
    """A user-facing error: bad input or an impossible configuration.

    Args:
        message: one sentence that names the file or flag, the field, the value and what is allowed.
    """


_NUMBER_TYPES = (int, float, int | None, float | None)


class NumbersNotBooleans(BaseModel):
    """Base for user-facing schemas: a YAML ``true``/``false`` given for a number is an error
    (pydantic would silently read it as 1/0), and so is ``.inf`` or ``.nan`` for any float."""

    model_config = ConfigDict(allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_booleans_for_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        field = cls.model_fields.get(info.field_name) if info.field_name else None
        if isinstance(value, bool) and field is not None and field.annotation in _NUMBER_TYPES:
            raise ValueError("expected a number, not true/false")
        return value


def _range_text(gt: float | None, ge: float | None, le: float | None) -> str:
    low = f"> {gt:g}" if gt is not None else f">= {ge:g}" if ge is not None else ""
    high = f"<= {le:g}" if le is not None else ""
    return " and ".join(x for x in (low, high) if x)


def bounded(gt: float | None = None, ge: float | None = None, le: float | None = None) -> Any:
    """A float field type that must be finite and within the given bounds.

    Its error names the whole allowed range, also for ``.inf`` / ``.nan`` (pydantic's own
    ``Field(gt=...)`` says only "should be a finite number" there), e.g. ``must be a finite
    number > 0 and <= 1e+05``.

    Args:
        gt, ge: exclusive / inclusive lower bound (at most one).
        le: inclusive upper bound.

    Returns:
        An ``Annotated[float, ...]`` type for a pydantic field.
    """
    allowed = _range_text(gt, ge, le)

    def check(value: float) -> float:
        ok = math.isfinite(value) and (gt is None or value > gt) and (ge is None or value >= ge) and (
            le is None or value <= le)
        if not ok:
            raise ValueError(f"must be a finite number {allowed}")
        return value

    return Annotated[float, Field(allow_inf_nan=True), AfterValidator(check)]


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


def load_yaml_file(path: Path) -> Any:
    """Read a YAML file safely (:func:`simtrain.loading.load_yaml`: a regular file of bounded
    size, unique keys, bounded alias expansion), every problem a :class:`SimtrainError`.

    Args:
        path: the file to read.

    Returns:
        The parsed document (usually a dict).

    Raises:
        SimtrainError: the file is missing, not a regular file, too large, unreadable, or not
            valid YAML.
    """
    from .loading import load_yaml

    return load_yaml(path)


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
    if data is None:
        raise SimtrainError(f"{source}: the file is empty; expected a mapping of fields")
    if not isinstance(data, dict):
        raise SimtrainError(f"{source}: expected a mapping of fields, got {type(data).__name__}")
    try:
        return cls.model_validate(data)
    except ValidationError as err:
        raise SimtrainError(describe_validation_error(err, source)) from None


class ConfigWarning(UserWarning):
    """A field of a user's config (HuggingFace, Megatron-LM, torchtitan) that simtrain reads but does
    not represent; the CLI prints it as one ``warning: ...`` line."""
