"""Collective pricing (network.Topology.seconds / route / all_to_all) against hand-written formulas,
and the groups ParallelConfig derives."""

from __future__ import annotations

import pytest

from simtrain.hardware import load_profile
from simtrain.network import Collective, Topology
from simtrain.parallel import Group, ParallelConfig

H100 = load_profile("h100-sxm")
M = 64 * 2**20  # bytes


def test_ring_all_reduce_matches_the_hand_formula():
    n, link = 8, H100.intra_node
    topo = Topology(H100, ParallelConfig(tp=n))
    alpha, bw = link.latency_s, link.bandwidth_bytes_per_s * link.efficiency
    hand = 2 * (n - 1) * alpha + 2 * (n - 1) / n * M / bw
    assert topo.seconds(Collective("all-reduce", "tp", M)) == pytest.approx(hand, rel=1e-12)
    half = (n - 1) * alpha + (n - 1) / n * M / bw
    assert topo.seconds(Collective("reduce-scatter", "tp", M)) == pytest.approx(half, rel=1e-12)
    assert topo.seconds(Collective("all-gather", "tp", M)) == pytest.approx(half, rel=1e-12)
    assert topo.seconds(Collective("reduce-scatter", "tp", M, repeat=4)) == pytest.approx(4 * half, rel=1e-12)


def test_a_group_of_one_gpu_or_an_empty_buffer_is_free():
    topo = Topology(H100, ParallelConfig(tp=1, dp=1))
    assert topo.seconds(Collective("all-reduce", "tp", M)) == 0.0
    assert topo.seconds(Collective("all-reduce", "dp", M)) == 0.0
    assert Topology(H100, ParallelConfig(tp=8)).seconds(Collective("all-reduce", "tp", 0.0)) == 0.0


def test_dp_group_across_nodes_takes_the_nics():
    # tp 8 fills a node of 8 GPUs, so the 2 DP replicas sit on two nodes: the ring runs over the NICs
    parallel = ParallelConfig(tp=8, pp=2, dp=2)
    topo = Topology(H100, parallel)
    link, bw = H100.inter_node, H100.nic_bandwidth_per_gpu_bytes_per_s
    hand = 2 * 1 * link.latency_s + 2 * 1 / 2 * M / (bw * link.efficiency)
    assert topo.seconds(Collective("all-reduce", "dp", M), pp_rank=1) == pytest.approx(hand, rel=1e-12)
    assert topo.route(Collective("all-reduce", "dp", M), 1).resources == ("nic:1:out", "nic:1:in")
    assert topo.route(Collective("all-reduce", "tp", M), 1).resources == ("nvlink:1:out", "nvlink:1:in")


def test_p2p_is_one_alpha_beta_message_on_the_peer_link():
    topo = Topology(H100, ParallelConfig(pp=2))
    link = H100.intra_node
    hand = link.latency_s + M / (link.peer_bandwidth_bytes_per_s * link.efficiency)
    c = Collective("p2p", "pp", M)
    assert topo.seconds(c, 0, peer=1) == pytest.approx(hand, rel=1e-12)
    assert topo.route(c, 0, peer=1).resources == ("nvlink:0:out", "nvlink:1:in")


def test_all_to_all_is_the_slower_link_class_with_imbalance():
    topo = Topology(H100, ParallelConfig(dp=16, ep=16))
    c = Collective("all-to-all", "ep", 3 * M, link_bytes=(("nvlink", M), ("nic", 2 * M)), imbalance=1.5)
    nv, nic = H100.intra_node, H100.inter_node
    nv_s = nv.latency_s + M * 1.5 / (nv.bandwidth_bytes_per_s * nv.efficiency)
    nic_s = nic.latency_s + 2 * M * 1.5 / (H100.nic_bandwidth_per_gpu_bytes_per_s * nic.efficiency)
    parts = topo.all_to_all(c)
    assert [p.link for p in parts] == ["nvlink", "nic"]
    assert parts[0].seconds() == pytest.approx(nv_s, rel=1e-12)
    assert parts[1].seconds(waves=4) == pytest.approx(nic.latency_s + (nic_s - nic.latency_s) / 4, rel=1e-12)
    assert topo.seconds(c) == pytest.approx(max(nv_s, nic_s), rel=1e-12)


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
