"""Import and export of schedules in PyTorch's CSV layout.

The layout is the one ``torch.distributed.pipelining`` reads and writes
(``PipelineScheduleMulti._load_csv`` / ``_dump_csv`` in ``schedules.py``, torch 2.13): one row per
pipeline rank, in rank order, one cell per action in execution order, each cell an action's text
(``0F1``, ``1I0``, ``1W0``, ``2B3``, ``(4F4;3B0)OVERLAP_F_B``), written with Python's ``csv``
module. torch writes an idle slot as an empty cell; those are skipped. Its "compute_comms" form
also holds communication actions (``0SEND_F1``, ``1RECV_B0``, ``UNSHARD``, ``RESHARD``,
``REDUCE_GRAD``); simtrain derives communication from the data dependencies, so those cells are
skipped too.

The file says nothing about placement: as torch does (``_validate_and_set_stage_mapping``), each
stage is placed on the rank whose row holds its actions, and a stage found in two rows is an
error. Every microbatch visits the stages in order ``0 .. S-1``, the number of microbatches is one
more than the largest microbatch index, and the schedule must then pass
:meth:`simtrain.schedules.ir.Schedule.validate`. An order that deadlocks passes these checks and
is reported by the engine (:class:`simtrain.engine.DeadlockError`), naming each rank and the
action it cannot run.
"""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path

from .. import atomic
from ..errors import SimtrainError
from ..loading import MAX_CSV_BYTES, read_text
from .ir import AnyAction, Schedule, ScheduleError, parse_action

_COMM_RE = re.compile(r"^\d+(SEND_F|RECV_F|SEND_B|RECV_B|UNSHARD|RESHARD|REDUCE_GRAD)\d*$")


def parse_torch_csv(text: str, name: str, source: str) -> Schedule:
    """Build a :class:`Schedule` from the text of a torch schedule CSV.

    Args:
        text: the file's contents.
        name: the schedule's name (e.g. the file's stem).
        source: where the text came from, for messages (a path).

    Returns:
        The validated schedule, placement derived from the rows.

    Raises:
        ScheduleError: no rows, a cell that is not an action, a rank with no action, a stage in
            two rows or in none, or a missing, duplicated or misplaced action (each message names
            the file, the rank and the action).
    """
    rows = list(csv.reader(io.StringIO(text)))
    while rows and not any(cell.strip() for cell in rows[-1]):
        rows.pop()  # blank lines at the end of the file
    orders: list[tuple[AnyAction, ...]] = []
    stage_rank: dict[int, tuple[int, str]] = {}
    for rank, row in enumerate(rows):
        order = []
        for column, cell in enumerate(row, start=1):
            cell = cell.strip()
            if not cell or _COMM_RE.match(cell):
                continue
            try:
                action = parse_action(cell)
            except ScheduleError as exc:
                raise ScheduleError(f"{source}: row {rank + 1} (rank {rank}), column {column}: {exc}") from None
            for part in action.parts:
                owner = stage_rank.setdefault(part.stage, (rank, str(part)))
                if owner[0] != rank:
                    raise ScheduleError(
                        f"{source}: stage {part.stage} appears on rank {owner[0]} ({owner[1]}) and on "
                        f"rank {rank} ({part}); a stage runs on one rank"
                    )
            order.append(action)
        orders.append(tuple(order))
    if not orders:
        raise ScheduleError(f"{source}: no rows; expected one row of actions per pipeline rank")
    for rank, order in enumerate(orders):
        if not order:
            raise ScheduleError(f"{source}: row {rank + 1} (rank {rank}) has no compute action")
    num_stages = max(stage_rank) + 1
    missing = [s for s in range(num_stages) if s not in stage_rank]
    if missing:
        raise ScheduleError(
            f"{source}: no rank runs stage {missing[0]}, but stages up to {num_stages - 1} appear; "
            f"stages must be numbered 0..S-1"
        )
    microbatches = 1 + max(p.microbatch for order in orders for a in order for p in a.parts)
    placement = tuple(stage_rank[s][0] for s in range(num_stages))
    schedule = Schedule(name, microbatches, placement, tuple(orders))
    try:
        schedule.validate()
    except ScheduleError as exc:
        raise ScheduleError(f"{source}: {exc}") from None
    return schedule


def read_torch_csv(path: Path) -> Schedule:
    """Read a torch schedule CSV file (see :func:`parse_torch_csv`); the name is the file's stem,
    or its file name (``1f1b.csv``) when the stem is a built-in schedule's name, so that an
    imported order never shows under a built-in's name beside it.

    Raises:
        SimtrainError: the file cannot be read.
        ScheduleError: the file does not hold a runnable schedule.
    """
    try:  # utf-8-sig: a byte-order mark (Excel writes one) is not part of the first cell
        text = read_text(path, "a schedule CSV file", MAX_CSV_BYTES, encoding="utf-8-sig")
    except SimtrainError as exc:
        raise SimtrainError(f"--schedule-file {exc}") from None
    from . import REGISTRY, split_name

    try:
        builtin = split_name(path.stem)[0] in REGISTRY
    except SimtrainError:
        builtin = False
    return parse_torch_csv(text, path.name if builtin else path.stem, str(path))


def format_torch_csv(schedule: Schedule) -> str:
    """The torch CSV text of ``schedule``: one row per rank, as ``_dump_csv`` writes it.

    Raises:
        ScheduleError: the schedule needs what the format cannot say (microbatches that take
            different paths through the stages, or stages that share a model chunk: DualPipe).
    """
    if schedule.paths is not None or schedule.stage_chunk is not None:
        raise ScheduleError(
            f"{schedule.name}: torch's CSV layout cannot express per-microbatch paths or stages "
            "that share a model chunk; this schedule cannot be exported to it"
        )
    out = io.StringIO()
    writer = csv.writer(out)
    for row in schedule.text_orders():
        writer.writerow(row)
    return out.getvalue()


def write_torch_csv(schedule: Schedule, path: Path, force: bool = False) -> None:
    """Write ``schedule`` to ``path`` in torch's CSV layout.

    Args:
        schedule: the schedule.
        path: the file to write.
        force: overwrite ``path`` if it exists.

    Raises:
        SimtrainError: ``path`` exists and ``force`` is False, or it cannot be written.
        ScheduleError: see :func:`format_torch_csv`.
    """
    atomic.write_text(path, format_torch_csv(schedule), overwrite=force, flag="--out")
