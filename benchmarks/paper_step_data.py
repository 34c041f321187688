"""The paper-scale step benchmark's data rows (benchmarks.paper_step): the data path's share of a b32 step at the
paper's VTAB shape (the resident path and the worker pipeline), and the embedded suite's end-to-end breakdown."""

from __future__ import annotations

import functools
import itertools
import time

import numpy as np
import torch

from transferbench import create_backbone


class Synthetic(torch.utils.data.Dataset):
    """n random uint8 images of `size` px: `array()` (the resident path's in-memory set) or, with `per_example`,
    only PIL images one at a time (the worker pipeline's view of a decoded source)."""

    def __init__(self, n: int, size: int, classes: int, per_example: bool = False, seed: int = 0):
        rng = np.random.default_rng(seed)
        self._array = rng.integers(0, 256, (n, size, size, 3), dtype=np.uint8)
        self.labels = rng.integers(0, classes, n)
        self.num_classes = classes
        if not per_example:
            self.array = lambda: self._array

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i):
        from PIL import Image

        return Image.fromarray(self._array[i]), int(self.labels[i])


def _timed(fn, seconds: float) -> float:
    """The median seconds of `fn` over at least 3 calls and `seconds`, after 2 warm-up calls (workers started,
    kernels chosen, the step compiled)."""
    for _ in range(2):
        fn()
    times, start = [], time.perf_counter()
    while len(times) < 3 or time.perf_counter() - start < seconds:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def data_share(
    device: str,
    seconds: float,
    *,
    size="b32",
    batch=512,
    n=1000,
    res=224,
    workers=0,
    fed_steps: bool = True,
    paths=("resident", "workers"),
) -> dict:
    """The data path as a cell trains: `fit` (the default path: compiled on CUDA) for `steps` steps fed by the
    resident path with the cell's DataLoader workers (`workers`: a VTAB cell's default, 0), against the same loop
    on one ready batch; the loop synchronises only where fit does (its loss reads), so the share is what the data
    costs a real cell: (fed - ready) / fed. Also each path's batches alone (`data_resident`, `data_workers`: the
    per-example pipeline in 8 workers), over runs longer than the pipeline's prefetch buffer."""
    from transferbench.data.transforms import train_transform
    from transferbench.engine.batches import train_batches
    from transferbench.engine.losses import cross_entropy
    from transferbench.engine.train import fit, optimizer_options

    bf16 = device.startswith("cuda")
    tf = train_transform(res, "crop_flip")
    model = create_backbone(size, img_size=res, num_classes=100).to(device).train()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9, **optimizer_options(device))
    steps = 20 if bf16 else 2

    def stream(path: str, w: int):
        per_example = path == "workers"
        data = Synthetic(n, res * 8 // 7, 100, per_example=per_example)
        return train_batches(
            data, tf, batch=batch, steps=10**6, seed=0, workers=w, device=device, per_example=per_example
        )

    def loop(batches):
        def go():
            kw = dict(base_lr=1e-3, warmup=1, clip=1.0, loss_fn=cross_entropy, device=device, bf16=bf16)
            fit(model, batches, opt, steps=steps, **kw)
            sync(device)

        return go

    timed = functools.partial(_timed, seconds=seconds)
    out = {"size": size, "batch": batch, "workers": workers, "n": n, "res": res, "steps": steps}
    for path, w in (p for p in (("resident", workers), ("workers", 8)) if p[0] in paths):
        batches = stream(path, w)
        assert batches.info()["data_path"] == path
        run = 1 if path == "resident" else 8 * w + 1  # longer than the pipeline's prefetch buffer (4 a worker)
        out[f"data_{path}"] = timed(lambda: [next(batches) for _ in range(run)] and sync(device)) / run
        if fed_steps and path == "resident":
            ready = next(batches)
            out["step_ready"] = timed(loop(itertools.repeat(ready))) / steps
            out["step_resident"] = timed(loop(batches)) / steps
        batches = None  # the worker pipeline's processes end here, before the next path is timed
    return out


def embedded(out_dir: str, timeout: float = 240.0) -> dict:
    """The README's main command on this machine as a user types it (its default --jobs: several cells on a GPU),
    timed, then `regress` of its records against the committed CPU records of the same command (results/runs/vtab:
    other arithmetic, so judged statistically). Where the time goes: `breakdown`."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "TRANSFERBENCH_HOME": os.path.join(out_dir, "home")}
    records = os.path.join(out_dir, "vtab")
    cli = [sys.executable, "-m", "transferbench.cli"]
    started = time.time()
    subprocess.run([*cli, "--help"], env=env, capture_output=True, timeout=120)
    import_s = time.time() - started
    started = time.time()
    run = subprocess.run([*cli, "run", "vtab", "--suite", "embedded", "--out", records], env=env, capture_output=True,
                         text=True, timeout=timeout)  # fmt: skip
    wall = time.time() - started
    gate = subprocess.run(
        [*cli, "regress", "--baseline", "results/runs/vtab", "--current", records],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return {
        "wall_s": wall,
        "exit": run.returncode,
        "tail": run.stderr[-600:],
        "regress_exit": gate.returncode,
        "regress_head": gate.stdout[:1500],
        "breakdown": breakdown(records, started, wall, import_s),
    }


def breakdown(records: str, started: float, wall: float, import_s: float) -> dict:
    """Where a run's wall time went, from its records: the process's start-up (Python and the imports, timed on
    `--help`), the time before the first cell began (start-up, data, workers), each cell's set-up (its seconds less
    its training) and its training steps (`info.train_seconds`), summed over cells and divided by the cells run at
    once (the records' own overlap: the cell-seconds per second of the span from first start to last finish)."""
    import json
    from pathlib import Path

    cells = []
    for f in Path(records).rglob("*.json"):
        r = json.loads(f.read_text())
        if "seconds" in r:
            cells.append((f.stat().st_mtime, float(r["seconds"]), float((r.get("info") or {}).get("train_seconds", 0))))
    if not cells:
        return {"cells": 0}
    first_start = min(end - sec for end, sec, _ in cells)
    last_end = max(end for end, _, _ in cells)
    cell_s = sum(sec for _, sec, _ in cells)
    train_s = sum(t for _, _, t in cells)
    overlap = cell_s / max(last_end - first_start, 1e-9)
    return {
        "cells": len(cells),
        "import_s": import_s,
        "before_first_cell_s": first_start - started,
        "cells_span_s": last_end - first_start,
        "after_last_cell_s": started + wall - last_end,
        "cells_at_once": overlap,
        "setup_s": (cell_s - train_s) / overlap,
        "train_s": train_s / overlap,
        "setup_per_cell_s": (cell_s - train_s) / len(cells),
        "train_per_cell_s": train_s / len(cells),
    }


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()
