"""Where the planner's simulations run: a local process pool, or a Ray cluster.

Both simulate each configuration with the cost model it is submitted with (the request's, so
that its bounds hold), keep at most ``workers`` simulations in flight (so that branch and bound prunes with fresh
results), give each finished one back as ``(config, row, error)``, and stop their workers on
:meth:`Backend.close` (also after Ctrl-C). Ray is an optional extra (``pip install simtrain[ray]``);
without ``address`` a local Ray instance with ``workers`` CPUs is started, with one the process
joins that cluster (``ray.init(address=...)``, Ray's documented entry point).
"""

from __future__ import annotations

import multiprocessing
import queue
import signal
import socket
import warnings
from typing import Protocol

from .cost_models import CostChoice
from .errors import SimtrainError
from .hardware import HardwareProfile
from .models import ModelSpec
from .plan import Config, row_of
from .scenario import run_schedule
from .schedules import ScheduleWarning

_JOB: dict = {}  # the model, hardware and sequence length of the running plan, per worker process


def evaluate(model: ModelSpec, hardware: HardwareProfile, seq_len: int | None, cfg: Config,
             cost: CostChoice = CostChoice()) -> tuple:
    """Simulate ``cfg`` with the compute cost model ``cost`` (the ``runtime`` hook ``simtrain
    compare`` passes, so the step time is compare's); returns ``(config, row, None)`` or
    ``(config, None, error message)``."""
    try:
        par = cfg.parallel(seq_len, cost.attention)
        with warnings.catch_warnings():  # a padded ZB-V is simulated as it is, bubbles included
            warnings.simplefilter("ignore", ScheduleWarning)
            report = run_schedule(cfg.schedule, model, hardware, par, runtime=cost.runtime(model, par, hardware)).report
    except SimtrainError as exc:
        return cfg, None, str(exc)
    return cfg, row_of(cfg, report, hardware.hbm_bytes), None


def _init_worker(model: ModelSpec, hardware: HardwareProfile, seq_len: int | None) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and terminates us
    _JOB.update(model=model, hardware=hardware, seq_len=seq_len)


def _evaluate_in_worker(cfg: Config, cost: CostChoice) -> tuple:
    return evaluate(_JOB["model"], _JOB["hardware"], _JOB["seq_len"], cfg, cost)


class Backend(Protocol):
    """What :func:`simtrain.plan.search` needs from a backend."""

    workers: int

    def submit(self, cfg: Config, cost: CostChoice) -> None: ...

    def next_result(self) -> tuple: ...

    def close(self) -> None: ...


class LocalBackend:
    """A pool of ``workers`` local processes (``multiprocessing``, fork start method)."""

    def __init__(self, model: ModelSpec, hardware: HardwareProfile, seq_len: int | None, workers: int) -> None:
        self.workers = workers
        self._done: queue.Queue = queue.Queue()
        ctx = multiprocessing.get_context("fork")
        self._pool = ctx.Pool(workers, initializer=_init_worker, initargs=(model, hardware, seq_len))

    def submit(self, cfg: Config, cost: CostChoice) -> None:
        self._pool.apply_async(_evaluate_in_worker, (cfg, cost), callback=self._done.put,
                               error_callback=lambda exc, c=cfg: self._done.put((c, None, repr(exc))))

    def next_result(self) -> tuple:
        return self._done.get()

    def close(self) -> None:
        self._pool.terminate()
        self._pool.join()


def _check_reachable(address: str) -> None:
    """Fail fast when a Ray address's host:port does not accept connections.

    Raises:
        SimtrainError: malformed address, or no connection within 5 s.
    """
    if address == "auto":
        return
    hostport = address.removeprefix("ray://")
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit():
        raise SimtrainError(f"--ray-address = {address!r}: expected HOST:PORT or ray://HOST:PORT (or 'auto')")
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as exc:
        raise SimtrainError(f"--ray-address = {address!r}: cannot connect ({exc.strerror or exc}); start a "
                            "cluster with `ray start --head` or leave out --ray-address for a local one") from None


class RayBackend:
    """Simulations as Ray tasks, at most ``workers`` in flight.

    Raises:
        SimtrainError: Ray is not installed, or the cluster cannot be reached.
    """

    def __init__(self, model: ModelSpec, hardware: HardwareProfile, seq_len: int | None, workers: int,
                 address: str | None = None) -> None:
        try:
            import ray
        except ImportError:
            raise SimtrainError("--backend ray: Ray is not installed; pip install 'simtrain[ray]'") from None
        if address is not None:
            _check_reachable(address)
        self.workers = workers
        self._ray = ray
        try:
            if address is None:
                ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False, configure_logging=False)
            else:
                ray.init(address=address, log_to_driver=False, configure_logging=False)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise SimtrainError(f"--ray-address = {address!r}: cannot join the Ray cluster ({exc})") from None
        self._task = ray.remote(num_cpus=1)(evaluate)
        self._job = (ray.put(model), ray.put(hardware), seq_len)
        self._pending: list = []

    def submit(self, cfg: Config, cost: CostChoice) -> None:
        self._pending.append(self._task.remote(*self._job, cfg, cost))

    def next_result(self) -> tuple:
        ready, self._pending = self._ray.wait(self._pending, num_returns=1)
        try:
            return self._ray.get(ready[0])
        except self._ray.exceptions.RayError as exc:
            raise SimtrainError(f"--backend ray: a worker failed ({exc})") from None

    def close(self) -> None:
        for ref in self._pending:
            self._ray.cancel(ref, force=True)
        self._pending = []
        self._ray.shutdown()


def make_backend(name: str, model: ModelSpec, hardware: HardwareProfile, seq_len: int | None, workers: int,
                 address: str | None = None) -> LocalBackend | RayBackend:
    """The backend called ``name`` (``local`` or ``ray``).

    Raises:
        SimtrainError: an unknown name, ``--workers`` < 1, ``--ray-address`` without Ray, or what
            :class:`RayBackend` raises.
    """
    if workers < 1:
        raise SimtrainError(f"--workers = {workers}: must be >= 1")
    if name == "local":
        if address is not None:
            raise SimtrainError("--ray-address: only with --backend ray")
        return LocalBackend(model, hardware, seq_len, workers)
    if name == "ray":
        return RayBackend(model, hardware, seq_len, workers, address)
    raise SimtrainError(f"--backend = {name!r}: choose local or ray")
