"""HuggingFace ``config.json`` -> :class:`~simtrain.models.ModelSpec`.

The field names are those of the ``transformers`` configuration classes of each family
(``LlamaConfig``, ``MistralConfig``, ``MixtralConfig``, ``Qwen2Config``, ``Qwen2MoeConfig``,
``Qwen3Config``, ``Qwen3MoeConfig``, ``DeepseekV3Config``, ``GPT2Config``, ``GPTNeoXConfig`` in
``src/transformers/models/<family>/configuration_<family>.py``), with their defaults where a field is
absent. What each family's modelling code does with them (gated MLP, biases, QK-norm, MLA, which
layers are MoE) is written next to each mapping below.

Fields that change neither the parameter count nor the simulated cost (token ids, norm epsilons,
RoPE settings, initialisation, ``use_cache`` ...) are dropped silently; every other field that is not
mapped is listed in ONE :class:`~simtrain.errors.ConfigWarning`.

The training sequence length is not in a model config: ``seq_len`` is
``rope_scaling.original_max_position_embeddings`` when the config extends its context with RoPE
scaling (the pre-extension training length: 4096 for DeepSeek-V3, 8192 for Llama 3.1), else
``max_position_embeddings`` capped at 8192 (Llama 3's pre-training length, arXiv:2407.21783
§3.4.1); ``--seq-len`` overrides it. Learned position embeddings (GPT-2) keep ``n_positions``.
"""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ..errors import ConfigWarning, SimtrainError
from ..loading import MAX_YAML_BYTES, read_text
from ..models import ModelSpec

SEQ_LEN_CAP = 8192

# fields that do not change parameters or cost
_SILENT = {
    "architectures", "model_type", "torch_dtype", "dtype", "transformers_version", "bos_token_id",
    "eos_token_id", "pad_token_id", "_name_or_path", "name_or_path", "initializer_range", "use_cache",
    "rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "rope_theta", "rope_scaling", "rope_parameters",
    "rotary_emb_base", "rotary_pct", "partial_rotary_factor", "pretraining_tp", "auto_map", "tokenizer_class",
    "output_router_logits", "router_aux_loss_coef", "router_jitter_noise", "aux_loss_alpha", "seq_aux",
    "routed_scaling_factor", "scoring_func", "norm_topk_prob", "ep_size", "use_parallel_residual",
    "initializer_factor", "summary_type", "summary_use_proj", "summary_activation", "summary_proj_to_labels",
    "summary_first_dropout", "task_specific_params", "scale_attn_weights", "scale_attn_by_inverse_layer_idx",
    "reorder_and_upcast_attn", "n_ctx", "classifier_dropout", "max_window_layers", "layer_types",
    "use_sliding_window", "rope_interleave", "head_dim_original",
}

_DROPOUT_FIELDS = ("attention_dropout", "hidden_dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop")


class _Fields:
    """The config's fields, remembering which ones a mapping read."""

    def __init__(self, data: dict[str, Any], path: Path) -> None:
        self.data, self.path, self.used = data, path, set(_SILENT)

    def get(self, key: str, default: Any = None) -> Any:
        self.used.add(key)
        value = self.data.get(key, default)
        return default if value is None else value

    def need(self, key: str) -> Any:
        self.used.add(key)
        if self.data.get(key) is None:
            raise SimtrainError(f"{self.path}: field '{key}' is missing (required for model_type "
                                f"'{self.data.get('model_type')}')")
        return self.data[key]

    def unmapped(self) -> list[str]:
        return sorted(k for k in self.data if k not in self.used)


def _seq_len(f: _Fields) -> int:
    scaling = f.data.get("rope_scaling") or {}
    original = scaling.get("original_max_position_embeddings") if isinstance(scaling, dict) else None
    longest = f.get("max_position_embeddings", SEQ_LEN_CAP)
    return int(original or min(longest, SEQ_LEN_CAP))


def _dropout(f: _Fields) -> bool:
    return any([float(f.get(k, 0.0) or 0.0) > 0 for k in _DROPOUT_FIELDS])


def _read(f: _Fields, *keys: str) -> dict:
    """Mark ``keys`` as mapped (the activation name: the MLP's structure, not its nonlinearity,
    sets the parameter count and FLOPs) and contribute no ModelSpec field."""
    f.used.update(keys)
    return {}


def _llama_like(f: _Fields) -> dict[str, Any]:
    """Llama, Mistral, Mixtral, Qwen2/3 (and their MoE variants): pre-RMSNorm, RoPE, a gated MLP of
    three matrices (``gate_proj``, ``up_proj``, ``down_proj``; mapped as ``swiglu`` whatever the
    gate's nonlinearity), GQA with ``num_key_value_heads``, untied head unless ``tie_word_embeddings``."""
    heads = f.need("num_attention_heads")
    spec = dict(
        num_layers=f.need("num_hidden_layers"), hidden_size=f.need("hidden_size"),
        ffn_hidden_size=f.need("intermediate_size"), num_heads=heads,
        num_kv_heads=f.get("num_key_value_heads", heads), vocab_size=f.need("vocab_size"), seq_len=_seq_len(f),
        activation="swiglu", norm="rmsnorm", tied_embeddings=bool(f.get("tie_word_embeddings", False)),
        dropout=_dropout(f), **_read(f, "hidden_act"),
    )
    if f.data.get("head_dim") is not None:
        spec["head_dim"] = f.get("head_dim")
    attention_bias, mlp_bias = bool(f.get("attention_bias", False)), bool(f.get("mlp_bias", False))
    if attention_bias and mlp_bias:
        spec["bias"] = True
    elif attention_bias or mlp_bias:  # LlamaConfig: attention_bias covers q, k, v and o
        f.used.discard("mlp_bias" if mlp_bias else "attention_bias")
        spec["qkv_bias"] = attention_bias
    return spec


def _moe_layers_from(f: _Fields, num_layers: int, is_moe) -> int:
    """The number of leading dense layers, given a predicate over 0-based layer indices.

    Raises:
        SimtrainError: the MoE layers are not all the layers after some leading dense ones.
    """
    moe = [i for i in range(num_layers) if is_moe(i)]
    first = moe[0] if moe else num_layers
    if moe != list(range(first, num_layers)):
        raise SimtrainError(f"{f.path}: MoE layers {moe[:8]}...: simtrain models leading dense layers followed "
                            "by MoE layers only (fields 'decoder_sparse_step', 'mlp_only_layers', 'moe_layer_freq')")
    return first


def _mixtral(f: _Fields) -> dict[str, Any]:
    """Mixtral: every layer's MLP is ``num_local_experts`` experts of ``intermediate_size``, top-k
    ``num_experts_per_tok``, a bias-free router."""
    spec = _llama_like(f)
    spec["moe"] = dict(num_experts=f.need("num_local_experts"), top_k=f.need("num_experts_per_tok"),
                       expert_ffn_hidden_size=spec["ffn_hidden_size"])
    f.get("sliding_window")  # Mixtral's configs set null; a window is reported below
    return spec


def _qwen_moe(f: _Fields, shared: bool) -> dict[str, Any]:
    """Qwen2-MoE / Qwen3-MoE: layer i is MoE when it is not in ``mlp_only_layers`` and
    ``(i + 1) % decoder_sparse_step == 0``; Qwen2-MoE adds one shared expert of
    ``shared_expert_intermediate_size`` (mapped as that width / ``moe_intermediate_size`` shared
    experts of the routed width, the same parameters and FLOPs)."""
    spec = _llama_like(f)
    step, dense_only = f.get("decoder_sparse_step", 1), set(f.get("mlp_only_layers", []))
    first = _moe_layers_from(f, spec["num_layers"], lambda i: i not in dense_only and (i + 1) % step == 0)
    width = f.need("moe_intermediate_size")
    moe = dict(num_experts=f.need("num_experts"), top_k=f.need("num_experts_per_tok"),
               expert_ffn_hidden_size=width, first_dense_layers=first)
    if shared and f.get("shared_expert_intermediate_size", 0):
        total = f.get("shared_expert_intermediate_size")
        if total % width:
            raise SimtrainError(f"{f.path}: field 'shared_expert_intermediate_size' = {total}: simtrain needs a "
                                f"multiple of moe_intermediate_size ({width})")
        moe["num_shared_experts"] = total // width
    spec["moe"] = moe
    return spec


def _qwen2(f: _Fields) -> dict[str, Any]:
    """Qwen2: Llama's layout with biases on the q, k and v projections (``Qwen2Attention``)."""
    return {**_llama_like(f), "qkv_bias": True}


def _qwen3(f: _Fields, moe: bool = False) -> dict[str, Any]:
    """Qwen3 (-MoE): Llama's layout with an RMSNorm over ``head_dim`` on queries and keys
    (``Qwen3Attention.q_norm``/``k_norm``)."""
    return {**(_qwen_moe(f, shared=False) if moe else _llama_like(f)), "qk_norm": True}


def _deepseek_v3(f: _Fields) -> dict[str, Any]:
    """DeepSeek-V3 (arXiv:2412.19437 §2.1): MLA with ``q_lora_rank``/``kv_lora_rank``; layer i is MoE
    when ``i >= first_k_dense_replace`` and ``i % moe_layer_freq == 0``, with ``n_shared_experts``
    shared and ``n_routed_experts`` routed experts of ``moe_intermediate_size``; ``topk_method``
    ``noaux_tc`` carries the per-expert routing bias of auxiliary-loss-free balancing (§2.1.2);
    ``num_nextn_predict_layers`` is the MTP depth (§2.2). ``num_key_value_heads`` is unused by MLA."""
    spec = _llama_like(f)
    spec.pop("num_kv_heads")
    spec.pop("head_dim", None)
    if f.data.get("q_lora_rank") is None:
        raise SimtrainError(f"{f.path}: field 'q_lora_rank' = null (uncompressed queries, as DeepSeek-V2-Lite): "
                            "simtrain's MLA needs a query LoRA rank")
    spec["mla"] = {k: f.need(k) for k in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                                          "v_head_dim")}
    freq, dense = f.get("moe_layer_freq", 1), f.get("first_k_dense_replace", 0)
    first = _moe_layers_from(f, spec["num_layers"], lambda i: i >= dense and i % freq == 0)
    spec["moe"] = dict(num_experts=f.need("n_routed_experts"), top_k=f.need("num_experts_per_tok"),
                       expert_ffn_hidden_size=f.need("moe_intermediate_size"),
                       num_shared_experts=f.get("n_shared_experts", 0), first_dense_layers=first,
                       router_bias=f.get("topk_method", "greedy") == "noaux_tc")
    spec["mtp_depth"] = f.get("num_nextn_predict_layers", 0)
    return spec


def _gpt2(f: _Fields) -> dict[str, Any]:
    """GPT-2: LayerNorm, learned positions of ``n_positions``, biased linear layers, a 2-matrix GELU
    MLP of ``n_inner`` (default 4 x ``n_embd``), LM head tied to the input embedding."""
    h = f.need("n_embd")
    return dict(num_layers=f.need("n_layer"), hidden_size=h, ffn_hidden_size=f.get("n_inner", 4 * h),
                num_heads=f.need("n_head"), vocab_size=f.need("vocab_size"), seq_len=f.get("n_positions", 1024),
                activation="gelu", norm="layernorm", bias=True, learned_positions=True,
                tied_embeddings=bool(f.get("tie_word_embeddings", True)), dropout=_dropout(f),
                **_read(f, "activation_function"))


def _gpt_neox(f: _Fields) -> dict[str, Any]:
    """GPT-NeoX (Pythia): LayerNorm, rotary positions, biased linear layers (``attention_bias``,
    default true), a 2-matrix GELU MLP of ``intermediate_size``, untied head by default."""
    return dict(num_layers=f.need("num_hidden_layers"), hidden_size=f.need("hidden_size"),
                ffn_hidden_size=f.need("intermediate_size"), num_heads=f.need("num_attention_heads"), **_read(f, "hidden_act"),
                vocab_size=f.need("vocab_size"), seq_len=_seq_len(f), activation="gelu", norm="layernorm",
                bias=bool(f.get("attention_bias", True)), tied_embeddings=bool(f.get("tie_word_embeddings", False)),
                dropout=_dropout(f))


MAPPERS = {
    "llama": _llama_like, "mistral": _llama_like, "mixtral": _mixtral, "qwen2": _qwen2,
    "qwen2_moe": lambda f: {**_qwen_moe(f, shared=True), "qkv_bias": True}, "qwen3": _qwen3,
    "qwen3_moe": lambda f: _qwen3(f, moe=True), "deepseek_v3": _deepseek_v3, "gpt2": _gpt2, "gpt_neox": _gpt_neox,
}
"""``model_type`` -> mapping function; the families simtrain reads."""

_NOT_SIMULATED = {
    "sliding_window": "sliding-window attention: attention is simulated over the full sequence",
    "quantization_config": "stored weight format; choose the compute dtype with --dtype",
    "topk_group": "group-limited routing: give --node-limit for node-limited dispatch",
    "n_group": "",
}


def _warn_unmapped(f: _Fields) -> None:
    notes = []
    for key in f.unmapped():
        value = f.data[key]
        if key == "sliding_window" and (value is None or f.data.get("use_sliding_window") is False):
            continue  # Qwen2 configs carry a window they do not use
        why = _NOT_SIMULATED.get(key, "not represented")
        notes.append(f"'{key}' = {json.dumps(value)[:60]}" + (f" ({why})" if why else ""))
    if f.data.get("model_type") == "qwen2_moe":
        notes.append("the shared-expert gate (hidden_size weights per MoE layer) is not counted")
    if notes:
        warnings.warn(ConfigWarning(f"{f.path}: fields not simulated: " + "; ".join(notes)), stacklevel=3)


_KEYS = {
    "num_layers": ("num_hidden_layers", "n_layer"), "hidden_size": ("hidden_size", "n_embd"),
    "ffn_hidden_size": ("intermediate_size", "n_inner"), "num_heads": ("num_attention_heads", "n_head"),
    "num_kv_heads": ("num_key_value_heads",), "seq_len": ("rope_scaling.original_max_position_embeddings",
                                                        "max_position_embeddings", "n_positions"),
    "moe.num_experts": ("num_local_experts", "num_experts", "n_routed_experts"),
    "moe.expert_ffn_hidden_size": ("moe_intermediate_size", "intermediate_size"),
    "moe.num_shared_experts": ("n_shared_experts", "shared_expert_intermediate_size"),
    "moe.top_k": ("num_experts_per_tok",), "moe.first_dense_layers": ("first_k_dense_replace", "mlp_only_layers"),
}
"""simtrain's ModelSpec field -> the config keys it is read from (the first present one is named)."""


def _config_key(f: _Fields, field: str) -> tuple[str, object] | None:
    """The config key (and its value) a ModelSpec field came from, or None (a derived field)."""
    for key in _KEYS.get(field, (field.split(".")[-1],)):
        value: object = f.data
        for part in key.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        if value is not None:
            return key, value
    return None


def _describe(err: ValidationError, f: _Fields) -> str:
    """A ModelSpec validation error in the config's own key names (``num_hidden_layers``, not
    simtrain's ``num_layers``); a field with no single key keeps simtrain's name."""
    parts = []
    for e in err.errors():
        field = ".".join(str(x) for x in e["loc"])
        msg = e["msg"].removeprefix("Value error, ")
        found = _config_key(f, field) if e["loc"] else None
        if found is not None:
            parts.append(f"field '{found[0]}' = {found[1]!r}: {msg}")
        elif e["loc"]:
            parts.append(f"'{field}' (derived from the config) = {e.get('input')!r}: {msg}")
        else:  # a rule across fields: name them by their config keys
            for name in _KEYS:
                key = _config_key(f, name)
                if key is not None and "." not in name:
                    msg = re.sub(rf"\b{name}\b", key[0], msg)
            parts.append(msg)
    return f"{f.path}: " + "; ".join(parts)


def model_from_hf_dict(data: dict[str, Any], path: Path) -> ModelSpec:
    """Map a parsed HuggingFace config to a :class:`ModelSpec` (see the module docstring).

    Args:
        data: the parsed ``config.json``.
        path: where it came from (names the model and every message).

    Returns:
        The validated ModelSpec, named after the config's folder (or file stem).

    Raises:
        SimtrainError: unknown or missing ``model_type``, a missing required field, or a layout simtrain
            cannot represent. Warns (:class:`ConfigWarning`) once, listing unmapped fields.
    """
    model_type = data.get("model_type")
    if model_type not in MAPPERS:
        raise SimtrainError(f"{path}: field 'model_type' = {model_type!r}: simtrain reads HuggingFace configs of "
                            f"{sorted(MAPPERS)}")
    f = _Fields(data, path)
    spec = MAPPERS[model_type](f)
    name = path.parent.name if path.name == "config.json" and path.parent.name else path.stem
    spec.update(name=name, description=f"HuggingFace {model_type} config", source=str(path))
    try:
        model = ModelSpec.model_validate(spec)
    except ValidationError as err:
        raise SimtrainError(_describe(err, f)) from None
    _warn_unmapped(f)
    return model


def load_hf_config(path: Path) -> ModelSpec:
    """Read a HuggingFace ``config.json`` file and map it (:func:`model_from_hf_dict`).

    Raises:
        SimtrainError: the file is missing, unreadable or not JSON, repeats a key (in any
            object), or the mapping fails.
    """
    text = read_text(path, "a HuggingFace config.json", MAX_YAML_BYTES)

    def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:  # json keeps the last of a repeated key silently
        seen: dict[str, Any] = {}
        for key, value in pairs:
            if key in seen:
                raise SimtrainError(f"{path}: field {key!r} is given twice ({seen[key]!r} and {value!r}); "
                                    "keep one (a YAML file refuses this too)")
            seen[key] = value
        return seen

    try:
        data = json.loads(text, object_pairs_hook=unique)
    except json.JSONDecodeError as exc:
        raise SimtrainError(f"{path}: malformed JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}") from None
    if not isinstance(data, dict):
        raise SimtrainError(f"{path}: expected a JSON object of config fields")
    return model_from_hf_dict(data, path)
