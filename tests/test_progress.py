"""The progress bar appears on a terminal once work lasts its delay, never on a pipe, and leaves
nothing behind."""

from __future__ import annotations

import io
import time

from rich.console import Console

from simtrain.progress import progress


def _console(terminal: bool) -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, force_terminal=terminal, width=100), buf


def test_slow_work_on_a_terminal_shows_the_bar():
    console, buf = _console(True)
    with progress(console, 3, "simulating", delay_s=0.05) as advance:
        time.sleep(0.3)
        advance("gpipe")
        time.sleep(0.3)
    assert "simulating" in buf.getvalue() and "1/3" in buf.getvalue()


def test_quick_work_and_pipes_show_nothing():
    console, buf = _console(True)
    with progress(console, 2, "simulating", delay_s=5) as advance:
        advance("1f1b")
    assert buf.getvalue() == ""
    console, buf = _console(False)
    with progress(console, 2, "simulating", delay_s=0.0) as advance:
        time.sleep(0.2)
        advance("1f1b")
    assert buf.getvalue() == ""
