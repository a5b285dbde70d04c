"""Checks that run before any schedule is generated, and the last check on results.

* :func:`check_structure`: the cheap structural limits (stages against layers) and an estimate
  of the work, in simulated tasks, refused above a ceiling (:data:`MAX_TASKS`, overridable with
  ``--max-tasks``). A schedule's generation, lowering and simulation all grow with its tasks, so
  ``--pp 512 --microbatches 100000`` is refused in milliseconds instead of running out of memory
  after minutes.
* :func:`check_applicable`: settings that do not apply to what runs. A setting that can only be a
  mistake (a flag given on the command line that no schedule or model uses) is an error; one that
  is harmless (the same setting in a scenario file, which may serve several schedule lists) is a
  warning. Physically odd but legal configurations (TP across nodes, TP above the KV heads,
  a node limit above the nodes an EP group spans) run, with a warning saying what they imply.
* :func:`check_finite`: no NaN or infinity reaches a table, a JSON row or a plot.

Warnings are :class:`simtrain.schedules.ScheduleWarning`, which the CLI prints as
``warning: ...`` lines.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterable

from .errors import SimtrainError
from .hardware import HardwareProfile
from .models import ModelSpec
from .parallel import ParallelConfig, flag_name, subject
from .schedules import REGISTRY, ScheduleWarning, split_name

MAX_TASKS = 2_000_000
"""Default ceiling on the estimated tasks of one command (all schedules and sweep points). The
engine runs ~5,000-10,000 tasks/s on one core here (benchmarks/bench_engine.py), so this is a few
minutes of simulation and a few GB of trace; above it ``--max-tasks`` must say so."""

MAX_OP_TIME_S = 1e6
"""Largest fixed op-time (``--op-times``, a scenario's ``op_times``): 11 days per action. Larger
values can only be a mistake, and near 1e308 the step time overflows to infinity."""


def op_times_ok(values) -> bool:
    """Whether ``values`` are fixed op-times as ``--op-times``, a scenario's ``op_times`` and the
    API's ``op_times`` take them: three numbers F, I, W in seconds, each from 0 to
    :data:`MAX_OP_TIME_S` (NaN fails), at least one > 0."""
    return len(values) == 3 and all(0 <= v <= MAX_OP_TIME_S for v in values) and sum(values) > 0


def check_schedule_names(names: list[str], where: str) -> None:
    """Refuse an unknown schedule name (:func:`simtrain.schedules.split_name`) or one given twice.

    Raises:
        SimtrainError: one line starting with ``where`` (the flag, field or argument).
    """
    for n in names:
        try:
            split_name(n)
        except SimtrainError as exc:
            raise SimtrainError(f"{where}: {exc}") from None
    twice = [n for n in names if names.count(n) > 1]
    if twice:
        raise SimtrainError(f"{where}: '{twice[0]}' is given twice")

_STAGES_PER_RANK = {"zbv": 2, "dualpipe": 2, "dualpipev": 2, "v-half": 2, "v-min": 2}
"""Stages per rank of the schedules with a fixed count above 1 (README, table of schedules)."""
_SPLIT_BACKWARD = {"interleaved-zb", "zb-h1", "zb-h2", "zbv", "dualpipe", "dualpipev", "v-half", "v-min"}
"""Schedules whose backward is split into I and W (three actions per stage and microbatch)."""
PAIRED = frozenset({"dualpipe", "dualpipev", "1f1b-overlap", "interleaved-1f1b-overlap"})
"""Schedules with overlapped F&B pairs, lowered layer by layer (simtrain.lowering)."""
EP_PAIRED = frozenset({"1f1b-overlap", "interleaved-1f1b-overlap"})
"""Paired schedules whose reference runs them only with expert parallelism (Megatron-Core's
combined 1F1B: ``TransformerConfig`` asserts ``expert_model_parallel_size > 1``)."""


def stages_and_chunks(name: str, pp: int, vp: int) -> tuple[int, int]:
    """Pipeline stages and distinct model chunks of schedule ``name`` on ``pp`` ranks.

    Returns:
        ``(stages, chunks)``: DualPipe's two directions hold the same ``pp`` chunks twice.
    """
    base, _ = split_name(name)
    per_rank = vp if REGISTRY[base].uses_vp else _STAGES_PER_RANK.get(base, 1)
    stages = pp * per_rank
    return stages, pp if base == "dualpipe" else stages


def estimate_actions(name: str, pp: int, microbatches: int, vp: int, forward_only: bool = False) -> int:
    """Actions (F, B, I, W) of schedule ``name``: stages x microbatches x passes."""
    stages, _ = stages_and_chunks(name, pp, vp)
    passes = 1 if forward_only else 3 if split_name(name)[0] in _SPLIT_BACKWARD else 2
    return stages * microbatches * passes


def estimate_tasks(name: str, model: ModelSpec, parallel: ParallelConfig) -> int:
    """An upper estimate of the tasks the engine simulates for ``name`` (schedule not generated).

    Per action: the action, its p2p transfer and its TP collective; plus, per MoE layer of the
    stage, attention, dispatch, experts and combine (three more per extra Waved-EP wave); plus,
    for F&B pairs, each layer of both halves and their TP collectives; per stage, its gradient
    buckets and optimizer step. Measured on the shipped models it is 1-6x the engine's count
    (tests/test_hostile.py).
    """
    base, variants = split_name(name)
    stages, chunks = stages_and_chunks(name, parallel.pp, parallel.vp)
    actions = estimate_actions(name, parallel.pp, parallel.microbatches, parallel.vp, parallel.forward_only)
    layers = math.ceil(model.num_layers / chunks)
    per_action = 3
    if model.moe is not None and parallel.ep > 1:
        waves = (parallel.waves or 4) if "waved-ep" in variants else 1
        per_action += layers * (4 + 3 * (waves - 1))
    if base in PAIRED:
        per_action += 2 * layers * (2 if parallel.tp > 1 else 1)
    per_stage = 2 * parallel.dp_buckets + 2  # gradient buckets (both DualPipe copies), optimizer step
    return actions * per_action + stages * per_stage


def check_max_tasks(max_tasks: object, where: str = "max_tasks") -> int:
    """``max_tasks`` (the task ceiling of the Python API and ``PlanRequest``) as an int >= 1.

    Raises:
        SimtrainError: a bool, a non-integer or a value below 1, named as ``where``.
    """
    if isinstance(max_tasks, bool) or not isinstance(max_tasks, int) or max_tasks < 1:
        raise SimtrainError(f"{where} = {max_tasks!r}: expected a whole number >= 1 (default {MAX_TASKS:,})")
    return max_tasks


def _refuse_work(total: int, max_tasks: int, what: str, api: bool = False, swept: str | None = None) -> None:
    """Refuse ``total`` estimated tasks above ``max_tasks``; the advice names the CLI's flags, or
    with ``api`` the Python API's arguments, and with ``swept`` (a sweep's field) its values first."""
    if total > max_tasks:
        others = [f for f in ("--microbatches", "--pp") if f != f"--{swept}"]
        lower = " or ".join([f"the sweep's {swept} values"] * bool(swept) + others)
        advice = (f"lower microbatches or pp, or pass max_tasks={total}" if api
                  else f"lower {lower}, or pass --max-tasks {total}")
        raise SimtrainError(
            f"{what} is about {total:,} tasks, above the ceiling of {max_tasks:,} (a few minutes and GB); "
            f"{advice} to run it anyway")


def check_structure(names: Iterable[str], model: ModelSpec, parallel: ParallelConfig,
                    max_tasks: int = MAX_TASKS, sweep: tuple[str, list[int]] | None = None,
                    api: bool = False, name: Callable[[str, object], str] = flag_name) -> int:
    """Refuse, before generating anything, schedules that cannot run or are too big to simulate.

    Args:
        names: schedule names (registry names with variants).
        model, parallel: what runs.
        max_tasks: the ceiling on the estimated tasks of all schedules (and sweep points).
        sweep: ``(field, values)`` of a sweep, whose every point is simulated too.
        api: the advice of a refusal names the Python API's arguments (``max_tasks=``), not
            the CLI's flags (``--max-tasks``).
        name: how a message names a parallel setting (default its flag, ``--pp 64``; a scenario
            file's loader names the file's field, :func:`simtrain.cli.settings.setting_name`).

    Returns:
        The estimated tasks (:func:`check_work`).

    Raises:
        SimtrainError: more stages than layers (naming pp, and vp, as ``name`` words them),
            a sequence that sequence parallelism cannot shard (:func:`check_sequence_parallel`),
            or too much work (:func:`check_work`).
    """
    names = list(names)
    for schedule in names:
        _check_layers(schedule, stages_and_chunks(schedule, parallel.pp, parallel.vp)[1], model, parallel, name)
    check_sequence_parallel(model, parallel)
    return check_work(names, model, parallel, max_tasks, sweep, api)


def check_work(names: list[str], model: ModelSpec, parallel: ParallelConfig, max_tasks: int = MAX_TASKS,
               sweep: tuple[str, list[int]] | None = None, api: bool = False) -> int:
    """Refuse a run whose work is above ``max_tasks``: the per-layer costs every run builds, and
    the estimated tasks of all schedules and sweep points (:func:`estimate_tasks`). Arguments as
    :func:`check_structure`'s; no ``names`` (a schedule imported or measured alone) is one run.

    Returns:
        The estimated tasks.

    Raises:
        SimtrainError: more layers than ``max_tasks`` (their costs are built per run), or an
            estimate above ``max_tasks``.
    """
    points = [parallel] + ([parallel.model_copy(update={sweep[0]: v}) for v in sweep[1]] if sweep else [])
    _check_layer_work(model, max(len(names), 1) * len(points), max_tasks, api)  # an imported order alone: 1 run
    total = sum(estimate_tasks(name, model, point) for point in points for name in names)
    parts = {"pp": f"pp {parallel.pp}", "microbatches": f"{parallel.microbatches} microbatches"}
    if sweep:  # the swept field's base value is not simulated: its sweep values are
        parts[sweep[0]] = f"sweep {sweep[0]}={','.join(str(v) for v in sweep[1])} ({len(sweep[1])} points)"
    where = ", ".join(parts.values())
    _refuse_work(total, max_tasks, f"simulating {', '.join(names) or 'the schedule'} at {where}", api,
                 sweep[0] if sweep else None)
    return total


def check_sequence_parallel(model: ModelSpec, parallel: ParallelConfig) -> None:
    """Refuse sequence parallelism (on by default with tp > 1) over a sequence share that tp
    does not divide: it shards each GPU's ``seq_len / cp`` tokens over the tp GPUs (Megatron-LM
    ``arguments.py`` asserts ``seq_length % tensor_model_parallel_size == 0`` with
    ``--sequence-parallel``). A ``seq_len`` that ``cp`` does not divide is
    :func:`simtrain.costs.context.check_context_parallel`'s to refuse.

    Raises:
        SimtrainError: naming seq_len, tp and how to fix it.
    """
    s, tp, cp = parallel.seq_len or model.seq_len, parallel.tp, parallel.cp
    if not parallel.sequence_parallel or tp == 1 or s % cp or (s // cp) % tp == 0:
        return
    where = f"seq_len = {s}" + ("" if parallel.seq_len else f" (model {model.name}'s default)")
    share = f" / cp {cp} = {s // cp} tokens per GPU" if cp > 1 else ""
    raise SimtrainError(f"{where}{share} with tp = {tp} and sequence parallelism (the default with tp > 1): tp must "
                        f"divide it, as Megatron-LM asserts; give a seq_len that is a multiple of {tp * cp}, or "
                        "sequence_parallel: false")


def _check_layer_work(model: ModelSpec, runs: int, max_tasks: int, api: bool) -> None:
    """Refuse a model whose per-layer costs alone are more work than ``max_tasks`` tasks.

    Every run (schedule and sweep point) builds the costs of each of the model's layers (and MTP
    blocks) before anything is simulated, at ~0.1 ms a layer here (30,000 layers of a small
    model: ~3.6 s, ``simtrain compare``), about one simulated task's work (the engine's
    5,000-10,000 tasks/s, :data:`MAX_TASKS`); so ``runs x layers`` is held to the same ceiling.

    Raises:
        SimtrainError: naming the model's ``num_layers`` field, its value and the ceiling.
    """
    layers = model.num_layers + model.mtp_depth
    if runs * layers > max_tasks:
        advice = f"max_tasks={runs * layers}" if api else f"--max-tasks {runs * layers}"
        raise SimtrainError(
            f"model {model.name}: field 'num_layers' = {model.num_layers}: every run builds each layer's costs "
            f"(about one simulated task's work), and {runs} run(s) x {layers:,} layers is above the ceiling of "
            f"{max_tasks:,} tasks; use fewer layers, or pass {advice} to run it anyway")


def _check_layers(schedule: str, chunks: int, model: ModelSpec, parallel: ParallelConfig,
                  name: Callable[[str, object], str]) -> None:
    """Refuse ``schedule``'s ``chunks`` model chunks (pp x vp, 2 pp for DualPipe) above the model's
    layers, naming pp (and vp) as ``name`` words them. Raises SimtrainError."""
    if chunks <= model.num_layers:
        return
    said = name("pp", parallel.pp) + (f" with {name('vp', parallel.vp)}" if parallel.vp > 1 else "")
    raise SimtrainError(f"{said}: {schedule} needs {chunks} pipeline stages for a model of {model.num_layers} layers "
                        f"({model.name}): each stage needs at least one layer; lower pp" + (" or vp" if parallel.vp > 1 else ""))


def check_imported(actions: int, max_tasks: int, source: str) -> None:
    """Refuse an imported schedule (``--schedule-file``) whose ``actions`` would simulate as more
    than ``max_tasks`` tasks (three per action: the action, its p2p transfer, its TP collective).

    Raises:
        SimtrainError: naming the file and the estimate.
    """
    _refuse_work(3 * actions, max_tasks, f"--schedule-file {source} ({actions:,} actions)")


def check_export(name: str, pp: int, microbatches: int, vp: int, max_tasks: int = MAX_TASKS) -> None:
    """Refuse an ``export-schedule`` whose actions exceed ``max_tasks``, and ``--vp`` on a
    schedule without virtual stages, before generating it.

    Raises:
        SimtrainError: the estimate is too large, or ``--vp`` > 1 does not apply.
    """
    base, _ = split_name(name)
    if vp > 1 and not REGISTRY[base].uses_vp:
        raise SimtrainError(f"--vp {vp}: {name} has no virtual stages; --vp applies to {_vp_schedules()}")
    _refuse_work(estimate_actions(name, pp, microbatches, vp), max_tasks,
                 f"{name} at pp {pp}, {microbatches} microbatches")


def _vp_schedules() -> str:
    return ", ".join(n for n, info in REGISTRY.items() if info.uses_vp)


def _not_applicable(field: str, parallel: ParallelConfig, given: set[str], why: str,
                    name: Callable[[str, object], str]) -> None:
    """An error for a setting the user gave (a flag, an API argument); a warning for the same
    setting in a scenario file. ``name`` words it (:func:`check_applicable`)."""
    said = name(field, getattr(parallel, field))
    if field in given:
        raise SimtrainError(f"{said}: {why}")
    warnings.warn(f"{said} is ignored: {why}", ScheduleWarning, stacklevel=2)


def check_applicable(names: list[str], model: ModelSpec, hardware: HardwareProfile, parallel: ParallelConfig,
                     given: set[str], imported: bool = False,
                     name: Callable[[str, object], str] = flag_name) -> None:
    """Refuse flags that do not apply, and warn about settings that are legal but odd.

    Args:
        names: the schedules that will run.
        model, hardware, parallel: what runs where.
        given: ParallelConfig fields given as command-line flags (the rest came from a scenario
            file or the defaults).
        imported: a schedule file runs too (its stages per rank are the file's, whatever ``vp``).
        name: how a warning names a setting, from its field and value (default: the flag,
            ``--tp 16``; a scenario file's loader names the file's field,
            :func:`simtrain.cli.settings.setting_name`).

    Raises:
        SimtrainError: a flag that applies to none of ``names`` or not to the model.
    """
    bases = [split_name(n) for n in names]
    if parallel.vp > 1 and (names or imported) and not any(REGISTRY[b].uses_vp for b, _ in bases):
        what = f"none of {', '.join(names)} has virtual stages" if names else \
            "the schedule file places its stages itself"
        _not_applicable("vp", parallel, given, f"{what}; virtual stages apply to {_vp_schedules()}", name)
    if parallel.waves is not None and names and not any("waved-ep" in v for _, v in bases):
        _not_applicable("waves", parallel, given, f"none of {', '.join(names)} uses Waved-EP; "
                        "add '+waved-ep' to a schedule name, e.g. 1f1b+waved-ep", name)
    moe = model.moe is not None and parallel.ep > 1
    defaults = ParallelConfig()
    for field in ("node_limit", "expert_imbalance", "dispatch_dtype", "a2a_links", "moe_coarsen", "ep_kernel"):
        if not moe and getattr(parallel, field) != getattr(defaults, field):
            why = (f"{model.name} has no experts" if model.moe is None else
                   f"it needs expert parallelism (ep > 1; {name('ep', parallel.ep)})")
            _not_applicable(field, parallel, given, f"applies to MoE all-to-all only, and {why}", name)
    _check_settings_apply(names, parallel, given, name)
    for field, off, why in (("expert_gemm", model.moe is None, "no experts, so no expert GEMMs"),
                            ("rope_fusion", model.learned_positions, "learned positions, so no rotary"),
                            ("bias_dropout_fusion", not model.bias, "no linear biases, so no bias add")):
        if off and getattr(parallel, field) != getattr(defaults, field):
            _not_applicable(field, parallel, given, f"{model.name} has {why} to price", name)
    for sched in [n for n, _ in bases if n in EP_PAIRED] if not moe else []:
        _warn(f"{sched}: Megatron-Core's combined 1F1B (--overlap-moe-expert-parallel-comm) needs expert "
              f"parallelism, and {model.name} " + ("has no experts" if model.moe is None else f"runs with {name('ep', parallel.ep)}")
              + ": there is no all-to-all to hide; its F&B pairs are lowered as DualPipe's (layer by layer, "
              "each half's TP collectives behind the other half's compute)")
    gpn = hardware.gpus_per_node
    if moe:
        warn_unbound_node_limit(parallel.node_limit, parallel.ep, gpn, name("node_limit", parallel.node_limit))
    if parallel.tp > gpn:
        _warn(f"{name('tp', parallel.tp)} > {gpn} GPUs per node of {hardware.name}: each TP group spans "
              f"{math.ceil(parallel.tp / gpn)} nodes, so its collectives, on the critical path of every layer, run over "
              f"{hardware.inter_node.name} ({hardware.nic_bandwidth_per_gpu_bytes_per_s / 1e9:.0f} GB/s per GPU "
              f"instead of {hardware.intra_node.bandwidth_bytes_per_s / 1e9:.0f} GB/s NVLink); see exposed comm")
    elif gpn % parallel.tp:
        _warn(f"{name('tp', parallel.tp)} does not divide the {gpn} GPUs per node of {hardware.name}: some TP groups "
              "straddle two nodes, and their collectives run over the inter-node network")
    if parallel.tp > model.kv_heads:
        _warn(f"{name('tp', parallel.tp)} > the {model.kv_heads} KV heads of {model.name}: each KV head is replicated on "
              f"{parallel.tp // model.kv_heads} GPUs (Megatron-LM), while simtrain divides the K/V projections by "
              "tp, so their FLOPs and memory are underestimated")


def _check_settings_apply(names: list[str], parallel: ParallelConfig, given: set[str],
                          name: Callable[[str, object], str] = flag_name) -> None:
    """The settings of TP overlap, offload, split-backward buffers and the DP reduction that
    would change nothing: an error when typed, a warning in a scenario file (:func:`_not_applicable`)."""
    if parallel.tp_overlap and parallel.tp == 1:
        _not_applicable("tp_overlap", parallel, given,
                        f"there are no TP collectives to hide with {name('tp', parallel.tp)}", name)
    if parallel.offload_fraction > 0 and parallel.forward_only:
        _not_applicable("offload", parallel, given, "a forward-only step keeps no activations for a backward", name)
    if parallel.w_pending != "gemm-io" and names and not any(split_name(n)[0] in _SPLIT_BACKWARD for n in names):
        _not_applicable("w_pending", parallel, given, f"none of {', '.join(names)} splits the backward "
                        "into I and W, so nothing waits for a W", name)
    if parallel.grad_reduce_op is not None and parallel.dp == 1:
        _not_applicable("grad_reduce_op", parallel, given,
                        f"there is no DP gradient reduction with {name('dp', parallel.dp)}", name)
    if parallel.cp_impl == "torch" and parallel.cp == 1:
        _not_applicable("cp_impl", parallel, given, "torch prices torch's context-parallel merges and rotations, "
                        f"and {name('cp', parallel.cp)} runs no context parallelism", name)
    if parallel.zero_impl == "fsdp2" and parallel.zero_stage < 2:
        _not_applicable("zero_impl", parallel, given, f"fsdp2 prices FSDP2's copy-out of gathered parameters, and "
                        f"{name('zero_stage', parallel.zero_stage)} keeps every parameter whole (FSDP2 shards gradients "
                        "too: ZeRO-2 or 3)", name)
    elif parallel.zero_impl == "fsdp2" and parallel.zero_stage == 2:
        _warn("zero_impl fsdp2 with zero_stage 2 (FSDP2 with reshard_after_forward False): the parameters stay "
              "gathered from a step's first forward to its last backward, so FSDP2 copies them out of the all-gather "
              "buffer once per step, not before every F and I as under ZeRO-3 (FSDPParamGroup.unshard is a no-op "
              "while they are unsharded, torch fully_shard's _fsdp_param_group.py); that one copy per step is not priced")


def check_simplified(fixed_times: str | None, free_comm: str | None, typed: dict[str, object],
                     name: Callable[[str, object], str] | None = None) -> None:
    """Refuse typed flags that only price what fixed op-times replace or what free communication
    removes, so they would change nothing.

    Args:
        fixed_times: where fixed op-times come from (``--op-times``, a scenario's field), or None.
        free_comm: where communication is made free (``--no-comm``, a scenario's field), or None.
        typed: the flags the user typed (None: not typed): ``--cost-model`` (other than auto),
            ``--recompute`` operator lists (memory is kept as for ``none``; only I is priced),
            ``--fp8``, ``--breakdown``, ``--attention-kernel``, ``--kernels`` (given only where it
            moves durations alone: ``compiled-blocks``; ``eager`` also sets the stored
            activations), ``--fused-projections`` (the API's ``fused_projections=False``; no flag),
            ``--tp-overlap`` and ``--tp-overlap-fraction``.

        name: how a message names a setting from its field and value (None: the flag, as typed;
            the Python API passes :func:`simtrain.api.argument_name`).

    Raises:
        SimtrainError: the first such flag, naming what makes it idle.
    """
    def said(flag: str, value: object) -> str:
        return f"{flag} {value}" if name is None else name(flag.lstrip("-").replace("-", "_"), value)

    if fixed_times is not None:
        for flag in ("--cost-model", "--recompute", "--fp8", "--breakdown", "--attention-kernel", "--kernels",
                     "--fused-projections"):
            if typed.get(flag) is not None:
                raise SimtrainError(f"{said(flag, typed[flag])}: changes only the compute cost model's durations, and "
                                    f"{fixed_times} fixes every duration; drop one of them")
    if free_comm is not None:
        for flag in ("--tp-overlap", "--tp-overlap-fraction"):
            if typed.get(flag) is not None:
                raise SimtrainError(f"{flag if name is None else said(flag, typed[flag])}: hides TP collectives behind "
                                    f"compute, and {free_comm} makes every collective free; drop one of them")


def check_dtype(hardware: HardwareProfile, parallel: ParallelConfig, ops: bool, default: bool,
                name: Callable[[str, object], str] = flag_name) -> None:
    """Refuse a compute dtype the hardware cannot price, before anything runs: one the profile
    lists no peak rate for, or (where the per-operator model's kernel tables are read: ``ops``,
    or a profile with tables) one without a GEMM table.

    Args:
        hardware, parallel: where it runs, and how.
        ops: the per-operator cost model runs.
        default: the dtype is the default (``bf16``), given nowhere.
        name: how the message names the setting, from its field and value (the flag ``--dtype
            fp16``, a scenario file's field, an API argument: :func:`check_applicable`'s ``name``).

    Raises:
        SimtrainError: naming the setting (or the default, and how to set it), the value and the
            dtypes allowed on ``hardware``.
    """
    from .costs.kernels import has_kernel_tables, rates_for

    allowed = set(hardware.peak_flops)
    if ops or has_kernel_tables(hardware):
        allowed &= set(rates_for(hardware).gemm)
    if parallel.dtype in allowed:
        return
    choices = ", ".join(sorted(allowed))
    if default:
        example = min(allowed, key=lambda d: (d != "fp16", d)) if allowed else None
        raise SimtrainError(f"{hardware.name} has no {parallel.dtype} rate, the default compute dtype; set the dtype "
                            f"to one of {choices}" + (f" (e.g. {name('dtype', example)})" if example else ""))
    raise SimtrainError(f"{subject(name, 'dtype', parallel.dtype)}: {hardware.name} can be priced in {choices}")


def warn_unbound_node_limit(node_limit: int | None, ep: int, gpus_per_node: int, said: str) -> None:
    """Warn (:class:`ScheduleWarning`) that a node limit (DeepSeek-V3 §2.1.2's M) of at least the
    nodes an EP group of ``ep`` GPUs spans never binds; ``said`` names the setting (``--node-limit 4``).
    ``compare`` and ``collective dispatch``/``combine`` both check it here."""
    nodes = math.ceil(ep / gpus_per_node)
    if node_limit is not None and node_limit >= nodes:
        warnings.warn(f"{said}: an EP group of {ep} GPUs spans {nodes} node(s) of {gpus_per_node} GPUs, so the limit "
                      "never binds; the result is that of no node limit", ScheduleWarning, stacklevel=3)


def _warn(message: str) -> None:
    warnings.warn(message, ScheduleWarning, stacklevel=3)


def check_finite(value, where: str, path: str = "") -> None:
    """Refuse a result holding NaN or infinity anywhere (dicts, lists, floats).

    Args:
        value: a result row (dict), a list of rows, or a number.
        where: what it is, for the message (e.g. ``"1f1b"``).

    Raises:
        SimtrainError: naming the field and value; such a number would print as ``nan`` / ``inf``
            and make the JSON invalid.
    """
    stack = [(path, value)]
    while stack:
        name, v = stack.pop()
        if isinstance(v, dict):
            stack.extend((f"{name}.{k}" if name else str(k), x) for k, x in v.items())
        elif isinstance(v, (list, tuple)):
            stack.extend((f"{name}[{i}]", x) for i, x in enumerate(v))
        elif isinstance(v, float) and not math.isfinite(v):
            raise SimtrainError(
                f"{where}: the simulation produced {name} = {v}; refusing to report a non-finite result "
                "(an input is outside what the cost model can represent: check the profile's and model's numbers)")
