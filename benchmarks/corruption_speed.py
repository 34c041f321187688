"""Corruption generation costs (transferbench.data.corruptions), each against a peer in the same process:

    python -m benchmarks.corruption_speed [--images 600] [--render 32] [--size 16] [--processes 2] [--seconds 2]

- the generator cache: the 15 corruptions at severity 3 of `images` embedded photographs (rendered at
  `render` px, resized to `size`), read back from the content-addressed cache (`cached`: memory-mapped .npy,
  materialised) against generating them again (the adapter's way: a process pool of `processes`). Printed:
  corrupted images per second of each and the ratio;
- generation throughput: the same images through a process pool of `processes` workers against the
  single-process generator (same output, tested in tests/test_corruption.py). Printed: images per second
  and the ratio (2 cores: at most 2x).
"""

from __future__ import annotations

import argparse
import os
import tempfile

import numpy as np

from benchmarks import interleaved_medians


def _images(n: int, render: int) -> np.ndarray:
    from transferbench.data import embedded
    from transferbench.data.corruptions import render as rendered
    from transferbench.data.folder import FolderDataset

    data = FolderDataset(embedded.ensure(["photos"]), "photos", "test")
    return np.stack([rendered(data.image(i % len(data)), render, 1.0) for i in range(n)])


def _all(images, size, processes):
    from transferbench.data.corruptions import CORRUPTIONS, generate, image_seed

    return [
        generate(images, c, 3, [image_seed(0, i, c, 3) for i in range(len(images))], size, processes=processes)
        for c in CORRUPTIONS
    ]


def run(images: int = 600, render: int = 32, size: int = 16, processes: int = 2, seconds: float = 2.0) -> dict:
    from transferbench.data import corruptions as C

    clean = _images(images, render)
    n = images * len(C.CORRUPTIONS)
    with tempfile.TemporaryDirectory() as home:
        old = os.environ.get("TRANSFERBENCH_HOME")
        os.environ["TRANSFERBENCH_HOME"] = home
        try:
            keys = [C.cache_key(bench=c, n=images) for c in C.CORRUPTIONS]
            made = _all(clean, size, processes)
            for k, arr in zip(keys, made):
                C.cached(k, lambda arr=arr: (arr, np.zeros(len(arr), np.int64)))

            def from_cache():
                return [np.array(C.cached(k, None)[0].array()) for k in keys]

            same = all(np.array_equal(a, b) for a, b in zip(from_cache(), made))
            t = interleaved_medians(
                {
                    "cache": from_cache,
                    "pool": lambda: _all(clean, size, processes),
                    "single": lambda: _all(clean, size, 1),
                },
                seconds,
                block=0.0,
                min_rounds=3,
            )
        finally:
            if old is None:
                os.environ.pop("TRANSFERBENCH_HOME", None)
            else:
                os.environ["TRANSFERBENCH_HOME"] = old
    return {
        "images": images,
        "render": render,
        "size": size,
        "processes": processes,
        "n": n,
        "same": same,
        "per_second": {k: n / v for k, v in t.items()},
    }


def markdown(r: dict) -> str:
    ps = r["per_second"]
    return "\n".join(
        [
            f"The 15 corruptions at severity 3 of {r['images']} embedded photographs rendered at {r['render']} "
            f"px, resized "
            f"to {r['size']} ({r['n']:,} corrupted images per call).",
            "",
            "| what | images / s | ratio |",
            "|---|---|---|",
            f"| rerun: read from the generator cache | {ps['cache']:,.0f} | **{ps['cache'] / ps['pool']:.0f}x** vs "
            f"generating again{' (same arrays)' if r['same'] else ' (ARRAYS DIFFER)'} |",
            f"| generate, process pool of {r['processes']} | {ps['pool']:,.0f} | "
            f"**{ps['pool'] / ps['single']:.2f}x** vs "
            "one process |",
            f"| generate, one process | {ps['single']:,.0f} | 1.00x |",
        ]
    )


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=600)
    ap.add_argument("--render", type=int, default=32)
    ap.add_argument("--size", type=int, default=16)
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=2.0)
    a = ap.parse_args()
    print(markdown(run(a.images, a.render, a.size, a.processes, a.seconds)))
