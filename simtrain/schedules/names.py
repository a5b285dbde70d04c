"""One schedule vocabulary: simtrain's registry names, the torch.distributed.pipelining class
names (``ScheduleInterleaved1F1B``, ``ZBVZeroBubble``, ...) accepted as aliases of them, and the run
options a name may carry after ``+`` (``1f1b+waved-ep``: 1F1B run with Waved-EP, a lowering option,
not a schedule order; see :data:`VARIANTS`).

torch's names are those of the classes in ``torch/distributed/pipelining/schedules.py`` (and the
strings torchtitan's ``pipeline_parallel_schedule`` takes, which are those class names without
``Schedule``); they are matched case-insensitively, without the ``Schedule`` prefix, dashes or
underscores.
"""

from __future__ import annotations

from ..errors import SimtrainError

TORCH_ALIASES: dict[str, str] = {
    "gpipe": "gpipe",
    "1f1b": "1f1b",
    "interleaved1f1b": "interleaved-1f1b",
    "loopedbfs": "looped-bfs",
    "interleavedzerobubble": "interleaved-zb",
    "zbvzerobubble": "zbv",
    "dualpipev": "dualpipev",
}
"""torch class name (lower case, no ``Schedule`` prefix) -> simtrain registry name."""


def canonical_schedule(name: str, where: str = "schedule") -> str:
    """simtrain's registry name for ``name`` (a registry name, or a torch class name).

    Args:
        name: e.g. ``zbv``, ``ZBVZeroBubble``, ``ScheduleInterleaved1F1B``, ``interleaved-1f1b``.
        where: the flag or field, for the message.

    Raises:
        SimtrainError: neither a registry name nor a torch alias.
    """
    from . import REGISTRY

    text = name.strip()
    if text.lower() in REGISTRY:
        return text.lower()
    key = text.lower().removeprefix("schedule").replace("-", "").replace("_", "")
    if key in TORCH_ALIASES:
        return TORCH_ALIASES[key]
    raise SimtrainError(f"{where}: unknown schedule '{text}'; choose from {sorted(REGISTRY)} "
                        f"(torch's class names {sorted(TORCH_ALIASES)} are accepted too)")


VARIANTS: dict[str, str] = {
    "waved-ep": "Waved-EP: each MoE layer's local experts run in --waves waves, overlapping dispatch, "
                "expert compute and combine (DeepSeek-V4 report §3.1)",
}
"""Run options a schedule name may carry after ``+`` (they change how it is lowered, not its order)."""


def split_name(name: str) -> tuple[str, tuple[str, ...]]:
    """Split ``"dualpipev+waved-ep"`` into the registry name and its run options.

    Returns:
        ``(base, variants)``, e.g. ``("dualpipev", ("waved-ep",))``.

    Raises:
        ScheduleError: unknown base name, unknown or repeated option.
    """
    from . import REGISTRY
    from .ir import ScheduleError

    base, *variants = name.strip().split("+")
    if base not in REGISTRY:
        raise ScheduleError(f"unknown schedule '{base}': choose from {sorted(REGISTRY)}")
    for v in variants:
        if v not in VARIANTS:
            raise ScheduleError(
                f"schedule '{name}': unknown variant '+{v}'; variants are {['+' + k for k in VARIANTS]}"
            )
    if len(set(variants)) < len(variants):
        raise ScheduleError(f"schedule '{name}': a variant is given twice")
    return base, tuple(variants)
