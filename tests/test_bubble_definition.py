"""bubble_ratio is the pipeline bubble (idle time with no communication of the rank in flight);
exposed communication is its own figure, and idle_ratio keeps the all-idle share."""

from __future__ import annotations

import pytest

import simtrain

DEFAULT = dict(model="llama3-70b", hardware="h100-sxm", tp=8, pp=8, dp=4, microbatches=16, seq_len=8192)


def test_idle_splits_into_bubble_and_exposed_communication():
    r = simtrain.simulate(schedule="gpipe", **DEFAULT)
    assert r.exposed_comm_s > 0
    for idle, bubble, exposed in zip(r.idle_ratio_per_rank, r.bubble_ratio_per_rank, r.exposed_comm_s_per_rank):
        assert idle == pytest.approx(bubble + exposed / r.step_time_s, abs=1e-12)
    assert r.idle_ratio == pytest.approx(r.bubble_ratio + r.exposed_comm_s / r.step_time_s, abs=1e-12)
    # the default scenario's GPipe row: the all-idle figure (what the bubble column used to show) is
    # 50 %; the pipeline bubble is near (p-1)/(m+p-1) = 7/23 = 30.4 %, a little above it because the
    # first and last stages also hold the embedding and the LM head
    assert 7 / 23 < r.bubble_ratio < 7 / 23 + 0.05  # + communication on the critical path (NCCL model)
    assert r.idle_ratio > r.bubble_ratio + 0.1


def test_free_communication_makes_them_equal():
    r = simtrain.simulate(schedule="1f1b", comm=False, **DEFAULT)
    assert r.exposed_comm_s == 0
    assert r.bubble_ratio == pytest.approx(r.idle_ratio, abs=1e-12)
    assert 7 / 23 < r.bubble_ratio < 7 / 23 + 0.05  # + communication on the critical path (NCCL model)
