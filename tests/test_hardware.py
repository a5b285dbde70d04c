"""Hardware profiles: shipped files load, the loader converts to SI, bad files are reported."""

from __future__ import annotations

import pytest
import yaml

from simtrain.errors import SimtrainError
from simtrain.hardware import GB, GiB, PROFILE_DIR, available_profiles, load_profile


def test_required_profiles_exist_and_load():
    names = available_profiles()
    for n in ("h100-sxm", "h200-sxm", "a100-sxm-80gb", "b200", "mi300x", "h800"):
        assert n in names
        p = load_profile(n)
        assert p.source and p.peak_flops["bf16"] > 1e14 and p.hbm_bytes > 40 * GiB


def test_units_are_converted_to_si():
    p = load_profile("h100-sxm")
    assert p.peak_flops["bf16"] == pytest.approx(989.4e12)
    assert p.hbm_bytes == 80 * 2**30
    assert p.intra_node.bandwidth_bytes_per_s == 450e9
    assert p.intra_node.latency_s == pytest.approx(3e-6)
    assert p.inter_node.bandwidth_bytes_per_s == 50 * GB
    assert p.achieved_flops("bf16") == pytest.approx(989.4e12 * 0.75)
    assert load_profile("h800").intra_node.bandwidth_bytes_per_s == 200e9  # 400 GB/s bidirectional
    assert load_profile("mi300x").intra_node.peer_bandwidth_bytes_per_s == 64e9
    assert "fp8" not in load_profile("a100-sxm-80gb").peak_flops


def _write(tmp_path, mutate):
    data = yaml.safe_load((PROFILE_DIR / "h100-sxm.yaml").read_text())
    mutate(data)
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("mutate,pattern", [
    (lambda d: d["inter_node"].update(bandwidth_gb_per_s=-5), r"p.yaml: field 'inter_node.bandwidth_gb_per_s' = -5: must be a finite number >= 1e-06 and <= 1e\+06"),
    (lambda d: d.pop("hbm_gib"), r"p.yaml: field 'hbm_gib' is missing"),
    (lambda d: d.update(hbm_gib=0), r"field 'hbm_gib' = 0"),
    (lambda d: d["efficiency"].update(matmul=1.5), r"field 'efficiency.matmul' = 1.5: must be a finite number >= 1e-06 and <= 1"),
    (lambda d: d.update(peak_tflops={"bf16": -1}), r"field 'peak_tflops.bf16' = -1: must be a finite number >= 1e-06"),
    (lambda d: d.update(peak_tflops={"bf17": 3}), r"field 'peak_tflops.bf17.\[key\]' = 'bf17'"),
    (lambda d: d.update(hbm_gb=80), r"field 'hbm_gb' is not a known field"),
    (lambda d: d["intra_node"].update(peer_bandwidth_gb_per_s=900), r"peer_bandwidth_gb_per_s' = 900.*must not exceed"),
])
def test_bad_profile_fields(tmp_path, mutate, pattern):
    with pytest.raises(SimtrainError, match=pattern):
        load_profile(_write(tmp_path, mutate))


def test_missing_malformed_unknown(tmp_path):
    with pytest.raises(SimtrainError, match="nothere.yaml: hardware profile file not found"):
        load_profile(tmp_path / "nothere.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(SimtrainError, match=r"bad.yaml: malformed YAML at line 2"):
        load_profile(bad)
    with pytest.raises(SimtrainError, match=r"unknown hardware 'tpu-v9'"):
        load_profile("tpu-v9")
    with pytest.raises(SimtrainError, match=r"no peak_tflops for dtype 'fp8'"):
        load_profile("a100-sxm-80gb").achieved_flops("fp8")


def test_issue16_profiles_from_their_datasheets():
    """GB200 NVL72, B300, V100 SXM2 and H100 PCIe (numbers from the datasheets their ``source``
    cites; dense = half of the sparse rates)."""
    from simtrain.network import Collective, Topology
    from simtrain.parallel import ParallelConfig

    gb = load_profile("gb200-nvl72")
    assert gb.gpus_per_node == 72 and gb.peak_flops["bf16"] == 2500e12
    # a DP group of 64 GPUs (tp 1, pp 1) stays inside the 72-GPU NVLink domain
    topo = Topology(gb, ParallelConfig(dp=64))
    assert topo.route(Collective("all-reduce", "dp", 1.0), 0).link.name.startswith("NVLink 5")
    assert load_profile("b300").nic_bandwidth_per_gpu_bytes_per_s == 100e9
    assert load_profile("h100-pcie").intra_node.bandwidth_bytes_per_s == 64e9
    v100 = load_profile("v100-sxm2")
    assert v100.intra_node.peer_bandwidth_bytes_per_s == 25e9 and "bf16" not in v100.peak_flops
    with pytest.raises(SimtrainError, match="no peak_tflops for dtype 'bf16'"):
        v100.achieved_flops("bf16")


def test_v100_has_no_fused_attention_so_scores_are_stored_by_default():
    """FlashAttention does not run on Volta: the V100 profile defaults --attention to unfused, whose
    score matrix is stored under recompute none; an explicit kernel still wins."""
    from simtrain.costs import stage_costs
    from simtrain.models import load_model
    from simtrain.parallel import ParallelConfig

    v100, h100 = load_profile("v100-sxm2"), load_profile("h100-sxm")
    assert (v100.attention_kernel(None), h100.attention_kernel(None)) == ("unfused", "flash")
    assert v100.attention_kernel("flash") == "flash"
    m = load_model("llama3-8b")

    def act(hw, **kw):
        p = ParallelConfig(pp=2, microbatches=2, seq_len=1024, dtype="fp16", recompute="none", **kw)
        return sum(c.activation_bytes for c in stage_costs(m, p, hw, 2).chunks)

    assert act(v100) == act(v100, attention="unfused") > act(v100, attention="flash")


def test_grand_teton_h100_96gb_is_h100_sxm_with_its_hbm2e():
    """torchtitan docs/performance.md (d4c86e375): "96GB HBM2e with 2.4 TB/sec peak memory
    bandwidth", 8 H100 per host on NVLink, "400 Gb/s per GPU" RDMA. The compute and its kernel
    tables are H100 SXM's (the 500 W limit is not priced), the memory is its own."""
    from simtrain.costs.kernels import rates_for

    gt, sxm = load_profile("h100-sxm-96gb"), load_profile("h100-sxm")
    assert gt.hbm_bytes == 96 * GiB and gt.hbm_bandwidth_bytes_per_s == pytest.approx(2.4e12)
    assert gt.peak_flops == sxm.peak_flops and gt.sms == sxm.sms == 132
    assert gt.gpus_per_node == 8 and gt.inter_node.bandwidth_bytes_per_s == 50 * GB
    assert gt.inter_node.nics_per_node == 8 and gt.intra_node.bandwidth_bytes_per_s == 450e9
    r_gt, r_sxm = rates_for(gt), rates_for(sxm)
    assert r_gt.gemm_flops_per_s(8192, 8192, 4096, "bf16") == r_sxm.gemm_flops_per_s(8192, 8192, 4096, "bf16")
    assert r_gt.gemm_flops_per_s(8192, 8192, 4096, "fp8") == r_sxm.gemm_flops_per_s(8192, 8192, 4096, "fp8")
    assert r_gt.hbm_efficiency == r_sxm.hbm_efficiency
