"""Calibration against real torch on the machine at hand (optional extra: ``pip install -e '.[calibrate]'``).

* :mod:`.launch` starts the ranks of a measurement: spawned locally (gloo on CPU, one process per
  GPU with NCCL) or, under ``torchrun``, the ranks torchrun started.
* :mod:`.microbench` measures GEMMs, attention, memory-bound kernels, copies, p2p and collectives,
  and the per-action framework overhead of ``torch.distributed.pipelining``.
* :mod:`.fit` turns the measurements into a NEW hardware profile (alpha-beta fits with R² and
  per-size residuals, GEMM and attention rate tables).
* :mod:`.validate` runs real pipeline-parallel training steps with torch's schedules and compares
  measured step time and activation memory with what simtrain predicts from the profile.

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
