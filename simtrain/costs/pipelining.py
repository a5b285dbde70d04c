"""The pipeline runtime's own activation buffers (``ParallelConfig.pp_buffers``).

``per-transfer`` (the default) stores nothing beyond the chunk's activations: a receive allocates
the tensor that becomes the stage input, and a sent output is dropped once sent (Megatron-LM's
p2p schedules, whose ``deallocate_output_tensor`` frees a sent output's data).

``per-microbatch`` is ``torch.distributed.pipelining`` (``stage.py``, ``PipelineStage``; the same
in torch 2.5-2.6 as the code torchtitan ran at ``95677cb`` and today):

* ``_prepare_forward_infra`` allocates, for every microbatch, a receive buffer for the stage's
  input on every stage but the first (``args_recv_info[chunk_id]``, ``_make_tensor_from_meta``),
  and ``_prepare_backward_infra`` a receive buffer for the output gradient on every stage but the
  last (``grad_recv_info[mb_index]``). The stage object keeps them, so they are held all step
  (static memory, the ``comm_buffers`` part of :func:`simtrain.memory.memory_breakdown`);
* ``forward_one_chunk`` keeps each forward's output in ``fwd_cache`` until that microbatch's
  backward input step pops it (the root of the stage's ``autograd`` call): one more activation of
  the sent size per microbatch in flight on every stage but the last (the last stage's output is
  the logits, already stored);
* the received input is the receive buffer itself (``_retrieve_recv_activations``), so where the
  chunk's first layer saves that very tensor (the fused count's norm input, full recompute's
  layer input, the fp32 eager block's RMSNorm input), it is not stored a second time; an eager
  16-bit block saves an fp32 copy instead (:mod:`simtrain.costs.saved`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StageBuffers:
    """What ``per-microbatch`` pipeline buffers change for one chunk (bytes).

    Attributes:
        activation_delta: per microbatch, added to what F stores and I frees.
        held_delta: per microbatch, added to what W still holds after I.
        static: receive buffers held all step on the chunk's rank.
    """

    activation_delta: float = 0.0
    held_delta: float = 0.0
    static: float = 0.0


def stage_buffers(p2p_bytes: float, microbatches: int, first: bool, last: bool, input_saved: bool,
                  graph_held: bool) -> StageBuffers:
    """The :class:`StageBuffers` of a chunk under ``pp_buffers: per-microbatch``.

    Args:
        p2p_bytes: bytes of one microbatch's activation (and gradient) between stages.
        microbatches: microbatches per step (one buffer each, per direction).
        first, last: whether the chunk is the first (no input to receive) or the last (no output
            gradient to receive, output already stored) of the model.
        input_saved: whether the chunk's first layer saves its input tensor itself.
        graph_held: whether W holds the autograd graph (``w_pending: autograd``), the input with it.

    Returns:
        The chunk's deltas and receive-buffer bytes.
    """
    dup = p2p_bytes if input_saved and not first else 0.0
    return StageBuffers(activation_delta=(0.0 if last else p2p_bytes) - dup,
                        held_delta=-dup if graph_held else 0.0,
                        static=microbatches * p2p_bytes * ((not first) + (not last)))
