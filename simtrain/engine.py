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

How it runs on SimPy: SimPy is the clock. Each task is a small state machine advanced by
callbacks (:class:`_Run`): it waits for its dependencies, takes its resources, runs, ends. Only
the run is a SimPy event (a delay); the steps that happen "now" go through a first-in-first-out
lane drained whenever the next SimPy event lies in the future (:class:`_Clock`). That is the order
SimPy itself gives zero-delay events (by time, then scheduling order), so the trace is the same,
step for step, as that of one generator process per stream yielding ``env.all_of(deps)``, a port
request, ``env.timeout(duration)`` and a done event (tests/test_engine_reference.py checks this on
random graphs against such an implementation), at about one SimPy event per task instead of four.

The engine is deterministic: the same graph gives the same trace. If some tasks can never run
(a dependency cycle or a stream order that waits on itself), :func:`simulate` raises
:class:`DeadlockError` naming, for each stuck stream, the task it is stuck before and what that
task waits for.
"""

from __future__ import annotations

import gc
from collections import deque
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import simpy
from simpy.events import NORMAL

from .errors import SimtrainError
from .trace import TRACE_COLUMNS, Trace

@dataclass(slots=True)
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


SimResult = Trace
"""What :func:`simulate` returns: a :class:`simtrain.trace.Trace` (the old name, kept for callers)."""


@contextmanager
def gc_paused():
    """Turn Python's cyclic garbage collector off for the block (and back on if it was on).

    Building and running a task graph allocates hundreds of thousands of long-lived objects and
    no reference cycles worth collecting; each automatic collection would scan them all again.
    Nothing that is computed depends on it, only how long it takes."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


class DeadlockError(SimtrainError):
    """Some tasks could never start; the message names where each stuck stream waits."""


class _Clock:
    """SimPy's clock with a first-in-first-out lane for zero-delay steps.

    SimPy orders events by (time, priority, scheduling order). Every step of a task that happens
    "now" (its dependencies are done, a port is granted, it is done) would be a zero-delay SimPy
    event, processed after every event already due now and before anything scheduled later; the
    same order is kept here by a FIFO that is drained whenever the next SimPy event lies in the
    future. So each task costs one SimPy event (its run, a delayed event on the environment) and
    the trace is the same, step for step, as with one SimPy event per step.
    """

    def __init__(self) -> None:
        self.env = simpy.Environment()
        self.fifo: deque = deque()
        self.soon = self.fifo.append  # soon((fn, arg)): call fn(arg) now, after every step already due now
        self.schedule = self.env.schedule
        self.now = 0.0  # the environment's time, kept here so that hot paths read an attribute
        self.events = 0  # SimPy events scheduled

    def after(self, delay_s: float, fn, arg) -> None:
        """Call ``fn(arg)`` ``delay_s`` seconds from now (a delay too small to move the clock is
        a step due now, as it is in SimPy)."""
        due = self.now + delay_s  # the time SimPy computes for the event
        if due == self.now:
            self.fifo.append((fn, arg))
        else:
            self.events += 1
            self.schedule(_Timer((self, due, fn, arg)), NORMAL, delay_s)

    def run(self) -> None:
        """Run until nothing is left to do: the FIFO is drained when the next SimPy event lies in
        the future; with the FIFO empty the next SimPy event is processed straight away."""
        fifo, peek, step = self.fifo, self.env.peek, self.env.step
        popleft = fifo.popleft
        while True:
            if not fifo:
                try:
                    step()
                except simpy.core.EmptySchedule:
                    return
            elif peek() > self.now:
                while fifo:
                    fn, arg = popleft()
                    fn(arg)
            else:
                step()


class _Timer:
    """A bare SimPy event (what :meth:`simpy.Environment.step` reads: ``callbacks``, ``_ok``); by
    default, processed at ``due`` seconds, it sets the clock's time and calls ``fn(arg)``."""

    __slots__ = ("callbacks", "_value")
    _ok = True

    def __init__(self, value: tuple, callbacks: list | None = None):
        self.callbacks = _FIRE if callbacks is None else callbacks  # SimPy never changes it: shared
        self._value = value


def _fire(event: _Timer) -> None:
    clock, due, fn, arg = event._value
    clock.now = due
    fn(arg)


_FIRE = [_fire]


class _Ports:
    """Capacity-1 resources taken all at once (see the module docstring).

    Waiting requests are kept in one queue per resource they want, numbered in arrival order. A
    release can only grant requests that want a released resource (every other one still waits
    for a resource that stays busy), so only those are tried, oldest first: the same grants, in
    the same order, as trying every waiting request in arrival order."""

    def __init__(self, clock: _Clock, on_grant):
        self.clock = clock
        self.on_grant = on_grant
        self.busy: set[str] = set()
        self.queues: dict[str, list[tuple[int, tuple[str, ...], int]]] = {}  # name -> (seq, wanted, tid)
        self.granted: set[int] = set()  # seqs granted since they queued (dropped from queues lazily)
        self.seq = 0

    def acquire(self, names: tuple[str, ...], tid: int) -> None:
        """Grant ``names`` to task ``tid`` (a step due now), or queue it until all are free."""
        if self.busy.isdisjoint(names):
            self.busy.update(names)
            self.clock.soon((self.on_grant, tid))
            return
        self.seq += 1
        entry = (self.seq, names, tid)
        for name in names:
            self.queues.setdefault(name, []).append(entry)

    def release(self, names: tuple[str, ...]) -> None:
        """Free ``names`` and grant every waiting request that can now take all it needs."""
        busy, granted, queues = self.busy, self.granted, self.queues
        busy.difference_update(names)
        if not queues:
            return
        candidates = {}
        for name in names:
            queue = queues.get(name)
            if queue:
                live = [e for e in queue if e[0] not in granted]
                if live:
                    queues[name] = live
                    candidates.update((e[0], e) for e in live)
                else:
                    del queues[name]
        for seq in sorted(candidates):
            _, wanted, tid = candidates[seq]
            if busy.isdisjoint(wanted):
                busy.update(wanted)
                granted.add(seq)
                self.clock.soon((self.on_grant, tid))


class _SharedProcessors:
    """A pool of ``count`` processors shared equally by the tasks running on it (see module doc)."""

    def __init__(self, clock: _Clock, count: float, on_done):
        self.clock = clock
        self.count = count
        self.on_done = on_done
        self.running: dict[int, float] = {}  # tid -> remaining work seconds
        self.updated = 0.0
        self.version = 0

    def _rate(self) -> float:
        return min(1.0, self.count / len(self.running)) if self.running else 1.0

    def _advance(self) -> None:
        now = self.clock.now
        elapsed, rate = now - self.updated, self._rate()
        for tid in self.running:
            self.running[tid] -= elapsed * rate
        self.updated = now

    def work(self, tid: int, seconds: float) -> None:
        """Run ``seconds`` of task ``tid``'s work on the pool; ``on_done(tid)`` when it is done."""
        self._advance()
        self.running[tid] = seconds
        self._plan()

    def _plan(self) -> None:
        """Wake up when the job with the least remaining work finishes at the current rate."""
        self.version += 1
        if not self.running:
            return
        least = min(self.running.values())
        self.clock.after(max(least, 0.0) / self._rate(), self._finish, self.version)

    def _finish(self, version: int) -> None:
        if version != self.version:  # the set of running jobs changed since this timer was set
            return
        self._advance()
        tolerance = 1e-12 * max(1.0, self.clock.now)
        for tid in [t for t, left in self.running.items() if left <= tolerance]:
            del self.running[tid]
            self.clock.soon((self.on_done, tid))
        self._plan()


class _Run:
    """One simulation of a task graph: each task a small state machine on a :class:`_Clock`.

    A task waits for its dependencies (one step due now when the last dependency's end has been
    processed), takes its resources (one step due now when granted), runs (one SimPy event after
    its duration, or on its processor pool) and ends (one step due now that releases the tasks
    waiting for it). These are the steps, in the same order, of the one-process-per-stream SimPy
    formulation (``yield env.all_of(deps)``, ``yield ports.acquire(...)``,
    ``yield env.timeout(d)``, ``done.succeed()``) without its generators and condition events.
    """

    def __init__(self, graph: TaskGraph):
        self.clock = _Clock()
        self.env = self.clock.env
        self.soon = self.clock.soon
        self.tasks = graph.tasks
        n = len(self.tasks)
        self.processed = [False] * n  # the task's end has been processed (its waiters released)
        self.waiters: list[list[int]] = [[] for _ in range(n)]  # tasks waiting for its end
        self.pending = [0] * n  # dependencies whose end is not processed yet
        self.next_in_stream: list[int | None] = [None] * n
        self.ports = _Ports(self.clock, self._start)
        self.pools = {name: _SharedProcessors(self.clock, count, self._finish) for name, count in graph.pools.items()}
        self.memory = list(graph.static_memory_bytes) or [0.0] * graph.num_ranks
        self.mem_rows: list[tuple[int, float, float]] = [(r, 0.0, self.memory[r]) for r in range(graph.num_ranks)]
        self.order: list[int] = []  # tids in the order they ended
        self.start_s = [0.0] * n
        self.end_s = [0.0] * n
        self.take, self.finish, self.ended = self._take, self._finish, self._ended  # bound once, not per call
        self.ran = [self._ran]  # the callbacks of a task's run event

    def _apply(self, deltas: list[tuple[int, float]]) -> None:
        memory, now, rows = self.memory, self.clock.now, self.mem_rows
        for rank, delta in deltas:
            memory[rank] += delta
            rows.append((rank, now, memory[rank]))

    def begin(self, tid: int) -> None:
        """Start waiting for ``tid``'s dependencies."""
        deps = self.tasks[tid].deps
        if not deps:
            self._take(tid)
            return
        pending, processed, waiters = 0, self.processed, self.waiters
        for d in deps:
            if not processed[d]:
                pending += 1
                waiters[d].append(tid)
        if pending:
            self.pending[tid] = pending
        else:
            self.soon((self.take, tid))

    def _ended(self, tid: int) -> None:
        """The end of ``tid`` is processed: release the tasks whose last dependency it was."""
        self.processed[tid] = True
        waiting = self.waiters[tid]
        if waiting:
            pending, soon, take = self.pending, self.soon, self.take
            for w in waiting:
                pending[w] -= 1
                if not pending[w]:
                    soon((take, w))

    def _take(self, tid: int) -> None:
        """Take the task's resources, then run it."""
        resources = self.tasks[tid].resources
        if resources:
            self.ports.acquire(resources, tid)
        else:
            self._start(tid)

    def _start(self, tid: int) -> None:
        task = self.tasks[tid]
        clock = self.clock
        now = clock.now
        self.start_s[tid] = now
        if task.mem_start:
            self._apply(task.mem_start)
        duration = task.duration_s
        if duration > 0:
            if task.pool is not None:
                self.pools[task.pool].work(tid, duration)
            elif now + duration == now:  # too small to move the clock: a step due now (:meth:`_Clock.after`)
                self.soon((self.finish, tid))
            else:
                clock.events += 1
                clock.schedule(_Timer((now + duration, tid), self.ran), NORMAL, duration)
        else:
            self._finish(tid)

    def _ran(self, event: _Timer) -> None:
        """A task's run event (value ``(due, tid)``) is processed: the clock is at ``due``, the task ends."""
        self.clock.now, tid = event._value
        self._finish(tid)

    def _finish(self, tid: int) -> None:
        task = self.tasks[tid]
        if task.mem_end:
            self._apply(task.mem_end)
        if task.resources:
            self.ports.release(task.resources)
        self.end_s[tid] = self.clock.now
        self.order.append(tid)
        self.soon((self.ended, tid))
        nxt = self.next_in_stream[tid]
        if nxt is not None:
            self.begin(nxt)


def simulate(graph: TaskGraph) -> Trace:
    """Run ``graph`` to completion.

    Args:
        graph: the tasks; dependencies must refer to tasks of the same graph.

    Returns:
        The :class:`simtrain.trace.Trace`: tasks table, memory timeline, makespan.

    Raises:
        DeadlockError: some tasks never ran.
    """
    with gc_paused():  # the run allocates many objects (per-task lists, columns) and no cycles
        return _simulate(graph)


def _simulate(graph: TaskGraph) -> Trace:
    """:func:`simulate` (with the garbage collector off)."""
    run = _Run(graph)
    tasks = graph.tasks
    streams: dict[tuple[int, str], list[int]] = {}
    starts = []
    for t in tasks:
        if t.stream is None:
            starts.append(t.tid)
        else:
            streams.setdefault((t.rank, t.stream), []).append(t.tid)
    for ids in streams.values():
        for a, b in zip(ids, ids[1:]):
            run.next_in_stream[a] = b
        starts.append(ids[0])
    for tid in starts:
        run.begin(tid)
    run.clock.run()
    if len(run.order) < len(tasks):
        ended = set(run.order)
        finished = [tid in ended for tid in range(len(tasks))]
        raise DeadlockError(_describe_deadlock(tasks, finished, streams))
    return Trace.from_columns(_columns(tasks, run), run.mem_rows, simpy_events=run.clock.events)


def _columns(tasks: list[Task], run: _Run) -> dict[str, Sequence]:
    """The trace columns (:data:`simtrain.trace.TRACE_COLUMNS`) of a finished run, rows in the
    order the tasks ended (one list comprehension per column: ~3x faster than one tuple per row)."""
    ended = [tasks[i] for i in run.order]
    start_s, end_s = run.start_s, run.end_s
    return {"rank": [t.rank for t in ended], "stream": [t.stream or "" for t in ended],
            "category": [t.category for t in ended], "kind": [t.kind for t in ended], "name": [t.name for t in ended],
            "stage": [t.stage for t in ended], "microbatch": [t.microbatch for t in ended],
            "start_s": [start_s[i] for i in run.order], "end_s": [end_s[i] for i in run.order],
            "bytes": [t.nbytes for t in ended], "peer": [t.peer for t in ended],
            "resources": [",".join(t.resources) if t.resources else "" for t in ended]}


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
