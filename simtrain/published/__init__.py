"""The published-runs suite: real-cluster measurements that judge simtrain's predictions.

``runs.yaml`` (shipped in this package) lists cases: a source, a model, a hardware profile, the
settings simtrain simulates, the assumptions made where the source is silent, and one or more
published figures with their metric. :func:`run_suite` simulates every figure and returns one
:class:`Row` per figure (``error = predicted / published - 1``); :func:`summarise` gives the
median and max ``|error|``. ``simtrain validate --published`` prints them.

These runs are the judge, not the training data (``shared/reference/published_runs.md``): no
cost-model factor may be fitted to them.

Metric definitions (the FLOP counts the sources themselves use):

* ``megatron_hw_tflops``: Narayanan et al. 2021 (arXiv:2104.04473) Eq. 3, hardware FLOPs of one
  iteration with full recomputation, ``96 B s l h^2 (1 + s/(6h) + V/(16 l h))``, per GPU-second.
* ``hw_tflops_8pt``: BLOOM's log line, ``8 x parameters x tokens`` per GPU-second
  (bigscience-workshop/bigscience ``math/README.md``, "Calculate TFLOPs": 4 passes x 2 FLOPs).
* ``model_tflops``: simtrain's model FLOPs (no recomputation) per GPU-second.
* ``tokens_per_s_per_gpu``, ``mfu``, ``step_time_s``: as in ``simtrain compare --json``.
* ``peak_memory_gib``: the simulated peak HBM of pipeline rank ``rank``, in GiB.

The ``network`` cases judge the collective models alone (no training step): nccl-tests' bus and
algorithm bandwidth of one collective (:func:`simtrain.collectives.estimate`; nccl-tests'
PERFORMANCE.md definitions: ``algbw = size / time``, ``busbw = algbw x 2(n-1)/n`` for an
all-reduce), and DeepEP's bottleneck bandwidth of its normal dispatch and combine kernels
(:func:`simtrain.deepep.estimate_ep`: NVLink bytes per second within a node, RDMA bytes per
second across nodes), in GB/s (1e9 bytes/s).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import ConfigDict, Field

from ..errors import NumbersNotBooleans, SimtrainError, load_yaml_file, validate_model
from ..hardware import GB, GiB, TFLOPS, US, HardwareProfile, InterNodeLinkFile, load_profile
from ..models import ModelSpec, load_model
from ..parallel import ParallelConfig
from ..scenario import ScheduleRun, run_schedule

Metric = Literal["step_time_s", "megatron_hw_tflops", "hw_tflops_8pt", "model_tflops",
                 "tokens_per_s_per_gpu", "mfu", "peak_memory_gib"]


class _Strict(NumbersNotBooleans):
    model_config = ConfigDict(extra="forbid", frozen=True)


class HardwareRef(_Strict):
    """A shipped profile, optionally with its scale-out network replaced (e.g. Jean Zay's Omni-Path)."""

    profile: str
    inter_node: InterNodeLinkFile | None = None


class FigureFile(_Strict):
    """One published figure: its metric and value, and what differs from the case's settings.

    ``recompute_ops`` names the operators the per-operator model reruns inside I (a
    ``--recompute`` value of :func:`simtrain.costs.ops.parse_recompute`, e.g. ``every-second-mm``)
    where they differ from ``settings.recompute``, which keeps setting the stored activations.

    ``excluded`` (a reason naming its evidence) keeps a figure out of the median and max: one that
    its own publisher reports as a software regression of that run, so it measures a defect of
    unknown mechanism that no cost model can predict. The figure is still simulated and printed.
    """

    metric: Metric
    value: float = Field(gt=0)
    label: str = ""
    note: str = ""
    rank: int | None = Field(default=None, ge=0)
    schedule: str | None = None
    global_batch: int | None = Field(default=None, ge=1)
    settings: dict[str, Any] = Field(default_factory=dict)
    model: str | dict[str, Any] | None = None
    recompute_ops: str | None = None
    excluded: str | None = Field(default=None, min_length=1)


class CaseFile(_Strict):
    """One published run (or family of runs) and its figures.

    ``fp8: gemms`` marks a run whose linear-layer GEMMs ran in FP8 with attention and the
    memory-bound kernels in ``settings.dtype`` (Transformer Engine's FP8 recipes): the
    per-operator model prices it as ``--fp8 gemms``; the flat model, which has no per-GEMM
    precision, runs it with ``dtype: fp8`` (every GEMM at the FP8 rate).
    """

    name: str
    source: str = Field(min_length=1)
    model: str | dict[str, Any]
    hardware: HardwareRef
    attention: Literal["flash", "unfused"] = "flash"
    fp8: Literal["gemms"] | None = None
    schedule: str = "1f1b"
    settings: dict[str, Any] = Field(default_factory=dict)
    global_batch: int | None = Field(default=None, ge=1)
    assumptions: list[str] = Field(default_factory=list)
    figures: list[FigureFile] = Field(min_length=1)
    params_for_tflops: float | None = Field(default=None, gt=0)


SPEED_METRICS = frozenset({"megatron_hw_tflops", "hw_tflops_8pt", "model_tflops", "tokens_per_s_per_gpu", "mfu"})
"""The training metrics that grow with speed (``step_time_s`` shrinks with it; ``peak_memory_gib``
is not a speed)."""

NetworkMetric = Literal["busbw_gb_per_s", "algbw_gb_per_s", "nvlink_gb_per_s", "rdma_gb_per_s"]
NETWORK_METRICS = frozenset(get_args(NetworkMetric))
"""The metrics of the ``network`` cases (collective bandwidths, GB/s)."""


class NetworkFigureFile(_Strict):
    """One published collective figure: the collective, its group and size, the metric (GB/s);
    ``excluded`` as :class:`FigureFile`'s."""

    metric: NetworkMetric
    value: float = Field(gt=0)
    label: str = ""
    op: Literal["all-reduce", "all-gather", "reduce-scatter", "dispatch", "combine"]
    gpus: int = Field(ge=2)
    size_bytes: float | None = Field(default=None, gt=0)
    algorithm: Literal["auto", "ring", "tree", "nvls"] = "auto"
    tokens: int | None = Field(default=None, ge=1)
    hidden: int | None = Field(default=None, ge=1)
    topk: int | None = Field(default=None, ge=1)
    dispatch_dtype: Literal["bf16", "fp8"] = "fp8"
    node_limit: int | None = Field(default=None, ge=1)
    excluded: str | None = Field(default=None, min_length=1)


class NetworkCaseFile(_Strict):
    """Published measurements of collectives on one hardware profile."""

    name: str
    source: str = Field(min_length=1)
    hardware: str
    assumptions: list[str] = Field(default_factory=list)
    figures: list[NetworkFigureFile] = Field(min_length=1)


class SuiteFile(_Strict):
    """The schema of ``runs.yaml`` (YAML anchors at the top level are allowed and ignored)."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    cases: list[CaseFile] = Field(min_length=1)
    network: list[NetworkCaseFile] = Field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class Row:
    """One figure compared: ``error = predicted / published - 1`` (units of ``metric``);
    ``label`` names the figure within its case; ``excluded`` is the reason a figure is kept out of
    :func:`summarise` (:class:`FigureFile`), None for every judged figure.

    For a training figure, ``peak_memory_gib_max`` is the simulated step's highest peak over all
    its pipeline ranks (GiB), whatever rank the figure names (a ``peak_memory_gib`` figure of
    ``rank`` 7 predicts rank 7's peak, which may be lower), ``hbm_gib`` the GPU's HBM (GiB) and
    ``fits_in_hbm`` whether that highest peak is within it; a published run ran, so a figure that
    does not fit is a memory-model error, whatever its metric. None for a collective figure."""

    case: str
    label: str
    metric: str
    published: float
    predicted: float
    error: float
    excluded: str | None = None
    peak_memory_gib_max: float | None = None
    hbm_gib: float | None = None
    fits_in_hbm: bool | None = None

    @property
    def speed_error(self) -> float | None:
        """Predicted over published training speed, minus 1 (> 0: predicted faster than measured),
        for a throughput metric its ``error`` and for ``step_time_s`` ``published / predicted - 1``;
        None for a memory or collective figure."""
        if self.metric in SPEED_METRICS:
            return self.error
        if self.metric == "step_time_s":
            return self.published / self.predicted - 1
        return None

    @property
    def kind(self) -> str:
        """``collective`` for a ``network`` case's bandwidth (:data:`NETWORK_METRICS`), else ``training``."""
        return "collective" if self.metric in NETWORK_METRICS else "training"

    def to_row(self) -> dict:
        """The ``validate --published --json`` row: the fields (``excluded`` null unless the figure is
        kept out of the statistics; the memory fields null for a collective), then ``kind``."""
        return {**dataclasses.asdict(self), "kind": self.kind}


Runtime = Callable[[ModelSpec, ParallelConfig, HardwareProfile, str, str | None, str | None], Callable | None]
"""Builds the ``runtime`` cost adjustment of :func:`simtrain.scenario.run_schedule` for one figure
from (model, parallel, hardware, attention kind, the figure's ``recompute_ops`` or None, the
case's ``fp8`` or None); None keeps the shipped cost model."""


def suite_path() -> Path:
    """Path of the shipped ``runs.yaml``."""
    return Path(str(resources.files(__package__).joinpath("runs.yaml")))


def load_suite(path: Path | None = None) -> SuiteFile:
    """Read and validate the suite.

    Raises:
        SimtrainError: a missing or malformed file, or a field out of range (naming it).
    """
    path = path or suite_path()
    return validate_model(SuiteFile, load_yaml_file(path), str(path))


def _model_of(case: CaseFile, fig: FigureFile, where: str) -> ModelSpec:
    """The figure's model: its own preset name, else the case's model with the figure's field
    overrides; an override dict's ``preset`` key names the preset the overrides apply to (e.g.
    ``{preset: llama3-405b, vocab_size: 129024}``)."""
    if isinstance(fig.model, str):
        return load_model(fig.model)
    own = dict(fig.model) if isinstance(fig.model, dict) else {}
    start = own.pop("preset", case.model)
    if isinstance(start, str):
        base = load_model(start).model_dump()
    else:
        base = dict(start)
    if own:
        base.update(own)
        for key in ("published_total_params", "published_active_params"):
            base.pop(key, None)
    return validate_model(ModelSpec, base, f"{where}: model")


def _hardware_of(ref: HardwareRef) -> HardwareProfile:
    hw = load_profile(ref.profile)
    if ref.inter_node is None:
        return hw
    link = ref.inter_node
    inter = dataclasses.replace(
        hw.inter_node, name=link.name, bandwidth_bytes_per_s=link.bandwidth_gb_per_s * GB,
        latency_s=link.latency_us * US, peer_bandwidth_bytes_per_s=link.bandwidth_gb_per_s * GB,
        nics_per_node=link.nics_per_node,
        achieved_efficiency=hw.inter_node.achieved_efficiency if link.efficiency is None else link.efficiency)
    return dataclasses.replace(hw, inter_node=inter)


def _parallel_of(case: CaseFile, fig: FigureFile, where: str) -> ParallelConfig:
    parallel = validate_model(ParallelConfig, {"attention": case.attention, **case.settings, **fig.settings},
                              f"{where}: settings")
    expected = fig.global_batch or case.global_batch
    batch = parallel.dp * parallel.microbatches * parallel.microbatch_size
    if expected is not None and expected != batch:
        raise SimtrainError(f"{where}: global batch {expected} != dp x microbatches x microbatch_size = {batch}")
    return parallel


def _predict(metric: str, run: ScheduleRun, model: ModelSpec, parallel: ParallelConfig, hw: HardwareProfile,
             case: CaseFile, fig: FigureFile) -> float:
    """The metric of ``fig`` from one simulated step (units as in the module docstring)."""
    rep = run.report
    step, gpus = rep.step_time_s, rep.gpus
    s = parallel.seq_len or model.seq_len
    batch = parallel.dp * parallel.microbatches * parallel.microbatch_size
    if metric == "step_time_s":
        return step
    if metric == "megatron_hw_tflops":
        h, l, v = model.hidden_size, model.num_layers, model.vocab_size
        flops = 96 * batch * s * l * h**2 * (1 + s / (6 * h) + v / (16 * l * h))
        return flops / (step * gpus) / TFLOPS
    if metric == "hw_tflops_8pt":
        params = case.params_for_tflops or model.total_params
        return 8 * params * batch * s / (step * gpus) / TFLOPS
    if metric == "model_tflops":
        return rep.model_flops / (step * gpus) / TFLOPS
    if metric == "tokens_per_s_per_gpu":
        return rep.tokens_per_s / gpus
    if metric == "mfu":
        return rep.mfu
    return rep.peak_memory_bytes[fig.rank or 0] / GiB


def run_suite(runtime: Runtime | None = None, path: Path | None = None,
              cases: list[str] | None = None) -> list[Row]:
    """Simulate every published figure of the suite.

    Args:
        runtime: builds a cost adjustment per figure (e.g. the per-operator model); None keeps
            the shipped cost model.
        path: a suite file other than the shipped one.
        cases: only these case names (default all).

    Returns:
        One :class:`Row` per figure, in file order.

    Raises:
        SimtrainError: a malformed suite, an unknown case name, or a figure simtrain cannot
            simulate (the message names the case and the figure).
    """
    suite = load_suite(path)
    names = [c.name for c in suite.cases] + [c.name for c in suite.network]
    for name in cases or []:
        if name not in names:
            raise SimtrainError(f"--case {name!r}: not a case of the published suite; choose from {names}")
    rows = []
    for case, fig, where in _figures(suite.cases + suite.network, cases):
        memory = {}
        if isinstance(case, NetworkCaseFile):
            predicted = _predict_network(fig, load_profile(case.hardware), where) / GB
        else:
            hw, model, parallel = _hardware_of(case.hardware), _model_of(case, fig, where), _parallel_of(case, fig, where)
            try:
                adjust = runtime(model, parallel, hw, case.attention, fig.recompute_ops, case.fp8) if runtime else None
                if adjust is None and case.fp8:
                    parallel = parallel.model_copy(update=dict(dtype="fp8"))
                run = run_schedule(fig.schedule or case.schedule, model, hw, parallel, runtime=adjust)
            except SimtrainError as exc:
                raise SimtrainError(f"{where}: {exc}") from None
            predicted = _predict(fig.metric, run, model, parallel, hw, case, fig)
            rep = run.report
            memory = dict(peak_memory_gib_max=max(rep.peak_memory_bytes) / GiB, hbm_gib=rep.hbm_bytes / GiB,
                          fits_in_hbm=rep.fits_in_hbm)
        rows.append(Row(case.name, fig.label, fig.metric, fig.value, predicted, predicted / fig.value - 1,
                        fig.excluded, **memory))
    return rows


def _figures(suite_cases: list, only: list[str] | None):
    """``(case, figure, where)`` for every figure of ``suite_cases`` (of the cases ``only`` names)."""
    for case in suite_cases:
        if only and case.name not in only:
            continue
        for i, fig in enumerate(case.figures):
            yield case, fig, f"published case {case.name} figure {i + 1} ({fig.label or fig.metric})"


def _predict_network(fig: NetworkFigureFile, hw: HardwareProfile, where: str) -> float:
    """The bandwidth of ``fig`` in bytes/s (module docstring).

    Raises:
        SimtrainError: a figure without the sizes its collective needs, or the model's own error.
    """
    from ..collectives import estimate
    from ..deepep import estimate_ep

    try:
        if fig.op in ("dispatch", "combine"):
            if None in (fig.tokens, fig.hidden, fig.topk):
                raise SimtrainError("a dispatch/combine figure needs tokens, hidden and topk")
            if fig.metric not in ("nvlink_gb_per_s", "rdma_gb_per_s"):
                raise SimtrainError(f"metric {fig.metric}: DeepEP figures are nvlink_gb_per_s or rdma_gb_per_s")
            e = estimate_ep(fig.op, hw, fig.gpus, fig.tokens, fig.hidden, fig.topk, fig.dispatch_dtype,
                            node_limit=fig.node_limit)
            return e.nvlink_bytes_per_s if fig.metric == "nvlink_gb_per_s" else e.rdma_bytes_per_s
        if fig.size_bytes is None or fig.metric not in ("busbw_gb_per_s", "algbw_gb_per_s"):
            raise SimtrainError("a collective figure needs size_bytes and a busbw_gb_per_s or algbw_gb_per_s metric")
        e = estimate(fig.op, fig.size_bytes, hw, fig.gpus, algorithm=fig.algorithm)
        return e.busbw_bytes_per_s if fig.metric == "busbw_gb_per_s" else e.algbw_bytes_per_s
    except SimtrainError as exc:
        raise SimtrainError(f"{where}: {exc}") from None


def summarise(rows: list[Row]) -> dict[str, float]:
    """Median and max ``|error|`` over the judged figures of ``rows`` (``excluded`` None), how many
    cases and figures they cover, how many figures were left out (``excluded``), and
    ``over_hbm``: how many judged training figures peak above their GPU's HBM (memory-model errors,
    :class:`Row`).

    The direction of the speed errors, which ``|error|`` hides: ``speed_figures`` judged figures
    with a speed metric (:attr:`Row.speed_error`), of which ``too_fast`` are predicted faster than
    published and ``too_slow`` slower, and ``median_speed_error``, the median signed speed error
    (> 0: simtrain is optimistic; None without a speed figure).

    Raises:
        ValueError: ``rows`` has no judged figure.
    """
    judged = [r for r in rows if r.excluded is None]
    errors = [abs(r.error) for r in judged]
    speeds = [r.speed_error for r in judged if r.speed_error is not None]
    return dict(median_abs_error=statistics.median(errors), max_abs_error=max(errors),
                figures=len(judged), cases=len({r.case for r in judged}), excluded=len(rows) - len(judged),
                over_hbm=len(over_hbm(judged)), speed_figures=len(speeds),
                too_fast=sum(e > 0 for e in speeds), too_slow=sum(e < 0 for e in speeds),
                median_speed_error=statistics.median(speeds) if speeds else None)


def over_hbm(rows: list[Row]) -> list[Row]:
    """The training figures of ``rows`` whose simulated peak exceeds their GPU's HBM, in order."""
    return [r for r in rows if r.fits_in_hbm is False]


def rows_table(rows: list[Row], title: str):
    """A rich table of ``rows`` (case, figure, metric, published, predicted, error, and a training
    figure's simulated highest peak over all its ranks, over its HBM in GiB, marked ``OVER`` where it
    does not fit: column ``max peak/HBM GiB``, whatever rank a memory figure names); an excluded
    figure's error is shown in parentheses (kept out of the statistics)."""
    from rich.table import Table

    table = Table(title=title)
    for col in ("case", "figure", "metric", "published", "predicted", "error", "max peak/HBM GiB"):
        table.add_column(col, justify="left" if col in ("case", "figure", "metric") else "right")
    for r in rows:
        memory = "" if r.peak_memory_gib_max is None else (
            f"{r.peak_memory_gib_max:.1f}/{r.hbm_gib:.0f}" + ("" if r.fits_in_hbm else " OVER"))
        table.add_row(r.case, r.label, r.metric, _figure(r.published), _figure(r.predicted),
                      f"{r.error:+.1%}" if r.excluded is None else f"({r.error:+.1%})", memory)
    return table


def _figure(value: float) -> str:
    """A figure for the table: a whole number with thousands separators from 1,000 (``14,451``,
    not ``1.445e+04``), else four significant digits."""
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.4g}"
