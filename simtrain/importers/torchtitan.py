"""torchtitan job files (TOML) -> model + parallel settings.

Section and field names are those of torchtitan's ``torchtitan/config/job_config.py``
(``[model] name, flavor, hf_assets_path, converters``; ``[training] local_batch_size, seq_len,
mixed_precision_param, mixed_precision_reduce``; ``[parallelism] data_parallel_replicate_degree,
data_parallel_shard_degree, tensor_parallel_degree, pipeline_parallel_degree,
pipeline_parallel_schedule, pipeline_parallel_microbatch_size, pipeline_parallel_layers_per_stage,
context_parallel_degree, context_parallel_rotate_method, expert_parallel_degree``;
``[activation_checkpoint] mode``), with its defaults. FSDP2 (``data_parallel_shard_degree`` other
than 1) is ZeRO-3 (parameters re-sharded after each forward), or ZeRO-2 with pipeline parallelism,
where torchtitan keeps the gathered parameters between microbatches (``reshard_after_forward``
False); its gradients are reduced in ``mixed_precision_reduce`` (default float32). Context
parallelism's ``allgather`` rotation (the default) is simtrain's ``allgather`` CP, ``alltoall`` its
``ring``. The model is the preset of the same flavor (``llama3`` 8B/70B/405B, ``deepseek_v3``
671B), else the HuggingFace ``config.json`` in ``hf_assets_path``.
"""

from __future__ import annotations

import math
import tomllib
from pathlib import Path
from typing import Any

from ..errors import SimtrainError
from ..loading import MAX_YAML_BYTES, read_text
from ..models import load_model
from ..schedules.names import canonical_schedule
from . import ImportedJob

FLAVORS = {("llama3", "8B"): "llama3-8b", ("llama3", "70B"): "llama3-70b", ("llama3", "405B"): "llama3-405b",
           ("deepseek_v3", "671B"): "deepseek-v3"}
"""(model.name, model.flavor) -> simtrain preset."""

_SINGLE_STAGE = {"gpipe", "1f1b"}
_READ = {
    "model": {"name", "flavor", "hf_assets_path", "converters"},
    "training": {"local_batch_size", "seq_len", "mixed_precision_param", "mixed_precision_reduce", "global_batch_size"},
    "parallelism": {"data_parallel_replicate_degree", "data_parallel_shard_degree", "tensor_parallel_degree",
                    "pipeline_parallel_degree", "pipeline_parallel_schedule", "pipeline_parallel_microbatch_size",
                    "pipeline_parallel_layers_per_stage", "context_parallel_degree", "context_parallel_rotate_method",
                    "expert_parallel_degree", "fsdp_reshard_after_forward"},
    "activation_checkpoint": {"mode"},
}
# sections that never change what one training step costs
_SILENT = {"job", "profiling", "metrics", "optimizer", "lr_scheduler", "checkpoint", "validation", "comm"}


def _model(m: dict[str, Any], path: Path):
    key = (m.get("name", "llama3"), str(m.get("flavor", "debugmodel")))
    if key in FLAVORS:
        return load_model(FLAVORS[key])
    assets = m.get("hf_assets_path")
    if assets and (Path(assets) / "config.json").is_file():
        return load_model(Path(assets) / "config.json")
    raise SimtrainError(f"--from-torchtitan {path}: [model] name = {key[0]!r}, flavor = {key[1]!r}: simtrain knows "
                        f"{sorted(f'{n} {f}' for n, f in FLAVORS)}, or reads hf_assets_path/config.json "
                        f"({assets!r} has none)")


def _fsdp_stage(reshard: str, pp: int) -> int:
    """The ZeRO stage of FSDP2: 3 when parameters are re-sharded after each forward (torchtitan's
    ``fsdp_reshard_after_forward`` "always", or "default" without pipeline parallelism), else 2."""
    return 3 if reshard == "always" or (reshard == "default" and pp == 1) else 2


def _data_parallel(p: dict[str, Any], dp: int | None, notes: list[str]) -> int:
    replicate, shard = p.get("data_parallel_replicate_degree", 1), p.get("data_parallel_shard_degree", -1)
    if shard == -1:  # the ranks left over after the other dimensions: the world size is not in the file
        where = f"dp = {dp} from --dp" if dp else f"no world size in the file, dp = {replicate} (give --dp)"
        notes.append(f"parallelism.data_parallel_shard_degree = -1 (the ranks left over): {where}")
        return dp or replicate
    return replicate * shard


def read_torchtitan_toml(path: Path, dp: int | None = None) -> ImportedJob:
    """Read a torchtitan job file (see the module docstring).

    Args:
        path: the ``.toml`` job file.
        dp: the data-parallel degree when ``data_parallel_shard_degree`` is -1 (all ranks left over).

    Returns:
        The :class:`ImportedJob`.

    Raises:
        SimtrainError: unreadable or malformed TOML, an unknown model, an unknown schedule, or a
            batch that does not divide into microbatches.
    """
    text = read_text(path, "a torchtitan job file", MAX_YAML_BYTES)
    try:
        job = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SimtrainError(f"--from-torchtitan {path}: malformed TOML: {exc}") from None
    m, t, p = job.get("model", {}), job.get("training", {}), job.get("parallelism", {})
    notes: list[str] = []
    model = _model(m, path)
    schedule = canonical_schedule(str(p.get("pipeline_parallel_schedule", "1F1B")),
                                  f"--from-torchtitan {path}: parallelism.pipeline_parallel_schedule")
    pp, local = p.get("pipeline_parallel_degree", 1), t.get("local_batch_size", 8)
    mbs = p.get("pipeline_parallel_microbatch_size", 1) if pp > 1 else local
    if local % mbs:
        raise SimtrainError(f"--from-torchtitan {path}: training.local_batch_size = {local} is not a multiple of "
                            f"parallelism.pipeline_parallel_microbatch_size = {mbs}")
    per_stage = p.get("pipeline_parallel_layers_per_stage")
    vp = 1 if schedule in _SINGLE_STAGE else (math.ceil(model.num_layers / per_stage / pp) if per_stage else 2)
    shard = p.get("data_parallel_shard_degree", -1)
    parallel = dict(tp=p.get("tensor_parallel_degree", 1), pp=pp, dp=_data_parallel(p, dp, notes), vp=vp,
                    ep=p.get("expert_parallel_degree", 1), microbatch_size=mbs, microbatches=local // mbs,
                    seq_len=t.get("seq_len", 2048),
                    dtype="fp8" if "float8" in m.get("converters", []) else
                    {"bfloat16": "bf16", "float32": "fp32"}[t.get("mixed_precision_param", "bfloat16")],
                    zero_stage=_fsdp_stage(p.get("fsdp_reshard_after_forward", "default"), pp) if shard != 1 else 0,
                    recompute=job.get("activation_checkpoint", {}).get("mode", "selective"),
                    cp=p.get("context_parallel_degree", 1),
                    cp_kind={"alltoall": "ring"}.get(p.get("context_parallel_rotate_method", "allgather"), "allgather"))
    if shard != 1:
        reduce = t.get("mixed_precision_reduce", "float32")
        parallel["grad_reduce_dtype"] = {"float32": "fp32", "bfloat16": "bf16"}.get(reduce, "fp32")
        if parallel["zero_stage"] == 2:
            notes.append("FSDP2 keeps the gathered parameters between microbatches (reshard_after_forward False, "
                         "torchtitan's default with pipeline parallelism): simulated as ZeRO-2")
    mapped = [f"{sec}.{k} = {v!r}" for sec, keys in _READ.items() for k, v in job.get(sec, {}).items() if k in keys]
    ignored = notes + [f"{sec}.{k}" for sec, table in job.items() if sec not in _SILENT and isinstance(table, dict)
                       for k in table if k not in _READ.get(sec, set())]
    return ImportedJob(str(path), model, parallel, [schedule], mapped, ignored)
