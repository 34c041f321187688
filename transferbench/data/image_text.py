"""Image-text pairs in the formats open_clip users already have, read in a fixed order.

- CSV/TSV (open_clip's `--train-data x.csv --csv-img-key filepath --csv-caption-key title
  --csv-separator '\\t'`): one row per pair; relative image paths are relative to the file's folder.
- webdataset tar shards (`/data/cc12m/{00000..01242}.tar`, a folder of `*.tar`, or one `.tar`): each
  sample is `KEY.jpg|jpeg|png|webp` + `KEY.txt`, read with the `webdataset` library in shard order.

`open_pairs(spec)` picks the reader. Both yield (PIL RGB image, caption) in the same order every time,
so the frozen image tower's features can be computed once and cached in that order (engine.features)
and a held-out tail of `heldout` pairs means the same pairs on every run. A missing or malformed file is
one UserError naming it and what was expected.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from pathlib import Path

from PIL import Image

from ..errors import UserError
from ..paths.writes import atomic_path
from .folder import DataMissingError

IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp")
CSV_SUFFIXES = (".csv", ".tsv")


class MalformedPairsError(UserError):
    """An image-text file that exists but does not hold what the reader expects."""


class CsvPairs:
    """Rows of a CSV/TSV with an image-path column and a caption column (open_clip's CsvDataset)."""

    def __init__(self, path, img_key: str = "filepath", caption_key: str = "title", sep: str = "\t"):
        self.path = Path(path)
        if not self.path.is_file():
            raise DataMissingError(
                f"image-text CSV {self.path} does not exist (expected a {sep_name(sep)}-separated "
                f"file with columns {img_key!r} and {caption_key!r})"
            )
        with open(self.path, newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f, delimiter=sep)
            columns = reader.fieldnames or []
            missing = [k for k in (img_key, caption_key) if k not in columns]
            if missing:
                shown = ", ".join(repr(c) for c in columns) or "none (empty file)"
                raise MalformedPairsError(
                    f"{self.path}: no column {' or '.join(repr(m) for m in missing)} in the header (found {shown}); "
                    f"expected {img_key!r} and {caption_key!r}, {sep_name(sep)}-separated "
                    "(set csv_img_key / csv_caption_key / csv_separator with --set)"
                )
            rows = []
            for line, row in enumerate(reader, start=2):
                img, cap = row.get(img_key), row.get(caption_key)
                if not img or cap is None:
                    raise MalformedPairsError(
                        f"{self.path}:{line}: empty {img_key!r} or missing {caption_key!r} "
                        f"(expected {len(columns)} {sep_name(sep)}-separated fields)"
                    )
                rows.append((img, cap))
        if not rows:
            raise MalformedPairsError(
                f"{self.path}: a header but no rows; expected one {img_key!r},{caption_key!r} row per image-text pair"
            )
        self.files = [r[0] for r in rows]
        self.captions = [r[1] for r in rows]

    def __len__(self) -> int:
        return len(self.captions)

    def image_path(self, i: int) -> Path:
        p = Path(self.files[i])
        return p if p.is_absolute() else self.path.parent / p

    def __iter__(self) -> Iterator[tuple[Image.Image, str]]:
        for i in range(len(self)):
            p = self.image_path(i)
            if not p.is_file():
                raise DataMissingError(f"{self.path}: row {i + 2} names image {p}, which does not exist")
            try:
                with Image.open(p) as im:
                    image = im.convert("RGB")
            except OSError as e:
                raise MalformedPairsError(f"{self.path}: row {i + 2}: {p} is not a readable image ({e})") from None
            yield image, self.captions[i]


def sep_name(sep: str) -> str:
    return {"\t": "tab", ",": "comma"}.get(sep, repr(sep))


def expand_shards(spec: str) -> list[Path]:
    """`a/{000..009}.tar` (brace ranges, webdataset's notation), a folder (its *.tar, sorted) or one file."""
    from braceexpand import braceexpand

    p = Path(spec)
    if p.is_dir():
        shards = sorted(p.glob("*.tar"))
        if not shards:
            raise DataMissingError(f"{p} holds no *.tar shards (expected webdataset shards of KEY.jpg|png + KEY.txt)")
        return shards
    shards = [Path(s) for s in braceexpand(spec)]
    absent = [s for s in shards if not s.is_file()]
    if absent:
        more = f" (and {len(absent) - 1} more of {len(shards)})" if len(absent) > 1 else ""
        raise DataMissingError(f"webdataset shard {absent[0]} does not exist{more}")
    return shards


class ShardPairs:
    """webdataset tar shards of KEY.{jpg,jpeg,png,webp} + KEY.txt, read in shard order."""

    def __init__(self, shards: list[Path] | str):
        self.shards = expand_shards(shards) if isinstance(shards, str) else [Path(s) for s in shards]

    def __iter__(self) -> Iterator[tuple[Image.Image, str]]:
        import tarfile

        import webdataset as wds

        urls = [str(s) for s in self.shards]
        ds = wds.WebDataset(urls, shardshuffle=False, empty_check=False, nodesplitter=None, workersplitter=None)
        try:
            for sample in ds:
                where = f"{sample.get('__url__', '?')} sample {sample.get('__key__', '?')!r}"
                ext = next((e for e in IMAGE_EXTENSIONS if e in sample), None)
                if ext is None or "txt" not in sample:
                    have = ", ".join(sorted(k for k in sample if not k.startswith("__"))) or "nothing"
                    raise MalformedPairsError(f"{where} has {have}; expected KEY.jpg|jpeg|png|webp with KEY.txt")
                try:
                    with Image.open(io.BytesIO(sample[ext])) as im:
                        image = im.convert("RGB")
                except OSError as e:
                    raise MalformedPairsError(f"{where}: .{ext} is not a readable image ({e})") from None
                yield image, sample["txt"].decode("utf-8").strip()
        except (OSError, ValueError, tarfile.TarError) as e:  # a truncated or non-tar shard
            if isinstance(e, UserError):
                raise
            raise MalformedPairsError(
                f"webdataset shards {urls[0]}..: cannot be read as tar ({e}); "
                "expected tar files of KEY.jpg|png + KEY.txt"
            ) from None


def pairs_identity(spec: str) -> dict:
    """What determines the pairs of `spec` (for the feature cache), without reading them: a CSV's path and
    sha256 (its rows; hashed once per size and modification time), shards' paths, sizes and modification
    times (hashing terabytes of shards is not an option). Images a CSV names are taken as immutable, as
    tfds and webdataset shards are (re-exported images belong under a new file name)."""
    import hashlib

    from ..hashing import file_sha256

    if str(spec).lower().endswith(CSV_SUFFIXES):
        path = Path(spec)
        if not path.is_file():
            raise DataMissingError(f"image-text CSV {path} does not exist")
        return {"format": "csv", "path": str(path.resolve()), "sha256": file_sha256(path)}
    stats = [(str(s.resolve()), s.stat().st_size, s.stat().st_mtime_ns) for s in expand_shards(spec)]
    return {
        "format": "webdataset",
        "shards": len(stats),
        "first": stats[0][0],
        "stats": hashlib.sha256(repr(stats).encode()).hexdigest()[:16],
    }


def open_pairs(spec: str, *, img_key: str = "filepath", caption_key: str = "title", sep: str = "\t"):
    """The reader for `spec`: a .csv/.tsv file, or webdataset shards (brace pattern, folder or .tar)."""
    if str(spec).lower().endswith(CSV_SUFFIXES):
        return CsvPairs(spec, img_key, caption_key, sep)
    if not (str(spec).endswith(".tar") or "{" in str(spec) or Path(spec).is_dir()):
        raise UserError(
            f"image-text data {spec!r}: give a .csv/.tsv of {img_key},{caption_key} rows, webdataset "
            "shards as 'DIR/{00000..00099}.tar', a folder of .tar shards, or `embedded`"
        )
    return ShardPairs(spec)


def write_shards(root, name: str, pairs, info: dict, shard_size: int = 1024) -> Path:
    """Write (uint8 image array, caption) pairs as webdataset shards `pairs-00000.tar`, ... (PNG + txt, keys
    in order, fixed tar metadata so the bytes depend on the pairs only) with info.json and a sha256
    MANIFEST, appearing atomically (written aside, then renamed)."""
    import json

    import numpy as np
    import webdataset as wds

    from ..hashing import sha256_file
    from .folder import INFO, MANIFEST

    root = Path(root)
    final = root / name
    with atomic_path(final, directory=True) as tmp:
        writer, n = None, 0
        for i, (img, caption) in enumerate(pairs):
            if i % shard_size == 0:
                if writer is not None:
                    writer.close()
                writer = wds.TarWriter(str(tmp / f"pairs-{i // shard_size:05d}.tar"), mtime=0.0)
            buf = io.BytesIO()
            Image.fromarray(np.asarray(img, dtype=np.uint8)).save(buf, format="PNG", optimize=False, compress_level=1)
            writer.write({"__key__": f"{i:06d}", "png": buf.getvalue(), "txt": caption})
            n += 1
        if writer is not None:
            writer.close()
        (tmp / INFO).write_text(
            json.dumps({**info, "name": name, "pairs": n, "shard_size": shard_size}, indent=1, sort_keys=True)
        )
        files = sorted(p for p in tmp.iterdir() if p.is_file() and p.name != MANIFEST)
        (tmp / MANIFEST).write_text("".join(f"{sha256_file(p)}  {p.name}\n" for p in files))
    return final
