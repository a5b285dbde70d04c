"""Read a real pipeline step from torch profiler traces (Chrome JSON of ``torch.profiler``).

Call :func:`read_torch_trace` with the trace file(s) of one step — torch writes one file per rank
(``prof.export_chrome_trace(path)``) — and get the step's actions as a table with the columns of
the simulated trace (:mod:`simtrain.trace`), so measured and simulated steps can be drawn and compared the same way.

How ``torch.distributed.pipelining`` (2.x, ``schedules.py``) labels its actions with
``torch.profiler.record_function`` (complete events, ``"ph": "X"``, category ``user_annotation``):

* schedules with several stages per rank, and every schedule run by ``_PipelineScheduleRuntime``
  (Interleaved1F1B, LoopedBFS, InterleavedZeroBubble, ZBVZeroBubble, DualPipeV, schedules loaded
  from CSV): ``PP:<action>``, the action in torch's text form — ``PP:2F1`` (stage 2, forward,
  microbatch 1), ``PP:3I0``, ``PP:3W0``, ``PP:1B5``, ``PP:(4F4;3B0)OVERLAP_F_B``, and the
  communication and bookkeeping actions ``PP:1SEND_F0``, ``PP:2RECV_B3``, ``PP:0UNSHARD``,
  ``PP:0RESHARD``, ``PP:0REDUCE_GRAD``;
* ``ScheduleGPipe`` (one stage per rank): ``Forward <mb>`` and ``Backward <mb>`` (each includes
  waiting for the incoming activation or gradient and posting the outgoing one); the stage is
  taken to be the rank (linear placement);
* ``Schedule1F1B`` records no per-action labels in torch 2.13; run it through the runtime (e.g.
  ``_PipelineScheduleRuntime`` with a loaded schedule) to get ``PP:`` labels.

Which step: if the trace has ``ProfilerStep#N`` events (``torch.profiler.profile(schedule=...)``
with ``prof.step()``, or a ``record_function("ProfilerStep#N")``), the actions inside step ``N``
are taken (default: the last step); otherwise every action label must occur once per rank.
Which rank: the file's ``distributedInfo.rank`` (torch writes it when a process group exists),
else the position of the file in the list. Times are aligned across ranks by their timestamps
(one host, or hosts with synchronised clocks) and shifted so the step's first action starts at 0.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from .errors import SimtrainError
from .trace import TRACE_COLUMNS
from .loading import MAX_TRACE_BYTES, read_text

COLUMNS = [*TRACE_COLUMNS, "label"]
"""Columns of :func:`read_torch_trace`'s table: the trace's (:data:`simtrain.trace.TRACE_COLUMNS`),
plus torch's ``label``."""

US = 1e-6

_COMPUTE = re.compile(r"^(\d+)([FBIW])(\d+)$")
_OVERLAP = re.compile(r"^\((\d+)F(\d+);(\d+)([BI])(\d+)\)OVERLAP_F_B$")
_COMM = re.compile(r"^(\d+)(SEND_F|RECV_F|SEND_B|RECV_B)(\d+)$")
_OTHER = re.compile(r"^(\d+)(UNSHARD|RESHARD|REDUCE_GRAD)(\d*)$")
_SINGLE = re.compile(r"^(Forward|Backward) (\d+)$")
_STEP = re.compile(r"^ProfilerStep#(\d+)$")


def parse_label(label: str, rank: int) -> dict | None:
    """Turn one torch record_function label into a row (without times), or None if it is not a
    pipeline action.

    Args:
        label: the event name, e.g. ``"PP:2F1"`` or ``"Forward 3"``.
        rank: the rank the event ran on (the stage of single-stage labels).

    Returns:
        dict with rank, stream, category, kind, name, stage, microbatch, label; ``name`` is the
        action in simtrain's (= torch's) text form, e.g. ``"2F1"``.
    """
    row = dict(rank=rank, label=label, bytes=0.0, peer=None, resources="")
    if label.startswith("PP:"):
        text = label[3:]
        m = _COMPUTE.match(text)
        if m:
            return {**row, "stream": "compute", "category": "compute", "kind": m.group(2), "name": text,
                    "stage": int(m.group(1)), "microbatch": int(m.group(3))}
        m = _OVERLAP.match(text)
        if m:
            return {**row, "stream": "compute", "category": "compute", "kind": "F&B", "name": text,
                    "stage": int(m.group(1)), "microbatch": int(m.group(2))}
        m = _COMM.match(text)
        if m:
            return {**row, "stream": "p2p", "category": "comm", "kind": "p2p", "name": text,
                    "stage": int(m.group(1)), "microbatch": int(m.group(3))}
        m = _OTHER.match(text)
        if m:
            return {**row, "stream": "dp", "category": "comm", "kind": "dp", "name": text,
                    "stage": int(m.group(1)), "microbatch": None}
        return None
    m = _SINGLE.match(label)
    if m:
        kind = "F" if m.group(1) == "Forward" else "B"
        mb = int(m.group(2))
        return {**row, "stream": "compute", "category": "compute", "kind": kind, "name": f"{rank}{kind}{mb}",
                "stage": rank, "microbatch": mb}
    return None


def _load(path: Path) -> dict:
    text = read_text(Path(path), "a measured trace JSON file", MAX_TRACE_BYTES, encoding="utf-8-sig")
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise SimtrainError(f"{path}: not a JSON trace ({exc})") from None
    if isinstance(data, list):
        data = {"traceEvents": data}
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise SimtrainError(f"{path}: not a Chrome trace: expected a 'traceEvents' list (torch.profiler's "
                            "export_chrome_trace writes one)")
    return data


def _rank_rows(events: list[dict], rank: int, step: int | None, path: Path) -> list[dict]:
    complete = [e for e in events if isinstance(e, dict) and e.get("ph") == "X"
                and isinstance(e.get("name"), str) and "ts" in e and "dur" in e]
    steps = {}
    for e in complete:
        m = _STEP.match(e["name"])
        if m:
            steps[int(m.group(1))] = (float(e["ts"]), float(e["ts"]) + float(e["dur"]))
    window = None
    if steps:
        chosen = max(steps) if step is None else step
        if chosen not in steps:
            raise SimtrainError(f"{path}: --step = {step}: the trace has profiler steps {sorted(steps)}")
        window = steps[chosen]
    elif step is not None:
        raise SimtrainError(f"{path}: --step = {step}: the trace has no ProfilerStep#N events")
    rows = []
    for e in complete:
        ts, dur = float(e["ts"]), float(e["dur"])
        if window and not (window[0] <= ts <= window[1]):
            continue
        row = parse_label(e["name"], rank)
        if row is None:
            continue
        rows.append({**row, "start_s": ts * US, "end_s": (ts + dur) * US})
    seen: dict[str, int] = {}
    for r in rows:
        seen[r["label"]] = seen.get(r["label"], 0) + 1
    repeated = [label for label, n in seen.items() if n > 1]
    if repeated:
        raise SimtrainError(
            f"{path}: action '{repeated[0]}' occurs {seen[repeated[0]]} times on rank {rank}: the trace holds "
            "more than one step; profile one step, or mark steps with torch.profiler's schedule (ProfilerStep#N)"
        )
    return rows


def read_torch_trace(paths: Sequence[Path], step: int | None = None) -> pd.DataFrame:
    """Read the actions of one pipeline step from torch profiler trace files.

    Args:
        paths: one Chrome-JSON trace per rank (or one file holding several ranks' events is not
            supported: torch writes a file per process).
        step: the ``ProfilerStep#N`` to take (default: the last one; ignored when absent).

    Returns:
        DataFrame with :data:`COLUMNS`, one row per action, times in seconds from the step's first
        action, sorted by start time then rank; ``attrs["world_size"]`` is the job's world size
        (the files' ``distributedInfo.world_size``), or None where they do not say.

    Raises:
        SimtrainError: a missing or unreadable file, a file that is not a Chrome trace, two files
            of the same rank, a trace without pipeline actions, or an action repeated on a rank.
    """
    if not paths:
        raise SimtrainError("--measured: give at least one torch profiler trace")
    rows: list[dict] = []
    ranks: dict[int, Path] = {}
    worlds: list[int] = []
    for i, path in enumerate(paths):
        data = _load(Path(path))
        info = data.get("distributedInfo") or {}
        rank = info.get("rank", i) if isinstance(info, dict) else i
        if not isinstance(rank, int) or rank < 0:
            raise SimtrainError(f"{path}: distributedInfo.rank = {rank!r} is not a rank number")
        if rank in ranks:
            raise SimtrainError(f"{path}: rank {rank} was already read from {ranks[rank]}; give one file per rank")
        ranks[rank] = Path(path)
        got = _rank_rows(data["traceEvents"], rank, step, Path(path))
        if not got:
            raise SimtrainError(
                f"{path}: no torch.distributed.pipelining actions found (labels 'PP:<action>' or "
                "'Forward <mb>'/'Backward <mb>'); was the step run under torch.profiler?"
            )
        rows += got
        size = info.get("world_size") if isinstance(info, dict) else None
        if isinstance(size, int) and not isinstance(size, bool) and size >= 1:
            worlds.append(size)
    df = pd.DataFrame(rows, columns=COLUMNS)
    t0 = df["start_s"].min()
    df["start_s"] -= t0
    df["end_s"] -= t0
    df = df.sort_values(["start_s", "rank"], kind="stable").reset_index(drop=True)
    df.attrs["world_size"] = max(worlds) if worlds else None
    return df
