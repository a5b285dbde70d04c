"""One schedule vocabulary: simtrain's registry names, and the torch.distributed.pipelining class
names (``ScheduleInterleaved1F1B``, ``ZBVZeroBubble``, ...) accepted as aliases of them.

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
