"""The classifier under test: a checkpoint's own head, or App. E's recipe fine-tuned on the clean split and cached
by its training identity."""

from __future__ import annotations

import json
from pathlib import Path

from ...backbones import create_backbone
from ...backbones.checkpoint import head_classes, save_checkpoint
from ...backbones.registry import backbone_code
from ...errors import UserError
from ...fingerprint import for_cache
from ...hashing import digest
from ...paths.entries import sealed, verified
from ...paths.home import cache
from ...settings.finetune import CorruptionSettings
from ..classify import finetune
from .dataset import TRAIN_KEYS, entry
from .images import open_clean


def home_dir() -> Path:
    return cache("classifiers")


def classifier_key(cell) -> str:
    """What determines the fine-tuned classifier: backbone and weights, the clean training data, the training
    hyper-parameters and the seed (not the corruption nor how the test images are made), and the fingerprint of
    the code and libraries that fine-tune it."""
    ds = entry(cell)
    ident = {
        "code": for_cache("classifiers", *backbone_code(cell.backbone)).digest,
        "backbone": cell.backbone_name,
        "weights": cell.checkpoint_sha256,
        "data": {k: ds.get(k) for k in ("name", "source", "tfds", "set", "train", "classes", "augment")},
        "data_version": cell.data_version,
        "hp": {k: cell.hparams.get(k) for k in TRAIN_KEYS},
        "seed": cell.seed,
    }
    return digest(ident)


def classifier(cell, ctx):
    """(model, info): the checkpoint's own head when it has the dataset's classes (hparam classifier auto or
    checkpoint), else the fine-tuned head from the classifier cache, trained on a miss."""
    from filelock import FileLock

    hp, ds = CorruptionSettings.of_cell(cell), entry(cell)
    name, mode, res = cell.backbone_name, hp.classifier, hp.resolution
    head = head_classes(cell.checkpoint) if cell.checkpoint and mode != "finetune" else None
    if head == ds["classes"]:
        model = create_backbone(name, img_size=res, num_classes=ds["classes"], checkpoint=cell.checkpoint)
        return model.to(ctx.device).eval(), {"classifier": "checkpoint head"}
    if mode == "checkpoint":
        raise UserError(
            f"backbone {cell.backbone!r}: classifier=checkpoint needs a checkpoint whose head has "
            f"{ds['classes']} classes (dataset {cell.dataset!r}); it has "
            f"{'none' if head is None else head}: use --set classifier=auto to fine-tune one"
        )
    if not ds["train"]:
        raise UserError(
            f"dataset {cell.dataset!r} has no training split to fine-tune a head on and backbone "
            f"{cell.backbone!r} has no head of {ds['classes']} classes: give NAME@CHECKPOINT with an "
            f"{ds['classes']}-class head (e.g. an ImageNet-1k fine-tuned file)"
        )
    folder = home_dir()
    folder.mkdir(parents=True, exist_ok=True)
    key = classifier_key(cell)
    path = folder / f"{key}.safetensors"
    with FileLock(str(folder / f"{key}.lock")):
        if verified(path, "classifier cache entry"):
            from safetensors import safe_open

            model = create_backbone(name, img_size=res, num_classes=ds["classes"], checkpoint=path)
            with safe_open(str(path), "pt") as f:  # the header only
                info = json.loads((f.metadata() or {}).get("info", "{}"))
            return model.to(ctx.device).eval(), {**info, "classifier_cache_hit": True}
        train = open_clean(ds, ds["train"], ctx.data_dir)
        model, info = finetune(
            cell, hp, train, ds["classes"], ds["augment"], ctx, desc=f"{cell.dataset} fine-tune seed={cell.seed}"
        )
        info = {**info, "classifier": "fine-tuned", "classifier_key": key}
        with sealed(path, suffix=".safetensors") as tmp:
            save_checkpoint(model, tmp, info=info)
    return model.eval(), {**info, "classifier_cache_hit": False}
