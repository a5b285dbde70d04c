"""ZB-V (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", arXiv:2401.10241 v2+, §6, Figure 8),
in the hand-written form of PyTorch's ``ScheduleZBVZeroBubble``
(``torch/distributed/pipelining/schedules.py``, torch 2.13, ``_calculate_single_rank_operations``).

The model is cut into ``2p`` chunks placed in a V: rank r holds stage r (chunk 0 of the rank, on
the way down) and stage ``2p-1-r`` (chunk 1, on the way back up), so the last stage sits on rank 0
next to the first. The backward is split into I and W. With T_F = T_B = T_W (the paper's B is
our I) and free communication every rank is busy from its first to its last action once
``m >= 2p``, while holding at most ``2p`` chunk activations, i.e. p activations of a 1F1B stage
(the same peak as 1F1B; sail-sg README: ZBV bubble 0, memory 1x, communication 2x).

Rank r, with ``n = max(m, 2p - 1)`` microbatches (F0/I0/W0 act on chunk 0, F1/I1/W1 on chunk 1):

1. warm-up 1: ``2(p - r) - 1`` times F0;
2. warm-up 2: ``r`` times F1 F0;
3. warm-up 3: ``p - r`` times F1 I1 W1;
4. steady state: F0 (while some remain) I0 W0 F1 I1 W1, until every F0 and F1 has run;
5. cool-down 1: ``r`` times I0 I1;
6. cool-down 2: ``p - r`` times I0 W0;
7. the remaining W1, then the remaining W0.

For ``m < 2p - 1`` torch generates the schedule for ``2p - 1`` microbatches and leaves the extra
ones' slots idle; simtrain does the same and warns, because the pipeline then never fills.

This is one of two ZB-V variants in circulation: sail-sg's own ``zbv.py`` (a greedy graph
scheduler under a memory limit) issues the same warm-up and steady state but interleaves the
cool-down W's differently. simtrain ships torch's; sail-sg's orders can be simulated by importing
them with ``simtrain compare --schedule-file`` (see :mod:`simtrain.schedules.io`).
"""

from __future__ import annotations

import warnings

from .common import check_common, v_placement
from .ir import Action, Schedule, SettingsWarning


def zbv(pp: int, microbatches: int, vp: int = 2) -> Schedule:
    """ZB-V on ``pp`` ranks, two stages per rank in a V.

    Args:
        pp: pipeline ranks; the schedule has ``2·pp`` stages.
        microbatches: m >= 1; below ``2·pp - 1`` torch's padded schedule is generated, with a
            :class:`ScheduleWarning`.
        vp: 1 or 2: the V always holds 2 stages per rank (the registry passes 1).

    Returns:
        The schedule, stages r and ``2pp-1-r`` on rank r, split backwards.

    Raises:
        ScheduleError: pp < 1, m < 1, or vp not in {1, 2}.
    """
    check_common("zbv", pp, microbatches, vp, allowed_vp=(1, 2))
    n = max(microbatches, 2 * pp - 1)
    if n > microbatches:
        warnings.warn(
            SettingsWarning("zbv", {"microbatches": microbatches, "pp": pp}, "ZB-V fills its pipeline only "
                            f"with m >= 2 x pp - 1 = {n}; simulating torch's padded schedule (built for {n} "
                            "microbatches, the missing ones left idle), which has bubbles"),
            stacklevel=2,
        )
    orders = []
    for rank in range(pp):
        order = _rank_order(pp, rank, n)
        orders.append(tuple(a for a in order if a.microbatch < microbatches))
    return Schedule("zbv", microbatches, v_placement(pp), tuple(orders))


def _rank_order(pp: int, rank: int, n: int) -> list[Action]:
    """Rank ``rank``'s actions for ``n`` microbatches, phase by phase (module docstring)."""
    stage = (rank, 2 * pp - 1 - rank)  # chunk 0 on the way down, chunk 1 on the way up
    count = {(c, k): 0 for c in (0, 1) for k in "FIW"}
    order: list[Action] = []

    def run(*ops: str) -> None:
        for op in ops:  # "F0" = forward of chunk 0, etc.
            kind, chunk = op[0], int(op[1])
            order.append(Action(stage[chunk], kind, count[chunk, kind]))
            count[chunk, kind] += 1

    run(*["F0"] * (2 * (pp - rank) - 1))  # 1. warm-up 1
    for _ in range(rank):  # 2. warm-up 2
        run("F1", "F0")
    for _ in range(pp - rank):  # 3. warm-up 3
        run("F1", "I1", "W1")
    while count[1, "F"] < count[0, "F"] or count[0, "F"] < n:  # 4. steady state
        if count[0, "F"] < n:
            run("F0")
        run("I0", "W0", "F1", "I1", "W1")
    for _ in range(rank):  # 5. cool-down 1
        run("I0", "I1")
    for _ in range(pp - rank):  # 6. cool-down 2
        run("I0", "W0")
    run(*["W1"] * (count[1, "I"] - count[1, "W"]))  # 7. the remaining W's
    run(*["W0"] * (count[0, "I"] - count[0, "W"]))
    return order
