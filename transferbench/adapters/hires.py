"""High-resolution fine-tuning (DPN App. D, its printed big_vision config): a checkpoint trained at its own
resolution (224) fine-tuned at a higher one (384) with sigmoid cross-entropy (`sigmoid_xent`), a new
zero-initialised head on the checkpoint's representation layer (App. D's `dont_load` head, whatever the
checkpoint's class count), SGD momentum, lr 0.03, no weight decay, clip 1.0, batch 512, 5,000 steps of which 500
warm-up then cosine, inception crop + flip, on ImageNet's train[:99%] (minival train[99%:] evaluated too); evaluated
after resize-small 418 -> centre crop 384. Position embeddings are resampled on the patch grid with big_vision's
`resample_posemb` (bilinear with the corner samples kept, = scipy.ndimage.zoom order 1; `posemb: timm` uses timm's
bicubic antialiased resampling instead) and DTN's grid factors are rebuilt for the new grid.

Cells, per dataset and seed, with the same hyper-parameters (so the record holds both resolutions):
    stage 'base':  the recipe at `base_resolution` (default: the checkpoint's own), evaluated there;
    stage 'high':  the recipe at `resolution`, evaluated there.
Both stages train with the same recipe, so their paired per-seed difference (the report's "gain") is what the
resolution alone buys. Training is adapters.classify.finetune (engine.train.fit: the one loop). `head: auto` is the
option that keeps a checkpoint head with the dataset's classes (an ImageNet-1k fine-tuned file for imagenet2012).

Datasets: imagenet2012 (train / validation) and every dataset of the VTAB spec (`datasets_from: [vtab]`), or
the embedded sets; the report (reporting/hires.py) shows base and high accuracy side by side with their
paired gain.
"""

from __future__ import annotations

from functools import lru_cache

from ..backbones.checkpoint import checkpoint_resolution
from ..cell import HIRES_REPORT, make_cell
from ..data.transforms import eval_transform
from ..engine.evaluate import Evaluation, accuracy
from ..errors import UserError
from ..settings.finetune import HiresSettings
from .classify import ClassificationAdapter, finetune, open_split

STAGES = ("base", "high")


@lru_cache(maxsize=32)
def _checkpoint_resolution(path: str) -> int | None:
    size = checkpoint_resolution(path)
    if size is None:
        return None
    if size[0] != size[1]:
        raise UserError(
            f"checkpoint {path} was trained at {size[0]}x{size[1]} px; high-res fine-tune starts from "
            "square inputs: set --set base_resolution=N"
        )
    return int(size[0])


def base_resolution(hp: dict, backbone) -> int:
    """`base_resolution` as a number: 'checkpoint' is the resolution the weights were trained at (what a timm tag
    or a py: model states, else what the checkpoint file says)."""
    value = hp["base_resolution"]
    if value != "checkpoint":
        try:
            return int(value)
        except (TypeError, ValueError):
            raise UserError(f"base_resolution={value!r}: give a number of pixels or 'checkpoint'") from None
    stated = dict(backbone.preprocess).get("input_size")
    if stated:  # timm tags' pretrained_cfg, a py: model's patch_embed.img_size
        return int(stated)
    if backbone.checkpoint is None:
        raise UserError(
            f"backbone {backbone.spec!r} has no checkpoint, so no resolution of its own: give "
            "NAME@CHECKPOINT or set --set base_resolution=N"
        )
    res = _checkpoint_resolution(str(backbone.checkpoint))
    if res is None:
        raise UserError(f"checkpoint {backbone.checkpoint} does not say its resolution: set --set base_resolution=N")
    return res


def eval_resize_small(hp: dict, resolution: int) -> int:
    """The protocol's resize-small before the centre crop, scaled to `resolution` (418 -> 384 at 384; the same
    crop fraction at the base resolution)."""
    return max(resolution, round(resolution * float(hp["eval_resize_small"]) / float(hp["resolution"])))


class HiresAdapter(ClassificationAdapter):
    name = "hires"
    settings = HiresSettings

    data_name = "high-res"

    def check_hparams(self, task) -> None:
        for hp in task.grid():
            if int(hp["resolution"]) < 1 or float(hp["eval_resize_small"]) < float(hp["resolution"]):
                raise UserError(
                    f"resolution={hp['resolution']}, eval_resize_small={hp['eval_resize_small']}: the "
                    "resize before the centre crop must be at least the resolution (protocol: 418 -> 384)"
                )

    def plan(self, task, backbone, results):
        cells = []
        for ds in task.datasets:
            for hp in task.grid():
                base = base_resolution(hp, backbone)
                if base >= int(hp["resolution"]):
                    raise UserError(
                        f"base_resolution {base} is not below resolution {hp['resolution']}: high-res "
                        "fine-tune goes up (set --set resolution=N or base_resolution=N)"
                    )
                fixed = {**hp, "base_resolution": base}
                for seed in task.seeds:
                    for stage in STAGES:
                        cells.append(make_cell(task, ds, backbone, fixed, seed, stage, report=HIRES_REPORT))
        return cells

    def run(self, cell, ctx):

        s = self.settings_of(cell)
        ds = self.entry(cell.dataset, cell.dataset_config)
        res = int(s.resolution if cell.stage == "high" else s.base_resolution)
        train, test = open_split(ds, "train", ctx.data_dir), open_split(ds, "test", ctx.data_dir)
        augment = ds["augment"] if s.augment == "dataset" else s.augment
        model, info = finetune(
            cell,
            s.model_copy(update={"resolution": res}),  # the model is built and trained at `res`
            train,
            ds["classes"],
            augment,
            ctx,
            keep_head=s.head == "auto",
            desc=f"{cell.dataset} {cell.stage} {res}px seed={cell.seed}",
            posemb=s.posemb,
        )
        resize = eval_resize_small(s, res)
        evaluate = eval_transform(res, resize_small=resize, pixels=s.pixels)
        how = Evaluation.of(ctx, info["bf16"])
        acc = accuracy(model, test, evaluate, how)
        extra = {}
        if ds.get("minival"):
            minival = open_split({**ds, "test": ds["minival"]}, "test", ctx.data_dir)
            extra["minival"] = {"accuracy": accuracy(model, minival, evaluate, how)}
        return {
            "test": {"accuracy": acc},
            **extra,
            "info": {
                **info,
                "trained_resolution": res,
                "eval_resize_small": resize,
                "augment": augment,
                "base_resolution": int(s.base_resolution),
                "high_resolution": int(s.resolution),
                "checkpoint_resolution": _checkpoint_resolution(str(cell.checkpoint)) if cell.checkpoint else None,
                "eval_examples": len(test),
            },
        }
