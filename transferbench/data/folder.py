"""The image-folder format (the PyTorch community's VTAB export), also used by the embedded suite.

    <root>/<dataset>/
        train800.txt  val200.txt  train800val200.txt  test.txt    # lines: "relative/path label"
        images/...                                                # PNG (lossless)
        masks/...                                                 # segmentation sets: a PNG mask per image,
                                                                  # lines "images/... masks/..."
        MANIFEST.sha256                                           # "<sha256>  <relative/path>" per file
        info.json                                                 # classes, sizes, source, version

Opening a split verifies the sha256 of its list and of every image it names.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from ..errors import UserError
from ..hashing import sha256_file
from ..paths.writes import atomic_path

SPLITS = ("train800", "val200", "train800val200", "test")
MANIFEST = "MANIFEST.sha256"
INFO = "info.json"


class DataMissingError(UserError):
    """A dataset that is not where we looked; the message says where and how to prepare it."""


class CorruptDataError(UserError):
    """A file whose sha256 differs from the manifest (`detail`: what is wrong, without the fix)."""

    def __init__(self, message: str, detail: str = ""):
        super().__init__(message)
        self.detail = detail or message


def write_folder_dataset(root, name: str, splits: dict[str, Iterable[tuple[np.ndarray, int]]], info: dict) -> Path:
    """Write `splits` ({'train800': [(uint8 HxW or HxWx3, label), ...], 'val200': ..., 'test': ...}; any
    iterables, consumed once) as PNGs plus lists, manifest and info. A label that is an array is a
    segmentation mask (uint8 H x W): it is written as a PNG under masks/ and the list line names both
    files. `train800val200` is written as train800 followed by val200. The folder appears atomically
    (written aside, then renamed)."""
    root = Path(root)
    final = root / name
    with atomic_path(final, directory=True) as tmp:
        (tmp / "images").mkdir()
        lists: dict[str, list[str]] = {}
        for split, items in splits.items():
            lines = []
            for i, (img, label) in enumerate(items):
                rel = f"images/{split}/{i:05d}.png"
                (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
                Image.fromarray(np.asarray(img, dtype=np.uint8)).save(tmp / rel, optimize=False, compress_level=1)
                if isinstance(label, np.ndarray):
                    mask_rel = f"masks/{split}/{i:05d}.png"
                    (tmp / mask_rel).parent.mkdir(parents=True, exist_ok=True)
                    Image.fromarray(label.astype(np.uint8)).save(tmp / mask_rel, optimize=False, compress_level=1)
                    lines.append(f"{rel} {mask_rel}")
                else:
                    lines.append(f"{rel} {int(label)}")
            lists[split] = lines
        if "train800" in lists and "val200" in lists:
            lists["train800val200"] = lists["train800"] + lists["val200"]
        for split, lines in lists.items():
            (tmp / f"{split}.txt").write_text("\n".join(lines) + "\n")
        info = {**info, "name": name, "sizes": {s: len(v) for s, v in lists.items()}}
        (tmp / INFO).write_text(json.dumps(info, indent=1, sort_keys=True))
        files = sorted(p for p in tmp.rglob("*") if p.is_file() and p.name != MANIFEST)
        (tmp / MANIFEST).write_text("".join(f"{sha256_file(p)}  {p.relative_to(tmp).as_posix()}\n" for p in files))
    return final


def verify_files(folder: Path, name: str, rel_paths) -> None:
    """Each file (relative to the dataset folder) is in the manifest, exists and has its sha256."""
    manifest = folder / MANIFEST
    if not manifest.is_file():
        raise CorruptDataError(
            f"{manifest} is missing: cannot verify dataset {name!r}; re-export it", f"{MANIFEST} missing"
        )
    expected = dict(reversed(line.split("  ", 1)) for line in manifest.read_text().splitlines() if line)
    for rel in dict.fromkeys(rel_paths):
        p = folder / rel
        if rel not in expected:
            raise CorruptDataError(f"{p} is not in {manifest}; re-export dataset {name!r}", f"{rel} not in {MANIFEST}")
        if not p.is_file():
            raise CorruptDataError(f"{p} listed in {manifest} is missing; re-export dataset {name!r}", f"{rel} missing")
        if sha256_file(p) != expected[rel]:
            raise CorruptDataError(
                f"{p} does not match its sha256 in {manifest}: the file changed; re-export dataset {name!r}",
                f"{rel}: sha256 differs from {MANIFEST}",
            )


def read_info(root, name: str) -> dict:
    """A dataset's info.json; {} when there is none. One that does not parse is a CorruptDataError."""
    p = Path(root) / name / INFO
    if not p.is_file():
        return {}
    try:
        return json.loads(p.read_text())
    except ValueError as e:
        raise CorruptDataError(f"{p} is unreadable ({e}); re-export dataset {name!r}", f"{INFO} unreadable") from None


def read_split(
    folder: Path,
    split: str,
    not_found: Callable[[Path], Exception],
    verify: Callable[[list[str]], None] | None = None,
    check: Callable[[Path, list[str]], None] | None = None,
) -> list[str]:
    """The lines of `split`: a list's name, or tfds slicing over the lists (`train800[:100]`,
    `training[384:]+validation`). Each list named is verified (`verify`, before it is parsed) and checked whole
    (`check`); `not_found(where)` is raised for a missing one."""
    from .splits import resolve_split

    lists = {}
    for piece in split.split("+"):
        part = piece.strip().split("[")[0]
        lst = folder / f"{part}.txt"
        if not lst.is_file():
            raise not_found(folder if not folder.is_dir() else lst)
        if verify:  # the list first: a damaged one is not parsed
            verify([lst.name])
        lists[part] = [line for line in lst.read_text().splitlines() if line.strip()]
        if check:
            check(lst, lists[part])
    picked = resolve_split(split, {k: len(v) for k, v in lists.items()})
    return [lists[part][i] for part, idx in picked for i in idx]


class FolderDataset(torch.utils.data.Dataset):
    """(image, label) pairs of one split; images as RGB PIL passed through `transform`."""

    def __init__(
        self,
        root,
        name: str,
        split: str,
        transform: Callable | None = None,
        *,
        verify: bool = True,
        prepare_hint: str = "",
    ):
        self.dir = Path(root) / name
        self.name, self.split, self.transform = name, split, transform
        lines = read_split(
            self.dir,
            split,
            lambda where: DataMissingError(
                f"dataset {name!r} split {split!r} not found: looked for {where}"
                + (f"; prepare it with `{prepare_hint}`" if prepare_hint else "")
            ),
            verify=(lambda lists: self.verify([*lists, *([INFO] if (self.dir / INFO).is_file() else [])]))
            if verify
            else None,
        )
        rows = [line.rsplit(" ", 1) for line in lines]
        self.paths = [r[0] for r in rows]
        self.labels = np.array([int(r[1]) for r in rows], dtype=np.int64)
        self.info = read_info(root, name)
        self.num_classes = int(self.info.get("num_classes", self.labels.max() + 1 if len(self.labels) else 0))
        if verify:
            self.verify(self.paths)

    def verify(self, rel_paths) -> None:
        verify_files(self.dir, self.name, rel_paths)

    def __len__(self) -> int:
        return len(self.paths)

    def array(self) -> np.ndarray:
        """Every image decoded once, as uint8 (N, H, W, 3) (same-size images only): training loops
        that revisit images many times skip the PNG decoding."""
        if not hasattr(self, "_array"):
            self._array = np.stack([self.pixels(i) for i in range(len(self))])
            self._pixels = {}  # held by the array now
        return self._array

    def pixels(self, i: int) -> np.ndarray:
        """Image `i` as uint8 (H, W, 3), decoded at its first visit and kept (a row of `array()` once that is
        made): a short run that visits a tenth of a large split decodes only that tenth."""
        if hasattr(self, "_array"):
            return self._array[i]
        kept = self.__dict__.setdefault("_pixels", {})
        if i not in kept:
            kept[i] = np.array(self.image(i))
        return kept[i]

    def image(self, i: int) -> Image.Image:
        with Image.open(self.dir / self.paths[i]) as im:
            return im.convert("RGB")  # grayscale tiled to 3 channels

    def __getitem__(self, i: int):
        img = self.image(i)
        return (self.transform(img) if self.transform else img), int(self.labels[i])
