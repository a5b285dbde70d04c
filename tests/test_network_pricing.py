"""Collective pricing (network.Topology.seconds / route / all_to_all) against hand-written formulas
of NCCL's model (simtrain.collectives) and DeepEP's all-to-all, and the groups ParallelConfig derives."""

from __future__ import annotations

import pytest

from simtrain.collectives import Group as Placement
from simtrain.collectives import estimate
from simtrain.deepep import FORWARD_CEILING_BYTES_PER_S
from simtrain.hardware import load_profile
from simtrain.network import Collective, Topology
from simtrain.parallel import Group, ParallelConfig

H100 = load_profile("h100-sxm")
A100 = load_profile("a100-sxm-80gb")
M = 64 * 2**20  # bytes


def test_collectives_in_a_node_are_nccls_model_on_the_group():
    n = 8
    topo = Topology(H100, ParallelConfig(tp=n))
    for op in ("all-reduce", "reduce-scatter", "all-gather"):
        assert topo.seconds(Collective(op, "tp", M)) == estimate(op, M, H100, n).time_s
    assert topo.seconds(Collective("reduce-scatter", "tp", M, repeat=4)) == 4 * estimate("reduce-scatter", M, H100, n).time_s
    # without NVLS (A100), a 64 MiB all-reduce is NCCL's ring/Simple: 8.4 us + 2(n-1) x 3.4 us + 2(n-1)/n M / bw
    link = A100.intra_node
    hand = (8.4 + 2 * (n - 1) * 3.4) * 1e-6 + 2 * (n - 1) / n * M / (link.bandwidth_bytes_per_s * link.collective_efficiency)
    assert Topology(A100, ParallelConfig(tp=n)).seconds(Collective("all-reduce", "tp", M)) == pytest.approx(hand, rel=1e-12)


def test_a_group_of_one_gpu_or_an_empty_buffer_is_free():
    topo = Topology(H100, ParallelConfig(tp=1, dp=1))
    assert topo.seconds(Collective("all-reduce", "tp", M)) == 0.0
    assert topo.seconds(Collective("all-reduce", "dp", M)) == 0.0
    assert Topology(H100, ParallelConfig(tp=8)).seconds(Collective("all-reduce", "tp", 0.0)) == 0.0


def test_dp_group_across_nodes_takes_the_nics():
    # tp 8 fills a node of 8 GPUs, so the 2 DP replicas sit on two nodes, one GPU on each: a ring over
    # one NIC per node; NCCL's ring/Simple latency across nodes is (8.4 + 2 x 14) us x 1.4 (plateau)
    parallel = ParallelConfig(tp=8, pp=2, dp=2)
    topo = Topology(H100, parallel)
    assert topo.placement("dp", 1) == Placement(2, 1, 2)
    assert topo.placement("tp", 1) == Placement(8, 8, 1)
    nic = H100.inter_node
    hand = 1.4 * (8.4 + 2 * 14.0) * 1e-6 + 2 * 1 / 2 * M / (nic.bandwidth_bytes_per_s * nic.collective_efficiency)
    assert topo.seconds(Collective("all-reduce", "dp", M), pp_rank=1) == pytest.approx(hand, rel=1e-12)
    assert topo.route(Collective("all-reduce", "dp", M), 1).resources == ("nic:1:out", "nic:1:in")
    assert topo.route(Collective("all-reduce", "tp", M), 1).resources == ("nvlink:1:out", "nvlink:1:in")


def test_p2p_is_one_alpha_beta_message_on_the_peer_link():
    topo = Topology(H100, ParallelConfig(pp=2))
    link = H100.intra_node
    hand = link.latency_s + M / (link.peer_bandwidth_bytes_per_s * link.collective_efficiency)
    c = Collective("p2p", "pp", M)
    assert topo.seconds(c, 0, peer=1) == pytest.approx(hand, rel=1e-12)
    assert topo.route(c, 0, peer=1).resources == ("nvlink:0:out", "nvlink:1:in")


def test_all_to_all_is_the_slower_link_class_with_imbalance():
    # EP 16 spans two nodes: the NVLink part is DeepEP's forwarding leg, at most its ceiling
    topo = Topology(H100, ParallelConfig(dp=16, ep=16, ep_kernel="fused"))
    c = Collective("all-to-all", "ep", 3 * M, link_bytes=(("nvlink", M), ("nic", 2 * M)), imbalance=1.5)
    nv, nic = H100.intra_node, H100.inter_node
    nv_bw = min(nv.bandwidth_bytes_per_s * nv.collective_efficiency, FORWARD_CEILING_BYTES_PER_S)
    nv_s = nv.latency_s + M * 1.5 / nv_bw
    nic_s = nic.latency_s + 2 * M * 1.5 / (H100.nic_bandwidth_per_gpu_bytes_per_s * nic.collective_efficiency)
    parts = topo.all_to_all(c)
    assert [p.link for p in parts] == ["nvlink", "nic"]
    assert parts[0].seconds() == pytest.approx(nv_s, rel=1e-12)
    assert parts[1].seconds(waves=4) == pytest.approx(nic.latency_s + (nic_s - nic.latency_s) / 4, rel=1e-12)
    assert topo.seconds(c) == pytest.approx(max(nv_s, nic_s), rel=1e-12)
    one_node = Topology(H100, ParallelConfig(dp=8, ep=8)).all_to_all(c)  # no forwarding inside one node
    assert one_node[0].seconds() == pytest.approx(nv.latency_s + M * 1.5 / (nv.bandwidth_bytes_per_s * nv.collective_efficiency))


def test_nccl_all_to_all_takes_the_profiles_all_to_all_nic_efficiency():
    # Megatron's alltoall dispatcher (ep_kernel nccl, the default) and a uniform CP all-to-all are
    # NCCL's all-to-all: their NIC part runs at inter_node.alltoall_efficiency; NVLink is unchanged
    nic, nv = H100.inter_node, H100.intra_node
    assert nic.alltoall_efficiency is not None and nic.alltoall_efficiency < nic.collective_efficiency
    c = Collective("all-to-all", "ep", 3 * M, link_bytes=(("nvlink", M), ("nic", 2 * M)))
    nccl = Topology(H100, ParallelConfig(dp=16, ep=16)).all_to_all(c)
    fused = Topology(H100, ParallelConfig(dp=16, ep=16, ep_kernel="fused")).all_to_all(c)
    share = H100.nic_bandwidth_per_gpu_bytes_per_s
    assert nccl[1].transfer_s == pytest.approx(2 * M / (share * nic.alltoall_efficiency), rel=1e-12)
    assert fused[1].transfer_s == pytest.approx(2 * M / (share * nic.collective_efficiency), rel=1e-12)
    assert nccl[0] == fused[0]
    cp = Topology(H100, ParallelConfig(cp=16, ep_kernel="fused")).all_to_all(Collective("all-to-all", "cp", 16 * M))
    assert cp[1].link == "nic" and cp[1].transfer_s == pytest.approx(8 * M / (share * nic.alltoall_efficiency), rel=1e-12)


def test_parallel_config_derives_the_groups_once():
    p = ParallelConfig(tp=2, pp=2, dp=4, ep=4)
    assert p.expert_dp == 2 and p.dp_stride == 2  # ep > 1: [TP, DP, PP] order, replicas tp apart
    assert p.group("tp", 1) == Group("tp", 2, (8, 9))
    assert p.group("ep", 1) == Group("ep", 4, (8, 11))
    assert p.group("dp", 1) == Group("dp", 4, (8, 14))
    assert p.group("expert_dp", 1) == Group("expert_dp", 2, (8, 12))  # ep = 4 apart
    # a chunk held by two pipeline ranks (DualPipe) reduces over both ranks' replicas
    assert p.group("dp", 0, holders=(0, 1)) == Group("dp", 8, (0, 14))
    assert ParallelConfig(tp=2, pp=2, dp=4).dp_stride == 4  # dense: [TP, PP, DP], replicas pp x tp apart
    with pytest.raises(ValueError):
        p.group("pp", 0)  # p2p has no group; cp is a dimension now
