"""Megatron-LM argument lists (``pretrain_gpt.py`` flags) -> model + parallel settings.

The flag names and defaults are those of ``megatron/training/arguments.py`` (Megatron-LM core
v0.x): e.g. ``--ffn-hidden-size`` defaults to 4 x hidden (or the SwiGLU width when ``--swiglu``
is set, see below), biases and tied embeddings are on unless ``--disable-bias-linear`` /
``--untie-embeddings-and-output-weights``, dropout is 0.1, positions are ``learned_absolute``.
The file may be a launch script: backslash line ends, ``#`` comments and anything that is not a
``--flag`` (``torchrun``, the script name, shell variables) are skipped; torchrun's ``--nnodes``
and ``--nproc-per-node`` give the world size and hence the data-parallel degree.
"""

from __future__ import annotations

import argparse
import math
import re
import shlex
from pathlib import Path

from ..errors import SimtrainError, validate_model
from ..loading import MAX_YAML_BYTES, read_text
from ..models import ModelSpec
from . import ImportedJob

_DTYPES = (("fp8_format", "fp8"), ("bf16", "bf16"), ("fp16", "fp16"))


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
    for name in ["normalization", "position-embedding-type", "recompute-granularity", "fp8-format"]:
        p.add_argument(f"--{name}")
    for name in ["attention-dropout", "hidden-dropout"]:
        p.add_argument(f"--{name}", type=float)
    for name in ["swiglu", "group-query-attention", "disable-bias-linear", "untie-embeddings-and-output-weights",
                 "use-rotary-position-embeddings", "sequence-parallel", "use-distributed-optimizer", "bf16", "fp16",
                 "multi-latent-attention", "qk-layernorm", "moe-router-enable-expert-bias", "recompute-activations"]:
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
    return validate_model(ModelSpec, spec, str(path))


def read_megatron_args(path: Path, dp: int | None = None) -> ImportedJob:
    """Read a Megatron-LM argument list (see the module docstring).

    Args:
        path: a text file of ``pretrain_gpt.py`` arguments, or a launch script containing them.
        dp: the data-parallel degree when the file does not give the world size.

    Returns:
        The :class:`ImportedJob` (schedule ``1f1b``, or ``interleaved-1f1b`` with virtual stages).

    Raises:
        SimtrainError: unreadable file, a missing model flag, or values that do not divide.
    """
    text = read_text(path, "a Megatron-LM argument file", MAX_YAML_BYTES)
    tokens = _tokens(text)
    try:
        a, unknown = _parser().parse_known_args(tokens)
    except argparse.ArgumentError as exc:
        raise SimtrainError(f"--from-megatron {path}: {exc}") from None
    ignored = [t.split("=")[0] for t in unknown if t.startswith("--")]
    tp, pp = a.tensor_model_parallel_size or 1, a.pipeline_model_parallel_size or 1
    model = _model(a, tp, path, ignored)
    world = (a.nnodes or 1) * (a.nproc_per_node or 0) if (a.nproc_per_node) else None
    if world is not None:
        dp = world // (tp * pp * (a.context_parallel_size or 1))
    vp = a.num_virtual_stages_per_pipeline_rank or (
        model.num_layers // pp // a.num_layers_per_virtual_pipeline_stage if a.num_layers_per_virtual_pipeline_stage else 1)
    mbs, gbs, dp = a.micro_batch_size or 1, a.global_batch_size, dp or 1
    if gbs is not None and gbs % (mbs * dp):
        raise SimtrainError(f"--from-megatron {path}: --global-batch-size {gbs} is not a multiple of "
                            f"--micro-batch-size x data-parallel size = {mbs} x {dp}")
    parallel = dict(tp=tp, pp=pp, dp=dp, vp=vp, ep=a.expert_model_parallel_size or 1, microbatch_size=mbs,
                    microbatches=gbs // (mbs * dp) if gbs else 1, seq_len=model.seq_len,
                    dtype=next((d for flag, d in _DTYPES if getattr(a, flag)), "fp32"),
                    zero_stage=1 if a.use_distributed_optimizer else 0, sequence_parallel=a.sequence_parallel,
                    recompute=a.recompute_granularity or ("selective" if a.recompute_activations else "none"))
    if (a.context_parallel_size or 1) > 1:
        ignored.append(f"--context-parallel-size {a.context_parallel_size} (no context parallelism in simtrain)")
    mapped = [f"--{k.replace('_', '-')}" + ("" if v is True else f" {v}")
              for k, v in vars(a).items() if v not in (None, False)]
    if world is None:
        ignored.append(f"(no world size: torchrun's --nnodes/--nproc-per-node are not in the file; dp = {dp} from --dp)")
    return ImportedJob(str(path), model, parallel, ["interleaved-1f1b" if vp > 1 else "1f1b"], mapped, ignored)
