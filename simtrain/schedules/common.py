"""Argument checks and placements shared by the schedule generators."""

from __future__ import annotations

from collections.abc import Iterable

from .ir import ScheduleError


def check_common(name: str, pp: int, microbatches: int, vp: int, allowed_vp: Iterable[int] | None = None) -> None:
    """Validate the arguments every generator takes.

    Args:
        name: schedule name for the message.
        pp: pipeline ranks (>= 1).
        microbatches: microbatches per step (>= 1).
        vp: stages per rank (>= 1).
        allowed_vp: the vp values this schedule supports, or None for any.

    Raises:
        ScheduleError: naming the parameter, its value and what is allowed.
    """
    if pp < 1:
        raise ScheduleError(f"{name}: --pp = {pp}: must be >= 1 pipeline rank")
    if microbatches < 1:
        raise ScheduleError(f"{name}: --microbatches = {microbatches}: must be >= 1")
    if vp < 1:
        raise ScheduleError(f"{name}: --vp = {vp}: must be >= 1 stage per rank")
    if allowed_vp is not None:
        allowed = tuple(allowed_vp)
        if vp not in allowed:
            raise ScheduleError(
                f"{name}: --vp = {vp}: this schedule runs {' or '.join(map(str, allowed))} "
                "stage(s) per rank"
            )


def linear_placement(pp: int) -> tuple[int, ...]:
    """Stage r on rank r."""
    return tuple(range(pp))
