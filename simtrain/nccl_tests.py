"""Read and write NVIDIA/nccl-tests output; fit a profile's link efficiencies to it.

nccl-tests (``all_reduce_perf``, ``all_gather_perf``, ``reduce_scatter_perf``, ``alltoall_perf``,
``sendrecv_perf``, ``broadcast_perf``) print a header (one ``#  Rank ... on HOST device ...`` line
per GPU), one row per size (``size count type redop root`` then time, algbw, busbw and #wrong for
out-of-place and for in-place), and ``# Avg bus bandwidth : X`` at the end (nccl-tests
``src/common.cu``). :func:`parse_log` reads that; :func:`format_log` writes it from
:func:`simtrain.collectives.estimate` (used to make the test fixtures); :func:`fit_profile` finds
the NVLink and NIC efficiencies (``intra_node.efficiency``, ``inter_node.efficiency``) that make
the model reproduce the measured times.

Fit: a row informs a link class when halving that class's efficiency would change its predicted
time by more than :data:`SENSITIVITY`; for such a row the efficiency that reproduces the measured
time exactly is solved (the time falls monotonically with efficiency), and the class takes the
median over its rows (single-node logs for NVLink first, then multi-node logs for the NIC).
Latencies stay NCCL's constants (:mod:`simtrain.collectives`).
"""

from __future__ import annotations

import dataclasses
import re
import statistics
from dataclasses import dataclass
from pathlib import Path

from .collectives import Estimate, estimate
from .errors import SimtrainError
from .hardware import HardwareProfile

BINARIES = {"all_reduce_perf": "all-reduce", "all_gather_perf": "all-gather", "reduce_scatter_perf": "reduce-scatter",
            "alltoall_perf": "all-to-all", "sendrecv_perf": "p2p", "broadcast_perf": "broadcast"}
BINARY_OF = {op: b for b, op in BINARIES.items()}
SENSITIVITY = 0.10
EFFICIENCY_RANGE = (0.02, 1.0)
_RANK = re.compile(r"^#\s+Rank\s+(\d+)\s+Group\s+\d+\s+Pid\s+\d+\s+on\s+(\S+)\s+device\s+\d+")
_AVG = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*([0-9.]+)")


@dataclass(frozen=True)
class Row:
    """One size of a log: nccl-tests' size (bytes) and the out-of-place and in-place seconds."""

    nbytes: int
    times_s: tuple[float, float]


@dataclass(frozen=True)
class Log:
    """One parsed nccl-tests run: its op (a :data:`simtrain.collectives.OPS` name), ranks, ranks
    per node (from the host names), nodes and rows."""

    path: str
    op: str
    gpus: int
    per_node: int
    nodes: int
    rows: tuple[Row, ...]


def _op_of(path: Path, lines: list[str]) -> str:
    for line in lines:
        m = re.match(r"^#\s*Collective test starting:\s*(\S+)", line)
        if m and m.group(1) in BINARIES:
            return BINARIES[m.group(1)]
    for binary, op in BINARIES.items():
        if binary in path.name:
            return op
    raise SimtrainError(f"{path}: cannot tell which test wrote it: no '# Collective test starting: <test>' line and "
                        f"no test name in the file name (one of {', '.join(BINARIES)})")


def _row(path: Path, lineno: int, line: str) -> Row:
    tokens = line.split()
    bad = f"{path}: line {lineno}: malformed result row {line.strip()!r}: expected size count type redop [root] " \
          "then time algbw busbw #wrong for out-of-place and in-place"
    if len(tokens) not in (12, 13):
        raise SimtrainError(bad)
    try:
        nbytes = int(tokens[0])
        times = (float(tokens[-8]), float(tokens[-4]))
        [float(x) for x in tokens[-7:-5] + tokens[-3:-1]]
    except ValueError:
        raise SimtrainError(bad) from None
    for wrong in (tokens[-5], tokens[-1]):
        if wrong not in ("0", "N/A"):
            raise SimtrainError(f"{path}: line {lineno}: the test reports {wrong} wrong results at size {nbytes}; "
                                "fix the cluster before fitting to it")
    if nbytes <= 0 or not all(t > 0 for t in times):
        raise SimtrainError(f"{path}: line {lineno}: size {nbytes} and times {times} must be > 0")
    return Row(nbytes, (times[0] * 1e-6, times[1] * 1e-6))


def parse_log(path: Path) -> Log:
    """Parse one nccl-tests output file.

    Raises:
        SimtrainError: unreadable file; no rank lines; unknown test; a malformed row; wrong
            results; no rows; truncated (no ``# Avg bus bandwidth`` line after the rows); ranks
            spread unevenly over hosts.
    """
    path = Path(path)
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise SimtrainError(f"--nccl-tests {path}: cannot read the file ({exc})") from None
    op = _op_of(path, lines)
    hosts: dict[int, str] = {}
    rows: list[Row] = []
    finished = False
    for lineno, line in enumerate(lines, 1):
        if m := _RANK.match(line):
            hosts[int(m.group(1))] = m.group(2)
        elif _AVG.match(line):
            finished = True
        elif line.strip() and not line.lstrip().startswith("#"):
            if finished:
                raise SimtrainError(f"{path}: line {lineno}: result row after '# Avg bus bandwidth'")
            rows.append(_row(path, lineno, line))
    if not hosts:
        raise SimtrainError(f"{path}: no '#  Rank N Group G Pid P on HOST device D' lines; is it nccl-tests output?")
    if not rows:
        raise SimtrainError(f"{path}: no result rows")
    if not finished:
        raise SimtrainError(f"{path}: truncated: no '# Avg bus bandwidth' line after the last row "
                            f"(size {rows[-1].nbytes}); did the test finish?")
    per_host = [list(hosts.values()).count(h) for h in dict.fromkeys(hosts.values())]
    if len(set(per_host)) != 1:
        raise SimtrainError(f"{path}: ranks spread unevenly over hosts ({per_host}); simtrain models equal nodes")
    return Log(str(path), op, len(hosts), per_host[0], len(per_host), tuple(rows))


def _format_row(e: Estimate, redop: str, root: int, dtype_bytes: int) -> str:
    cols = f"{int(e.nbytes):>12d}  {int(e.nbytes) // dtype_bytes:>12d}  {'float':>8s}  {redop:>6s}  {root:>6d}"
    t_us = e.time_s * 1e6
    digits = 0 if t_us >= 1e4 else 1 if t_us >= 100 else 2  # nccl-tests' time column precision
    one = f"  {t_us:7.{digits}f}  {e.algbw_bytes_per_s / 1e9:6.2f}  {e.busbw_bytes_per_s / 1e9:6.2f}  {0:5d}"
    return cols + one + one


def format_log(op: str, hw: HardwareProfile, gpus: int, per_node: int, sizes: list[int], algorithm: str = "auto") -> str:
    """nccl-tests' output for ``op`` as :func:`simtrain.collectives.estimate` predicts it.

    Hosts are named ``node0``, ``node1`` ...; in-place and out-of-place times are equal. Used to
    write the test fixtures; the text follows nccl-tests 2.x (``src/common.cu``) column by column.
    """
    binary = BINARY_OF[op]
    redop = "sum" if op in ("all-reduce", "reduce-scatter") else "none"
    root = 0 if op == "broadcast" else -1
    est = [estimate(op, s, hw, gpus, per_node, algorithm) for s in sizes]
    head = [f"# nccl-tests version 2.13.9 (simtrain writer) nccl-headers=22105 nccl-library=22105",
            f"# Collective test starting: {binary}",
            f"# nThread 1 nGpus 1 minBytes {min(sizes)} maxBytes {max(sizes)} step: 2(factor) warmup iters: 5 "
            "iters: 20 agg iters: 1 validation: 1 graph: 0", "#", "# Using devices"]
    head += [f"#  Rank {r:2d} Group  0 Pid {1000 + r:6d} on {'node' + str(r // per_node):>10s} device {r % per_node:2d} "
             f"[0x{16 + r % per_node:02x}] {hw.name}" for r in range(gpus)]
    head += ["#", "#" + " " * 62 + "out-of-place" + " " * 23 + "in-place",
             "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   "
             "busbw #wrong",
             "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  "
             "(GB/s)"]
    body = [_format_row(e, redop, root, 4) for e in est]
    avg = statistics.fmean(e.busbw_bytes_per_s / 1e9 for e in est)
    tail = ["# Out of bounds values : 0 OK", f"# Avg bus bandwidth    : {avg:.4f} ", "#",
            f"# Collective test concluded: {binary}", ""]
    return "\n".join(head + body + tail)


def with_efficiencies(hw: HardwareProfile, intra: float, inter: float) -> HardwareProfile:
    """``hw`` with the achieved efficiencies of NVLink (``intra``) and the NIC (``inter``) replaced."""
    return dataclasses.replace(hw, intra_node=dataclasses.replace(hw.intra_node, achieved_efficiency=intra),
                               inter_node=dataclasses.replace(hw.inter_node, achieved_efficiency=inter))


def predict_s(hw: HardwareProfile, log: Log, row: Row) -> float:
    """Predicted seconds of one row of ``log`` on ``hw``."""
    return estimate(log.op, row.nbytes, hw, log.gpus, log.per_node).time_s


def _solve(time_at, measured: float) -> float:
    """Efficiency in :data:`EFFICIENCY_RANGE` where ``time_at(eff)`` (falling) meets ``measured``."""
    lo, hi = EFFICIENCY_RANGE
    if time_at(hi) >= measured:
        return hi
    if time_at(lo) <= measured:
        return lo
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if time_at(mid) > measured else (lo, mid)
    return (lo + hi) / 2


def _fit_class(hw: HardwareProfile, logs: list[Log], which: str) -> tuple[float | None, int]:
    """Median efficiency of link class ``which`` (``intra``/``inter``) over the rows it bounds."""
    current = {"intra": hw.intra_node.collective_efficiency, "inter": hw.inter_node.collective_efficiency}

    def at(eff: float) -> HardwareProfile:
        return with_efficiencies(hw, **{**current, which: eff})

    solved = []
    for log in logs:
        for row in log.rows:
            base, half = predict_s(at(current[which]), log, row), predict_s(at(current[which] / 2), log, row)
            if half / base - 1 <= SENSITIVITY:
                continue
            for measured in row.times_s:
                solved.append(_solve(lambda e: predict_s(at(e), log, row), measured))
    return (statistics.median(solved) if solved else None), len(solved)


def fit_profile(hw: HardwareProfile, logs: list[Log]) -> tuple[HardwareProfile, dict]:
    """Fit NVLink and NIC efficiencies of ``hw`` to nccl-tests ``logs``. The NIC efficiency is
    fitted to every multi-node log (all-to-all ones too) and, once fitted, also prices NCCL's
    all-to-all: the base's ``inter_node.alltoall_efficiency`` measured another cluster.

    Returns:
        ``(fitted profile, record)``: the record has per class the fitted efficiency (or None
        when no row bounds it), the rows used, and per row the measured and predicted time.

    Raises:
        SimtrainError: a log's group does not fit ``hw`` (see :func:`simtrain.collectives.place`),
            or no row of any log is bandwidth-bound on either link class.
    """
    single = [lg for lg in logs if lg.nodes == 1]
    multi = [lg for lg in logs if lg.nodes > 1]
    for lg in logs:
        try:
            estimate(lg.op, lg.rows[0].nbytes, hw, lg.gpus, lg.per_node)
        except SimtrainError as exc:
            raise SimtrainError(f"{lg.path}: {exc}") from None
    intra, n_intra = _fit_class(hw, single or multi, "intra")
    fitted = with_efficiencies(hw, intra or hw.intra_node.collective_efficiency, hw.inter_node.collective_efficiency)
    one_nic = dataclasses.replace(fitted, inter_node=dataclasses.replace(fitted.inter_node, alltoall_efficiency=None))
    inter, n_inter = _fit_class(one_nic, multi, "inter") if multi else (None, 0)
    if intra is None and inter is None:
        raise SimtrainError("--nccl-tests: no row is bandwidth-bound on NVLink or the NIC; give logs with large "
                            "sizes (e.g. -b 1M -e 8G)")
    if inter is not None:
        fitted = with_efficiencies(one_nic, fitted.intra_node.collective_efficiency, inter)
    residuals = []
    for lg in logs:
        for row in lg.rows:
            pred = predict_s(fitted, lg, row)
            for place, measured in zip(("out-of-place", "in-place"), row.times_s):
                residuals.append(dict(file=Path(lg.path).name, op=lg.op, gpus=lg.gpus, nodes=lg.nodes,
                                      bytes=row.nbytes, placement=place, measured_us=round(measured * 1e6, 3),
                                      predicted_us=round(pred * 1e6, 3), error=round(pred / measured - 1, 5)))
    record = dict(intra_node_efficiency=intra, intra_node_rows=n_intra,
                  inter_node_efficiency=inter, inter_node_rows=n_inter, residuals=residuals)
    return fitted, record
