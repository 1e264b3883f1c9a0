"""Child processes of the runtime and the profiler (CPU engine ranks, profiling ranks): spawned,
never forked (the parent may have CUDA up), asked to stop, then made to.

Each child gets one end of a pipe and a picklable spec; tensor-parallel children meet through a
Gloo file rendezvous whose path `gloo_rendezvous` picks (Gloo's file store creates it)."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import tempfile
from collections.abc import Callable, Collection
from pathlib import Path

import torch


def spawn(target: Callable, spec: object, name: str) -> tuple[mp.Process, object]:
    """Start `target(conn, spec)` in a new daemon process; returns (process, parent's end)."""
    ctx = mp.get_context("spawn")
    conn, child = ctx.Pipe()
    proc = ctx.Process(target=target, args=(child, spec), daemon=True, name=name)
    proc.start()
    child.close()
    return proc, conn


def place_all_threads(cores: Collection[int]) -> None:
    """Every thread of this process on `cores`, each free among them: undoes `pin_threads`,
    whose OpenMP workers outlive the parallel region that pinned them (Linux; elsewhere only
    the calling thread)."""
    tasks = Path("/proc/self/task")
    tids = [int(t.name) for t in tasks.iterdir()] if tasks.is_dir() else [0]
    for tid in tids:
        with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
            os.sched_setaffinity(tid, set(cores))


def _pinned_main(conn, spec: tuple[Callable, tuple, tuple[int, ...] | None]) -> None:
    from dualpace_hw.kernels.cpu_attention import pin_threads

    fn, args, cores = spec
    try:
        if cores:
            os.sched_setaffinity(0, cores)
            torch.set_num_threads(len(cores))
            pin_threads(list(cores))
        conn.send(("done", fn(*args)))
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        with contextlib.suppress(OSError, ValueError):
            conn.send(("error", f"{type(e).__name__}: {e}"))


def as_cpu_engine(fn: Callable, args: tuple, cores: Collection[int] | None, name: str):
    """`fn(*args)` in a process of its own with the CPU engine's threads: on `cores`, one
    OpenMP thread pinned to each (as `CpuExecutor` runs them; None: the process's cores,
    unpinned, as the engine runs without --cpu-cores). The CPU stages' speed depends on the
    placement: on the H200 box the same attention call took 0.73-1.37x as long with floating
    threads as with pinned ones, by shape (benchmarks/results/kernels/README.md). A process of
    its own, so the caller's OpenMP team keeps its cores. `fn` must be picklable."""
    proc, conn = spawn(_pinned_main, (fn, args, tuple(sorted(cores)) if cores else None), name)
    try:
        kind, value = conn.recv()
    except EOFError:
        raise RuntimeError(f"{name}: the process died (exit code {proc.exitcode})") from None
    finally:
        stop([proc], [conn])
    if kind == "error":
        raise RuntimeError(f"{name}: {value}")
    return value


def stop(procs: list[mp.Process], conns: list) -> None:
    """Ask each child to stop ("stop" on its pipe), then terminate and kill the ones that do
    not within a few seconds, and close the pipes."""
    for proc, conn in zip(procs, conns, strict=True):
        if proc.is_alive():
            with contextlib.suppress(OSError, ValueError):
                conn.send(("stop",))
    for proc in procs:
        proc.join(5.0)
        if proc.is_alive():
            proc.terminate()
            proc.join(2.0)
        if proc.is_alive():
            proc.kill()
            proc.join()
    for conn in conns:
        conn.close()


def gloo_rendezvous() -> str:
    """A fresh path for Gloo's file rendezvous (remove it with `forget`)."""
    fd, path = tempfile.mkstemp(prefix="dualpace-gloo-")
    os.close(fd)
    os.unlink(path)
    return path


def forget(path: str | None) -> None:
    if path is not None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def engine_cores(cpu_cores: int | None) -> list[int] | None:
    """The cores `--cpu-cores N` gives the CPU engine: the machine's first N (None: no set)."""
    return list(range(cpu_cores)) if cpu_cores else None


def cores_off(engine_cores: Collection[int] | None) -> set[int] | None:
    """This thread's cores less the CPU engine's (None where that leaves none, or where the
    engine was given no cores: then there is nothing to keep off)."""
    if not engine_cores or not hasattr(os, "sched_getaffinity"):
        return None
    return (os.sched_getaffinity(0) - set(engine_cores)) or None


@contextlib.contextmanager
def on_cores(cores: Collection[int] | None):
    """This process on `cores` with as many OpenMP threads for the duration of the block (None:
    leave it be). A team of 16 threads on 2 cores turns every small CPU copy into a
    time-slicing stall."""
    if not cores:
        yield
        return
    affinity, threads = os.sched_getaffinity(0), torch.get_num_threads()
    os.sched_setaffinity(0, set(cores))
    torch.set_num_threads(len(cores))
    try:
        yield
    finally:
        os.sched_setaffinity(0, affinity)
        torch.set_num_threads(threads)
