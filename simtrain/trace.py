"""The trace: what ran when in one simulated (or measured) step. Plain rows and numpy columns; no
SimPy, and pandas only when a table is asked for.

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

A :class:`Trace` keeps the tasks table as source columns (the values as given, rows in any order)
with the order of its rows, and the memory table as rows; :attr:`Trace.table` gives the tasks
table as object arrays, :attr:`Trace.columns` and :attr:`Trace.memory_columns` as typed numpy
arrays (what :mod:`simtrain.metrics` reads, in time linear in the tasks), and
:attr:`Trace.tasks` and :attr:`Trace.memory` as pandas DataFrames (what viz and export read),
each built on first use.

It also names the *lanes* a task is drawn in (timeline rows, trace-viewer threads) and parses
the engine's link-port resource names ``"<link>:<rank>:<out|in>"`` (built by
:class:`simtrain.network.Topology`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
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

_NUMERIC = {"rank": np.int64, "stage": float, "microbatch": float, "start_s": float, "end_s": float,
            "bytes": float, "peer": float}
"""Numpy dtypes of the numeric columns of :attr:`Trace.columns` (None becomes NaN); the others are
object arrays."""

_NULLABLE = frozenset({"stage", "microbatch", "peer"})
"""The numeric columns that hold None for tasks without one (the others are numbers throughout)."""


@dataclass
class Trace:
    """One step's tasks, memory timeline and makespan.

    Build it with :meth:`from_rows` or :meth:`from_columns` (the engine gives its columns in
    task order and the order of the rows, so that each table is built only when it is asked for).

    Attributes:
        source: one equally long sequence per :data:`TRACE_COLUMNS` name, the values as given
            (ints, floats, strings, None), in any order of rows.
        order: the tasks table's rows as indices into ``source``, sorted by (start_s, rank); None
            when ``source`` is in that order already.
        memory_rows: ``(rank, time_s, bytes)`` tuples in the order the changes happened.
        makespan_s: end of the last task (0 for an empty step).
        events: number of tasks executed (engine events, for benchmarks).
        simpy_events: number of SimPy events the run scheduled (benchmarks; 0 when not simulated).
    """

    source: dict[str, Sequence] = field(repr=False)
    memory_rows: list[tuple] = field(repr=False)
    makespan_s: float
    events: int
    simpy_events: int = 0
    order: np.ndarray | None = field(default=None, repr=False)

    @classmethod
    def from_columns(cls, columns: dict[str, Sequence], memory_rows: list[tuple], simpy_events: int = 0) -> Trace:
        """Build a trace from columns.

        Args:
            columns: one equally long sequence per :data:`TRACE_COLUMNS` name, rows in any order
                of time.
            memory_rows: ``(rank, time_s, bytes)`` tuples in the order the changes happened.
            simpy_events: SimPy events the engine scheduled for them (benchmarks).

        Returns:
            The trace, rows sorted stably by (start_s, rank), makespan the largest ``end_s``.

        Raises:
            ValueError: a column is missing or the columns differ in length.
        """
        table = {name: _objects(columns[name]) for name in TRACE_COLUMNS}
        n = len(table["rank"])
        if any(len(col) != n for col in table.values()):
            raise ValueError("trace columns differ in length")
        if n:
            order = np.lexsort((table["rank"].astype(np.int64), table["start_s"].astype(float)))  # stable
            table = {name: col[order] for name, col in table.items()}
        return cls(source=table, memory_rows=list(memory_rows),
                   makespan_s=float(table["end_s"].astype(float).max()) if n else 0.0,
                   events=n, simpy_events=simpy_events)

    @cached_property
    def table(self) -> dict[str, np.ndarray]:
        """The tasks table, one 1-D object array per :data:`TRACE_COLUMNS` name holding the values
        as given (ints, floats, strings, None), rows sorted by (start_s, rank)."""
        return {name: self._column(name, object) for name in TRACE_COLUMNS}

    def _column(self, name: str, dtype: type) -> np.ndarray:
        """Column ``name`` of the tasks table as a ``dtype`` array (``object``: the values themselves)."""
        values = self.source[name]
        if dtype is object:
            col = _objects(values)
        elif isinstance(values, np.ndarray):
            col = values.astype(dtype)
        elif name in _NULLABLE:  # None (no pipeline action, no peer) becomes NaN through objects
            col = _objects(values).astype(dtype)
        else:
            try:  # ints and floats straight to numbers
                col = np.fromiter(values, dtype=dtype, count=len(values))
            except TypeError:  # a None after all
                col = _objects(values).astype(dtype)
        return col if self.order is None else col[self.order]

    def codes(self, name: str) -> tuple[np.ndarray, dict]:
        """Column ``name`` as integer codes: ``(code of each row in row order, {value: code})``,
        a value's code being where it first occurs in :attr:`source` (not dense: codes are below
        the number of rows). Cheaper than the object column where a few values repeat."""
        values = self.source[name]
        distinct: dict = {}
        code = np.fromiter(map(distinct.setdefault, values, range(len(values))), dtype=np.int64, count=len(values))
        return (code if self.order is None else code[self.order]), distinct

    @classmethod
    def from_rows(cls, task_rows: list[tuple], memory_rows: list[tuple], simpy_events: int = 0) -> Trace:
        """Build a trace from rows: tuples in :data:`TRACE_COLUMNS` order, in any order of time
        (see :meth:`from_columns` for the rest)."""
        cols = list(zip(*task_rows)) if task_rows else [()] * len(TRACE_COLUMNS)
        return cls.from_columns(dict(zip(TRACE_COLUMNS, cols)), memory_rows, simpy_events)

    @cached_property
    def columns(self) -> Columns:
        """The tasks table as typed numpy arrays, one per :data:`TRACE_COLUMNS` name, in row
        order: ``rank`` int64; ``stage``, ``microbatch``, ``start_s``, ``end_s``, ``bytes`` and
        ``peer`` float64 (NaN where none); the text columns object arrays. Each column is built
        on first use (metrics read 9 of the 12; building one costs ~5 ms per 10^5 tasks), and
        :meth:`Columns.equal` gives (and keeps) the rows where a column holds a value."""
        return Columns(self)

    @cached_property
    def rows(self) -> list[tuple]:
        """The tasks table as tuples in :data:`TRACE_COLUMNS` order, in row order."""
        return list(zip(*(self.table[name].tolist() for name in TRACE_COLUMNS)))

    @cached_property
    def memory_columns(self) -> dict[str, np.ndarray]:
        """The memory table as numpy arrays: ``rank`` int64, ``time_s`` and ``bytes`` float64."""
        cols = list(zip(*self.memory_rows)) if self.memory_rows else [(), (), ()]
        return {name: np.array(col, dtype=np.int64 if name == "rank" else float)
                for name, col in zip(MEMORY_COLUMNS, cols)}

    @cached_property
    def tasks(self) -> pd.DataFrame:
        """The tasks table as a DataFrame with :data:`TRACE_COLUMNS` (index 0..n-1)."""
        import pandas as pd

        return pd.DataFrame(self.rows, columns=TRACE_COLUMNS)

    @property
    def trace(self) -> pd.DataFrame:
        """The tasks table (the name callers used before the trace had its own module)."""
        return self.tasks

    @cached_property
    def memory(self) -> pd.DataFrame:
        """The memory table as a DataFrame with :data:`MEMORY_COLUMNS`."""
        import pandas as pd

        return pd.DataFrame(self.memory_rows, columns=MEMORY_COLUMNS)


class Columns(Mapping):
    """:attr:`Trace.columns`: a read-only mapping of :data:`TRACE_COLUMNS` names to typed column
    arrays, each built (and kept) on first access."""

    def __init__(self, trace: Trace) -> None:
        self._trace = trace
        self._built: dict[str, np.ndarray] = {}
        self._equal: dict[tuple[str, object], np.ndarray] = {}
        self._codes: dict[str, tuple[np.ndarray, dict]] = {}

    def equal(self, name: str, value: object) -> np.ndarray:
        """The rows where column ``name`` equals ``value`` (``self[name] == value``), as a
        read-only bool array, computed once per (name, value): the report and the memory
        breakdown ask for the same few masks of the text columns (``category == "compute"``,
        ``kind == "B"`` ...). Each is one integer comparison of the column's codes
        (:meth:`Trace.codes`, built once per column), not an element-by-element comparison of
        an object column: a value equals a row's value exactly when it is the same dictionary
        key (``value`` must be hashable; the text columns hold strings and None).

        Raises:
            KeyError: ``name`` is not a :data:`TRACE_COLUMNS` name.
            TypeError: ``value`` is not hashable.
        """
        mask = self._equal.get((name, value))
        if mask is None:
            if name not in TRACE_COLUMNS:
                raise KeyError(name)
            codes = self._codes.get(name)
            if codes is None:
                codes = self._codes[name] = self._trace.codes(name)
            code, distinct = codes
            mask = self._equal[name, value] = code == distinct.get(value, -1)  # (codes are >= 0)
            mask.flags.writeable = False
        return mask

    def __getitem__(self, name: str) -> np.ndarray:
        col = self._built.get(name)
        if col is None:
            if name not in TRACE_COLUMNS:
                raise KeyError(name)
            col = self._built[name] = self._trace._column(name, _NUMERIC.get(name, object))
        return col

    def __iter__(self) -> Iterator[str]:
        return iter(TRACE_COLUMNS)

    def __len__(self) -> int:
        return len(TRACE_COLUMNS)


def _objects(values: Sequence) -> np.ndarray:
    """A 1-D object array holding ``values`` themselves (no conversion; tuples stay elements)."""
    return np.fromiter(values, dtype=object, count=len(values))


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
    import pandas as pd

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


@lru_cache(maxsize=65536)
def held_ports(resources: str) -> tuple[tuple[str, int | None], ...]:
    """The resources of one tasks-table ``resources`` entry, parsed (cached: a trace repeats few
    distinct entries).

    Args:
        resources: resource names joined by ``","`` ("" for none).

    Returns:
        ``(port_kind, port_rank)`` per resource, in order: ``port_kind`` is
        ``"<link>:<direction>"`` for link ports (``port_rank`` the port's rank), else the
        resource's own name (``port_rank`` None: the holding task's rank stands for it).
    """
    out = []
    for name in resources.split(",") if resources else ():
        port = parse_port(name)
        out.append((f"{port[0]}:{port[2]}", port[1]) if port else (name, None))
    return tuple(out)


def held_resources(tasks: pd.DataFrame) -> list[tuple[str, int, str, float, float]]:
    """Every (resource, task) holding in the tasks table, in table order.

    Args:
        tasks: a tasks table (without a ``resources`` column nothing is held).

    Returns:
        ``(port_kind, port_rank, task_kind, start_s, end_s)`` per resource a task held:
        ``port_kind`` is ``"<link>:<direction>"`` for link ports (``port_rank`` the port's rank),
        else the resource's own name (``port_rank`` the task's rank); see :func:`held_ports`.
    """
    if "resources" not in tasks or tasks.empty:
        return []
    out = []
    held = tasks[tasks["resources"].fillna("") != ""]
    for res, kind, rank, start, end in zip(held["resources"], held["kind"], held["rank"], held["start_s"],
                                           held["end_s"]):
        for port_kind, port_rank in held_ports(str(res)):
            out.append((port_kind, int(rank) if port_rank is None else port_rank, kind, start, end))
    return out
