"""A progress bar (rich) for simulations that take a while: it appears only once the work has
lasted ``delay_s`` (2 s by default) and only on a terminal, and it leaves no trace when done, so
quick runs, pipes and ``--json`` output look exactly as without it."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

DELAY_S = 2.0
"""Seconds of work after which the bar appears."""


@contextmanager
def progress(console: Console, total: int, description: str, delay_s: float = DELAY_S) -> Iterator[Callable[[str], None]]:
    """Show a transient progress bar of ``total`` steps on ``console`` if the work lasts ``delay_s``.

    Neither the console nor rich's progress bar is touched before ``delay_s`` has passed, so quick
    work does not import rich (:class:`simtrain.cli.app.LazyConsole` makes the console on first use).

    Args:
        console: where to draw (nothing is drawn unless it is a terminal).
        total: the steps of the work (e.g. schedules x sweep points).
        description: what is being done, shown left of the bar.
        delay_s: seconds before the bar appears.

    Yields:
        ``advance(label)``: call after each step; ``label`` names the step just done.
    """
    lock = threading.Lock()
    state: dict = {"done": False, "bar": None, "task": None, "steps": 0, "description": description}

    def show() -> None:
        with lock:
            if state["done"] or not console.is_terminal:
                return
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn,
                                       TimeElapsedColumn)

            bar = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                           TimeElapsedColumn(), console=console, transient=True)
            state["task"] = bar.add_task(state["description"], total=total, completed=state["steps"])
            state["bar"] = bar
            bar.start()

    def advance(label: str) -> None:
        with lock:
            state["steps"] += 1
            state["description"] = f"{description}: {label} done"
            if state["bar"] is not None:
                state["bar"].update(state["task"], advance=1, description=state["description"])

    timer = threading.Timer(delay_s, show)
    timer.daemon = True
    timer.start()
    try:
        yield advance
    finally:
        with lock:
            state["done"] = True
            timer.cancel()
            if state["bar"] is not None:
                state["bar"].stop()
