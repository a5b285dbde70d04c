"""Argument checks, stage placements and the 1F1B-family phases shared by the schedule generators."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from .ir import Action, SettingsError


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
        raise SettingsError(name, {"pp": pp}, "must be >= 1 pipeline rank")
    if microbatches < 1:
        raise SettingsError(name, {"microbatches": microbatches}, "must be >= 1")
    if vp < 1:
        raise SettingsError(name, {"vp": vp}, "must be >= 1 stage per rank")
    if allowed_vp is not None:
        allowed = tuple(allowed_vp)
        if vp not in allowed:
            raise SettingsError(name, {"vp": vp}, f"this schedule runs {' or '.join(map(str, allowed))} "
                                "stage(s) per rank")


def linear_placement(pp: int) -> tuple[int, ...]:
    """Stage r on rank r."""
    return tuple(range(pp))


def looped_placement(pp: int, vp: int) -> tuple[int, ...]:
    """Stage ``c·pp + r`` on rank r for chunk c in 0..vp-1 (Megatron-LM 2021 §2.2.2, Figure 4)."""
    return tuple(s % pp for s in range(pp * vp))


def v_placement(pp: int) -> tuple[int, ...]:
    """Stages r and ``2pp-1-r`` on rank r: a microbatch goes down the ranks and back up (ZB-V,
    Qi et al. 2024 §6; torch's ``generate_stage_to_rank_mapping(style="v")``)."""
    stages = 2 * pp
    return tuple(min(s, stages - 1 - s) for s in range(stages))


def one_f_one_b_phases(
    forwards: Sequence[Action],
    backwards: Sequence[Action],
    warmup: int,
    weights: Sequence[Action] = (),
    weight_lag: int = 0,
) -> tuple[Action, ...]:
    """One rank's order in the three phases of the 1F1B family.

    1. warm-up: the first ``warmup`` forwards;
    2. steady state: one forward then one backward, until every forward has run;
    3. cool-down: the remaining backwards.

    With a split backward (``backwards`` are I actions and ``weights`` the matching W actions,
    ``weights[k]`` belonging to ``backwards[k]``), the W of the k-th backward runs right after the
    ``(k + weight_lag)``-th backward, and the W still pending at the end close the order. This is
    how the Zero Bubble schedules delay W to fill the cool-down bubble (Qi et al. 2024 §2.1).

    Args:
        forwards: the rank's F actions in issue order.
        backwards: the rank's B (or I) actions in issue order, as many as forwards.
        warmup: forwards before the first backward (clipped to ``len(forwards)``).
        weights: the W actions, empty when the backward is not split.
        weight_lag: backward slots each W waits (>= 0).

    Returns:
        The rank's actions in execution order.
    """
    warmup = min(warmup, len(forwards))
    order: list[Action] = list(forwards[:warmup])
    pending_w = 0

    def backward(k: int) -> None:
        nonlocal pending_w
        order.append(backwards[k])
        if weights and k >= weight_lag:
            order.append(weights[pending_w])
            pending_w += 1

    for k in range(len(forwards) - warmup):  # steady state
        order.append(forwards[warmup + k])
        backward(k)
    for k in range(len(forwards) - warmup, len(backwards)):  # cool-down
        backward(k)
    order += weights[pending_w:]
    return tuple(order)
