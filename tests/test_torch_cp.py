"""torch's context parallelism (``cp_impl: torch``): the fp32 merges and gradient accumulations
around the attention calls (``cp_merge``), every head's K and V on the wire with the fp32 dK/dV
rotation, their overlap with the attention calls, and the error lines for settings that cannot run."""

from __future__ import annotations

import warnings

import pytest
from typer.testing import CliRunner

from simtrain.cli import app
from simtrain.costs.context import cp_declaration
from simtrain.costs.cp_merge import cp_merge_op
from simtrain.costs.ops import chunk_breakdown, ops_runtime
from simtrain.errors import SimtrainError
from simtrain.hardware import load_profile
from simtrain.models import ModelSpec, load_model
from simtrain.parallel import ParallelConfig
from simtrain.scenario import run_schedule

H100 = load_profile("h100-sxm-96gb")
TINY = ModelSpec(name="tiny", num_layers=2, hidden_size=256, ffn_hidden_size=512, num_heads=4, num_kv_heads=2,
                 head_dim=64, vocab_size=1024, seq_len=64, activation="swiglu", norm="rmsnorm")
# one microbatch of one 64-token sequence over cp 2: 32 tokens a rank, 4 heads of 64 after repeat_kv
TOKENS, HEADS, D = 32, 4, 64
E_O = E_Q = TOKENS * HEADS * D  # 8192 elements of the attention output, of the queries
E_KV = 2 * E_Q  # K and V of every query head


def _ctx(**over):
    par = ParallelConfig(**{**dict(cp=2, cp_kind="allgather", cp_impl="torch", seq_len=64, recompute="none"), **over})
    return ops_runtime(TINY, par, H100).ctx


def test_compiled_merge_bytes_by_hand_for_cp_2():
    """cp 2 (fused kernels): F, one merge kernel reading both steps' bf16 outputs and writing the
    bf16 result (2 + 2 + 2 bytes an element). I: the dQ accumulation alike (6 bytes), and for dK/dV
    the first gradient cast into the fp32 message (read 2, write 4), the second step reading the
    received fp32 message and the half-size bf16 gradient (4 + 2/2) and writing the next message (4),
    then the received sum cast back (read 4, write 2)."""
    ctx = _ctx()
    (row,) = cp_merge_op(ctx)
    fwd = E_O * (2 + 2 + 2)
    bwd = E_Q * (2 + 2 + 2) + E_KV * ((2 + 4) + (4 + 1 + 4) + (4 + 2))
    assert (fwd, bwd) == (49_152, 393_216)
    assert row.name == "cp_merge" and row.bound == "memory"
    assert row.bytes == pytest.approx((fwd, bwd, 0.0))
    assert row.seconds == pytest.approx((fwd / ctx.hbm_bytes_per_s, bwd / ctx.hbm_bytes_per_s, 0.0))
    assert row.kernels == (1, 4, 0)


def test_eager_merge_bytes_by_hand_for_cp_2():
    """cp 2, op by op (torch/distributed/tensor/experimental/_attention.py as written): F copies K
    and V contiguous (read + write 2 bytes) and cats them once; casts the first output to fp32
    (2 + 4), then for the second a cast (6), out - out_b (4 + 4 + 4), the broadcast product (4 + 4)
    and the subtraction (4 + 4 + 4), then the cast back (6). I: fp32 zeros for dQ, dK, dV; the
    same copies; dQ += (4 + 2 + 4) twice, the cast back; dK/dV += at the first step, the half-size
    += (5) and its cat (8) at the second, the message's cat at both (8 each), the cast back."""
    (row,) = cp_merge_op(_ctx(kernels="eager"))
    fwd = (2 * 2 * E_KV) + (2 * 2 * E_KV) + E_O * (6 + (6 + 12 + 8 + 12) + 6)
    bwd = (4 * (E_Q + E_KV) + (2 * 2 * E_KV) * 2 + E_Q * (10 * 2 + 6)
           + E_KV * (10 + (5 + 8) + 8 * 2 + 6))
    assert (fwd, bwd) == (540_672, 1_179_648)
    assert row.bytes == pytest.approx((fwd, bwd, 0.0))


def test_merge_row_only_with_torch_cp_and_in_the_full_rerun():
    """The row exists only where torch's CP code runs (cp > 1, cp_impl torch); full recomputation
    reruns its F in I, and it scales with cp at constant tokens per rank."""
    assert cp_merge_op(_ctx(cp_impl="te")) == []
    m = TINY
    rows = {}
    for cp, recompute, impl in ((2, "none", "torch"), (2, "full", "torch"), (2, "full", "te"), (4, "none", "torch")):
        par = ParallelConfig(cp=cp, cp_kind="allgather", cp_impl=impl, seq_len=32 * cp, recompute=recompute)
        rt = ops_runtime(m, par, H100)
        c = run_schedule("1f1b", m, H100, par, runtime=rt).costs.chunks[0]
        rows[cp, recompute, impl] = {o.name: o for o in chunk_breakdown(rt.ctx, c.layers, c.has_embedding, c.has_head,
                                                                          c.params)}
    merge = rows[2, "none", "torch"]["cp_merge"]
    assert merge.bytes[0] == pytest.approx(TINY.num_layers * E_O * 6)
    assert "cp_merge" not in rows[2, "full", "te"]
    rerun = rows[2, "full", "torch"]["recompute"].bytes[1] - rows[2, "full", "te"]["recompute"].bytes[1]
    assert rerun == pytest.approx(merge.bytes[0])  # the full rerun repeats exactly the merges' F
    four = rows[4, "none", "torch"]["cp_merge"]
    assert four.bytes[0] == pytest.approx(merge.bytes[0] * (3 * 10 - 4) / (10 - 4))  # (cp-1)(e+8) - 2(4-e)


def test_torch_cp_moves_every_heads_kv_and_fp32_dkv_overlapped():
    """torch CP: the all-gather carries every query head's K and V (repeat_kv precedes SDPA), I adds
    cp fp32 dK/dV messages (priced as ring steps), hidden behind 1/cp of F's attention and
    (cp-1)/cp of I's; Transformer Engine's all-gather moves the KV heads, unhidden."""
    m = load_model("llama3-8b")
    tokens, layers, cp = 8192, 4, 4
    torch = ParallelConfig(cp=cp, cp_kind="allgather", cp_impl="torch", recompute="none")
    decl = cp_declaration(m, torch, tokens, layers, 1.0, 3.0)
    kv = tokens * m.num_heads * (m.q_head_dim + m.v_head_dim)  # elements on this rank, every head
    (gather,) = decl.forward
    assert (gather.op, gather.nbytes, gather.repeat) == ("all-gather", pytest.approx(2 * kv * cp), layers)
    gather_i, dkv = decl.backward
    assert gather_i == gather
    assert (dkv.nbytes, dkv.repeat) == (pytest.approx(4 * kv * cp / (cp - 1)), layers * cp)
    assert (decl.hide_forward_s, decl.hide_backward_s) == pytest.approx((1.0 / cp, 3.0 * (cp - 1) / cp))
    te = cp_declaration(m, torch.model_copy(update=dict(cp_impl="te")), tokens, layers, 1.0, 3.0)
    assert te.forward[0].nbytes == pytest.approx(gather.nbytes * m.kv_heads / m.num_heads)
    assert te.hide_forward_s == 0.0


def test_torch_cp_with_ulysses_is_refused():
    from simtrain.costs.context import check_context_parallel

    par = ParallelConfig(cp=2, cp_kind="ulysses", cp_impl="torch")
    with pytest.raises(SimtrainError, match="^--cp-impl torch with --cp-kind ulysses: .*or --cp-impl te$"):
        check_context_parallel(load_model("llama3-8b"), par, 8192)


def _scenario(tmp_path, **parallel):
    lines = "\n".join(f"  {k}: {v}" for k, v in parallel.items())
    path = tmp_path / "s.yaml"
    path.write_text(f"model: llama3-8b\nhardware: h100-sxm-96gb\nparallel:\n  seq_len: 16384\n{lines}\n"
                    "schedules: [1f1b]\n")
    return path


@pytest.mark.parametrize("parallel, said", [
    (dict(cp=2, cp_kind="ulysses", cp_impl="torch"), "cp_impl"),
    (dict(cp=2, cp_kind="allgather", cp_impl="pytorch"), "cp_impl"),
])
def test_bad_cp_impl_is_one_error_line(tmp_path, parallel, said):
    res = CliRunner().invoke(app, ["compare", str(_scenario(tmp_path, **parallel)), "--json"])
    assert res.exit_code == 2, res.output
    lines = [x for x in res.output.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and said in lines[0], res.output
    assert "Traceback" not in res.output


def test_cp_impl_torch_without_cp_warns_in_a_scenario(tmp_path):
    from simtrain.checks import _check_settings_apply
    from simtrain.parallel import file_field_name

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _check_settings_apply([], ParallelConfig(cp=1, cp_impl="torch"), set(), file_field_name("s.yaml"))
    assert any("s.yaml: field 'parallel.cp_impl' = 'torch' is ignored" in str(w.message) for w in caught)
    with pytest.raises(SimtrainError, match="--cp-impl"):
        _check_settings_apply([], ParallelConfig(cp=1, cp_impl="torch"), {"cp_impl"})
