"""Semantic segmentation with a linear decoder (DPN §6.3 + App. G's scenic config; docs/segmentation.md), at
fractions of the training set.

Model: the last block's patch tokens (before the encoder's final norm: App. G's `out_with_norm = False`; no
cls token) -> Linear(D, K) -> (B, K, h, w) on the patch grid -> bilinear upsampling to the input size
(`LinearSegmenter`, Segmenter's linear baseline). The whole backbone is fine-tuned with stochastic depth 0.1,
position embeddings resized to the crop's grid as scenic's `pos_interpolation_method = 'bilinear'` does:
AdamW (lr 3e-5, weight decay 0.01 except on 1-D parameters: scenic's `skip_scale_and_bias_regularization`),
polynomial decay (power 0.9) to 0, batch 16, 128 epochs of `20210 // 16` steps whatever the fraction (App. G's
`steps_per_epoch`), pixels standardised with ImageNet's mean and std, mmseg's training pipeline on (image,
mask) pairs (`data.segmentation.train_transform`), cross-entropy that ignores label 255. (Segmenter's own
ADE20K recipe, 64 epochs at batch 8 with SGD at lr 1e-3, mmseg's "160k" schedule, is a different one.)

Evaluation (`predict`): the image resized as mmseg's ADE20K test pipeline does (short side 512, long side
at most 2048, aspect kept), sliding windows of 512 with stride 341 whose logits are averaged where they
overlap (`slide_logits`), logits resized bilinearly to the annotation's own size, argmax. Metrics over the
whole split (`SegMetric`): per-class intersection and union summed over images, IoU_c = ΣI/ΣU, mIoU = the
mean over classes with a non-zero union; aAcc = ΣI / Σ labelled pixels; mAcc = mean over classes present
in the labels of ΣI_c / Σlabel_c — mmsegmentation's IoUMetric, tested against it.

Train fractions (1/16 ... 1) are a report axis: a fraction's images are the first round(f·N) of one
permutation drawn from the cell's seed, so every fraction's subset holds the smaller ones' (`subset`).

Modules: metric (SegMetric, miou), inference (sliding windows, predict, evaluate), adapter (the decoder, the
train fractions, the data entries, the adapter).
"""

from .adapter import (
    ADE_DEFAULT_DIRS,
    LinearSegmenter,
    SegAdapter,
    SegDatasetEntry,
    Subset,
    open_split,
    segmentation_loss,
    subset,
)
from .inference import evaluate, grid_window_logits, interp_matrix, predict, slide_logits, window_starts
from .metric import IGNORE_INDEX, SegMetric, metrics_from_areas, miou

__all__ = [
    "ADE_DEFAULT_DIRS",
    "IGNORE_INDEX",
    "LinearSegmenter",
    "SegAdapter",
    "SegDatasetEntry",
    "SegMetric",
    "Subset",
    "evaluate",
    "grid_window_logits",
    "interp_matrix",
    "metrics_from_areas",
    "miou",
    "open_split",
    "predict",
    "segmentation_loss",
    "slide_logits",
    "subset",
    "window_starts",
]
