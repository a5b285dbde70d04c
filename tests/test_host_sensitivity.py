"""scripts/host_sensitivity.py: the what-if of a slower host leaves the shipped prediction alone
at the shipped rate, only slows a row as the host time per kernel grows, and its bind points
are what the breakdown's F/I/W seconds and kernels say."""

import importlib.util
from pathlib import Path

import pytest

from simtrain.costs.kernels import has_kernel_tables
from simtrain.costs.ops import published_runtime
from simtrain.hardware import US
from simtrain.published import run_suite

CASE = "megatron-bridge-h100-bf16"  # GPT-OSS 120B PP4 EP8: one figure, about 1 s


@pytest.fixture(scope="module")
def sens():
    path = Path(__file__).resolve().parents[1] / "scripts" / "host_sensitivity.py"
    spec = importlib.util.spec_from_file_location("host_sensitivity", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _shipped():
    rt = lambda m, p, hw, *rest: published_runtime(m, p, hw, *rest) if has_kernel_tables(hw) else None
    return run_suite(rt, cases=[CASE])


def test_shipped_rate_reproduces_validate(sens):
    shipped = _shipped()
    again = sens.rows_at(9.9 * US, [CASE])  # op_data.yaml host: 4.9 + 5.0 us
    assert [r.predicted for r in again] == pytest.approx([r.predicted for r in shipped], rel=1e-12)


def test_slower_host_only_slows_and_binds_past_its_bind_point(sens):
    (point,) = sens.bind_points([CASE])
    bind_us = min(b for b in point["bind_s"] if b is not None) / US
    below, above = sens.rows_at(0.5 * bind_us * US, [CASE])[0], sens.rows_at(2.0 * bind_us * US, [CASE])[0]
    shipped = _shipped()[0]
    assert below.predicted == pytest.approx(shipped.predicted, rel=1e-9)  # the GPU still binds every pass
    assert above.predicted < 0.95 * shipped.predicted  # tokens/s fall once the host binds


def test_bind_points_are_gpu_seconds_over_kernels(sens):
    (point,) = sens.bind_points([CASE])
    for gpu, kernels, bind in zip(point["gpu_s"], point["kernels"], point["bind_s"]):
        assert gpu > 0 and kernels > 0
        assert bind == pytest.approx(gpu / kernels)
