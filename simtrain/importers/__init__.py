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
        parallel: :class:`~simtrain.parallel.ParallelConfig` fields (degrees, microbatches, dtype ...),
            with the command line's values where it gave them.
        schedules: simtrain names of the pipeline schedule(s) the job runs.
        mapped: their settings that were read (``--num-layers 32``, ``parallelism.tensor_parallel_degree = 8``).
        ignored: their settings that simtrain does not represent (with a reason where known).
        fields: ``parallel`` key -> the file's name for it (``--tensor-model-parallel-size``,
            ``parallelism.tensor_parallel_degree``), for messages about the file's values.
        given: the ``parallel`` keys the command line set (shown as such in :meth:`summary`).
        flag: the command-line flag that read the file (``--from-megatron``), for messages.
        ops_settings: ``parallel`` fields the job implies that only the per-operator cost model
            prices (``kernels``, ``fused_projections``), applied by :meth:`for_cost_model` when it runs.
        attention_by_kind: the fused-attention kernel the job runs per GPU kind of
            :mod:`simtrain.costs.kernels` (``{"sm_90": "fa2"}``), applied likewise.
        fp8: ``gemms`` when the job runs its linear layers' GEMMs in FP8 (compare's ``--fp8``).
    """

    source: str
    model: ModelSpec
    parallel: dict[str, Any]
    schedules: list[str]
    mapped: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)
    fields: dict[str, str] = field(default_factory=dict)
    given: set[str] = field(default_factory=set)
    flag: str = ""
    ops_settings: dict[str, Any] = field(default_factory=dict)
    attention_by_kind: dict[str, str] = field(default_factory=dict)
    fp8: str | None = None

    def for_cost_model(self, parallel, cost_model: str, hardware):
        """``parallel`` with :attr:`ops_settings` and the GPU kind's :attr:`attention_by_kind` entry
        where the per-operator model (``cost_model`` ``ops``) prices ``hardware`` and the command
        line did not set the field; unchanged under the flat model, which refuses them.

        Returns:
            A :class:`~simtrain.parallel.ParallelConfig`.
        """
        from ..costs.kernels import gpu_kind_of

        if cost_model != "ops":
            return parallel
        update = dict(self.ops_settings)
        kernel = self.attention_by_kind.get(gpu_kind_of(hardware) or "")
        if kernel is not None:
            update["attention_kernel"] = kernel
        return parallel.model_copy(update={k: v for k, v in update.items() if k not in self.given})

    def summary(self) -> list[str]:
        """Three lines for the user: what was read, what is simulated (a value the command line
        set is marked ``(--flag)``), what was ignored."""
        settings = ", ".join(f"{k} {v}" + (f" (--{k.replace('_', '-')})" if k in self.given else "")
                             for k, v in self.parallel.items())
        ops = [f"{k} {v}" for k, v in self.ops_settings.items()] + [f"fp8 {self.fp8}"] * bool(self.fp8) + \
            [f"attention_kernel {v} on {k}" for k, v in self.attention_by_kind.items()]
        simulating = (f"{self.model.name} ({self.model.total_params / 1e9:.2f}B parameters), {settings}, "
                      f"schedule {', '.join(self.schedules)}"
                      + (f"; with the per-operator cost model: {', '.join(ops)}" if ops else ""))
        return [f"{self.source}: read: {', '.join(self.mapped)}", f"{self.source}: simulating: {simulating}",
                f"{self.source}: ignored: {'; '.join(self.ignored) or 'nothing'}"]


def positive_int(value: Any, where: str, low: int = 1) -> int:
    """``value`` as an integer >= ``low``.

    Args:
        value: what the file holds.
        where: the file and its field's name, for the message.

    Raises:
        SimtrainError: ``value`` is not an integer (a boolean is not one) or is below ``low``.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise SimtrainError(f"{where} = {value!r}: must be an integer >= {low}")
    return value


def read_job(megatron: Path | None, torchtitan: Path | None, given: dict[str, Any] | None = None) -> ImportedJob | None:
    """The job of ``--from-megatron`` or ``--from-torchtitan`` (None when neither is given).

    Args:
        megatron: a Megatron-LM argument list (:func:`.megatron.read_megatron_args`).
        torchtitan: a torchtitan job file (:func:`.torchtitan.read_torchtitan_toml`).
        given: ParallelConfig fields set on the command line (None values are not given); they
            override the file, and what the file derives from them (Megatron's data-parallel
            degree from its world size, microbatches from the global batch, virtual stages from
            layers per virtual stage) is derived again with them.

    Raises:
        SimtrainError: both are given, or the file cannot be mapped.
    """
    given = {k: v for k, v in (given or {}).items() if v is not None}
    if megatron is not None and torchtitan is not None:
        raise SimtrainError("give --from-megatron or --from-torchtitan, not both")
    if megatron is not None:
        from .megatron import read_megatron_args

        return read_megatron_args(megatron, given)
    if torchtitan is not None:
        from .torchtitan import read_torchtitan_toml

        return read_torchtitan_toml(torchtitan, given)
    return None
