"""1F1B, also called PipeDream-Flush (Narayanan et al. 2021, "PipeDream-2BW", arXiv:2006.09503,
§3; Megatron-LM 2021 §2.2.1, Figure 4 top).

Rank r runs three phases:

1. warm-up: ``min(p - r - 1, m)`` forwards,
2. steady state: one forward then one backward, until every forward has run,
3. cool-down: the remaining backwards.

Rank r therefore holds at most ``min(m, p - r)`` activations, and with unit costs the bubble is
(p-1)(F+B) per rank, as GPipe's. This is the order torch's ``Schedule1F1B`` runs.
"""

from __future__ import annotations

from .common import check_common, linear_placement, one_f_one_b_phases
from .ir import Action, Schedule


def one_f_one_b(pp: int, microbatches: int, vp: int = 1) -> Schedule:
    """One-forward-one-backward on each of ``pp`` ranks.

    Args:
        pp: pipeline ranks (= stages).
        microbatches: microbatches per step (m >= 1).
        vp: stages per rank; must be 1.

    Raises:
        ScheduleError: pp < 1, m < 1 or vp != 1.
    """
    check_common("1f1b", pp, microbatches, vp, allowed_vp=(1,))
    orders = []
    for rank in range(pp):
        forwards = [Action(rank, "F", mb) for mb in range(microbatches)]
        backwards = [Action(rank, "B", mb) for mb in range(microbatches)]
        orders.append(one_f_one_b_phases(forwards, backwards, warmup=pp - rank - 1))
    return Schedule("1f1b", microbatches, linear_placement(pp), tuple(orders))
