"""VTAB-1k's 19 tasks: split strings and label rules (tasks/vtab.yaml holds the table; this module
reads it and implements the rules it names). Pure functions, testable on tfds mock data.

    splits("eurosat") -> {"train": "train[:800]", "val": "train[16200:16400]",
                          "trainval": "train[:800]+train[16200:16400]", "test": "train[21600:]"}
    label("clevr_dist", example) -> int       # example: the tfds feature dict as numpy values
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from ..errors import UserError, close_matches
from .labels import (
    DSPRITES_ORIENTATIONS,
    DSPRITES_POSITIONS,
    KITTI_DIST_THRESHOLDS,
    binned,
    clevr_count_label,
    clevr_dist_label,
    threshold_class,
)

# tfds folder split (train800 ...) <- role in the protocol
FOLDER_SPLITS = {"train800": "train", "val200": "val", "test": "test"}


@lru_cache(maxsize=1)
def tasks() -> dict:
    """task name -> its dataset entry in tasks/vtab.yaml (the 19 tfds tasks, not the embedded sets)."""
    from ..spec import load_task

    return {d.name: d for d in load_task("vtab").datasets if getattr(d, "source", "tfds") == "tfds"}


def task(name: str):
    table = tasks()
    if name not in table:
        raise UserError(f"unknown VTAB task {name!r}{close_matches(name, table)}; tasks: {', '.join(table)}")
    return table[name]


def splits(name: str) -> dict[str, str]:
    t = task(name)
    return {"train": t.train, "val": t.val, "trainval": f"{t.train}+{t.val}", "test": t.test}


def _kitti_dist(ex) -> int:
    """Closest vehicle (type < 3: car, van, truck) by depth location[:, 2]; 1000 when there is none."""
    objects = ex["objects"]
    depth = np.asarray(objects["location"], dtype=np.float64).reshape(-1, 3)[:, 2]
    vehicles = np.asarray(objects["type"]) < 3
    d = float(depth[vehicles].min()) if vehicles.any() else 1000.0
    return threshold_class(min(d, 1000.0), KITTI_DIST_THRESHOLDS)


LABEL_RULES = {
    "label": lambda ex: int(ex["label"]),
    "clevr_count": lambda ex: clevr_count_label(len(np.asarray(ex["objects"]["pixel_coords"]).reshape(-1, 3))),
    "clevr_dist": lambda ex: clevr_dist_label(np.asarray(ex["objects"]["pixel_coords"]).reshape(-1, 3)[:, 2]),
    "dsprites_loc": lambda ex: binned(int(ex["label_x_position"]), DSPRITES_POSITIONS),
    "dsprites_ori": lambda ex: binned(int(ex["label_orientation"]), DSPRITES_ORIENTATIONS),
    "smallnorb_azi": lambda ex: int(ex["label_azimuth"]),
    "smallnorb_ele": lambda ex: int(ex["label_elevation"]),
    "kitti_dist": _kitti_dist,
}


def label(name: str, example: dict) -> int:
    return LABEL_RULES[task(name).label](example)


def export_vtab(out, names=None, data_dir=None, limit: int | None = None, progress=None) -> list:
    """Write each task's train800 / val200 / test from tfds into the image-folder format (PNG, lossless),
    with train800val200, manifest and info. `limit` caps every split (a quick look, not the protocol)."""
    from .folder import write_folder_dataset
    from .tfds_source import TfdsDataset

    written = []
    for name in names or list(tasks()):
        t = task(name)
        roles = splits(name)
        parts = {}
        for folder_split, role in FOLDER_SPLITS.items():
            ds = TfdsDataset(t.tfds, roles[role], label_fn=LABEL_RULES[t.label], data_dir_=data_dir)
            n = len(ds) if limit is None else min(limit, len(ds))
            # a generator: images stream to disk one by one (a test split can be gigabytes)
            items = ((np.asarray(img), y) for img, y in (ds[i] for i in range(n)))
            parts[folder_split] = progress(items, total=n, desc=f"{name} {folder_split}") if progress else items
        info = {
            "num_classes": t.classes,
            "source": f"tfds {t.tfds}",
            "splits": roles,
            "label_rule": t.label,
            "version": f"vtab-{name}-{t.tfds}" + (f"-limit{limit}" if limit else ""),
        }
        written.append(write_folder_dataset(out, name, parts, info))
    return written
