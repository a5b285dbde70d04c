"""torchtitan job files (TOML) -> model + parallel settings.

Section and field names are those of torchtitan's ``torchtitan/config/job_config.py``
(``[model] name, flavor, hf_assets_path, converters``; ``[training] local_batch_size, seq_len,
mixed_precision_param, mixed_precision_reduce``; ``[parallelism] data_parallel_replicate_degree,
data_parallel_shard_degree, tensor_parallel_degree, pipeline_parallel_degree,
pipeline_parallel_schedule, pipeline_parallel_microbatch_size, pipeline_parallel_layers_per_stage,
context_parallel_degree, context_parallel_rotate_method, expert_parallel_degree``;
``[activation_checkpoint] mode``; ``training.compile`` or ``[compile] enable, components``), with
its defaults. FSDP2 (``data_parallel_shard_degree`` other
than 1) is ZeRO-3 (parameters re-sharded after each forward), or ZeRO-2 with pipeline parallelism,
where torchtitan keeps the gathered parameters between microbatches (``reshard_after_forward``
False); its gradients are reduced in ``mixed_precision_reduce`` (default float32). Context
parallelism's ``allgather`` rotation (the default) is simtrain's ``allgather`` CP, ``alltoall`` its
``ring``.

What only the per-operator cost model prices, as ``simtrain/published/runs.yaml``'s torchtitan
cases read it from torchtitan's code: the ``float8`` converter swaps the linear layers for torchao's
``Float8Linear`` (the output head excluded, ``float8.filter_fqns`` ``["output"]``) while the
parameters stay in ``mixed_precision_param``: FP8 GEMMs (``fp8: gemms``), not an fp8 compute
dtype. Without compile the blocks run as PyTorch eager ops (``kernels: eager``); compile of the
model alone (``[compile] components = ["model"]``) compiles each TransformerBlock while the loss
stays eager (``compiled-blocks``); with the loss too (``training.compile``, whose loss
``components/loss.py`` compiles, or ``[compile]``'s default components ``["model", "loss"]``),
``fused``. Attention runs ``F.scaled_dot_product_attention``: on H100-class GPUs (sm_90) it ran
FlashAttention-2 at every torchtitan version runs.yaml reads -- the December 2024 torch 2.6 nightly
did not pick cuDNN there (pytorch#142132, after pytorch#138522 made it opt-in), and from mid-2025
torchtitan's ``ScaledDotProductAttention._init_backend`` puts FLASH_ATTENTION first on every GPU
but compute capability 10.0 -- so ``attention_kernel: fa2`` there and on A100 (sm_80); on sm_100,
where torchtitan puts cuDNN first and ``op_data.yaml`` rates no cuDNN kernel, the kind's default
prices it. The model is the preset of the same flavor (``llama3`` 8B/70B/405B, ``deepseek_v3``
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
from . import ImportedJob, positive_int

FLAVORS = {("llama3", "8B"): "llama3-8b", ("llama3", "70B"): "llama3-70b", ("llama3", "405B"): "llama3-405b",
           ("deepseek_v3", "671B"): "deepseek-v3"}
"""(model.name, model.flavor) -> simtrain preset."""

_SINGLE_STAGE = {"gpipe", "1f1b"}
_READ = {
    "model": {"name", "flavor", "hf_assets_path", "converters"},
    "training": {"local_batch_size", "seq_len", "mixed_precision_param", "mixed_precision_reduce", "global_batch_size",
                 "compile"},
    "compile": {"enable", "components"},
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


_FIELDS = dict(tp="parallelism.tensor_parallel_degree", pp="parallelism.pipeline_parallel_degree",
               dp="parallelism.data_parallel_replicate_degree x data_parallel_shard_degree",
               vp="parallelism.pipeline_parallel_layers_per_stage", ep="parallelism.expert_parallel_degree",
               microbatch_size="parallelism.pipeline_parallel_microbatch_size",
               microbatches="training.local_batch_size / microbatch size", seq_len="training.seq_len",
               dtype="training.mixed_precision_param", zero_stage="parallelism.data_parallel_shard_degree",
               recompute="activation_checkpoint.mode", cp="parallelism.context_parallel_degree",
               cp_kind="parallelism.context_parallel_rotate_method",
               grad_reduce_dtype="training.mixed_precision_reduce",
               zero_impl="parallelism.data_parallel_shard_degree (torchtitan's FSDP is FSDP2)",
               fused_projections="model.name (torchtitan's models run wq, wk, wv and w1, w3 as separate linear layers)",
               kernels="compile.enable / training.compile", attention_kernel="(torchtitan's SDPA priority)")
"""simtrain's parallel field -> the torchtitan field it comes from, for messages."""

_PRECISION = {"bfloat16": "bf16", "float32": "fp32"}
"""torchtitan's ``mixed_precision_param`` / ``mixed_precision_reduce`` values -> simtrain dtypes."""
_ROTATE = {"allgather": "allgather", "alltoall": "ring"}
"""torchtitan's ``context_parallel_rotate_method`` -> simtrain's ``cp_kind``."""


class _Job:
    """The parsed TOML with typed, range-checked reads that name the field (``section.key``)."""

    def __init__(self, job: dict[str, Any], path: Path) -> None:
        self.job, self.where = job, f"--from-torchtitan {path}"

    def section(self, name: str) -> dict[str, Any]:
        table = self.job.get(name, {})
        if not isinstance(table, dict):
            raise SimtrainError(f"{self.where}: [{name}] must be a table, not {table!r}")
        return table

    def int(self, section: str, key: str, default: int, low: int = 1) -> int:
        return positive_int(self.section(section).get(key, default), f"{self.where}: {section}.{key}", low)

    def choice(self, section: str, key: str, default: str, allowed: dict[str, str]) -> str:
        value = self.section(section).get(key, default)
        if value not in allowed:
            raise SimtrainError(f"{self.where}: {section}.{key} = {value!r}: simtrain reads {sorted(allowed)}")
        return allowed[value]


def _data_parallel(j: _Job, dp: int | None, notes: list[str]) -> int:
    replicate = j.int("parallelism", "data_parallel_replicate_degree", 1)
    if j.section("parallelism").get("data_parallel_shard_degree", -1) == -1:
        # the ranks left over after the other dimensions: the world size is not in the file
        where = f"dp = {dp} from --dp" if dp else f"no world size in the file, dp = {replicate} (give --dp)"
        notes.append(f"parallelism.data_parallel_shard_degree = -1 (the ranks left over): {where}")
        return dp or replicate
    from_file = replicate * j.int("parallelism", "data_parallel_shard_degree", -1)
    return dp or from_file


def read_torchtitan_toml(path: Path, given: dict | None = None) -> ImportedJob:
    """Read a torchtitan job file (see the module docstring).

    Args:
        path: the ``.toml`` job file.
        given: ParallelConfig fields set on the command line; they override the file (``dp``
            also stands for ``data_parallel_shard_degree = -1``, all ranks left over).

    Returns:
        The :class:`ImportedJob`.

    Raises:
        SimtrainError: unreadable or malformed TOML, an unknown model, an unknown schedule, a
            degree or batch that is not an integer >= 1, an unknown precision or rotate method,
            or a batch that does not divide into microbatches (each naming ``section.field``).
    """
    given = dict(given or {})
    text = read_text(path, "a torchtitan job file", MAX_YAML_BYTES)
    try:
        job = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SimtrainError(f"--from-torchtitan {path}: malformed TOML: {exc}") from None
    j = _Job(job, path)
    m, t, p = j.section("model"), j.section("training"), j.section("parallelism")
    notes: list[str] = []
    model = _model(m, path)
    schedule = canonical_schedule(str(p.get("pipeline_parallel_schedule", "1F1B")),
                                  f"--from-torchtitan {path}: parallelism.pipeline_parallel_schedule")
    pp, local = given.get("pp", j.int("parallelism", "pipeline_parallel_degree", 1)), j.int("training", "local_batch_size", 8)
    mbs = j.int("parallelism", "pipeline_parallel_microbatch_size", 1) if pp > 1 else local
    mbs = given.get("microbatch_size", mbs)
    if local % mbs:
        raise SimtrainError(f"--from-torchtitan {path}: training.local_batch_size = {local} is not a multiple of "
                            f"parallelism.pipeline_parallel_microbatch_size = {mbs}")
    per_stage = p.get("pipeline_parallel_layers_per_stage")
    per_stage = None if per_stage is None else j.int("parallelism", "pipeline_parallel_layers_per_stage", 1)
    vp = 1 if schedule in _SINGLE_STAGE else (math.ceil(model.num_layers / per_stage / pp) if per_stage else 2)
    shard = p.get("data_parallel_shard_degree", -1)
    converters = m.get("converters", [])
    if not isinstance(converters, list) or not all(isinstance(c, str) for c in converters):
        raise SimtrainError(f"--from-torchtitan {path}: model.converters = {converters!r}: expected a list of names")
    parallel = dict(tp=j.int("parallelism", "tensor_parallel_degree", 1), pp=pp,
                    dp=_data_parallel(j, given.get("dp"), notes), vp=vp,
                    ep=j.int("parallelism", "expert_parallel_degree", 1), microbatch_size=mbs,
                    microbatches=local // mbs, seq_len=j.int("training", "seq_len", 2048),
                    dtype=j.choice("training", "mixed_precision_param", "bfloat16", _PRECISION),
                    zero_stage=_fsdp_stage(p.get("fsdp_reshard_after_forward", "default"), pp) if shard != 1 else 0,
                    recompute=j.section("activation_checkpoint").get("mode", "selective"),
                    cp=j.int("parallelism", "context_parallel_degree", 1),
                    cp_kind=j.choice("parallelism", "context_parallel_rotate_method", "allgather", _ROTATE))
    if parallel["cp"] > 1:
        parallel["cp_impl"] = "torch"  # torch's context_parallel: fp32 merges, every head's K/V (simtrain.costs.cp_merge)
    if shard != 1:
        parallel["grad_reduce_dtype"] = j.choice("training", "mixed_precision_reduce", "float32", _PRECISION)
        parallel["zero_impl"] = "fsdp2"  # torchtitan shards with fully_shard: per-parameter copy-out
        if parallel["zero_stage"] == 2:
            notes.append("FSDP2 keeps the gathered parameters between microbatches (reshard_after_forward False, "
                         "torchtitan's default with pipeline parallelism): simulated as ZeRO-2")
    parallel.update(given)
    mapped = [f"{sec}.{k} = {v!r}" for sec, keys in _READ.items() for k, v in j.section(sec).items() if k in keys]
    ignored = notes + [f"{sec}.{k}" for sec, table in job.items() if sec not in _SILENT and isinstance(table, dict)
                       for k in table if k not in _READ.get(sec, set())]
    return ImportedJob(str(path), model, parallel, [schedule], mapped, ignored, _FIELDS, set(given), "--from-torchtitan",
                       dict(kernels=_kernels(j), fused_projections=False),  # separate wq, wk, wv; w1, w3
                       dict(_ATTENTION), "gemms" if "float8" in converters else None)


_ATTENTION = {"sm_90": "fa2", "sm_80": "fa2"}
"""GPU kind -> the fused-attention kernel torchtitan's SDPA runs there (module docstring)."""


def _kernels(j: _Job) -> str:
    """simtrain's ``kernels`` of the job's compile settings (module docstring)."""
    comp = j.section("compile")
    enable, old = comp.get("enable", False), j.section("training").get("compile", False)
    components = comp.get("components", ["model", "loss"])
    for key, value in (("compile.enable", enable), ("training.compile", old)):
        if not isinstance(value, bool):
            raise SimtrainError(f"{j.where}: {key} = {value!r}: expected true or false")
    if not isinstance(components, list) or not set(components) <= {"model", "loss"}:
        raise SimtrainError(f"{j.where}: compile.components = {components!r}: expected a list of 'model' and 'loss'")
    if old or (enable and {"model", "loss"} <= set(components)):
        return "fused"
    return "compiled-blocks" if enable and "model" in components else "eager"
