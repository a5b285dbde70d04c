"""V-Half and V-Min: the memory-controllable V schedules of Qi et al., "Pipeline Parallelism with
Controllable Memory" (NeurIPS 2024, arXiv:2405.15362), in the form sail-sg's runtime builds them
for ``--zero-bubble-v-schedule-mem-setup half|min`` (sail-sg/zero-bubble-pipeline-parallelism,
``megatron/core/pipeline_parallel/zerobubble/scheduler/zbv_greedy.py`` at commit 39f2c18; re-derived
here, its orders are the test oracle: ``tests/data/sailsg_v_orders.json``).

Placement is ZB-V's V: rank r holds stage r (chunk 0, on the way down) and stage ``2p-1-r``
(chunk 1, on the way back up); the backward is split into I and W. The paper builds a schedule in
four steps (its Figures 2-4; sail-sg README: V-Half 1/2, V-Min 1/3 of 1F1B's activation memory):

1. **Building block.** One microbatch's four passes on rank r sit at fixed slots of a grid of
   unit-time slots: F of chunk 0, F of chunk 1, I of chunk 1, I of chunk 0 (the W's come later).
   The block is repeated every 6 slots (F, F, I, I, W, W per microbatch and rank). A pass's
   *lifespan*, from its F to its I, sets how many activations a rank holds: V-Min packs the
   passes as tightly as the dependencies allow (one slot per hop), V-Half spaces the descending
   hops two slots apart. A gap ``g`` before the backward keeps the four slots distinct modulo 6.
2. **Weights.** W's fill the idle slots, each after an I that has not had its W yet.
3. **Squeeze.** Repeating the block leaves needless idle slots in the warm-up and cool-down. Going
   through the passes in slot order, each warm-up and cool-down pass moves to the earliest idle
   slot after its dependencies that does not raise the largest peak of any rank; the steady state
   (from the first microbatch's last backward to the last microbatch's first forward) stays.
   Then every pass starts as early as its rank's order and its dependencies allow (unit times).
4. The squeeze is done twice, first with the W's in place, then without them (cool-down only,
   a W then running in any idle slot); the W's are placed again, chunk 1's before chunk 0's.

The bubble and memory follow: with T_F = T_I = T_W, V-Min holds about a third of 1F1B's stage
activations and V-Half a half (sail-sg README table; the project's HF space gives the peaks
(p+4)//3 and (p+2)//2 microbatches against 1F1B's p), at bubble rates about 2/3 and 1/2 of 1F1B's.
"""

from __future__ import annotations

from collections.abc import Callable

from .common import check_common, v_placement
from .ir import Action, Schedule

PERIOD = 6
"""Slots per microbatch and rank in the repeated block: F and I of both chunks, two W's."""
PASSES = ("F0", "F1", "I1", "I0")
"""A block's passes in the order a tie at the same slot is broken (sail-sg's ``FfBb``)."""
WEIGHT = "W"  # one W list while squeezing: any W frees one activation
SPLIT_WEIGHTS = ("W1", "W0")  # the final W's, chunk 1's (the first backward) first

RankSlots = dict[str, list[int]]
"""One rank's passes: kind (``F0``, ``I1``, ``W``, ...) -> slot of each microbatch's pass."""


def v_half(pp: int, microbatches: int, vp: int = 2) -> Schedule:
    """V-Half on ``pp`` ranks: about half of 1F1B's activation memory (arXiv:2405.15362 §4).

    Args:
        pp: pipeline ranks; the schedule has ``2·pp`` stages, r and ``2pp-1-r`` on rank r.
        microbatches: m >= 1 (sail-sg's generator takes any m).
        vp: 1 or 2: the V always holds 2 stages per rank (the registry passes 1).

    Returns:
        The schedule with split backwards (F, I, W).

    Raises:
        ScheduleError: pp < 1, m < 1, or vp not in {1, 2}.
    """
    check_common("v-half", pp, microbatches, vp, allowed_vp=(1, 2))
    return _schedule("v-half", pp, microbatches, _half_block)


def v_min(pp: int, microbatches: int, vp: int = 2) -> Schedule:
    """V-Min on ``pp`` ranks: about a third of 1F1B's activation memory (arXiv:2405.15362 §4).

    Args, Returns, Raises: as :func:`v_half`.
    """
    check_common("v-min", pp, microbatches, vp, allowed_vp=(1, 2))
    return _schedule("v-min", pp, microbatches, _min_block)


def _min_block(p: int, r: int) -> tuple[int, ...]:
    """Rank r's slots of F0, F1, I1, I0 in V-Min's block: one slot per hop down, turn, up, down
    and up again, with a 2-slot gap before the backward when 3 divides p (zbv_greedy.py
    ``stable_pattern_v_min``)."""
    gap = 2 if p % 3 == 0 else 0
    return r, 2 * p - 1 - r, 2 * p + gap + r, 4 * p + gap - 1 - r


def _half_block(p: int, r: int) -> tuple[int, ...]:
    """Rank r's slots in V-Half's block: the descending hops 2 slots apart, the ascending ones 1,
    with a 3-slot gap before the backward when p is even (``stable_pattern_v_half``)."""
    gap = 3 if p % 2 == 0 else 0
    return 2 * r, 3 * p - 2 - r, 3 * p + gap + 2 * r - 1, 6 * p + gap - r - 2


def _schedule(name: str, p: int, m: int, block: Callable[[int, int], tuple[int, ...]]) -> Schedule:
    """Steps 1-4 of the module docstring, then each rank's passes in slot order as actions."""
    slots = [{kind: [start + PERIOD * mb for mb in range(m)] for kind, start in zip(PASSES, block(p, r))}
             for r in range(p)]
    slots = _start_early(_squeeze([_with_weights(s) for s in slots], warmup_too=True, weights=True))
    slots = [{k: s[k] for k in PASSES} for s in slots]
    slots = _start_early([_with_weights(s) for s in _squeeze(slots, warmup_too=False, weights=False)])
    orders = []
    for r, rank in enumerate(slots):
        final = _with_weights({k: rank[k] for k in PASSES}, split=True)
        stage = {"0": r, "1": 2 * p - 1 - r}
        timed = sorted((t, kind, mb) for kind, times in final.items() for mb, t in enumerate(times))
        orders.append(tuple(Action(stage[kind[1]], kind[0], mb) for _, kind, mb in timed))
    return Schedule(name, m, v_placement(p), tuple(orders))


def _with_weights(rank: RankSlots, split: bool = False) -> RankSlots:
    """``rank`` with its W's added (step 2): walking the slots, an idle slot runs a W for an I
    already run (in ``split`` mode chunk 1's W's first); the W's still owed follow the last pass."""
    passes = {t: kind for kind in PASSES for t in rank[kind]}
    kinds = SPLIT_WEIGHTS if split else (WEIGHT,)
    owed = dict.fromkeys(kinds, 0)
    placed: RankSlots = {**rank, **{k: [] for k in kinds}}
    last = max(passes)
    for t in range(last + 1):
        kind = passes.get(t)
        if kind in ("I1", "I0"):
            owed[f"W{kind[1]}" if split else WEIGHT] += 1
        elif kind is None:
            due = next((k for k in kinds if owed[k]), None)
            if due is not None:
                placed[due].append(t)
                owed[due] -= 1
    t = last
    for k in kinds:
        for _ in range(owed[k]):
            t += 1
            placed[k].append(t)
    return placed


def _peak(rank: RankSlots, free_when_idle: bool) -> int:
    """Most activations rank holds, counted in chunk activations: +1 at an F, -1 at a W; without
    W's in ``rank`` (``free_when_idle``), each idle slot runs one owed W (sail-sg ``mem_of_stage``)."""
    delta = {t: (1 if kind[0] == "F" else -1 if kind[0] == "W" else 0) for kind, times in rank.items() for t in times}
    backwards = {t for kind in ("I1", "I0") for t in rank[kind]}
    held = peak = owed = 0
    for t in range(max(delta) + 1):
        if t in delta:
            held += delta[t]
            owed += t in backwards
        elif free_when_idle and owed:
            held, owed = held - 1, owed - 1
        peak = max(peak, held)
    return peak


def _squeeze(slots: list[RankSlots], warmup_too: bool, weights: bool) -> list[RankSlots]:
    """Step 3: move warm-up (if ``warmup_too``) and cool-down passes to their earliest idle slot
    that keeps every rank's peak at or below the largest peak before the squeeze.

    Passes are visited in slot order (ties: lower rank, then :data:`PASSES` order, then W); a
    visited pass's slot is taken. ``slots`` is changed in place and returned.
    """
    kinds = PASSES + ((WEIGHT,) if weights else ())
    cap = max(_peak(rank, free_when_idle=not weights) for rank in slots)
    visits = sorted((t, r, kinds.index(kind), mb) for r, rank in enumerate(slots)
                    for kind, times in rank.items() for mb, t in enumerate(times))
    last_mb = len(slots[0]["F0"]) - 1
    taken: list[set[int]] = [set() for _ in slots]
    phase = "warm-up"
    for t, r, k, mb in visits:
        kind = kinds[k]
        if phase == "warm-up" and kind == "I0" and r == 0:
            phase = "steady"
        if phase == "steady" and kind == "F0" and mb == last_mb:
            phase = "cool-down"
        elif phase != "steady" and (phase == "cool-down" or warmup_too):
            times = slots[r][kind]
            for earlier in range(_earliest(slots, r, kind, mb), t):
                if earlier not in taken[r]:
                    times[mb] = earlier
                    if _peak(slots[r], free_when_idle=not weights) <= cap:
                        break
            else:
                times[mb] = t
        taken[r].add(slots[r][kind][mb])
    return slots


def _waits_for(p: int, r: int, kind: str, mb: int) -> list[tuple[int, str, int]]:
    """The passes ``(rank, kind, microbatch)`` that ``kind`` of microbatch ``mb`` on rank r waits
    for: the same pass of the microbatch before; for F and I also the previous hop (chunk 0's
    passes come from rank r-1, chunk 1's from r+1, I1 after F1 at the turn) and the previous pass
    of the same microbatch on this rank. A W's own I is not among them (see :func:`_earliest`)."""
    deps = [(r, kind, mb - 1)] if mb > 0 else []
    if kind in PASSES:
        neighbour = r - 1 if kind in ("F0", "I1") else r + 1
        if 0 <= neighbour < p:
            deps.append((neighbour, kind, mb))
        if kind != "F0":
            deps.append((r, PASSES[PASSES.index(kind) - 1], mb))
    return deps


def _earliest(slots: list[RankSlots], r: int, kind: str, mb: int) -> int:
    """The first slot after every pass that ``kind`` of microbatch ``mb`` on rank r waits for; a W
    waits for the mb-th backward run on its rank."""
    after = [slots[q][k][b] for q, k, b in _waits_for(len(slots), r, kind, mb)]
    if kind == WEIGHT:
        after.append(sorted(slots[r]["I1"] + slots[r]["I0"])[mb])
    return max(after, default=-1) + 1


def _start_early(slots: list[RankSlots]) -> list[RankSlots]:
    """Every pass at the earliest slot its rank's order and the passes it waits for allow, with
    unit pass times and free communication (sail-sg ``eager_execution_time``). Returns new slots."""
    kinds = PASSES + (WEIGHT,)
    visits = sorted((t, r, kinds.index(kind), mb) for r, rank in enumerate(slots)
                    for kind, times in rank.items() for mb, t in enumerate(times))
    start: list[RankSlots] = [{kind: [0] * len(times) for kind, times in rank.items()} for rank in slots]
    free = [0] * len(slots)  # first free slot of each rank
    for _, r, k, mb in visits:
        kind = kinds[k]
        ready = max([free[r]] + [start[q][d][b] + 1 for q, d, b in _waits_for(len(slots), r, kind, mb)])
        start[r][kind][mb] = ready
        free[r] = ready + 1
    return start
