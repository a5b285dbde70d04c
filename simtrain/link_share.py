"""Bandwidth sharing on link ports: transfers that use one port at the same time share its bandwidth.

The engine's link ports (``"<link>:<rank>:out"`` / ``":in"``, :mod:`simtrain.network`) are either
capacity-1 FIFO resources (:class:`simtrain.sharing.Ports`) or, for the links a graph names in
``TaskGraph.shared_links``, shared by every transfer using them at the same instant. This module
implements the shared ones.

Model (fluid, per-port egalitarian sharing). A transfer's duration is its *work*: the seconds it
takes on free links. While ``n_p`` transfers are in progress on port ``p``, a transfer progresses
at rate ``1 / max_p n_p`` over the ports it uses: the share of its most shared port (a transfer
holding a sender's egress and a receiver's ingress goes as fast as the busier of the two allows).
Two equal transfers that start together on one port both end at twice their duration; a short
transfer of ``s`` seconds arriving during a long one ends ``2 s`` after it starts, and the long one
ends ``s`` late. Where every transfer of a port uses that port alone (or shares its other ports
with no one), the port is busy as long as under FIFO and its last transfer ends when it would
have; what changes is that a short message no longer waits for a whole bulk transfer ahead of
it. (The rate is not work-conserving across ports: a transfer slowed by a busier port leaves
some of its other port's bandwidth unused; see max-min below.)

Why sharing, not FIFO. Concurrent NCCL operations on different communicators run at once and
split the link: two concurrent nccl-tests broadcasts on the same two GPUs each got half the
bandwidth, their sum the single-operation bandwidth (NVIDIA/nccl#204, 2019: 12 GB/s alone,
halved each when run together); collectives of two PyTorch process groups "genuinely compete
for NVLink bandwidth ... each collective gets a fraction of the available NVLink bandwidth"
(meta-pytorch/torchrec#4251, 2026, the competing_comms benchmark). On InfiniBand the queue pairs
of the several communicators share the HCA port's transmitter, which interleaves their packets
under the port's virtual-lane arbitration, weighted round robin among lanes of equal priority
(InfiniBand Architecture Specification vol. 1, §7.6.9; Shanley, *InfiniBand Network
Architecture*, ch. 25, "CA port's transmitter and receiver are shared resources"): no
communicator's message waits for another's to end. Operations of ONE communicator are
serialized by NCCL: "NCCL collective operations on a given communicator are always serialized"
(S. Jeaugey, NVIDIA/nccl#574). So sharing is among communicators, and each communicator's
transfers on a port keep their order: a transfer first takes, capacity-1 and first come first
served like any resource, the *lane* of its kind on each of its shared ports (``"<port>@<kind>"``:
``p2p``, ``dp``, ``a2a`` ..., the engine's stand-in for the communicator), and only then shares
the port with the transfers of other kinds. The waves of one all-to-all, issued at once, thus
still run one after the other, and a pipeline send no longer waits for a DP reduction.

Why the most shared port and not a max-min fair allocation. A max-min fair share (progressive
filling, Bertsekas & Gallager, *Data Networks*, 2nd ed., §6.5.2) gives each transfer at least
``1 / max_p n_p`` (its share of its bottleneck port) and sometimes more, where another transfer
on that port is held back elsewhere. It couples every transfer to every other one of the
connected set of ports (through a pipeline's p2p chains: every port of the job), so each start
and end would re-solve the whole set. The most-shared-port rate changes only for the transfers on
the ports of the one that starts or ends, so an event costs the size of those ports' queues.
The two agree whenever the transfers sharing a port have that port as their bottleneck (the
cases that matter here: a pipeline send beside a rank's DP reduction, two collectives of one
rank); elsewhere the rate here is a lower bound of max-min's.

The fixed latency part of a transfer is shared as well: the engine sees one duration per task
and cannot split a collective's (NCCL's model, :mod:`simtrain.collectives`) latency from its
bandwidth time. Physically only the bandwidth part is shared; counting the latency too delays a
shared transfer by at most ``(n - 1) x`` its latency (microseconds per message against the
milliseconds to seconds of the transfers that overlap).

Exactness and speed. A transfer that starts with every one of its ports free gets the finish
event the engine gives any task (``(STEP_FINISH, tid)`` at ``now + duration``): where no two
transfers of a port overlap, the trace is that of FIFO ports, step for step. Only when a
transfer joins a port in use are the transfers on its ports re-planned: each one's old finish
event is disarmed (its step becomes a no-op) and a new one, this module's own step, scheduled;
it re-plans the neighbours of the transfer it ends and then makes ``(STEP_FINISH, tid)`` due.
Rates are piecewise constant, so every finish time is exact (no time step).

SMs. A shared transfer that is also an NCCL collective taking SMs (:mod:`simtrain.sm_share`)
tells its SM pool that it takes its SMs for its duration on free links
(:meth:`simtrain.sm_share.SmShare.take`): the SMs of a collective stretched by sharing are
counted free again at its unshared end (a known simplification, documented there).
"""

from __future__ import annotations

from collections.abc import Iterable
from heapq import heappush

from simpy.events import NORMAL

from .errors import SimtrainError
from .sharing import STEP_FINISH, Clock, Due


def link_of(port: str) -> str:
    """The link name of an engine resource name: the part before the first ``:`` (``"nic"`` for
    ``"nic:3:out"``)."""
    return port.split(":", 1)[0]


class _Flow:
    """One transfer in progress: its ports, work left (s on free links) at time ``at`` (s), its
    rate (0..1], planned end (s) and the event making it due (None: due now, no event)."""

    __slots__ = ("ports", "left", "at", "rate", "end", "event")

    def __init__(self, ports: tuple[str, ...], left: float, at: float, rate: float):
        self.ports, self.left, self.at, self.rate = ports, left, at, rate
        self.end = at + left / rate
        self.event: Due | None = None


class LinkShare:
    """The shared link ports of one run (module docstring).

    Args:
        clock: the run's clock (its ``now`` is set wherever the engine calls in).
        tasks: the graph's tasks (for each shared transfer's processor pool).
        shared: id of each task on shared ports -> those ports (:meth:`split`).
        pools: the run's processor pools by name (a shared transfer on an SM pool tells it the
            SMs it takes, :meth:`simtrain.sm_share.SmShare.take`).
    """

    def __init__(self, clock: Clock, tasks: list, shared: dict[int, tuple[str, ...]], pools: dict):
        self.clock = clock
        self.tasks = tasks
        self.ports_of = shared
        self.shared = frozenset(shared)
        self.pools = pools
        # a transfer that started on free ports is *alone*: each of its ports maps to
        # (tid, end, event, ports, seconds, start) in `alone` (kept after it ends: its end says so);
        # once another joins one of its ports it is *crowded*: a _Flow in `flows`, listed on its
        # ports in `users` (until retired; some may have ended at this instant: end <= now)
        self.alone: dict[str, tuple] = {}
        self.users: dict[str, list[int]] = {}
        self.flows: dict[int, _Flow] = {}

    @staticmethod
    def split(tasks: list, links: Iterable[str], pools: dict) -> tuple[dict[int, tuple[str, ...]], list[tuple]]:
        """Which resources of each task of ``tasks`` are shared ports, and which are capacity-1
        resources it takes first.

        A port of one of ``links`` (link names, :func:`link_of`) is shared if transfers of more
        than one kind use it. The transfers of one kind on a port are one communicator's and run
        in order (module docstring), so a port that only one kind uses stays a capacity-1
        resource (the same trace, at no cost); on a shared port a transfer first takes the
        capacity-1 lane of its kind, ``"<port>@<kind>"``. A task's capacity-1 resources are thus
        its resources that are not shared ports (e.g. a hardware queue,
        :mod:`simtrain.lowering.queues`) and the lanes of its shared ports.

        Returns:
            ``(shared, holds)``: task id -> its shared ports, for the tasks with some; and each
            task's capacity-1 resources, by task id (its resources when it has no shared port).

        """
        holds = [t.resources for t in tasks]
        links = frozenset(links)
        if not links:
            return {}, holds
        kinds = [t.kind for t in tasks]
        distinct = set(zip(holds, kinds))  # few: each split once
        users: dict[str, set[str]] = {}  # shared-link port -> the kinds of transfer using it
        for names, kind in distinct:
            for name in names:
                if link_of(name) in links:
                    users.setdefault(name, set()).add(kind)
        crossed = frozenset(name for name, used in users.items() if len(used) > 1)
        if not crossed:
            return {}, holds
        parts = {key: part for key in distinct if (part := _part(*key, crossed)) is not None}
        found = list(map(parts.get, zip(holds, kinds)))
        shared = {tid: part[0] for tid, part in enumerate(found) if part is not None}
        return shared, [names if part is None else part[1] for part, names in zip(found, holds)]

    # ------------------------------------------------------------------ the engine's entry point
    def work(self, tid: int, seconds: float) -> None:
        """Transfer ``tid`` starts now with ``seconds`` of work; its finish is made due as the step
        ``(STEP_FINISH, tid)``.

        Raises:
            SimtrainError: the transfer is on a processor pool that does not take SMs (a
                :class:`simtrain.sharing.SharedProcessors` pool, whose work is its duration: the
                two rates are not combined; the lowering puts only compute there).
        """
        pool = self.tasks[tid].pool
        if pool is not None:
            take = getattr(self.pools[pool], "take", None)
            if take is None:
                task = self.tasks[tid]
                raise SimtrainError(f"task {task.name} (rank {task.rank}): on processor pool {pool!r} and on "
                                    f"shared link ports {', '.join(self.ports_of[tid])}; allowed: one of the two")
            take(tid, seconds)
        clock, ports, users, alone = self.clock, self.ports_of[tid], self.users, self.alone
        now = clock.now
        for port in ports:
            if port in users:
                break
            other = alone.get(port)
            if other is not None and other[1] > now:
                break
        else:  # every port free: the engine's own finish event (Clock.after, inline)
            end = now + seconds
            if end == now:
                event = None
                clock.fifo.append((STEP_FINISH, tid))
            else:
                event = Due()
                event.callbacks, event.step = clock.callbacks, (STEP_FINISH, tid)
                heappush(clock.queue, (end, NORMAL, next(clock.eid), event))
            entry = (tid, end, event, ports, seconds, now)
            for port in ports:
                alone[port] = entry
            return
        self._crowd(tid, seconds, ports, now)

    def _crowd(self, tid: int, seconds: float, ports: tuple[str, ...], now: float) -> None:
        """Transfer ``tid`` starts on ports some other transfer uses: those alone on them become
        crowded, what has ended is retired, and every transfer on its ports is re-planned."""
        users, alone, flows = self.users, self.alone, self.flows
        for port in ports:
            other = alone.pop(port, None)
            if other is not None and other[1] > now:
                other_tid, _, event, other_ports, work, start = other
                flow = flows[other_tid] = _Flow(other_ports, work, start, 1.0)
                flow.event = event
                for q in other_ports:
                    users.setdefault(q, []).append(other_tid)
                    if alone.get(q) is other:
                        del alone[q]
        neighbours: list[int] = []
        for port in ports:  # first retire what has ended on them (it may leave others of them empty)
            on = users.get(port)
            if on:
                self._prune(on, now, neighbours)
        for port in ports:
            on = users.get(port)
            if on:
                neighbours.extend(on)
                on.append(tid)
            else:
                users[port] = [tid]
        flow = flows[tid] = _Flow(ports, seconds, now, self._rate(ports))
        self._schedule(tid, flow)
        self._replan(neighbours, now)

    # ------------------------------------------------------------------ rates and plans
    def _rate(self, ports: tuple[str, ...]) -> float:
        """The rate of a transfer on ``ports``: 1 / the most users any of them has now."""
        users = self.users
        return 1.0 / max(len(users[p]) for p in ports)

    def _prune(self, on: list[int], now: float, neighbours: list[int]) -> None:
        """Retire the transfers of a port (``on``, its users) that have ended by ``now`` (their
        finish is due now or was processed); the transfers left on their ports go to ``neighbours``."""
        flows = self.flows
        for tid in [t for t in on if flows[t].end <= now]:
            if tid in flows:  # (a transfer listed twice on one port is retired once)
                self._retire(tid, neighbours)

    def _retire(self, tid: int, neighbours: list[int]) -> None:
        """Take transfer ``tid`` off its ports; the transfers left on them go to ``neighbours``."""
        flow = self.flows.pop(tid)
        users = self.users
        for port in flow.ports:
            on = users[port]
            on.remove(tid)
            if on:
                neighbours.extend(on)
            else:
                del users[port]

    def _replan(self, tids: list[int], now: float) -> None:
        """Bring each still running transfer of ``tids`` to ``now`` at its old rate and, if its
        rate changed, move its finish (the old event disarmed)."""
        flows = self.flows
        seen = set()
        for tid in tids:
            flow = flows.get(tid)
            if flow is None or tid in seen or flow.end <= now:
                continue
            seen.add(tid)
            rate = self._rate(flow.ports)
            if rate == flow.rate:
                continue
            flow.left = max(flow.left - (now - flow.at) * flow.rate, 0.0)
            flow.at, flow.rate = now, rate
            if flow.event is not None:
                flow.event.step = (_skip, tid)
            self._schedule(tid, flow)

    def _schedule(self, tid: int, flow: _Flow) -> None:
        """Make this module's end step of ``tid`` due when ``flow`` finishes at its rate."""
        delay = flow.left / flow.rate
        flow.end = flow.at + delay
        flow.event = self.clock.after(delay, (self._end, tid))

    def _end(self, tid: int) -> None:
        """A re-planned transfer's work is done: retire it (unless a start at this same instant
        already did), re-plan the transfers left on its ports, and make its finish due."""
        if tid in self.flows:
            neighbours: list[int] = []
            self._retire(tid, neighbours)
            now = self.clock.now
            for other in neighbours:  # those ending now too are retired, not re-planned
                flow = self.flows.get(other)
                if flow is not None and flow.end <= now:
                    self._retire(other, neighbours)
            self._replan(neighbours, now)
        self.clock.fifo.append((STEP_FINISH, tid))


def _part(names: tuple[str, ...], kind: str, crossed: frozenset[str]) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """:meth:`LinkShare.split` of one task's resources ``names`` and ``kind``: (its ports that
    transfers of several kinds use, its capacity-1 resources), or None without such a port."""
    shared = tuple(n for n in names if n in crossed)
    if not shared:
        return None
    return shared, tuple(n for n in names if n not in crossed) + tuple(f"{n}@{kind}" for n in shared)


def _skip(tid: int) -> None:
    """The step of a disarmed finish event: nothing."""
