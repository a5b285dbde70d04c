"""Schedule generators and the registry that maps names to them.

Each generator is a function ``(pp, microbatches, vp) -> Schedule`` in its own module, reading
like its paper's figure. Add a schedule by writing the module and one line in ``REGISTRY``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .dualpipe import dualpipe
from .dualpipev import dualpipev
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
    "dualpipe": ScheduleInfo(dualpipe, "DualPipe: two directions, overlapped F&B pairs (DeepSeek-V3 report §3.2.1)"),
    "dualpipev": ScheduleInfo(dualpipev, "DualPipeV: DualPipe cut in half, V placement (Sea AI Lab; deepseek-ai/DualPipe)"),
}


def generate(name: str, pp: int, microbatches: int, vp: int = 1) -> Schedule:
    """Build the schedule registered as ``name``.

    Raises:
        ScheduleError: unknown name, or parameters the schedule does not allow.
    """
    info = REGISTRY.get(name)
    if info is None:
        raise ScheduleError(f"unknown schedule '{name}': choose from {sorted(REGISTRY)}")
    if vp < 1:
        raise ScheduleError(f"{name}: --vp = {vp}: must be >= 1 stage per rank")
    schedule = info.generator(pp, microbatches, vp if info.uses_vp else 1)
    schedule.validate()
    return schedule


__all__ = [
    "Action",
    "OverlapAction",
    "REGISTRY",
    "Schedule",
    "ScheduleError",
    "ScheduleInfo",
    "generate",
    "parse_action",
]
