"""Segmentation metrics as mmsegmentation's IoUMetric computes them: one confusion matrix over the whole split,
IoU per class = sum of intersections / sum of unions, mIoU over classes with a non-zero union, aAcc and mAcc."""

from __future__ import annotations

import numpy as np
import torch

IGNORE_INDEX = 255


class SegMetric:
    """Accumulates a K x K confusion matrix (rows: label, columns: prediction) over a whole split, with
    one `torch.bincount` per image over label·K + prediction. Labels equal to `ignore_index` are left out;
    a label outside [0, K) that is not the ignore index, or a prediction outside [0, K), is an error."""

    def __init__(self, num_classes: int, ignore_index: int = IGNORE_INDEX, device="cpu"):
        self.k, self.ignore = int(num_classes), int(ignore_index)
        self.hist = torch.zeros(self.k * self.k, dtype=torch.int64, device=device)  # where the predictions are

    def update(self, pred, label) -> None:
        pred, label = torch.as_tensor(pred, device=self.hist.device), torch.as_tensor(label, device=self.hist.device)
        if pred.shape != label.shape:
            raise ValueError(
                f"prediction {tuple(pred.shape)} and label {tuple(label.shape)} differ in shape; "
                "resize the prediction to the annotation's size"
            )
        k = self.k
        pred, label = pred.reshape(-1), label.reshape(-1)
        if pred.numel():
            lo, hi = (int(v) for v in torch.aminmax(pred))
            if lo < 0 or hi >= k:
                raise ValueError(f"predictions must lie in [0, {k}), got {lo}..{hi}")
        if self.ignore >= k:  # every label >= K (the ignore index among them) lands past row K-1: no mask needed
            counts = torch.bincount(label.to(torch.int64) * k + pred.to(torch.int64), minlength=k * k)
            stray = counts[k * k :].sum() - counts[self.ignore * k : (self.ignore + 1) * k].sum()
        else:
            label = label.to(torch.int64)
            keep = label != self.ignore
            counts = torch.bincount(label[keep] * k + pred[keep].to(torch.int64), minlength=k * k)
            stray = counts[k * k :].sum()
        if int(stray):
            raise ValueError(
                f"{int(stray)} labelled pixels have a class outside [0, {k}) that is not the ignore "
                f"index {self.ignore}: is num_classes right (ADE20K: 150, labels reduced 0 -> 255)?"
            )
        self.hist += counts[: k * k]

    def merge(self, other: SegMetric) -> None:
        self.hist += other.hist

    def areas(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(intersection, prediction area, label area) per class, summed over every update."""
        conf = self.hist.view(self.k, self.k).cpu().numpy().astype(np.float64)
        return np.diag(conf).copy(), conf.sum(0), conf.sum(1)

    def compute(self) -> dict:
        return metrics_from_areas(*self.areas())


def metrics_from_areas(intersect, area_pred, area_label) -> dict:
    """mIoU / aAcc / mAcc (fractions) and per-class IoU and accuracy (NaN where undefined) from summed areas."""
    intersect, area_pred, area_label = (np.asarray(a, np.float64) for a in (intersect, area_pred, area_label))
    union = area_pred + area_label - intersect
    with np.errstate(divide="ignore", invalid="ignore"):
        iou = np.where(union > 0, intersect / union, np.nan)
        acc = np.where(area_label > 0, intersect / area_label, np.nan)
    present = union > 0
    return {
        "miou": float(iou[present].mean()) if present.any() else float("nan"),
        "aacc": float(intersect.sum() / area_label.sum()) if area_label.sum() else float("nan"),
        "macc": float(np.nanmean(acc)) if (area_label > 0).any() else float("nan"),
        "iou": iou,
        "acc": acc,
    }


def miou(pred, label, num_classes: int, ignore_index: int = IGNORE_INDEX) -> dict:
    """Dataset-level metrics of predictions against labels: one (H, W) pair, or sequences of pairs (a
    whole split, areas summed over images before dividing). Returns fractions: miou, aacc, macc and the
    per-class arrays iou and acc (NaN for classes with no union / no labelled pixel)."""
    metric = SegMetric(num_classes, ignore_index)
    pairs = zip(pred, label) if isinstance(pred, (list, tuple)) else [(pred, label)]
    for p, lab in pairs:
        metric.update(p, lab)
    return metric.compute()
