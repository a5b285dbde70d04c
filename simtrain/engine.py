"""The discrete-event engine: runs a task graph on SimPy and records what ran when.

The engine knows tasks, streams, resources and memory deltas, nothing about schedules:

* A :class:`Task` has a duration, dependencies (task ids), optionally a *stream* and optionally
  *resources*. Tasks of one ``(rank, stream)`` run one after another in the order the graph lists
  them (like a CUDA stream). Tasks with no stream start as soon as their dependencies are done.
* Resources (link ports, NICs) have capacity 1. A task takes all of its resources at once, when
  all are free, and holds them for its whole duration; waiting tasks are served first come, first
  served, a later one going ahead only when everything it needs is free (no task holds one port
  while it waits for another). Transfers that share a port therefore run one after the other: two
  equal transfers that start together on one port end at T and 2T, where fair bandwidth sharing
  would end both at 2T. The time a port is busy, and when the last transfer ends, are the same.
* Memory deltas (bytes, per rank) are applied when a task starts or ends; the engine keeps a
  memory timeline per rank starting from each rank's static memory.
* Shared processors: a task may name a *processor pool* of the graph (``TaskGraph.pools``, name ->
  number of processors). Its duration is then work, done at rate ``min(1, processors / running)``
  while ``running`` tasks of the pool are in progress (egalitarian processor sharing, Kleinrock
  1967, "Time-shared systems: a theoretical treatment", JACM 14(2)): one task on a free pool takes
  its duration; two equal tasks that start together on a one-processor pool both end at twice
  their duration. This models ranks that outnumber the cores or GPUs running them.

The engine is deterministic: the same graph gives the same trace. If some tasks can never run
(a dependency cycle or a stream order that waits on itself), :func:`simulate` raises
:class:`DeadlockError` naming, for each stuck stream, the task it is stuck before and what that
task waits for.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd
import simpy

from .errors import SimtrainError

TRACE_COLUMNS = [
    "rank", "stream", "category", "kind", "name", "stage", "microbatch",
    "start_s", "end_s", "bytes", "peer", "resources",
]
"""Columns of the trace table, one row per executed task (``resources``: the names of the
resources the task held, joined by ``","``; empty when it held none)."""


@dataclass
class Task:
    """One interval of work.

    Attributes:
        tid: index of the task in its graph.
        name: readable label, e.g. ``"1F3"`` or ``"p2p 1F3 -> rank 2"``.
        rank: rank the task is recorded on.
        category: ``"compute"`` or ``"comm"`` (metrics use it).
        kind: finer label (``F``, ``B``, ``I``, ``W``, ``OPT``, ``p2p``, ``tp``, ``dp`` ...).
        duration_s: seconds it takes once started.
        deps: ids of tasks that must end before it starts.
        stream: in-order stream on ``rank`` (``"compute"``, ``"tp"``, ``"dp"``), or None.
        resources: names of capacity-1 resources held while it runs.
        stage, microbatch: the pipeline action it belongs to, if any.
        nbytes: bytes it moves (communication) or 0.
        peer: the other rank of a point-to-point transfer, if any.
        mem_start, mem_end: ``(rank, delta_bytes)`` pairs applied at start and at end.
        pool: name of the shared processor pool its duration runs on, or None (its own).
    """

    tid: int
    name: str
    rank: int
    category: str
    kind: str
    duration_s: float
    deps: list[int] = field(default_factory=list)
    stream: str | None = None
    resources: tuple[str, ...] = ()
    stage: int | None = None
    microbatch: int | None = None
    nbytes: float = 0.0
    peer: int | None = None
    mem_start: list[tuple[int, float]] = field(default_factory=list)
    mem_end: list[tuple[int, float]] = field(default_factory=list)
    pool: str | None = None


@dataclass
class TaskGraph:
    """Tasks plus each rank's static memory.

    Attributes:
        num_ranks: ranks 0..num_ranks-1.
        tasks: all tasks, ``tasks[i].tid == i``.
        static_memory_bytes: memory each rank holds before the first task (params, optimizer).
        pools: shared processor pools, name -> number of processors (> 0, may be fractional).
    """

    num_ranks: int
    tasks: list[Task] = field(default_factory=list)
    static_memory_bytes: list[float] = field(default_factory=list)
    pools: dict[str, float] = field(default_factory=dict)

    def add(self, **kwargs) -> Task:
        """Append a task (keyword arguments of :class:`Task` except ``tid``) and return it."""
        task = Task(tid=len(self.tasks), **kwargs)
        self.tasks.append(task)
        return task


@dataclass
class SimResult:
    """What the engine recorded.

    Attributes:
        trace: DataFrame with :data:`TRACE_COLUMNS`, one row per task, sorted by start.
        memory: DataFrame (rank, time_s, bytes): each rank's memory after every change,
            beginning with its static memory at time 0.
        makespan_s: end of the last task.
        events: number of tasks executed (engine events for benchmarks).
    """

    trace: pd.DataFrame
    memory: pd.DataFrame
    makespan_s: float
    events: int


class DeadlockError(SimtrainError):
    """Some tasks could never start; the message names where each stuck stream waits."""


class _Ports:
    """Capacity-1 resources taken all at once (see the module docstring)."""

    def __init__(self, env: simpy.Environment):
        self.env = env
        self.busy: set[str] = set()
        self.waiting: list[tuple[tuple[str, ...], simpy.Event]] = []

    def acquire(self, names: tuple[str, ...]) -> simpy.Event:
        """An event that fires when all ``names`` are taken for the caller."""
        event = self.env.event()
        if self.busy.isdisjoint(names):
            self.busy.update(names)
            event.succeed()
        else:
            self.waiting.append((names, event))
        return event

    def release(self, names: tuple[str, ...]) -> None:
        """Free ``names`` and start every waiting request that can now take all it needs."""
        self.busy.difference_update(names)
        still = []
        for wanted, event in self.waiting:
            if self.busy.isdisjoint(wanted):
                self.busy.update(wanted)
                event.succeed()
            else:
                still.append((wanted, event))
        self.waiting = still


class _SharedProcessors:
    """A pool of ``count`` processors shared equally by the tasks running on it (see module doc)."""

    def __init__(self, env: simpy.Environment, count: float):
        self.env = env
        self.count = count
        self.running: dict[int, list] = {}  # tid -> [remaining work seconds, done event]
        self.updated = 0.0
        self.version = 0

    def _rate(self) -> float:
        return min(1.0, self.count / len(self.running)) if self.running else 1.0

    def _advance(self) -> None:
        elapsed, rate = self.env.now - self.updated, self._rate()
        for job in self.running.values():
            job[0] -= elapsed * rate
        self.updated = self.env.now

    def work(self, tid: int, seconds: float) -> simpy.Event:
        """An event that fires when ``seconds`` of work of task ``tid`` are done on the pool."""
        self._advance()
        event = self.env.event()
        self.running[tid] = [seconds, event]
        self._plan()
        return event

    def _plan(self) -> None:
        """Wake up when the job with the least remaining work finishes at the current rate."""
        self.version += 1
        if not self.running:
            return
        version = self.version
        least = min(job[0] for job in self.running.values())
        timer = self.env.timeout(max(least, 0.0) / self._rate())
        timer.callbacks.append(lambda _: self._finish(version))

    def _finish(self, version: int) -> None:
        if version != self.version:  # the set of running jobs changed since this timer was set
            return
        self._advance()
        tolerance = 1e-12 * max(1.0, self.env.now)
        for tid in [t for t, job in self.running.items() if job[0] <= tolerance]:
            self.running.pop(tid)[1].succeed()
        self._plan()


def simulate(graph: TaskGraph) -> SimResult:
    """Run ``graph`` to completion.

    Args:
        graph: the tasks; dependencies must refer to tasks of the same graph.

    Returns:
        The trace and memory timeline.

    Raises:
        DeadlockError: some tasks never ran.
    """
    env = simpy.Environment()
    tasks = graph.tasks
    done = [env.event() for _ in tasks]
    finished = [False] * len(tasks)
    ports = _Ports(env)
    pools = {name: _SharedProcessors(env, count) for name, count in graph.pools.items()}
    memory = list(graph.static_memory_bytes) or [0.0] * graph.num_ranks
    mem_rows: list[tuple[int, float, float]] = [(r, 0.0, memory[r]) for r in range(graph.num_ranks)]
    rows: list[tuple] = []

    def apply(deltas: list[tuple[int, float]]) -> None:
        for rank, delta in deltas:
            memory[rank] += delta
            mem_rows.append((rank, env.now, memory[rank]))

    def run(task: Task):
        if task.deps:
            yield env.all_of([done[d] for d in task.deps])
        if task.resources:
            yield ports.acquire(task.resources)
        start = env.now
        apply(task.mem_start)
        if task.duration_s > 0 and task.pool is not None:
            yield pools[task.pool].work(task.tid, task.duration_s)
        elif task.duration_s > 0:
            yield env.timeout(task.duration_s)
        apply(task.mem_end)
        if task.resources:
            ports.release(task.resources)
        rows.append((
            task.rank, task.stream or "", task.category, task.kind, task.name, task.stage,
            task.microbatch, start, env.now, task.nbytes, task.peer, ",".join(task.resources),
        ))
        finished[task.tid] = True
        done[task.tid].succeed()

    def run_stream(ids: list[int]):
        for tid in ids:
            yield from run(tasks[tid])

    streams: dict[tuple[int, str], list[int]] = {}
    for t in tasks:
        if t.stream is None:
            env.process(run(t))
        else:
            streams.setdefault((t.rank, t.stream), []).append(t.tid)
    for ids in streams.values():
        env.process(run_stream(ids))
    env.run()

    if not all(finished):
        raise DeadlockError(_describe_deadlock(tasks, finished, streams))
    trace = pd.DataFrame(rows, columns=TRACE_COLUMNS).sort_values(["start_s", "rank"], kind="stable")
    mem = pd.DataFrame(mem_rows, columns=["rank", "time_s", "bytes"])
    return SimResult(
        trace=trace.reset_index(drop=True),
        memory=mem,
        makespan_s=float(trace["end_s"].max()) if len(trace) else 0.0,
        events=len(rows),
    )


def _describe_deadlock(tasks: list[Task], finished: list[bool], streams: dict) -> str:
    """One sentence per stuck stream: the task it is stuck before and what that waits for."""
    parts = []
    for (rank, stream), ids in sorted(streams.items()):
        head = next((tasks[i] for i in ids if not finished[i]), None)
        if head is None:
            continue
        waits = _blocking(tasks, finished, head)
        what = ", ".join(f"{w.name} (rank {w.rank})" for w in waits[:3]) or "a busy resource"
        parts.append(f"rank {rank} ({stream}) cannot run {head.name}: it waits for {what}")
    if not parts:
        stuck = [t for t in tasks if not finished[t.tid]][:3]
        parts = [f"{t.name} (rank {t.rank}) never became ready" for t in stuck]
    return "deadlock, no task can proceed: " + "; ".join(parts[:8])


def _blocking(tasks: list[Task], finished: list[bool], task: Task) -> list[Task]:
    """Unfinished dependencies of ``task``, looking through stream-less tasks (transfers) to the
    stream tasks they wait for."""
    out: list[Task] = []
    stack = [tasks[d] for d in task.deps if not finished[d]]
    seen: set[int] = set()
    while stack:
        t = stack.pop(0)
        if t.tid in seen:
            continue
        seen.add(t.tid)
        pending = [tasks[d] for d in t.deps if not finished[d]]
        if t.stream is None and pending:
            stack.extend(pending)
        else:
            out.append(t)
    return out
