"""Start the ranks of a measurement and collect rank 0's result.

Two ways, one code path (:func:`run_rank_job`):

* **local spawn** (:func:`spawn`): ``world`` copies of ``python -m simtrain.calibration.launch JOB
  DIR`` on this machine, rendezvous through a fresh ``file://`` store in a new temporary folder
  (no port to collide with), ``OMP_NUM_THREADS`` and torch threads set per rank, a process-group
  timeout, a final barrier, and a wall-clock limit after which the parent kills the ranks it
  started. Rank 0 reports progress lines through a file the parent polls.
* **torchrun** (:func:`under_torchrun`): the CLI itself is a rank; torchrun's ``env://``
  rendezvous is used and rank 0 returns the result.

A job is a function ``run_rank(ctx, spec, progress) -> dict`` of a module named in :func:`_job`; ``spec`` is a
JSON-able dict, the returned dict (rank 0's) is JSON too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from ..errors import SimtrainError
from . import require_torch

Progress = Callable[[str], None]


@dataclass
class RankContext:
    """Where this process runs.

    Attributes:
        rank, world: global rank and world size.
        local_rank, local_world: rank and ranks within this node.
        device: ``torch.device`` the rank computes on (``cpu`` or ``cuda:<local_rank>``).
        backend: process-group backend (``gloo`` or ``nccl``).
        threads: torch intra-op threads of this rank (CPU).
    """

    rank: int
    world: int
    local_rank: int
    local_world: int
    device: Any
    backend: str
    threads: int

    def barrier(self) -> None:
        """Barrier over all ranks (no-op for one rank)."""
        if self.world > 1:
            import torch.distributed as dist

            dist.barrier()


def _job(name: str) -> Callable[[RankContext, dict, Progress], dict]:
    """The job function registered as ``name`` (``calibrate`` or ``validate``)."""
    import importlib

    module = {"calibrate": "microbench", "validate": "pipeline_runs"}[name]
    return importlib.import_module(f"{__package__}.{module}").run_rank


def under_torchrun() -> bool:
    """Whether this process was started by ``torchrun`` (its environment names rank and world)."""
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR"))


def init_rank(device: str, threads: int, timeout_s: float) -> RankContext:
    """Join the process group described by the environment (spawned rank or torchrun).

    Args:
        device: ``cpu`` or ``cuda``.
        threads: torch threads per rank on CPU.
        timeout_s: process-group timeout (every collective, the barrier, the rendezvous).

    Returns:
        The :class:`RankContext`.
    """
    torch = require_torch()
    import torch.distributed as dist

    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    if device == "cuda":
        torch.cuda.set_device(local_rank)
        dev, backend = torch.device("cuda", local_rank), "nccl"
    else:
        torch.set_num_threads(threads)
        dev, backend = torch.device("cpu"), "gloo"
    if world > 1 and not dist.is_initialized():
        init = os.environ.get("SIMTRAIN_INIT_METHOD", "env://")
        kwargs = dict(backend=backend, init_method=init, timeout=timedelta(seconds=timeout_s))
        if init != "env://":
            kwargs.update(rank=rank, world_size=world)
        if backend == "nccl":
            kwargs["device_id"] = dev
        dist.init_process_group(**kwargs)
    return RankContext(rank, world, local_rank, local_world, dev, backend, threads)


def run_rank_job(job: str, spec: dict, progress: Progress) -> dict | None:
    """Run ``job`` as one rank of the current group (spawned or torchrun); rank 0 returns its result.

    Ends with a barrier so no rank leaves while others still communicate.
    """
    ctx = init_rank(spec["device"], spec.get("threads", 1), spec.get("pg_timeout_s", 120))
    result = _job(job)(ctx, spec, progress if ctx.rank == 0 else (lambda _msg: None))
    ctx.barrier()
    return result if ctx.rank == 0 else None


def finish_torchrun() -> None:
    """Leave the process group after a torchrun job (a no-op when there is none)."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def spawn(
    job: str,
    spec: dict,
    world: int,
    timeout_s: float,
    progress: Progress | None = None,
) -> dict:
    """Run ``job`` on ``world`` local processes and return rank 0's result.

    Args:
        job: a key of the job table (``calibrate``, ``validate``).
        spec: JSON-able job arguments; must contain ``device``.
        world: ranks to start (one per GPU on ``cuda``).
        timeout_s: wall-clock limit for the whole job; past it the ranks are killed.
        progress: called with each progress line rank 0 reports.

    Raises:
        SimtrainError: a rank failed (the message quotes the end of its stderr) or the job ran
            past ``timeout_s``.
    """
    with tempfile.TemporaryDirectory(prefix=f"simtrain-{job}-") as tmp:
        folder = Path(tmp)
        (folder / "spec.json").write_text(json.dumps(spec))
        env = dict(os.environ)
        for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
            env.pop(key, None)
        env.update(
            WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
            SIMTRAIN_INIT_METHOD=f"file://{folder / 'rendezvous'}",
        )
        if spec["device"] == "cpu":
            env["OMP_NUM_THREADS"] = str(spec.get("threads", 1))
        procs, logs = [], []
        for rank in range(world):
            log = open(folder / f"rank{rank}.log", "w")  # noqa: SIM115 - closed below
            logs.append(log)
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "simtrain.calibration.launch", job, str(folder)],
                env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
                stdout=log, stderr=subprocess.STDOUT,
            ))
        try:
            _wait(procs, folder, timeout_s, progress)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            for log in logs:
                log.close()
        failed = [(r, p.returncode) for r, p in enumerate(procs) if p.returncode not in (0, None)]
        result_path = folder / "result.json"
        if failed and not result_path.exists():
            rank, code = failed[0]
            tail = (folder / f"rank{rank}.log").read_text().strip().splitlines()[-12:]
            raise SimtrainError(
                f"{job}: rank {rank} of {world} failed with exit status {code}: " + " | ".join(tail)
            )
        return json.loads(result_path.read_text())


def _wait(procs: list, folder: Path, timeout_s: float, progress: Progress | None) -> None:
    """Poll the ranks and rank 0's progress file until all exit, rank 0 is done, or time is up."""
    deadline = time.monotonic() + timeout_s
    seen = 0
    done = folder / "result.json"
    done_at = None
    while True:
        lines = _read_lines(folder / "progress.txt")
        if progress is not None:
            for line in lines[seen:]:
                progress(line)
        seen = len(lines)
        codes = [p.poll() for p in procs]
        if all(c is not None for c in codes):
            return
        if any(c not in (None, 0) for c in codes):
            time.sleep(0.5)  # let the others report, then stop them
            return
        if done.exists():
            done_at = done_at or time.monotonic()
            if time.monotonic() - done_at > 20:  # a rank hung in process-group teardown
                return
        if time.monotonic() > deadline:
            raise SimtrainError(
                f"{folder.name.split('-')[1]}: did not finish within {timeout_s:.0f} s; stopped its ranks"
            )
        time.sleep(0.1)


def _read_lines(path: Path) -> list[str]:
    try:
        return path.read_text().splitlines()
    except FileNotFoundError:
        return []


def _worker_main(job: str, folder: str) -> None:
    """Entry point of a spawned rank: run the job, rank 0 writes progress and ``result.json``."""
    path = Path(folder)
    spec = json.loads((path / "spec.json").read_text())

    def progress(msg: str) -> None:
        with open(path / "progress.txt", "a") as f:
            f.write(msg.replace("\n", " ") + "\n")

    result = run_rank_job(job, spec, progress)
    if result is not None:
        tmp = path / "result.tmp"
        tmp.write_text(json.dumps(result))
        tmp.rename(path / "result.json")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip process-group teardown, which can hang with gloo; the OS closes sockets


if __name__ == "__main__":
    _worker_main(sys.argv[1], sys.argv[2])
