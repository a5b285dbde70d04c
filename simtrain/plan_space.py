"""The search space of ``simtrain plan``: the points :func:`enumerate_space` yields for a
:class:`~simtrain.plan.PlanRequest`, each a :class:`Config` (tp, pp, dp, ep, vp, schedule,
microbatch size, microbatches, recompute, ZeRO stage, and the request's gradient dtype), with the
first cheap reason it cannot run.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .checks import EP_PAIRED, PAIRED
from .parallel import ParallelConfig
from .plan_bounds import divisors
from .schedules import REGISTRY, split_name

if TYPE_CHECKING:
    from .plan import PlanRequest

MICROBATCH_SIZES = (1, 2, 4, 8)
"""Sequences per microbatch tried (Megatron-LM 2021 §5.4.2 / Fig. 16 sweeps 1-8)."""

VIRTUAL_STAGES = (2, 3, 4, 6, 8)
"""Stages per rank tried for interleaved schedules (vp = 1 is plain 1F1B); pp x vp <= layers."""


@dataclass(frozen=True, order=True)
class Config:
    """One point of the space (the fields of a result row that say what runs)."""

    tp: int
    pp: int
    dp: int
    ep: int
    vp: int
    schedule: str
    microbatch_size: int
    microbatches: int
    recompute: str
    zero_stage: int
    grad_reduce_dtype: str | None = None  # the request's, the same for every point (ParallelConfig's field)

    @property
    def gpus(self) -> int:
        """tp x pp x dp."""
        return self.tp * self.pp * self.dp

    @property
    def paired(self) -> bool:
        """Whether the schedule overlaps F&B pairs (:data:`simtrain.checks.PAIRED`: DualPipe, ...)."""
        return split_name(self.schedule)[0] in PAIRED

    def parallel(self, seq_len: int | None, attention: str = "flash") -> ParallelConfig:
        """The :class:`ParallelConfig` that runs this point (``attention``: the kernel, flash or unfused); a
        ``recompute`` module list is the per-operator cost model's (:meth:`simtrain.plan.PlanRequest.cost_of`),
        so its config recomputes ``none``, as ``compare --recompute MODULE,...``."""
        recompute = self.recompute if self.recompute in ("none", "selective", "full") else "none"  # modules: the cost model's
        return ParallelConfig(tp=self.tp, pp=self.pp, dp=self.dp, ep=self.ep, vp=self.vp, microbatches=self.microbatches,
                              microbatch_size=self.microbatch_size, seq_len=seq_len, recompute=recompute,
                              zero_stage=self.zero_stage, attention=attention, grad_reduce_dtype=self.grad_reduce_dtype)


def enumerate_space(req: PlanRequest) -> Iterator[tuple[Config, str | None]]:
    """Every point of the space, with the first cheap reason it cannot run (or None).

    Yields:
        ``(config, reason)``; reason is ``batch_divisibility``, ``redundant`` or None. A point
        whose global batch does not divide keeps ``microbatches = 0``.
    """
    max_tp = req.max_tp or req.hardware.gpus_per_node
    counts = divisors(req.gpus) if req.objective == "tokens-per-gpu" else [req.gpus]
    moe = req.model.moe
    plain = [n for n in req.schedules if "+" not in n and n not in EP_PAIRED]  # pipeline orders alone
    one_stage = "1f1b" if "1f1b" in plain else (plain[0] if plain else None)  # what PP 1 keeps of them
    for g in counts:
        for tp in [t for t in divisors(g) if t <= max_tp]:
            for pp in divisors(g // tp):
                dp = g // (tp * pp)
                eps = [e for e in divisors(dp * tp) if moe.num_experts % e == 0] if moe else [1]
                for ep in eps:
                    for b in MICROBATCH_SIZES:
                        m, rest = divmod(req.global_batch, dp * b)
                        for name in req.schedules:
                            vps = [v for v in VIRTUAL_STAGES if pp * v <= req.model.num_layers] \
                                if REGISTRY[name.split("+")[0]].uses_vp else [1]
                            for vp in vps:
                                for rc in req.recompute:
                                    for z in req.zero_stages:
                                        cfg = Config(tp, pp, dp, ep, vp, name, b, m if not rest else 0, rc, z, req.grad_reduce_dtype)
                                        if rest or m == 0:
                                            yield cfg, "batch_divisibility"
                                        elif (z >= 1 and dp == 1 and (moe is None or ep == tp)) or (vp > 1 and pp == 1) \
                                                or (ep == 1 and name.split("+")[0] in EP_PAIRED) \
                                                or (pp == 1 and name in plain and name != one_stage):
                                            yield cfg, "redundant"
                                        else:
                                            yield cfg, None

