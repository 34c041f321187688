"""Executors: where a run's cells are computed. The runner (`engine.runner.run_task`) plans, takes each
cell's lock, submits the cell and writes its record from the outcome that comes back; an executor only
computes. Records are therefore written by the driver alone, under its locks, in its --out folder: workers
need no shared file system for them, and a worker that dies leaves nothing behind.

- `InlineExecutor`: this process, one cell at a time (`--executor local --jobs 1`, the default).
- `PoolExecutor`: N worker processes on this machine (`--executor local --jobs N`), each with its share of
  the cores and, when several GPUs are visible, its own GPU.
- `RayExecutor` (engine.ray_executor): one Ray task per cell on a Ray cluster (`--executor ray`; extra `scale`).

`submit(cell)` returns a `concurrent.futures.Future` of the cell's outcome (`engine.compute.compute_cell`).
The cache entries a cell meets are counted and checked in the run's ledger of the process that computes it
(`paths.ledger`): the driver's for `InlineExecutor`, each worker's own for `PoolExecutor` (a worker serves one run),
and the cell's own in a Ray task (a Ray worker outlives the run).

A future that fails with `WorkerLost` means that the process computing it died (kill -9, the out-of-memory
killer, a lost node): the runner submits the cell again or records it failed. `slots` is how many cells
may be in flight at once.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
from concurrent.futures import Future

from ..errors import UserError
from ..paths.ledger import Ledger
from .futures import WorkerLost, chained

EXECUTORS = ("local", "ray")


class InlineExecutor:
    """One cell at a time in this process, with its progress bars: transferbench's behaviour before executors.
    `threads` (--cpus-per-cell) sets torch's threads for the run, e.g. 1 to reproduce a pool's or Ray's records
    exactly: the threads per cell, not the executor, decide the floating-point reduction order."""

    slots = 1

    def __init__(self, threads: int | None = None):
        self.threads = threads
        self._restore = None

    def start(self, adapter, ctx) -> None:
        self.adapter, self.ctx = adapter, ctx
        if self.threads:
            import torch

            self._restore = torch.get_num_threads()
            torch.set_num_threads(self.threads)

    def submit(self, cell) -> Future:
        from .compute import compute_cell

        f: Future = Future()
        f.set_result(compute_cell(self.adapter, cell, self.ctx))  # a KeyboardInterrupt propagates from here
        return f

    def close(self, interrupted: bool = False) -> None:
        if self._restore:
            import torch

            torch.set_num_threads(self._restore)


# --- a pool of worker processes on this machine ---------------------------------------------------------------


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def visible_gpus() -> list[str]:
    """The CUDA devices this process sees, as CUDA_VISIBLE_DEVICES entries."""
    import torch

    if not torch.cuda.is_available():
        return []
    listed = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    return listed or [str(i) for i in range(torch.cuda.device_count())]


def _die_with_parent() -> None:
    """Linux: the kernel kills this worker when the driver dies (kill -9 included), so an orphan never goes on
    computing a cell whose lock its dead driver no longer holds."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def gpu_slots(jobs: int, gpus: list[str]) -> list[tuple[str | None, float]]:
    """Each worker slot's GPU and its share of that GPU's memory. Slots go round-robin over the visible GPUs, so
    --jobs larger than the GPU count puts several cells on a GPU; a GPU with k slots gives each one 1/k of its
    memory (torch.cuda.set_per_process_memory_fraction), so that no cell starves the others: one that needs more
    runs out of memory in its own share and halves its micro-batch (engine.train.fit). Without GPUs: (None, 1)."""
    if not gpus:
        return [(None, 1.0)] * jobs
    assigned = [gpus[i % len(gpus)] for i in range(jobs)]
    return [(g, 1.0 / assigned.count(g)) for g in assigned]


def _init_worker(threads: int, gpu: str | None, pid, memory_fraction: float = 1.0) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # idle workers ignore Ctrl-C; a computing one stops its cell
    _die_with_parent()
    if gpu is not None:  # before CUDA is initialised: the worker sees one GPU, as cuda:0
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu
    import torch
    from threadpoolctl import threadpool_limits

    if gpu is not None and memory_fraction < 1 and torch.cuda.is_available():
        torch.cuda.set_per_process_memory_fraction(memory_fraction, 0)
    torch.set_num_threads(threads)
    threadpool_limits(threads)  # numpy's BLAS (few-shot solvers, statistics) too
    pid.value = os.getpid()
    Ledger().hold()  # this worker's ledger for the run (paths.ledger): the pool and its workers live for one run


# a pool worker's own for the run it serves (the pool lives for one run): its trackers (tracking.Trackers; a ctx
# arrives pickled with each cell, as a fresh one), so that a tracker that failed stays off for its later cells
_IN_WORKER: dict = {}


def _compute_in_worker(adapter, cell, ctx) -> dict:
    from .compute import compute_cell

    if ctx.trackers is not None:
        ctx = dataclasses.replace(ctx, trackers=_IN_WORKER.setdefault("trackers", ctx.trackers))
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return compute_cell(adapter, cell, ctx)
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)


class PoolExecutor:
    """`jobs` worker processes (spawned: nothing of the driver's state is shared), each a one-process
    `concurrent.futures.ProcessPoolExecutor`, so that a worker's death breaks its own cell only: the slot
    gets a fresh process and the cells beside it go on. Workers live for the whole run, keeping what they
    cached in memory from cell to cell. Each gets `cores // jobs` threads (torch and BLAS) and, when several
    GPUs are visible and the device is CUDA, GPU number `slot % GPUs`."""

    def __init__(self, jobs: int, threads: int | None = None):
        if jobs < 1:
            raise UserError(f"--jobs must be >= 1, got {jobs}")
        self.slots = jobs
        self.threads = threads or max(1, usable_cores() // jobs)
        self._pools: list = [None] * jobs
        self._busy: list[bool] = [False] * jobs
        self._lock = threading.Lock()

    def start(self, adapter, ctx) -> None:
        import multiprocessing

        self._mp = multiprocessing.get_context("spawn")
        self.adapter = adapter
        self.ctx = dataclasses.replace(ctx, show_progress=False)  # the driver's bar counts cells; workers stay quiet
        gpus = visible_gpus() if ctx.device is None or ctx.device == "cuda" else []
        self._gpus = gpu_slots(self.slots, gpus)
        self._pids = [self._mp.Value("i", 0, lock=False) for _ in range(self.slots)]

    def _pool(self, slot: int):
        from concurrent.futures import ProcessPoolExecutor

        if self._pools[slot] is None:
            gpu, fraction = self._gpus[slot]
            self._pools[slot] = ProcessPoolExecutor(
                1,
                mp_context=self._mp,
                initializer=_init_worker,
                initargs=(self.threads, gpu, self._pids[slot], fraction),
            )
        return self._pools[slot]

    def submit(self, cell) -> Future:
        from concurrent.futures.process import BrokenProcessPool

        with self._lock:
            slot = self._busy.index(False)  # the runner keeps at most `slots` cells in flight
            self._busy[slot] = True
        try:
            inner = self._pool(slot).submit(_compute_in_worker, self.adapter, cell, self.ctx)
        except BrokenProcessPool:  # its worker died while idle
            self._pools[slot] = None
            inner = self._pool(slot).submit(_compute_in_worker, self.adapter, cell, self.ctx)
        pool = self._pools[slot]

        def translate(e):
            if not isinstance(e, BrokenProcessPool):
                return e
            self._pools[slot] = None  # the next cell in this slot gets a fresh process
            pool.shutdown(wait=False)
            return WorkerLost(
                f"worker process {self._pids[slot].value} died while computing the cell (killed, or out of memory)"
            )

        return chained(inner, translate, settle=lambda: self._busy.__setitem__(slot, False))

    def close(self, interrupted: bool = False) -> None:
        pools = [(slot, p) for slot, p in enumerate(self._pools) if p is not None]
        if interrupted:  # stop the cells in flight (a Ctrl-C from the terminal reached them already)
            busy = [self._pids[slot].value for slot, _ in pools if self._busy[slot] and self._pids[slot].value]
            for pid in busy:
                _signal(pid, signal.SIGINT)
            watchdog = threading.Timer(30.0, lambda: [_signal(pid, signal.SIGKILL) for pid in busy])
            watchdog.daemon = True
            watchdog.start()
        for _, p in pools:  # all at once: each worker takes a second or two to exit
            p.shutdown(wait=False, cancel_futures=True)
        for _, p in pools:
            p.shutdown(wait=True)
        if interrupted:
            watchdog.cancel()
        self._pools = [None] * self.slots


def _signal(pid: int, sig) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


GPU_SLOTS = 4  # cells at once on each visible GPU when --jobs is not given (benchmarks/paper_step.py --embedded)


def default_jobs() -> int:
    """--jobs when it is not given: 1 without a GPU (one cell at a time, all cores); with GPUs, GPU_SLOTS cells on
    each, at least 2 cores apiece: one cell of the embedded suite or of a few-shot probe leaves a GPU idle between
    its small launches, and several cells fill it (gpu_slots shares its memory between them)."""
    gpus = visible_gpus()
    if not gpus:
        return 1
    return max(1, min(GPU_SLOTS * len(gpus), usable_cores() // 2))


def make_executor(
    name: str = "local",
    *,
    jobs: int | None = None,
    address: str | None = None,
    cpus_per_cell: float | None = None,
    gpus_per_cell: float | None = None,
):
    """The executor that `transferbench run --executor NAME` asks for (`jobs` None: `default_jobs()` locally). Every
    execution flag of the executors is checked here: a bad one is one line (UserError)."""
    if cpus_per_cell is not None and not cpus_per_cell > 0:
        raise UserError(f"--cpus-per-cell must be > 0, got {cpus_per_cell}")
    if name == "local":
        if cpus_per_cell is not None and cpus_per_cell != int(cpus_per_cell):
            raise UserError(
                f"--cpus-per-cell {cpus_per_cell:g}: the local executor gives each cell that many torch threads, a "
                "whole number (fractions of a CPU are for --executor ray)"
            )
        jobs = default_jobs() if jobs is None else jobs
        if address is not None or gpus_per_cell is not None:
            raise UserError(
                "--address and --gpus-per-cell are for --executor ray; the local executor takes --jobs "
                "(each job gets its share of the cores and, with several GPUs, its own)"
            )
        threads = None if cpus_per_cell is None else int(cpus_per_cell)
        return InlineExecutor(threads) if jobs == 1 else PoolExecutor(jobs, threads)
    if name == "ray":
        if jobs not in (None, 1):
            raise UserError(
                "--jobs is for --executor local; with --executor ray the cluster's size sets how many "
                "cells run at once (--cpus-per-cell / --gpus-per-cell size each one)"
            )
        from .ray_executor import RayExecutor

        return RayExecutor(address, 1 if cpus_per_cell is None else cpus_per_cell, gpus_per_cell)
    from ..errors import close_matches

    raise UserError(f"--executor {name!r} is not one of {', '.join(EXECUTORS)}{close_matches(name, EXECUTORS)}")
