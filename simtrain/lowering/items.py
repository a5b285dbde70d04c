"""The items a lowered action is made of, and the state the lowering passes share.

Every action of a schedule (a plain F/B/I/W, each half of an overlapped F&B pair, an action on an
MoE stage) becomes one :class:`Chain`: a list of *steps*, each a few items emitted together, and a
*tail* emitted after every chain of the schedule step. The items are compute slices on the
rank's ``compute`` stream (:class:`Compute`), tensor-parallel collectives on its ``tp`` stream
(:class:`TPComm`) and MoE blocks (:class:`Block`: all-to-all, experts, all-to-all). One emitter
(:func:`simtrain.lowering.chains.emit`) turns chains into tasks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..costs import ChunkCost, StageCosts
from ..engine import Task, TaskGraph
from ..moe import A2ACost
from ..network import A2APart, Topology
from ..schedules.ir import Action, Schedule


@dataclass(frozen=True)
class Compute:
    """A compute slice: ``seconds`` on the compute stream, named ``label``."""

    seconds: float
    label: str


@dataclass(frozen=True)
class TPComm:
    """In-stage collectives: ``seconds`` on ``stream`` (``tp``, or ``cp`` for context
    parallelism; also the task's kind) after the chain's previous item, holding ``resources``; the
    chain's next item waits for it; ``nbytes``: their buffers' bytes (each collective's
    :attr:`~simtrain.network.Collective.nbytes` x its ``repeat``), for the trace."""

    seconds: float
    label: str
    resources: tuple[str, ...]
    stream: str = "tp"
    nbytes: float = 0.0


@dataclass(frozen=True)
class Block:
    """An MoE block: all-to-all ``to_experts``, ``expert_s`` of expert compute, all-to-all
    ``back``; ``names`` label the two all-to-alls in the trace; ``last_layer`` is the last of
    the layers it stands for when it stands for several (``parallel.moe_coarsen``), else None."""

    layer: int
    expert_s: float
    to_experts: A2ACost
    back: A2ACost
    names: tuple[str, str]
    last_layer: int | None = None

    @property
    def label(self) -> str:
        """``L<layer>``, or ``L<first>-<last>`` for a coarsened block."""
        return f"L{self.layer}" if self.last_layer is None else f"L{self.layer}-{self.last_layer}"


Item = Compute | TPComm | Block


@dataclass(frozen=True)
class Transfer:
    """One link class's share of an all-to-all (``part``: its bytes and seconds) and the engine
    ports it holds while it runs (``resources``)."""

    part: A2APart
    resources: tuple[str, ...]


@dataclass
class Chain:
    """What one action lowers to.

    Attributes:
        action: the action.
        chunk: its chunk's costs.
        steps: groups of items; the steps of two chains of a pair alternate (see
            :func:`simtrain.lowering.chains.emit`).
        tail: items emitted after every step of the schedule step (a MoE action's TP collectives).
        buckets: how the action's compute is cut for DP gradient buckets: ``"pieces"`` (bucket i
            after compute task i), ``"elapsed"`` (after the compute task by whose end (i+1)/n of
            the compute ran) or ``"end"`` (all after the action).
        compute, tasks: filled by the emitter: the chain's compute tasks (expert tasks included)
            and all its tasks, in creation order.
    """

    action: Action
    chunk: ChunkCost
    steps: list[list[Item]]
    tail: list[Item] = field(default_factory=list)
    buckets: str = "end"
    compute: list[Task] = field(default_factory=list)
    tasks: list[Task] = field(default_factory=list)


@dataclass
class Lowering:
    """The state the lowering passes share.

    Attributes:
        schedule, costs, topology: the inputs of :func:`simtrain.lowering.lower`.
        comm: False makes every communication free.
        waves: expert waves per MoE block.
        graph: the task graph being built.
        chunk: the chunk cost of each stage.
        held: the chunks each rank holds.
        first, last: the first task of each action (its dependencies attach there) and the task
            whose end means it is done.
        freed: the action's last compute task, at whose end its memory is freed.
        bucket_after: for each action that completes a stage's weight gradients, the task after
            which each of its gradient buckets is ready.
        dp_tasks: each rank's gradient-reduction tasks (its optimizer waits for them).
        tp_cache: (stage, kind, rank, stream) -> seconds, ports and bytes of the action's TP (or CP)
            collectives.
        a2a_cache: (id of an all-to-all cost, rank, lane) -> that cost and its engine transfers.
        item_cache: (stage, kind, compute factor) -> the MoE items of its actions, labels after
            the action's name (:func:`simtrain.lowering.moe.item_template`).
        chain_tasks: how many tasks the chains' emitter made (the graph's first ones; the host
            launch order of :func:`simtrain.lowering.queues.issue_order` starts from them).
    """

    schedule: Schedule
    costs: StageCosts
    topology: Topology
    comm: bool
    waves: int
    graph: TaskGraph
    chunk: list[ChunkCost]
    held: list[set[int]]
    first: dict[Action, Task] = field(default_factory=dict)
    last: dict[Action, Task] = field(default_factory=dict)
    freed: dict[Action, Task] = field(default_factory=dict)
    bucket_after: dict[Action, list[Task]] = field(default_factory=dict)
    dp_tasks: dict[int, list[Task]] = field(default_factory=dict)
    tp_cache: dict[tuple, tuple[float, tuple[str, ...], float]] = field(default_factory=dict)
    a2a_cache: dict[tuple, tuple[A2ACost, list[Transfer]]] = field(default_factory=dict)
    item_cache: dict[tuple, list[Compute | Block]] = field(default_factory=dict)
    chain_tasks: int = 0

    @property
    def training(self) -> bool:
        """Whether the step has a backward (not ``forward_only``)."""
        return not self.topology.parallel.forward_only


NO_DELTAS: tuple = ()
"""The memory deltas of a task that has none and is built in bulk (an all-to-all transfer,
:func:`simtrain.lowering.moe.add_block`): one shared empty tuple instead of two new lists per task
(an MoE step has ~10^5 transfers). :func:`add_delta` gives such a task lists of its own."""


def add_delta(task: Task, at: str, rank: int, delta_bytes: float) -> None:
    """Apply ``delta_bytes`` to ``rank``'s memory when ``task`` starts (``at="start"``) or ends
    (``at="end"``), after the deltas it has; a task holding :data:`NO_DELTAS` gets a new list."""
    name = "mem_start" if at == "start" else "mem_end"
    deltas = getattr(task, name)
    if deltas is NO_DELTAS:
        deltas = []
        setattr(task, name, deltas)
    deltas.append((rank, delta_bytes))

