"""DualPipeV: DualPipe "cut in half" into one V-shaped pipeline (Sea AI Lab, "Cut-in-half",
hackmd.io/@ufotalent/r1lVXsa9Jg; reference implementation deepseek-ai/DualPipe,
``dualpipe/dualpipev.py`` ``DualPipeV.step()`` at commit 3da1bbe; torch's ``ScheduleDualPipeV``
issues the same orders).

Placement: ``pp`` ranks, ``2·pp`` stages (each a model chunk of half a 1F1B stage), stage r and
stage ``2pp-1-r`` on rank r: every microbatch goes down the ranks through stages ``0 .. pp-1``
and back up through ``pp .. 2pp-1``. Each rank holds two half-size chunks, so its parameters
equal 1F1B's on the same ranks (the DualPipe README's "2x" counts against 1F1B with as many
*stages*, 2·pp).

Cutting DualPipe on ``2·pp`` ranks in half keeps its first ``pp`` ranks: phase 0 is the
descending stage r, phase 1 the ascending stage ``2pp-1-r``, and both phases carry the same
``m`` microbatches. The reference's ``step()`` is then DualPipe's with ``n = pp`` ranks in the
half, position ``k = r`` and ``m`` microbatches per phase, so the eight steps are shared:
:func:`simtrain.schedules.dualpipe.eight_steps`. With unit op-times its bubble and activations
are DualPipe's with the README's PP = 2·pp stages: ``(pp-1)(F&B+B-3W)`` idle per rank when pairs
send at their end, and at most 2·pp+1 stage activations per rank.
"""

from __future__ import annotations

from .common import check_common, v_placement
from .dualpipe import RankProgram, eight_steps
from .ir import Schedule, SettingsError


def dualpipev(pp: int, microbatches: int, vp: int = 1) -> Schedule:
    """DualPipeV on ``pp`` ranks with 2 stages per rank in a V.

    Args:
        pp: pipeline ranks (>= 1); the schedule has 2·pp stages.
        microbatches: m >= 2·pp (the reference asserts ``num_chunks >= num_ranks * 2``; torch:
            at least as many microbatches as stages).
        vp: 1 or 2: the V always holds 2 stages per rank (the registry passes 1).

    Returns:
        The schedule, stage r and 2pp-1-r on rank r, every microbatch on stages 0 .. 2pp-1.

    Raises:
        ScheduleError: pp < 1, m < 2·pp, or vp not in {1, 2}.
    """
    check_common("dualpipev", pp, microbatches, vp, allowed_vp=(1, 2))
    if microbatches < 2 * pp:
        raise SettingsError(
            "dualpipev", {"microbatches": microbatches, "pp": pp}, "DualPipeV needs at least "
            f"as many microbatches as stages, 2 x pp = {2 * pp}"
        )
    stages = 2 * pp
    orders = []
    for r in range(pp):
        program = RankProgram(lambda phase, r=r: (r, stages - 1 - r)[phase], lambda phase, i: i)
        eight_steps(program, n=pp, k=r, chunks=microbatches)
        orders.append(tuple(program.actions))
    return Schedule("dualpipev", microbatches, v_placement(pp), tuple(orders))
