"""A progress bar (rich) for simulations that take a while: it appears only once the work has
lasted ``delay_s`` (2 s by default) and only on a terminal, and it leaves no trace when done, so
quick runs, pipes and ``--json`` output look exactly as without it."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

DELAY_S = 2.0
"""Seconds of work after which the bar appears."""


@contextmanager
def progress(console: Console, total: int, description: str, delay_s: float = DELAY_S) -> Iterator[Callable[[str], None]]:
    """Show a transient progress bar of ``total`` steps on ``console`` if the work lasts ``delay_s``.

    Args:
        console: where to draw (nothing is drawn unless it is a terminal).
        total: the steps of the work (e.g. schedules x sweep points).
        description: what is being done, shown left of the bar.
        delay_s: seconds before the bar appears.

    Yields:
        ``advance(label)``: call after each step; ``label`` names the step just done.
    """
    bar = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn(), console=console, transient=True)
    task = bar.add_task(description, total=total)
    lock, state = threading.Lock(), {"done": False, "shown": False}

    def show() -> None:
        with lock:
            if not state["done"]:
                bar.start()
                state["shown"] = True

    timer = threading.Timer(delay_s, show)
    timer.daemon = True
    if console.is_terminal:
        timer.start()
    try:
        yield lambda label: bar.update(task, advance=1, description=f"{description}: {label} done")
    finally:
        with lock:
            state["done"] = True
            timer.cancel()
            if state["shown"]:
                bar.stop()
