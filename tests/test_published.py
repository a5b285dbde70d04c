"""The published-runs suite: its data file validates, every figure is predicted, errors are
predicted / published - 1, and `simtrain validate --published` prints them (JSON keys, bad input)."""

from __future__ import annotations

import dataclasses
import statistics
import json

import pytest
import yaml
from typer.testing import CliRunner

from simtrain.cli import app
from simtrain.costs.ops import published_runtime
from simtrain.errors import SimtrainError
from simtrain.published import load_suite, run_suite, suite_path, summarise


def test_the_suite_has_at_least_ten_figures_from_five_cases_with_sources():
    suite = load_suite()
    assert len(suite.cases) >= 5 and sum(len(c.figures) for c in suite.cases) >= 10
    assert all(c.source and c.figures for c in suite.cases)
    assert {"R1-megatron-175b", "R2-llama3-405b", "R3-torchtitan-llama3-8b-pp8", "korthikanti-2022-table5",
            "megatron-bridge-h100-fp8", "megatron-bridge-h100-2511-fp8",
            "megatron-bridge-h100-2511-moe-fp8"} <= {c.name for c in suite.cases}
    assert all(c.assumptions for c in suite.cases)



def test_megatron_bridge_figures_run_on_the_gpus_their_rows_name():
    """Each Megatron-Bridge figure's TP x PP x CP x DP is the table row's GPU count (in its label),
    and its EP groups fit the DP x TP GPUs of a stage (expert TP 1)."""
    import re

    from simtrain.published import _parallel_of

    figures = [(c, f) for c in load_suite().cases if c.name.startswith("megatron-bridge-") for f in c.figures]
    assert len(figures) >= 10
    for case, fig in figures:
        gpus = int(re.search(r"(\d+) GPUs", fig.label).group(1))
        p = _parallel_of(case, fig, fig.label)
        assert p.tp * p.pp * p.cp * p.dp == gpus, fig.label
        assert (p.dp * p.tp) % p.ep == 0, fig.label

def test_every_megatron_family_case_sets_the_rank_order_its_source_uses():
    """Megatron-LM, Megatron-Core, NeMo and Megatron-Bridge number ranks with PP outermost unless told
    otherwise, which is not simtrain's default without EP: every case run on them (named megatron-*,
    nemo-*, mlperf-*, korthikanti-*) sets rank_order on every figure, and an assumption that names
    the order (``rank_order X``) names the one the case runs."""
    import re

    from simtrain.published import _parallel_of

    family = [c for c in load_suite().cases if re.search(r"megatron|nemo|mlperf|korthikanti", c.name)]
    assert len(family) >= 20
    for case in family:
        orders = {_parallel_of(case, fig, fig.label).rank_order for fig in case.figures}
        assert None not in orders, case.name
        named = set(re.findall(r"rank_order (tp-[a-z]+-[a-z]+)", " ".join(case.assumptions)))
        assert named <= orders, (case.name, named, orders)


def test_rows_are_predicted_per_figure_with_the_relative_error():
    rows = run_suite(cases=["R1-megatron-175b"])
    assert [r.published for r in rows] == [153, 149, 141]
    for r in rows:
        assert r.predicted > 0 and r.error == pytest.approx(r.predicted / r.published - 1)
    # more GPUs at a fixed global batch: fewer microbatches per pipeline, a larger bubble
    assert rows[0].predicted > rows[1].predicted > rows[2].predicted
    s = summarise(rows)
    assert s["figures"] == 3 and s["cases"] == 1 and s["max_abs_error"] >= s["median_abs_error"]


def test_the_per_operator_model_moves_the_prediction():
    case = ["megatron-table1"]
    shipped, ops = run_suite(cases=case), run_suite(published_runtime, cases=case)
    assert all(o.predicted < s.predicted for o, s in zip(ops, shipped))  # memory-bound kernels cost time


def test_a_bad_suite_file_or_case_name_is_one_error(tmp_path):
    with pytest.raises(SimtrainError, match="not a case"):
        run_suite(cases=["nope"])
    data = yaml.safe_load(suite_path().read_text())
    data["cases"][0]["figures"][0]["metric"] = "speed"
    bad = tmp_path / "runs.yaml"
    bad.write_text(yaml.safe_dump(data))
    with pytest.raises(SimtrainError, match="metric"):
        load_suite(bad)
    data = yaml.safe_load(suite_path().read_text())
    data["cases"][0]["global_batch"] = 1000
    bad.write_text(yaml.safe_dump(data))
    with pytest.raises(SimtrainError, match="global batch 1000"):
        run_suite(path=bad, cases=["R1-megatron-175b"])


def test_an_excluded_figure_is_printed_but_kept_out_of_the_median_and_max(tmp_path):
    from simtrain.published import Row

    judged = [Row("a", "x", "step_time_s", 1.0, 1.1, 0.1), Row("b", "y", "step_time_s", 1.0, 0.8, -0.2)]
    regressed = Row("c", "z", "step_time_s", 1.0, 3.0, 2.0, excluded="the publisher's regression report")
    s = summarise(judged + [regressed])
    assert s["max_abs_error"] == pytest.approx(0.2) and s["median_abs_error"] == pytest.approx(0.15)
    assert s["figures"] == 2 and s["cases"] == 2 and s["excluded"] == 1
    assert regressed.to_row()["excluded"] == "the publisher's regression report" and judged[0].to_row()["excluded"] is None
    assert (s["speed_figures"], s["too_fast"], s["too_slow"]) == (2, 1, 1)  # step time 0.8 of 1.0: too fast
    assert s["median_speed_error"] == pytest.approx(statistics.median([1 / 1.1 - 1, 1 / 0.8 - 1]))
    tflops = Row("f", "u", "model_tflops", 100.0, 120.0, 0.2)
    memory = Row("g", "t", "peak_memory_gib", 60.0, 70.0, 1 / 6)
    assert tflops.speed_error == pytest.approx(0.2) and memory.speed_error is None
    assert summarise([tflops, memory])["speed_figures"] == 1
    with pytest.raises(ValueError):
        summarise([regressed])  # nothing left to judge
    # a judged training figure whose simulated peak exceeds HBM is counted (an excluded one is not)
    over = Row("d", "w", "step_time_s", 1.0, 1.0, 0.0, peak_memory_gib_max=90.0, hbm_gib=80.0, fits_in_hbm=False)
    fits = Row("e", "v", "step_time_s", 1.0, 1.0, 0.0, peak_memory_gib_max=70.0, hbm_gib=80.0, fits_in_hbm=True)
    gone = dataclasses.replace(over, excluded="a regression")
    assert summarise(judged + [over, fits, gone])["over_hbm"] == 1 and summarise(judged)["over_hbm"] == 0
    data = yaml.safe_load(suite_path().read_text())
    data["cases"][0]["figures"][0]["excluded"] = ""  # a reason is required
    bad = tmp_path / "runs.yaml"
    bad.write_text(yaml.safe_dump(data))
    with pytest.raises(SimtrainError, match="excluded"):
        load_suite(bad)


def test_validate_published_json_and_bad_flags(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    res = runner.invoke(app, ["validate", "--published", "--json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    assert len(rows) >= 10
    for r in rows:
        assert set(r) == {"case", "label", "metric", "published", "predicted", "error", "excluded", "kind",
                          "peak_memory_gib_max", "hbm_gib", "fits_in_hbm"}  # README's keys
        if r["kind"] == "training":
            assert r["peak_memory_gib_max"] > 0 and r["hbm_gib"] > 0
            assert r["fits_in_hbm"] == (r["peak_memory_gib_max"] <= r["hbm_gib"])
        else:
            assert r["peak_memory_gib_max"] is None and r["fits_in_hbm"] is None
    excluded = [r for r in rows if r["excluded"] is not None]
    assert excluded and all("Megatron-Bridge#1998" in r["excluded"] for r in excluded)
    kinds = {r["case"]: r["kind"] for r in rows}
    assert kinds["R5-nccl-allreduce-8gpu"] == kinds["R4-deepep-h800"] == "collective"
    assert kinds["R1-megatron-175b"] == "training" and set(kinds.values()) == {"training", "collective"}
    bad = runner.invoke(app, ["validate", "--published", "--cost-model", "magic"])
    assert bad.exit_code == 2 and "error: --cost-model" in bad.output
    missing = runner.invoke(app, ["validate"])
    assert missing.exit_code == 2 and "error: --profile is required" in missing.output


@pytest.mark.parametrize("args, named", [
    (["--published", "--steps", "5", "--device", "cuda"], "--device, --steps"),
    (["--published", "--profile", "cpu.yaml"], "--profile"),
    (["--cost-model", "ops"], "--cost-model = 'ops'"),
])
def test_validate_refuses_options_of_the_other_mode(args, named):
    """The torch run's options with --published (and --cost-model without it) are refused, not ignored."""
    res = CliRunner().invoke(app, ["validate", *args])
    assert res.exit_code == 2 and f"error: {named}" in res.output, res.output


def test_the_network_cases_are_the_collective_models_own_numbers(tmp_path):
    """R4 and R5 are priced by simtrain.deepep / simtrain.collectives alone, in GB/s."""
    from simtrain.collectives import estimate
    from simtrain.deepep import estimate_ep
    from simtrain.hardware import load_profile

    rows = {r.label: r for r in run_suite(cases=["R5-nccl-allreduce-8gpu", "R4-deepep-h800"])}
    assert len(rows) == 11
    ring = estimate("all-reduce", 8 * 2**30, load_profile("h100-sxm"), 8, algorithm="ring")
    assert rows["ring busbw, 8 GiB"].predicted == pytest.approx(ring.busbw_bytes_per_s / 1e9)
    ep16 = estimate_ep("dispatch", load_profile("h800"), 16, 4096, 7168, 8, "fp8", node_limit=4)
    assert rows["EP 16 dispatch"].predicted == pytest.approx(ep16.rdma_bytes_per_s / 1e9)
    for r in rows.values():
        assert r.error == pytest.approx(r.predicted / r.published - 1)
    data = yaml.safe_load(suite_path().read_text())
    del data["network"][1]["figures"][0]["tokens"]
    bad = tmp_path / "runs.yaml"
    bad.write_text(yaml.safe_dump(data))
    with pytest.raises(SimtrainError, match="R4-deepep-h800 figure 1 .*needs tokens, hidden and topk"):
        run_suite(path=bad, cases=["R4-deepep-h800"])


def _only(tmp_path, case_name, keep):
    """A copy of the suite with only ``case_name``'s figures whose label starts with one of ``keep``."""
    data = yaml.safe_load(suite_path().read_text())
    case = next(c for c in data["cases"] if c["name"] == case_name)
    case["figures"] = [f for f in case["figures"] if f["label"].startswith(keep)]
    path = tmp_path / "runs.yaml"
    path.write_text(yaml.safe_dump(data))
    return path, data, case


def test_a_case_with_fp8_gemms_runs_them_in_fp8_under_ops_and_as_dtype_fp8_under_flat(tmp_path):
    """Megatron-Bridge's H100 FP8 rows: --fp8 gemms for the per-operator model; the flat model,
    which has no per-GEMM precision, runs the case with dtype fp8."""
    from simtrain.hardware import load_profile
    from simtrain.models import load_model
    from simtrain.parallel import ParallelConfig
    from simtrain.scenario import run_schedule

    path, data, case = _only(tmp_path, "megatron-bridge-h100-fp8", ("Llama 3 70B",))
    [fp8] = run_suite(published_runtime, path=path, cases=[case["name"]])
    del case["fp8"]
    path.write_text(yaml.safe_dump(data))
    [bf16] = run_suite(published_runtime, path=path, cases=[case["name"]])
    assert fp8.predicted > 1.2 * bf16.predicted  # the linear layers' GEMMs at the FP8 rate
    case["fp8"] = "gemms"
    path.write_text(yaml.safe_dump(data))
    [flat] = run_suite(None, path=path, cases=[case["name"]])
    fig = case["figures"][0]
    model = load_model("llama3-70b").model_copy(update=dict(fig["model"], published_total_params=None))
    parallel = ParallelConfig(attention="flash", **{**case["settings"], **fig["settings"], "dtype": "fp8"})
    run = run_schedule(case["schedule"], model, load_profile("h100-sxm"), parallel)
    assert flat.predicted == pytest.approx(run.report.tokens_per_s / run.report.gpus)


def test_korthikanti_full_recompute_is_slower_than_sequence_parallel_plus_selective(tmp_path):
    """Table 5's two columns of one run: full recomputation without SP reruns every forward
    operator, SP + selective only the attention core, so the first step is the longer."""
    path, _, case = _only(tmp_path, "korthikanti-2022-table5", ("22B", "175B"))
    rows = {r.label: r for r in run_suite(published_runtime, path=path, cases=[case["name"]])}
    assert len(rows) == 4
    for size in ("22B", "175B"):
        assert rows[f"{size}, full recompute"].predicted > rows[f"{size}, SP + selective"].predicted


def test_bloom_prices_jean_zays_links_at_the_all_reduce_measured_on_its_a100_nodes():
    """bigscience experiments/bandwidth/all_reduce_bench-a100-n4.txt (358e3c8): a 4.0e9-byte fp32
    all-reduce over 4 nodes x 8 A100 took 1.529 s (median of trials 2-5), and NCCL_DEBUG shows its
    ring crossing each node through one NIC per direction. BLOOM's DP group (8 ranks, 2 a node)
    crosses through one NIC in simtrain, so it gets that busbw; a pipeline hop gets half a NIC."""
    from simtrain.collectives import Group, bus_factor, estimate_group
    from simtrain.network import Topology
    from simtrain.parallel import ParallelConfig
    from simtrain.published import _hardware_of

    measured_busbw = 4.0e9 / 1.529 * bus_factor("all-reduce", 32)
    case = next(c for c in load_suite().cases if c.name == "bloom-176b")
    hw = _hardware_of(case.hardware)
    dp = estimate_group("all-reduce", 14.7e9, hw, Group(gpus=8, per_node=2, nodes=4))
    assert dp.busbw_bytes_per_s == pytest.approx(measured_busbw, rel=0.01)
    hop = Topology(hw, ParallelConfig(tp=4, pp=12, dp=8, rank_order="tp-dp-pp")).p2p(0, 1)
    assert hop.resources[0].startswith("nic")
    assert hop.transfer_s(117e6) == pytest.approx(hw.inter_node.latency_s + 117e6 / (measured_busbw / 2), rel=0.01)


def test_the_eager_all_to_all_qwen3_step_is_the_hybridep_fp8_layout_in_bf16_over_nccl():
    """Megatron-Bridge#3868's eager run and the 26.04.01 FP8 row share Qwen3 30B-A3B at TP1 PP1
    EP16, MBS 1, GBS 1024 (64 microbatches over DP 16); the #3868 run is BF16 with NCCL's
    all-to-all (no flex backend), so its simulated step is the longer of the two, and the
    published step of the eager run (41.36 s) is the longer one too."""
    cases = ["megatron-bridge-h100-qwen3-a2a-eager", "megatron-bridge-h100-moe-fp8"]
    suite = {c.name: c for c in load_suite().cases}
    eager, fp8 = suite[cases[0]], suite[cases[1]].figures[0]
    [fig] = eager.figures
    assert eager.fp8 is None and fig.metric == "step_time_s"
    assert "ep_kernel" not in fig.settings and fp8.settings["ep_kernel"] == "fused"
    for key in ("tp", "pp", "dp", "ep", "microbatches"):
        assert fig.settings[key] == fp8.settings[key], key
    rows = {r.case: r for r in run_suite(published_runtime, cases=cases) if "30B" in r.label}
    fp8_step = 1024 * 4096 / (16 * rows[cases[1]].predicted)
    fp8_published_step = 1024 * 4096 / (16 * rows[cases[1]].published)
    assert rows[cases[0]].predicted > fp8_step and rows[cases[0]].published > fp8_published_step


def test_the_2509_token_drop_rows_are_balanced_routing_without_ep_overlap():
    """Megatron-Bridge 25.09 (v0.1.0rc3) ran both Qwen3 rows with apply_moe_token_drop: capacity
    factor 1.0, padded to capacity, so every expert gets exactly ceil(T k / E) rows, the mean of a
    balanced routing (expert_imbalance 1), and no EP overlap. The 30B-A3B row is the layout whose
    columns the 25.11 row carries (PP2 VP24 EP8, MBS 2, GBS 512); NVIDIA's Megatron-Bridge#1998
    calls the 25.11 dropless figure a 2x regression against it."""
    import math

    from simtrain.models import load_model
    from simtrain.published import _model_of, _parallel_of

    suite = {c.name: c for c in load_suite().cases}
    case, dropless = suite["megatron-bridge-h100-2509-moe-fp8"], suite["megatron-bridge-h100-2511-moe-fp8"]
    assert case.schedule == "interleaved-1f1b" and case.fp8 == "gemms"
    for fig in case.figures:
        model, p = _model_of(case, fig, fig.label), _parallel_of(case, fig, fig.label)
        tokens, moe = p.microbatch_size * p.seq_len, model.moe
        assert p.expert_imbalance == 1.0 and p.ep_kernel == "nccl" and fig.schedule is None
        assert math.ceil(tokens * moe.top_k / moe.num_experts * 1.0) == tokens * moe.top_k / moe.num_experts
    small = _parallel_of(case, case.figures[0], "30B")
    assert (small.pp, small.vp, small.ep, small.microbatch_size, small.microbatches) == (2, 24, 8, 2, 32)
    assert load_model(case.model).moe.num_experts == 128
    assert case.figures[0].value / dropless.figures[0].value > 1.9


def test_the_nemo_2407_rows_follow_the_launchers_rules():
    """NeMo 24.07 (NeMo-Framework-Launcher tag 24.07): each row runs on the GPUs its label names,
    CUDA_DEVICE_MAX_CONNECTIONS is 1 exactly when TP > 1 or CP > 1 (stages.py
    _cuda_device_max_connections), the vocabulary is padded to a multiple of 128 x TP, and the
    inline models keep their own attention heads (Llama 2 7B and GPT-3 5B have no GQA; the case's
    base model, Llama 3 8B, has 8 KV heads)."""
    import re

    from simtrain.published import _model_of, _parallel_of

    [case] = [c for c in load_suite().cases if c.name == "nemo-2407-h100-fp8"]
    assert len(case.figures) == 4 and case.fp8 == "gemms"
    for fig in case.figures:
        p, m = _parallel_of(case, fig, fig.label), _model_of(case, fig, fig.label)
        assert p.tp * p.pp * p.cp * p.dp == int(re.search(r"(\d+) GPUs", fig.label).group(1)), fig.label
        assert (p.hardware_queues == 1) == (p.tp > 1 or p.cp > 1), fig.label
        assert m.vocab_size % (128 * p.tp) == 0, fig.label
        if m.name in ("llama2-7b", "gpt3-5b"):
            assert m.num_kv_heads == m.num_heads, fig.label
def test_torchtitan_h100_figures_run_on_their_gpus_and_keep_the_tables_orderings():
    """torchtitan docs/performance.md Tables 1, 3, 4, 5: each figure's TP x PP x DP is the GPU
    count its label names, its global batch is the table's, and the simulated steps keep the
    orderings the tables measured: torch.compile faster than eager, Float8 faster than BF16,
    AsyncTP faster than TP, Interleaved 1F1B faster than 1F1B."""
    import re

    from simtrain.published import _parallel_of

    names = ["torchtitan-h100-bf16", "torchtitan-h100-float8"]
    suite = {c.name: c for c in load_suite().cases}
    for name in names:
        assert suite[name].hardware.profile == "h100-sxm-96gb"
        for fig in suite[name].figures:
            gpus = int(re.search(r"(\d+) GPUs", fig.label).group(1))
            p = _parallel_of(suite[name], fig, fig.label)
            assert p.tp * p.pp * p.cp * p.dp == gpus, fig.label
    rows = {r.label: r for r in run_suite(published_runtime, cases=names)}
    for gpus in (8, 128):
        t = "T1" if gpus == 8 else "T3"
        eager, compiled = rows[f"{t} 8B, {gpus} GPUs, FSDP (eager)"], rows[f"{t} 8B, {gpus} GPUs, FSDP + compile"]
        fp8 = rows[f"{t} 8B, {gpus} GPUs, FSDP + compile + Float8"]
        for published in (False, True):
            value = (lambda r: r.published) if published else (lambda r: r.predicted)
            assert value(eager) < value(compiled) < value(fp8), (gpus, published)
    tp, async_tp = rows["T4 70B, 256 GPUs, FSDP 32 TP 8"], rows["T4 70B, 256 GPUs, FSDP 32 TP 8 + AsyncTP"]
    one, interleaved = (rows[f"T5 405B, 512 GPUs, FSDP 8 TP 8 PP 8, {s}"] for s in ("1F1B", "Interleaved 1F1B"))
    for a, b in ((tp, async_tp), (one, interleaved)):
        assert a.predicted < b.predicted and a.published < b.published


def test_the_2021_megatron_and_mlperf_gpt3_rows_run_their_sources_layouts():
    """Narayanan et al. 2021 Table 1 / Table 2 rows and the MLPerf v3.1 GPT-3 rows: each figure's
    TP x PP x DP is the GPU count its label names, and every interleaved figure passes Megatron's
    own checks (microbatches divisible by PP, training.py; whole layers per model chunk), with
    the one chunk count whole layers allow for the 2021 rows (chunks = layers per rank)."""
    import re

    from simtrain.published import _model_of, _parallel_of

    names = ["megatron-table1-rest", "megatron-2021-table2-530b", "mlperf-v3.1-gpt3-175b-h100"]
    suite = {c.name: c for c in load_suite().cases}
    interleaved = 0
    for name in names:
        for fig in suite[name].figures:
            gpus = int(re.search(r"(\d+) GPUs", fig.label).group(1))
            p, model = _parallel_of(suite[name], fig, fig.label), _model_of(suite[name], fig, fig.label)
            assert p.tp * p.pp * p.cp * p.dp == gpus, fig.label
            if (fig.schedule or suite[name].schedule) == "interleaved-1f1b":
                interleaved += 1
                assert p.vp > 1 and p.microbatches % p.pp == 0, fig.label
                assert model.num_layers % (p.pp * p.vp) == 0, fig.label
                if name != "mlperf-v3.1-gpt3-175b-h100":
                    assert model.num_layers == p.pp * p.vp, fig.label  # one layer a chunk
    assert interleaved == 8


MLPERF_LOG_CASES = ["mlperf-v3.0-gpt3-175b-h100", "mlperf-v4.0-gpt3-175b-h100", "mlperf-v4.1-gpt3-175b-h100",
                    "mlperf-v4.1-gpt3-175b-h100-oci", "mlperf-v5.0-llama31-405b-h100", "mlperf-v5.1-llama31-405b-b200"]


def test_the_mlperf_result_log_cases_run_their_submissions_layouts_and_fit_in_hbm():
    """The MLPerf v3.0-v5.1 cases read from result logs: each label's nodes x the profile's GPUs per
    node is its GPU count and TP x PP x CP x DP; each interleaved figure passes Megatron's checks
    (microbatches divisible by PP; whole layers per chunk, or for Llama 3.1 405B's 126 layers the
    account_for_embedding/loss split, 126 + 2 = 2 per chunk); and every simulated step fits in
    HBM, since the runs ran."""
    import re

    from simtrain.published import _hardware_of, _model_of, _parallel_of

    suite = {c.name: c for c in load_suite().cases}
    for name in MLPERF_LOG_CASES:
        case = suite[name]
        per_node = _hardware_of(case.hardware).gpus_per_node
        for fig in case.figures:
            nodes, gpus = map(int, re.search(r"(\d+) nodes \((\d+) GPUs\)", fig.label).groups())
            p, model = _parallel_of(case, fig, fig.label), _model_of(case, fig, fig.label)
            assert nodes * per_node == gpus == p.tp * p.pp * p.cp * p.dp, fig.label
            assert case.schedule == "interleaved-1f1b" and p.microbatches % p.pp == 0, fig.label
            layers = model.num_layers + (2 if model.num_layers == 126 else 0)
            assert layers % (p.pp * p.vp) == 0, fig.label
    rows = run_suite(published_runtime, cases=MLPERF_LOG_CASES)
    assert len(rows) == 17 and all(r.fits_in_hbm for r in rows)



def test_the_mlperf_cases_overlap_the_parameter_all_gather_and_cite_where_their_configs_say_so():
    """Every MLPerf GPT-3 / Llama 3.1 405B case ran a distributed optimizer whose parameter
    all-gather overlaps the next step's forwards (Apex ``overlap_param_sync`` True by default in
    run_and_time.sh / ``distributed_fused_adam.yaml``; ``OVERLAP_PARAM_GATHER=True`` in the
    Llama config_common.sh): each figure's settings carry ``overlap_param_gather`` on ZeRO-1, and
    the case says where it comes from in an assumption line."""
    from simtrain.published import _parallel_of

    suite = {c.name: c for c in load_suite().cases}
    for name in ["mlperf-v3.1-gpt3-175b-h100", *MLPERF_LOG_CASES]:
        case = suite[name]
        for fig in case.figures:
            p = _parallel_of(case, fig, fig.label)
            assert p.overlap_param_gather and p.zero_stage == 1, fig.label
        assert any(a.startswith("parameter all-gather overlapped with the next step's forwards")
                   for a in case.assumptions), name


def test_rank_order_moves_a_tp4_mlperf_row_but_not_a_tp8_one(tmp_path):
    """NeMo's order (PP outermost, ``tp-dp-pp``) against simtrain's default ``tp-pp-dp``: with TP 4 on
    8-GPU nodes the order decides which GPUs share a node, so the GPT-3 step moves; with TP 8 a
    stage's TP group is a whole node either way, so the Llama 3.1 405B step is the same."""
    data = yaml.safe_load(suite_path().read_text())
    gpt3, llama = "mlperf-v4.1-gpt3-175b-h100", "mlperf-v5.0-llama31-405b-h100"
    cases = [c for c in data["cases"] if c["name"] in (gpt3, llama)]
    for c in cases:
        c["figures"] = c["figures"][:1]
    steps = {}
    for order in ("tp-dp-pp", "tp-pp-dp"):
        for c in cases:
            c["settings"]["rank_order"] = order
        path = tmp_path / f"{order}.yaml"
        path.write_text(yaml.safe_dump({"cases": cases}))
        steps[order] = {r.case: r.predicted for r in run_suite(published_runtime, path=path)}
    assert abs(steps["tp-dp-pp"][gpt3] / steps["tp-pp-dp"][gpt3] - 1) > 0.01
    assert steps["tp-dp-pp"][llama] == pytest.approx(steps["tp-pp-dp"][llama], rel=1e-9)
