"""The SMs that expert-parallel communication kernels take from the compute they overlap.

DeepEP's dispatch and combine are kernels that run on the GPU's streaming multiprocessors (SMs):
``deep_ep.Buffer.num_sms = 20``, "the SMs used in high-throughput kernels" (deepseek-ai/DeepEP
``deep_ep/buffer.py``, commit dcfd954851157f0bf683e1c3f1a7778f78344759; every dispatch and
combine config of ``get_dispatch_config``/``get_combine_config`` is built with it), and the
DeepSeek-V3 report (arXiv:2412.19437, §3.2.2) states "only 20 SMs are sufficient to fully utilize
the bandwidths of IB and NVLink" of an H800's 132. While they run, the compute kernels of the
same GPU get the other ``S - s`` SMs.

Model (an assumption, stated): a compute-bound kernel (a large GEMM, FlashAttention) runs at a
rate proportional to the SMs it gets (its tiles are spread over the SMs in waves), so it takes
``S / (S - s)`` times as long; a memory-bound kernel keeps its time (a fraction of the SMs
already saturates HBM, so the bandwidth it reaches falls much less than the SM count; kept
unchanged here). An item of ``c`` compute-bound and ``m`` memory-bound seconds takes
``c x S / (S - s) + m``: :func:`item_factor` of its compute-bound fraction ``c / (c + m)``.

Where it applies (:mod:`simtrain.lowering.chains`): the engine gives every task a fixed duration,
so "slower only while an all-to-all is in flight" cannot be expressed exactly. The approximation:

* an overlapped F&B pair with MoE blocks (DualPipe, DualPipeV, ``1f1b-overlap``): every compute
  item of both halves, since each half's all-to-alls are meant to run under the other half's
  compute (DeepSeek-V3 §3.2.1, Figure 4);
* a Waved-EP block outside a pair: its experts' compute (each wave's experts run while the other
  waves' dispatch and combine are in flight); the attention part is not concurrent with an
  all-to-all there and is unchanged;
* serial (non-waved, non-paired) MoE and dense models: nothing (no EP kernel runs beside compute).

The compute-bound fractions come from the per-operator model (:func:`bound_fractions`, per pass,
one for a chunk's segments and one for its experts); under the flat model every second is
GEMM-rated, so the fractions are 1.
"""

from __future__ import annotations

from ..errors import SimtrainError

PASSES = ("F", "I", "B")
"""Action kinds a fraction is kept for (B: I and W together)."""


def ep_slowdown(hardware, parallel) -> float:
    """``S / (S - s)``: how much longer a compute-bound kernel takes beside EP communication.

    Args:
        hardware: a :class:`simtrain.hardware.HardwareProfile` (``sms``: SMs per GPU, or None).
        parallel: a :class:`simtrain.parallel.ParallelConfig` (``ep_comm_sms``: the SMs of the
            dispatch / combine kernels; ``ep``).

    Returns:
        1.0 without expert parallelism, with ``ep_comm_sms = 0`` or a profile without ``sms``;
        otherwise ``S / (S - s)`` (H800, 132 SMs, DeepEP's 20: 132 / 112 = 1.1786).

    Raises:
        SimtrainError: ``ep_comm_sms`` not below the profile's ``sms``.
    """
    s, total = parallel.ep_comm_sms, hardware.sms
    if parallel.ep == 1 or s == 0 or total is None:
        return 1.0
    check_ep_sms(hardware, parallel)
    return total / (total - s)


def check_ep_sms(hardware, parallel) -> None:
    """Refuse an EP communication SM count the GPU cannot spare.

    Raises:
        SimtrainError: ``ep_comm_sms`` >= the profile's ``sms`` (no SM left for compute).
    """
    s, total = parallel.ep_comm_sms, hardware.sms
    if total is not None and parallel.ep > 1 and s >= total:
        raise SimtrainError(f"parallel.ep_comm_sms = {s}: must be below the {total} SMs (sms) of hardware profile "
                            f"{hardware.name} (no SM would be left for compute); DeepEP's default is 20")


def item_factor(slowdown: float, compute_fraction: float) -> float:
    """Time factor of an item whose ``compute_fraction`` of seconds is compute-bound:
    ``1 + compute_fraction x (slowdown - 1)`` (module docstring)."""
    return 1.0 + compute_fraction * (slowdown - 1.0)


def bound_fractions(segment_ops, expert_ops) -> tuple[tuple[float, float], ...]:
    """Per pass (:data:`PASSES`), the compute-bound share of the seconds of ``segment_ops`` and of
    ``expert_ops`` (:class:`simtrain.costs.ops.OpCost` lists; ``bound == "compute"`` counts).

    Returns:
        ``((F segments, F experts), (I ...), (B ...))``; 1.0 where a list has no seconds.
    """
    def share(ops, passes) -> float:
        total = sum(o.seconds[p] for o in ops for p in passes)
        bound = sum(o.seconds[p] for o in ops for p in passes if o.bound == "compute")
        return bound / total if total > 0 else 1.0

    index = {"F": (0,), "I": (1,), "B": (1, 2)}
    return tuple((share(segment_ops, index[k]), share(expert_ops, index[k])) for k in PASSES)
