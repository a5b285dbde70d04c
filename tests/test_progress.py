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


def test_the_cli_consoles_draw_the_bars_and_give_the_streams_back(monkeypatch, capsys):
    """The CLI's lazily made consoles (simtrain.cli.app.LazyConsole) on a terminal: rich's Live
    enters its console with ``with``, so a bar over one must draw, clear and restore sys.stdout and
    sys.stderr (it crashed and left them replaced: review 8). TTY_COMPATIBLE makes rich treat the
    captured stream as a terminal."""
    import sys

    from rich.progress import Progress

    from simtrain.cli.app import LazyConsole

    monkeypatch.setenv("TTY_COMPATIBLE", "1")
    stdout, stderr = sys.stdout, sys.stderr
    console = LazyConsole(stderr=True)
    assert console.is_terminal
    with progress(console, 2, "simulating", delay_s=0.01) as advance:
        time.sleep(0.2)
        advance("gpipe")
    with Progress(console=console, transient=True) as bar:  # as simtrain plan draws its bar
        bar.add_task("plan", total=None)
    assert sys.stdout is stdout and sys.stderr is stderr
    print("after")
    assert "after" in capsys.readouterr().out
