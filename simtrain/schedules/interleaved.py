"""Interleaved 1F1B (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU
Clusters Using Megatron-LM", §2.2.2 and Figure 4 bottom; reference implementation Megatron-LM
``core/pipeline_parallel/schedules.py``: ``get_schedule_table``, ``get_pp_rank_microbatches``,
``forward_backward_pipelining_with_interleaving``).

Each of the ``p`` ranks holds ``v`` model chunks in a *looped* placement: stage ``c·p + r`` on
rank r, so a microbatch loops over the ranks v times. A rank runs ``m·v`` forwards ("virtual
microbatches") and as many backwards, ordered by Megatron's schedule table: microbatches go in
groups of ``p``; each group passes through chunk 0, then chunk 1, ..., then the next group starts
(depth first). Backwards take the same table with the chunks reversed. Rank r then runs the 1F1B
phases with

    warm-up = min(2·(p - r - 1) + (v - 1)·p, m·v) forwards,

so it holds at most ``warm-up + 1`` chunk activations. With unit costs the bubble per rank is
``(p-1)(F+B)`` in chunk units, ``1/v`` of 1F1B's (Megatron §2.2.2).

Megatron needs ``m`` to be a multiple of ``p`` (with its default group size ``p``, a last group
shorter than ``p`` is refused). torch's ``ScheduleInterleaved1F1B`` issues the same orders for
those ``m`` (checked against the recorded orders) and relaxes the rule ("flexible" interleaving,
torch 2.13 ``torch/distributed/pipelining/schedules.py``, ``ScheduleInterleaved1F1B.__init__``
and ``_get_warmup_ops``): with ``rounds = max(1, m // p)`` the group is ``g = m / rounds``
microbatches, which must be whole, and the warm-up is

    warm-up = min((v - 1)·g + 2·(p - r - 1), m·v),

which is Megatron's for ``m`` a multiple of ``p`` (g = p). simtrain's ``interleaved-1f1b``
follows torch there: m = 10 on p = 4 runs in groups of 5, m = 3 in one group of 3, and m = 7 on
p = 2 (3 rounds of 7/3 microbatches) is refused (tests/test_schedules_interleaved_flexible.py checks
every order against torch's). With ``v = 1`` the same rules give torch's ``ScheduleInterleaved1F1B``
with one stage per rank (warm-up ``2(p-r-1)``); Megatron-LM runs plain 1F1B there instead.
"""

from __future__ import annotations

import warnings

from .common import check_common, looped_placement, one_f_one_b_phases
from .ir import Action, Schedule, SettingsError, SettingsWarning


def virtual_microbatches(microbatches: int, vp: int, group: int) -> list[tuple[int, int]]:
    """Megatron's schedule table: the (chunk, microbatch) of each forward a rank issues.

    Args:
        microbatches: m, a multiple of ``group``.
        vp: chunks per rank.
        group: microbatches that pass through one chunk before the next chunk starts.

    Returns:
        ``m·vp`` pairs in issue order; backwards use the same pairs with chunk ``vp-1-c``.
    """
    table = []
    for first in range(0, microbatches, group):
        for chunk in range(vp):
            table += [(chunk, mb) for mb in range(first, first + group)]
    return table


def round_size(name: str, torch_class: str, pp: int, microbatches: int) -> int:
    """Microbatches per round of torch's flexible interleaved schedules: ``m / rounds`` with
    ``rounds = max(1, m // pp)`` (torch 2.13 ``ScheduleInterleaved1F1B.__init__``, the same rule in
    ``ScheduleInterleavedZeroBubble``).

    Raises:
        ScheduleError: m is not a whole number of rounds (naming ``name`` and ``torch_class``).
    """
    rounds = max(1, microbatches // pp)
    if microbatches % rounds:
        raise SettingsError(
            name, {"microbatches": microbatches, "pp": pp}, f"torch's {torch_class} runs "
            f"{rounds} rounds of microbatches and needs m to be a multiple of {rounds}"
        )
    return microbatches // rounds


def looped_actions(
    rank: int, pp: int, vp: int, table: list[tuple[int, int]], backward_kind: str
) -> tuple[list[Action], list[Action]]:
    """Rank ``rank``'s forwards and backwards in looped placement, in the table's order.

    Args:
        rank, pp, vp: the rank, pipeline ranks, chunks per rank.
        table: :func:`virtual_microbatches`.
        backward_kind: "B" (full backward) or "I" (backward for inputs).

    Returns:
        (forwards, backwards), each ``len(table)`` actions on stages ``c·pp + rank``.
    """
    forwards = [Action(chunk * pp + rank, "F", mb) for chunk, mb in table]
    backwards = [Action((vp - 1 - chunk) * pp + rank, backward_kind, mb) for chunk, mb in table]
    return forwards, backwards


def interleaved_1f1b(pp: int, microbatches: int, vp: int = 2) -> Schedule:
    """Megatron-LM's interleaved 1F1B on ``pp`` ranks with ``vp`` chunks each.

    Args:
        pp: pipeline ranks.
        microbatches: m; a multiple of ``max(1, m // pp)`` (any multiple of pp is; see the module
            docstring for torch's flexible rule).
        vp: model chunks (virtual stages) per rank (>= 1).

    Returns:
        The schedule with ``pp·vp`` stages, stage ``c·pp + r`` on rank r (with a
        :class:`ScheduleWarning` when vp = 1, which interleaves nothing).

    Raises:
        ScheduleError: pp < 1, m < 1, vp < 1, or m not a whole number of rounds.
    """
    check_common("interleaved-1f1b", pp, microbatches, vp)
    group = round_size("interleaved-1f1b", "ScheduleInterleaved1F1B", pp, microbatches)
    if vp == 1 and pp > 1:
        warnings.warn(SettingsWarning(
            "interleaved-1f1b", {"vp": vp}, "one stage per rank, so nothing is interleaved; simulating "
            "torch's ScheduleInterleaved1F1B with one stage per rank (1F1B's bubble, warm-up "
            "2(p-r-1) instead of p-r-1); pass {vp} or more to interleave", hints={"vp": 2}), stacklevel=2)
    table = virtual_microbatches(microbatches, vp, group=group)
    orders = []
    for rank in range(pp):
        forwards, backwards = looped_actions(rank, pp, vp, table, "B")
        warmup = 2 * (pp - rank - 1) + (vp - 1) * group
        orders.append(one_f_one_b_phases(forwards, backwards, warmup))
    return Schedule("interleaved-1f1b", microbatches, looped_placement(pp, vp), tuple(orders))
