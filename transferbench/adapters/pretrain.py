"""Upstream pretraining (DPN App. C: the AugReg recipe), one cell per backbone, writing a checkpoint.

Protocol (numbers in tasks/pretrain.yaml): Adam with decoupled weight decay, linear warm-up then cosine
to 0, sigmoid cross-entropy on one-hot targets, gradient clip 1.0, dropout and stochastic depth 0.1 for
B and L. The record's info holds the checkpoint path and sha256; `NAME@embedded` backbones resolve to it
(`embedded_checkpoint`, the `embedded` weights provider of backbones.weights) and pretrain on demand.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
from pydantic import BaseModel, ConfigDict

from ..backbones import SIZES, create_backbone, parse_name, save_checkpoint
from ..cell import BackboneRef, RANDOM_INIT
from ..data.sources import open_split
from ..data.transforms import AUGMENTATIONS, eval_transform, train_transform
from ..engine.runner import Results, run_task
from ..engine.train import (BF16_SETTINGS, accuracy, cross_entropy, fit, sigmoid_cross_entropy,
                            train_batches)
from ..errors import UserError
from ..hashing import file_sha256
from ..paths import cache
from ..records.store import RecordStore
from .base import Adapter, plan_select_then_final, prepare_task


class PretrainDataset(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    group: str | None = None
    version: str = ""
    source: str  # embedded | tfds
    tfds: str | None = None
    train: str
    test: str


def load_split(cell, split: str, data_dir=None):
    return open_split({**cell.dataset_config, "name": cell.dataset}, cell.dataset_config[split], data_dir)


def checkpoint_path(cell) -> Path:
    return cache("checkpoints") / f"{cell.backbone}-{cell.dataset}-{cell.key}.safetensors"


LOSSES = {"sigmoid": sigmoid_cross_entropy, "softmax": cross_entropy}


class PretrainAdapter(Adapter):
    name = "pretrain"
    dataset_schema = PretrainDataset
    hparam_choices = {"loss": tuple(LOSSES), "augment": AUGMENTATIONS, "bf16": BF16_SETTINGS}

    def plan(self, task, backbone, results):
        return plan_select_then_final(task, backbone, results)

    def run(self, cell, ctx):

        hp = cell.hparams
        torch.manual_seed(cell.seed)
        train, test = load_split(cell, "train", ctx.data_dir), load_split(cell, "test", ctx.data_dir)
        name = cell.backbone.partition("@")[0]  # the spec may name a checkpoint to continue from
        try:
            big = parse_name(name)["embed_dim"] >= SIZES["b"].embed_dim  # AugReg regularises B and L only
        except UserError:
            big = False  # a plugin backbone: no size to go by
        reg = dict(drop_rate=hp["dropout_b_l"], drop_path_rate=hp["dropout_b_l"]) if big else {}
        model = create_backbone(name, img_size=hp["resolution"], num_classes=train.num_classes,
                                checkpoint=cell.checkpoint, **reg)
        model.to(ctx.device)
        decay = [p for n, p in model.named_parameters() if p.ndim > 1 and "pos_embed" not in n]
        rest = [p for n, p in model.named_parameters() if not (p.ndim > 1 and "pos_embed" not in n)]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": hp["weight_decay"]},
                                 {"params": rest, "weight_decay": 0.0}], lr=hp["lr"], betas=(0.9, hp["beta2"]))
        batches = train_batches(train, train_transform(hp["resolution"], hp["augment"]), batch=hp["batch"],
                                steps=hp["steps"], seed=cell.seed, workers=ctx.workers)
        started = time.time()
        out = fit(model, batches, opt, steps=hp["steps"], base_lr=hp["lr"], warmup=hp["warmup_steps"], clip=hp["clip"],
                  loss_fn=LOSSES[hp["loss"]], device=ctx.device, bf16=hp["bf16"], micro_batch=ctx.micro_batch,
                  progress=ctx.progress, desc=f"pretrain {cell.backbone}")
        train_seconds = time.time() - started
        acc = accuracy(model, test, eval_transform(hp["resolution"]), ctx.device, out["bf16"], workers=ctx.workers)
        path = save_checkpoint(model.cpu(), checkpoint_path(cell), task="pretrain", dataset=cell.dataset,
                               cell_key=cell.key, steps=hp["steps"], test_accuracy=acc)
        return {"test": {"accuracy": acc},
                "info": {**out, "checkpoint": str(path), "checkpoint_sha256": file_sha256(path),
                         "train_seconds": round(train_seconds, 1),
                         "images_per_second": round(hp["steps"] * hp["batch"] / max(train_seconds, 1e-9), 1)}}



PRETRAINED = {"embedded": "embedded"}  # NAME@<this> -> the pretrain task's suite that makes the weights
PRETRAIN_SETS: tuple = ()  # --set overrides for that suite (tests shorten it; users keep the spec's)
# checkpoints of the pretrain task that ship with the package, named {backbone}-{dataset}-{cell key}
SHIPPED = Path(__file__).resolve().parent.parent / "weights"


def embedded_checkpoint(name: str) -> Path:
    """The weights provider of `NAME@embedded` (entry point group transferbench.weights)."""
    return pretrained_checkpoint(name, "embedded")


def pretrained_checkpoint(name: str, source: str, *, show_progress: bool = True) -> Path | None:
    """The checkpoint of task `pretrain` (suite `source`) for backbone `name`, or None when `source` is
    not a pretraining suite (a file path, then): the one shipped in transferbench/weights when its cell
    key matches (same profile, data and protocol version), else the record's, pretraining first when
    the record is missing (a record is reused, as for any cell)."""

    if source not in PRETRAINED:
        return None
    task = prepare_task("pretrain", suite=PRETRAINED[source], sets=PRETRAIN_SETS)
    out = cache("pretrain")
    ref = BackboneRef(name, name, None, RANDOM_INIT)
    store = RecordStore(out)
    (cell,) = [c for c in task.adapter.plan(task, ref, Results(store)) if c.stage == "final"]
    shipped = SHIPPED / f"{name}-{cell.dataset}-{cell.key}.safetensors"
    if shipped.is_file():  # made by exactly this cell (same profile, data version and code protocol)
        return shipped
    if show_progress and not store.finished(cell):
        print(f"{name}@{source}: no shipped checkpoint for this pretraining profile; pretraining it now "
              f"(the record under {out} is reused afterwards)", file=sys.stderr)
    run_task(task, [ref], out, show_progress=show_progress)
    rec = store.get(cell)
    if rec is None or rec["status"] != "ok":
        why = rec["reason"] if rec else "no record"
        raise UserError(f"pretraining {name} on the {source} suite did not finish ({why}); see {store.path(cell)}")
    path = Path(rec["info"]["checkpoint"])
    if not path.is_file() or file_sha256(path) != rec["info"]["checkpoint_sha256"]:
        raise UserError(f"checkpoint {path} of {name}@{source} is missing or changed; delete {store.path(cell)} "
                        f"and rerun to pretrain again")
    return path
