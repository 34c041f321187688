"""The Ray executor (engine.executors): one Ray task per cell on a Ray cluster (`--executor ray`; extra `scale`), each
with the CPUs and GPUs `--cpus-per-cell` / `--gpus-per-cell` give it, the checkpoint read from the shared path or
sent through the object store. A cell holds its own cache ledger (a Ray worker outlives the run)."""

from __future__ import annotations

import dataclasses
import time
from concurrent.futures import Future
from pathlib import Path

from ..errors import UserError
from .futures import WorkerLost, chained


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

        return chained(task.future(), translate, settle=lambda: self._inflight.discard(task))

    def close(self, interrupted: bool = False) -> None:
        ray = _ray()
        if interrupted:
            for task in list(self._inflight):
                ray.cancel(task, force=True)
        if self._started_here:
            ray.shutdown()
            self._started_here = False
