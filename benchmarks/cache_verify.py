"""What verifying a cache entry costs against reading it (transferbench.paths.entries.verified: each file's size
and checksum, the CRC-32 of each 8 MiB block in parallel threads, against the digest written with it; once per run
in a process while the file keeps its size and mtime). sha256 of the same bytes, one thread, is timed beside it for
scale.

    python -m benchmarks.cache_verify [--seconds 2] [--mb 200]

Rows, both read from the page cache (a warm file: the case where verification weighs most; a cold read from
disk is slower and the ratio smaller):
- a feature entry (`.npz` of float32 pre-logits: 65,000 x 768, the size of few-shot ImageNet's 65,000 training
  images at ViT-B width, scaled by --mb): `np.load` of both arrays vs the first verification; target <= 0.5x;
- a corruption entry (uint8 images, memory-mapped as the robustness cells read them): turning every image into
  the [-1, 1] float batches the model gets (what a cell does before its forward passes) vs the first
  verification; target <= 0.5x (a bare copy of the array is about as fast as the verification itself);
- a later verification of the same entry in the same run and process (a stat of each file): microseconds.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import numpy as np

from benchmarks import interleaved_medians


def _verify(path, directory=False):
    from transferbench.paths.entries import damage
    from transferbench.paths.ledger import Ledger

    with Ledger().held():  # as a new run: the first verification hashes every byte
        assert damage(path, directory=directory) is None


def _features(d: str, mb: float, seconds: float) -> list[dict]:
    """A features entry of `mb` MB: reading it against verifying it and hashing it; then verifying it again in the
    same run."""
    from transferbench.hashing import sha256_file
    from transferbench.paths.entries import damage, sealed
    from transferbench.paths.ledger import Ledger

    n = max(1, int(mb * 1e6 / (768 * 4)))
    feats = np.random.default_rng(0).normal(size=(n, 768)).astype(np.float32)
    entry = Path(d) / "features" / "k.npz"
    with sealed(entry, suffix=".npz") as tmp:
        np.savez(tmp, features=feats, labels=np.arange(n))
    del feats

    def load():
        with np.load(entry) as z:
            return z["features"], z["labels"]

    t = interleaved_medians(
        {"read": load, "verify": lambda: _verify(entry), "sha256": lambda: sha256_file(entry)}, seconds
    )
    first = {
        "entry": f"features .npz, {entry.stat().st_size / 1e6:.0f} MB",
        "read_ms": 1e3 * t["read"],
        "verify_ms": 1e3 * t["verify"],
        "sha256_ms": 1e3 * t["sha256"],
    }
    with Ledger().held():  # one run: the entry is hashed once, then each check is a stat of its files
        damage(entry)
        t = interleaved_medians({"again": lambda: damage(entry)}, seconds / 4)
    again = {"entry": "the features entry again, same process", "read_ms": float("nan"), "verify_ms": 1e3 * t["again"]}
    return [first, again]


def _images(d: str, mb: float, seconds: float) -> dict:
    """A corruption images entry of `mb` MB read as a robustness cell reads it, against verifying it."""
    from transferbench.paths.entries import sealed

    folder = Path(d) / "corruptions" / "k"
    images = np.random.default_rng(1).integers(
        0, 256, (max(1, int(mb * 1e6 / (224 * 224 * 3))), 224, 224, 3), dtype=np.uint8
    )
    with sealed(folder, directory=True) as tmp:
        np.save(tmp / "images.npy", images)
        np.save(tmp / "labels.npy", np.arange(len(images)))
    del images

    def read_images():  # what a robustness cell does before its model: each batch as [-1, 1] float tensors
        import torch

        mm = np.load(folder / "images.npy", mmap_mode="r")
        for i in range(0, len(mm), 256):
            torch.from_numpy(np.array(mm[i : i + 256])).permute(0, 3, 1, 2).float().div_(127.5).sub_(1.0)

    t = interleaved_medians({"read": read_images, "verify": lambda: _verify(folder, True)}, seconds)
    size = (folder / "images.npy").stat().st_size / 1e6
    return {
        "entry": f"corruption images .npy (mmap) to float batches, {size:.0f} MB",
        "read_ms": 1e3 * t["read"],
        "verify_ms": 1e3 * t["verify"],
    }


def run(mb: float = 200, seconds: float = 2.0) -> list[dict]:
    with tempfile.TemporaryDirectory() as d:
        os.environ["TRANSFERBENCH_HOME"] = d
        first, again = _features(d, mb, seconds)
        return [first, _images(d, mb, seconds), again]


def markdown(rows: list[dict]) -> str:
    out = [
        "| entry | read | verify (size + checksum) | verify / read | target | sha256, 1 thread (context) |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        sha = f"{r['sha256_ms']:.1f} ms" if "sha256_ms" in r else "-"
        if r["read_ms"] == r["read_ms"]:
            ratio = r["verify_ms"] / r["read_ms"]
            out.append(
                f"| {r['entry']} | {r['read_ms']:.1f} ms | {r['verify_ms']:.1f} ms | {ratio:.2f}x | "
                f"<= 0.5x {'ok' if ratio <= 0.5 else 'MISSED'} | {sha} |"
            )
        else:
            out.append(f"| {r['entry']} | - | {1e3 * r['verify_ms']:.0f} µs | - | - | - |")
    return "\n".join(out)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--mb", type=float, default=200)
    a = ap.parse_args()
    print(markdown(run(a.mb, a.seconds)))
