"""What the engine's tasks share: its clock's lane of steps due now, link ports, processor pools.

:mod:`simtrain.engine` runs a task graph as steps on a :class:`Clock`. A *step* is a pair
``(code, arg)`` in the clock's first-in-first-out lane of things due now: the engine's own steps
use small integer codes it dispatches itself (:data:`STEP_START` and :data:`STEP_FINISH` are the
ones :class:`Ports` and :class:`SharedProcessors` push); any other code is a callable, called
``code(arg)``. The rules by which tasks share capacity-1 resources and processor pools are
described in the engine's module docstring; this module implements them.
"""

from __future__ import annotations

import heapq
from collections import Counter, deque
from collections.abc import Iterable

import simpy
from simpy.events import NORMAL

STEP_BEGIN, STEP_TAKE, STEP_START, STEP_FINISH, STEP_ENDED = 0, 1, 2, 3, 4
"""Codes of the engine's steps: a task begins (waits for its dependencies), its dependencies are
done (take its resources), it starts (its resources are granted), it finishes (its work is done),
its end is processed (release the tasks waiting for it)."""


def dispatch_links(tasks: list) -> tuple[list, list[bool]]:
    """What the engine's dependency bookkeeping needs of each task (:class:`simtrain.engine.Task`,
    ``tasks[i].tid == i``): its dependencies, with each task ``x`` of its ``dispatch_after`` as the
    id ``len(tasks) + x`` (the engine processes task x's dispatch as the "end" of that id, so the
    same waiter lists and counts serve both), and whether some task waits for its dispatch.

    Returns:
        ``(deps, signals)``: per task its ``deps`` (the task's own list where it has no
        ``dispatch_after``) and a flag, True where it is in another task's ``dispatch_after``.

    Raises:
        ValueError: a ``dispatch_after`` id outside the graph or naming the task itself."""
    n = len(tasks)
    deps = [t.deps for t in tasks]
    signals = [False] * n
    for t in tasks:
        after = t.dispatch_after
        if after:
            if any(not 0 <= x < n or x == t.tid for x in after):
                raise ValueError(f"task {t.tid} ({t.name}): dispatch_after {after} must name other tasks of the graph")
            deps[t.tid] = (*t.deps, *(n + x for x in after))
            for x in after:
                signals[x] = True
    return deps, signals


class Clock:
    """SimPy's clock with a first-in-first-out lane for zero-delay steps.

    SimPy orders events by (time, priority, scheduling order). Every step of a task that happens
    "now" (its dependencies are done, a port is granted, it is done) would be a zero-delay SimPy
    event, processed after every event already due now and before anything scheduled later; the
    engine keeps the same order with :attr:`fifo`, drained whenever the next SimPy event lies in
    the future. So each task costs one SimPy event (its run, a delayed event on the environment)
    and the trace is the same, step for step, as with one SimPy event per step.

    A SimPy event here is a :class:`Due` carrying a step. The engine pushes and pops them on
    the environment's own event heap (:attr:`queue`, entries ``(time, priority, event id,
    event)`` with ids from :attr:`eid`) exactly as ``Environment.schedule`` and
    ``Environment.step`` do (simpy 4.1 ``core.py``), setting the environment's time when it pops
    one, and takes the event's step instead of calling its callbacks: the same events in the
    same order without two Python calls per event. Processed by SimPy itself
    (``env.step()``), a :class:`Due` only appends itself to :attr:`due`.

    Attributes:
        env: the SimPy environment (its events are the runs of tasks and pool wake-ups).
        queue, eid: the environment's event heap and event-id counter.
        fifo: the steps due now, ``(code, arg)`` pairs (see the module docstring).
        due: the events SimPy itself processed (``env.step()``), in order.
        callbacks: the callbacks of every :class:`Due` (SimPy drops an event's list, never
            changes it, so one list serves all).
        now: the environment's time (seconds), kept here so that hot paths read an attribute.
    """

    def __init__(self) -> None:
        self.env = simpy.Environment()
        self.fifo: deque = deque()
        self.due: list[Due] = []
        self.callbacks = [self.due.append]
        self.queue, self.eid = self.env._queue, self.env._eid  # what Environment.schedule and step use
        self.now = 0.0

    def after(self, delay_s: float, step: tuple) -> Due | None:
        """Make ``step`` due ``delay_s`` seconds from now (a delay too small to move the clock
        makes it due now, as it is in SimPy), pushed on the event heap as ``Environment.schedule``
        does (``now`` is the environment's time wherever a pool calls this).

        Returns:
            The scheduled :class:`Due` (a pool may disarm it by replacing its ``step``), or None
            for a step due now."""
        due = self.now + delay_s
        if due == self.now:  # SimPy's time for the event
            self.fifo.append(step)
            return None
        event = Due()
        event.callbacks, event.step = self.callbacks, step
        heapq.heappush(self.queue, (due, NORMAL, next(self.eid), event))
        return event


class Due:
    """A bare SimPy event (what :meth:`simpy.Environment.step` reads: ``callbacks``, ``_ok``)
    carrying the ``step`` it makes due when it is processed. Made without ``__init__`` and
    filled attribute by attribute: the engine makes one per task."""

    __slots__ = ("callbacks", "step")
    _ok = True


class Ports:
    """Capacity-1 resources taken all at once (see :mod:`simtrain.engine`).

    Free requests are granted by the engine itself (:attr:`busy` is disjoint from what it
    wants); :meth:`wait` queues the others, numbered in arrival order, in one queue per *class*:
    the tuple of resource names a request wants. A release can only grant requests that want a
    released resource (every other one still waits for a resource that stays busy), and of a
    class only its oldest request: a later one wants the same resources, which the oldest leaves
    busy if it is granted and which are not all free if it is not. So the oldest request of
    each class that wants a released resource is tried, oldest first: the same grants, in the
    same order, as trying every waiting request in arrival order. A grant is the step
    ``(STEP_START, tid)`` on the clock's lane.

    A class that shares no resource with any other class of the run (``classes``; e.g. one GPU's
    NVLink port pair, used by its own all-to-alls alone) is a first-come-first-served *server*:
    its resources are busy exactly while one of its requests runs, a release can only grant its
    own oldest request, and no other class's grant can depend on it, so it keeps one plain queue
    of task ids for the whole run (:attr:`servers`), outside :attr:`queues` and :attr:`wanting`:
    the same grants in the same order, without the per-class bookkeeping.

    Attributes:
        busy: names of the resources held now.
        queues: class (tuple of names) -> its waiting requests ``(seq, tid)``, oldest first;
            only classes with a waiting request (empty when nothing waits); servers excluded.
        wanting: resource name -> the classes in :attr:`queues` that want it.
        servers: each server class -> the ids of its waiting requests, oldest first.
        server_waits: how many requests wait in :attr:`servers` (with :attr:`queues` empty and
            none, a release only frees its resources).
    """

    def __init__(self, clock: Clock, classes: Iterable[tuple[str, ...]] = ()):
        """``classes``: every tuple of resource names the run's tasks may request (those sharing
        no name with another are servers; a class left out is handled by the general path)."""
        self.clock = clock
        self.busy: set[str] = set()
        self.queues: dict[tuple[str, ...], deque[tuple[int, int]]] = {}
        self.wanting: dict[str, list[tuple[str, ...]]] = {}
        self.seq = 0
        self.servers: dict[tuple[str, ...], deque[int]] = {}
        self.server_waits = 0  # requests waiting in the servers' queues
        classes = {names for names in classes if names}
        sharing = Counter(name for names in classes for name in set(names))
        for names in classes:
            if all(sharing[name] == 1 for name in names):
                self.servers[names] = deque()

    def wait(self, names: tuple[str, ...], tid: int) -> None:
        """Queue task ``tid``'s request for ``names`` (some of them are busy)."""
        server = self.servers.get(names)
        if server is not None:
            server.append(tid)
            self.server_waits += 1
            return
        self.seq += 1
        queue = self.queues.get(names)
        if queue is not None:
            queue.append((self.seq, tid))
            return
        self.queues[names] = deque(((self.seq, tid),))
        wanting = self.wanting
        for name in names:
            classes = wanting.get(name)
            if classes is None:
                wanting[name] = [names]
            else:
                classes.append(names)

    def release(self, names: tuple[str, ...]) -> None:
        """Free ``names`` (held now) and grant every waiting request that can then take all it
        needs, oldest first (see the class docstring); once every freed resource is taken again
        no later candidate can be granted, so the scan stops there. When the class ``names``
        itself waits and no other waiting class wants any of them, its oldest request takes them
        all again: what the scan would do, without freeing them first (a server's always does)."""
        server = self.servers.get(names)
        if server is not None:
            if server:
                self.clock.fifo.append((STEP_START, server.popleft()))
                self.server_waits -= 1
            else:
                self.busy.difference_update(names)
            return
        queues, wanting = self.queues, self.wanting
        queue = queues.get(names)
        if queue is not None:
            for name in names:
                if len(wanting[name]) > 1:
                    break
            else:
                self.clock.fifo.append((STEP_START, queue.popleft()[1]))
                if not queue:
                    self._drop(names)
                return
        self.busy.difference_update(names)
        for name in names:
            if name in wanting:
                self._grant(names)
                return

    def _grant(self, names: tuple[str, ...]) -> None:
        """:meth:`release`'s scan: ``names`` are free now and some waiting class wants one."""
        busy, queues, wanting = self.busy, self.queues, self.wanting
        found = []
        for name in names:
            classes = wanting.get(name)
            if classes:
                for wanted in classes:
                    if wanted not in found:
                        found.append(wanted)
        if len(found) > 1:
            found.sort(key=lambda wanted: queues[wanted][0][0])
        for wanted in found:
            if busy.isdisjoint(wanted):
                busy.update(wanted)
                queue = queues[wanted]
                self.clock.fifo.append((STEP_START, queue.popleft()[1]))
                if not queue:
                    self._drop(wanted)
                if busy.issuperset(names):
                    return

    def _drop(self, wanted: tuple[str, ...]) -> None:
        """Forget class ``wanted``: nothing of it waits any more."""
        del self.queues[wanted]
        wanting = self.wanting
        for name in wanted:
            classes = wanting[name]
            if len(classes) == 1:
                del wanting[name]
            else:
                classes.remove(wanted)


class SharedProcessors:
    """A pool of ``count`` processors shared equally by the tasks running on it (see
    :mod:`simtrain.engine`); a task whose work is done is the step ``(STEP_FINISH, tid)``."""

    def __init__(self, clock: Clock, count: float):
        self.clock = clock
        self.count = count
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
        """Run ``seconds`` of task ``tid``'s work on the pool, from the clock's now."""
        self._advance()
        self.running[tid] = seconds
        self._plan()

    def _plan(self) -> None:
        """Wake up when the job with the least remaining work finishes at the current rate."""
        self.version += 1
        if not self.running:
            return
        least = min(self.running.values())
        self.clock.after(max(least, 0.0) / self._rate(), (self._finish, self.version))

    def _finish(self, version: int) -> None:
        if version != self.version:  # the set of running jobs changed since this timer was set
            return
        self._advance()
        tolerance = 1e-12 * max(1.0, self.clock.now)
        for tid in [t for t, left in self.running.items() if left <= tolerance]:
            del self.running[tid]
            self.clock.fifo.append((STEP_FINISH, tid))
        self._plan()
