"""ImageNet-C corruptions: the released data, and the 15 corruptions generated for any dataset.

Released data (Hendrycks & Dietterich, ICLR 2019):
  ImageNetCFolder   `<root>/<corruption>/<severity>/<wnid>/*.JPEG` (ImageNet-C, Tiny-ImageNet-C); labels are
                    the index of the wnid among the folder's sorted wnids (ImageNet's class order)
  NpyCorrupted      CIFAR-10-C / CIFAR-100-C: `<root>/<corruption>.npy` holds the 5 severities one after
                    another (10,000 images each) and `<root>/labels.npy` their labels
  tfds              `imagenet2012_corrupted/<corruption>_<severity>` through tfds.data_source (TfdsDataset)

Generated corruptions (`corrupted_split`): any dataset the harness reads (tfds, folders, embedded) is put
through the maintained `imagecorruptions-imaug` package (bethgelab's `imagecorruptions` API and parameters:
the 15 functions of the paper's code, severities 1-5). Each image is first brought to the `render` size as
ImageNet-C's images were (short side to render / crop_pct, centre crop; 256 -> 224 for ImageNet), corrupted
there, then resized to the model's input size. The randomness of every image is seeded from (dataset
identity, image index, corruption, severity), so the output does not depend on batching or on the number of
processes, and the result is cached under $TRANSFERBENCH_HOME/corruptions by content (dataset identity,
split, geometry, corruption, severity, generator version): a rerun reads it instead of generating it.
"""

from __future__ import annotations

import atexit
import os
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from ..errors import UserError
from ..fingerprint import for_cache, stamp
from ..paths.entries import sealed, verified
from ..paths.home import cache
from .folder import DataMissingError
from .imagenet_c import CORRUPTIONS, FAMILIES, SEVERITIES  # noqa: F401 (public names)

GENERATOR_VERSION = "1"  # bump when generation (geometry, seeding) changes
PACKAGE = "imagecorruptions-imaug"
INSTALL = "pip install 'transferbench[corruptions]' (imagecorruptions-imaug==1.1.5)"
CHUNK = 64  # images per task sent to a worker process


def check_name(corruption: str) -> str:
    if corruption not in CORRUPTIONS:
        from ..errors import close_matches

        raise UserError(
            f"unknown corruption {corruption!r}{close_matches(corruption, CORRUPTIONS)}; the 15 are: "
            f"{', '.join(CORRUPTIONS)}"
        )
    return corruption


@lru_cache(maxsize=1)
def generator_identity() -> dict:
    """The package that generates corruptions, by distribution and version (part of every cache key).
    The original `imagecorruptions` 1.1.2 is refused: with numpy 2 / scikit-image 0.26 its glass_blur
    and fog fail."""
    from importlib import metadata

    try:
        version = metadata.version(PACKAGE)
    except metadata.PackageNotFoundError:
        try:
            old = metadata.version("imagecorruptions")
        except metadata.PackageNotFoundError:
            raise UserError(f"generating corruptions needs the {PACKAGE} package: {INSTALL}") from None
        raise UserError(
            f"imagecorruptions {old} is installed, whose glass_blur and fog fail with numpy 2 and "
            f"scikit-image 0.26; install its maintained fork instead: pip uninstall -y imagecorruptions "
            f"&& {INSTALL}"
        ) from None
    return {"package": PACKAGE, "version": version, "v": GENERATOR_VERSION}


def image_seed(base: int, index: int, corruption: str, severity: int) -> int:
    """The seed of one corrupted image: (dataset identity, image index, corruption, severity) -> 32 bits."""
    return int(np.random.SeedSequence([base, index, CORRUPTIONS.index(corruption), severity]).generate_state(1)[0])


class _KeptImread:
    """cv2 for imagecorruptions' module with an `imread` that keeps what it read: frost() decodes one of six
    frost photographs from disk on every call (most of its time at small sizes); it only reads the array, so a
    copy of the kept one gives the same output. Everything else is cv2's."""

    def __init__(self, cv2):
        self._cv2, self._kept = cv2, {}

    def imread(self, path, *args):
        key = (str(path), args)
        if key not in self._kept:
            self._kept[key] = self._cv2.imread(str(path), *args)
        return self._kept[key].copy()

    def __getattr__(self, name):
        return getattr(self._cv2, name)


def _keep_frost_reads() -> None:
    import imagecorruptions.corruptions as module

    if not isinstance(module.cv2, _KeptImread):
        module.cv2 = _KeptImread(module.cv2)


def corrupt(image: np.ndarray, corruption: str, severity: int, seed: int) -> np.ndarray:
    """`image` (uint8 H x W x 3, H and W >= 32) under `corruption` at `severity`, deterministic in `seed`:
    numpy's global generator is seeded (the package draws from it) and the two functions that take a seed
    (glass_blur's jitted pixel shuffle, impulse_noise's scikit-image noise) get it."""
    from imagecorruptions import corrupt as apply

    _keep_frost_reads()
    np.random.seed(seed)
    extra = {"seed": seed} if corruption in ("glass_blur", "impulse_noise") else {}
    return np.asarray(apply(image, severity=severity, corruption_name=corruption, **extra), dtype=np.uint8)


def render(image, size: int, crop_pct: float = 1.0) -> np.ndarray:
    """An image (PIL or uint8 array) as ImageNet-C's inputs were made: short side to round(size / crop_pct),
    centre crop size x size (crop_pct 0.875: ImageNet's 256 -> 224); uint8 (size, size, 3)."""
    from torchvision.transforms import v2

    pil = image if isinstance(image, Image.Image) else Image.fromarray(np.asarray(image, dtype=np.uint8))
    out = v2.CenterCrop(size)(v2.Resize(round(size / crop_pct))(pil.convert("RGB")))
    return np.asarray(out, dtype=np.uint8)


def resize(images: np.ndarray, size: int) -> np.ndarray:
    """uint8 (N, H, W, 3) -> (N, size, size, 3), PIL's antialiased bilinear (what eval transforms use)."""
    if images.shape[1] == size and images.shape[2] == size:
        return images
    return np.stack([np.asarray(Image.fromarray(im).resize((size, size), Image.BILINEAR)) for im in images])


def _work(task) -> np.ndarray:
    images, seeds, corruption, severity, size = task
    return resize(np.stack([corrupt(im, corruption, severity, int(s)) for im, s in zip(images, seeds)]), size)


_POOL: dict = {}


def pool(processes: int):
    """A process pool kept for the life of this process (the generator's imports and glass_blur's numba
    compilation are paid once per worker). forkserver: workers fork from a clean server that never ran torch."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    if processes not in _POOL:
        for p in list(_POOL.values()):
            p.shutdown()
        _POOL.clear()
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["transferbench.data._corruption_worker"])
        _POOL[processes] = ProcessPoolExecutor(processes, mp_context=ctx)
        # a multiprocessing worker (a --jobs cell process) ends through os._exit, where atexit never runs, after
        # joining its child processes: the pool must be shut down first, or that join waits on it for ever; and
        # before its queues close (their finalizers have priority 10), or its workers never hear of it
        multiprocessing.util.Finalize(None, _shutdown, exitpriority=100)
    return _POOL[processes]


@atexit.register
def _shutdown() -> None:
    for p in _POOL.values():
        p.shutdown(cancel_futures=True)
    _POOL.clear()


def generate(
    clean: np.ndarray,
    corruption: str,
    severity: int,
    seeds,
    size: int,
    *,
    processes: int = 1,
    progress=None,
    desc: str = "corrupting",
) -> np.ndarray:
    """Corrupt every image of `clean` (uint8 (N, R, R, 3), R >= 32) with its seed, then resize to `size`.
    `processes` > 1 spreads chunks of images over a process pool; the output is the same either way."""
    check_name(corruption)
    if severity not in SEVERITIES:
        raise ValueError(f"severity must be one of {SEVERITIES}, got {severity!r}")
    generator_identity()
    if clean.shape[1] < 32 or clean.shape[2] < 32:
        raise ValueError(
            f"the corruption functions need images of at least 32 x 32, got {clean.shape[1:3]}: "
            "render them larger (--set render=64)"
        )
    seeds = np.asarray(seeds)
    tasks = [
        (clean[i : i + CHUNK], seeds[i : i + CHUNK], corruption, severity, size) for i in range(0, len(clean), CHUNK)
    ]
    results = pool(processes).map(_work, tasks) if processes > 1 and len(tasks) > 1 else map(_work, tasks)
    if progress is not None:
        results = progress(results, total=len(tasks), desc=desc)
    return np.concatenate(list(results)) if tasks else np.zeros((0, size, size, 3), np.uint8)


# --- the content-addressed cache ----------------------------------------------------------------------


def cache_dir() -> Path:
    return cache("corruptions")


def cache_key(**identity) -> str:
    from ..hashing import digest

    return digest(identity)


def entry_name(key: str) -> str:
    """A cache entry's folder name: its content key (`cache_key`) with the fingerprint of what generates it (the
    key alone also seeds the corruptions' draws, which no code change may move)."""
    return stamp(key, for_cache("corruptions"))


class ArraySet(torch.utils.data.Dataset):
    """uint8 images (N, H, W, 3) and labels held as arrays (a cache entry, memory-mapped): the training
    loop's fast path (`array()`) and a Dataset of PIL images for everything else."""

    def __init__(self, images: np.ndarray, labels: np.ndarray, num_classes: int = 0):
        self.images, self.labels = images, np.asarray(labels, dtype=np.int64)
        self.num_classes = num_classes or (int(self.labels.max()) + 1 if len(self.labels) else 0)

    def __len__(self) -> int:
        return len(self.labels)

    def array(self) -> np.ndarray:
        return self.images

    def __getitem__(self, i: int):
        return Image.fromarray(np.asarray(self.images[i])), int(self.labels[i])


def cached(key: str, compute) -> tuple[ArraySet, bool]:
    """(the cached images and labels, hit). On a miss `compute()` -> (images, labels) is stored: written in a
    folder aside with its manifest (each array's size and checksum) and renamed, under a file lock, so
    concurrent runs generate an entry once. An entry is verified before it is read: a damaged one is set aside
    and generated again (paths.entries.verified)."""
    from filelock import FileLock

    key = entry_name(key)
    folder = cache_dir() / key
    folder.parent.mkdir(parents=True, exist_ok=True)

    def load():
        return ArraySet(np.load(folder / "images.npy", mmap_mode="r"), np.load(folder / "labels.npy"))

    if verified(folder, "corruption cache entry", directory=True):
        return load(), True
    with FileLock(str(folder.parent / f"{key}.lock")):
        if verified(folder, "corruption cache entry", directory=True):  # made by the run that held the lock
            return load(), True
        images, labels = compute()
        with sealed(folder, directory=True) as tmp:
            np.save(tmp / "images.npy", np.ascontiguousarray(images, dtype=np.uint8))
            np.save(tmp / "labels.npy", np.asarray(labels, dtype=np.int64))
    return load(), False


# --- released data ------------------------------------------------------------------------------------

LAYOUT = "<root>/<corruption>/<severity>/<wnid>/*.JPEG"


class ImageNetCFolder(torch.utils.data.Dataset):
    """One (corruption, severity) of the released ImageNet-C folders: `<root>/<corruption>/<severity>/<wnid>/`.
    A label is the index of its wnid among the sorted wnids (torchvision's ImageFolder rule, which is
    ImageNet's class order); a folder with another number of classes than `num_classes` is an error, not a
    silent relabelling."""

    def __init__(self, root, corruption: str, severity: int, num_classes: int | None = None, transform=None):
        from torchvision.datasets.folder import IMG_EXTENSIONS, make_dataset

        self.dir = Path(root).expanduser() / corruption / str(severity)
        self.transform = transform
        if not self.dir.is_dir():
            raise DataMissingError(f"ImageNet-C folder {self.dir} not found (layout {LAYOUT})")
        classes = sorted(e.name for e in os.scandir(self.dir) if e.is_dir())
        if num_classes and len(classes) != num_classes:
            raise DataMissingError(
                f"{self.dir} has {len(classes)} class folders, expected {num_classes} (one per "
                f"wnid, layout {LAYOUT}): is the download complete?"
            )
        samples = make_dataset(str(self.dir), {c: i for i, c in enumerate(classes)}, extensions=IMG_EXTENSIONS)
        self.paths = [p for p, _ in samples]
        self.labels = np.array([y for _, y in samples], dtype=np.int64)
        self.num_classes = len(classes)

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int):
        with Image.open(self.paths[i]) as im:
            img = im.convert("RGB")
        return (self.transform(img) if self.transform else img), int(self.labels[i])


class NpyCorrupted(ArraySet):
    """One (corruption, severity) of CIFAR-10-C / CIFAR-100-C: rows (severity-1)·n ... severity·n of
    `<root>/<corruption>.npy`, with `<root>/labels.npy`."""

    def __init__(self, root, corruption: str, severity: int, num_classes: int = 0):
        root = Path(root).expanduser()
        path, labels_path = root / f"{corruption}.npy", root / "labels.npy"
        for p in (path, labels_path):
            if not p.is_file():
                raise DataMissingError(
                    f"{p} not found (CIFAR-10-C layout: <root>/<corruption>.npy with the 5 "
                    "severities one after another, and <root>/labels.npy)"
                )
        images, labels = np.load(path, mmap_mode="r"), np.load(labels_path, mmap_mode="r")
        if len(images) != len(labels) or len(images) % len(SEVERITIES):
            raise DataMissingError(
                f"{path} holds {len(images)} images and {labels_path} {len(labels)} labels; "
                "expected equal counts, a multiple of 5 (one block per severity)"
            )
        n = len(images) // len(SEVERITIES)
        rows = slice((severity - 1) * n, severity * n)
        super().__init__(images[rows], np.asarray(labels[rows]), num_classes)
