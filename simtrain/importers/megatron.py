"""Megatron-LM argument lists (``pretrain_gpt.py`` flags) -> model + parallel settings.

The flag names and defaults are those of ``megatron/training/arguments.py`` (Megatron-LM core
v0.x): e.g. ``--ffn-hidden-size`` defaults to 4 x hidden (or the SwiGLU width when ``--swiglu``
is set, see below), biases and tied embeddings are on unless ``--disable-bias-linear`` /
``--untie-embeddings-and-output-weights``, dropout is 0.1, positions are ``learned_absolute``.
The file may be a launch script: backslash line ends, ``#`` comments and anything that is not a
``--flag`` (``torchrun``, the script name, shell variables) are skipped; torchrun's ``--nnodes``
and ``--nproc-per-node`` give the world size and hence the data-parallel degree, world / (TP x PP x
CP), derived again when ``--tp``, ``--pp`` or ``--cp`` override the file (the same job on the same
GPUs, cut differently), as are the microbatches from ``--global-batch-size``. Context parallelism
(``--context-parallel-size``, ``--cp-comm-type``) maps to simtrain's ``cp`` and ``cp_kind``.
Every integer flag must be >= 1 (Megatron-LM divides by them).
"""

from __future__ import annotations

import argparse
import math
import re
import shlex
from pathlib import Path

from pydantic import ValidationError

from ..errors import SimtrainError
from ..loading import MAX_YAML_BYTES, read_text
from ..models import ModelSpec
from . import ImportedJob, positive_int

_DTYPES = (("bf16", "bf16"), ("fp16", "fp16"))
"""Megatron's precision flag -> simtrain's compute dtype. ``--fp8-format`` runs Transformer
Engine's FP8 GEMMs in the linear layers while the rest runs in the ``--bf16``/``--fp16`` (else
fp32) compute dtype, i.e. compare's ``--fp8 gemms``, as the
published Megatron cases of ``simtrain/published/runs.yaml`` price it (``fp8: gemms``)."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False, allow_abbrev=False, exit_on_error=False)
    ints = ["num-layers", "hidden-size", "ffn-hidden-size", "num-attention-heads", "num-query-groups", "kv-channels",
            "seq-length", "max-position-embeddings", "vocab-size", "make-vocab-size-divisible-by",
            "tensor-model-parallel-size", "pipeline-model-parallel-size", "num-layers-per-virtual-pipeline-stage",
            "num-virtual-stages-per-pipeline-rank", "expert-model-parallel-size", "micro-batch-size",
            "global-batch-size", "num-experts", "moe-router-topk", "moe-ffn-hidden-size",
            "moe-shared-expert-intermediate-size", "q-lora-rank", "kv-lora-rank", "qk-head-dim",
            "qk-pos-emb-head-dim", "v-head-dim", "nnodes", "nproc-per-node", "nproc_per_node",
            "context-parallel-size", "moe-layer-freq"]
    for name in ints:
        p.add_argument(f"--{name}", type=int)
    for name in ["normalization", "position-embedding-type", "recompute-granularity", "fp8-format", "cp-comm-type"]:
        p.add_argument(f"--{name}")
    for name in ["attention-dropout", "hidden-dropout"]:
        p.add_argument(f"--{name}", type=float)
    for name in ["swiglu", "group-query-attention", "disable-bias-linear", "untie-embeddings-and-output-weights",
                 "use-rotary-position-embeddings", "sequence-parallel", "use-distributed-optimizer", "bf16", "fp16",
                 "multi-latent-attention", "qk-layernorm", "moe-router-enable-expert-bias", "recompute-activations",
                 "no-rope-fusion", "no-bias-dropout-fusion", "use-tp-pp-dp-mapping"]:
        p.add_argument(f"--{name}", action="store_true")
    return p


def _tokens(text: str) -> list[str]:
    text = re.sub(r"\\\n", " ", text)
    lines = [line.split(" #")[0] if not line.lstrip().startswith("#") else "" for line in text.splitlines()]
    try:
        return shlex.split(" ".join(lines))
    except ValueError as exc:
        raise SimtrainError(f"cannot split the arguments into words: {exc}") from None


def _model(a: argparse.Namespace, tp: int, path: Path, ignored: list[str]) -> ModelSpec:
    for flag in ("num_layers", "hidden_size", "num_attention_heads", "vocab_size"):
        if getattr(a, flag) is None:
            hint = " (Megatron reads it from the tokenizer; add it to the file)" if flag == "vocab_size" else ""
            raise SimtrainError(f"{path}: --{flag.replace('_', '-')} is missing{hint}")
    h = a.hidden_size
    # arguments.py: --swiglu without --ffn-hidden-size gives 4h x 2/3 rounded down to a multiple of 64
    ffn = a.ffn_hidden_size or (int(4 * h * 2 / 3 / 64) * 64 if a.swiglu else 4 * h)
    multiple = (a.make_vocab_size_divisible_by or 128) * tp  # tokenizer.py _vocab_size_with_padding
    spec = dict(
        name=path.stem, description="Megatron-LM arguments", source=str(path), num_layers=a.num_layers,
        hidden_size=h, ffn_hidden_size=ffn, num_heads=a.num_attention_heads,
        num_kv_heads=a.num_query_groups if a.group_query_attention else None, head_dim=a.kv_channels,
        vocab_size=multiple * math.ceil(a.vocab_size / multiple), seq_len=a.seq_length or 1024,
        activation="swiglu" if a.swiglu else "gelu",
        norm="rmsnorm" if (a.normalization or "LayerNorm").lower() == "rmsnorm" else "layernorm",
        bias=not a.disable_bias_linear, tied_embeddings=not a.untie_embeddings_and_output_weights,
        learned_positions=(a.position_embedding_type or "learned_absolute") == "learned_absolute"
        and not a.use_rotary_position_embeddings,
        dropout=(a.attention_dropout if a.attention_dropout is not None else 0.1) > 0
        or (a.hidden_dropout if a.hidden_dropout is not None else 0.1) > 0,
        qk_norm=a.qk_layernorm,
    )
    if a.multi_latent_attention:
        spec["mla"] = dict(q_lora_rank=a.q_lora_rank, kv_lora_rank=a.kv_lora_rank, qk_nope_head_dim=a.qk_head_dim,
                           qk_rope_head_dim=a.qk_pos_emb_head_dim, v_head_dim=a.v_head_dim)
        spec.pop("head_dim")
    if a.num_experts:
        width = a.moe_ffn_hidden_size or ffn
        shared = (a.moe_shared_expert_intermediate_size or 0) // width
        spec["moe"] = dict(num_experts=a.num_experts, top_k=a.moe_router_topk or 2, expert_ffn_hidden_size=width,
                           num_shared_experts=shared, router_bias=a.moe_router_enable_expert_bias)
        if (a.moe_layer_freq or 1) != 1:
            ignored.append(f"--moe-layer-freq {a.moe_layer_freq} (every layer is simulated as MoE)")
    try:
        return ModelSpec.model_validate(spec)
    except ValidationError as err:
        raise SimtrainError(f"{path}: " + "; ".join(_in_flags(e) for e in err.errors())) from None


_MODEL_FLAGS = dict(num_layers="--num-layers", hidden_size="--hidden-size", ffn_hidden_size="--ffn-hidden-size",
                    num_heads="--num-attention-heads", num_kv_heads="--num-query-groups", head_dim="--kv-channels",
                    vocab_size="--vocab-size (padded)", seq_len="--seq-length")
"""simtrain's ModelSpec field -> the Megatron-LM flag it is read from, for messages."""


def _in_flags(e: dict) -> str:
    """One ModelSpec validation error in the file's own flag names (``--num-query-groups``, not
    simtrain's ``num_kv_heads``); a field read from no single flag keeps simtrain's name."""
    msg = e["msg"].removeprefix("Value error, ")
    if not e["loc"]:  # a rule across fields: name them by their flags
        for name, flag in _MODEL_FLAGS.items():
            msg = re.sub(rf"\b{name}\b", flag, msg)
        return msg
    field = ".".join(str(x) for x in e["loc"])
    return f"{_MODEL_FLAGS.get(field, f'field {field!r} (derived)')} = {e.get('input')!r}: {msg}"


_FIELDS = dict(tp="--tensor-model-parallel-size", pp="--pipeline-model-parallel-size",
               dp="the data-parallel size (--nnodes x --nproc-per-node / (TP x PP x CP))",
               ep="--expert-model-parallel-size", microbatch_size="--micro-batch-size",
               microbatches="--global-batch-size / (--micro-batch-size x data-parallel size)", seq_len="--seq-length",
               dtype="--bf16/--fp16/--fp8-format", zero_stage="--use-distributed-optimizer",
               sequence_parallel="--sequence-parallel", recompute="--recompute-granularity",
               cp="--context-parallel-size", cp_kind="--cp-comm-type", rope_fusion="--no-rope-fusion",
               bias_dropout_fusion="--no-bias-dropout-fusion",
               rank_order="Megatron-Core's rank order (--use-tp-pp-dp-mapping)")
"""simtrain's parallel field -> the Megatron-LM flag (or the rule) it comes from, for messages."""

CP_KINDS = {"p2p": "ring", "a2a": "ulysses", "allgather": "allgather"}
"""``--cp-comm-type`` (Megatron-LM arguments.py; default ``p2p``) -> simtrain's ``cp_kind``: p2p
passes KV blocks around the CP ring, a2a is DeepSpeed-Ulysses' all-to-all of heads, allgather
gathers K and V. Megatron's hierarchical ``a2a+p2p`` has no counterpart."""


def _world(a: argparse.Namespace) -> int | None:
    """torchrun's world size, ``--nnodes`` x ``--nproc-per-node`` (torchrun's defaults: 1 and 1),
    or None when the file gives neither."""
    if a.nnodes is None and a.nproc_per_node is None:
        return None
    return (a.nnodes or 1) * (a.nproc_per_node or 1)


def _data_parallel(a: argparse.Namespace, given: dict, group: tuple[int, int, int], where: str,
                   ignored: list[str]) -> int:
    """The data-parallel size: ``--dp`` when given, else Megatron's world size / (TP x PP x CP)
    (``megatron/training/arguments.py``, ``validate_args``), else 1."""
    world, (tp, pp, cp) = _world(a), group
    launch = f"--nnodes {a.nnodes or 1} x --nproc-per-node {a.nproc_per_node or 1} = {world} GPUs"
    if "dp" in given:
        if world is not None and world != tp * pp * cp * given["dp"]:
            ignored.append(f"the world size ({launch}): --dp {given['dp']} is simulated instead")
        return given["dp"]
    if world is None:
        ignored.append("(no world size: torchrun's --nnodes/--nproc-per-node are not in the file; dp = 1, "
                       "or give --dp)")
        return 1
    cli = [f"--{k}" for k in ("tp", "pp", "cp") if k in given]
    if world % (tp * pp * cp):
        raise SimtrainError(f"{where}: the world size {launch} is not a multiple of TP x PP x CP = {tp} x {pp} x {cp}"
                            f" = {tp * pp * cp}" + (f" ({', '.join(cli)} from the command line)" if cli else "")
                            + "; Megatron-LM refuses it too (validate_args)")
    return world // (tp * pp * cp)


def _virtual_stages(a: argparse.Namespace, given: dict, num_layers: int, pp: int, where: str) -> int:
    """Virtual stages per rank: ``--vp`` when given, ``--num-virtual-stages-per-pipeline-rank``, or
    (layers / pp) / ``--num-layers-per-virtual-pipeline-stage``, which Megatron-LM requires to
    divide (``validate_args``: "number of layers per pipeline stage must be divisible number of
    layers per virtual pipeline stage"), else 1."""
    per_stage, per_rank = a.num_layers_per_virtual_pipeline_stage, a.num_virtual_stages_per_pipeline_rank
    if per_stage is not None and per_rank is not None:
        raise SimtrainError(f"{where}: --num-layers-per-virtual-pipeline-stage and "
                            "--num-virtual-stages-per-pipeline-rank are both given; Megatron-LM takes one")
    if "vp" in given:
        return given["vp"]
    if per_stage is None:
        return per_rank or 1
    pp_note = " (--pp from the command line)" if "pp" in given else ""
    if num_layers % pp:
        raise SimtrainError(f"{where}: --num-layers-per-virtual-pipeline-stage {per_stage} needs --num-layers "
                            f"{num_layers} to be a multiple of the pipeline size {pp}{pp_note} (Megatron-LM's "
                            "validate_args)")
    layers = num_layers // pp
    if layers % per_stage:
        divisors = [d for d in range(1, layers + 1) if layers % d == 0]
        raise SimtrainError(f"{where}: --num-layers-per-virtual-pipeline-stage = {per_stage}: each pipeline rank "
                            f"holds {layers} layers (--num-layers {num_layers} / pp {pp}{pp_note}), not a multiple "
                            f"of {per_stage}; allowed: a divisor of {layers} ({', '.join(map(str, divisors))})")
    return layers // per_stage


def _microbatches(a: argparse.Namespace, given: dict, mbs: int, dp: int, where: str) -> int:
    """``--microbatches`` when given, else ``--global-batch-size`` / (micro-batch x dp), which must
    divide; without a global batch Megatron-LM takes micro-batch x dp, one microbatch."""
    if "microbatches" in given:
        return given["microbatches"]
    gbs = a.global_batch_size
    if gbs is None:
        return 1
    if gbs % (mbs * dp):
        raise SimtrainError(f"{where}: --global-batch-size {gbs} is not a multiple of "
                            f"--micro-batch-size x data-parallel size = {mbs} x {dp}")
    return gbs // (mbs * dp)


def _rank_order(a: argparse.Namespace) -> str:
    """Megatron-Core's rank numbering as simtrain's ``rank_order``: ``tp-cp-ep-dp-pp`` (pipeline
    stage outermost, ``tp-dp-pp``) unless ``--use-tp-pp-dp-mapping`` asks for ``tp-cp-ep-pp-dp``
    (``tp-pp-dp``); Megatron-LM ``arguments.py`` / ``parallel_state.initialize_model_parallel``'s
    ``order``, as the published Megatron-family cases cite it (``simtrain/published/runs.yaml``)."""
    return "tp-pp-dp" if a.use_tp_pp_dp_mapping else "tp-dp-pp"


def _context_parallel(a: argparse.Namespace, cp: int, where: str) -> dict:
    if cp == 1 and a.cp_comm_type is None:
        return {}
    kind = a.cp_comm_type or "p2p"
    if kind not in CP_KINDS:
        raise SimtrainError(f"{where}: --cp-comm-type = {kind!r}: simtrain simulates {', '.join(CP_KINDS)}")
    return dict(cp=cp, cp_kind=CP_KINDS[kind])


def read_megatron_args(path: Path, given: dict | None = None) -> ImportedJob:
    """Read a Megatron-LM argument list (see the module docstring).

    Args:
        path: a text file of ``pretrain_gpt.py`` arguments, or a launch script containing them.
        given: ParallelConfig fields set on the command line: they override the file, and the
            data-parallel size (from the file's world size), the microbatches (from its global
            batch) and the virtual stages (from its layers per virtual stage) are derived with them.

    Returns:
        The :class:`ImportedJob` (schedule ``1f1b``, or ``interleaved-1f1b`` with virtual stages).

    Raises:
        SimtrainError: unreadable file, a missing model flag, a size below 1, or values that do
            not divide (each as Megatron-LM's ``validate_args`` refuses them).
    """
    given, where = dict(given or {}), f"--from-megatron {path}"
    text = read_text(path, "a Megatron-LM argument file", MAX_YAML_BYTES)
    tokens = _tokens(text)
    try:
        a, unknown = _parser().parse_known_args(tokens)
    except argparse.ArgumentError as exc:
        raise SimtrainError(f"{where}: {exc}") from None
    for key, value in vars(a).items():
        if type(value) is int:
            positive_int(value, f"{where}: --{key.replace('_', '-')}")
    ignored = [t.split("=")[0] for t in unknown if t.startswith("--")]
    tp, pp = given.get("tp", a.tensor_model_parallel_size or 1), given.get("pp", a.pipeline_model_parallel_size or 1)
    cp, mbs = given.get("cp", a.context_parallel_size or 1), given.get("microbatch_size", a.micro_batch_size or 1)
    model = _model(a, tp, path, ignored)
    dp = _data_parallel(a, given, (tp, pp, cp), where, ignored)
    vp = _virtual_stages(a, given, model.num_layers, pp, where)
    parallel = dict(tp=tp, pp=pp, dp=dp, vp=vp, ep=a.expert_model_parallel_size or 1, microbatch_size=mbs,
                    microbatches=_microbatches(a, given, mbs, dp, where), seq_len=model.seq_len,
                    dtype=next((d for flag, d in _DTYPES if getattr(a, flag)), "fp32"),
                    zero_stage=1 if a.use_distributed_optimizer else 0, sequence_parallel=a.sequence_parallel,
                    recompute=a.recompute_granularity or ("selective" if a.recompute_activations else "none"),
                    rank_order=_rank_order(a), **_context_parallel(a, cp, where))
    # Megatron-LM's --no-rope-fusion / --no-bias-dropout-fusion (arguments.py: apply_rope_fusion,
    # bias_dropout_fusion) run those kernels unfused, as simtrain's fields of the same names price them
    parallel.update({k: False for k, flag in (("rope_fusion", "no_rope_fusion"),
                                              ("bias_dropout_fusion", "no_bias_dropout_fusion")) if getattr(a, flag)})
    parallel.update(given)
    mapped = [f"--{k.replace('_', '-')}" + ("" if v is True else f" {v}")
              for k, v in vars(a).items() if v not in (None, False)]
    fields = dict(_FIELDS, vp="--num-virtual-stages-per-pipeline-rank" if a.num_virtual_stages_per_pipeline_rank
                  else "the layers per rank / --num-layers-per-virtual-pipeline-stage")
    schedule = "interleaved-1f1b" if parallel["vp"] > 1 else "1f1b"
    return ImportedJob(str(path), model, parallel, [schedule], mapped, ignored, fields, set(given), "--from-megatron",
                       fp8="gemms" if a.fp8_format else None)
