"""NCCL collective model: busbw grows with size and saturates; R5 (8-GPU H100/H200 ring and NVLS);
multi-node rings use every NIC; `simtrain collective` rows and errors."""

from __future__ import annotations

import dataclasses
import json

import pytest
from typer.testing import CliRunner

from simtrain.cli import app
from simtrain.collectives import OPS, estimate
from simtrain.errors import SimtrainError
from simtrain.hardware import GB, PROFILE_DIR, load_profile

runner = CliRunner()
SIZES = [2**20 * 2**i for i in range(14)]  # 1 MiB .. 8 GiB


@pytest.mark.parametrize("hardware", ["h100-sxm", "a100-sxm-80gb", "b200", "mi300x"])
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("gpus,per_node", [(8, 8), (16, 8), (32, 4)])
def test_busbw_rises_with_size_from_1mb_to_8gb_and_saturates(hardware, op, gpus, per_node):
    hw = load_profile(hardware)
    bus = [estimate(op, s, hw, gpus, per_node).busbw_bytes_per_s for s in SIZES]
    assert all(b2 >= b1 for b1, b2 in zip(bus, bus[1:])), bus
    assert bus[-1] > 1.05 * bus[0]
    assert bus[-1] / bus[-2] < 1.01  # saturated at the top: 4 GiB -> 8 GiB gains < 1 %


@pytest.mark.parametrize("hardware", ["h100-sxm", "h200-sxm"])
def test_r5_ring_and_nvls_all_reduce_on_8_gpus(hardware):
    """published_runs.md R5: ring busbw ~370 GB/s, NVLS busbw 475-480 (algbw ~275) on 8 GPUs."""
    hw = load_profile(hardware)
    ring = estimate("all-reduce", 8 * 2**30, hw, 8, algorithm="ring")
    nvls = estimate("all-reduce", 8 * 2**30, hw, 8, algorithm="nvls")
    assert ring.busbw_bytes_per_s == pytest.approx(370 * GB, rel=0.10)
    assert nvls.busbw_bytes_per_s == pytest.approx(477.5 * GB, rel=0.10)
    assert nvls.algbw_bytes_per_s == pytest.approx(275 * GB, rel=0.10)
    assert estimate("all-reduce", 8 * 2**30, hw, 8).algorithm == "nvls"  # NCCL's default on H100/H200
    at_256mb = estimate("all-reduce", 256 * 2**20, hw, 8, algorithm="ring").busbw_bytes_per_s
    assert at_256mb < 0.97 * ring.busbw_bytes_per_s  # 256 MB is too small to reach the peak


def test_no_nvls_on_a100_and_auto_falls_back_to_ring():
    hw = load_profile("a100-sxm-80gb")
    with pytest.raises(SimtrainError, match="no NVLink SHARP"):
        estimate("all-reduce", 2**30, hw, 8, algorithm="nvls")
    assert estimate("all-reduce", 2**30, hw, 8).algorithm == "ring"


def test_multi_node_ring_uses_every_nic_of_a_node():
    """A 16-GPU all-reduce over 2 nodes is bounded by NVLink or the node's 8 NICs together, not by
    one NIC share on a flat ring (the old model: ~40 GB/s)."""
    hw = load_profile("h100-sxm")
    e = estimate("all-reduce", 8 * 2**30, hw, 16, 8, algorithm="ring")
    nic_node = 8 * hw.inter_node.achieved_bandwidth_bytes_per_s
    assert e.nodes == 2
    assert e.busbw_bytes_per_s > 0.95 * min(hw.intra_node.achieved_bandwidth_bytes_per_s, nic_node)
    # Four GPUs per node drive four NICs: the NIC side binds at half the node's NICs.
    half = estimate("all-reduce", 8 * 2**30, hw, 16, 4, algorithm="ring")
    assert half.busbw_bytes_per_s == pytest.approx(nic_node / 2, rel=0.02)


def test_link_classes_have_separate_efficiencies():
    hw = load_profile("h800")
    assert hw.intra_node.achieved_bandwidth_bytes_per_s == pytest.approx(200 * 0.824 * GB)
    assert hw.inter_node.achieved_bandwidth_bytes_per_s == pytest.approx(50 * 0.94 * GB)
    slower_nic = dataclasses.replace(hw, inter_node=dataclasses.replace(hw.inter_node, achieved_efficiency=0.5))
    intra = estimate("all-reduce", 2**30, hw, 8).time_s
    assert estimate("all-reduce", 2**30, slower_nic, 8).time_s == intra  # NIC plays no part in one node
    assert estimate("p2p", 2**30, slower_nic, 2, 1).time_s > 1.8 * estimate("p2p", 2**30, hw, 2, 1).time_s


@pytest.mark.parametrize("kwargs,match", [
    (dict(op="all-gather", algorithm="tree"), "tree runs only all-reduce"),
    (dict(op="all-reduce", algorithm="nvls", gpus=16), "spans 2 nodes"),
    (dict(op="p2p", algorithm="ring"), "no algorithm choice"),
    (dict(op="all-reduce", gpus_per_node=9), "must be 1 to 8"),
    (dict(op="all-reduce", gpus=12), "multiple of --gpus-per-node"),
    (dict(op="gather"), "choose one of"),
])
def test_impossible_requests_are_errors(kwargs, match):
    args = dict(op="all-reduce", nbytes=2**20, hw=load_profile("h100-sxm"), gpus=8) | kwargs
    with pytest.raises(SimtrainError, match=match):
        estimate(**args)


def test_group_larger_than_the_cluster_is_an_error():
    hw = load_profile("h100-sxm")
    small = dataclasses.replace(hw, inter_node=dataclasses.replace(hw.inter_node, nodes=2))
    estimate("all-reduce", 2**20, small, 16)
    with pytest.raises(SimtrainError, match="has 2 nodes"):
        estimate("all-reduce", 2**20, small, 32)


def test_cli_json_rows_have_exactly_the_documented_keys():
    res = runner.invoke(app, ["collective", "all-reduce", "--hardware", "h100-sxm", "--gpus", "16",
                              "--sizes", "1M,64M,1G,8G", "--json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    assert [r["bytes"] for r in rows] == [2**20, 64 * 2**20, 2**30, 8 * 2**30]
    for r in rows:
        assert set(r) == {"op", "gpus", "nodes", "bytes", "time_s", "algbw_bytes_per_s", "busbw_bytes_per_s",
                          "algorithm"}
        assert r["nodes"] == 2 and r["busbw_bytes_per_s"] == pytest.approx(r["algbw_bytes_per_s"] * 2 * 15 / 16)
    table = runner.invoke(app, ["collective", "broadcast", "--hardware", "h100-sxm", "--gpus", "8"])
    assert table.exit_code == 0 and "busbw (GB/s)" in table.stdout


@pytest.mark.parametrize("args,match", [
    (["all-reduce", "--hardware", "a100-sxm-80gb", "--gpus", "8", "--algorithm", "nvls"], "--algorithm nvls"),
    (["all-reduce", "--hardware", "h100-sxm", "--gpus", "8", "--gpus-per-node", "16"], "--gpus-per-node = 16"),
    (["all-reduce", "--hardware", "h100-sxm", "--gpus", "8", "--sizes", "1M,lots"], "--sizes"),
    (["all-reduce", "--hardware", "h100-sxm"], "--gpus required"),
    (["all-reduce", "--hardware", "h100-sxm", "--gpus", "8", "--ep", "8"], "--ep: only for dispatch"),
    (["all-reduce", "--hardware", "nope", "--gpus", "8"], "unknown hardware"),
])
def test_cli_bad_input_is_one_error_line_exit_2(args, match):
    res = runner.invoke(app, ["collective", *args])
    assert res.exit_code == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and match in lines[0], res.stderr


def test_cli_group_larger_than_the_cluster_is_one_error_line(tmp_path):
    profile = tmp_path / "two-nodes.yaml"
    text = (PROFILE_DIR / "h800.yaml").read_text()
    profile.write_text(text.replace("  nics_per_node: 8\n", "  nics_per_node: 8\n  nodes: 2\n"))
    ok = runner.invoke(app, ["collective", "all-gather", "--hardware", str(profile), "--gpus", "16", "--json"])
    assert ok.exit_code == 0, ok.output
    for args in (["all-gather", "--gpus", "32"],
                 ["dispatch", "--ep", "32", "--tokens", "4096", "--hidden", "7168", "--topk", "8"]):
        res = runner.invoke(app, ["collective", *args, "--hardware", str(profile)])
        assert res.exit_code == 2
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and "has 2 nodes" in lines[0], res.stderr


@pytest.mark.parametrize("good,bad,field", [("nvls_efficiency: 0.85", "nvls_efficiency: 1.5", "intra_node.nvls_efficiency"),
                                            ("alltoall_efficiency: 0.743", "alltoall_efficiency: 1.2",
                                             "inter_node.alltoall_efficiency")])
def test_new_link_fields_are_validated_and_optional(tmp_path, good, bad, field):
    text = (PROFILE_DIR / "h100-sxm.yaml").read_text()
    path = tmp_path / "bad.yaml"
    path.write_text(text.replace(good, bad))
    with pytest.raises(SimtrainError, match=field):
        load_profile(path)
    plain = load_profile("mi300x")  # no per-class fields: both classes fall back to efficiency.link
    assert plain.intra_node.collective_efficiency == plain.inter_node.collective_efficiency == 0.75
    assert plain.intra_node.nvls_efficiency is None and plain.inter_node.nodes is None
    assert plain.inter_node.alltoall_efficiency is None  # NCCL's all-to-all then at the NIC's rate
    assert plain.inter_node.a2a_efficiency == plain.inter_node.collective_efficiency


def test_nccl_all_to_all_on_four_dgx_h100_is_nvidias_measured_busbw():
    """NVIDIA GTC25 S72583, "All-to-all Communication Bandwidth": nccl-tests alltoall busbw 48 GB/s
    on 32 GPUs of 8x 400Gb DGX H100 (4 nodes). The profile's inter_node.alltoall_efficiency must
    reproduce it at a large size, while all-reduce keeps the NIC's collective efficiency."""
    hw = load_profile("h100-sxm")
    e = estimate("all-to-all", 2**30, hw, 32)
    assert (e.nodes, e.bottleneck) == (4, "nic")
    assert e.busbw_bytes_per_s == pytest.approx(48 * GB, rel=0.02)
    without = dataclasses.replace(hw, inter_node=dataclasses.replace(hw.inter_node, alltoall_efficiency=None))
    assert estimate("all-to-all", 2**30, without, 32).busbw_bytes_per_s > 1.2 * e.busbw_bytes_per_s
    for op in ("all-reduce", "all-gather"):
        assert estimate(op, 2**30, hw, 32).time_s == estimate(op, 2**30, without, 32).time_s
    assert estimate("all-to-all", 2**30, hw, 8).time_s == estimate("all-to-all", 2**30, without, 8).time_s

