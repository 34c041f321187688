"""Semantic segmentation with Segmenter's linear decoder (DPN §6.3 + App. G; PROTOCOLS.md "ADE20K linear
segmentation"), at fractions of the training set.

Model: the backbone's patch tokens after its final norm (no cls token) -> Linear(D, K) -> (B, K, h, w) on
the patch grid -> bilinear upsampling to the input size (`LinearSegmenter`). The whole backbone is
fine-tuned: AdamW, polynomial decay (power 0.9) to 0, batch 16, `epochs` passes over the fraction's images
(128: Segmenter's 160k iterations on all of ADE20K), mmseg's training pipeline on (image, mask) pairs
(`data.segmentation.train_transform`), cross-entropy that ignores label 255.

Evaluation (`predict`): the image resized as mmseg's ADE20K test pipeline does (short side 512, long side
at most 2048, aspect kept), sliding windows of 512 with stride 341 whose logits are averaged where they
overlap (`slide_logits`), logits resized bilinearly to the annotation's own size, argmax. Metrics over the
whole split (`SegMetric`): per-class intersection and union summed over images, IoU_c = ΣI/ΣU, mIoU = the
mean over classes with a non-zero union; aAcc = ΣI / Σ labelled pixels; mAcc = mean over classes present
in the labels of ΣI_c / Σlabel_c — mmsegmentation's IoUMetric, tested against it.

Train fractions (1/16 ... 1) are a report axis: a fraction's images are the first round(f·N) of one
permutation drawn from the cell's seed, so every fraction's subset holds the smaller ones' (`subset`).
"""
from __future__ import annotations

import math
import time
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..data.sources import DatasetEntry
from ..engine.train import BF16_SETTINGS, SCHEDULES
from . import Adapter, plan_select_then_final

IGNORE_INDEX = 255


# --- metrics ---------------------------------------------------------------------------------------

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
            raise ValueError(f"prediction {tuple(pred.shape)} and label {tuple(label.shape)} differ in shape; "
                             "resize the prediction to the annotation's size")
        k = self.k
        pred, label = pred.reshape(-1), label.reshape(-1)
        if pred.numel():
            lo, hi = (int(v) for v in torch.aminmax(pred))
            if lo < 0 or hi >= k:
                raise ValueError(f"predictions must lie in [0, {k}), got {lo}..{hi}")
        if self.ignore >= k:  # every label >= K (the ignore index among them) lands past row K-1: no mask needed
            counts = torch.bincount(label.to(torch.int64) * k + pred.to(torch.int64), minlength=k * k)
            stray = counts[k * k:].sum() - counts[self.ignore * k:(self.ignore + 1) * k].sum()
        else:
            label = label.to(torch.int64)
            keep = label != self.ignore
            counts = torch.bincount(label[keep] * k + pred[keep].to(torch.int64), minlength=k * k)
            stray = counts[k * k:].sum()
        if int(stray):
            raise ValueError(f"{int(stray)} labelled pixels have a class outside [0, {k}) that is not the ignore "
                             f"index {self.ignore}: is num_classes right (ADE20K: 150, labels reduced 0 -> 255)?")
        self.hist += counts[:k * k]

    def merge(self, other: "SegMetric") -> None:
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
    return {"miou": float(iou[present].mean()) if present.any() else float("nan"),
            "aacc": float(intersect.sum() / area_label.sum()) if area_label.sum() else float("nan"),
            "macc": float(np.nanmean(acc)) if (area_label > 0).any() else float("nan"),
            "iou": iou, "acc": acc}


def miou(pred, label, num_classes: int, ignore_index: int = IGNORE_INDEX) -> dict:
    """Dataset-level metrics of predictions against labels: one (H, W) pair, or sequences of pairs (a
    whole split, areas summed over images before dividing). Returns fractions: miou, aacc, macc and the
    per-class arrays iou and acc (NaN for classes with no union / no labelled pixel)."""
    metric = SegMetric(num_classes, ignore_index)
    pairs = zip(pred, label) if isinstance(pred, (list, tuple)) else [(pred, label)]
    for p, lab in pairs:
        metric.update(p, lab)
    return metric.compute()


# --- model -----------------------------------------------------------------------------------------

class LinearSegmenter(nn.Module):
    """Segmenter's linear decoder on a timm-style ViT (`forward_features`, `num_prefix_tokens`,
    `grid_size`): patch tokens -> Linear(D, K) -> (B, K, h, w) -> bilinear upsampling to the input size.
    The head is initialised as Segmenter's (truncated normal, std 0.02; bias 0)."""

    def __init__(self, backbone: nn.Module, num_classes: int):
        super().__init__()
        from timm.layers import trunc_normal_
        self.backbone, self.num_classes = backbone, num_classes
        self.head = nn.Linear(backbone.embed_dim, num_classes)
        trunc_normal_(self.head.weight, std=0.02)
        nn.init.zeros_(self.head.bias)

    def grid_logits(self, x: torch.Tensor) -> torch.Tensor:
        """(B, K, h, w) on the patch grid, before upsampling."""
        tokens = self.backbone.forward_features(x)[:, self.backbone.num_prefix_tokens:]
        gh, gw = self.backbone.grid_size
        # (B, h, w, K) seen as (B, K, h, w): channels-last, no copy; the upsampled logits stay channels-last,
        # which makes the interpolation, the window stitching and the per-pixel argmax cheaper on CPUs
        return self.head(tokens).reshape(x.shape[0], gh, gw, self.num_classes).permute(0, 3, 1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.interpolate(self.grid_logits(x), size=x.shape[-2:], mode="bilinear", align_corners=False)


def segmentation_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Pixel cross-entropy, label 255 ignored, mean over the labelled pixels (0 for a batch with none)."""
    target = target.long()
    if not bool((target != IGNORE_INDEX).any()):
        return logits.sum() * 0.0
    return F.cross_entropy(logits, target, ignore_index=IGNORE_INDEX)


# --- inference -------------------------------------------------------------------------------------

def window_starts(size: int, window: int, stride: int) -> list[int]:
    """mmseg's slide_inference grid along one axis: ceil((size - window) / stride) + 1 windows, the last
    one moved back to end at the border; one window at 0 when the image is not larger than it."""
    if size <= window:
        return [0]
    n = (size - window + stride - 1) // stride + 1
    return [min(i * stride, size - window) for i in range(n)]


def _cover(size: int, window: int, starts: list[int], device) -> torch.Tensor:
    """How many windows cover each position along one axis."""
    cover = torch.zeros(size, device=device)
    for st in starts:
        cover[st:st + window] += 1
    return cover


_WORKSPACE: dict = {}


def _workspace(numel: int, device) -> torch.Tensor:
    """A flat float buffer reused across images (one per device): a fresh 150 x 512 x 683 tensor costs
    more in page faults (~0.25 s on a CPU) than the stitching itself."""
    buf = _WORKSPACE.get(str(device))
    if buf is None or buf.numel() < numel:
        buf = _WORKSPACE[str(device)] = torch.empty(numel, device=device)
    return buf[:numel]


@torch.inference_mode()
def slide_logits(model, image: torch.Tensor, num_classes: int, *, window: int, stride: int,
                 batch: int = 8, bf16: bool = False) -> torch.Tensor:
    """Logits (K, H, W) of one image (3, H, W) — or (N, K, H, W) of N images of one size (N, 3, H, W) — from
    windows of `window` px every `stride` px, averaged where windows overlap. Windows (of all N images) go
    through the model `batch` at a time. Where an image is smaller than a window it is padded with 0 at
    the bottom / right and the padding's logits are dropped. The result is a channels-last view of a
    buffer that the next call reuses: use (or copy) it before calling again."""
    device = next(model.parameters()).device
    single = image.dim() == 3
    images = image[None] if single else image
    images = images.to(device)
    n, _, h, w = images.shape
    ph, pw = max(h, window), max(w, window)
    if (ph, pw) != (h, w):
        images = F.pad(images, (0, pw - w, 0, ph - h))
    ys, xs = window_starts(ph, window, stride), window_starts(pw, window, stride)
    boxes = [(i, y, x) for i in range(n) for y in ys for x in xs]
    out = _workspace(n * ph * pw * num_classes, device).view(n, ph, pw, num_classes).zero_()  # (N, H, W, K)
    for start in range(0, len(boxes), batch):
        part = boxes[start:start + batch]
        crops = torch.stack([images[i, :, y:y + window, x:x + window] for i, y, x in part])
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            logits = model(crops)
        for (i, y, x), lg in zip(part, logits):
            out[i, y:y + window, x:x + window] += lg.permute(1, 2, 0)  # a channels-last model output: no transpose
    # how many windows cover each pixel: the grid is separable, so an outer product of two 1-d counts
    cover = _cover(ph, window, ys, device)[:, None] * _cover(pw, window, xs, device)[None, :]
    out /= cover[..., None]
    out = out[:, :h, :w].permute(0, 3, 1, 2)
    return out[0] if single else out


def interp_matrix(n_in: int, n_out: int, device=None) -> torch.Tensor:
    """(n_out, n_in): the 1-d bilinear interpolation (align_corners=False) that F.interpolate applies along one
    axis, read off F.interpolate itself (bilinear resizing is separable, so two of these make it)."""
    eye = torch.eye(n_in, device=device)[None, :, :, None]  # channels = unit vectors, along H
    return F.interpolate(eye, size=(n_out, 1), mode="bilinear", align_corners=False)[0, :, :, 0].T


def _window_maps(size: int, padded: int, out: int, window: int, grid: int, starts: list[int], device) -> list:
    """Per window start along one axis: the (out, grid) matrix taking a window's patch-grid logits to the
    final map: upsample grid -> window, place at the start, divide by the windows covering each pixel,
    drop the padding beyond `size`, resize size -> out."""
    up = interp_matrix(grid, window, device)  # (window, grid)
    cover = _cover(padded, window, starts, device)
    down = interp_matrix(size, out, device) if size != out else torch.eye(size, device=device)  # (out, size)
    maps = []
    for st in starts:
        end = min(st + window, size)  # rows of this window inside the image (padding dropped)
        placed = up[:end - st] / cover[st:end, None]  # (end - st, grid)
        maps.append(down[:, st:end] @ placed)
    return maps


@torch.inference_mode()
def grid_window_logits(model, images: torch.Tensor, num_classes: int, *, window: int, stride: int, out_size,
                       batch: int = 8, bf16: bool = False) -> torch.Tensor:
    """(N, H0, W0, K) final logits of N same-size images (N, 3, h, w) for a model with `grid_logits`, through
    the separable maps of `_window_maps`; a view of a buffer that the next call reuses. Each window adds
    one in-place matrix product into the buffer (laid out (N, W0, H0, K)): no full-size temporary."""
    device = next(model.parameters()).device
    n, _, h, w = images.shape
    ph, pw = max(h, window), max(w, window)
    if (ph, pw) != (h, w):
        images = F.pad(images, (0, pw - w, 0, ph - h))
    ys, xs = window_starts(ph, window, stride), window_starts(pw, window, stride)
    gh, gw = model.backbone.grid_size
    rows = _window_maps(h, ph, out_size[0], window, gh, ys, device)  # (H0, gh) per window row
    cols = _window_maps(w, pw, out_size[1], window, gw, xs, device)  # (W0, gw) per window column
    boxes = [(i, a, b) for i in range(n) for a in range(len(ys)) for b in range(len(xs))]
    h0, w0 = out_size
    out = _workspace(n * h0 * w0 * num_classes, device).view(n, w0, h0 * num_classes)
    for start in range(0, len(boxes), batch):
        part = boxes[start:start + batch]
        crops = torch.stack([images[i, :, ys[a]:ys[a] + window, xs[b]:xs[b] + window] for i, a, b in part])
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            grid = model.grid_logits(crops)
        grid = grid.float().permute(0, 2, 3, 1)  # (B, gh, gw, K)
        for (i, a, b), g in zip(part, grid):
            tall = torch.einsum("hy,yxk->xhk", rows[a], g).reshape(gw, h0 * num_classes)  # (gw, H0 K)
            if a == 0 and b == 0:  # an image's first window writes, the others add
                torch.mm(cols[b], tall, out=out[i])
            else:
                out[i].addmm_(cols[b], tall)  # (W0, gw) @ (gw, H0 K)
    return out.view(n, w0, h0, num_classes).transpose(1, 2)


@torch.inference_mode()
def predict(model, image, num_classes: int, *, short: int, window: int, stride: int, out_size=None,
            batch: int = 8, bf16: bool = False) -> torch.Tensor:
    """The test pipeline on one image (PIL or uint8 (3, H, W)) or on N images of one size (uint8
    (N, 3, H, W)): resize (`data.segmentation.eval_image`, on the model's device), sliding windows whose
    logits are averaged where they overlap, bilinear resize to `out_size` (default: the images' own size),
    argmax -> (H, W) or (N, H, W) class indices on the model's device (uint8 for up to 255 classes).

    For a LinearSegmenter the windows' upsampled logits are never built: upsampling, placing, averaging,
    cropping and the final resize are all separable linear maps, so each window's patch-grid logits go to
    the final map through one (H0, h_grid) and one (W0, w_grid) matrix (`_window_maps`); the result equals
    `slide_logits` followed by F.interpolate up to float rounding (tested). Other models take that path."""
    from ..data.segmentation import eval_image
    device = next(model.parameters()).device
    x = eval_image(image, short, device)
    if out_size is None:
        out_size = (image.height, image.width) if hasattr(image, "height") else tuple(image.shape[-2:])
    single = x.dim() == 3
    if not hasattr(model, "grid_logits"):
        logits = slide_logits(model, x, num_classes, window=window, stride=stride, batch=batch, bf16=bf16)
        logits = logits[None] if single else logits
        if tuple(logits.shape[-2:]) != tuple(out_size):
            logits = F.interpolate(logits, size=tuple(out_size), mode="bilinear", align_corners=False)
        pred = logits.argmax(1)
    else:
        pred = grid_window_logits(model, x if not single else x[None], num_classes, window=window, stride=stride,
                                  out_size=out_size, batch=batch, bf16=bf16).argmax(-1)
    pred = pred.to(torch.uint8 if num_classes <= 255 else torch.int64)
    return pred[0] if single else pred


def evaluate(model, dataset, num_classes: int, *, short: int, window: int, stride: int, bf16: bool = False,
             group: int = 16, batch: int = 32, progress=None, desc: str = "evaluate") -> SegMetric:
    """SegMetric over every (image, mask) of `dataset`, predictions at each annotation's own size.
    Consecutive images of one size (and annotation size) are evaluated together, up to `group` at a time,
    their windows `batch` per forward (ADE20K's images vary in size: one at a time)."""
    model.eval()
    device = next(model.parameters()).device
    metric = SegMetric(num_classes, device=device)
    bar = progress(total=len(dataset), desc=desc) if progress else None
    pending: list = []

    def flush():
        images = torch.stack([torch.as_tensor(np.asarray(im)) if not hasattr(im, "height")
                              else _pil_tensor(im) for im, _ in pending])
        masks = torch.stack([torch.as_tensor(np.asarray(m)) for _, m in pending]).to(device)
        preds = predict(model, images, num_classes, short=short, window=window, stride=stride,
                        out_size=tuple(masks.shape[-2:]), batch=batch, bf16=bf16)
        for p, m in zip(preds, masks):
            metric.update(p, m)
        if bar is not None:
            bar.update(len(pending))
        pending.clear()

    for i in range(len(dataset)):
        image, mask = dataset[i]
        size = (_hw(image), np.shape(mask))
        if pending and (len(pending) == group or (_hw(pending[0][0]), np.shape(pending[0][1])) != size):
            flush()
        pending.append((image, mask))
    if pending:
        flush()
    if bar is not None:
        bar.close()
    return metric


def _hw(image) -> tuple:
    return (image.height, image.width) if hasattr(image, "height") else tuple(image.shape[-2:])


def _pil_tensor(image) -> torch.Tensor:
    from torchvision.transforms import v2
    return v2.functional.pil_to_tensor(image.convert("RGB"))


# --- train fractions -------------------------------------------------------------------------------

def subset(n: int, fraction: float, seed: int) -> np.ndarray:
    """The training images of `fraction` for `seed`: the first round(fraction * n) (at least 1) of
    np.random.default_rng(seed).permutation(n), so each fraction's subset holds every smaller one's."""
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must lie in (0, 1], got {fraction}")
    take = max(1, min(n, int(math.floor(fraction * n + 0.5))))
    return np.random.default_rng(seed).permutation(n)[:take]


class Subset(torch.utils.data.Dataset):
    def __init__(self, dataset, indices):
        self.dataset, self.indices = dataset, [int(i) for i in indices]

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int):
        return self.dataset[self.indices[i]]


# --- the adapter -----------------------------------------------------------------------------------

class SegDatasetEntry(DatasetEntry):
    source: Literal["ade", "tfds", "embedded"] = "ade"  # type: ignore[assignment]
    classes: int
    reduce_zero_label: bool = True  # ADE20K: 0 'other' -> 255, 1..150 -> 0..149 (embedded sets: from their info)


ADE_DEFAULT_DIRS = ("data/ade",)  # mmsegmentation's data_root for ADE20K


def open_split(ds: dict, split: str, data_dir=None):
    """(image, mask) dataset of `split` for a resolved dataset entry: the ADE20K folder layout (source ade),
    a prepared tfds dataset (source tfds) or an embedded segmentation set (source embedded)."""
    from ..data import embedded
    from ..data.folder import DataMissingError
    from ..data.segmentation import AdeFolder, SegFolderDataset, TfdsSegmentation, find_ade_root

    if ds["source"] == "embedded":
        name = ds.get("set") or ds["name"]
        return SegFolderDataset(embedded.ensure([name]), name, split)
    if ds["source"] == "tfds":
        return TfdsSegmentation(ds["tfds"], split, data_dir=data_dir, num_classes=ds["classes"],
                                reduce_zero=ds["reduce_zero_label"])
    searched = [data_dir] if data_dir else list(ADE_DEFAULT_DIRS)
    for d in searched:
        root = find_ade_root(d)
        if root is not None:
            return AdeFolder(root, split, num_classes=ds["classes"], reduce_zero=ds["reduce_zero_label"])
    raise DataMissingError(f"ADE20K not found: searched {', '.join(str(d) for d in searched)} and its "
                           "ADEChallengeData2016/ for images/ and annotations/")


class SegAdapter(Adapter):
    name = "seg"
    dataset_schema = SegDatasetEntry
    hparam_choices = {"bf16": BF16_SETTINGS, "optimizer": ("adamw",), "schedule": SCHEDULES}

    def validate(self, spec, source="<spec>"):
        super().validate(spec, source)
        from .spec import SpecError
        for i, ds in enumerate(spec.datasets):
            d = ds.model_dump()
            if d.get("source", "ade") == "tfds" and not d.get("tfds"):
                raise SpecError(f"{source}: datasets.{i}.tfds: a tfds dataset needs its tfds name (dataset {ds.name!r})")

    def check_data(self, task, ctx) -> None:
        """Before any cell: every dataset's train and test splits open, or one line says what is missing."""
        from ..data.folder import DataMissingError
        from ..errors import UserError

        missing = []
        for spec in task.datasets:
            ds = SegDatasetEntry.model_validate(spec.model_dump()).model_dump()
            try:
                open_split(ds, ds["train"], ctx.data_dir)
                open_split(ds, ds["test"], ctx.data_dir)
            except DataMissingError as e:
                missing.append((ds, str(e)))
        if not missing:
            return
        names = ", ".join(ds["name"] for ds, _ in missing)
        ade = any(ds["source"] == "ade" for ds, _ in missing)
        searched = ctx.data_dir or " or ".join(ADE_DEFAULT_DIRS)
        hint = (f"searched {searched} (--data-dir, else mmsegmentation's data/ade) and its ADEChallengeData2016/ "
                "for images/{training,validation}/*.jpg with annotations/{training,validation}/*.png; "
                "download ADEChallengeData2016.zip from http://data.csail.mit.edu/places/ADEchallenge/ and unzip it "
                "there, or give --data-dir; tfds's scene_parse150 holds the 2017 instance masks (100 categories, "
                "not these 150 classes): run it as --datasets scene_parse150 once prepared with tfds"
                if ade else missing[0][1])
        raise UserError(f"segmentation data missing for {names}: {hint}; or try `--suite embedded`, which needs "
                        "no download")

    def plan(self, task, backbone, results):
        return plan_select_then_final(task, backbone, results)  # fraction is a report axis: no select stage

    def run(self, cell, ctx):
        from ..backbones import create_backbone
        from ..data.segmentation import train_transform
        from ..engine.train import fit, train_batches

        hp = cell.hparams
        ds = SegDatasetEntry.model_validate({**cell.dataset_config, "name": cell.dataset}).model_dump()
        if hp["optimizer"] != "adamw":
            raise ValueError(f"optimizer {hp['optimizer']!r}: the Segmenter protocol uses adamw")
        full = open_split(ds, ds["train"], ctx.data_dir)
        test = open_split(ds, ds["test"], ctx.data_dir)
        num_classes = ds["classes"]
        idx = subset(len(full), float(hp["fraction"]), cell.seed)
        train = Subset(full, idx)
        steps = int(hp["steps"]) if hp.get("steps") else math.ceil(hp["epochs"] * len(train) / hp["batch"])

        torch.manual_seed(cell.seed)
        backbone = create_backbone(cell.backbone.partition("@")[0], img_size=hp["crop"], checkpoint=cell.checkpoint)
        backbone.reset_classifier(0)
        model = LinearSegmenter(backbone, num_classes).to(ctx.device)
        opt = torch.optim.AdamW(model.parameters(), lr=hp["lr"], weight_decay=hp["weight_decay"],
                                betas=(0.9, 0.999))
        transform = train_transform(hp["crop"], ratio=(hp["ratio_min"], hp["ratio_max"]),
                                    photometric=hp["photometric"], cat_max_ratio=hp.get("cat_max_ratio", 1.0))
        batches = train_batches(train, transform, batch=hp["batch"], steps=steps, seed=cell.seed,
                                workers=ctx.workers, joint=True)
        started = time.time()
        out = fit(model, batches, opt, steps=steps, base_lr=hp["lr"], warmup=hp["warmup_steps"],
                  clip=hp.get("clip") or None, loss_fn=segmentation_loss, device=ctx.device, bf16=hp.get("bf16", "auto"),
                  micro_batch=ctx.micro_batch, progress=ctx.progress, schedule=hp["schedule"], power=hp["power"],
                  desc=f"{cell.dataset} fraction={hp['fraction']} seed={cell.seed}")
        train_seconds = time.time() - started
        started = time.time()
        metric = evaluate(model, test, num_classes, short=hp["test_short"], window=hp["window"],
                          stride=hp["stride"], bf16=out["bf16"], progress=ctx.progress,
                          desc=f"{cell.dataset} sliding-window eval")
        result = metric.compute()
        return {"test": {"miou": 100 * result["miou"], "aacc": 100 * result["aacc"], "macc": 100 * result["macc"]},
                "info": {**out, "steps": steps, "train_examples": len(train), "train_pool": len(full),
                         "eval_examples": len(test), "train_seconds": round(train_seconds, 2),
                         "eval_seconds": round(time.time() - started, 2),
                         "iou_per_class": [None if np.isnan(v) else round(100 * float(v), 4) for v in result["iou"]]}}
