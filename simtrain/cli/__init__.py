"""Command line: ``simtrain compare``, ``simtrain export-schedule``, ``simtrain overlay``,
``simtrain profiles``, ``simtrain models``, ``simtrain plan`` (:mod:`.plan`), and the torch-based ``simtrain calibrate`` and
``simtrain validate`` (:mod:`simtrain.calibration.commands`).

Every user error ends as one line ``error: ...`` on stderr and exit status 2, never a traceback
(commands are wrapped by :func:`user_errors`; typer reports unknown flags and bad types with 2).
Units are converted here, at the edge: tables print ms, GiB, TFLOP/s and GB/s.

The package: :mod:`.app` (the typer app and the error convention), :mod:`.settings` (scenario +
flags), :mod:`.compare` and :mod:`.commands` (the commands, registered on import, in this order).
"""

from . import compare  # noqa: F401  (registers ``compare`` first, as ``--help`` lists it)
from . import commands  # noqa: F401,I001  (registers the other commands)
from . import plan  # noqa: F401,I001  (registers ``plan``)
from .app import app, main, user_errors

__all__ = ["app", "main", "user_errors"]
