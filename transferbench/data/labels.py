"""VTAB's label rules for the structured tasks (google-research/task_adaptation), pure.

The embedded suite's procedural sets use the same functions, so their labels follow VTAB's exactly.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

CLEVR_DIST_THRESHOLDS = (0.0, 8.0, 8.5, 9.0, 9.5, 10.0, 100.0)  # 6 classes
KITTI_DIST_THRESHOLDS = (-100.0, 8.0, 20.0, 999.0)  # 4 classes
DSPRITES_POSITIONS, DSPRITES_ORIENTATIONS = 32, 40  # number of values of the dSprites latents
DSPRITES_BINS = 16


def binned(value: int, num_values: int, bins: int = DSPRITES_BINS) -> int:
    """dSprites location/orientation: floor(value / (num_values / bins))."""
    return int(math.floor(value / (num_values / bins)))


def threshold_class(d: float, thresholds: Sequence[float]) -> int:
    """The largest i with thresholds[i] < d (VTAB's clevr_dist and kitti_dist rule)."""
    return max(i for i, t in enumerate(thresholds) if t < d)


def clevr_count_label(num_objects: int) -> int:
    return num_objects - 3  # CLEVR scenes hold 3..10 objects: 8 classes


def clevr_dist_label(depths: Sequence[float]) -> int:
    """depths = objects.pixel_coords[:, 2]; the closest object decides."""
    return threshold_class(min(depths), CLEVR_DIST_THRESHOLDS)
