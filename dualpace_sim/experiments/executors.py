"""Where a sweep's points are computed: this process, a local process pool, or a Ray cluster.

Every executor takes the same function and argument tuples and yields ``(index, outcome)`` as
each call finishes, in finishing order; ``outcome`` is the function's return value, or the
exception that kept it from returning (a worker killed by the OS, a lost Ray node). The sweep
loads the inputs and writes the outputs itself, so the executor is the only thing that differs:
results are byte-identical whichever one computed them, and a Ray cluster needs neither the
scenario's files nor a file system shared with this machine.

Each executor is a context manager: leaving it normally waits for its workers; leaving it on
Ctrl-C (or any exception) stops them without waiting.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from tqdm import tqdm

RAY_INSTALL = 'pip install -e ".[ray]"'

Calls = Sequence[tuple]


class ExecutorUnavailable(ValueError):
    """The executor asked for cannot run; the message is one line saying what to do."""


class InProcess:
    """One call after another in this process (one worker; also what tests monkeypatch)."""

    def __enter__(self) -> InProcess:
        return self

    def __exit__(self, *exc_info) -> None:
        return None

    def run(self, fn: Callable, calls: Calls) -> Iterator[tuple[int, Any]]:
        for index, args in enumerate(calls):
            yield index, fn(*args)


def _worker_init(sweep_pid: int) -> None:
    # Ctrl-C goes to the whole process group; only the parent handles it (and stops workers).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_exit_with, args=(sweep_pid,), daemon=True,
                     name="exit-with-sweep").start()
    # Workers draw no bars: a thread lock keeps tqdm from creating a named multiprocessing lock,
    # which a worker stopped on Ctrl-C would leave to the resource tracker (a "leaked" warning).
    tqdm.set_lock(threading.RLock())


def _exit_with(sweep_pid: int, poll_s: float = 0.5) -> None:
    """End this worker once the sweep's process is gone. A SIGKILLed sweep cannot stop its
    workers, and they are not its children (the forkserver forked them), so no signal tells
    them: they would compute for minutes, and keep the forkserver and the resource tracker
    alive (each worker holds the sweep's end of the pipe the forkserver waits on)."""
    while _running(sweep_pid):
        time.sleep(poll_s)
    os._exit(1)


def _running(pid: int) -> bool:
    """Whether `pid` runs; a zombie (dead, not yet reaped by its parent) does not."""
    if Path("/proc/self/stat").exists():
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in "ZX"
        except FileNotFoundError:
            return False
    try:  # no /proc (not Linux): a zombie counts as running until its parent reaps it
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):  # gone, or its pid reused by another user
        return False
    return True


INTERRUPTS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}


def _started() -> None:
    """A worker's first call: busy long enough that each worker of the pool takes one."""
    time.sleep(0.1)


def _mp_context():
    """forkserver where available: workers fork from a clean, single-threaded server that has
    already imported the simulator, so starting them is cheap and safe."""
    if "forkserver" in multiprocessing.get_all_start_methods():
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["dualpace_sim.experiments.sweep"])
        return ctx
    return multiprocessing.get_context("spawn")


class ProcessPool:
    """Calls in ``workers`` worker processes of this machine."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self._pool: ProcessPoolExecutor | None = None

    def __enter__(self) -> ProcessPool:
        # Every worker is started now, with Ctrl-C, SIGTERM and SIGHUP held back until they
        # all run: a worker still reading its queues when the sweep exits prints a traceback.
        held = signal.pthread_sigmask(signal.SIG_BLOCK, INTERRUPTS)
        try:
            self._pool = ProcessPoolExecutor(max_workers=self.workers, mp_context=_mp_context(),
                                             initializer=_worker_init,
                                             initargs=(os.getpid(),))
            for fut in [self._pool.submit(_started) for _ in range(self.workers)]:
                fut.result()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
        return self

    def run(self, fn: Callable, calls: Calls) -> Iterator[tuple[int, Any]]:
        futures = {self._pool.submit(fn, *args): index for index, args in enumerate(calls)}
        for fut in as_completed(futures):
            exc = fut.exception()
            yield futures[fut], exc if exc is not None else fut.result()

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self._pool.shutdown(wait=True)
            return
        processes = list((getattr(self._pool, "_processes", None) or {}).values())
        manager = getattr(self._pool, "_executor_manager_thread", None)
        self._pool.shutdown(wait=False, cancel_futures=True)
        for proc in processes:  # what a call computed is written by the sweep: killing is safe
            proc.terminate()
        for proc in processes:
            proc.join(timeout=5)
        # The pool's own thread must be gone before the interpreter exits: else the executor's
        # exit hook can wake it through a pipe it is closing, and print a traceback (CI, once).
        if manager is not None:
            manager.join(timeout=5)


class RayCluster:
    """Calls as Ray tasks of one CPU each, for sweeps that outgrow one machine.

    ``address`` is Ray's own (see ``ray.init``): ``local`` starts a Ray instance on this machine
    for the sweep, ``auto`` joins the cluster that ``ray start`` runs here, ``ray://HOST:10001``
    reaches a remote cluster through Ray Client. A process that called ``ray.init`` itself keeps
    its Ray: the sweep uses it and leaves it running. ``max_running`` caps the calls in flight
    (None: the cluster's free CPUs decide). The cluster's nodes need this package installed in
    the same version as here (as any Ray job does); they need no files of the scenario.
    """

    def __init__(self, address: str, max_running: int | None = None) -> None:
        try:
            import ray
        except ImportError:
            raise ExecutorUnavailable(f"--ray: Ray is not installed in this environment; "
                                      f"install the extra with {RAY_INSTALL}") from None
        self._ray = ray
        self.address = address
        self.max_running = max_running
        self._started = False
        self._pending: dict = {}

    def __enter__(self) -> RayCluster:
        ray = self._ray
        if ray.is_initialized():
            return self
        local = {"include_dashboard": False} if self.address == "local" else {}
        try:
            ray.init(address=self.address, logging_level=logging.WARNING, **local)
        except (ConnectionError, ValueError, RuntimeError, TimeoutError) as e:
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise ExecutorUnavailable(
                f"--ray {self.address}: cannot start or reach Ray ({first}); give 'local' to "
                f"start Ray here, 'auto' for the cluster `ray start` runs here, or "
                f"ray://HOST:10001 for a remote one") from None
        self._started = True
        return self

    def run(self, fn: Callable, calls: Calls) -> Iterator[tuple[int, Any]]:
        ray = self._ray
        task = ray.remote(num_cpus=1)(fn)
        limit = self.max_running or len(calls)
        waiting = list(enumerate(calls))[::-1]  # popped from the end: in the given order
        while waiting or self._pending:
            while waiting and len(self._pending) < limit:
                index, args = waiting.pop()
                self._pending[task.remote(*args)] = index
            (ref,), _ = ray.wait(list(self._pending), num_returns=1)
            index = self._pending.pop(ref)
            try:
                outcome = ray.get(ref)
            except Exception as exc:  # noqa: BLE001 - e.g. a node lost: reported, not raised
                outcome = exc
            yield index, outcome

    def __exit__(self, exc_type, exc, tb) -> None:
        for ref in self._pending:  # Ctrl-C: stop what is still running on the cluster
            self._ray.cancel(ref, force=True)
        self._pending.clear()
        if self._started:
            self._ray.shutdown()
