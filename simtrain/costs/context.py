"""Context parallelism (CP): each sequence of a microbatch is split over ``cp`` GPUs, and what
attention then has to communicate.

Each CP rank holds ``s / cp`` tokens of every sequence, so its GEMM FLOPs, its activations and the
messages it sends along the pipeline are divided by ``cp`` (:func:`simtrain.costs.stage_costs`
divides the tokens). Attention needs the keys and values of the whole sequence: every query of the
rank's tokens still meets ``s`` keys, so attention FLOPs per token keep their full-``s`` cost.
Causal load balancing (Megatron-Core's ``get_batch_on_this_cp_rank`` and Llama 3 §3.3.2 split the
sequence into ``2 x cp`` chunks and give rank i chunks i and ``2cp-1-i``) gives every rank the
same share of the causal attention work, which is what dividing the tokens evenly models; it
needs ``2 x cp`` to divide the sequence length.

Per layer and microbatch, with ``kv`` the bytes of this rank's K and V (``s/cp x b x 2 x
kv_heads/tp x head_dim``) and ``q``, ``o`` those of its queries and attention output:

* ``ring`` (Liu et al. 2023, "Ring Attention with Blockwise Transformers", §3; Megatron-Core's
  ``cp_comm_type="p2p"``): ``cp - 1`` steps each pass a KV block to the next CP rank while the
  rank computes attention on the block it holds: the bytes of a ring all-gather of the layer's
  KV (``(cp-1)/cp x cp x kv``). The backward passes the KV blocks and their gradients (twice the
  bytes). A transfer is hidden behind one block of attention, so the ``cp - 1`` transfers can
  hide behind ``(cp-1)/cp`` of the layer's attention time; the rest is exposed;
* ``allgather`` (Llama 3, Dubey et al. 2024 §3.3.2; Megatron-Core's ``"all_gather"``): all-gather
  K and V before attention (not overlapped); the backward gathers them again and reduce-scatters
  their gradients;
* ``ulysses`` (Jacobs et al. 2023, "DeepSpeed Ulysses", §3): an all-to-all of Q, K, V before
  attention (sequence-split to head-split) and one of the output after it; the backward does the
  same for the gradients. The heads of a TP rank are split over CP: ``tp x cp`` must divide the
  attention heads and the KV heads.

With full recomputation the backward repeats the forward's collectives too.

``cp_impl: torch`` is torch's ``context_parallel`` (``torch/distributed/tensor/experimental/
_attention.py``: ``_templated_ring_attention`` and its backward; pytorch/pytorch at ``0123248a``,
the same loop as the December 2024 nightly torchtitan ``9dec370`` ran), with the KV heads that
torchtitan's Llama passes to SDPA after ``repeat_kv`` (every query head, ``models/llama/model.py``
at ``9dec370``). Per layer, with ``kv`` now ``s/cp x b x 2 x heads/tp x head_dim``:

* F: one ``all_gather_tensor`` of ``cat(K, V)`` (``_AllGatherRotater``), issued before the first of
  the ``cp`` SDPA calls and waited for before the second, so it can hide behind one call's
  attention (``1/cp`` of the layer's: with load balancing every call has the same work);
* I: the same all-gather, then at every one of the ``cp`` steps the fp32 ``cat(dK, dV)`` sent to
  the next CP rank (``dkv_rotater``, ``_RotateMethod.ALL_TO_ALL``: ``ft_c.permute_tensor``), each
  waited for after the next call's attention; the last wait follows the last call. They are
  priced as hiding behind ``(cp-1)/cp`` of I's attention. One rank's send to its ring neighbour
  moves the bytes of one ring all-gather step, so it is priced as an all-gather whose output is
  ``cp / (cp-1)`` times the message.

``ring`` (torchtitan's ``alltoall`` rotate method) passes ``cat(K, V)`` around the ring instead:
the same bytes per rank as the all-gather, in ``cp - 1`` messages. Its merges and accumulations are
:mod:`simtrain.costs.cp_merge`'s.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..errors import SimtrainError
from ..models import ModelSpec
from ..network import Collective
from ..parallel import ParallelConfig, flag_name


@dataclass(frozen=True)
class CPDeclaration:
    """The CP collectives of one chunk for one microbatch on one GPU, and what can hide them.

    Attributes:
        forward, backward: collectives of F and of the backward input pass (I, or B).
        hide_forward_s, hide_backward_s: seconds of attention compute that can overlap them
            (``ring`` only; 0 otherwise).
    """

    forward: tuple[Collective, ...] = ()
    backward: tuple[Collective, ...] = ()
    hide_forward_s: float = 0.0
    hide_backward_s: float = 0.0


def check_context_parallel(model: ModelSpec, parallel: ParallelConfig, seq_len: int,
                           name: Callable[[str, object], str] = flag_name) -> None:
    """Refuse a CP setting that cannot run.

    Args:
        model, parallel: the model and the degrees; seq_len: the sequence length (tokens).
        name: how a message names a setting, from its field and value (default: the flag,
            ``--cp 3``; :func:`simtrain.costs.stage.check_settings`).

    Raises:
        SimtrainError: ``2 x cp`` not dividing the sequence length (causal load balancing), CP
            with expert parallelism, Ulysses with ``tp x cp`` not dividing the attention or KV
            heads, or Ulysses with ``cp_impl: torch``.
    """
    cp = parallel.cp
    if cp == 1:
        return
    if seq_len % (2 * cp):
        raise SimtrainError(
            f"{name('cp', cp)}: 2 x cp = {2 * cp} must divide the sequence length {seq_len} "
            "(causal load balancing splits each sequence into 2 x cp chunks)")
    if parallel.ep > 1:
        raise SimtrainError(f"{name('cp', cp)} with {name('ep', parallel.ep)}: context parallelism with expert "
                            f"parallelism is not modelled; use {name('cp', 1)} or {name('ep', 1)}")
    if parallel.cp_kind == "ulysses" and parallel.cp_impl == "torch":
        raise SimtrainError(f"{name('cp_impl', 'torch')} with {name('cp_kind', 'ulysses')}: torch's context_parallel "
                            f"rotates K and V (allgather or alltoall); use {name('cp_kind', 'allgather')} or 'ring', "
                            f"or {name('cp_impl', 'te')}")
    if parallel.cp_kind == "ulysses":
        for heads, what in ((model.num_heads, "attention heads"), (model.kv_heads, "KV heads")):
            if heads % (parallel.tp * cp):
                raise SimtrainError(
                    f"{name('cp', cp)} with {name('cp_kind', parallel.cp_kind)}: tp x cp = {parallel.tp * cp} must divide the model's "
                    f"{heads} {what} ({model.name}); use {name('cp_kind', 'ring')} or 'allgather', or a smaller cp")


def cp_declaration(model: ModelSpec, parallel: ParallelConfig, tokens: int, layers: int,
                   attn_forward_s: float, attn_backward_s: float) -> CPDeclaration:
    """The CP collectives of a chunk of ``layers`` transformer layers.

    Args:
        model, parallel: the model and the degrees (cp, cp_kind, tp, recompute, dtype).
        tokens: tokens of one microbatch on this GPU (``b x s / cp``).
        layers: transformer layers in the chunk.
        attn_forward_s, attn_backward_s: the chunk's attention seconds in F and in I.

    Returns:
        The :class:`CPDeclaration` (empty when ``cp == 1`` or the chunk has no layers).
    """
    cp, tp, elem = parallel.cp, parallel.tp, parallel.dtype_bytes
    if cp == 1 or layers == 0:
        return CPDeclaration()
    if parallel.cp_impl == "torch":
        return _torch_declaration(model, parallel, tokens, layers, attn_forward_s, attn_backward_s)
    d_q, d_v = model.q_head_dim, model.v_head_dim
    kv = tokens * model.kv_heads * (d_q + d_v) / tp * elem  # this rank's K and V
    kind = parallel.cp_kind
    if kind == "ring":
        fwd = (Collective("all-gather", "cp", kv * cp, repeat=layers),)
        bwd = (Collective("all-gather", "cp", 2 * kv * cp, repeat=layers),)
        hide = (cp - 1) / cp
        decl = CPDeclaration(fwd, bwd, hide * attn_forward_s, hide * attn_backward_s)
    elif kind == "allgather":
        fwd = (Collective("all-gather", "cp", kv * cp, repeat=layers),)
        bwd = fwd + (Collective("reduce-scatter", "cp", kv * cp, repeat=layers),)
        decl = CPDeclaration(fwd, bwd)
    else:  # ulysses: Q, K, V in, output back (the backward: their gradients)
        q_o = tokens * model.num_heads * (d_q + d_v) / tp * elem
        fwd = (Collective("all-to-all", "cp", kv + q_o, repeat=layers),)
        decl = CPDeclaration(fwd, fwd)
    return _full_recompute(decl, parallel)


def _full_recompute(decl: CPDeclaration, parallel: ParallelConfig) -> CPDeclaration:
    """``decl`` with full recomputation: the backward reruns the forward's collectives first."""
    if parallel.recompute != "full":
        return decl
    return CPDeclaration(decl.forward, decl.forward + decl.backward, decl.hide_forward_s,
                         decl.hide_forward_s + decl.hide_backward_s)


def _torch_declaration(model: ModelSpec, parallel: ParallelConfig, tokens: int, layers: int,
                       attn_forward_s: float, attn_backward_s: float) -> CPDeclaration:
    """torch ``context_parallel``'s collectives of a chunk (``cp_impl: torch``, module docstring):
    the all-gather (or ring) of every head's K and V in the compute dtype, in I also the ``cp``
    fp32 dK/dV messages; arguments as :func:`cp_declaration`'s."""
    cp = parallel.cp
    kv_elems = tokens * model.num_heads / parallel.tp * (model.q_head_dim + model.v_head_dim)
    gather = Collective("all-gather", "cp", kv_elems * parallel.dtype_bytes * cp, repeat=layers)
    dkv = Collective("all-gather", "cp", 4 * kv_elems * cp / (cp - 1), repeat=layers * cp)
    if parallel.cp_kind == "ring":  # each call hides the next block's message
        hide_f = attn_forward_s * (cp - 1) / cp
    else:
        hide_f = attn_forward_s / cp
    decl = CPDeclaration((gather,), (gather, dkv), hide_f, attn_backward_s * (cp - 1) / cp)
    return _full_recompute(decl, parallel)

