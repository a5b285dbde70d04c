"""What calibration and validation run, described once and free of torch at import time: the
validation transformer (:class:`ValidationModel`, also as a simtrain ModelSpec and ParallelConfig),
torch's pipeline schedules and their stage placements, the calibration model's cases, the
microbenchmark grids, and the builders of the kernels that are timed (GEMMs of ``nn.Linear``,
attention, elementwise kernels) and of a stage's ``nn.Module``.

Functions that need torch take the ``torch`` module as their first argument.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from ..costs import split_layers
from ..models import ModelSpec
from ..parallel import ParallelConfig

LINEAR_LAYERS = (("qkv", 1, 3), ("attn_out", 1, 1), ("ffn_up", 1, 4), ("ffn_down", 4, 1))
"""(name, fan_in / h, fan_out / h) of a GPT layer's linear layers (Narayanan et al. 2021 §5.1)."""


DEFAULT_GRID = {
    # device: (hidden sizes, tokens per microbatch, vocab sizes, (seq_len, head_dim, heads) list)
    "cpu": ([256, 512, 1024], [256, 1024], [2048], [(128, 64, 4), (256, 64, 4), (512, 64, 4)]),
    "cuda": ([2048, 4096, 8192], [2048, 8192], [32000, 128256], [(2048, 128, 16), (4096, 128, 16), (8192, 128, 16)]),
}


QUICK_GRID = {
    "cpu": ([256, 512], [256, 512], [2048], [(128, 64, 4), (256, 64, 4)]),
    "cuda": ([4096, 8192], [4096], [32000], [(4096, 128, 16)]),
}


MESSAGE_BYTES = {
    "cpu": [2**k for k in range(12, 25, 2)],  # 4 KiB .. 16 MiB
    "cuda": [2**k for k in range(14, 29, 2)],  # 16 KiB .. 256 MiB
}


QUICK_MESSAGE_BYTES = {
    "cpu": [2**k for k in range(12, 23, 2)],  # 4 KiB .. 4 MiB
    "cuda": [2**k for k in range(16, 27, 2)],
}


PIPELINE_SCHEDULES = ("gpipe", "interleaved1f1b", "zbvzerobubble")
"""torch runtimes whose steps calibrate what a pipeline stage really costs: the single-stage
runtime (GPipe) and the multi-stage one (Interleaved1F1B: full backwards on middle stages;
ZBVZeroBubble: split I/W backwards, and a V placement that passes half the activations within a
rank, which separates per-action from per-message cost). ``Schedule1F1B`` fuses a send and a
receive into one call (about half the cost per message on gloo); simtrain does not model that
fusion, so it over-estimates 1F1B's overhead slightly."""


TORCH_SCHEDULES: dict[str, tuple[str, int]] = {
    "gpipe": ("ScheduleGPipe", 1),
    "1f1b": ("Schedule1F1B", 1),
    "interleaved1f1b": ("ScheduleInterleaved1F1B", 2),
    "loopedbfs": ("ScheduleLoopedBFS", 2),
    "interleavedzerobubble": ("ScheduleInterleavedZeroBubble", 2),
    "zbvzerobubble": ("ScheduleZBVZeroBubble", 2),
    "dualpipev": ("ScheduleDualPipeV", 2),
}
"""Schedule name (torch's class name without ``Schedule``, lower case) -> (class, stages per rank)."""


V_SHAPED = ("zbvzerobubble", "dualpipev")


@dataclass(frozen=True)
class ValidationModel:
    """The transformer trained by ``simtrain validate`` (pre-norm GPT block, GeLU MLP, no biases).

    Attributes:
        layers, hidden, heads, ffn, vocab, seq_len: its shape.
        microbatch_size: sequences per microbatch (b).
        microbatches: microbatches per step (m).
    """

    layers: int = 8
    hidden: int = 256
    heads: int = 4
    ffn: int = 1024
    vocab: int = 2048
    seq_len: int = 128
    microbatch_size: int = 2
    microbatches: int = 4

    def spec(self) -> ModelSpec:
        """The same model as a simtrain :class:`ModelSpec`."""
        return ModelSpec(
            name=f"validation transformer ({self.layers} x h{self.hidden})",
            description="the model simtrain validate trains with torch",
            source="simtrain.calibration.workload.ValidationModel",
            num_layers=self.layers, hidden_size=self.hidden, ffn_hidden_size=self.ffn, num_heads=self.heads,
            vocab_size=self.vocab, seq_len=self.seq_len, activation="gelu", norm="layernorm", bias=False,
        )

    def parallel(self, world: int, stages_per_rank: int) -> ParallelConfig:
        """The simtrain parallel configuration of a run on ``world`` ranks (fp32, no recomputation
        of anything but attention scores, which torch's fused attention never stores)."""
        return ParallelConfig(
            pp=world, vp=stages_per_rank, microbatches=self.microbatches, microbatch_size=self.microbatch_size,
            seq_len=self.seq_len, dtype="fp32", recompute="selective", sequence_parallel=False,
        )


def default_model(world: int, device: str, quick: bool) -> ValidationModel:
    """The validation model for ``world`` ranks: 4 layers per rank, 2 microbatches per rank."""
    base = ValidationModel(layers=4 * world, microbatches=2 * world)
    if device == "cuda":
        base = replace(base, hidden=2048, heads=16, ffn=8192, vocab=32000, seq_len=2048, microbatch_size=1)
    return base


def calibration_models(spec: dict, device: str, world: int) -> dict[str, tuple[str, object]]:
    """The calibration model's cases: label -> (torch schedule, model).

    The model is the validation transformer's architecture (:func:`transformer_layer` blocks,
    embedding, LM head and cross-entropy loss) with ONE layer per pipeline stage, at the first hidden
    size and token count of the GEMM grid (``--hidden``, ``--tokens``), the grid's first attention
    shape and vocabulary; each schedule runs it with ``world`` and ``3·world`` microbatches.
    """
    grid = (QUICK_GRID if spec["quick"] else DEFAULT_GRID)[device]
    h = (spec.get("hidden") or grid[0])[0]
    t = (spec.get("tokens") or grid[1])[0]
    seq_len, head_dim, _ = grid[3][0]
    cases = {}
    for name in PIPELINE_SCHEDULES:
        stages = world * TORCH_SCHEDULES[name][1]
        for m in (world, 3 * world):
            cfg = ValidationModel(layers=stages, hidden=h, heads=max(1, h // head_dim), ffn=4 * h, vocab=grid[2][0],
                                  seq_len=min(seq_len, t), microbatch_size=max(1, t // seq_len), microbatches=m)
            cases[f"{name} m={m}"] = (name, cfg)
    return cases


def stage_placement(name: str, world: int) -> list[int]:
    """``stage_to_rank`` torch uses: linear, looped (``s % world``) or V-shaped."""
    per_rank = TORCH_SCHEDULES[name][1]
    n = world * per_rank
    if per_rank == 1:
        return list(range(n))
    if name in V_SHAPED:
        return [s if s < world else n - 1 - s for s in range(n)]
    return [s % world for s in range(n)]


def transformer_layer(torch, hidden: int, heads: int, ffn: int):
    """A pre-norm GPT layer (LayerNorm, QKV, causal SDPA, output projection, GeLU MLP, no biases).

    The layer ``simtrain validate`` trains and ``calibrate`` times whole; its simtrain
    description is ``ModelSpec(activation="gelu", norm="layernorm", bias=False)``.
    """
    import torch.nn.functional as F
    from torch import nn

    d = hidden // heads

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm1, self.norm2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
            self.qkv = nn.Linear(hidden, 3 * hidden, bias=False)
            self.proj = nn.Linear(hidden, hidden, bias=False)
            self.fc1 = nn.Linear(hidden, ffn, bias=False)
            self.fc2 = nn.Linear(ffn, hidden, bias=False)

        def forward(self, x):
            b, s, _ = x.shape
            q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, heads, d).permute(2, 0, 3, 1, 4)
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # laid out [b, s, a, d]
            x = x + self.proj(o.transpose(1, 2).reshape(b, s, hidden))
            return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))

    return Block()


def build_stage_module(torch, cfg: ValidationModel, stage: int, num_stages: int, device, dtype):
    """The ``nn.Module`` of one pipeline stage: its layers (split as simtrain splits them), plus
    the embedding on the first stage and the final norm and LM head on the last."""
    from torch import nn

    class Stage(nn.Module):
        def __init__(self, n_layers: int, first: bool, last: bool):
            super().__init__()
            h = cfg.hidden
            self.embed = nn.Embedding(cfg.vocab, h) if first else None
            self.blocks = nn.ModuleList(transformer_layer(torch, h, cfg.heads, cfg.ffn) for _ in range(n_layers))
            self.norm = nn.LayerNorm(h) if last else None
            self.head = nn.Linear(h, cfg.vocab, bias=False) if last else None

        def forward(self, x):
            if self.embed is not None:
                x = self.embed(x)
            for block in self.blocks:
                x = block(x)
            if self.head is not None:
                x = self.head(self.norm(x))
            return x

    counts = split_layers(cfg.layers, num_stages)
    torch.manual_seed(1234 + stage)
    return Stage(counts[stage], stage == 0, stage == num_stages - 1).to(device=device, dtype=dtype)


def dtype_of(torch, name: str):
    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[name]


COLD_BYTES = {"cpu": 8 * 2**20, "cuda": 256 * 2**20}
"""Working set, per case, of the operand a model reads cold (weights in F and I, saved
activations in the backward): several copies are rotated so it does not stay in cache (several
times this machine's per-core L2 on CPU, twice an H100's L2 on GPU)."""


def _copies(make: Callable[[], object], nbytes: int, device) -> Callable[[], object]:
    """A function returning, on each call, the next of enough copies of ``make()`` that their
    total exceeds :data:`COLD_BYTES` (at most 16 copies)."""
    count = max(1, min(16, math.ceil(COLD_BYTES[device.type] / max(nbytes, 1))))
    items = [make() for _ in range(count)]
    state = {"i": -1}

    def next_item():
        state["i"] = (state["i"] + 1) % count
        return items[state["i"]]

    return next_item


def linear_cases(torch, device, dtype, hidden: list[int], tokens: list[int], vocab: list[int]):
    """The (tokens, fan_in, fan_out, kind) cases and their callables (torch nn.Linear layouts).

    F ``X Wᵀ`` and I ``dY W`` read a cold weight, W ``dYᵀ X`` a cold saved input.
    """
    shapes = sorted({(t, h * a, h * b) for h in hidden for t in tokens for _, a, b in LINEAR_LAYERS}
                    | {(t, h, v) for h in hidden for t in tokens for v in vocab})
    elem = torch.tensor([], dtype=dtype).element_size()
    keys, fns = [], []
    for t, k, n in shapes:
        x = torch.randn(t, k, device=device, dtype=dtype)
        dy = torch.randn(t, n, device=device, dtype=dtype)
        w = _copies(lambda: torch.randn(n, k, device=device, dtype=dtype), n * k * elem, device)
        xs = _copies(lambda: torch.randn(t, k, device=device, dtype=dtype), t * k * elem, device)
        for kind, fn in (
            ("F", lambda x=x, w=w: torch.mm(x, w().t())),
            ("I", lambda dy=dy, w=w: torch.mm(dy, w())),
            ("W", lambda dy=dy, xs=xs: torch.mm(dy.t(), xs())),
        ):
            keys.append((t, k, n, kind))
            fns.append(fn)
    return keys, fns


def attention_cases(torch, device, dtype, configs: list[tuple[int, int, int]], tokens: int):
    """Causal SDPA forward and backward cases: (seq_len, head_dim, heads, batch, pass).

    Q, K, V are views of one ``[b, s, 3, a, d]`` projection, as a model lays them out; the
    backward reads a cold saved forward.
    """
    import torch.nn.functional as F

    elem = torch.tensor([], dtype=dtype).element_size()
    keys, fns = [], []
    for s, d, a in configs:
        b = max(1, tokens // s)
        qkv = torch.randn(b, s, 3, a, d, device=device, dtype=dtype, requires_grad=True)

        def forward(qkv=qkv):
            q, k, v = qkv.permute(2, 0, 3, 1, 4)
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

        def saved(forward=forward, qkv=qkv):
            out = forward()
            return out, torch.randn_like(out), qkv

        graphs = _copies(saved, 4 * b * s * a * d * elem, device)

        def backward(graphs=graphs):
            out, dout, inp = graphs()
            return torch.autograd.grad(out, inp, dout, retain_graph=True)

        keys += [(s, d, a, b, "F"), (s, d, a, b, "B")]
        fns += [forward, backward]
    return keys, fns


def elementwise_cases(torch, device, dtype, hidden: list[int], tokens: list[int], vocab: list[int]):
    """Memory-bound kernels by class, with the bytes the cost model counts for each.

    ``norm``: LayerNorm forward / backward; ``activation``: GeLU forward / backward and the fp32
    log-softmax of the loss; ``add``: a residual add and the in-place gradient accumulation
    ``grad += new`` of a layer's weights. Backward cases and the accumulation read cold data.
    Returns keys ``(class, kernel, tokens, hidden, bytes)`` and callables.
    """
    import torch.nn.functional as F

    elem = torch.tensor([], dtype=dtype).element_size()
    keys, fns = [], []

    def graph(fn, inp):
        def make():
            leaf = inp.detach().clone().requires_grad_()
            out = fn(leaf)
            return out, torch.randn_like(out), leaf
        return _copies(make, 2 * inp.numel() * inp.element_size(), device)

    def backward(graphs):
        out, grad, leaf = graphs()
        return torch.autograd.grad(out, leaf, grad, retain_graph=True)

    for h in hidden:
        params = 12 * h * h  # one GPT layer's weights
        grads = _copies(lambda: torch.randn(params, device=device, dtype=dtype), params * elem, device)
        new = torch.randn(params, device=device, dtype=dtype)
        for t in tokens:
            x = torch.randn(t, h, device=device, dtype=dtype)
            u = torch.randn(t, 4 * h, device=device, dtype=dtype)
            y = torch.randn(t, h, device=device, dtype=dtype)
            ln = torch.nn.LayerNorm(h, device=device, dtype=dtype)
            cases = [
                ("norm", "layernorm_F", 2 * t * h * elem, lambda x=x, ln=ln: ln(x)),
                ("norm", "layernorm_B", 3 * t * h * elem, lambda g=graph(ln, x): backward(g)),
                ("activation", "gelu_F", 2 * t * 4 * h * elem, lambda u=u: F.gelu(u)),
                ("activation", "gelu_B", 3 * t * 4 * h * elem, lambda g=graph(F.gelu, u): backward(g)),
                ("add", "residual_add_F", 3 * t * h * elem, lambda x=x, y=y: torch.add(x, y)),
            ]
            for v in vocab:
                z = torch.randn(t, v, device=device, dtype=torch.float32)
                cases += [
                    ("activation", "log_softmax_F", 2 * t * v * 4, lambda z=z: torch.log_softmax(z, -1)),
                    ("activation", "log_softmax_B", 3 * t * v * 4,
                     lambda g=graph(lambda a: torch.log_softmax(a, -1), z): backward(g)),
                ]
            for cls, name, nbytes, fn in cases:
                keys.append((cls, name, t, h, nbytes))
                fns.append(fn)
        keys.append(("add", "grad_accumulate", 0, h, 3 * params * elem))
        fns.append(lambda grads=grads, new=new: grads().add_(new))
    return keys, fns
