"""The handcrafted Zero Bubble schedules ZB-H1 and ZB-H2 (Qi et al. 2024, "Zero Bubble Pipeline
Parallelism", ICLR 2024, §2.1-2.2, Figure 3, Table 2; reference: sail-sg/zero-bubble-pipeline-
parallelism, branch ``arxiv``, ``megatron/core/pipeline_parallel/efficiency.py``
``get_hand_schedule``).

The backward is split into I (gradient for the input, on the critical path between stages) and
W (gradient for the weights, needed by nobody downstream). One stage per rank, stage r on rank r.
Both schedules are 1F1B with a warm-up of ``c`` forwards per hop and each W delayed to fill the
cool-down bubble, with ``c = 1`` for ZB-H1 and ``c = 2`` for ZB-H2:

1. warm-up: ``c·(p - r - 1)`` forwards (capped at m);
2. steady state: one forward then one I; the W of each I waits ``c·r`` backward slots, so every
   rank starts its W's when rank 0 does;
3. cool-down: the remaining I's, each followed by a pending W; the last ``c·r`` W's close the step.

With T_F, T_B (the paper's B = our I) and T_W per action and free communication: ZB-H1's bubble
is ``(p-1)(T_F + T_B - T_W)`` per rank and it holds at most p activations (as 1F1B); ZB-H2's
per-rank span bubble is ``(p-1)(T_F + T_B - 2T_W)`` (zero when the three are equal) and it holds
up to ``2p - 1`` (Table 2). ZB-H2's parallelogram needs no synchronisation across ranks before the
optimizer step (the paper's post-validation, §4), which simtrain's per-rank optimizer satisfies.
"""

from __future__ import annotations

from .common import check_common, linear_placement, one_f_one_b_phases
from .ir import Action, Schedule, SettingsError


def _handcrafted(name: str, pp: int, microbatches: int, per_hop: int) -> Schedule:
    """Rank r: warm-up ``per_hop·(p-r-1)`` forwards, W lagging I by ``per_hop·r`` slots."""
    orders = []
    for rank in range(pp):
        forwards = [Action(rank, "F", mb) for mb in range(microbatches)]
        inputs = [Action(rank, "I", mb) for mb in range(microbatches)]
        weights = [Action(rank, "W", mb) for mb in range(microbatches)]
        warmup = per_hop * (pp - rank - 1)
        orders.append(one_f_one_b_phases(forwards, inputs, warmup, weights, weight_lag=per_hop * rank))
    return Schedule(name, microbatches, linear_placement(pp), tuple(orders))


def zb_h1(pp: int, microbatches: int, vp: int = 1) -> Schedule:
    """ZB-H1: 1F1B's warm-up and memory, W delayed by r slots on rank r (ZB paper Figure 3 top).

    Args:
        pp: pipeline ranks (= stages).
        microbatches: m >= 1 (below p the warm-up is capped at m and the bubble grows).
        vp: stages per rank; must be 1.

    Returns:
        The schedule with split backwards, stage r on rank r.

    Raises:
        ScheduleError: pp < 1, m < 1 or vp != 1.
    """
    check_common("zb-h1", pp, microbatches, vp, allowed_vp=(1,))
    return _handcrafted("zb-h1", pp, microbatches, per_hop=1)


def zb_h2(pp: int, microbatches: int, vp: int = 1) -> Schedule:
    """ZB-H2: twice the warm-up forwards, so the W's close every bubble (ZB paper Figure 3 bottom).

    Args:
        pp: pipeline ranks (= stages).
        microbatches: m >= 2·pp (sail-sg's ``get_hand_schedule`` asserts it: the warm-up of rank 0
            alone is 2(p-1) forwards, and the parallelogram needs them all in flight).
        vp: stages per rank; must be 1.

    Returns:
        The schedule with split backwards, stage r on rank r.

    Raises:
        ScheduleError: pp < 1, m < 2·pp or vp != 1.
    """
    check_common("zb-h2", pp, microbatches, vp, allowed_vp=(1,))
    if microbatches < 2 * pp:
        raise SettingsError(
            "zb-h2", {"microbatches": microbatches, "pp": pp}, "ZB-H2 needs m >= 2 x pp = "
            f"{2 * pp} (its warm-up alone is 2(p-1) forwards); use zb-h1 for fewer microbatches"
        )
    return _handcrafted("zb-h2", pp, microbatches, per_hop=2)
