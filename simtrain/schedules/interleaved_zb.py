"""Interleaved Zero Bubble: PyTorch's ``ScheduleInterleavedZeroBubble``
(``torch/distributed/pipelining/schedules.py``, torch 2.13), which implements the ZB1P idea of
Qi et al. 2024 ("Zero Bubble Pipeline Parallelism", ICLR 2024, §2-3) on interleaved stages.

Placement and issue order are interleaved 1F1B's (looped placement, stage ``c·p + r`` on rank r;
Megatron's schedule table, :mod:`simtrain.schedules.interleaved`), with the backward split into
I (input gradient) and W (weight gradient):

* warm-up: ``min((v - 1)·g + (p - r - 1), m·v)`` forwards, one hop per rank instead of
  interleaved 1F1B's two, because I alone is on the critical path;
* steady state and cool-down: one forward then one I; the W of each I waits ``r`` backward slots
  (rank r runs ``r`` I's without W first), then follows the I it lags; W still pending run last.

torch groups microbatches in ``rounds = max(1, m // p)`` rounds of ``g = m / rounds`` (its
relaxation of Megatron's m-multiple-of-p rule) and needs ``m`` to be a multiple of ``rounds``.
With ``v = 1`` this is ZB-H1 (:mod:`simtrain.schedules.zero_bubble`); torch's bubble-padding pass
only inserts idle slots, which a simulator derives from the dependencies.
"""

from __future__ import annotations

from .common import check_common, looped_placement, one_f_one_b_phases
from .interleaved import looped_actions, round_size, virtual_microbatches
from .ir import Action, Schedule


def interleaved_zero_bubble(pp: int, microbatches: int, vp: int = 2) -> Schedule:
    """torch's interleaved zero-bubble schedule on ``pp`` ranks with ``vp`` chunks each.

    Args:
        pp: pipeline ranks.
        microbatches: m; must be a multiple of ``max(1, m // pp)`` (torch's rounds).
        vp: model chunks per rank (>= 1).

    Returns:
        The schedule with ``pp·vp`` stages, stage ``c·pp + r`` on rank r, split backwards.

    Raises:
        ScheduleError: pp < 1, m < 1, vp < 1, or m not a multiple of the number of rounds.
    """
    check_common("interleaved-zb", pp, microbatches, vp)
    group = round_size("interleaved-zb", "ScheduleInterleavedZeroBubble", pp, microbatches)
    table = virtual_microbatches(microbatches, vp, group)
    orders = []
    for rank in range(pp):
        forwards, inputs = looped_actions(rank, pp, vp, table, "I")
        weights = [Action(a.stage, "W", a.microbatch) for a in inputs]
        warmup = (vp - 1) * group + (pp - rank - 1)
        orders.append(one_f_one_b_phases(forwards, inputs, warmup, weights, weight_lag=rank))
    return Schedule("interleaved-zb", microbatches, looped_placement(pp, vp), tuple(orders))
