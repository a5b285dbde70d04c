"""Activation offload in the lowering: device-to-host copies of saved activations after each
forward, copied back before the backward that needs them (``--offload activations[=FRACTION]``).

Sources: Wan et al., "PipeOffload: Improving Scalability of Pipeline Parallelism with Memory
Optimization", ICML 2025 (arXiv:2503.01328), §3: in pipeline parallelism most activations wait
long between their forward and their backward, so they can be offloaded to host memory over PCIe
and reloaded before the backward, the copies overlapped with compute; a fraction can be
offloaded where the link is too slow for all (selective offload). With ``--no-comm`` the copies take no time. Megatron-Core's fine-grained
activation offloading does the same per module, on copy streams of their own.

How simtrain lowers it (training steps only; a forward-only step frees its activations anyway):

* after every F whose backward comes at least :data:`MIN_STEPS_BETWEEN` steps later on its rank
  (the others stay on the GPU), an ``offload`` task (kind ``offload``) on the rank's ``offload`` stream copies
  ``FRACTION x activation_bytes`` of the chunk to the host: a :class:`simtrain.network.Collective`
  ``d2h`` priced by :meth:`simtrain.network.Topology.seconds` (``bytes / (pcie bandwidth x
  efficiency)`` + latency) on the GPU's ``pcie`` out port. The bytes leave HBM when the copy ends;
* before every B (or I, when the backward is split) a ``reload`` task on the ``reload`` stream
  (the ``h2d`` direction, the ``pcie`` in port: PCIe is full duplex, so reloads do not wait for
  offloads) copies them back, allocating them when it starts. It is issued once its copy to the
  host is done and the rank's step two steps before the backward is done, so it runs while the
  step just before the backward computes (prefetched one step ahead, like the ZeRO-3 gathers of
  :mod:`simtrain.lowering.zero`); the backward waits for it;
* the backward frees the whole activation when it ends, as without offload.

Where the copies are hidden, each in-flight microbatch holds ``(1 - FRACTION) x activation_bytes``
between its offload and its reload instead of ``activation_bytes``. Where they are not (a copy
slower than the step that should hide it), the backward waits for its reload: the step time says
so.
"""

from __future__ import annotations

from ..network import Collective, check_host_link
from ..schedules.ir import Action
from .items import Lowering

MIN_STEPS_BETWEEN = 2
"""Offload an F's activation only when at least this many of its rank's steps run between the F
and its backward: one to hide the copy out, one to hide the copy back. An activation needed
sooner stays on the GPU, as in PipeOffload's selective offload (§4), which keeps the activations
of short lifespan (the last stages of 1F1B) in HBM."""


def _backward_of(low: Lowering, f: Action) -> Action | None:
    """The action that first needs ``f``'s activation back: its B, else its I (None if neither)."""
    for kind in ("B", "I"):
        a = Action(f.stage, kind, f.microbatch)
        if a in low.first:
            return a
    return None


def add_offload(low: Lowering) -> None:
    """The offload pass: an ``offload`` copy after every F whose backward is at least
    :data:`MIN_STEPS_BETWEEN` steps later on its rank, and a ``reload`` copy before that backward,
    with their memory deltas (see the module docstring)."""
    fraction = low.topology.parallel.offload_fraction
    if fraction <= 0 or not low.training:
        return
    check_host_link(low.topology.parallel, low.topology.hardware)  # (check_settings names the setting first)
    topology = low.topology
    for rank, order in enumerate(low.schedule.orders):
        ports = {op: topology.route(Collective(op, "host", 0.0), rank).resources for op in ("d2h", "h2d")}
        steps = [parts for act in order if (parts := [a for a in act.parts if a in low.first])]
        step_of = {a: i for i, parts in enumerate(steps) for a in parts}
        kept = [(i, f, b) for i, parts in enumerate(steps) for f in parts if f.kind == "F"
                and (b := _backward_of(low, f)) is not None and step_of[b] - i - 1 >= MIN_STEPS_BETWEEN]
        out: dict[Action, int] = {}
        for _, f, _ in kept:  # the offload stream in forward order
            nbytes = fraction * low.chunk[f.stage].activation_bytes
            out[f] = low.graph.add(
                name=f"offload {f}", rank=rank, category="comm", kind="offload", stream="offload",
                duration_s=_copy_s(low, "d2h", nbytes, rank), deps=[low.last[f].tid], resources=ports["d2h"],
                stage=f.stage, microbatch=f.microbatch, nbytes=nbytes, mem_end=[(rank, -nbytes)],
            ).tid
        for _, f, b in sorted(kept, key=lambda k: step_of[k[2]]):  # the reload stream in backward order
            nbytes = fraction * low.chunk[f.stage].activation_bytes
            back = low.graph.add(
                name=f"reload {b}", rank=rank, category="comm", kind="offload", stream="reload",
                duration_s=_copy_s(low, "h2d", nbytes, rank),
                deps=[out[f], *(low.last[p].tid for p in steps[step_of[b] - 2])], resources=ports["h2d"],
                stage=b.stage, microbatch=b.microbatch, nbytes=nbytes, mem_start=[(rank, nbytes)],
            )
            low.first[b].deps.append(back.tid)


def _copy_s(low: Lowering, op: str, nbytes: float, rank: int) -> float:
    """Seconds of one ``d2h`` / ``h2d`` copy of ``nbytes`` on ``rank`` (0 with ``--no-comm``)."""
    return low.topology.seconds(Collective(op, "host", nbytes), rank) if low.comm else 0.0
