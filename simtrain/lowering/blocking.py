"""Blocking pipeline p2p in the order of DeepSpeed's pipeline engine (``p2p_mode: blocking``).

DeepSpeed's ``PipelineEngine`` runs, on every stage, the instructions of ``TrainSchedule.steps()``
(``deepspeed/runtime/pipe/schedule.py``) one after another: ``2 (m + p - 1)`` steps; in each a stage
either exchanges activations with the previous stage and runs a forward, or exchanges gradients
with the next stage and runs a backward (even stages run forwards on even steps, odd stages on
odd steps). Its sends and receives are synchronous (``deepspeed/runtime/pipe/p2p.py``:
``assert async_op == False``, then ``dist.send`` / ``dist.recv``; the docstrings of
``SendActivation`` ... ``RecvGrad``: "The communication is blocking and must be paired"), so:

* a transfer starts when both ranks have reached it in their instruction lists (a rendezvous:
  the receiver's matching ``recv`` is only issued after its previous instruction);
* neither rank runs its next instruction before the transfer ends (no overlap with compute);
* the gradient reduction, the tied-embedding sync and the optimizer step run after the last
  step (``ReduceTiedGrads``, ``ReduceGrads``, ``OptimizerStep``), after the stage's last send.

The compute order of ``TrainSchedule`` is 1F1B's (PipeDream-Flush): :func:`deepspeed_steps`
rebuilds the instruction lists and :func:`add_blocking_p2p` checks that the schedule being lowered
has that compute order on every rank.
"""

from __future__ import annotations

from ..engine import Task
from ..errors import SimtrainError
from ..network import Collective
from ..schedules.ir import Action
from .items import Lowering


def _step_to_microbatch(step: int, stage: int, stages: int) -> tuple[int, bool]:
    """(microbatch, is_forward) of ``stage`` at ``step`` (``TrainSchedule._step_to_micro_batch``)."""
    if step % 2 == stage % 2:  # forward steps: even stages on even steps, odd ones on odd steps
        return step // 2 - stage // 2, True
    if step % 2 == 0:  # an odd stage's backward on an even step
        return step // 2 - stages + (stage + 1) // 2, False
    return (step - 1) // 2 - stages + 1 + stage // 2, False


def deepspeed_steps(stages: int, microbatches: int, stage: int) -> list[tuple]:
    """The instructions ``TrainSchedule`` gives ``stage``, flattened, without buffer ids.

    Returns:
        ``("recv" | "send", "act" | "grad", peer_stage, microbatch)`` for the four exchange
        instructions and ``("F" | "B", microbatch)`` for the passes, in execution order.
    """
    out: list[tuple] = []
    prev = -1

    def valid(mb: int) -> bool:
        return 0 <= mb < microbatches

    for step in range(2 * (microbatches + stages - 1)):
        mb, forward = _step_to_microbatch(step, stage, stages)
        if forward and stage > 0:
            if valid(mb):
                out.append(("recv", "act", stage - 1, mb))
            if valid(prev):
                out.append(("send", "grad", stage - 1, prev))
        elif not forward and stage < stages - 1:
            if valid(prev):
                out.append(("send", "act", stage + 1, prev))
            if valid(mb):
                out.append(("recv", "grad", stage + 1, mb))
        if valid(mb):
            out.append(("F" if forward else "B", mb))
        prev = mb
    return out


def add_blocking_p2p(low: Lowering) -> dict[int, int]:
    """Pass 2 under ``p2p_mode: blocking``: every pipeline transfer as a rendezvous of its two ranks
    in DeepSpeed's instruction order (module docstring), priced like :func:`add_p2p`'s sends (the
    route of :meth:`simtrain.network.Topology.route`, plus the profile's per-message overhead at
    each end).

    Returns:
        Rank -> id of the task that ends its last instruction (what its gradient reduction and
        optimizer step must follow).

    Raises:
        SimtrainError: the schedule's compute order is not ``TrainSchedule``'s (1F1B with one stage
            per rank) on some rank.
    """
    schedule, topology, first, last = low.schedule, low.topology, low.first, low.last
    p, m = schedule.num_stages, schedule.num_microbatches
    lists = {s: deepspeed_steps(p, m, s) for s in range(p)}
    for s, steps in lists.items():
        wanted = [Action(s, ins[0], ins[1]) for ins in steps if ins[0] in ("F", "B")]
        r = schedule.stage_to_rank[s] if schedule.num_ranks == p else -1
        if r != s or list(schedule.orders[r]) != wanted:
            raise SimtrainError(f"p2p_mode 'blocking' follows DeepSpeed's TrainSchedule (1F1B, one stage per rank); "
                                f"schedule '{schedule.name}' runs another order on rank {s}: use p2p_mode 'async'")
    for a in first:  # a backward after its own forward (same rank: no transfer)
        if a.kind == "B":
            first[a].deps.append(last[Action(a.stage, "F", a.microbatch)].tid)
    transfers: dict[tuple, Task] = {}
    cursor: dict[int, int | None] = {s: None for s in range(p)}
    overhead = 2 * topology.hardware.message_overhead_s  # posting the send, completing the receive

    def transfer(kind: str, src: int, dst: int, mb: int) -> Task:
        key = (kind, src, dst, mb)
        if key not in transfers:
            producer = Action(src, "F" if kind == "act" else "B", mb)
            nbytes = low.chunk[src if kind == "act" else dst].p2p_bytes
            c = Collective("p2p", "pp", nbytes)
            seconds = topology.seconds(c, src, peer=dst) + overhead if low.comm else 0.0
            transfers[key] = low.graph.add(
                name=f"p2p {producer} -> {dst}", rank=src, peer=dst, category="comm", kind="p2p",
                duration_s=seconds, resources=topology.route(c, src, peer=dst).resources if low.comm else (),
                stage=src, microbatch=mb, nbytes=nbytes)
        return transfers[key]

    for s in range(p):  # each instruction waits for the rank's previous one
        for ins in lists[s]:
            if ins[0] in ("F", "B"):
                a = Action(s, ins[0], ins[1])
                if cursor[s] is not None:
                    first[a].deps.append(cursor[s])
                cursor[s] = last[a].tid
                continue
            op, kind, peer, mb = ins
            src, dst = (s, peer) if op == "send" else (peer, s)
            t = transfer(kind, src, dst, mb)
            if cursor[s] is not None:
                t.deps.append(cursor[s])
            cursor[s] = t.tid
    return {s: tid for s, tid in cursor.items() if tid is not None}


def after_last_instruction(low: Lowering, done: dict[int, int]) -> None:
    """Make each rank's gradient reductions, tied-embedding sync and optimizer step wait for the
    end of its last instruction (``TrainSchedule`` issues ``ReduceTiedGrads``, ``ReduceGrads`` and
    ``OptimizerStep`` after its last step). Run after the optimizer pass."""
    for t in low.graph.tasks:
        if t.rank in done and t.tid != done[t.rank] and (t.kind in ("dp", "OPT")):
            t.deps.append(done[t.rank])
