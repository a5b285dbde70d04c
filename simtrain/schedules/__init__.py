"""Schedule generators and the registry that maps names to them.

Each generator is a function ``(pp, microbatches, vp) -> Schedule`` in its own module, reading
like its paper's figure. Add a schedule by writing the module and one line in ``REGISTRY``.

The registry knows schedule orders only. How a schedule is *run* is not part of it: Waved-EP is a
lowering option (``lower(..., waves=)``, resolved from ``ParallelConfig.waves``); the names
``1f1b+waved-ep`` that compare and scenario files accept for it are parsed at that edge, by
:func:`simtrain.schedules.names.split_name`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .combined_1f1b import interleaved_1f1b_overlap, one_f_one_b_overlap
from .controllable_memory import v_half, v_min
from .dualpipe import dualpipe
from .dualpipev import dualpipev
from .eager_1f1b import eager_1f1b
from .gpipe import gpipe
from .interleaved import interleaved_1f1b
from .interleaved_zb import interleaved_zero_bubble
from .ir import (Action, ActionKind, OverlapAction, Schedule, ScheduleError, ScheduleWarning, SettingsError,
                 SettingsWarning, parse_action)
from .looped_bfs import looped_bfs
from .names import VARIANTS, split_name
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
    "v-half": ScheduleInfo(v_half, "V-Half: V placement, 1/2 of 1F1B's activations (Qi et al. 2024, arXiv:2405.15362)"),
    "v-min": ScheduleInfo(v_min, "V-Min: V placement, 1/3 of 1F1B's activations (Qi et al. 2024, arXiv:2405.15362)"),
    "eager-1f1b": ScheduleInfo(eager_1f1b, "Eager 1F1B: 2(p-r)-1 warm-up forwards (PaddlePaddle Eager1F1B pass)"),
    "1f1b-overlap": ScheduleInfo(
        one_f_one_b_overlap, "1F1B with F&B pairs: Megatron-Core's combined 1F1B for MoE "
        "(--overlap-moe-expert-parallel-comm)"),
    "interleaved-1f1b-overlap": ScheduleInfo(
        interleaved_1f1b_overlap, "Interleaved 1F1B with F&B pairs: Megatron-Core's combined 1F1B "
        "(--overlap-moe-expert-parallel-comm)", uses_vp=True),
}


def generate(name: str, pp: int, microbatches: int, vp: int = 1) -> Schedule:
    """Build the schedule registered as ``name``.

    Raises:
        ScheduleError: unknown name (a run option such as ``+waved-ep`` is not a schedule: see
            :func:`simtrain.schedules.names.split_name`), or parameters the schedule does not allow.
    """
    info = REGISTRY.get(name.strip())
    if info is None:
        base, _, option = name.strip().partition("+")
        if option and base in REGISTRY:
            raise ScheduleError(f"'{name.strip()}': '+{option}' is how a schedule is run (a lowering option), "
                                f"not a schedule order; give '{base}'")
        raise ScheduleError(f"unknown schedule '{name.strip()}': choose from {sorted(REGISTRY)}")
    if vp < 1:
        raise SettingsError(name, {"vp": vp}, "must be >= 1 stage per rank")
    schedule = info.generator(pp, microbatches, vp if info.uses_vp else 1)
    schedule.validate()
    return schedule


__all__ = [
    "Action",
    "ActionKind",
    "OverlapAction",
    "REGISTRY",
    "Schedule",
    "ScheduleError",
    "ScheduleInfo",
    "ScheduleWarning",
    "SettingsError",
    "SettingsWarning",
    "VARIANTS",
    "generate",
    "parse_action",
    "split_name",
]
