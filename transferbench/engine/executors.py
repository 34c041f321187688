"""Executors: where a run's cells are computed. The runner (`engine.runner.run_task`) plans, takes each
cell's lock, submits the cell and writes its record from the outcome that comes back; an executor only
computes. Records are therefore written by the driver alone, under its locks, in its --out folder: workers
need no shared file system for them, and a worker that dies leaves nothing behind.

- `InlineExecutor`: this process, one cell at a time (`--executor local --jobs 1`, the default).
- `PoolExecutor`: N worker processes on this machine (`--executor local --jobs N`), each with its share of
  the cores and, when several GPUs are visible, its own GPU.
- `RayExecutor`: one Ray task per cell on a Ray cluster (`--executor ray`; extra `scale`).

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
import time
from concurrent.futures import Future
from pathlib import Path

from ..errors import UserError
from ..paths.ledger import Ledger

EXECUTORS = ("local", "ray")


class WorkerLost(RuntimeError):
    """The process computing a cell died before returning its outcome."""


def _chain(inner: Future, translate, settle=lambda: None) -> Future:
    """A future with `inner`'s result, or `translate(exception)` raised in its place; `settle()` runs first (the
    executor frees what the cell held, so that the runner may submit the next cell as soon as it sees this one)."""
    outer: Future = Future()

    def done(f):
        try:
            result, error = f.result(), None
        except BaseException as e:  # noqa: BLE001 - handed to the runner through the future
            result, error = None, translate(e)
        settle()
        outer.set_result(result) if error is None else outer.set_exception(error)

    inner.add_done_callback(done)
    return outer


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

        return _chain(inner, translate, settle=lambda: self._busy.__setitem__(slot, False))

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


# --- Ray ------------------------------------------------------------------------------------------------------


def _ray():
    try:
        import ray
    except ImportError:
        raise UserError(
            "--executor ray needs Ray: pip install 'transferbench[scale]' (on the driver and on every "
            "node of the cluster)"
        ) from None
    return ray


def _ray_compute(adapter, cell, ctx, threads: int, checkpoint_ref) -> dict:
    """A cell inside a Ray task: `threads` torch threads (the task's CPUs); the checkpoint from the shared path
    when this node sees the same file there, else from the object store into this node's cache."""
    import torch

    from .compute import compute_cell

    torch.set_num_threads(threads)
    if cell.checkpoint is not None:
        cell = dataclasses.replace(cell, checkpoint=str(local_checkpoint(cell, checkpoint_ref)))
    return compute_cell(adapter, cell, ctx)


def local_checkpoint(cell, checkpoint_ref) -> Path:
    """`cell.checkpoint` where this node has that file (same sha256), else the driver's copy from the object
    store written into $TRANSFERBENCH_HOME/checkpoints/<sha256><suffix> (atomically: tasks on one node may
    race)."""
    from ..hashing import file_sha256
    from ..paths.entries import entry_lock, quarantine
    from ..paths.home import cache
    from ..paths.writes import atomic_path

    path = Path(cell.checkpoint)
    if path.is_file() and file_sha256(path) == cell.checkpoint_sha256:
        return path
    cached = cache("checkpoints") / f"{cell.checkpoint_sha256}{path.suffix}"  # named by its digest
    if cached.is_file() and file_sha256(cached) == cell.checkpoint_sha256:
        return cached
    with entry_lock(cached):
        if cached.is_file() and file_sha256(cached) != cell.checkpoint_sha256:
            quarantine(cached, "its sha256 is not the one its name says", "checkpoint cache entry")
        if not cached.is_file():
            with atomic_path(cached) as tmp:
                tmp.write_bytes(_ray().get(checkpoint_ref[0]))
    return cached


def _reachable(address: str | None, timeout: float = 5.0) -> None:
    """A HOST:PORT or ray://HOST:PORT address answers on TCP within `timeout` s, else ConnectionError: Ray itself
    retries an unreachable head for minutes before it gives up."""
    if not address or address == "auto":
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise ConnectionError("expected auto, HOST:PORT or ray://HOST:PORT")
    import socket

    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as e:
        raise ConnectionError(f"{host}:{port} does not answer: {e.strerror or e}") from None


class RayExecutor:
    """One Ray task per cell, with `cpus_per_cell` CPUs and `gpus_per_cell` GPUs (None: 1 when the cluster has
    GPUs, else 0). `address`: None starts a Ray instance on this machine; 'auto' joins the cluster that
    `ray start` runs here; 'ray://host:10001' connects through Ray Client; 'host:6379' joins as a driver.
    At most as many cells are in flight as the cluster's nodes hold (read again as nodes join or leave), so
    the progress bar's 'running' is what runs. Ray's own task retries are off: a lost worker comes back to the
    runner as WorkerLost, which counts attempts the same way for every executor."""

    def __init__(
        self,
        address: str | None = None,
        cpus_per_cell: float = 1,
        gpus_per_cell: float | None = None,
        runtime_env: dict | None = None,
        init: dict | None = None,
    ):
        if gpus_per_cell is not None and gpus_per_cell < 0:
            raise UserError(f"--gpus-per-cell must be >= 0, got {gpus_per_cell}")
        self.address, self.cpus, self.gpus = address, cpus_per_cell, gpus_per_cell
        self.runtime_env, self.init = runtime_env, init or {}
        self._started_here = False
        self._inflight: set = set()
        self._capacity_at = 0.0
        self._slots = 1

    def start(self, adapter, ctx) -> None:
        ray = _ray()
        if not ray.is_initialized():
            kwargs = {"logging_level": "WARNING", **self.init}
            if self.address is None:
                kwargs.setdefault("include_dashboard", False)
            try:
                _reachable(self.address)
                ray.init(address=self.address, **kwargs)
            except ConnectionError as e:
                raise UserError(
                    f"--address {self.address}: no Ray cluster there ({e}); start one with "
                    "`ray start --head`, or leave --address out to run Ray on this machine"
                ) from None
            self._started_here = True
        nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
        if self.gpus is None:
            self.gpus = 1 if any(r.get("GPU", 0) >= 1 for r in nodes) else 0
        if not any(r.get("CPU", 0) >= self.cpus and r.get("GPU", 0) >= self.gpus for r in nodes):
            self.close()
            have = "; ".join(f"{r.get('CPU', 0):g} CPUs, {r.get('GPU', 0):g} GPUs" for r in nodes)
            raise UserError(
                f"no node of the Ray cluster can hold a cell of {self.cpus:g} CPUs and {self.gpus:g} GPUs "
                f"(nodes: {have}); lower --cpus-per-cell / --gpus-per-cell"
            )
        self.ctx = dataclasses.replace(ctx, show_progress=False)
        self._adapter = ray.put(adapter)
        self._checkpoints: dict[str, list] = {}
        self._remote = ray.remote(_ray_compute).options(
            num_cpus=self.cpus, num_gpus=self.gpus, max_retries=0, runtime_env=self.runtime_env
        )

    @property
    def slots(self) -> int:
        """Cells the live nodes hold at once (per node: its CPUs and GPUs over a cell's), read every 5 s."""
        if time.time() - self._capacity_at > 5:
            ray = _ray()
            fits = 0
            for n in ray.nodes():
                if n.get("Alive"):
                    r = n["Resources"]
                    fit = int(r.get("CPU", 0) // self.cpus)
                    fits += min(fit, int(r.get("GPU", 0) // self.gpus)) if self.gpus else fit
            self._slots, self._capacity_at = max(1, fits), time.time()
        return self._slots

    def submit(self, cell) -> Future:
        ray = _ray()
        ref = None
        if cell.checkpoint is not None:  # into the object store once per checkpoint; fetched only where needed
            ref = self._checkpoints.get(cell.checkpoint_sha256)
            if ref is None:
                ref = self._checkpoints[cell.checkpoint_sha256] = [ray.put(Path(cell.checkpoint).read_bytes())]
        task = self._remote.remote(self._adapter, cell, self.ctx, max(1, int(self.cpus)), ref)
        self._inflight.add(task)

        def translate(e):
            lost = (
                ray.exceptions.WorkerCrashedError,
                ray.exceptions.NodeDiedError,
                ray.exceptions.ObjectLostError,
                ray.exceptions.OwnerDiedError,
                ray.exceptions.TaskCancelledError,
            )
            if isinstance(e, lost):
                return WorkerLost(
                    f"Ray worker lost while computing the cell ({type(e).__name__}: "
                    f"{str(e).strip().splitlines()[0] if str(e).strip() else ''})"
                )
            return e

        return _chain(task.future(), translate, settle=lambda: self._inflight.discard(task))

    def close(self, interrupted: bool = False) -> None:
        ray = _ray()
        if interrupted:
            for task in list(self._inflight):
                ray.cancel(task, force=True)
        if self._started_here:
            ray.shutdown()
            self._started_here = False


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
        return RayExecutor(address, 1 if cpus_per_cell is None else cpus_per_cell, gpus_per_cell)
    from ..errors import close_matches

    raise UserError(f"--executor {name!r} is not one of {', '.join(EXECUTORS)}{close_matches(name, EXECUTORS)}")
