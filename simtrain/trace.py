"""The trace: what ran when in one simulated (or measured) step. Pure pandas, no SimPy.

The engine writes it, and metrics, viz, export, measured and overlay read it:

* the **tasks table** (:data:`TRACE_COLUMNS`), one row per executed task, sorted by start time
  then rank: ``rank``, ``stream`` ("" for stream-less transfers), ``category`` (``"compute"`` or
  ``"comm"``), ``kind`` (``F``, ``B``, ``I``, ``W``, ``F&B``, ``OPT``, ``p2p``, ``tp``, ``dp``,
  ``a2a`` ...), ``name``, ``stage`` and ``microbatch`` (the pipeline action, NaN if none),
  ``start_s`` and ``end_s`` (seconds), ``bytes`` moved, ``peer`` (the other rank of a
  point-to-point transfer, NaN if none) and ``resources`` (the engine resources the task held,
  joined by ``","``; empty when none);
* the **memory table** (:data:`MEMORY_COLUMNS`): each rank's memory in bytes after every change,
  beginning with its static memory at time 0;
* the **makespan** (end of the last task, seconds).

It also names the *lanes* a task is drawn in (timeline rows, trace-viewer threads) and parses
the engine's link-port resource names ``"<link>:<rank>:<out|in>"`` (built by
:class:`simtrain.network.Topology`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import pandas as pd

TRACE_COLUMNS = [
    "rank", "stream", "category", "kind", "name", "stage", "microbatch",
    "start_s", "end_s", "bytes", "peer", "resources",
]
"""Columns of the tasks table, one row per executed task (see the module docstring)."""

MEMORY_COLUMNS = ["rank", "time_s", "bytes"]
"""Columns of the memory table: rank, time (s), memory held after the change (bytes)."""

COMPUTE_LANE = "compute"
P2P_LANE = "p2p"


@dataclass
class Trace:
    """One step's tasks table, memory table and makespan.

    Attributes:
        tasks: DataFrame with :data:`TRACE_COLUMNS`, one row per task, sorted by (start_s, rank).
        memory: DataFrame with :data:`MEMORY_COLUMNS`.
        makespan_s: end of the last task (0 for an empty step).
        events: number of tasks executed (engine events, for benchmarks).
        simpy_events: number of SimPy events the run scheduled (benchmarks; 0 when not simulated).
    """

    tasks: pd.DataFrame
    memory: pd.DataFrame
    makespan_s: float
    events: int
    simpy_events: int = 0

    @property
    def trace(self) -> pd.DataFrame:
        """The tasks table (the name callers used before the trace had its own module)."""
        return self.tasks

    @classmethod
    def from_rows(cls, task_rows: list[tuple], memory_rows: list[tuple], simpy_events: int = 0) -> Trace:
        """Build a trace from raw rows.

        Args:
            task_rows: tuples in :data:`TRACE_COLUMNS` order, in any order of time.
            memory_rows: ``(rank, time_s, bytes)`` tuples in the order the changes happened.
            simpy_events: SimPy events the engine scheduled for them (benchmarks).

        Returns:
            The trace, tasks sorted stably by (start_s, rank), makespan the largest ``end_s``.
        """
        tasks = pd.DataFrame(task_rows, columns=TRACE_COLUMNS).sort_values(["start_s", "rank"], kind="stable")
        return cls(
            tasks=tasks.reset_index(drop=True),
            memory=pd.DataFrame(memory_rows, columns=MEMORY_COLUMNS),
            makespan_s=float(tasks["end_s"].max()) if len(tasks) else 0.0,
            events=len(task_rows),
            simpy_events=simpy_events,
        )


def lane_of(category: str, stream: str | None, kind: str) -> str:
    """The lane (timeline row / trace thread) a task is drawn in.

    Args:
        category: ``"compute"`` or ``"comm"``.
        stream: the task's stream ("" or None for stream-less transfers).
        kind: the task's kind (used when a communication task has no stream).

    Returns:
        ``"compute"`` for compute, the stream name for streamed communication, ``"p2p"`` for
        stream-less point-to-point transfers, else the kind.
    """
    if category == "compute":
        return COMPUTE_LANE
    if stream:
        return str(stream)
    return P2P_LANE if kind == "p2p" else str(kind)


def lanes(tasks: pd.DataFrame) -> pd.Series:
    """:func:`lane_of` for every row of a tasks table (a Series aligned with ``tasks``)."""
    return pd.Series(
        [lane_of(c, s, k) for c, s, k in zip(tasks["category"], tasks["stream"], tasks["kind"])],
        index=tasks.index, dtype=object,
    )


def lane_order(names: Iterable[str]) -> list[str]:
    """Lanes in drawing order: compute, tp (it runs between compute tasks), p2p, the other
    communication lanes alphabetically, and dp (gradient reduction, at the end of the step) last."""
    rank = {COMPUTE_LANE: 0, "tp": 1, P2P_LANE: 2, "dp": 4}
    return sorted(set(names), key=lambda n: (rank.get(n, 3), n))


def parse_port(name: str) -> tuple[str, int, str] | None:
    """Split an engine port name ``"<link>:<rank>:<out|in>"`` (see :class:`simtrain.network.Topology`).

    Returns:
        ``(link, rank, direction)``, e.g. ``("nic", 3, "out")``, or None for any other resource name.
    """
    parts = name.split(":")
    if len(parts) == 3 and parts[1].isdigit():
        return parts[0], int(parts[1]), parts[2]
    return None


def held_resources(tasks: pd.DataFrame) -> list[tuple[str, int, str, float, float]]:
    """Every (resource, task) holding in the tasks table, in table order.

    Args:
        tasks: a tasks table (without a ``resources`` column nothing is held).

    Returns:
        ``(port_kind, port_rank, task_kind, start_s, end_s)`` per resource a task held:
        ``port_kind`` is ``"<link>:<direction>"`` for link ports (``port_rank`` the port's rank),
        else the resource's own name (``port_rank`` the task's rank).
    """
    if "resources" not in tasks or tasks.empty:
        return []
    out = []
    held = tasks[tasks["resources"].fillna("") != ""]
    for res, kind, rank, start, end in zip(held["resources"], held["kind"], held["rank"], held["start_s"],
                                           held["end_s"]):
        for name in str(res).split(","):
            port = parse_port(name)
            where = (f"{port[0]}:{port[2]}", port[1]) if port else (name, int(rank))
            out.append((*where, kind, start, end))
    return out
