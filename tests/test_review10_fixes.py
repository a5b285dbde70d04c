"""Regression tests for the defects review 10 found (items 4-12 of the hostile-fixes5 brief)."""

from __future__ import annotations

import pytest

from simtrain.errors import SimtrainError

GIB = 2**30


@pytest.mark.parametrize("device_name, memory_gib, profile", [
    ("NVIDIA H100 80GB HBM3", 79.1, "h100-sxm"),
    ("NVIDIA A100-SXM4-80GB", 79.1, "a100-sxm-80gb"),
    ("NVIDIA A100-SXM4-40GB", 39.4, None),  # was a100-sxm-80gb, calibrated as 80 GiB
    ("NVIDIA A100-PCIE-40GB", 39.4, None),
    ("Tesla V100-SXM2-16GB", 15.8, None),  # was the 32 GB profile
    ("Tesla V100-SXM2-32GB", 31.7, "v100-sxm2"),
    ("NVIDIA GH200 480GB", 94.5, None),  # was h200-sxm ('h200' inside 'gh200')
    ("NVIDIA H100 NVL", 93.1, None),  # was h100-sxm: no shipped NVL profile
    ("NVIDIA H200", 139.8, "h200-sxm"),
])
def test_calibrate_matches_a_cuda_device_by_name_form_factor_and_memory(device_name, memory_gib, profile):
    from simtrain.calibration.profile import _matching_profile
    from simtrain.hardware import available_profiles

    assert _matching_profile(device_name, available_profiles(), memory_gib * GIB) == profile


def test_calibrate_refuses_or_takes_the_devices_memory():
    from simtrain.calibration.profile import base_profile_data

    with pytest.raises(SimtrainError, match=r"--base: no shipped profile is GPU 'NVIDIA A100-SXM4-40GB' with 39.4 GiB"):
        base_profile_data(None, "cuda", "NVIDIA A100-SXM4-40GB", 39.4 * GIB)
    data, name = base_profile_data("a100-sxm-80gb", "cuda", "NVIDIA A100-SXM4-40GB", 39.4 * GIB)
    assert name == "a100-sxm-80gb" and data["hbm_gib"] == pytest.approx(39.4, rel=1e-3)
    data, _ = base_profile_data(None, "cuda", "NVIDIA A100-SXM4-80GB", 79.1 * GIB)
    assert data["hbm_gib"] == 80  # the datasheet capacity where the device is the profile
