"""What torch's selective activation checkpointing stores for one Llama block under torchtitan's
"selective op" policy (every second mm recomputed) with TP and sequence parallelism, as JSON.

One CPU process with torch's fake process group (collectives move no data; shapes are real). The
block and its TP plan follow torchtitan ``models/llama/model.py`` / ``parallelize_llama.py`` at
``9dec370`` (norms ``SequenceParallel``; attention and FFN inputs gathered from ``Shard(1)``; wq,
wk, wv, w1, w3 ``ColwiseParallel``; wo, w2 ``RowwiseParallel(output_layouts=Shard(1))``), the policy
its ``_custom_policy`` over ``_save_list`` (CPU's SDPA kernel stands in for the CUDA flash one).
Prints ``[{"op", "placement", "elements_per_token"}]`` per saved output, in forward order, per token
of the full sequence. Run by tests/test_review11_fixes.py in a subprocess (the fake group is global).
"""

import json
import sys
from collections import defaultdict

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel,
                                               parallelize_module)
from torch.testing._internal.distributed.fake_pg import FakeStore
from torch.utils.checkpoint import _RECOMPUTE, CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

TP, S, H, HEADS, KV, FFN = (int(a) for a in sys.argv[1:7])
D = H // HEADS
dist.init_process_group("fake", rank=0, world_size=TP, store=FakeStore())
mesh = init_device_mesh("cpu", (TP,))


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.wq, self.wk, self.wv = (nn.Linear(H, n * D, bias=False) for n in (HEADS, KV, KV))
        self.wo = nn.Linear(HEADS * D, H, bias=False)

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = (w(x).view(b, s, -1, D).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        rep = q.shape[1] // k.shape[1]
        k, v = (t.repeat_interleave(rep, dim=1) for t in (k, v))
        return self.wo(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, -1))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention_norm, self.ffn_norm = nn.RMSNorm(H), nn.RMSNorm(H)
        self.attention = Attention()
        self.w1, self.w3, self.w2 = nn.Linear(H, FFN, bias=False), nn.Linear(H, FFN, bias=False), nn.Linear(FFN, H, bias=False)

    def forward(self, x):
        h = x + self.attention(self.attention_norm(x))
        y = self.ffn_norm(h)
        return h + self.w2(F.silu(self.w1(y)) * self.w3(y))


block = Block()
gathered = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
parallelize_module(block, mesh, {
    "attention_norm": SequenceParallel(), "ffn_norm": SequenceParallel(), "attention": gathered,
    "attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(), "attention.wv": ColwiseParallel(),
    "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
    "w1": ColwiseParallel(input_layouts=Shard(1)), "w3": ColwiseParallel(input_layouts=Shard(1)),
    "w2": RowwiseParallel(output_layouts=Shard(1))})
SAVE = {torch.ops.aten.mm.default, torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
        torch.ops._c10d_functional.reduce_scatter_tensor.default}
count = defaultdict(int)


def policy(ctx, func, *args, **kwargs):
    mode = "recompute" if ctx.is_recompute else "forward"
    if func == torch.ops.aten.mm.default:
        count[mode] += 1
    save = func in SAVE and not (func == torch.ops.aten.mm.default and count[mode] % 2 == 0)
    return CheckpointPolicy.MUST_SAVE if save else CheckpointPolicy.PREFER_RECOMPUTE


modes = create_selective_checkpoint_contexts(policy)
x = torch.randn(1, S // TP, H, requires_grad=True)  # this rank's sequence shard
checkpoint(block, x, use_reentrant=False, context_fn=lambda: modes)
rows = []
for key, outs in modes[0].storage.items():
    for out in (outs.values() if isinstance(outs, dict) else outs):
        if out is _RECOMPUTE:
            continue
        for t in (out if isinstance(out, (list, tuple)) else [out]):
            v = getattr(t, "val", t)
            if not isinstance(v, torch.Tensor) or not v.is_floating_point():
                continue
            local = v._local_tensor if isinstance(v, DTensor) else v
            rows.append(dict(op=str(key[0] if isinstance(key, tuple) else key),
                             placement=str(v.placements[0]) if isinstance(v, DTensor) else "local",
                             elements_per_token=local.numel() / S))
print(json.dumps(rows))
