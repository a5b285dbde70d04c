"""The schedule IR: per-rank ordered actions and the placement of stages on ranks. No times.

An action is (stage, kind, microbatch) with kind ``F`` (forward), ``B`` (full backward),
``I`` (backward for inputs) or ``W`` (backward for weights). Its text form is PyTorch's
(``torch.distributed.pipelining.schedules._Action``): ``"0F1"`` is stage 0, forward, microbatch 1.
An :class:`OverlapAction` is a forward and a backward that run as one overlapped pair
(DualPipe's F&B), written ``"(4F4;3B0)OVERLAP_F_B"`` as in torch.

Stages are global indices. A microbatch visits stages along its *path* (``0, 1, ..., S-1`` unless
the schedule says otherwise, e.g. DualPipe's second direction); each stage computes one *model
chunk* (the identity unless two stages share a chunk's layers, as in DualPipe).
"""

from __future__ import annotations

import re
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from typing import NamedTuple, Union

from ..errors import SimtrainError
from ..parallel import flag_name

class ActionKind(StrEnum):
    """The compute kinds of an action, named as torch's ``_ComputationType``
    (``torch/distributed/pipelining/schedules.py``); the value is the letter of the text form
    (``0F1``, ``2I3``). Members are strings, so ``ActionKind.FORWARD == "F"``."""

    FORWARD = "F"
    FULL_BACKWARD = "B"
    BACKWARD_INPUT = "I"
    BACKWARD_WEIGHT = "W"


KINDS = tuple(k.value for k in ActionKind)
_ACTION_RE = re.compile(r"^(\d+)([FBIW])(\d+)$")
_OVERLAP_RE = re.compile(r"^\((\d+[FBIW]\d+);(\d+[FBIW]\d+)\)OVERLAP_F_B$")


class ScheduleError(SimtrainError):
    """A schedule that cannot run: invalid parameters, a missing or duplicated action, etc."""


class ScheduleWarning(UserWarning):
    """A schedule that runs but not as its paper intends (e.g. padded for too few microbatches).

    Generators emit it with :func:`warnings.warn`; the CLI prints it as ``warning: ...``.
    """


class _OnSettings:
    """A generator's message about the settings it was given: ``schedule: SETTINGS: why``, the
    settings (``{field: value}``, the refused one first) worded as flags, ``--microbatches = 2
    with --pp 4``, until :meth:`named` words them as where they were set. ``why`` may hold
    ``{field}`` placeholders for the settings it suggests (``hints``, ``{field: value}``), worded
    the same way: ``"pass {vp} or more"`` with ``hints={"vp": 2}`` reads ``pass --vp 2 or more``
    on the command line and ``pass vp=2 or more`` from the Python API."""

    def __init__(self, schedule: str, settings: dict[str, int], why: str,
                 hints: dict[str, object] | None = None) -> None:
        self.schedule, self.settings, self.why, self.hints = schedule, settings, why, hints or {}
        super().__init__(self.named())

    def __reduce__(self):
        return type(self), (self.schedule, self.settings, self.why, self.hints)

    def named(self, name: Callable[[str, object], str] = flag_name) -> str:
        """The message with each setting worded by ``name(field, value)`` (a scenario file's
        loader: :func:`simtrain.cli.settings.setting_name`); one ``name`` words as its flag
        (:func:`simtrain.parallel.flag_name`) keeps the generator's wording, so a typed flag reads
        as it always did."""
        words = []
        for i, (field, value) in enumerate(self.settings.items()):
            flag, said = flag_name(field, value), name(field, value)
            words.append(said if said != flag else flag.replace(" ", " = ", 1) if i == 0 else flag)
        why = self.why.format(**{f: name(f, v) for f, v in self.hints.items()}) if self.hints else self.why
        return f"{self.schedule}: {' with '.join(words)}: {why}"


@contextmanager
def settings_named(name: Callable[[str, object], str]) -> Iterator[None]:
    """Word a schedule's refusal of its settings (:class:`SettingsError`, and a
    :class:`SettingsWarning` given on the way) with ``name`` (the CLI's
    :func:`simtrain.cli.settings.setting_name`, the API's :func:`simtrain.api.argument_name`), so
    a scenario file's pp or microbatches is named as its field and an API call's as its argument.

    Raises:
        SimtrainError: the refusal, worded by ``name``.
    """
    caught: list[warnings.WarningMessage] = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", SettingsWarning)
            try:
                yield
            except SettingsError as exc:
                raise SimtrainError(exc.named(name)) from None
    finally:  # on to the caller's handling, reworded, once the recording is over (an error too)
        for w in caught:
            said = ScheduleWarning(w.message.named(name)) if isinstance(w.message, SettingsWarning) else w.message
            warnings.warn_explicit(said, w.category, w.filename, w.lineno)


class SettingsError(_OnSettings, ScheduleError):
    """A schedule that cannot run with the settings it was given (pp, microbatches, vp): see
    :class:`_OnSettings`."""


class SettingsWarning(_OnSettings, ScheduleWarning):
    """A schedule that runs, but not as its paper intends, with the settings it was given: see
    :class:`_OnSettings`."""


class Action(NamedTuple):
    """One compute action: ``stage`` (global index), ``kind`` (an :class:`ActionKind` letter:
    F, B, I or W), ``microbatch``.

    A named tuple (immutable, ordered by stage, kind, microbatch, with the repr
    ``Action(stage=0, kind='F', microbatch=1)``): the lowering keys its tables by action, ~5
    hashes and a comparison per task, which a tuple does in C. Its hash is the one a frozen
    dataclass of these fields has (the hash of the tuple of its fields), so sets and dicts of
    actions keep their order."""

    stage: int
    kind: str
    microbatch: int

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{self.microbatch}"

    @property
    def parts(self) -> tuple[Action, ...]:
        """The plain actions this action consists of (itself)."""
        return (self,)


@dataclass(frozen=True)
class OverlapAction:
    """A forward and a backward executed as one overlapped pair (DualPipe F&B)."""

    forward: Action
    backward: Action

    def __str__(self) -> str:
        return f"({self.forward};{self.backward})OVERLAP_F_B"

    @property
    def parts(self) -> tuple[Action, ...]:
        """The two plain actions, forward first."""
        return (self.forward, self.backward)


AnyAction = Union[Action, OverlapAction]


def parse_action(text: str) -> AnyAction:
    """Parse PyTorch's action text (``"2I3"``, ``"(4F4;3B0)OVERLAP_F_B"``).

    Raises:
        ScheduleError: the text is not an action.
    """
    t = text.strip()
    m = _ACTION_RE.match(t)
    if m:
        return Action(int(m.group(1)), m.group(2), int(m.group(3)))
    m = _OVERLAP_RE.match(t)
    if m:
        fwd, bwd = (parse_action(x) for x in m.groups())
        if fwd.kind != "F" or bwd.kind not in ("B", "I"):
            raise ScheduleError(f"'{text}': an overlapped pair is a forward then a backward")
        return OverlapAction(fwd, bwd)
    raise ScheduleError(
        f"'{text}' is not an action: expected <stage><F|B|I|W><microbatch> such as 0F1, "
        "or (<F action>;<B action>)OVERLAP_F_B"
    )


@dataclass(frozen=True)
class Schedule:
    """Per-rank action orders and stage placement of one pipeline schedule.

    Attributes:
        name: schedule name (registry key or file name).
        num_microbatches: microbatches per step (m).
        stage_to_rank: ``stage_to_rank[s]`` is the rank that runs stage ``s``.
        orders: ``orders[r]`` is rank r's actions in execution order.
        stage_chunk: model chunk computed by each stage; None means stage ``s`` is chunk ``s``.
        paths: ``paths[mb]`` is the sequence of stages microbatch ``mb`` visits; None means every
            microbatch visits ``0 .. num_stages-1``.
    """

    name: str
    num_microbatches: int
    stage_to_rank: tuple[int, ...]
    orders: tuple[tuple[AnyAction, ...], ...]
    stage_chunk: tuple[int, ...] | None = None
    paths: tuple[tuple[int, ...], ...] | None = None

    @property
    def num_stages(self) -> int:
        """Stages in the schedule."""
        return len(self.stage_to_rank)

    @property
    def num_ranks(self) -> int:
        """Pipeline ranks (devices)."""
        return len(self.orders)

    @property
    def num_chunks(self) -> int:
        """Distinct model chunks the model is cut into."""
        return len(set(self.stage_chunk)) if self.stage_chunk else self.num_stages

    def chunk_of(self, stage: int) -> int:
        """Model chunk computed by ``stage``."""
        return self.stage_chunk[stage] if self.stage_chunk else stage

    def path(self, microbatch: int) -> tuple[int, ...]:
        """Stages ``microbatch`` visits in forward order."""
        if self.paths is not None:
            return self.paths[microbatch]
        return tuple(range(self.num_stages))

    def stages_of(self, rank: int) -> list[int]:
        """Stages placed on ``rank``, ascending."""
        return [s for s, r in enumerate(self.stage_to_rank) if r == rank]

    def text_orders(self) -> list[list[str]]:
        """Orders in PyTorch's text form, one list per rank."""
        return [[str(a) for a in order] for order in self.orders]

    def validate(self) -> None:
        """Check that the schedule is complete and consistent (before simulating it).

        Every microbatch must run, on every stage of its path, exactly one F and either one B or
        one I and one W; each action must be on the rank that holds its stage.

        Raises:
            ScheduleError: naming the rank and the action that is unknown, misplaced, duplicated
                or missing.
        """
        if len(self.stage_to_rank) == 0 or self.num_microbatches < 1:
            raise ScheduleError(f"schedule '{self.name}': no stages or no microbatches")
        if set(self.stage_to_rank) != set(range(self.num_ranks)):
            raise ScheduleError(
                f"schedule '{self.name}': stage_to_rank {list(self.stage_to_rank)} must place "
                f"stages on every rank 0..{self.num_ranks - 1}"
            )
        seen: Counter[Action] = Counter()
        where: dict[Action, int] = {}
        for rank, order in enumerate(self.orders):
            for act in order:
                for a in act.parts:
                    if not 0 <= a.stage < self.num_stages:
                        raise ScheduleError(
                            f"schedule '{self.name}': rank {rank} has action {a} of unknown stage "
                            f"{a.stage} (stages are 0..{self.num_stages - 1})"
                        )
                    if not 0 <= a.microbatch < self.num_microbatches:
                        raise ScheduleError(
                            f"schedule '{self.name}': rank {rank} has action {a} of unknown "
                            f"microbatch {a.microbatch} (microbatches are 0..{self.num_microbatches - 1})"
                        )
                    owner = self.stage_to_rank[a.stage]
                    if owner != rank:
                        raise ScheduleError(
                            f"schedule '{self.name}': rank {rank} has action {a}, but stage "
                            f"{a.stage} is placed on rank {owner}"
                        )
                    seen[a] += 1
                    where[a] = rank
        for a, n in seen.items():
            if n > 1:
                raise ScheduleError(
                    f"schedule '{self.name}': rank {where[a]} runs action {a} {n} times (once allowed)"
                )
        for mb in range(self.num_microbatches):
            path = set(self.path(mb))  # (a set: one look-up per stage, not a scan of the path)
            for stage in range(self.num_stages):
                acts = {k: Action(stage, k, mb) in seen for k in KINDS}
                rank = self.stage_to_rank[stage]
                if stage not in path:
                    present = [str(Action(stage, k, mb)) for k in KINDS if acts[k]]
                    if present:
                        raise ScheduleError(
                            f"schedule '{self.name}': rank {rank} has {present[0]}, but microbatch "
                            f"{mb} does not pass through stage {stage}"
                        )
                    continue
                missing = []
                if not acts["F"]:
                    missing.append(f"{stage}F{mb}")
                if acts["B"] and (acts["I"] or acts["W"]):
                    raise ScheduleError(
                        f"schedule '{self.name}': rank {rank} has both {stage}B{mb} and a split "
                        f"backward ({stage}I{mb}/{stage}W{mb}) for the same microbatch"
                    )
                if not acts["B"]:
                    if not acts["I"]:
                        missing.append(f"{stage}B{mb} (or {stage}I{mb} + {stage}W{mb})")
                    elif not acts["W"]:
                        missing.append(f"{stage}W{mb}")
                if missing:
                    raise ScheduleError(
                        f"schedule '{self.name}': rank {rank} is missing action {missing[0]}"
                    )
