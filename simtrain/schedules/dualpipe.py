"""DualPipe: two pipelines running in opposite directions over the same ranks, with overlapped
forward-and-backward pairs (DeepSeek-V3 Technical Report, arXiv:2412.19437, §3.2.1 and Figure 5;
reference implementation deepseek-ai/DualPipe, ``dualpipe/dualpipe.py`` ``DualPipe.step()`` at
commit 3da1bbe).

Placement: ``pp`` ranks (even) and ``2·pp`` stages. Direction 0 runs stages ``0 .. pp-1`` with
stage s on rank s; direction 1 runs stages ``pp .. 2pp-1`` with stage ``pp+k`` on rank
``pp-1-k``. Both directions compute the same ``pp`` model chunks (stage ``pp+k`` computes chunk
k), so each rank holds two different chunks: twice 1F1B's parameters. Microbatches
``0 .. m/2-1`` flow in direction 0, ``m/2 .. m-1`` in direction 1.

Each rank is a mirror pair with rank ``pp-1-r``: its *half rank* is ``k = min(r, pp-1-r)`` and
``n = pp/2`` ranks form one half. On the first half "phase 0" is direction 0 and "phase 1"
direction 1; on the second half the two are swapped (the reference's ``phase ^=
is_in_second_half``). Every rank then runs the reference's eight steps (see
:func:`eight_steps`), with ``c = m/2`` microbatches per direction:

====  ==============  ==============  =====================================================
step  reference name  count           what runs
====  ==============  ==============  =====================================================
1     nF0             2(n-k-1)        warm-up forwards of phase 0
2     nF0F1           k+1             a forward of phase 0, then one of phase 1
3     nB1W1F1         n-k-1           backward of phase 1 split into I then W (zero bubble),
                                      forward of phase 1
4     nF0B1F1B0       c-2n+k+1        main step: two overlapped pairs (F0 & B1), (F1 & B0);
                                      the middle ranks run their first F0, B1 un-overlapped
5     nB1F1B0         n-k-1           backward of phase 1, pair (F1 & B0)
6     nB1B0           k+1             backwards of phase 1 and 0; from the middle of the
                                      step on they are split (I now, W deferred)
7     nWB0            n-k-1           a deferred W, then a split backward of phase 0
8     nW              k+1             the remaining deferred W
====  ==============  ==============  =====================================================

Deferred W run first in, first out (the reference's ``WeightGradStore`` queue). Overlapped pairs
use the full backward B, as the reference does.

With unit op-times (F = I = W = 1, B = 2, F&B = 3) and free communication, every rank's idle
time over the step equals the DualPipe README's bubble ``(PP/2-1)(F&B+B-3W)`` (PP = pp, the stages
of one direction) when a pair's outputs leave at the end of the pair, as the README's figure draws
it; when each half's output leaves as soon as that half is done (simtrain's default, see
:mod:`simtrain.lowering.chains`) it is up to one layer slice per bubble step shorter. Every rank holds at
most PP+1 activations (the README's "PP+1").
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from .common import check_common
from .ir import Action, AnyAction, OverlapAction, Schedule, ScheduleError, SettingsError


class RankProgram:
    """The order one rank issues its actions in, built call by call like the reference's ``step()``.

    Args:
        stage_of: ``stage_of(phase)`` is the global stage the rank runs in phase 0 or 1.
        microbatch_of: ``microbatch_of(phase, i)`` is the global microbatch of the rank's i-th
            forward (or backward) in that phase; each phase runs its microbatches in order.

    The rank keeps, like the reference, a forward and a backward counter per phase and a FIFO
    queue of deferred weight gradients.
    """

    def __init__(self, stage_of: Callable[[int], int], microbatch_of: Callable[[int, int], int]):
        self._stage_of = stage_of
        self._microbatch_of = microbatch_of
        self._next = {("F", 0): 0, ("F", 1): 0, ("B", 0): 0, ("B", 1): 0}
        self._deferred_w: deque[Action] = deque()
        self.actions: list[AnyAction] = []

    def _take(self, kind: str, phase: int) -> tuple[int, int]:
        i = self._next[(kind, phase)]
        self._next[(kind, phase)] = i + 1
        return self._stage_of(phase), self._microbatch_of(phase, i)

    def _forward(self, phase: int) -> Action:
        stage, mb = self._take("F", phase)
        return Action(stage, "F", mb)

    def _backward(self, phase: int, zero_bubble: bool) -> Action:
        stage, mb = self._take("B", phase)
        if not zero_bubble:
            return Action(stage, "B", mb)
        self._deferred_w.append(Action(stage, "W", mb))
        return Action(stage, "I", mb)

    def forward(self, phase: int) -> None:
        """Forward of the next microbatch of ``phase``."""
        self.actions.append(self._forward(phase))

    def backward(self, phase: int, zero_bubble: bool = False) -> None:
        """Backward of the next microbatch of ``phase``: full B, or, with ``zero_bubble``, the
        input-gradient part I now and W queued for :meth:`weight`."""
        self.actions.append(self._backward(phase, zero_bubble))

    def weight(self) -> None:
        """The oldest deferred weight gradient W.

        Raises:
            ScheduleError: nothing is deferred (a generator bug).
        """
        if not self._deferred_w:
            raise ScheduleError("DualPipe step asks for a deferred W but none is queued")
        self.actions.append(self._deferred_w.popleft())

    def overlapped(self, forward_phase: int, backward_phase: int) -> None:
        """An overlapped pair: forward of ``forward_phase`` with full backward of ``backward_phase``."""
        fwd = self._forward(forward_phase)
        self.actions.append(OverlapAction(fwd, self._backward(backward_phase, zero_bubble=False)))


def eight_steps(rank: RankProgram, n: int, k: int, chunks: int) -> None:
    """Issue the eight steps of deepseek-ai/DualPipe's ``step()`` on one rank.

    Shared by DualPipe and DualPipeV, whose ``step()`` bodies are the same with these names.

    Args:
        rank: the program to append to.
        n: ranks in one half (DualPipe: ``pp/2``; DualPipeV: ``pp``).
        k: this rank's position in its half (DualPipe: ``min(r, pp-1-r)``; DualPipeV: ``r``).
        chunks: microbatches per phase (DualPipe: ``m/2``; DualPipeV: ``m``); ``>= 2n``.
    """
    turning = k == n - 1  # where the two phases meet (DualPipe's middle ranks, DualPipeV's last)

    for _ in range(2 * (n - k - 1)):  # Step 1: nF0
        rank.forward(0)

    for _ in range(k + 1):  # Step 2: nF0F1
        rank.forward(0)
        rank.forward(1)

    for _ in range(n - k - 1):  # Step 3: nB1W1F1 (zero bubble)
        rank.backward(1, zero_bubble=True)
        rank.weight()
        rank.forward(1)

    for i in range(chunks - 2 * n + k + 1):  # Step 4 (main step): nF0B1F1B0
        if i == 0 and turning:  # the reference does not overlap these two, to shrink the bubble
            rank.forward(0)
            rank.backward(1)
        else:
            rank.overlapped(0, 1)
        rank.overlapped(1, 0)

    for _ in range(n - k - 1):  # Step 5: nB1F1B0
        rank.backward(1)
        rank.overlapped(1, 0)

    middle = (k + 1) // 2  # Step 6: nB1B0, zero bubble from the middle of the step on
    for i in range(k + 1):
        rank.backward(1, zero_bubble=i > middle or (i == middle and k % 2 == 1))
        rank.backward(0, zero_bubble=i >= middle)

    for _ in range(n - k - 1):  # Step 7: nWB0 (zero bubble)
        rank.weight()
        rank.backward(0, zero_bubble=True)

    for _ in range(k + 1):  # Step 8: nW
        rank.weight()


def dualpipe(pp: int, microbatches: int, vp: int = 1) -> Schedule:
    """DualPipe on ``pp`` ranks (2·pp stages, two directions sharing ``pp`` model chunks).

    Args:
        pp: pipeline ranks; even.
        microbatches: m, even and >= 2·pp (the reference asserts ``num_chunks % 2 == 0 and
            num_chunks >= num_ranks * 2``; the paper only says divisible by 2).
        vp: must be 1 (each rank always holds one stage per direction).

    Returns:
        The schedule with ``stage_chunk`` (stage pp+k computes chunk k) and ``paths``.

    Raises:
        ScheduleError: pp < 1, odd pp, m < 1, odd m, m < 2·pp, or vp != 1.
    """
    check_common("dualpipe", pp, microbatches, vp, allowed_vp=(1,))
    if pp % 2:
        raise SettingsError("dualpipe", {"pp": pp}, "DualPipe needs an even number of pipeline ranks "
                            "(rank r is paired with rank pp-1-r)")
    if microbatches % 2 or microbatches < 2 * pp:
        raise SettingsError(
            "dualpipe", {"microbatches": microbatches, "pp": pp}, "DualPipe needs an even number "
            f"of microbatches, at least 2 x pp = {2 * pp} (half flow in each direction; "
            "deepseek-ai/DualPipe asserts this)"
        )
    half = microbatches // 2
    stage_to_rank = tuple(range(pp)) + tuple(reversed(range(pp)))
    orders = []
    for r in range(pp):
        second_half = int(r >= pp // 2)
        stages = (r, 2 * pp - 1 - r)  # by direction

        def stage_of(phase: int, stages=stages, second_half=second_half) -> int:
            return stages[phase ^ second_half]

        def microbatch_of(phase: int, i: int, second_half=second_half) -> int:
            return (phase ^ second_half) * half + i

        program = RankProgram(stage_of, microbatch_of)
        eight_steps(program, n=pp // 2, k=min(r, pp - 1 - r), chunks=half)
        orders.append(tuple(program.actions))
    return Schedule(
        "dualpipe",
        microbatches,
        stage_to_rank,
        tuple(orders),
        stage_chunk=tuple(range(pp)) * 2,
        paths=tuple(tuple(range(pp)) if mb < half else tuple(range(pp, 2 * pp)) for mb in range(microbatches)),
    )
