"""Readers of other tools' model and job descriptions: HuggingFace ``config.json``
(:mod:`.hf`), Megatron-LM argument lists (:mod:`.megatron`) and torchtitan job files
(:mod:`.torchtitan`). Each maps what it can onto simtrain's ModelSpec / ParallelConfig fields and
says what it left out."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import SimtrainError
from ..models import ModelSpec


@dataclass
class ImportedJob:
    """A training job read from another framework's configuration.

    Attributes:
        source: the file read.
        model: the model it trains.
        parallel: :class:`~simtrain.parallel.ParallelConfig` fields (degrees, microbatches, dtype ...).
        schedules: simtrain names of the pipeline schedule(s) the job runs.
        mapped: their settings that were read (``--num-layers 32``, ``parallelism.tensor_parallel_degree = 8``).
        ignored: their settings that simtrain does not represent (with a reason where known).
    """

    source: str
    model: ModelSpec
    parallel: dict[str, Any]
    schedules: list[str]
    mapped: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)

    def summary(self) -> list[str]:
        """Three lines for the user: what was read, what is simulated, what was ignored."""
        settings = ", ".join(f"{k} {v}" for k, v in self.parallel.items())
        simulating = (f"{self.model.name} ({self.model.total_params / 1e9:.2f}B parameters), {settings}, "
                      f"schedule {', '.join(self.schedules)}")
        return [f"{self.source}: read: {', '.join(self.mapped)}", f"{self.source}: simulating: {simulating}",
                f"{self.source}: ignored: {'; '.join(self.ignored) or 'nothing'}"]


def read_job(megatron: Path | None, torchtitan: Path | None, dp: int | None = None) -> ImportedJob | None:
    """The job of ``--from-megatron`` or ``--from-torchtitan`` (None when neither is given).

    Args:
        megatron: a Megatron-LM argument list (:func:`.megatron.read_megatron_args`).
        torchtitan: a torchtitan job file (:func:`.torchtitan.read_torchtitan_toml`).
        dp: the data-parallel degree when the file does not fix it.

    Raises:
        SimtrainError: both are given, or the file cannot be mapped.
    """
    if megatron is not None and torchtitan is not None:
        raise SimtrainError("give --from-megatron or --from-torchtitan, not both")
    if megatron is not None:
        from .megatron import read_megatron_args

        return read_megatron_args(megatron, dp)
    if torchtitan is not None:
        from .torchtitan import read_torchtitan_toml

        return read_torchtitan_toml(torchtitan, dp)
    return None
