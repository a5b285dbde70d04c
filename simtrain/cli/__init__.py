"""Command line: ``simtrain compare``, ``simtrain export-schedule``, ``simtrain overlay``,
``simtrain profiles``, ``simtrain models``, ``simtrain plan`` (:mod:`.plan`), and the torch-based ``simtrain calibrate`` and
``simtrain validate`` (:mod:`simtrain.calibration.commands`).

Every user error ends as one line ``error: ...`` on stderr and exit status 2, never a traceback
(commands are wrapped by :func:`user_errors`; typer reports unknown flags and bad types with 2).
Units are converted here, at the edge: tables print ms, GiB, TFLOP/s and GB/s.

The package: :mod:`.app` (the typer app and the error convention), :mod:`.settings` (scenario +
flags), :mod:`.compare`, :mod:`.commands` and :mod:`.plan` (the commands, registered on import, in
that order). ``simtrain.cli.app`` is the typer app with every command registered; :func:`main`
(the console script) imports only the module of the command it is asked for, so that
``simtrain compare`` does not pay for importing and building ``plan`` or ``calibrate``.
"""

from __future__ import annotations

import atexit
import gc
import importlib
import os
import sys
import threading

from . import app as _base
from .app import user_errors

del app  # noqa: F821  (the submodule's name; ``app`` is the complete typer app, see __getattr__)

MODULES = ("compare", "commands", "plan")
"""The command modules, in registration order (``--help`` lists the commands in this order)."""
COMMAND_MODULE = {"compare": "compare", "plan": "plan", **dict.fromkeys(
    ("export-schedule", "overlay", "profiles", "models", "schema", "calibrate", "validate", "collective"), "commands")}
"""Which module registers each command (``tests/test_cli.py`` checks it against the full app)."""

__all__ = ["app", "main", "run", "user_errors"]


def _register(modules: tuple[str, ...] = MODULES):
    """Import the command ``modules`` (registering their commands) and return the typer app."""
    for name in modules:
        importlib.import_module(f"{__name__}.{name}")
    return _base.app


def __getattr__(name: str):
    """``app``: the typer app with every command registered (PEP 562, imported on first use)."""
    if name == "app":
        return _register()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main(ends_without_teardown: bool = False) -> None:
    """Console-script entry point (``simtrain``): register the command named by the first argument
    (every command when it is an option, ``--help``, or not a command) and run the app.

    Args:
        ends_without_teardown: the process ends after the command without freeing what is left
            (:func:`run`): ``compare`` then keeps its last task graph instead of freeing it, and
            what its runs leave out of the collector's sight
            (:func:`simtrain.scenario.keep_last_graph`; a bounded set of runs, unlike ``plan``).
    """
    module = COMMAND_MODULE.get(sys.argv[1]) if len(sys.argv) > 1 else None
    collecting = gc.isenabled()
    gc.disable()  # importing allocates ~10^5 long-lived objects (modules, classes, schemas) and little garbage
    try:
        _register((module,) if module else MODULES)
    finally:
        gc.freeze()  # ... which later collections, the one at exit included, need not scan again
        if collecting:
            gc.enable()
    if ends_without_teardown and module == "compare":
        sys.modules["simtrain.scenario"].keep_last_graph()  # (imported by compare)
    _base.main()


def run() -> None:
    """Console-script entry point (``simtrain``, ``python -m simtrain``): :func:`main`, then the
    end of the process without its teardown.

    A normal exit frees every object left (a large step's trace and runs, the modules: ~0.1 s
    of CPU for a DeepSeek-V3 step) only for the memory to be returned to the system anyway; for
    the same reason ``compare`` keeps the last task graph it simulates (``main``'s
    ``ends_without_teardown``).
    Once the command is done, this runs the ``atexit`` handlers (what a normal exit runs first:
    logging, multiprocessing, temporary folders, coverage ...), flushes standard output and
    error, and ends the process with the command's exit status (``os._exit``). Every output
    file is closed by then (they are written atomically, :mod:`simtrain.atomic`). It falls back
    to the normal exit where that could differ: a non-integer status (Python prints it), another
    non-daemon thread still running (a normal exit waits for it), or a flush that fails (e.g.
    a closed pipe, which a normal exit reports).

    Before the command runs, ``OPENBLAS_NUM_THREADS`` defaults to 1 (numpy's idle BLAS threads
    cost CPU, none of it useful here; a value the user set is kept).

    An output that cannot be written (``OSError``: a full disk, an I/O error) is one ``error:``
    line on standard error and exit status 1, not a traceback.

    Raises:
        SystemExit: in those fallback cases, with the command's status.
    """
    # numpy's OpenBLAS starts one worker thread per core at import, which spin for a while: ~0.14 s
    # of CPU per process on this 2-core machine (`import numpy` then 0.3 s asleep: 0.21 s user
    # CPU, 0.07 s with one thread). simtrain does no BLAS work on its simulation path; a user's own
    # OPENBLAS_NUM_THREADS is kept, and plan's worker processes inherit it.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    try:
        main(ends_without_teardown=True)
        code = 0
    except SystemExit as exc:
        code = 0 if exc.code is None else exc.code
    except BrokenPipeError:
        raise  # a reader that stopped early (``| head``): Python's own quiet exit
    except OSError as exc:  # the output could not be written (a full disk: ENOSPC; an I/O error)
        print(f"error: the output could not be written: {exc}", file=sys.stderr, flush=True)
        atexit._run_exitfuncs()  # noqa: SLF001
        os._exit(1)  # standard output's buffer holds what could not be written: no flush at exit
    others = [t for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon and t.is_alive()]
    if not isinstance(code, int) or isinstance(code, bool) or others:
        raise SystemExit(code)
    atexit._run_exitfuncs()  # noqa: SLF001  (CPython's own hook for them; they run once: it also unregisters them)
    try:
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
    except (OSError, ValueError):
        raise SystemExit(code) from None
    os._exit(code & 0xFF)

