"""The discrete-event engine: runs a task graph on SimPy and records what ran when.

The engine knows tasks, streams, resources and memory deltas, nothing about schedules:

* A :class:`Task` has a duration, dependencies (task ids), optionally a *stream* and optionally
  *resources*. Tasks of one ``(rank, stream)`` run one after another in the order the graph lists
  them (like a CUDA stream). Tasks with no stream start as soon as their dependencies are done.
* Resources (link ports, NICs) have capacity 1 unless their link is shared (below). A task takes
  all of its resources at once, when all are free, and holds them for its whole duration; waiting
  tasks are served first come, first served, a later one going ahead only when everything it
  needs is free (no task holds one port while it waits for another). Transfers that share such a
  port run one after the other: two equal transfers that start together end at T and 2T.
* Shared links: the ports of the links named in ``TaskGraph.shared_links`` (a resource's link is
  the part of its name before the first ``:``) are shared by the transfers using them at once
  (:mod:`simtrain.link_share`): a transfer takes its other resources and, on each such port, the
  capacity-1 lane of its kind (one communicator's transfers run in order), then progresses at
  ``1 / n`` while ``n`` transfers use its most shared port; two equal transfers of different
  kinds that start together both end at 2T. Where no two transfers use a port at once, the trace
  is the one of capacity-1 ports.
* Dispatch order: a task may name tasks it is *dispatched after* (``dispatch_after``). A task is
  dispatched at the instant its dependencies have ended, its stream has reached it and every task
  it is dispatched after has been dispatched; it then starts, at once or when its resources are
  granted. This is a GPU's hardware work queue, which hands its kernels to the device in the
  host's launch order, each once its own dependencies are met, and goes on to the next while it
  runs (:mod:`simtrain.lowering.queues`): a start-after-start edge, where ``deps`` are
  start-after-end.
* Memory deltas (bytes, per rank) are applied when a task starts or ends; the engine keeps a
  memory timeline per rank starting from each rank's static memory.
* Shared processors: a task may name a *processor pool* of the graph (``TaskGraph.pools``, name ->
  number of processors). Its duration is then work, done at rate ``min(1, processors / running)``
  while ``running`` tasks of the pool are in progress (egalitarian processor sharing, Kleinrock
  1967, "Time-shared systems: a theoretical treatment", JACM 14(2)): one task on a free pool takes
  its duration; two equal tasks that start together on a one-processor pool both end at twice
  their duration. This models ranks that outnumber the cores or GPUs running them.

How it runs on SimPy: SimPy is the clock. Each task is a small state machine whose steps
(:class:`_Run`) are dispatched by one loop: it waits for its dependencies, takes its resources,
runs, ends. Only the run is a SimPy event (a delay, :class:`simtrain.sharing.Due`, on the
environment's event queue); the steps that happen "now" go through a first-in-first-out lane
drained whenever the next SimPy event lies in the future (:class:`simtrain.sharing.Clock`).
That is the order SimPy itself gives zero-delay events (by time, then scheduling order), so the
trace is the same, step for step, as that of one generator process per stream yielding
``env.all_of(deps)``, a port request, ``env.timeout(duration)`` and a done event
(tests/test_engine_reference.py checks this on random graphs against such an implementation), at
one SimPy event per task instead of four.

The engine is deterministic: the same graph gives the same trace. If some tasks can never run
(a dependency cycle or a stream order that waits on itself), :func:`simulate` raises
:class:`DeadlockError` naming, for each stuck stream, the task it is stuck before and what that
task waits for.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from heapq import heappop, heappush

from simpy.events import NORMAL

from .errors import SimtrainError
from .link_share import LinkShare
from .sharing import (STEP_BEGIN, STEP_ENDED, STEP_FINISH, STEP_START, STEP_TAKE, Clock, Due, Ports, SharedProcessors,
                      dispatch_links)
from .trace import Trace

_NOBODY = ()
"""A task's waiters before the first one registers (one shared empty tuple instead of a list per task)."""

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
        deps: ids of tasks that must end before it starts (a list a pass may extend; the bulk-built
            transfers of an MoE block share one tuple, :func:`simtrain.lowering.moe.add_block`).
        stream: in-order stream on ``rank`` (``"compute"``, ``"tp"``, ``"dp"``), or None.
        resources: names of capacity-1 resources held while it runs.
        stage, microbatch: the pipeline action it belongs to, if any.
        nbytes: bytes it moves (communication) or 0.
        peer: the other rank of a point-to-point transfer, if any.
        mem_start, mem_end: ``(rank, delta_bytes)`` pairs applied at start and at end.
        pool: name of the shared processor pool its duration runs on, or None (its own).
        dispatch_after: ids of tasks that must have been dispatched (see the module docstring)
            before it can be; () for none.
    """

    tid: int
    name: str
    rank: int
    category: str
    kind: str
    duration_s: float
    deps: list[int] | tuple[int, ...] = field(default_factory=list)
    stream: str | None = None
    resources: tuple[str, ...] = ()
    stage: int | None = None
    microbatch: int | None = None
    nbytes: float = 0.0
    peer: int | None = None
    mem_start: list[tuple[int, float]] = field(default_factory=list)
    mem_end: list[tuple[int, float]] = field(default_factory=list)
    pool: str | None = None
    dispatch_after: tuple[int, ...] = ()


@dataclass
class TaskGraph:
    """Tasks plus each rank's static memory.

    Attributes:
        num_ranks: ranks 0..num_ranks-1.
        tasks: all tasks, ``tasks[i].tid == i``.
        static_memory_bytes: memory each rank holds before the first task (params, optimizer).
        pools: shared processor pools, name -> number of processors (> 0, may be fractional), or
            name -> a callable building the pool on the run's clock (an object with
            ``work(tid, seconds)`` that makes ``(STEP_FINISH, tid)`` due: e.g.
            :class:`simtrain.sm_share.SmShare`).
        shared_links: link names whose ports share bandwidth among the transfers using them
            (:mod:`simtrain.link_share`); the ports of other links are capacity-1 FIFO resources.
    """

    num_ranks: int
    tasks: list[Task] = field(default_factory=list)
    static_memory_bytes: list[float] = field(default_factory=list)
    pools: dict[str, float | Callable] = field(default_factory=dict)
    shared_links: frozenset[str] = frozenset()

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


class _Run:
    """One simulation of a task graph: each task a small state machine on a :class:`Clock`.

    A task waits for its dependencies (the step ``STEP_TAKE`` due when the last dependency's end,
    or dispatch, has been processed), is dispatched (``STEP_TAKE`` releases the tasks that wait
    for its dispatch, as the "end" of id ``len(tasks) + tid``), takes its resources
    (``STEP_START`` due when they are granted), runs (one SimPy event after its duration, or on
    its processor pool) and ends (``STEP_ENDED`` releases the tasks waiting for it). These are the steps, in the same order, of the
    one-process-per-stream SimPy formulation (``yield env.all_of(deps)``,
    ``yield ports.acquire(...)``, ``yield env.timeout(d)``, ``done.succeed()``) without its
    generators and condition events. :meth:`run` dispatches the steps itself and does, inline,
    what ``Environment.schedule`` and ``Environment.step`` do with a task's run event (push it on,
    and pop it off, the environment's heap keyed by (time, priority, event id), setting the
    environment's time; see :class:`simtrain.sharing.Clock`), so a task costs one SimPy event and
    no Python call on the common path: the steps due now are drained before the next SimPy event
    (none scheduled meanwhile is due now), and a step that makes another due at once, with
    nothing queued before it, runs that one at once. Memory deltas are logged as task ids in the
    order they apply and turned into rows after the run (:meth:`memory_rows`).
    """

    def __init__(self, graph: TaskGraph):
        self.graph = graph
        self.clock = Clock()
        self.fifo = self.clock.fifo
        self.tasks = graph.tasks
        n = len(self.tasks)
        self.deps, self.dispatched = dispatch_links(self.tasks)  # dispatch_after as ids n + tid
        # tasks waiting for its end (id n + tid: its dispatch): _NOBODY until the first one, None once processed
        self.waiters: list[list[int] | tuple | None] = [_NOBODY] * (2 * n if any(self.dispatched) else n)
        self.pending = [0] * n  # dependencies whose end (or dispatch) is not processed yet
        self.next_in_stream = [-1] * n  # the next task of its stream, -1 for none
        self.pools = {name: spec(self.clock) if callable(spec) else SharedProcessors(self.clock, spec)
                      for name, spec in graph.pools.items()}
        shared, self.holds = LinkShare.split(self.tasks, graph.shared_links, self.pools)  # holds: capacity-1 ones
        self.links = LinkShare(self.clock, self.tasks, shared, self.pools)
        self.ports = Ports(self.clock, set(self.holds))
        self.mem_log: list[int] = []  # tid: its mem_start applied, ~tid: its mem_end, in order
        self.order: list[int] = []  # tids in the order they ended
        self.start_s = [0.0] * n
        self.end_s = [0.0] * n
        self.events = 0  # SimPy events processed (every scheduled one is, the run goes to the end)

    def begin(self, tids: list[int]) -> None:
        """Queue the first steps, ``STEP_BEGIN`` of each task of ``tids`` in order (before
        :meth:`run`). Up to the first task without dependencies, nothing can have ended when
        they are taken, so each of those tasks waits for every one of its dependencies at once,
        here; the rest are queued."""
        deps_of, waiters, pending = self.deps, self.waiters, self.pending
        for i, tid in enumerate(tids):
            deps = deps_of[tid]
            if not deps:
                self.fifo.extend((STEP_BEGIN, t) for t in tids[i:])
                return
            pending[tid] = len(deps)
            for d in deps:
                dep_waiters = waiters[d]
                if dep_waiters is _NOBODY:
                    waiters[d] = [tid]
                else:
                    dep_waiters.append(tid)

    def run(self) -> None:
        """Run the steps :meth:`begin` queued until none is left, in the order the class docstring gives."""
        clock, fifo, tasks, ports, pools = self.clock, self.fifo, self.tasks, self.ports, self.pools
        links, shared, holds = self.links, self.links.shared, self.holds
        env, queue, eid, popleft, push, now = clock.env, clock.queue, clock.eid, fifo.popleft, fifo.append, 0.0
        waiters, pending, nexts, nobody, deps_of, signals = self.waiters, self.pending, self.next_in_stream, _NOBODY, self.deps, self.dispatched
        start_s, end_s, ended, mem_log = self.start_s, self.end_s, self.order.append, self.mem_log.append
        busy, wait, release, queues, callbacks = ports.busy, ports.wait, ports.release, ports.queues, clock.callbacks
        BEGIN, TAKE, START, FINISH, ENDED, normal = STEP_BEGIN, STEP_TAKE, STEP_START, STEP_FINISH, STEP_ENDED, NORMAL
        while True:
            if fifo:
                code, tid = popleft()
            else:  # the next SimPy event (nothing is due before it), and any due at the same time
                if not queue:
                    break
                now, _, _, event = heappop(queue)  # Environment.step but its callbacks (env time set where read)
                code, tid = event.step  # its step now, the steps of the others due now queued after it
                while queue and queue[0][0] == now:
                    push(heappop(queue)[3].step)
            while True:  # the step, then the step it makes due at once, if any
                if code == ENDED:  # release the tasks whose last dependency it was (None: released)
                    released, waiters[tid] = waiters[tid], None
                    for w in released:
                        pending[w] -= 1
                        if not pending[w]:
                            push((TAKE, w))
                    break
                if code == FINISH:  # it ends, frees its resources, its stream goes on
                    task = tasks[tid]
                    if task.mem_end:
                        mem_log(~tid)
                    resources = holds[tid]
                    if resources:
                        release(resources) if queues or ports.server_waits else busy.difference_update(resources)
                    end_s[tid] = now
                    ended(tid)
                    following = nexts[tid]
                    if following < 0:
                        if fifo:
                            push((ENDED, tid))
                            break
                        code = ENDED  # (nothing queued before it: its end is processed now)
                        continue
                    push((ENDED, tid))
                    code, tid = BEGIN, following
                if code == BEGIN:  # wait for those dependencies whose end (or dispatch) is not processed yet
                    deps = deps_of[tid]  # (inline: one Python call less per task than a helper, ~4 % of the run)
                    if deps:
                        left = 0
                        for d in deps:
                            dep_waiters = waiters[d]
                            if dep_waiters is not None:
                                left += 1
                                if dep_waiters is nobody:
                                    waiters[d] = [tid]
                                else:
                                    dep_waiters.append(tid)
                        if left:
                            pending[tid] = left
                            break
                        if fifo:  # (with nothing queued the step would be the next one: run it now)
                            push((TAKE, tid))
                            break
                    code = TAKE
                if code == TAKE:  # dispatched: release who waits for that; take the resources at once if free, else queue
                    if signals[tid]:
                        push((ENDED, len(tasks) + tid))  # (its dispatch, id n + tid)
                    if tasks[tid].resources:
                        resources = holds[tid]  # (of a transfer on shared ports: the rest, e.g. a hardware queue)
                        if resources:
                            if not busy.isdisjoint(resources):
                                wait(resources, tid)
                                break
                            busy.update(resources)
                        if fifo:
                            push((START, tid))
                            break
                    code = START
                if code == START:
                    task = tasks[tid]
                    start_s[tid] = now
                    if task.mem_start:
                        mem_log(tid)
                    duration = task.duration_s
                    if duration > 0:
                        if tid in shared:
                            clock.now = env._now = now
                            links.work(tid, duration)
                        elif task.pool is not None:
                            clock.now = env._now = now
                            pools[task.pool].work(tid, duration)
                        elif now + duration != now:
                            run = Due()
                            run.callbacks, run.step = callbacks, (FINISH, tid)
                            heappush(queue, (now + duration, normal, next(eid), run))  # Environment.schedule
                        else:  # too small to move the clock: a step due now
                            push((FINISH, tid))
                        break
                    code = FINISH
                    continue
                clock.now = env._now = now
                code(tid)  # a processor pool's step
                break
        env._now = now
        self.events = next(eid)  # every event scheduled (ids count from 0) was processed: the queue is empty

    def memory_rows(self) -> list[tuple[int, float, float]]:
        """Each rank's memory ``(rank, time_s, bytes)`` at time 0 and after every change, in the
        order the changes applied."""
        graph, tasks, start_s, end_s = self.graph, self.tasks, self.start_s, self.end_s
        memory = list(graph.static_memory_bytes) or [0.0] * graph.num_ranks
        rows = [(r, 0.0, memory[r]) for r in range(graph.num_ranks)]
        append = rows.append
        for tid in self.mem_log:
            if tid >= 0:
                deltas, now = tasks[tid].mem_start, start_s[tid]
            else:
                deltas, now = tasks[~tid].mem_end, end_s[~tid]
            for rank, delta in deltas:
                memory[rank] += delta
                append((rank, now, memory[rank]))
        return rows


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
    columns = _task_columns(tasks)
    starts = _link_streams(columns["rank"], columns["stream"], run.next_in_stream)
    run.begin(starts)
    run.run()
    if len(run.order) < len(tasks):
        ended = set(run.order)
        finished = [tid in ended for tid in range(len(tasks))]
        raise DeadlockError(_describe_deadlock(tasks, finished, _streams(tasks)))
    return _trace(columns, run)


def _task_columns(tasks: list[Task]) -> dict[str, list]:
    """What the trace records of each task (the :data:`simtrain.trace.TRACE_COLUMNS` but
    ``start_s`` and ``end_s``), one list per column in task order (``stream`` None where none).
    One list comprehension per column: ~3x faster than one tuple per task. Built eagerly, not on
    demand: a trace that kept the tasks to read them later would keep ~10^5 objects alive for
    the garbage collector to traverse (measured: the first full collection after a DeepSeek-V3
    step took 0.23-0.30 s instead of 0.07 s)."""
    return {"rank": [t.rank for t in tasks], "stream": [t.stream for t in tasks],
            "category": [t.category for t in tasks], "kind": [t.kind for t in tasks], "name": [t.name for t in tasks],
            "stage": [t.stage for t in tasks], "microbatch": [t.microbatch for t in tasks],
            "bytes": [t.nbytes for t in tasks], "peer": [t.peer for t in tasks],
            "resources": [",".join(t.resources) for t in tasks]}


def _link_streams(ranks: list[int], streams: list[str | None], nexts: list[int]) -> list[int]:
    """Chain the tasks of each ``(rank, stream)`` in task order (fills ``nexts[tid]``: the next
    task of its stream, -1 for none) and return the tasks to begin, in the order the engine
    begins them: the stream-less ones, then the first of each stream in order of first appearance."""
    n = len(streams)
    names = {s: i for i, s in enumerate(dict.fromkeys(streams))}
    code = np.fromiter(map(names.__getitem__, streams), dtype=np.int64, count=n)
    key = np.asarray(ranks, dtype=np.int64) * len(names) + code
    free = code == names[None] if None in names else np.zeros(n, dtype=bool)
    chained = np.flatnonzero(~free)
    chained = chained[np.argsort(key[chained], kind="stable")]  # grouped by stream, in task order
    same = key[chained[1:]] == key[chained[:-1]]
    nxt = np.full(n, -1, dtype=np.int64)
    nxt[chained[:-1][same]] = chained[1:][same]
    nexts[:] = nxt.tolist()
    heads = np.sort(chained[np.concatenate(([True], ~same))]) if len(chained) else chained
    return np.flatnonzero(free).tolist() + heads.tolist()


def _streams(tasks: list[Task]) -> dict[tuple[int, str], list[int]]:
    """``(rank, stream)`` -> its task ids in order (for the deadlock message)."""
    streams: dict[tuple[int, str], list[int]] = {}
    for t in tasks:
        if t.stream is not None:
            streams.setdefault((t.rank, t.stream), []).append(t.tid)
    return streams


def _trace(columns: dict[str, list], run: _Run) -> Trace:
    """The :class:`simtrain.trace.Trace` of a finished run: rows sorted stably by (start_s, rank)
    from the order the tasks ended, as :meth:`simtrain.trace.Trace.from_columns` sorts them."""
    n = len(run.order)
    order = np.fromiter(run.order, dtype=np.int64, count=n)
    ranks = np.fromiter(columns["rank"], dtype=np.int64, count=len(run.start_s))
    starts = np.fromiter(run.start_s, dtype=float, count=len(run.start_s))
    rows = order[np.lexsort((ranks[order], starts[order]))]
    source = {**columns, "stream": [s or "" for s in columns["stream"]], "start_s": run.start_s, "end_s": run.end_s}
    # tasks end in time order, so the last one to end ends last
    return Trace(source=source, order=rows, memory_rows=run.memory_rows(),
                 makespan_s=float(run.end_s[run.order[-1]]) if n else 0.0, events=n, simpy_events=run.events)


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
    stack = [tasks[d] for d in (*task.deps, *task.dispatch_after) if not finished[d]]
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
