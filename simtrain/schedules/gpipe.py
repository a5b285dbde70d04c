"""GPipe (Huang et al. 2019, arXiv:1811.06965, §2.3 and Figure 2c).

Every rank runs the forward of all m microbatches, then their backwards, in microbatch order
(the order ``torch.distributed.pipelining.ScheduleGPipe`` issues). One stage per rank.
Bubble with unit costs: (p-1)(F+B) per rank; every rank holds all m activations at its peak.
"""

from __future__ import annotations

from .common import check_common, linear_placement
from .ir import Action, Schedule


def gpipe(pp: int, microbatches: int, vp: int = 1) -> Schedule:
    """All forwards, then all backwards, on each of ``pp`` ranks.

    Args:
        pp: pipeline ranks (= stages).
        microbatches: microbatches per step (m >= 1).
        vp: stages per rank; must be 1.

    Returns:
        The schedule, stage r on rank r.

    Raises:
        ScheduleError: pp < 1, m < 1 or vp != 1.
    """
    check_common("gpipe", pp, microbatches, vp, allowed_vp=(1,))
    orders = []
    for stage in range(pp):
        forwards = [Action(stage, "F", mb) for mb in range(microbatches)]
        backwards = [Action(stage, "B", mb) for mb in range(microbatches)]
        orders.append(tuple(forwards + backwards))
    return Schedule("gpipe", microbatches, linear_placement(pp), tuple(orders))
