"""The segmentation adapter: Segmenter's linear decoder on the fine-tuned backbone, the train fractions, the
ADE20K / tfds / embedded data entries, and one cell = fine-tune on a fraction, then sliding-window evaluation."""

from __future__ import annotations

import math
import time
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ...backbones import create_backbone
from ...backbones.api import patch_grid, require
from ...data import embedded
from ...data.folder import DataMissingError
from ...data.segmentation import AdeFolder, SegFolderDataset, TfdsSegmentation, find_ade_root, train_transform
from ...data.sources import DatasetEntry, require_tfds_name
from ...engine import augreg
from ...engine.train import fit_protocol
from ...errors import UserError
from ...settings.choices import DECODER_TOKENS
from ...settings.seg import SegSettings
from ..base import Adapter, plan_select_then_final
from .inference import evaluate
from .metric import IGNORE_INDEX


class LinearSegmenter(nn.Module):
    """Segmenter's linear decoder on a ViT with timm's API (backbones.api: `forward_intermediates`,
    `forward_features`, `num_prefix_tokens`, `patch_embed.grid_size`, `embed_dim`): patch tokens -> Linear(D, K)
    -> (B, K, h, w) -> bilinear upsampling to the input size. The head is initialised as Segmenter's (truncated
    normal, std 0.02; bias 0).

    `tokens`: 'prenorm' (DPN App. G's `out_with_norm = False`): the last block's patch tokens, before the
    encoder's final norm, which then takes no part; 'norm': after it (`forward_features`)."""

    def __init__(self, backbone: nn.Module, num_classes: int, tokens: str = "prenorm"):
        super().__init__()
        from timm.layers import trunc_normal_

        if tokens not in DECODER_TOKENS:
            raise ValueError(f"decoder_tokens {tokens!r}: choose one of {', '.join(DECODER_TOKENS)}")
        self.backbone, self.num_classes, self.tokens = backbone, num_classes, tokens
        self.head = nn.Linear(backbone.embed_dim, num_classes)
        trunc_normal_(self.head.weight, std=0.02)
        nn.init.zeros_(self.head.bias)

    def patch_tokens(self, x: torch.Tensor) -> torch.Tensor:
        """(B, N, D) patch tokens the decoder reads (prefix tokens dropped)."""
        if self.tokens == "prenorm":
            return self.backbone.forward_intermediates(
                x, indices=1, norm=False, output_fmt="NLC", intermediates_only=True
            )[0]
        return self.backbone.forward_features(x)[:, self.backbone.num_prefix_tokens :]

    def grid_logits(self, x: torch.Tensor) -> torch.Tensor:
        """(B, K, h, w) on the patch grid, before upsampling."""
        tokens = self.patch_tokens(x)
        gh, gw = patch_grid(self.backbone)
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


def _segmenter(cell, s: SegSettings, classes: int, device):
    """(the backbone, App. G's linear segmenter on it) for a cell, on `device`: its checkpoint at the crop size,
    stochastic depth and position-embedding resampling as the settings say, no classifier."""
    backbone = create_backbone(
        cell.backbone_name,
        img_size=s.crop,
        checkpoint=cell.checkpoint,
        drop_path_rate=s.drop_path,
        **({"posemb": s.posemb} if s.posemb else {}),
    )
    backbone.reset_classifier(0)
    return backbone, LinearSegmenter(backbone, classes, tokens=s.decoder_tokens).to(device)


def train_steps(hp: SegSettings, subset_size: int, pool_size: int) -> int:
    """The fine-tuning steps of a cell. `steps` when set; else `epochs` x steps per epoch, where an epoch is
    `pool_size // batch` steps whatever the fraction (`epoch: pool`, App. G: `steps_per_epoch = 20210 //
    batch_size` with 20,210 = all of ADE20K's training images, so every fraction trains 128 x 1263 steps) or
    ceil(subset_size / batch) steps (`epoch: fraction`: passes over the fraction's own images)."""
    if hp.steps:
        return hp.steps
    if hp.epoch == "pool":
        return hp.epochs * max(1, pool_size // hp.batch)
    return math.ceil(hp.epochs * subset_size / hp.batch)


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


class SegDatasetEntry(DatasetEntry):
    source: Literal["ade", "tfds", "embedded"] = "ade"  # type: ignore[assignment]
    classes: int
    reduce_zero_label: bool = True  # ADE20K: 0 'other' -> 255, 1..150 -> 0..149 (embedded sets: from their info)


ADE_DEFAULT_DIRS = ("data/ade",)  # mmsegmentation's data_root for ADE20K


def open_split(ds: dict, split: str, data_dir=None):
    """(image, mask) dataset of `split` for a resolved dataset entry: the ADE20K folder layout (source ade),
    a prepared tfds dataset (source tfds) or an embedded segmentation set (source embedded)."""

    if ds["source"] == "embedded":
        name = ds.get("set") or ds["name"]
        return embedded.open_set(name, lambda root: SegFolderDataset(root, name, split))
    if ds["source"] == "tfds":
        return TfdsSegmentation(
            ds["tfds"], split, data_dir=data_dir, num_classes=ds["classes"], reduce_zero=ds["reduce_zero_label"]
        )
    searched = [data_dir] if data_dir else list(ADE_DEFAULT_DIRS)
    for d in searched:
        root = find_ade_root(d)
        if root is not None:
            return AdeFolder(root, split, num_classes=ds["classes"], reduce_zero=ds["reduce_zero_label"])
    raise DataMissingError(
        f"ADE20K not found: searched {', '.join(str(d) for d in searched)} and its "
        "ADEChallengeData2016/ for images/ and annotations/"
    )


# the training images of a data set whose size `run --dry-run` knows before reading it: ADE20K's 20,210 (App. G's
# `steps_per_epoch = 20210 // batch_size`)
TRAINING_IMAGES = {"ade20k": 20210}


class SegAdapter(Adapter):
    name = "seg"
    dataset_schema = SegDatasetEntry
    settings = SegSettings

    def input_size(self, cell) -> int:
        return self.settings_of(cell).crop

    def training_images(self, cell) -> int:
        """`train_steps` x batch: known before the data is read where `steps` is set or the set's size is
        (TRAINING_IMAGES); 0 (no estimate) otherwise."""
        hp = self.settings_of(cell)
        pool = TRAINING_IMAGES.get(cell.dataset, 0)
        if not hp.steps and not pool:
            return 0
        n = len(subset(pool, hp.fraction, cell.seed)) if pool else 0
        return train_steps(hp, n, pool) * hp.batch

    def validate(self, spec, source="<spec>"):
        super().validate(spec, source)
        for i, ds in enumerate(spec.datasets):
            require_tfds_name(source, i, {"source": "ade", **ds.model_dump()})

    def check_data(self, task, ctx) -> None:
        """Before any cell: every dataset's train and test splits open, or one line says what is missing."""

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
        hint = (
            f"searched {searched} (--data-dir, else mmsegmentation's data/ade) and its ADEChallengeData2016/ "
            "for images/{training,validation}/*.jpg with annotations/{training,validation}/*.png; "
            "download ADEChallengeData2016.zip from http://data.csail.mit.edu/places/ADEchallenge/ and unzip it "
            "there, or give --data-dir; tfds's scene_parse150 holds the 2017 instance masks (100 categories, "
            "not these 150 classes): run it as --datasets scene_parse150 once prepared with tfds"
            if ade
            else missing[0][1]
        )
        raise UserError(
            f"segmentation data missing for {names}: {hint}; or try `--suite embedded`, which needs no download"
        )

    def plan(self, task, backbone, results):
        for hp in task.grid():  # a model without a patch grid is refused here, before any cell runs
            needs = {"patch grid": "the linear decoder reads the patch tokens on it"}
            if hp["decoder_tokens"] == "prenorm":
                needs["forward_intermediates"] = (
                    "decoder_tokens=prenorm reads the last block before the final norm; --set decoder_tokens=norm "
                    "reads forward_features"
                )
            require(backbone.name, task.spec.task, needs, img_size=int(hp["crop"]))
        return plan_select_then_final(task, backbone, results)  # fraction is a report axis: no select stage

    def run(self, cell, ctx):
        s = self.settings_of(cell)
        ds = self.entry(cell.dataset, cell.dataset_config)
        full = open_split(ds, ds["train"], ctx.data_dir)
        test = open_split(ds, ds["test"], ctx.data_dir)
        train = Subset(full, subset(len(full), s.fraction, cell.seed))
        steps = train_steps(s, len(train), len(full))

        torch.manual_seed(cell.seed)
        backbone, model = _segmenter(cell, s, ds["classes"], ctx.device)
        opt = augreg.scenic_adamw(
            model,
            lr=s.lr,
            weight_decay=s.weight_decay,
            betas=(s.beta1, s.beta2),
            skip_scale_and_bias=s.skip_scale_and_bias,
            device=ctx.device,
        )
        crops = train_transform(
            s.crop,
            ratio=(s.ratio_min, s.ratio_max),
            photometric=s.photometric,
            cat_max_ratio=s.cat_max_ratio,
            pixels=s.pixels,
        )
        options = {"steps": steps, "joint": True, "loss_fn": segmentation_loss, "schedule": s.schedule}
        options |= {"power": s.power, "desc": f"{cell.dataset} fraction={s.fraction} seed={cell.seed}"}
        out, _, train_seconds = fit_protocol(model, train, crops, opt, s, cell.seed, ctx, **options)
        started = time.time()
        metric = evaluate(
            model,
            test,
            ds["classes"],
            short=s.test_short,
            window=s.window,
            stride=s.stride,
            bf16=out["bf16"],
            progress=ctx.progress,
            desc=f"{cell.dataset} sliding-window eval",
            pixels=s.pixels,
        )
        result = metric.compute()
        return {
            "test": {"miou": 100 * result["miou"], "aacc": 100 * result["aacc"], "macc": 100 * result["macc"]},
            "info": {
                **out,
                "steps": steps,
                "train_examples": len(train),
                "train_pool": len(full),
                "posemb_resample": getattr(backbone, "posemb_resample", None),
                "no_decay_params": len(augreg.scale_and_bias(model)) if s.skip_scale_and_bias else 0,
                "eval_examples": len(test),
                "train_seconds": round(train_seconds, 2),
                "eval_seconds": round(time.time() - started, 2),
                "iou_per_class": [None if np.isnan(v) else round(100 * float(v), 4) for v in result["iou"]],
            },
        }
