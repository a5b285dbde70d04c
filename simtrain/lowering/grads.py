"""Gradients allocated at each chunk's first backward (``ParallelConfig.grad_allocation:
first-backward``): torch without a DDP/FSDP wrapper.

``torch.optim.Optimizer.zero_grad`` sets every ``param.grad`` to None (``set_to_none=True``, the
default since torch 2.0; torchtitan's ``OptimizersContainer.zero_grad`` calls it before each
step's forwards, ``train.py``), and a gradient is allocated when the backward first writes it:
``AccumulateGrad`` for a full backward (B), ``stage_backward_weight``'s ``weight.grad = dw`` for
a split one (W; ``stage_backward_input`` computes only input gradients;
``torch/distributed/pipelining/_backward.py``). So the static memory of a rank (:mod:`simtrain.engine`)
lacks its chunks' gradients until then; this pass moves each chunk's gradient bytes
(:meth:`~simtrain.costs.StageCosts.lazy_grad_bytes`) to the end of the chunk's first B or W on
the rank (in the rank's schedule order), where they stay to the step's end. That action frees
its activations (or W-pending buffers) at the same instant: during it the gradients appear and
the activations go layer by layer, so with layers alike the rank's bytes change linearly across
the action and their maximum is at its start (nothing allocated yet) or at its end (both
deltas applied), the two instants the timeline has.
"""

from __future__ import annotations

from .items import Lowering, add_delta


def add_lazy_gradients(low: Lowering) -> None:
    """Move each held chunk's lazily allocated gradient bytes from the rank's static memory to the
    end of its first B or W (no-op when ``costs.lazy_grad_bytes_per_param`` is 0 or the step
    is forward-only)."""
    costs = low.costs
    if not low.training or not costs.lazy_grad_bytes_per_param:
        return
    for rank, order in enumerate(low.schedule.orders):
        allocated: set[int] = set()
        for act in order:
            for a in act.parts:
                chunk = low.schedule.chunk_of(a.stage)
                if a.kind not in ("B", "W") or a not in low.first or chunk in allocated:
                    continue
                allocated.add(chunk)
                nbytes = costs.lazy_grad_bytes([chunk])
                add_delta(low.freed[a], "end", rank, nbytes)
                low.graph.static_memory_bytes[rank] -= nbytes
