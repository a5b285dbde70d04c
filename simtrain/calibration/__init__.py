"""Calibration against real torch on the machine at hand (optional extra: ``pip install -e '.[calibrate]'``).

The modules depend on each other in this order only (no cycle):

* :mod:`.launch` starts the ranks of a measurement: spawned locally (gloo on CPU, one process per
  GPU with NCCL) or, under ``torchrun``, the ranks torchrun started.
* :mod:`.measurements` types what the ranks measure (typed dicts, as the JSON they travel in).
* :mod:`.workload` describes what runs: the validation transformer, torch's schedules and stage
  placements, the microbenchmark grids and the kernel and stage builders.
* :mod:`.timing` times work on a rank (timers, the compute clock, a step across ranks).
* :mod:`.pipeline_runs` runs and measures real ``torch.distributed.pipelining`` training steps
  (the ``validate`` job, and the pipeline part of ``calibrate``).
* :mod:`.microbench` measures GEMMs, attention, memory-bound kernels, copies, p2p and collectives
  (the ``calibrate`` job).
* :mod:`.predict` imports a measured run into simtrain and simulates it (no torch).
* :mod:`.fit` turns the measurements into a NEW hardware profile (alpha-beta fits with R² and
  per-size residuals, GEMM and attention rate tables).
* :mod:`.validate` compares measured step time and activation memory of the validation runs with
  what simtrain predicts from the profile.

Nothing outside this package imports torch.
"""

from __future__ import annotations

from ..errors import SimtrainError

TORCH_HINT = "install the calibration extra: pip install -e '.[calibrate]' (torch>=2.4,<2.14)"


def require_torch():
    """Import and return torch.

    Raises:
        SimtrainError: torch is not installed.
    """
    try:
        import torch
    except ImportError:
        raise SimtrainError(f"simtrain calibrate/validate need torch, which is not installed: {TORCH_HINT}") from None
    return torch
