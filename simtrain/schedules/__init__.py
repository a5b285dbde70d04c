"""Schedule generators and the registry that maps names to them.

Each generator is a function ``(pp, microbatches, vp) -> Schedule`` in its own module, reading
like its paper's figure. Add a schedule by writing the module and one line in ``REGISTRY``.

A name may carry variants after ``+`` that change how the schedule is run, not its order:
``1f1b+waved-ep`` is 1F1B with Waved-EP expert overlap (see ``VARIANTS``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from .dualpipe import dualpipe
from .dualpipev import dualpipev
from .gpipe import gpipe
from .interleaved import interleaved_1f1b
from .interleaved_zb import interleaved_zero_bubble
from .ir import Action, ActionKind, OverlapAction, Schedule, ScheduleError, ScheduleWarning, parse_action
from .looped_bfs import looped_bfs
from .one_f_one_b import one_f_one_b
from .zbv import zbv
from .zero_bubble import zb_h1, zb_h2

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
    "interleaved-1f1b": ScheduleInfo(
        interleaved_1f1b, "Interleaved 1F1B, looped placement (Megatron-LM 2021 §2.2.2)", uses_vp=True),
    "looped-bfs": ScheduleInfo(
        looped_bfs, "Breadth-first looped stages (arXiv:2211.05953; torch ScheduleLoopedBFS)", uses_vp=True),
    "interleaved-zb": ScheduleInfo(
        interleaved_zero_bubble, "Interleaved zero bubble (torch ScheduleInterleavedZeroBubble)", uses_vp=True),
    "zb-h1": ScheduleInfo(zb_h1, "ZB-H1: W delayed into the cool-down (Qi et al. 2024 §2.1)"),
    "zb-h2": ScheduleInfo(zb_h2, "ZB-H2: doubled warm-up, zero bubble (Qi et al. 2024 §2.2)"),
    "zbv": ScheduleInfo(zbv, "ZB-V: 2 stages per rank in a V (Qi et al. 2024 §6; torch ScheduleZBVZeroBubble)"),
    "dualpipe": ScheduleInfo(
        dualpipe, "DualPipe: two directions, overlapped F&B pairs (DeepSeek-V3 report §3.2.1)"),
    "dualpipev": ScheduleInfo(
        dualpipev, "DualPipeV: DualPipe cut in half, V placement (Sea AI Lab; deepseek-ai/DualPipe)"),
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
    "ActionKind",
    "OverlapAction",
    "REGISTRY",
    "Schedule",
    "ScheduleError",
    "ScheduleInfo",
    "ScheduleWarning",
    "VARIANTS",
    "generate",
    "parse_action",
    "split_name",
]
