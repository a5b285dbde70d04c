"""Megatron-Core's combined 1F1B for MoE (``--overlap-moe-expert-parallel-comm``): the 1F1B family
with the forward of one microbatch overlapped with the backward of another, so that each one's
expert-parallel all-to-all hides behind the other's compute.

Reference implementation: NVIDIA/Megatron-LM at commit d98e8a64ddf34856e74b24714e3bedb2f5a39553,
``megatron/core/pipeline_parallel/schedules.py`` (``get_pp_rank_microbatches``,
``get_schedule_table``, ``forward_backward_pipelining_with_interleaving``,
``forward_backward_no_pipelining``), ``megatron/core/pipeline_parallel/combined_1f1b.py``
(``combined_1f1b_schedule_for_no_pipelining``,
``combined_1f1b_schedule_for_interleaved_pipelining``) and
``megatron/core/models/common/model_chunk_schedule_plan.py`` (how a pair runs, layer by layer).

What Megatron merges. On rank r of ``p`` with ``v`` model chunks and ``T = m·v`` virtual
microbatches in the order of Megatron's schedule table (:func:`virtual_microbatches`, groups of
``g`` microbatches), the rank runs

1. warm-up: the first ``W`` forwards alone, with
   ``W = min(T, 2·(p - r - 1) + (v - 1)·g + 1)`` -- the interleaved schedule's warm-up plus the
   "one extra micro-batch forward step" Megatron adds under the flag so that the forward and the
   backward of every merged step are independent (``get_pp_rank_microbatches``);
2. steady state: step k is **one** combined step, the forward of virtual microbatch ``W + k``
   and the full backward of virtual microbatch ``k`` (``forward_backward_helper_wrapper`` ->
   ``combined_1f1b_schedule_for_interleaved_pipelining`` -> ``combined_forward_backward_step``):
   here an :class:`~simtrain.schedules.ir.OverlapAction` ``(F;B)OVERLAP_F_B``;
3. cool-down: the last ``W`` backwards alone.

The backward is not split into I and W at the schedule level (Megatron's ``delay_wgrad_compute``
only reorders weight gradients inside a layer of a pair, off by default). With ``p = 1`` Megatron
runs ``combined_1f1b_schedule_for_no_pipelining``: the first forward alone, then
(F of microbatch i+1; B of microbatch i), then the last backward alone -- the same rule with
``W = 1``.

Inside a pair, Megatron runs the backward chunk's head first, then layer by layer "combine_bwd |
dispatch_fwd -> dispatch_bwd | combine_fwd" on the communication stream against "pre_dispatch_fwd
| mlp_bwd -> mlp_fwd | pre_dispatch_bwd" on the compute stream
(``TransformerLayerSchedulePlan.run``): the same backward-first alternation of sub-operations as
simtrain's lowering of DualPipe's MoE pairs (:mod:`simtrain.lowering.moe`), which therefore lowers
these pairs unchanged.

Which ``(p, m, v)`` Megatron accepts. Under the flag, ``pp > 1`` needs a virtual pipeline size
(``TransformerConfig.__post_init__`` asserts ``virtual_pipeline_model_parallel_size is not None``),
so the combined path with ``p > 1`` is always the interleaved function. ``1f1b-overlap`` is that
function with one model chunk per rank (Megatron-Core's API takes
``virtual_pipeline_model_parallel_size=1``; the training script's arguments turn 1 into None and
then refuse), ``interleaved-1f1b-overlap`` the same with ``v`` chunks. The interleaved function
requires the group ``g`` in ``[p, m]`` -- hence ``m >= p`` -- and a last group of 0 or at least
``p`` microbatches. simtrain takes ``g`` as its ``interleaved-1f1b`` does (torch's flexible
rounds: ``g = p`` when p divides m, as Megatron's default), which is a group Megatron accepts
through ``--microbatch-group-size-per-virtual-pipeline-stage``; with one chunk ``g`` does not
change the order. ``p = 1`` with ``v > 1`` is refused as Megatron refuses model chunks without
pipelining (``forward_backward_no_pipelining``).

The orders equal the ones recorded from Megatron's own ``get_pp_rank_microbatches``,
``get_schedule_table`` and ``convert_schedule_table_to_order`` (``scripts/record_megatron_orders.py``,
checked by tests/test_schedules_combined_1f1b.py).

Consequences (unit op-times, free communication, tested): the pairs run back to back, so the
bubble is 1F1B's ``(p-1)(F+B)`` per rank (in chunk units); the time the pairs save is the
all-to-all (and, on layers without experts, TP collectives) that each half hides behind the
other. The doubled warm-up is what allows it: with 1F1B's warm-up plus one (``p - r``), also
enough to make each pair's halves independent, rank r's pair k would wait for rank r+1's pair k,
which waits for rank r's pair k-1, and the bubble grows several-fold. The price is memory: rank r
holds ``min(W + 1, m·v)`` chunk activations at its peak (``1f1b-overlap``'s rank 0: 2p, against
1F1B's p).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

from .common import check_common, looped_placement
from .interleaved import looped_actions, round_size, virtual_microbatches
from .ir import Action, AnyAction, OverlapAction, Schedule, SettingsError, SettingsWarning


def combined_warmup(pp: int, rank: int, vp: int, group: int) -> int:
    """Forwards rank ``rank`` runs before its first combined step, before clipping to ``m·vp``:
    ``2·(pp - rank - 1) + (vp - 1)·group + 1`` (Megatron ``get_pp_rank_microbatches`` with
    ``overlap_moe_expert_parallel_comm``; 1 with ``pp = 1``, the no-pipelining path)."""
    return 2 * (pp - rank - 1) + (vp - 1) * group + 1


def combined_phases(forwards: Sequence[Action], backwards: Sequence[Action], warmup: int) -> tuple[AnyAction, ...]:
    """One rank's order: ``warmup`` forwards, then each remaining forward overlapped with the
    oldest pending backward (one ``OVERLAP_F_B`` pair per step), then the remaining backwards.

    Args:
        forwards, backwards: the rank's F and B actions in issue order, as many of each.
        warmup: forwards before the first pair (clipped to ``len(forwards)``).

    Returns:
        The rank's actions in execution order.
    """
    warmup = min(warmup, len(forwards))
    steady = len(forwards) - warmup
    pairs = [OverlapAction(forwards[warmup + k], backwards[k]) for k in range(steady)]
    return (*forwards[:warmup], *pairs, *backwards[steady:])


def _combined(name: str, pp: int, microbatches: int, vp: int) -> Schedule:
    """The combined 1F1B order on ``pp`` ranks with ``vp`` looped chunks (module docstring)."""
    if microbatches < pp:
        raise SettingsError(
            name, {"microbatches": microbatches, "pp": pp}, "Megatron-Core's combined 1F1B "
            f"needs at least pp = {pp} microbatches (its interleaved schedule takes a microbatch group "
            "between pp and m: megatron/core/pipeline_parallel/schedules.py)")
    if pp == 1 and vp > 1:
        raise SettingsError(
            name, {"vp": vp, "pp": pp}, "Megatron-Core runs one model chunk without pipeline "
            "parallelism (forward_backward_no_pipelining); give {vp} or {pp} or more", hints={"vp": 1, "pp": 2})
    group = microbatches if vp == 1 else round_size(name, "ScheduleInterleaved1F1B", pp, microbatches)
    table = virtual_microbatches(microbatches, vp, group)
    orders = []
    for rank in range(pp):
        forwards, backwards = looped_actions(rank, pp, vp, table, "B")
        orders.append(combined_phases(forwards, backwards, combined_warmup(pp, rank, vp, group)))
    return Schedule(name, microbatches, looped_placement(pp, vp), tuple(orders))


def one_f_one_b_overlap(pp: int, microbatches: int, vp: int = 1) -> Schedule:
    """Megatron-Core's combined 1F1B with one model chunk per rank.

    Args:
        pp: pipeline ranks (= stages).
        microbatches: m >= pp.
        vp: must be 1 (``interleaved-1f1b-overlap`` takes more).

    Raises:
        ScheduleError: pp < 1, m < 1, vp != 1, or m < pp.
    """
    check_common("1f1b-overlap", pp, microbatches, vp, allowed_vp=(1,))
    return _combined("1f1b-overlap", pp, microbatches, 1)


def interleaved_1f1b_overlap(pp: int, microbatches: int, vp: int = 2) -> Schedule:
    """Megatron-Core's combined 1F1B in the interleaved schedule: ``vp`` looped chunks per rank.

    Args:
        pp: pipeline ranks (>= 2 when vp > 1).
        microbatches: m >= pp, a whole number of torch's flexible rounds (any multiple of pp is).
        vp: chunks per rank (>= 1; 1 gives ``1f1b-overlap``'s order, with a warning).

    Returns:
        The schedule with ``pp·vp`` stages, stage ``c·pp + r`` on rank r.

    Raises:
        ScheduleError: pp < 1, m < 1, vp < 1, m < pp, pp = 1 with vp > 1, or m not a whole number
            of rounds.
    """
    check_common("interleaved-1f1b-overlap", pp, microbatches, vp)
    if vp == 1 and pp > 1:
        warnings.warn(SettingsWarning(
            "interleaved-1f1b-overlap", {"vp": vp}, "one stage per rank, so nothing is interleaved; "
            "this is 1f1b-overlap's order; pass {vp} or more to interleave", hints={"vp": 2}), stacklevel=2)
    return _combined("interleaved-1f1b-overlap", pp, microbatches, vp)
