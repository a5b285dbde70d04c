"""Test oracle: the engine as it was written before its callback form (simtrain 0.1, one SimPy
generator process per stream and per stream-less task, ``yield env.all_of(deps)``, a dispatch
event, a port request event, ``yield env.timeout(duration)``, a done event per task). tests/test_engine_reference.py
checks that :func:`simtrain.engine.simulate` gives exactly its rows and memory timeline.
Kept only as an independent implementation to compare with; not used by simtrain.
"""

from __future__ import annotations

import simpy

from simtrain.engine import Task, TaskGraph


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


def simulate_reference(graph: TaskGraph):
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
    dispatched = [env.event() for _ in tasks]  # its dependencies met (what dispatch_after waits for)
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
        if task.deps or task.dispatch_after:
            yield env.all_of([done[d] for d in task.deps] + [dispatched[d] for d in task.dispatch_after])
        dispatched[task.tid].succeed()
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

    return rows, mem_rows, finished


