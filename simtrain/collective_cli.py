"""``simtrain collective`` (the network model on its own) and ``simtrain calibrate --nccl-tests``.

Registered on the typer app by :mod:`simtrain.cli`. Units are converted here, at the edge: sizes
are read as nccl-tests writes them (``1M`` = 2**20 bytes), tables print us and GB/s (1e9), JSON
stays SI.
"""

from __future__ import annotations

import datetime
import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
import yaml
from rich.console import Console
from rich.table import Table

from . import atomic
from .checks import warn_unbound_node_limit
from .collectives import OPS, estimate
from .deepep import estimate_ep
from .errors import SimtrainError, load_yaml_file, validate_model
from .hardware import ProfileFile, load_profile, resolve_profile_path
from .nccl_tests import fit_profile, parse_log

out = Console(width=None if sys.stdout.isatty() else 160)
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
DEFAULT_SIZES = "1M,8M,64M,512M,1G,8G"
_EP_FLAGS = ("--ep", "--tokens", "--hidden", "--topk")
DEFAULT_EXPERTS = 256
"""``--experts`` when not given: DeepSeek-V3's 256 routed experts (DeepSeek-V3 §4.2), as DeepEP's tests route."""


def parse_sizes(text: str) -> list[int]:
    """``"1M,64M,1G"`` -> bytes (K/M/G/T are powers of 2, as nccl-tests' -b/-e read them).

    Raises:
        SimtrainError: an entry that is not a positive integer with an optional K/M/G/T suffix.
    """
    sizes = []
    for item in text.split(","):
        item = item.strip().upper().removesuffix("B")
        unit = item[-1:] if item[-1:] in _UNITS else ""
        number = item[: len(item) - len(unit)]
        if not number.isdigit() or int(number) < 1:
            raise SimtrainError(f"--sizes = {text!r}: expected comma-separated positive sizes such as 1M,64M,1G,8G "
                                "(K/M/G/T = 2**10/2**20/2**30/2**40 bytes)")
        sizes.append(int(number) * _UNITS[unit])
    return sizes


def _refuse(op: str, flags: dict[str, object], why: str) -> None:
    """Refuse the first of ``flags`` that was given (not None): it would change nothing for ``op``.

    Raises:
        SimtrainError: ``--flag: <why>, not <op>``.
    """
    for flag, value in flags.items():
        if value is not None:
            raise SimtrainError(f"{flag}: {why}, not {op}")


def _print_rows(rows: list[dict], title: str, columns: list[tuple[str, str, float, str]]) -> None:
    table = Table(title=title)
    for head, *_ in columns:
        table.add_column(head, justify="right")
    for r in rows:
        table.add_row(*(f"{r[key] * scale:{fmt}}" if isinstance(r[key], float) else str(r[key])
                        for _, key, scale, fmt in columns))
    out.print(table)


def collective(
    op: Annotated[str, typer.Argument(help=f"{', '.join(OPS)}, dispatch or combine")],
    hardware: Annotated[str, typer.Option(help="hardware profile name or YAML file")],
    gpus: Annotated[Optional[int], typer.Option(help="ranks in the group (NCCL collectives)")] = None,
    gpus_per_node: Annotated[Optional[int], typer.Option(help="ranks per node (default: the node's GPUs)")] = None,
    sizes: Annotated[Optional[str], typer.Option(
        help=f"nccl-tests sizes, e.g. 1M,64M,1G,8G (NCCL collectives) [default: {DEFAULT_SIZES}]")] = None,
    algorithm: Annotated[Optional[str], typer.Option(
        help="auto, ring, tree or nvls (NCCL collectives) [default: auto]")] = None,
    ep: Annotated[Optional[int], typer.Option(help="expert-parallel GPUs (dispatch/combine)")] = None,
    tokens: Annotated[Optional[int], typer.Option(help="tokens per GPU (dispatch/combine)")] = None,
    hidden: Annotated[Optional[int], typer.Option(help="hidden size (dispatch/combine)")] = None,
    topk: Annotated[Optional[int], typer.Option(help="experts per token (dispatch/combine)")] = None,
    dispatch_dtype: Annotated[Optional[str], typer.Option(
        help="bf16 or fp8 (dispatch only; combine is bf16) [default: fp8]")] = None,
    node_limit: Annotated[Optional[int], typer.Option(help="nodes a token may use (default: all)")] = None,
    experts: Annotated[Optional[int], typer.Option(
        help=f"routed experts in total (dispatch/combine) [default: {DEFAULT_EXPERTS}]")] = None,
    low_latency: Annotated[bool, typer.Option("--low-latency", help="DeepEP's pure-RDMA kernels")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print the rows as JSON")] = False,
) -> None:
    """Time one collective (nccl-tests sizes, algbw, busbw) or a DeepEP dispatch/combine."""
    hw = load_profile(hardware)
    if op in ("dispatch", "combine"):
        given = {"--ep": ep, "--tokens": tokens, "--hidden": hidden, "--topk": topk}
        missing = [f for f in _EP_FLAGS if given[f] is None]
        if missing:
            raise SimtrainError(f"collective {op}: {', '.join(missing)} required")
        if gpus is not None:
            raise SimtrainError(f"--gpus: not used by {op}; give the group with --ep")
        _refuse(op, {"--gpus-per-node": gpus_per_node, "--sizes": sizes, "--algorithm": algorithm},
                "only for the NCCL collectives (the message size is --tokens x --hidden x --topk)")
        if op == "combine":
            _refuse(op, {"--dispatch-dtype": dispatch_dtype}, "only for dispatch: DeepEP's combine sends BF16")
        if experts is None and DEFAULT_EXPERTS % ep:
            raise SimtrainError(f"--ep = {ep}: must divide the routed experts, {DEFAULT_EXPERTS} by default "
                                "(DeepSeek-V3's); give --experts as a multiple of --ep")
        warn_unbound_node_limit(node_limit, ep, hw.gpus_per_node, f"--node-limit {node_limit}")
        e = estimate_ep(op, hw, ep, tokens, hidden, topk, dispatch_dtype or "fp8", node_limit,
                        DEFAULT_EXPERTS if experts is None else experts, low_latency)
        row = dict(op=e.op, ep=e.ep, time_s=e.time_s, bottleneck=e.bottleneck,
                   nvlink_bytes_per_s=e.nvlink_bytes_per_s, rdma_bytes_per_s=e.rdma_bytes_per_s)
        if as_json:
            print(json.dumps([row], indent=2))
            return
        _print_rows([row], f"DeepEP {e.kernel} {op}, {hw.name}, EP {ep}, {tokens} tokens x {hidden}, top-{topk}",
                    [("op", "op", 1, ""), ("EP", "ep", 1, ""), ("time (us)", "time_s", 1e6, ".1f"),
                     ("bottleneck", "bottleneck", 1, ""), ("NVL (GB/s)", "nvlink_bytes_per_s", 1e-9, ".1f"),
                     ("RDMA (GB/s)", "rdma_bytes_per_s", 1e-9, ".1f")])
        return
    _refuse(op, dict(zip(_EP_FLAGS + ("--node-limit", "--dispatch-dtype", "--experts", "--low-latency"),
                         (ep, tokens, hidden, topk, node_limit, dispatch_dtype, experts, low_latency or None))),
            "only for dispatch and combine")
    if gpus is None:
        raise SimtrainError(f"collective {op}: --gpus required")
    if gpus < 2:
        raise SimtrainError(f"--gpus = {gpus}: a collective needs at least 2 GPUs (one GPU moves nothing: "
                            "its time, algbw and busbw are undefined)")
    ests = [estimate(op, size, hw, gpus, gpus_per_node, algorithm or "auto") for size in parse_sizes(sizes or DEFAULT_SIZES)]
    rows = [dict(op=e.op, gpus=e.gpus, nodes=e.nodes, bytes=e.nbytes, time_s=e.time_s,
                 algbw_bytes_per_s=e.algbw_bytes_per_s, busbw_bytes_per_s=e.busbw_bytes_per_s, algorithm=e.algorithm)
            for e in ests]
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    for r, e in zip(rows, ests):
        r["via"] = ", ".join(x for x in (f"{e.algorithm}/{e.protocol}" if e.protocol != "-" else e.algorithm,
                                         e.bottleneck) if x != "-")
    _print_rows(rows, f"{op} on {hw.name}: {gpus} GPUs over {rows[0]['nodes']} node(s)",
                [("size (B)", "bytes", 1, ""), ("time (us)", "time_s", 1e6, ".1f"),
                 ("algbw (GB/s)", "algbw_bytes_per_s", 1e-9, ".1f"), ("busbw (GB/s)", "busbw_bytes_per_s", 1e-9, ".1f"),
                 ("algorithm/protocol, bound by", "via", 1, "")])


def calibrate_nccl_tests(files: list[Path], base: str | None, out_path: Path, force: bool) -> None:
    """Fit a profile's NVLink and NIC efficiencies to nccl-tests logs; write a NEW profile.

    The profile is ``base`` with ``intra_node.efficiency`` / ``inter_node.efficiency`` replaced
    where the logs bound them and a ``calibration:`` record (files, fitted values, residual per
    size); a table of residuals is printed.

    Raises:
        SimtrainError: no ``--base``; ``--out`` exists (without ``--force``) or is the base file;
            a bad log (see :func:`simtrain.nccl_tests.parse_log`) or nothing to fit.
    """
    if base is None:
        raise SimtrainError("--nccl-tests: --base NAME|FILE is required (the profile whose links the logs measure)")
    base_path = resolve_profile_path(base)
    if out_path.suffix not in (".yaml", ".yml"):
        raise SimtrainError(f"--out {out_path}: expected a .yaml file name")
    if out_path.exists() and (not force or out_path.resolve() == base_path.resolve()):
        raise SimtrainError(f"--out {out_path}: the file exists; choose a new name"
                            + ("" if out_path.resolve() == base_path.resolve() else " or pass --force"))
    atomic.check_writable(out_path, "--out")
    logs = [parse_log(f) for f in files]
    hw = load_profile(base_path)
    _, record = fit_profile(hw, logs)
    data = load_yaml_file(base_path)
    for key, section in (("intra_node_efficiency", "intra_node"), ("inter_node_efficiency", "inter_node")):
        if record[key] is not None:
            data[section]["efficiency"] = round(record[key], 4)
    if record["inter_node_efficiency"] is not None:  # the fitted NIC also prices NCCL's all-to-all (fit_profile)
        data["inter_node"].pop("alltoall_efficiency", None)
    data["name"] = out_path.stem
    data["source"] = f"{data['source']} Link efficiencies fitted to nccl-tests logs by `simtrain calibrate --nccl-tests`."
    data["calibration"] = dict(method="nccl-tests", base=str(base_path), date=datetime.date.today().isoformat(),
                               files=[str(f) for f in files], **record)
    validate_model(ProfileFile, data, str(out_path))
    atomic.write_text(out_path, "# Written by `simtrain calibrate --nccl-tests`; calibration: records the fit.\n"
                      + yaml.safe_dump(data, sort_keys=False, width=120), flag="--out")
    table = Table(title=f"nccl-tests fit: NVLink efficiency {_fmt(record['intra_node_efficiency'])} "
                  f"({record['intra_node_rows']} rows), NIC efficiency {_fmt(record['inter_node_efficiency'])} "
                  f"({record['inter_node_rows']} rows)")
    for col in ("file", "op", "GPUs", "nodes", "size (B)", "placement", "measured (us)", "predicted (us)", "error"):
        table.add_column(col, justify="left" if col in ("file", "op", "placement") else "right")
    for r in record["residuals"]:
        table.add_row(r["file"], r["op"], str(r["gpus"]), str(r["nodes"]), str(r["bytes"]), r["placement"],
                      f"{r['measured_us']:.2f}", f"{r['predicted_us']:.2f}", f"{r['error']:+.1%}")
    out.print(table)
    out.print(f"profile: {out_path}")


def _fmt(x: float | None) -> str:
    return "unchanged (no row bounded by it)" if x is None else f"{x:.4f}"
