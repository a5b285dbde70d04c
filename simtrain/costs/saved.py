"""What autograd saves for the backward of an eager (uncompiled) torchtitan Llama block, per token.

``ParallelConfig.kernels = "eager"`` prices the memory-bound operators as PyTorch eager ops
(:func:`simtrain.costs.eager.eager_factors`); this module gives the same setting's stored
activations. simtrain's default count (:func:`simtrain.costs.layers.layer_shape`) is Korthikanti
et al. 2022 §4.1's, for fused kernels; an eager block keeps more, and which tensors it keeps
follows from the model code and from the ``derivatives.yaml`` formula of each operator it calls
(torch's generated autograd saves an operand only when a formula of an input that requires a
gradient uses it). Counted from torchtitan at ``95677cb`` (2025-01-09), the code of the R3
case of ``simtrain/published/runs.yaml``:

* ``torchtitan/models/norms.py`` ``RMSNorm.forward`` / ``_norm``: ``x.float()``, ``pow(2)``,
  ``mean``, ``+ eps``, ``rsqrt``, ``x * rsqrt``, ``type_as(x)``, ``* weight``. ``pow`` and the
  first product save the fp32 input (in 16-bit training the ``float()`` copy, since the cast's
  backward saves nothing), ``rsqrt`` its output (one fp32 per token), the product with the weight
  the normalised tensor in the compute dtype; its output is the next linear layer's saved input.
* ``models/llama/model.py`` ``Attention.forward``: ``apply_rotary_emb`` multiplies by the
  ``freqs_cis`` buffer, which needs no gradient, so it saves only that buffer (shared by all
  tokens and layers; nothing per token); ``repeat_kv``'s ``expand(...).reshape(...)`` copies the
  rotated k and the v to all query heads (``reshape`` of a non-viewable tensor clones it), and
  SDPA saves those copies, q, its output and its log-sum-exp. In fp32 SDPA runs the memory-
  efficient kernel (FlashAttention takes only fp16/bf16: ``check_flash_attention_datatype`` in
  ``aten/src/ATen/native/transformers/cuda/sdp_utils.cpp``); ``_efficient_attention_forward``
  (``cuda/attention.cu``) writes its output as ``[b, s, heads, d]``, so the block's
  ``transpose(1, 2).contiguous()`` copies nothing and ``wo`` saves that same output; its
  log-sum-exp is fp32 ``[b, heads, ceil(s / 32) * 32]``, one per head and token (the fused
  count's :attr:`~simtrain.costs.layers.LayerShape.lse_bytes`, kept apart here).
* ``FeedForward.forward``: ``w2(silu(w1 x) * w3 x)``: ``silu`` saves its input (w1's output),
  the product both factors (silu's output and w3's output), ``w2`` its input (the product).

Per token and layer, with ``e`` bytes per element, hidden ``h``, ``a`` query heads of width
``d``, FFN width ``f``: each norm ``4 h + 4 + 2 e h`` bytes; attention ``4 e a d`` plus the
log-sum-exp ``4 a``; FFN ``4 e f``. In fp32 (``e = 4``, ``a d = h``) that is
``10 h + 4 f + a + 2`` elements, ``24 h`` for Llama 3 8B's ``f = 3.5 h``, against the fused
count's ``17 h + a``. The excess: the two normalised outputs and rsqrt (``2 h + 2``), k and v at
all heads instead of the key/value heads (``2 (a - kv) d``), and silu's output (``f``). A CPU
check of this count with ``torch.autograd.graph.saved_tensors_hooks`` on torchtitan's block is in
``docs/published_validation.md``.

The count is the torchtitan Llama block's: RMSNorm, SwiGLU, separate q/k/v projections (no MLA),
a dense FFN, no dropout, no q/k norm. Other layers keep the fused count (:func:`applies`).
"""

from __future__ import annotations

from ..models import ModelSpec

LSE = "attention_lse"
"""Key of the attention core's log-sum-exp, which the backward needs only without recomputation."""


def applies(model: ModelSpec, layer: int) -> bool:
    """Whether :func:`eager_layer_bytes` describes ``layer`` of ``model``: a torchtitan Llama
    block (RMSNorm, SwiGLU, no MLA, dense FFN, no dropout, no q/k norm, no biases)."""
    return (model.norm == "rmsnorm" and model.activation == "swiglu" and model.mla is None
            and not model.is_moe_layer(layer) and not model.dropout and not model.qk_norm
            and not model.bias and not model.qkv_bias)


def eager_norm_bytes(hidden: int, elem: int) -> float:
    """Bytes per token one eager RMSNorm keeps for the backward, its output included (the next
    linear layer's saved input): the fp32 input (or its fp32 copy), rsqrt's fp32 output, the
    normalised tensor and the scaled output in ``elem`` bytes each (``norms.py`` ``RMSNorm``)."""
    return 4 * hidden + 4 + 2 * elem * hidden


def eager_layer_bytes(model: ModelSpec, elem: int) -> dict[str, float]:
    """Bytes per token that autograd saves in one eager torchtitan Llama block (whole, before any
    TP split), per operator group (the module docstring gives the count and its sources).

    Args:
        model: a model whose layers :func:`applies` to.
        elem: bytes per element of the compute dtype (4 in fp32, 2 in bf16).

    Returns:
        ``{"attention_norm", "attention", "attention_lse", "ffn_norm", "ffn"}`` -> bytes per token:
        each norm with its output; q, the repeated k and v and the SDPA output; SDPA's fp32
        log-sum-exp (:data:`LSE`); w1's, silu's, w3's outputs and their product.
    """
    h, a = model.hidden_size, model.num_heads
    norm = eager_norm_bytes(h, elem)
    return {
        "attention_norm": norm,
        "attention": elem * a * (3 * model.q_head_dim + model.v_head_dim),  # q, k and v at a heads, output
        LSE: 4.0 * a,
        "ffn_norm": norm,
        "ffn": 4.0 * elem * model.ffn_hidden_size,
    }


def eager_head_bytes(model: ModelSpec, elem: int) -> float:
    """Bytes per token the last stage's final norm, LM head and loss keep in eager torchtitan:
    the final RMSNorm with its output (the head GEMM's input), the logits in ``elem`` bytes (held
    as the stage's output, ``torch.distributed.pipelining`` ``stage.py`` ``fwd_cache``) and the
    fp32 log-softmax of the loss (``train.py`` ``loss_fn``: ``cross_entropy(pred.float(), ...)``,
    whose ``log_softmax`` saves its result)."""
    return eager_norm_bytes(model.hidden_size, elem) + (elem + 4.0) * model.vocab_size
