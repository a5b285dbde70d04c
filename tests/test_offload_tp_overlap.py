"""Activation offload (PipeOffload, Wan et al., ICML 2025) and TP-communication overlap (Megatron's
--tp-comm-overlap), also under one hardware work queue (CUDA_DEVICE_MAX_CONNECTIONS, whose own
tests are tests/test_hardware_queues.py): each against its formula, the lanes of the dashboard and
the error lines of impossible values."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from conftest import SMALL, invoke
from simtrain.hardware import load_profile
from simtrain.lowering.offload import MIN_STEPS_BETWEEN
from simtrain.models import load_model
from simtrain.parallel import ParallelConfig
from simtrain.scenario import run_schedule

MODEL = load_model("llama3-8b")
H100 = load_profile("h100-sxm")
OP_TIMES = (0.05, 0.05, 0.05)  # F, I, W seconds: long enough to hide every copy of these sizes


def _run(schedule: str = "1f1b", hardware=H100, op_times=OP_TIMES, **kw):
    return run_schedule(schedule, MODEL, hardware, ParallelConfig(seq_len=2048, **kw), op_times=op_times)


@pytest.mark.parametrize("fraction", [0.25, 1.0])
def test_offloaded_bytes_and_copy_seconds_follow_the_pcie_formula(fraction):
    """Each copy moves fraction x the chunk's saved activation bytes, in bytes / PCIe bandwidth
    (the profile's pcie figure: 64 GB/s per direction for H100's Gen5 x16, latency 0)."""
    run = _run(pp=4, tp=2, microbatches=8, offload=f"activations={fraction}")
    trace = run.result.trace
    copies = trace[trace["kind"] == "offload"]
    assert len(copies) > 0 and set(copies["stream"]) == {"offload", "reload"}
    assert H100.host_link.bandwidth_bytes_per_s == 64e9
    for _, row in copies.iterrows():
        expected = fraction * run.costs.chunks[int(row["stage"])].activation_bytes
        assert row["bytes"] == pytest.approx(expected)
        assert row["end_s"] - row["start_s"] == pytest.approx(expected / 64e9)
    assert (copies["stream"] == "offload").sum() == (copies["stream"] == "reload").sum()


def test_hidden_copies_lower_the_peak_by_the_offloaded_activations_and_keep_the_step_time():
    """1F1B, p = 8, copies hidden by compute: rank r holds p - r activations at its peak; the
    copies of all but three of them are done by then (the next one is in flight, and the first
    backward's reload is prefetched), so the peak drops by max(0, p - r - 3) x the offloaded
    bytes; the step time is unchanged."""
    p = 8
    base, off = (_run(pp=p, tp=2, microbatches=2 * p, offload=o) for o in ("none", "activations"))
    assert off.report.step_time_s == pytest.approx(base.report.step_time_s)
    x = base.costs.chunks[0].activation_bytes
    drops = [(b - o) / x for b, o in zip(base.report.peak_memory_bytes, off.report.peak_memory_bytes)]
    assert drops == pytest.approx([max(0, p - r - 3) for r in range(p)])


def test_an_activation_needed_soon_stays_on_the_gpu():
    """The last stage of 1F1B runs each backward right after its forward: nothing to hide a copy
    behind, so it offloads nothing (PipeOffload's selective offload); the first stage offloads
    every microbatch whose backward comes MIN_STEPS_BETWEEN or more steps later."""
    trace = _run(pp=4, microbatches=8, offload="activations").result.trace
    out = trace[(trace["kind"] == "offload") & (trace["stream"] == "offload")]
    assert 3 not in set(out["rank"])
    order = run_schedule("1f1b", MODEL, H100, ParallelConfig(pp=4, microbatches=8, seq_len=2048),
                         op_times=OP_TIMES).schedule.orders[0]
    names = [str(a) for a in order]
    expected = {f"offload {a}" for i, a in enumerate(order) if a.kind == "F"
                and names.index(str(a).replace("F", "B")) - i - 1 >= MIN_STEPS_BETWEEN}
    assert set(out[out["rank"] == 0]["name"]) == expected and expected


@pytest.mark.parametrize("schedule,kw", [("gpipe", {}), ("interleaved-1f1b", dict(vp=2)), ("zbv", {}),
                                         ("dualpipev", dict(dp=2)), ("dualpipe", {}), ("zbv", dict(zero_stage=2, dp=2)),
                                         ("1f1b", dict(zero_stage=3, dp=2))])
@pytest.mark.parametrize("queues", [None, 1])
def test_copies_follow_their_actions_in_every_schedule(schedule, kw, queues):
    """Virtual stages, split backwards (I first), F&B pairs and ZeRO-2/3 lower without deadlock:
    each offload starts when its F has ended and each backward starts after its reload ended."""
    trace = _run(schedule, pp=4, tp=2, microbatches=8, offload="activations=0.5", hardware_queues=queues,
                 **kw).result.trace
    copies = trace[trace["kind"] == "offload"]
    assert len(copies) > 0
    compute = trace[trace["category"] == "compute"]
    for _, c in copies.iterrows():
        kind = re.fullmatch(r"(offload|reload) \d+([FBI])\d+", c["name"]).group(2)
        mine = compute[(compute["stage"] == c["stage"]) & (compute["microbatch"] == c["microbatch"])
                       & (compute["kind"] == kind)]
        if kind == "F":
            assert c["start_s"] >= mine["end_s"].max() - 1e-12
        else:
            assert mine["start_s"].min() >= c["end_s"] - 1e-12


def test_slow_copies_show_in_the_step_time():
    """A PCIe link far too slow for the activations (1 GB/s) delays the backwards that wait for
    their reloads."""
    slow = dataclasses.replace(H100, host_link=dataclasses.replace(H100.host_link, bandwidth_bytes_per_s=1e9))
    base = _run(pp=4, microbatches=8)
    assert _run(hardware=slow, pp=4, microbatches=8, offload="activations").report.step_time_s > \
        base.report.step_time_s * 1.5


def test_offload_does_nothing_without_a_backward_and_defaults_change_nothing():
    fwd = _run(pp=2, microbatches=4, offload="activations", forward_only=True).result.trace
    assert not (fwd["kind"] == "offload").any()
    plain = _run(pp=2, microbatches=4).result.trace
    explicit = _run(pp=2, microbatches=4, offload="none", tp_overlap=False, hardware_queues=8).result.trace
    assert plain.equals(explicit)


@pytest.mark.parametrize("exposed_share", [0.0, H100.tp_exposed_fraction])
@pytest.mark.parametrize("fraction", [1.0, 0.1])
def test_tp_overlap_hides_the_smaller_of_the_collective_and_the_overlap_window(fraction, exposed_share):
    """Exposed TP time of each action = max(TP - fraction x the action's linear-GEMM seconds (F's,
    or B's = I's + W's), the profile's tp_exposed_fraction x TP, 0)."""
    hw = dataclasses.replace(H100, tp_exposed_fraction=exposed_share)
    kw = dict(pp=2, tp=8, microbatches=4, hardware=hw)
    plain = _run(op_times=None, **kw)
    over = _run(op_times=None, tp_overlap=True, tp_overlap_fraction=fraction, **kw)
    a, b = (r.result.trace for r in (plain, over))
    tp_a = a[a["kind"] == "tp"].set_index("name")
    tp_b = b[b["kind"] == "tp"].set_index("name")
    chunks = plain.costs.chunks
    for name, row in tp_a.iterrows():
        action = name.split(" ", 1)[1]
        c = chunks[int(row["stage"])]
        compute = {"F": c.gemm_s[0], "B": c.gemm_s[1] + c.gemm_s[2]}[next(ch for ch in action if ch.isalpha())]
        tp = row["end_s"] - row["start_s"]
        exposed = max(tp - fraction * compute, exposed_share * tp, 0.0)
        got = tp_b.loc[name, "end_s"] - tp_b.loc[name, "start_s"] if name in tp_b.index else 0.0
        assert got == pytest.approx(exposed, abs=1e-12)
        assert got >= exposed_share * tp - 1e-12
    assert over.report.step_time_s < plain.report.step_time_s


def test_the_exposed_tp_share_is_the_cited_kernel_measurement_per_gpu_kind():
    """overlap.tp_exposed_fraction: bytedance/flux docs/performance_report.md, 8 GPUs, TP 8,
    M 4096, K 12288, N 49152, exposed / NCCL-alone ms of AG+GEMM and GEMM+RS, averaged: H800
    (SM90: every Hopper profile) and A800 (SM80: A100); no measurement, no exposed share."""
    hopper = (0.143 / 0.583 + 0.111 / 0.590) / 2
    ampere = (0.091 / 0.662 + 0.080 / 0.646) / 2
    for name in ("h100-sxm", "h100-sxm-96gb", "h200-sxm", "h800"):
        assert load_profile(name).tp_exposed_fraction == pytest.approx(hopper, abs=0.005)
    assert load_profile("a100-sxm-80gb").tp_exposed_fraction == pytest.approx(ampere, abs=0.005)
    assert load_profile("b200").tp_exposed_fraction == 0.0


def test_the_exposed_share_slows_a_step_whose_gemms_hide_all_of_its_tp():
    """Llama 3 8B at TP 8: its GEMMs are longer than its TP collectives, so share 0 hides them all;
    the Hopper share leaves 0.22 x TP of each action exposed: slower, still faster than no overlap."""
    kw = dict(pp=2, tp=8, microbatches=4, op_times=None)
    none = dataclasses.replace(H100, tp_exposed_fraction=0.0)
    full = _run(hardware=none, tp_overlap=True, **kw).report.step_time_s
    shared = _run(tp_overlap=True, **kw).report.step_time_s
    plain = _run(**kw).report.step_time_s
    assert full < shared < plain


def test_an_impossible_exposed_share_in_a_profile_is_one_error_line(tmp_path, monkeypatch):
    import yaml

    monkeypatch.chdir(tmp_path)
    data = yaml.safe_load(H100.path.read_text())
    data["overlap"]["tp_exposed_fraction"] = 1.5
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(data))
    res = invoke("compare", *SMALL, "--schedules", "1f1b", "--hardware", "bad.yaml")
    assert res.exit_code == 2, res.output
    assert "tp_exposed_fraction" in res.stderr and "Traceback" not in res.output
    assert len(res.stderr.strip().splitlines()) == 1


def test_the_gemm_window_is_the_linear_layers_share_of_the_compute():
    """Flat costs: each layer's linear GEMMs are 2 m K N FLOPs in each of F, I and W at the
    profile's GEMM rate (peak x matmul efficiency): a middle chunk's F window is its forward FLOPs
    less attention's, over that rate; the per-operator model sums its linear operators."""
    from simtrain.cost_models import parse_cost_choice
    from simtrain.costs.layers import linear_layers

    par = ParallelConfig(pp=4, tp=4, microbatches=4, seq_len=2048)
    flat = run_schedule("1f1b", MODEL, H100, par).costs.chunks[1]
    rate = H100.peak_flops["bf16"] * H100.matmul_efficiency
    linear_flops = sum(sum(2 * k * n * mult for k, n, mult in linear_layers(MODEL, i)) / 4 * 2048 for i in flat.layers)
    assert flat.gemm_s[0] == pytest.approx(linear_flops / rate)
    assert flat.gemm_s[0] == pytest.approx(flat.gemm_s[1]) == pytest.approx(flat.gemm_s[2])
    assert flat.gemm_s[0] < flat.forward_s
    ops = parse_cost_choice("ops", (), None, "flash", H100).runtime(MODEL, par, H100)
    c = run_schedule("1f1b", MODEL, H100, par, runtime=ops).costs.chunks[1]
    assert c.gemm_s is not None and 0 < c.gemm_s[0] < c.forward_s and 0 < c.gemm_s[1] < c.backward_input_s


def test_offload_has_its_own_lanes_and_colour():
    from simtrain.viz.style import color_of, name_of
    from simtrain.viz.timeline import timeline_figure

    fig = timeline_figure(_run(pp=4, microbatches=8, offload="activations").result.trace)
    bar = {t.name: t for t in fig.data}[name_of("offload")]
    assert bar.marker.color == color_of("offload") != color_of("unknown kind")
    assert {y.split(" · ")[1] for y in bar.y} == {"offload", "reload"}
    assert len({color_of(k) for k in ("offload", "zero", "cp", "dp", "tp", "exposed comm")}) == 6


@pytest.mark.parametrize("args,needle", [
    (["--offload", "activations=0"], "--offload = 'activations=0'"),
    (["--offload", "activations=1.5"], "FRACTION in (0, 1]"),
    (["--offload", "weights"], "--offload = 'weights'"),
    (["--offload", "activations", "--hardware", "b300"], "has no field 'pcie'"),
    (["--tp-overlap", "--tp-overlap-fraction", "2"], "--tp-overlap-fraction = 2.0"),
    (["--hardware-queues", "0"], "--hardware-queues = 0"),
])
def test_impossible_values_are_one_error_line(args, needle, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = invoke("compare", *SMALL, "--schedules", "1f1b", *args)
    assert res.exit_code == 2, res.output
    assert needle in res.stderr and "Traceback" not in res.output
    assert len(res.stderr.strip().splitlines()) == 1


def test_the_flags_run_from_the_command_line(tmp_path, monkeypatch):
    import json

    monkeypatch.chdir(tmp_path)
    rows = {}
    for label, extra in (("base", []), ("offload", ["--offload", "activations=0.25"]),
                         ("tp", ["--tp-overlap", "--hardware-queues", "1"])):
        res = invoke("compare", *SMALL, "--schedules", "1f1b", "--json", *extra)
        assert res.exit_code == 0, res.output
        rows[label] = json.loads(res.stdout)[0]
    assert rows["offload"]["peak_memory_bytes"][0] < rows["base"]["peak_memory_bytes"][0]
    assert rows["tp"]["step_time_s"] != rows["base"]["step_time_s"]


def test_a_tp_overlap_fraction_without_tp_overlap_is_refused():
    """--tp-overlap-fraction alone would be ignored: one error line instead."""
    from conftest import invoke

    res = invoke("compare", "--tp-overlap-fraction", "0.5", "--json")
    assert res.exit_code == 2 and res.output.count("error:") == 1
    assert "--tp-overlap-fraction = 0.5" in res.output and "tp_overlap_fraction applies only with tp_overlap" in res.output


def test_host_copies_are_not_gpu_communication_in_the_metrics():
    """Offload copies made in a bubble change neither the bubble, the exposed communication nor
    the overlap ratio (they are not GPU-to-GPU communication); the step time carries their cost."""
    from conftest import SMALL, invoke

    rows = [json.loads(invoke("compare", *SMALL, "--schedules", "1f1b", "--json", *extra).stdout)[0]
            for extra in ((), ("--offload", "activations=0.25"))]
    assert rows[1]["step_time_s"] == rows[0]["step_time_s"]  # copies hidden
    assert max(rows[1]["peak_memory_bytes"]) < max(rows[0]["peak_memory_bytes"])
    for key in ("bubble_ratio", "idle_ratio", "exposed_comm_s", "overlap_ratio"):
        assert rows[1][key] == pytest.approx(rows[0][key]), key


@pytest.mark.parametrize("args, message", [
    (("--tp-overlap", "--tp", "1"), "--tp-overlap True: there are no TP collectives to hide with --tp 1"),
    (("--offload", "activations", "--forward-only"), "--offload activations: a forward-only step keeps no activations"),
])
def test_settings_that_change_nothing_are_refused_on_the_command_line(args, message):
    from conftest import SMALL, invoke

    res = invoke("compare", *SMALL, "--schedules", "1f1b", "--json", *args)
    assert res.exit_code == 2 and res.output.count("error:") == 1 and message in res.output, res.output


def test_an_offload_that_lowers_no_peak_is_warned_about():
    """SMALL at FRACTION 0.5 keeps its no-offload peak (the copies end too late): a warning says
    so; at 0.25 the peak drops and nothing is said."""
    from conftest import SMALL, invoke

    def run(fraction):
        res = invoke("compare", *SMALL, "--schedules", "1f1b", "--json", "--offload", f"activations={fraction}")
        return res, json.loads(res.stdout)[0]

    base = json.loads(invoke("compare", *SMALL, "--schedules", "1f1b", "--json").stdout)[0]
    (quiet, low), (loud, same) = run(0.25), run(0.5)
    assert max(low["peak_memory_bytes"]) < max(base["peak_memory_bytes"]) and "warning: --offload" not in quiet.output
    assert max(same["peak_memory_bytes"]) == max(base["peak_memory_bytes"])
    assert "warning: --offload activations=0.5: 1f1b's highest peak" in loud.output
