"""Megatron-LM argument lists and torchtitan job files as input: model and parallel settings are
mapped, what was read and ignored is printed, and compare runs with them."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

import simtrain
from simtrain.cli import app
from simtrain.errors import SimtrainError
from simtrain.importers.megatron import read_megatron_args
from simtrain.importers.torchtitan import read_torchtitan_toml
from simtrain.schedules.names import canonical_schedule

from conftest import DATA

JOBS = DATA / "jobs"
runner = CliRunner()


def test_megatron_arguments_map_model_and_parallel():
    job = read_megatron_args(JOBS / "megatron_llama3_70b.txt")
    preset = simtrain.load_model("llama3-70b")
    m = job.model
    assert (m.num_layers, m.hidden_size, m.ffn_hidden_size, m.num_heads, m.kv_heads) == (80, 8192, 28672, 64, 8)
    assert (m.activation, m.norm, m.bias, m.tied_embeddings, m.learned_positions, m.dropout) == \
        ("swiglu", "rmsnorm", False, False, False, False)
    assert m.vocab_size == 129024  # 128256 padded to a multiple of 128 x tp (Megatron's _vocab_size_with_padding)
    assert m.total_params - preset.total_params == 2 * (129024 - 128256) * 8192
    # 64 GPUs (torchrun --nnodes 8 --nproc-per-node 8) / (tp 8 x pp 4) = dp 2; 32 sequences / (1 x 2) = 16
    assert job.parallel == dict(tp=8, pp=4, dp=2, vp=2, ep=1, microbatch_size=1, microbatches=16, seq_len=8192,
                                dtype="bf16", zero_stage=1, sequence_parallel=True, recompute="full",
                                rank_order="tp-dp-pp")  # Megatron-Core's tp-cp-ep-dp-pp: pipeline stage outermost
    assert job.schedules == ["interleaved-1f1b"]
    assert {"--overlap-grad-reduce", "--lr", "--data-path"} <= set(job.ignored)
    assert "--num-layers 80" in job.mapped


def test_megatron_tp_pp_dp_mapping_flag_sets_the_rank_order(tmp_path):
    path = tmp_path / "args.txt"
    path.write_text((JOBS / "megatron_llama3_70b.txt").read_text() + "\n--use-tp-pp-dp-mapping\n")
    job = read_megatron_args(path)
    assert job.parallel["rank_order"] == "tp-pp-dp" and "--use-tp-pp-dp-mapping" not in job.ignored


def test_megatron_unfused_rope_and_bias_dropout_flags_map_to_their_fields(tmp_path):
    """--no-rope-fusion / --no-bias-dropout-fusion set rope_fusion / bias_dropout_fusion False (they
    were listed as ignored: review 8); without them the fields keep simtrain's defaults."""
    base = (JOBS / "megatron_llama3_70b.txt").read_text()
    path = tmp_path / "args.txt"
    path.write_text(base + "\n--no-rope-fusion --no-bias-dropout-fusion\n")
    job = read_megatron_args(path)
    assert (job.parallel["rope_fusion"], job.parallel["bias_dropout_fusion"]) == (False, False)
    assert not {"--no-rope-fusion", "--no-bias-dropout-fusion"} & set(job.ignored)
    plain = read_megatron_args(JOBS / "megatron_llama3_70b.txt")
    assert not {"rope_fusion", "bias_dropout_fusion"} & plain.parallel.keys()


def test_megatron_without_the_model_is_an_error(tmp_path):
    path = tmp_path / "args.txt"
    path.write_text("--hidden-size 4096 --num-attention-heads 32 --vocab-size 32000\n")
    with pytest.raises(SimtrainError, match="--num-layers is missing"):
        read_megatron_args(path)


def test_torchtitan_job_maps_model_and_parallel():
    job = read_torchtitan_toml(JOBS / "torchtitan_llama3_70b.toml", {"dp": 4})
    assert job.model.name == "llama3-70b"
    assert job.parallel == dict(tp=8, pp=4, dp=4, vp=2, ep=1, microbatch_size=1, microbatches=8, seq_len=8192,
                                dtype="bf16", zero_stage=2, recompute="full", cp=1, cp_kind="allgather",
                                grad_reduce_dtype="fp32", zero_impl="fsdp2")  # FSDP2 with PP; reduced in float32
    assert job.ops_settings["fused_projections"] is False  # separate wq, wk, wv and w1, w3: priced by operator
    assert job.schedules == ["interleaved-1f1b"]  # torch's Interleaved1F1B
    assert any("ZeRO-2" in note for note in job.ignored) and "training.steps" in job.ignored
    assert not any(k.startswith("optimizer.") for k in job.ignored)  # never changes a step's cost


def test_torchtitan_unknown_flavor_is_an_error(tmp_path):
    path = tmp_path / "job.toml"
    path.write_text('[model]\nname = "llama3"\nflavor = "13B"\n')
    with pytest.raises(SimtrainError, match="flavor = '13B'"):
        read_torchtitan_toml(path)


def test_torch_schedule_names_are_aliases():
    assert canonical_schedule("ZBVZeroBubble") == "zbv"
    assert canonical_schedule("ScheduleInterleaved1F1B") == "interleaved-1f1b"
    assert canonical_schedule("1F1B") == "1f1b" and canonical_schedule("zb-h1") == "zb-h1"
    with pytest.raises(SimtrainError, match="unknown schedule 'Zigzag'"):
        canonical_schedule("Zigzag")


@pytest.mark.parametrize("flag, path", [("--from-megatron", "megatron_llama3_70b.txt"),
                                        ("--from-torchtitan", "torchtitan_llama3_70b.toml")])
def test_compare_runs_an_imported_job(flag, path):
    res = runner.invoke(app, ["compare", flag, str(JOBS / path), "--hardware", "h100-sxm", "--dp", "2",
                              "--microbatches", "8", "--json"])
    assert res.exit_code == 0, res.output
    assert "read:" in res.stderr and "ignored:" in res.stderr and "simulating:" in res.stderr
    [row] = json.loads(res.stdout)
    assert row["schedule"] == "interleaved-1f1b" and row["gpus"] == 8 * 4 * 2
    again = runner.invoke(app, ["compare", flag, str(JOBS / path), "--model", "llama3-8b", "--hardware", "h100-sxm"])
    assert again.exit_code == 2 and "drop the scenario file and --model" in again.output



def test_torchtitan_fsdp_without_pp_is_zero3_and_cp_is_mapped(tmp_path):
    """FSDP2 alone re-shards after each forward (ZeRO-3); CP's rotate method picks the CP kind."""
    text = (JOBS / "torchtitan_llama3_70b.toml").read_text()
    text = text.replace("pipeline_parallel_degree = 4", "pipeline_parallel_degree = 1")
    text = text.replace("context_parallel_degree = 1", 'context_parallel_degree = 2\ncontext_parallel_rotate_method = "alltoall"')
    text = text.replace('pipeline_parallel_schedule = "Interleaved1F1B"', 'pipeline_parallel_schedule = "1F1B"')
    path = tmp_path / "job.toml"
    path.write_text(text + '\n')
    job = read_torchtitan_toml(path, {"dp": 4})
    assert (job.parallel["zero_stage"], job.parallel["cp"], job.parallel["cp_kind"]) == (3, 2, "ring")
    assert job.parallel["cp_impl"] == "torch"  # torch's context_parallel: fp32 merges (simtrain.costs.cp_merge)
    assert not any("ZeRO" in note for note in job.ignored)
