"""One GPU's streaming multiprocessors shared by its compute and the kernels that take some of them.

A :class:`SmShare` is a processor pool of the engine (``TaskGraph.pools``; a task names it in
``Task.pool``) that models one GPU: some of its tasks *take* SMs while they run (a communication
kernel's CTAs, each holding one SM for the kernel's whole life), the others *compute* and run
slower while SMs are taken. It knows tasks and SM counts, nothing about schedules: which tasks take
how many SMs, and which share of each compute task is slowed, are given when it is built
(:mod:`simtrain.lowering.nccl_sms` fills them in for NCCL collectives).

Rates. With ``S`` SMs of which ``c`` are taken, a compute task whose compute-bound share of seconds
is ``f`` progresses at ``1 / (f S / (S - c) + 1 - f)`` of its full speed (the model of
:mod:`simtrain.costs.ep_sms`: compute-bound kernels slow down with the SMs they lose, memory-bound
ones keep their time); ``c`` is the sum of the SMs of the takers running at that instant (at most
``S - 1``). A taker's duration is fixed (communication is not slowed by compute), so every change
of rate but one is known in advance: the end of a running taker. The one that is not, a taker
starting, re-plans the compute tasks running then. The rate is piecewise constant, so each finish
time is exact (no time step).

Exactness where nothing overlaps: a compute task that starts with no taker running and meets none
gets the same finish event, scheduled the same way, as a task without a pool
(:class:`simtrain.sharing.Due` at ``now + duration``), and a taker's finish is scheduled exactly
as any task's. So graphs in which no taker overlaps compute give the same trace as without the
pools. A re-planned task's old finish event is disarmed (its step becomes a no-op) and a new one
scheduled; the engine sees the finish only once.
"""

from __future__ import annotations

from .sharing import STEP_FINISH, Clock, Due


class SmShare:
    """The SMs of one GPU, shared by compute tasks and SM-taking tasks (module docstring).

    Args:
        sms: streaming multiprocessors of the GPU (>= 2).
        takers: task id -> SMs it holds while it runs (>= 1).
        compute_bound: task id -> share of its seconds that is compute-bound (0..1) for every
            compute task of the pool; a task of the pool in neither map runs at full speed.

    ``TaskGraph.pools`` holds its :meth:`factory`; the engine builds one bound to each run's
    clock. Nothing here raises: the lowering checks the counts (:mod:`simtrain.lowering.nccl_sms`).
    """

    def __init__(self, sms: int, takers: dict[int, int], compute_bound: dict[int, float]):
        self.sms = sms
        self.takers = takers
        self.compute_bound = compute_bound
        self.clock: Clock | None = None
        self.running_takers: list[tuple[float, int]] = []  # (end time, SMs) of takers that started
        self.running: dict[int, list] = {}  # compute tid -> [work left (s), at time, finish time, event]
        self.busy_until = 0.0  # when the last taker that started ends

    def factory(self, clock: Clock) -> SmShare:
        """A fresh copy of this pool bound to ``clock`` (the engine builds pools per run)."""
        pool = SmShare(self.sms, self.takers, self.compute_bound)
        pool.clock = clock
        return pool

    # ------------------------------------------------------------------ the engine's entry point
    def work(self, tid: int, seconds: float) -> None:
        """Task ``tid`` starts now with ``seconds`` of work (its duration at full speed); its
        finish is scheduled as the step ``(STEP_FINISH, tid)``."""
        now = self.clock.now
        if tid in self.takers:  # a taker: fixed duration; the compute running now slows down
            self._schedule(tid, seconds)
            self.take(tid, seconds)
            return
        if now >= self.busy_until:  # no SM taken: exactly the engine's own scheduling of the task
            self.running[tid] = [seconds, now, now + seconds, self._schedule(tid, seconds)]
            return
        finish = self._finish_time(tid, seconds, now)
        self.running[tid] = [seconds, now, finish, self._schedule(tid, finish - now)]

    def take(self, tid: int, seconds: float) -> None:
        """Taker ``tid`` holds its SMs from now for ``seconds``; the compute running now is
        re-planned. :meth:`work` makes the taker's finish due; a transfer whose finish another
        model decides (a shared link, :mod:`simtrain.link_share`) calls this alone, with its
        duration on free links: if sharing stretches it, its SMs count as free again from that
        unshared end on (a simplification: NCCL's CTAs stay until the kernel ends)."""
        now = self.clock.now
        if self.running:  # (without compute to slow, the ended takers are dropped later)
            self._advance(now)
        end = now + seconds
        self.running_takers.append((end, self.takers[tid]))
        if end > self.busy_until:
            self.busy_until = end
        for task, state in self.running.items():
            self._replan(task, state, now)

    # ------------------------------------------------------------------ rates and plans
    def _taken_at(self, t: float) -> int:
        """SMs held by the takers running at time ``t`` (from now on), at most ``sms - 1``."""
        return min(self.sms - 1, sum(c for end, c in self.running_takers if end > t))

    def _rate(self, tid: int, taken: int) -> float:
        """Progress per second of compute task ``tid`` with ``taken`` SMs gone (module docstring)."""
        if not taken:
            return 1.0
        f = self.compute_bound.get(tid, 0.0)
        return 1.0 / (f * self.sms / (self.sms - taken) + 1.0 - f)

    def _segments(self, start: float):
        """``(from, to, taken SMs)`` of the known piecewise-constant stretch from ``start`` on (the
        last one open-ended, ``to`` = inf, nothing taken)."""
        t = start
        for end in sorted({end for end, _ in self.running_takers if end > start}):
            yield t, end, self._taken_at(t)
            t = end
        yield t, float("inf"), 0

    def _finish_time(self, tid: int, work: float, start: float) -> float:
        """When compute task ``tid`` with ``work`` seconds left at ``start`` finishes, if no other
        taker starts."""
        for lo, hi, taken in self._segments(start):
            rate = self._rate(tid, taken)
            if work <= rate * (hi - lo):
                return lo + work / rate
            work -= rate * (hi - lo)
        raise AssertionError("unreachable: the last segment is open-ended")

    def _advance(self, now: float) -> None:
        """Bring every running compute task's work left to ``now`` (a taker starts); forget the
        tasks that are done by then and the takers that ended. Between two taker starts the rates
        change only when a taker ends, which every plan already counts in."""
        for tid, state in list(self.running.items()):
            if state[2] <= now:  # finished (its finish step is due now or was taken)
                del self.running[tid]
                continue
            left, at = state[0], state[1]
            for lo, hi, taken in self._segments(at):
                if lo >= now:
                    break
                left -= self._rate(tid, taken) * (min(hi, now) - lo)
            state[0], state[1] = max(left, 0.0), now
        self.running_takers = [(end, c) for end, c in self.running_takers if end > now]

    def _replan(self, tid: int, state: list, now: float) -> None:
        """A taker started: move compute task ``tid``'s finish to its new time."""
        finish = self._finish_time(tid, state[0], now)
        if finish == state[2]:
            return
        old = state[3]
        if old is not None:
            old.step = (_skip, tid)  # disarmed: processed as a no-op step
        state[2], state[3] = finish, self._schedule(tid, finish - now)

    def _schedule(self, tid: int, delay_s: float) -> Due | None:
        """Make ``(STEP_FINISH, tid)`` due ``delay_s`` from now, as the engine does for a task
        without a pool; returns the event (None when the delay is too small to move the clock)."""
        return self.clock.after(delay_s, (STEP_FINISH, tid))


def _skip(tid: int) -> None:
    """The step of a disarmed finish event: nothing."""
