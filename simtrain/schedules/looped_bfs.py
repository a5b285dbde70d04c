"""Looped BFS (breadth-first pipeline parallelism, Lamy-Poirier 2023, "Breadth-First Pipeline
Parallelism", arXiv:2211.05953; as PyTorch's ``ScheduleLoopedBFS`` issues it,
``torch/distributed/pipelining/schedules.py``, torch 2.13).

Looped placement as interleaved 1F1B (stage ``c·p + r`` on rank r), but breadth first: rank r runs
the forwards of all m microbatches through its first stage, then through its second, and so on;
then the backwards stage by stage in reverse, each stage's microbatches in reverse order (the last
microbatch's gradient arrives first). Like GPipe it holds all ``m·v`` chunk activations at its
peak; it trades memory for fewer switches between stages.
"""

from __future__ import annotations

from .common import check_common, looped_placement
from .ir import Action, Schedule


def looped_bfs(pp: int, microbatches: int, vp: int = 2) -> Schedule:
    """Breadth-first looped schedule on ``pp`` ranks with ``vp`` stages each.

    Args:
        pp: pipeline ranks.
        microbatches: m >= 1.
        vp: stages per rank (>= 1); with 1 it is GPipe with backwards in reverse microbatch order.

    Returns:
        The schedule with ``pp·vp`` stages, stage ``c·pp + r`` on rank r.

    Raises:
        ScheduleError: pp < 1, m < 1 or vp < 1.
    """
    check_common("looped-bfs", pp, microbatches, vp)
    orders = []
    for rank in range(pp):
        stages = [chunk * pp + rank for chunk in range(vp)]
        order = [Action(s, "F", mb) for s in stages for mb in range(microbatches)]
        order += [Action(s, "B", mb) for s in reversed(stages) for mb in reversed(range(microbatches))]
        orders.append(tuple(order))
    return Schedule("looped-bfs", microbatches, looped_placement(pp, vp), tuple(orders))
