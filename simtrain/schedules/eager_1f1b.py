"""Eager 1F1B: 1F1B with a warm-up of ``2(p - r) - 1`` forwards on rank r instead of ``p - r - 1``,
in the order of PaddlePaddle's auto-parallel ``Eager1F1B`` schedule mode
(``python/paddle/distributed/passes/pipeline_scheduler_pass/pipeline_eager_1f1b.py``,
``PipelineEager1F1BPass._create_job_list``). Its forwards run ahead of 1F1B's, so a forward's
send to the next rank has a slot of compute to hide behind; sail-sg's demo of the building-block
framework of arXiv:2405.15362 (huggingface.co/spaces/sail/pipeline-parallelism-with-controllable-memory,
description2.md) builds it as its example of a schedule that squeezing improves.

Rank r runs, with ``w = 2(p - r) - 1``:

1. warm-up: ``w`` forwards;
2. steady state: one backward then one forward, until every forward has run;
3. cool-down: the remaining ``w`` backwards.

This is the 1F1B phase sequence with ``w - 1`` warm-up forwards
(:func:`simtrain.schedules.common.one_f_one_b_phases`): after the warm-up, a backward and the next
forward alternate either way. Rank r holds at most ``2(p - r) - 1`` activations (rank 0: 2p - 1,
against 1F1B's p). Paddle asserts ``2(p - r) - 1 <= m`` on every rank, so m >= 2p - 1.
"""

from __future__ import annotations

from .common import check_common, linear_placement, one_f_one_b_phases
from .ir import Action, Schedule, SettingsError


def eager_1f1b(pp: int, microbatches: int, vp: int = 1) -> Schedule:
    """Eager 1F1B on ``pp`` ranks, one stage per rank.

    Args:
        pp: pipeline ranks (= stages).
        microbatches: m >= 2·pp - 1 (Paddle's assertion for rank 0).
        vp: stages per rank; must be 1.

    Returns:
        The schedule, stage r on rank r, full backwards.

    Raises:
        ScheduleError: pp < 1, m < 2·pp - 1, or vp != 1.
    """
    check_common("eager-1f1b", pp, microbatches, vp, allowed_vp=(1,))
    if microbatches < 2 * pp - 1:
        raise SettingsError(
            "eager-1f1b", {"microbatches": microbatches, "pp": pp}, "Eager 1F1B warms up with "
            f"2 x pp - 1 = {2 * pp - 1} forwards on rank 0 and needs m >= {2 * pp - 1}"
        )
    orders = []
    for rank in range(pp):
        forwards = [Action(rank, "F", mb) for mb in range(microbatches)]
        backwards = [Action(rank, "B", mb) for mb in range(microbatches)]
        orders.append(one_f_one_b_phases(forwards, backwards, warmup=2 * (pp - rank) - 2))
    return Schedule("eager-1f1b", microbatches, linear_placement(pp), tuple(orders))
