"""torch context parallelism's memory-bound work around the attention calls (``cp_impl: torch``).

torch's ``context_parallel`` (``torch/distributed/tensor/experimental/_attention.py``, pytorch at
``0123248a``; the December 2024 nightly that torchtitan ``9dec370`` ran has the same loop) runs one
SDPA call per rotation step, ``cp`` of them a layer, and combines their results outside the
attention kernel:

* F (``_templated_ring_attention``, ``_SDPAMerger``): every step's output is cast to fp32
  (``convert_to_f32`` is True) and merged into the running output by its log-sum-exp,
  ``out - sigmoid(lse_b - lse) * (out - out_b)``; a step over half the queries updates the second
  half and ``torch.cat``\\ s the halves (``_partial_update``). The result is cast back.
* I (``_templated_ring_attention_backward``): dQ, dK and dV are accumulated in fp32 over the
  ``cp`` steps (``grad_query += grad_query_``, ``_partial_update(..., add=True)`` for half-size
  gradients); every step ``torch.cat``\\ s fp32 dK and dV into the message for the next rank, and
  the received sum is cast back at the end.
* Both passes make ``key``/``value`` contiguous and ``torch.cat`` them into the buffer to rotate
  at every step but the last; with the ``allgather`` rotater only the first buffer is sent.

Bytes per layer and microbatch on one GPU, for the last CP rank (whose every step after the first
takes all its queries against the first half of the keys: full-size outputs and dQ, half-size dK
and dV), with ``E_o``, ``E_q``, ``E_kv`` the elements of this rank's attention output, queries
and K plus V (every query head: torchtitan's ``repeat_kv`` comes first), ``e`` the compute
dtype's bytes and ``c = e + 4`` a cast to or from fp32 (0 when ``e`` is 4):

* eager (``kernels: eager``), each op reading its inputs and writing its output once:
  F ``2 e E_kv cp + E_o (2c + (cp-1)(c + 32))`` (the copies; per merge a cast, two subtractions
  of 12 bytes an element and a broadcast product of 8); I
  ``4 (E_q + E_kv) + 2 e E_kv cp + (8+e) E_q cp + c E_q + E_kv ((8+e) + (cp-1)((8+e)/2 + 8) + 8 cp + c)``
  (the fp32 zeros, the copies, the dQ additions, the dK/dV additions, half-size adds then their
  ``cat``, the messages' ``cat`` and the casts back);
* compiled (``fused``, ``compiled-blocks``: the SDPA calls and collectives split the traced
  graph, inductor fuses each step's pointwise ops into one kernel, removes the rotater's unused
  ``cat``\\ s and writes the first buffer where ``repeat_kv`` writes K and V): F
  ``E_o ((cp-1)(e+8) - 2(4-e))`` (each merge reads the fp32 running output and the step's output
  and writes the running output; the first step's output is read in the compute dtype and the
  last merge writes it), I dQ the same on ``E_q``, dK/dV ``E_kv ((e+4) + (cp-1)(8 + e/2) + c)``
  (the first gradient cast into the message; each later step reads the received fp32 message and
  a half-size gradient and writes the next message; the final cast).

Log-sum-exps (``1 / head_dim`` of an output) are left out. Under full recomputation the F work
reruns in I (:func:`simtrain.costs.ops.chunk_breakdown`); torchtitan's selective op policy saves
the SDPA call whole, merges included (the checkpoint mode sees the DTensor SDPA op), so it reruns
nothing of this.
"""

from __future__ import annotations

CP_MERGE = "cp_merge"
"""The operator of torch CP's merges (F) and gradient accumulations (I) around attention."""


def cp_merge_bytes(elems_o: float, elems_q: float, elems_kv: float, cp: int, elem: int,
                   eager: bool) -> tuple[float, float]:
    """HBM bytes of torch CP's merge work of one layer (module docstring).

    Args:
        elems_o, elems_q, elems_kv: elements of this rank's attention output, queries, and K
            plus V (every query head).
        cp: the CP degree (>= 2); elem: bytes of the compute dtype; eager: op by op, else fused.

    Returns:
        (F bytes, I bytes).
    """
    e, c = elem, (elem + 4 if elem < 4 else 0)
    if eager:
        fwd = 2 * e * elems_kv * cp + elems_o * (2 * c + (cp - 1) * (c + 32))
        bwd = (4 * (elems_q + elems_kv) + 2 * e * elems_kv * cp + (8 + e) * elems_q * cp + c * elems_q
               + elems_kv * ((8 + e) + (cp - 1) * ((8 + e) / 2 + 8) + 8 * cp + c))
        return fwd, bwd
    merge = (cp - 1) * (e + 8) - 2 * (4 - e)  # bytes per element of the running result
    return elems_o * merge, elems_q * merge + elems_kv * ((e + 4) + (cp - 1) * (8 + e / 2) + c)


def cp_merge_kernels(cp: int, eager: bool) -> tuple[float, float, float]:
    """Kernels of torch CP's merge work per layer and pass (F, I, W): compiled, one per merge
    step in F and per accumulator step in I; eager, one per op of the module docstring (nine per
    merge with the log-sum-exp's)."""
    if eager:  # F: 2 contiguous, cp-1 cats, 2 casts, the merges; I: 3 zeros, the copies, the adds, casts
        return (4.0 + 10 * (cp - 1), 9.0 + 5 * (cp - 1) + 2 * cp, 0.0)
    return (float(cp - 1), float(2 * cp), 0.0)


def cp_merge_op(ctx) -> list:
    """The ``cp_merge`` row of one layer for one microbatch on this GPU: ``[OpCost]`` with
    ``cp_impl: torch`` and ``cp > 1``, else ``[]``.

    Args:
        ctx: :mod:`simtrain.costs.ops`'s ``_Ctx`` (model, parallel settings, HBM rate).
    """
    from .ops import _memory

    par, m = ctx.parallel, ctx.model
    if par.cp == 1 or par.cp_impl != "torch":
        return []
    heads = ctx.tokens * m.num_heads / par.tp
    eager = par.kernels == "eager"
    fwd, bwd = cp_merge_bytes(heads * m.v_head_dim, heads * m.q_head_dim, heads * (m.q_head_dim + m.v_head_dim),
                              par.cp, ctx.elem, eager)
    return [_memory(CP_MERGE, fwd, bwd, ctx, kernels=cp_merge_kernels(par.cp, eager))]
