"""Executors on one machine: the embedded VTAB suite through each, in one home, one after another:

    python -m benchmarks.executors [--task vtab] [--suite embedded] [--jobs 2] [--no-ray]

- `--executor local --jobs 1` (in process, torch on every core) against `--jobs N` (N worker processes with
  cores/N threads each): wall-clock ratio, and whether the records are the same (keys, and metrics to the
  last digit);
- with Ray installed (extra `scale`), `--executor ray` on a local Ray instance of this machine's cores, one
  CPU per cell (on 2 cores: 2 cells at once, as `--jobs 2`), against `--jobs N`: the overhead per cell in
  seconds, Ray's start included, and whether the records are the same.

The embedded data is generated before the first run, so no run pays for it. Each run is a
`transferbench run` subprocess timed from start to exit. About 15 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _records(out: Path) -> dict:
    from transferbench.records.store import load_records

    return {r["key"]: r for r in load_records([out])}


def _run(task: str, suite: str, out: Path, home: str, extra: list[str]) -> tuple[float, int]:
    cmd = [
        sys.executable,
        "-m",
        "transferbench.cli",
        "run",
        task,
        "--suite",
        suite,
        "--out",
        str(out),
        "--no-progress",
        *extra,
    ]
    started = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "TRANSFERBENCH_HOME": home})
    wall = time.time() - started
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stderr[-2000:]}")
    return wall, len(_records(out))


def _same(a: dict, b: dict) -> str:
    """'identical', or how many cells differ and by how much (accuracy points, the largest per split)."""
    if set(a) != set(b):
        return f"different cells ({len(set(a) ^ set(b))} differ)"
    worst: dict[str, float] = {}
    differ = 0
    for k in a:
        d = {
            s: max(abs(a[k]["metrics"][s][m] - b[k]["metrics"][s][m]) for m in a[k]["metrics"][s])
            for s in a[k]["metrics"]
        }
        differ += any(v > 0 for v in d.values())
        for s, v in d.items():
            worst[s] = max(worst.get(s, 0.0), v)
    if not differ:
        return "identical"
    return (
        f"{len(a) - differ}/{len(a)} cells identical; largest difference "
        + ", ".join(f"{s} {v:.2f}" for s, v in sorted(worst.items()))
        + " points"
    )


def run(task: str = "vtab", suite: str = "embedded", jobs: int = 2, ray: bool = True) -> dict:
    from transferbench.data import embedded
    from transferbench.engine.executors import usable_cores

    with tempfile.TemporaryDirectory() as home:
        old = os.environ.get("TRANSFERBENCH_HOME")
        os.environ["TRANSFERBENCH_HOME"] = home
        try:
            embedded.ensure()
        finally:
            os.environ.pop("TRANSFERBENCH_HOME") if old is None else os.environ.__setitem__("TRANSFERBENCH_HOME", old)
        root = Path(home)
        one, cells = _run(task, suite, root / "jobs1", home, [])
        many, _ = _run(task, suite, root / "jobsN", home, ["--jobs", str(jobs)])
        res = {
            "task": task,
            "suite": suite,
            "jobs": jobs,
            "cores": usable_cores(),
            "cells": cells,
            "jobs1": one,
            "jobsN": many,
            "same": _same(_records(root / "jobs1"), _records(root / "jobsN")),
        }
        if ray and importlib.util.find_spec("ray") is not None:
            # a local Ray instance on this machine's cores, one CPU per cell (on 2 cores: 2 at once, as --jobs 2)
            wall, _ = _run(task, suite, root / "ray", home, ["--executor", "ray", "--cpus-per-cell", "1"])
            res.update(ray=wall, ray_same=_same(_records(root / "jobsN"), _records(root / "ray")))
    return res


def markdown(r: dict) -> str:
    rows = [
        f"The embedded `{r['task']}` suite ({r['cells']} cells), one machine with {r['cores']} cores, data "
        "generated beforehand; each run a `transferbench run` subprocess from start to exit.",
        "",
        "| executor | wall | per cell | vs `--jobs 1` | records |",
        "|---|---|---|---|---|",
        f"| `--executor local --jobs 1` (in process, {r['cores']} threads) | {r['jobs1'] / 60:.2f} min | "
        f"{r['jobs1'] / r['cells']:.2f} s | 1.00x | reference |",
        f"| `--executor local --jobs {r['jobs']}` ({max(1, r['cores'] // r['jobs'])} thread each) | "
        f"{r['jobsN'] / 60:.2f} min | {r['jobsN'] / r['cells']:.2f} s | **{r['jobs1'] / r['jobsN']:.2f}x** faster | "
        f"{r['same']} |",
    ]
    if "ray" in r:
        over = (r["ray"] - r["jobsN"]) / r["cells"]
        rows.append(
            f"| `--executor ray` (local instance, 1 CPU per cell) | {r['ray'] / 60:.2f} min | "
            f"{r['ray'] / r['cells']:.2f} s | {r['jobs1'] / r['ray']:.2f}x | {r['ray_same']} vs `--jobs "
            f"{r['jobs']}` |"
        )
        rows += [
            "",
            f"Ray's overhead against `--jobs {r['jobs']}` (same cells at once): **{over:+.2f} s per cell** "
            f"({r['ray'] - r['jobsN']:+.1f} s over the run, Ray's start included).",
        ]
    else:
        rows += ["", "Ray is not installed (`pip install -e '.[scale]'`): no Ray row."]
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", default="vtab")
    ap.add_argument("--suite", default="embedded")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--no-ray", action="store_true", help="skip the Ray row")
    args = ap.parse_args()
    print(markdown(run(args.task, args.suite, args.jobs, not args.no_ray)))


if __name__ == "__main__":
    main()
