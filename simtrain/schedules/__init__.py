"""Schedule generators and the registry that maps names to them.

Each generator is a function ``(pp, microbatches, vp) -> Schedule`` in its own module, reading
like its paper's figure. Add a schedule by writing the module and one line in ``REGISTRY``.

A name may carry variants after ``+`` that change how the schedule is run, not its order:
``1f1b+waved-ep`` is 1F1B with Waved-EP expert overlap (see ``VARIANTS``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from .gpipe import gpipe
from .ir import Action, OverlapAction, Schedule, ScheduleError, parse_action
from .one_f_one_b import one_f_one_b

Generator = Callable[[int, int, int], Schedule]


@dataclass(frozen=True)
class ScheduleInfo:
    """A registry entry.

    Attributes:
        generator: ``(pp, microbatches, vp) -> Schedule``.
        description: one line with the source.
        uses_vp: whether the schedule takes ``--vp``; others are generated with vp = 1, so one
            comparison can mix interleaved and plain schedules.
    """

    generator: Generator
    description: str
    uses_vp: bool = False


REGISTRY: dict[str, ScheduleInfo] = {
    "gpipe": ScheduleInfo(gpipe, "GPipe: all forwards then all backwards (Huang et al. 2019)"),
    "1f1b": ScheduleInfo(one_f_one_b, "1F1B / PipeDream-Flush (Narayanan et al. 2021)"),
}


VARIANTS: dict[str, str] = {
    "waved-ep": "Waved-EP: each MoE layer's local experts run in --waves waves, overlapping dispatch, "
                "expert compute and combine (DeepSeek-V4 report §3.1)",
}
"""Run-time variants a schedule name may carry after ``+``."""


def split_name(name: str) -> tuple[str, tuple[str, ...]]:
    """Split ``"dualpipev+waved-ep"`` into the registry name and its variants.

    Returns:
        ``(base, variants)``, e.g. ``("dualpipev", ("waved-ep",))``.

    Raises:
        ScheduleError: unknown base name, unknown or repeated variant.
    """
    base, *variants = name.strip().split("+")
    if base not in REGISTRY:
        raise ScheduleError(f"unknown schedule '{base}': choose from {sorted(REGISTRY)}")
    for v in variants:
        if v not in VARIANTS:
            raise ScheduleError(
                f"schedule '{name}': unknown variant '+{v}'; variants are {['+' + k for k in VARIANTS]}"
            )
    if len(set(variants)) < len(variants):
        raise ScheduleError(f"schedule '{name}': a variant is given twice")
    return base, tuple(variants)


def generate(name: str, pp: int, microbatches: int, vp: int = 1) -> Schedule:
    """Build the schedule registered as ``name`` (variants after ``+`` are kept in its name).

    Raises:
        ScheduleError: unknown name or variant, or parameters the schedule does not allow.
    """
    base, variants = split_name(name)
    info = REGISTRY[base]
    if vp < 1:
        raise ScheduleError(f"{name}: --vp = {vp}: must be >= 1 stage per rank")
    schedule = info.generator(pp, microbatches, vp if info.uses_vp else 1)
    schedule.validate()
    return replace(schedule, name=name.strip()) if variants else schedule


__all__ = [
    "Action",
    "OverlapAction",
    "REGISTRY",
    "Schedule",
    "ScheduleError",
    "ScheduleInfo",
    "VARIANTS",
    "generate",
    "parse_action",
    "split_name",
]
