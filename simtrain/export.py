"""Export simulated steps for other tools: Chrome / Perfetto trace-event JSON and CSV tables.

Input is the tasks and memory tables of a :class:`simtrain.trace.Trace` (pure pandas; nothing here
knows about SimPy). Each schedule's step becomes, per rank, one *process* in the trace viewer, and
each stream of that rank one *thread*: ``compute`` first, then the communication lanes
(``p2p`` for point-to-point transfers, and each collective stream such as ``tp``, ``dp``).

Trace-event format (Google, "Trace Event Format", the JSON Object Format that chrome://tracing
and ui.perfetto.dev read): ``{"traceEvents": [...], "displayTimeUnit": "ms"}``; times ``ts`` and
``dur`` are in microseconds. Tasks are complete events (``"ph": "X"``); names of processes and
threads are metadata events (``"ph": "M"``); the memory of each rank is a counter (``"ph": "C"``,
in GiB). Every event carries ``name``, ``ph``, ``ts``, ``dur``, ``pid`` and ``tid`` (``ts`` and
``dur`` are 0 where the format ignores them), so each event reads the same way.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from . import atomic
from .errors import SimtrainError
from .trace import lane_order, lanes

if TYPE_CHECKING:
    import pandas as pd

US = 1e6
GiB = 2**30
def _clean(value):
    """JSON-safe scalar: NaN/None -> None, numpy numbers -> Python numbers."""
    if value is None:
        return None
    if isinstance(value, float) and math.isnan(value):
        return None
    if hasattr(value, "item"):
        value = value.item()
        if isinstance(value, float) and math.isnan(value):
            return None
    return value


def chrome_trace(
    traces: Mapping[str, pd.DataFrame], memories: Mapping[str, pd.DataFrame] | None = None
) -> dict:
    """Build the trace-event JSON object of one or more simulated steps.

    Args:
        traces: schedule name -> engine trace (columns of :data:`simtrain.trace.TRACE_COLUMNS`).
        memories: schedule name -> memory timeline (rank, time_s, bytes), optional.

    Returns:
        ``{"traceEvents": [...], "displayTimeUnit": "ms"}``: one process per (schedule, rank),
        named ``"<schedule> · rank <r>"``; one thread per lane; a ``memory`` counter per rank.
    """
    events: list[dict] = []
    pid = 0
    memories = memories or {}
    for schedule, trace in traces.items():
        lane = lanes(trace)
        memory = memories.get(schedule)
        for rank in sorted(trace["rank"].unique()):
            pid += 1
            rows = trace[trace["rank"] == rank]
            order = lane_order(lane[rows.index])
            tid_of = {name: i + 1 for i, name in enumerate(order)}
            meta = dict(ph="M", ts=0, dur=0, pid=pid)
            events.append({**meta, "name": "process_name", "tid": 0,
                           "args": {"name": f"{schedule} · rank {int(rank)}"}})
            events.append({**meta, "name": "process_sort_index", "tid": 0, "args": {"sort_index": pid}})
            for name, tid in tid_of.items():
                events.append({**meta, "name": "thread_name", "tid": tid, "args": {"name": name}})
                events.append({**meta, "name": "thread_sort_index", "tid": tid, "args": {"sort_index": tid}})
            for idx, row in rows.iterrows():
                args = {k: _clean(row[k]) for k in ("kind", "stage", "microbatch", "bytes", "peer")
                        if k in row and _clean(row[k]) not in (None, "")}
                if row.get("resources"):
                    args["resources"] = row["resources"]
                events.append({
                    "name": str(row["name"]), "cat": str(row["kind"]), "ph": "X",
                    "ts": float(row["start_s"]) * US, "dur": float(row["end_s"] - row["start_s"]) * US,
                    "pid": pid, "tid": tid_of[lane[idx]], "args": args,
                })
            if memory is not None:
                mem = memory[memory["rank"] == rank].sort_values("time_s", kind="stable")
                for t, b in zip(mem["time_s"], mem["bytes"]):
                    events.append({"name": "memory", "ph": "C", "ts": float(t) * US, "dur": 0,
                                   "pid": pid, "tid": 0, "args": {"GiB": float(b) / GiB}})
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"generator": GENERATOR_MARK}}


def with_lanes(trace: pd.DataFrame) -> pd.DataFrame:
    """The engine's task table (SI units) with a ``lane`` column after ``stream``: the
    trace-viewer thread and timeline row of the task (:func:`simtrain.trace.lane_of`; ``p2p`` for
    the point-to-point transfers, which have no in-order ``stream``: each waits only for its
    producer and its link ports). The CSV's columns, and :attr:`simtrain.api.Report.trace`'s."""
    names = [n for n in trace.columns if n != "lane"]
    at = names.index("stream") + 1
    return trace.assign(lane=lanes(trace))[[*names[:at], "lane", *names[at:]]]


def trace_table(traces: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """All traces in one table: a ``schedule`` column, then :func:`with_lanes`'s columns."""
    import pandas as pd

    frames = [with_lanes(t).assign(schedule=name) for name, t in traces.items()]
    frames = [f[["schedule", *[c for c in f.columns if c != "schedule"]]] for f in frames]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["schedule"])


INTEGER_COLUMNS = ("stage", "microbatch", "peer")
"""Task-table columns that hold whole numbers or nothing (a task without a stage, microbatch or
peer); the engine keeps them as floats with NaN, the CSV writes them as integers or empty."""


GENERATOR_MARK = "simtrain"
"""Every file simtrain writes carries this word near its start (HTML ``<meta name="generator">``,
trace JSON ``otherData.generator``, CSV header ``schedule,...,start_s,end_s``), so a later run may
replace it; any other existing file is only overwritten with ``--force``."""


def _head_and_tail(path: Path, size: int = 4096) -> str:
    """The first and last ``size`` bytes of a file (decompressed when it ends in ``.gz``), as text."""
    import gzip  # (here: only the commands that write files need it)

    with (gzip.open if path.name.lower().endswith(".gz") else open)(path, "rb") as f:
        head = tail = f.read(size)
        for chunk in iter(lambda: f.read(1 << 20), b""):  # streams a gzip file; seeks would too
            tail = (tail + chunk)[-size:]
    return (head + b"\n" + tail).decode("utf-8", errors="replace")


def _written_by_simtrain(path: Path) -> bool:
    """Whether ``path`` looks like a file simtrain wrote (see :data:`GENERATOR_MARK`; a trace JSON
    carries it at its end)."""
    try:
        text = _head_and_tail(path)
    except (OSError, EOFError):  # gzip.BadGzipFile is an OSError
        return False
    if path.suffix.lower() == ".csv":
        first = text.splitlines()[0] if text else ""
        return first.startswith("schedule,") and "start_s" in first and "end_s" in first
    return GENERATOR_MARK in text


def check_output_path(path: Path, flag: str, suffix: str | tuple[str, ...], inputs: Iterable[Path] = (),
                      force: bool = False, force_name: str = "--force") -> Path:
    """Refuse an output path that would overwrite an input or a user's file, or has the wrong type.

    Args:
        path: where the user asked to write.
        flag: the CLI flag (or scenario field), for the message (e.g. ``"--trace"``).
        suffix: the required extension, e.g. ``".json"``, or a tuple of allowed ones
            (``(".json", ".json.gz")``).
        inputs: files this command reads (scenario, model, profile, schedule file, measured
            traces); none may be overwritten, even with ``force``.
        force: allow overwriting an existing file that simtrain did not write.
        force_name: how the refusal names that permission (the flag, or the API's ``force=True``).

    Returns:
        ``path``.

    Raises:
        SimtrainError: wrong extension, a folder, one of ``inputs``, an existing file simtrain did
            not write (without ``force``), or a folder simtrain cannot write in
            (:func:`simtrain.atomic.check_writable`).
    """
    path = Path(path)
    allowed = (suffix,) if isinstance(suffix, str) else suffix
    if not path.name.lower().endswith(allowed) or path.name.lower() in allowed:
        raise SimtrainError(f"{flag} = {str(path)!r}: expected a {' or '.join(allowed)} file name")
    if path.is_dir():
        raise SimtrainError(f"{flag} = {str(path)!r}: is a folder, expected a {' or '.join(allowed)} file name")
    for src in inputs:
        if src is not None and Path(src).exists() and path.exists() and path.resolve() == Path(src).resolve():
            raise SimtrainError(f"{flag} = {str(path)!r}: is an input of this command; refusing to overwrite it")
    if path.exists() and not force and not _written_by_simtrain(path):
        raise SimtrainError(f"{flag} = {str(path)!r}: the file exists and was not written by simtrain; "
                            f"choose another name or pass {force_name} to overwrite it")
    atomic.check_writable(path, flag)  # before the simulation, not after it
    return path


def write_output(write: Callable[[], object], path: Path, flag: str) -> None:
    """Run ``write`` (which writes ``path`` atomically, :mod:`simtrain.atomic`), turning a
    file-system error or a non-finite number into a SimtrainError.

    Raises:
        SimtrainError: ``{flag} = path: cannot write the file (reason)``.
    """
    try:
        write()
    except OSError as exc:
        raise SimtrainError(f"{flag} = {str(path)!r}: cannot write the file ({exc.strerror or exc}); "
                            "nothing was changed") from None
    except ValueError as exc:  # json's allow_nan=False: a non-finite number must never be written
        raise SimtrainError(f"{flag} = {str(path)!r}: not written: {exc}") from None


def write_chrome_trace(
    path: Path, traces: Mapping[str, pd.DataFrame], memories: Mapping[str, pd.DataFrame] | None = None
) -> Path:
    """Write :func:`chrome_trace` to ``path`` atomically (parent folders are created), gzip-compressed
    when the name ends in ``.gz`` (Perfetto and chrome://tracing open ``.json.gz`` directly); returns
    the path."""
    data = json.dumps(chrome_trace(traces, memories), separators=(",", ":"), allow_nan=False).encode("utf-8")
    if str(path).lower().endswith(".gz"):
        import gzip

        data = gzip.compress(data, mtime=0)  # mtime 0: the same trace gives the same bytes
    return atomic.write_bytes(Path(path), data)


def write_trace_csv(path: Path, traces: Mapping[str, pd.DataFrame]) -> Path:
    """Write :func:`trace_table` as CSV (seconds and bytes) to ``path``; returns the path."""
    table = trace_table(traces)
    for column in INTEGER_COLUMNS:
        if column in table:
            table[column] = table[column].astype("Int64")
    return atomic.write_text(Path(path), table.to_csv(index=False))
