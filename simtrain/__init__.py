"""simtrain: a discrete-event simulator of one pipeline-parallel LLM training step.

The pipeline, in the order the modules run: a **hardware** profile (:mod:`simtrain.hardware`: peak
FLOP/s, HBM, links, in SI units), a **model** (:mod:`simtrain.models`: transformer shapes, parameter
counts; presets, YAML files or HuggingFace ``config.json`` via :mod:`simtrain.importers`) and a
**parallel** layout (:mod:`simtrain.parallel`: TP, PP, DP, EP, microbatches) give the per-stage
**costs** (:mod:`simtrain.costs`: seconds, bytes and FLOPs of each forward/backward action and the
communication it needs); a **schedule** (:mod:`simtrain.schedules`: GPipe, 1F1B, interleaved,
zero-bubble, DualPipe, ...) orders the actions per rank; **lowering** (:mod:`simtrain.lowering`)
turns schedule + costs into a task graph on compute and communication streams; the **engine**
(:mod:`simtrain.engine`, SimPy) runs the graph and records the **trace** (every task's start and
end, and each rank's memory over time); **metrics** (:mod:`simtrain.metrics`) reduce the trace to a
report (step time, bubble, exposed communication, peak memory, MFU, tokens/s), and **viz**
(:mod:`simtrain.viz`) draws it. :func:`simtrain.scenario.run_schedule` runs that chain for one
schedule; the CLI (``simtrain compare``) and the Python API below are thin layers over it.

Public API (imported lazily, so ``import simtrain`` stays light)::

    import simtrain
    report = simtrain.simulate(model="llama3-8b", hardware="h100-sxm", tp=8, schedule="1f1b")
    report.step_time_s, report.bubble_ratio, report.trace, report.memory
    reports = simtrain.compare(model="llama3-70b", hardware="h100-sxm", tp=8, pp=8,
                               microbatches=16, schedules=["gpipe", "1f1b", "zbv"])
    simtrain.load_model("config.json").total_params          # a HuggingFace config works too
    simtrain.load_hardware("h100-sxm").hbm_bytes

See :mod:`simtrain.api` for the arguments, units and errors.
"""

from __future__ import annotations

__all__ = ["__version__", "simulate", "compare", "load_model", "load_hardware", "Report", "Comparison",
           "SimtrainError"]

_LAZY = {
    "simulate": "simtrain.api", "compare": "simtrain.api", "load_model": "simtrain.api",
    "load_hardware": "simtrain.api", "Report": "simtrain.api", "Comparison": "simtrain.api",
    "SimtrainError": "simtrain.errors",
}


def _version() -> str:
    """The installed distribution's version (``0+unknown`` in a checkout never installed)."""
    from importlib import metadata

    try:
        return metadata.version("simtrain")
    except metadata.PackageNotFoundError:
        return "0+unknown"


def __getattr__(name: str):
    """Import the public API on first use (PEP 562), keeping SimPy, pandas and plotly out of a
    bare ``import simtrain``; ``__version__`` is read from the package metadata on first use too
    (``importlib.metadata`` costs ~20 ms of start-up)."""
    if name == "__version__":
        globals()["__version__"] = version = _version()
        return version
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'simtrain' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
