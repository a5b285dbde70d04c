"""HuggingFace configs as model input: the fixture configs give the presets' parameter counts and
step times; every family maps to its published parameter count; unmapped fields are one warning
and an unknown model_type one error."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
from typer.testing import CliRunner

import simtrain
from simtrain.cli import app
from simtrain.errors import ConfigWarning, SimtrainError
from simtrain.importers.hf import model_from_hf_dict

from conftest import DATA

HF = DATA / "hf_configs"
PRESETS = ["llama3-8b", "llama3-70b", "mixtral-8x7b", "deepseek-v3"]


@pytest.mark.parametrize("name", PRESETS)
def test_hf_config_counts_equal_the_preset(name):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConfigWarning)
        model = simtrain.load_model(HF / name / "config.json")
    preset = simtrain.load_model(name)
    assert model.total_params == pytest.approx(preset.total_params, rel=1e-3)
    assert model.activated_params == pytest.approx(preset.activated_params, rel=1e-3)
    assert model.name == name


def test_deepseek_v3_is_671b_total_37b_activated_without_mtp():
    with pytest.warns(ConfigWarning) as caught:
        model = simtrain.load_model(HF / "deepseek-v3" / "config.json")
    assert len(caught) == 1  # one warning lists every unmapped field
    text = str(caught[0].message)
    assert "quantization_config" in text and "topk_group" in text
    assert "num_nextn_predict_layers" not in text and model.mtp_depth == 1  # mapped: the MTP depth
    assert 670.5e9 < model.total_params < 671.5e9
    assert 37e9 <= model.activated_params < 38e9
    assert model.mla.kv_lora_rank == 512 and model.moe.first_dense_layers == 3 and model.moe.router_bias
    assert model.seq_len == 4096  # rope_scaling.original_max_position_embeddings


def test_a_clean_config_warns_nothing():
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConfigWarning)
        simtrain.load_model(HF / "llama3-8b" / "config.json")


@pytest.mark.parametrize("name, kwargs", [
    ("llama3-8b", dict(tp=8)),
    ("deepseek-v3", dict(tp=1, pp=4, dp=64, ep=64, microbatches=8, seq_len=4096, zero_stage=1)),
])
def test_simulating_the_config_equals_the_preset(name, kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConfigWarning)
        from_config = simtrain.simulate(model=str(HF / name / "config.json"), hardware="h100-sxm", schedule="1f1b",
                                        **kwargs)
    preset = simtrain.simulate(model=name, hardware="h100-sxm", schedule="1f1b", **kwargs)
    assert from_config.step_time_s == preset.step_time_s
    assert from_config.peak_memory_bytes == preset.peak_memory_bytes


# published totals (and activated counts) of each family, from the model cards / papers
FAMILIES = {
    "gpt2": (dict(model_type="gpt2", n_embd=768, n_layer=12, n_head=12, n_positions=1024, vocab_size=50257,
                  activation_function="gelu_new", resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1),
             124_439_808, None),  # GPT-2 small, transformers' num_parameters()
    "gpt_neox": (dict(model_type="gpt_neox", hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                      intermediate_size=3072, vocab_size=50304, max_position_embeddings=2048,
                      tie_word_embeddings=False, rotary_pct=0.25, hidden_act="gelu"),
                 162_322_944, None),  # Pythia-160M (EleutherAI/pythia README, "Params" column)
    "mistral": (dict(model_type="mistral", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                     num_attention_heads=32, num_key_value_heads=8, vocab_size=32000, max_position_embeddings=32768,
                     sliding_window=4096, hidden_act="silu"), 7.24e9, None),  # Mistral 7B v0.1
    "qwen2": (dict(model_type="qwen2", hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                   num_attention_heads=14, num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True,
                   max_position_embeddings=131072, use_sliding_window=False, sliding_window=131072),
              0.49e9, None),  # Qwen2-0.5B: 0.49B
    "qwen3": (dict(model_type="qwen3", hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                   num_attention_heads=16, num_key_value_heads=8, head_dim=128, vocab_size=151936,
                   tie_word_embeddings=True, max_position_embeddings=40960), 0.596e9, None),  # Qwen3-0.6B
    "qwen2_moe": (dict(model_type="qwen2_moe", hidden_size=2048, intermediate_size=5632, moe_intermediate_size=1408,
                       shared_expert_intermediate_size=5632, num_experts=60, num_experts_per_tok=4,
                       num_hidden_layers=24, num_attention_heads=16, num_key_value_heads=16, vocab_size=151936,
                       max_position_embeddings=8192), 14.3e9, 2.7e9),  # Qwen1.5-MoE-A2.7B
    "qwen3_moe": (dict(model_type="qwen3_moe", hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
                       num_experts=128, num_experts_per_tok=8, num_hidden_layers=48, num_attention_heads=32,
                       num_key_value_heads=4, head_dim=128, vocab_size=151936, max_position_embeddings=40960),
                  30.5e9, 3.3e9),  # Qwen3-30B-A3B
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_family_maps_to_its_published_count(family):
    data, total, active = FAMILIES[family]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConfigWarning)
        model = model_from_hf_dict(data, Path(f"{family}.json"))
    tol = 1e-6 if isinstance(total, int) else 0.01
    assert model.total_params == pytest.approx(total, rel=tol)
    if active is not None:
        assert model.activated_params == pytest.approx(active, rel=0.02)


def test_unknown_model_type_is_one_error(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "mamba", "hidden_size": 768}))
    with pytest.raises(SimtrainError, match=r"model_type' = 'mamba'.*llama"):
        simtrain.load_model(path)
    res = CliRunner().invoke(app, ["compare", "--model", str(path), "--hardware", "h100-sxm", "--json"])
    assert res.exit_code == 2 and res.output.count("error:") == 1 and "Traceback" not in res.output


def test_missing_field_and_unrepresentable_layout_are_errors():
    base = FAMILIES["qwen3_moe"][0]
    with pytest.raises(SimtrainError, match="'hidden_size' is missing"):
        model_from_hf_dict({k: v for k, v in base.items() if k != "hidden_size"}, Path("c.json"))
    with pytest.raises(SimtrainError, match="leading dense layers"):
        model_from_hf_dict({**base, "decoder_sparse_step": 2}, Path("c.json"))


def test_cli_reads_a_config_and_prints_the_warning_once():
    res = CliRunner().invoke(app, ["compare", "--model", str(HF / "mixtral-8x7b" / "config.json"), "--hardware",
                                   "h100-sxm", "--pp", "4", "--dp", "8", "--ep", "8", "--microbatches", "4",
                                   "--seq-len", "4096", "--schedules", "1f1b", "--json"])
    assert res.exit_code == 0, res.output
    assert "warning:" not in res.output  # Mixtral's config has nothing unmapped


@pytest.mark.parametrize("flag", ["--model", "--from-megatron", "--from-torchtitan"])
def test_importers_refuse_what_is_not_a_regular_text_file(tmp_path, flag):
    """Every importer reads through loading.read_text: a directory or binary file is one error line."""
    binary = tmp_path / ("config.json" if flag == "--model" else "job.toml")
    binary.write_bytes(b"\xff\xfe\x00garbage")
    for path in (tmp_path, binary):
        res = CliRunner().invoke(app, ["compare", flag, str(path), "--hardware", "h100-sxm", "--json"])
        assert res.exit_code == 2 and res.output.count("error:") == 1, res.output
        assert "Traceback" not in res.output and str(path) in res.output
