"""torch FSDP2's all-gather copy-out (``zero_impl: fsdp2``): a memory-bound row before every F and I
of a ZeRO-3 chunk, on the compute stream, and nothing for flat-buffer ZeRO-3 or for ZeRO-2."""

from __future__ import annotations

import pytest

from simtrain.costs.ops import chunk_breakdown, ops_runtime
from simtrain.hardware import load_profile
from simtrain.models import load_model
from simtrain.parallel import ParallelConfig
from simtrain.scenario import run_schedule


def _setup(**over):
    m, h = load_model("llama3-8b"), load_profile("h100-sxm-96gb")
    p = ParallelConfig(**{**dict(tp=1, pp=1, dp=8, microbatches=1, microbatch_size=1, seq_len=4096, dtype="bf16",
                                 sequence_parallel=False, zero_stage=3, zero_impl="fsdp2"), **over})
    return m, h, p


def _rows(m, h, p):
    """The breakdown of the one chunk (PP 1) and its parameter count, as the simulation costs it."""
    c = run_schedule("1f1b", m, h, p, runtime=ops_runtime(m, p, h)).costs.chunks[0]
    ops = chunk_breakdown(ops_runtime(m, p, h).ctx, c.layers, c.has_embedding, c.has_head, c.params)
    return {o.name: o for o in ops}, c.params


def test_copy_out_reads_and_writes_every_parameter_before_f_and_i():
    m, h, p = _setup()
    rows, params = _rows(m, h, p)
    row = rows["fsdp_copy_out"]
    assert row.bytes == pytest.approx((4 * params, 4 * params, 0.0))  # bf16: read 2 + write 2 bytes
    assert row.bound == "memory" and row.seconds[0] == pytest.approx(row.bytes[0] / ops_runtime(m, p, h).ctx.hbm_bytes_per_s)
    assert row.kernels == (m.num_layers + 1, m.num_layers + 1, 0.0)  # one copy per block, one for the root
    fp32 = _rows(m, h, p.model_copy(update=dict(dtype="fp32")))[0]["fsdp_copy_out"]
    assert fp32.bytes[0] == pytest.approx(2 * row.bytes[0])


@pytest.mark.parametrize("over", [dict(zero_impl="flat"), dict(zero_stage=2)])
def test_no_copy_out_for_flat_buffers_or_without_parameter_gathers(over):
    m, h, p = _setup(**over)
    assert "fsdp_copy_out" not in _rows(m, h, p)[0]


def test_the_step_grows_by_the_copy_out_on_the_compute_stream():
    m, h, p = _setup()
    flat = p.model_copy(update=dict(zero_impl="flat"))
    steps = [run_schedule("1f1b", m, h, q, runtime=ops_runtime(m, q, h)).report.step_time_s for q in (flat, p)]
    row = _rows(m, h, p)[0]["fsdp_copy_out"]
    copy_s = row.seconds[0] + row.seconds[1]
    # on the critical path (PP 1, one microbatch); the engine's sharing of SMs with the overlapped
    # NCCL kernels (simtrain.lowering.nccl_sms) moves it by a few per cent, never above the row
    assert 0.9 * copy_s < steps[1] - steps[0] <= copy_s * (1 + 1e-9)


def test_compiled_blocks_run_the_head_eager_and_the_blocks_fused():
    """``kernels: compiled-blocks`` (torchtitan's per-block torch.compile, loss uncompiled): the head's
    norm and cross-entropy move eager's bytes, every block operator the fused kernels' bytes."""
    m, h, p = _setup()
    rows = {k: _rows(m, h, p.model_copy(update=dict(kernels=k)))[0] for k in ("fused", "eager", "compiled-blocks")}
    for name in ("head:cross_entropy", "head:norm"):
        assert rows["compiled-blocks"][name].bytes == rows["eager"][name].bytes != rows["fused"][name].bytes
    for name in ("norm", "rotary", "activation"):
        assert rows["compiled-blocks"][name].bytes == rows["fused"][name].bytes != rows["eager"][name].bytes


def test_compiled_blocks_need_the_per_operator_model(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from simtrain.cli import app

    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(app, ["compare", "--model", "llama3-8b", "--hardware", "h100-sxm", "--pp", "1",
                                   "--kernels", "compiled-blocks", "--cost-model", "flat"])
    assert res.exit_code == 2 and res.output.count("\n") == 1
    assert res.output.startswith("error: --kernels compiled-blocks: prices the per-operator model")
