"""Model specs: transformer shapes (dense or Mixture-of-Experts) and their parameter counts.

Presets live in ``simtrain/model_presets/<name>.yaml``; any YAML file of the same schema works too,
and so does a HuggingFace ``config.json`` (mapped by :mod:`simtrain.importers.hf`).
Each preset states its source and the parameter counts its authors published, so a test can check
that :attr:`ModelSpec.total_params` agrees with them.

Parameter counting follows the architecture literally: every weight matrix, bias and norm; the
input embedding, learned position embedding (GPT-3) and, unless tied, the output (LM head) matrix.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .errors import NumbersNotBooleans, SimtrainError, load_yaml_file, validate_model

PRESET_PACKAGE = "simtrain.model_presets"
MAX_DIM = 2**31 - 1
"""Largest count or dimension a model field may have (no published model comes within a factor
1000 of it; above it, a value can only be a typo)."""


class _Strict(NumbersNotBooleans):
    model_config = ConfigDict(extra="forbid", frozen=True)


class MLASpec(_Strict):
    """Multi-head latent attention (DeepSeek-V2/V3 §2.1.1): low-rank compressed Q and KV.

    Attributes:
        q_lora_rank: query compression width d_c' (1536 in DeepSeek-V3).
        kv_lora_rank: key/value compression width d_c (512).
        qk_nope_head_dim: per-head query/key width without RoPE d_h (128).
        qk_rope_head_dim: per-head decoupled RoPE query/key width d_h^R (64).
        v_head_dim: per-head value width (128).
    """

    q_lora_rank: int = Field(ge=1, le=MAX_DIM)
    kv_lora_rank: int = Field(ge=1, le=MAX_DIM)
    qk_nope_head_dim: int = Field(ge=1, le=MAX_DIM)
    qk_rope_head_dim: int = Field(ge=0, le=MAX_DIM)
    v_head_dim: int = Field(ge=1, le=MAX_DIM)


class MoESpec(_Strict):
    """Mixture-of-Experts FFN: routed experts (top-k per token), optional shared experts.

    ``first_dense_layers`` leading layers keep a dense FFN of ``ModelSpec.ffn_hidden_size``
    (DeepSeek-V3: 3); every other layer is an MoE layer.

    Attributes:
        num_experts: routed experts per MoE layer.
        top_k: routed experts each token is sent to.
        expert_ffn_hidden_size: FFN width of one expert (routed or shared).
        num_shared_experts: experts every token passes through.
        first_dense_layers: leading layers with a dense FFN.
        router_bias: the router carries a per-expert bias (DeepSeek-V3's auxiliary-loss-free balancing).
        activation_clamp: the routed experts' gated activation clamps its two halves at this value
            before the GLU (Megatron-Core ``activation_func_clamp_value``, HF ``swiglu_limit``;
            GPT-OSS 7.0); None: no clamp. Priced by :mod:`simtrain.costs.expert_epilogue`.
    """

    num_experts: int = Field(ge=1, le=MAX_DIM)
    top_k: int = Field(ge=1, le=MAX_DIM)
    expert_ffn_hidden_size: int = Field(ge=1, le=MAX_DIM)
    num_shared_experts: int = Field(default=0, ge=0, le=MAX_DIM)
    first_dense_layers: int = Field(default=0, ge=0, le=MAX_DIM)
    router_bias: bool = False
    activation_clamp: float | None = Field(default=None, gt=0, le=1e6)

    @model_validator(mode="after")
    def _k_le_e(self) -> MoESpec:
        if self.top_k > self.num_experts:
            raise ValueError(f"top_k ({self.top_k}) must be <= num_experts ({self.num_experts})")
        return self


class ModelSpec(_Strict):
    """A decoder-only transformer.

    Attributes (all counts, no units):
        name, description, source: identification; ``source`` cites the published shape.
        num_layers: transformer layers.
        hidden_size: model width h.
        ffn_hidden_size: dense FFN width f.
        num_heads: attention heads a.
        num_kv_heads: key/value heads (GQA); defaults to num_heads.
        head_dim: per-head width; defaults to h / a.
        vocab_size: vocabulary size V.
        seq_len: default training sequence length, tokens.
        activation: ``gelu`` (2 FFN matrices) or ``swiglu`` (3 FFN matrices).
        norm: ``layernorm`` (weight + bias) or ``rmsnorm`` (weight).
        bias: linear layers carry biases (GPT-3).
        qkv_bias: only the query/key/value projections carry biases (Qwen2).
        qk_norm: an RMSNorm over head_dim on queries and on keys (Qwen3; 2 x head_dim weights).
        learned_positions: a learned position embedding of seq_len x h (GPT-3).
        tied_embeddings: the LM head reuses the input embedding.
        dropout: the model trains with dropout (adds dropout masks to stored activations).
        mla: multi-head latent attention instead of standard attention (DeepSeek), see MLASpec.
        moe: the MoE FFN, if any.
        mtp_depth: multi-token-prediction modules D (DeepSeek-V3 report, arXiv:2412.19437, §2.2;
            HF ``num_nextn_predict_layers``, 1 for DeepSeek-V3): each predicts one more future token
            through its own RMSNorms, projection and Transformer block and the shared embedding and
            output head (:meth:`mtp_module_params`); 0: none. Trained with the model, so priced
            in compute, memory and MFU (:mod:`simtrain.costs.mtp`); not in ``total_params``. At most
            64 (published models use 1 to 4; above it a value can only be a typo).
        published_total_params, published_active_params: the authors' figures, for tests.
    """

    name: str
    description: str = ""
    source: str = ""
    num_layers: int = Field(ge=1, le=MAX_DIM)
    hidden_size: int = Field(ge=1, le=MAX_DIM)
    ffn_hidden_size: int = Field(ge=1, le=MAX_DIM)
    num_heads: int = Field(ge=1, le=MAX_DIM)
    num_kv_heads: int | None = Field(default=None, ge=1, le=MAX_DIM)
    head_dim: int | None = Field(default=None, ge=1, le=MAX_DIM)
    vocab_size: int = Field(ge=1, le=MAX_DIM)
    seq_len: int = Field(ge=1, le=MAX_DIM)
    activation: Literal["gelu", "swiglu"] = "swiglu"
    norm: Literal["layernorm", "rmsnorm"] = "rmsnorm"
    bias: bool = False
    qkv_bias: bool = False
    qk_norm: bool = False
    learned_positions: bool = False
    tied_embeddings: bool = False
    dropout: bool = False
    mla: MLASpec | None = None
    moe: MoESpec | None = None
    mtp_depth: int = Field(default=0, ge=0, le=64)
    published_total_params: float | None = Field(default=None, gt=0, le=1e16)
    published_active_params: float | None = Field(default=None, gt=0, le=1e16)

    @model_validator(mode="after")
    def _check_shapes(self) -> ModelSpec:
        if self.kv_heads > self.num_heads or self.num_heads % self.kv_heads:
            raise ValueError(
                f"num_kv_heads ({self.kv_heads}) must divide num_heads ({self.num_heads})"
            )
        if self.head_dim is None and self.mla is None and self.hidden_size % self.num_heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be divisible by num_heads "
                f"({self.num_heads}) unless head_dim is given"
            )
        if self.moe is not None and self.moe.activation_clamp is not None and self.activation != "swiglu":
            raise ValueError(f"moe.activation_clamp ({self.moe.activation_clamp}) needs a gated activation "
                             f"(activation: swiglu), not {self.activation}")
        if self.moe is not None and self.moe.first_dense_layers > self.num_layers:
            raise ValueError(
                f"moe.first_dense_layers ({self.moe.first_dense_layers}) exceeds "
                f"num_layers ({self.num_layers})"
            )
        return self

    # ------------------------------------------------------------------ derived shapes
    @property
    def kv_heads(self) -> int:
        """Key/value heads (GQA); equals num_heads for multi-head attention."""
        return self.num_kv_heads or self.num_heads

    @property
    def q_head_dim(self) -> int:
        """Per-head query/key width (MLA: nope + rope parts)."""
        if self.mla is not None:
            return self.mla.qk_nope_head_dim + self.mla.qk_rope_head_dim
        return self.head_dim or self.hidden_size // self.num_heads

    @property
    def v_head_dim(self) -> int:
        """Per-head value width."""
        if self.mla is not None:
            return self.mla.v_head_dim
        return self.head_dim or self.hidden_size // self.num_heads

    def is_moe_layer(self, layer: int) -> bool:
        """Whether 0-based ``layer`` has an MoE FFN (False for dense models and leading dense layers)."""
        return self.moe is not None and layer >= self.moe.first_dense_layers

    @property
    def num_moe_layers(self) -> int:
        """How many layers have an MoE FFN."""
        return 0 if self.moe is None else self.num_layers - self.moe.first_dense_layers

    # ------------------------------------------------------------------ parameter counts
    def norm_params(self, width: int) -> int:
        """Parameters of one norm over ``width`` features (LayerNorm: weight + bias)."""
        return 2 * width if self.norm == "layernorm" else width

    def linear_params(self, fan_in: int, fan_out: int) -> int:
        """Parameters of one linear layer, with bias if the model uses biases."""
        return fan_in * fan_out + (fan_out if self.bias else 0)

    def attention_params(self) -> int:
        """Parameters of one attention block (projections, MLA norms), excluding the pre-norm."""
        h = self.hidden_size
        if self.mla is not None:
            m = self.mla
            a = self.num_heads
            return (
                self.linear_params(h, m.q_lora_rank)
                + self.norm_params(m.q_lora_rank)
                + self.linear_params(m.q_lora_rank, a * (m.qk_nope_head_dim + m.qk_rope_head_dim))
                + self.linear_params(h, m.kv_lora_rank + m.qk_rope_head_dim)
                + self.norm_params(m.kv_lora_rank)
                + self.linear_params(m.kv_lora_rank, a * (m.qk_nope_head_dim + m.v_head_dim))
                + self.linear_params(a * m.v_head_dim, h)
            )
        q = self.num_heads * self.q_head_dim
        kv = self.kv_heads * self.q_head_dim + self.kv_heads * self.v_head_dim
        extra = (q + kv if self.qkv_bias and not self.bias else 0) + (2 * self.q_head_dim if self.qk_norm else 0)
        return self.linear_params(h, q + kv) + self.linear_params(self.num_heads * self.v_head_dim, h) + extra

    def ffn_params(self, width: int) -> int:
        """Parameters of one dense FFN (or one expert) of intermediate ``width``."""
        h = self.hidden_size
        if self.activation == "swiglu":
            return 2 * self.linear_params(h, width) + self.linear_params(width, h)
        return self.linear_params(h, width) + self.linear_params(width, h)

    def layer_params(self, layer: int, experts: str = "all") -> int:
        """Parameters of 0-based ``layer``.

        Args:
            layer: layer index.
            experts: ``"all"`` counts every routed expert, ``"active"`` only top_k of them.
        """
        h = self.hidden_size
        n = 2 * self.norm_params(h) + self.attention_params()
        if self.is_moe_layer(layer):
            moe = self.moe
            routed = moe.num_experts if experts == "all" else moe.top_k
            n += (routed + moe.num_shared_experts) * self.ffn_params(moe.expert_ffn_hidden_size)
            n += h * moe.num_experts + (moe.num_experts if moe.router_bias else 0)
        else:
            n += self.ffn_params(self.ffn_hidden_size)
        return n

    def embedding_params(self) -> int:
        """Input embedding (and learned positions)."""
        n = self.vocab_size * self.hidden_size
        if self.learned_positions:
            n += self.seq_len * self.hidden_size
        return n

    def head_params(self) -> int:
        """Final norm plus the LM head matrix (0 for the matrix when tied)."""
        head = 0 if self.tied_embeddings else self.vocab_size * self.hidden_size
        return self.norm_params(self.hidden_size) + head

    def mtp_layer(self, depth: int) -> int:
        """Layer index of the Transformer block of MTP module ``depth`` (0-based): ``num_layers +
        depth``, as DeepSeek-V3's checkpoint numbers it (``model.layers.61``). The block is of the
        kind of the deepest layers (an MoE layer in DeepSeek-V3, §2.2: "one Transformer block")."""
        return self.num_layers + depth

    def mtp_module_params(self, depth: int = 0) -> int:
        """Parameters of MTP module ``depth`` that the main model does not share: the RMSNorms of the
        previous depth's hidden state and of the token embedding, the projection ``M_k`` of their
        concatenation (2h -> h, no bias), the Transformer block and the shared head's own final
        RMSNorm; the embedding and the output matrix are the main model's (DeepSeek-V3 §2.2, Eq. 21-23;
        module layout: vLLM ``vllm/model_executor/models/deepseek_mtp.py``,
        ``DeepSeekMultiTokenPredictorLayer``: ``enorm``, ``hnorm``, ``eh_proj``, ``mtp_block``,
        ``shared_head.norm``)."""
        h = self.hidden_size
        return 3 * self.norm_params(h) + 2 * h * h + self.layer_params(self.mtp_layer(depth))

    @property
    def mtp_params(self) -> int:
        """Parameters of all ``mtp_depth`` MTP modules (0 without MTP), not counted in ``total_params``."""
        return sum(self.mtp_module_params(d) for d in range(self.mtp_depth))

    @property
    def last_stage_embedding(self) -> bool:
        """Whether the stage holding the LM head needs the input embedding matrix too: tied
        embeddings (the head is that matrix) or MTP (its modules embed the next tokens, §2.2)."""
        return self.tied_embeddings or self.mtp_depth > 0

    @property
    def total_params(self) -> int:
        """All parameters of the main model (MTP modules excluded, as DeepSeek-V3's 671B; see
        :attr:`mtp_params`)."""
        return (
            self.embedding_params()
            + sum(self.layer_params(i) for i in range(self.num_layers))
            + self.head_params()
        )

    @property
    def activated_params(self) -> int:
        """Parameters a token passes through (MoE: top_k routed + shared experts); = total if dense."""
        return (
            self.embedding_params()
            + sum(self.layer_params(i, experts="active") for i in range(self.num_layers))
            + self.head_params()
        )


def available_models() -> list[str]:
    """Names of the model presets shipped with simtrain, sorted."""
    folder = resources.files(PRESET_PACKAGE)
    return sorted(p.name[: -len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml"))


def load_model(name_or_path: str | Path) -> ModelSpec:
    """Load a model preset by name, a model spec YAML file by path, or a HuggingFace
    ``config.json`` (any ``.json`` file; see :func:`simtrain.importers.hf.load_hf_config`).

    Raises:
        SimtrainError: unknown name, missing file, malformed YAML/JSON, an invalid field, or an
            HF ``model_type`` that is not mapped.
    """
    text = str(name_or_path)
    candidate = Path(text)
    if candidate.suffix == ".json":
        from .importers.hf import load_hf_config

        return load_hf_config(candidate)
    if candidate.suffix in (".yaml", ".yml") or candidate.exists():
        path = candidate
    else:
        path = Path(str(resources.files(PRESET_PACKAGE).joinpath(f"{text}.yaml")))
        if not path.exists():
            raise SimtrainError(
                f"unknown model '{text}': not a file, and not one of {available_models()}"
            )
    return validate_model(ModelSpec, load_yaml_file(path), str(path))
