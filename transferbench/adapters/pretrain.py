"""Upstream pretraining (DPN §5 + App. C: the AugReg recipe in big_vision), one cell per backbone, writing a
checkpoint.

Protocol (numbers in tasks/pretrain.yaml; the recipe's pieces in engine.augreg): inception crop + flip +
RandAugment(2, m) and mixup p at the strength App. C's table gives each model size (`aug: auto`), the
representation layer (`rep_size`) except for S/32, dropout and stochastic depth 0.1 for B and L only, a
zero-initialised head with bias -6.9, sigmoid cross-entropy, Adam (0.9, 0.999) with big_vision's weight decay
(wd x schedule on the kernels: AdamW weight_decay = wd / lr), linear warm-up then cosine to 0, clip 1.0; train on
`train[:99%]`, evaluate on the official validation split and on minival `train[99%:]` after resize-small 256 ->
centre crop 224. The record's info holds the checkpoint path and sha256; the checkpoint's header says its pixel
normalisation. `NAME@embedded` backbones resolve to it (`embedded_checkpoint`, the `embedded` weights provider of
backbones.weights) and pretrain on demand.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from pydantic import BaseModel, ConfigDict

from ..arithmetic import pin_next
from ..backbones import create_backbone, parse_name, save_checkpoint
from ..backbones.checkpoint import training_log_path
from ..backbones.measures import TrainingLog
from ..backbones.registry import backbone_code
from ..cell import RANDOM_INIT, BackboneRef, pretraining_name
from ..data.sources import open_split
from ..data.transforms import eval_transform, train_transform
from ..engine import augreg
from ..engine.evaluate import Evaluation, accuracy, heldout_loss
from ..engine.losses import LOSSES
from ..engine.runner import Results, RunOptions, run_task
from ..engine.train import fit_protocol
from ..errors import UserError
from ..fingerprint import for_cache
from ..hashing import file_sha256
from ..paths.entries import damage, quarantine
from ..paths.home import cache
from ..paths.portable import expand, portable
from ..paths.writes import atomic_path
from ..records.store import RecordStore
from ..settings.choices import MIXUP, RANDAUG
from ..settings.pretrain import PretrainSettings
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
    minival: str | None = None  # a held-out part of the training split, evaluated as well (AugReg: train[99%:])


def load_split(cell, split: str, data_dir=None):
    return open_split({**cell.dataset_config, "name": cell.dataset}, cell.dataset_config[split], data_dir)


def checkpoint_path(cell) -> Path:
    """Where pretraining `cell` puts its checkpoint: named by the cell and the fingerprint of the code that trains it
    (a shipped checkpoint is named by the cell alone: it is an input, identified by its sha256 in every cell key)."""
    code = for_cache("checkpoints", *backbone_code(cell.backbone)).digest
    return cache("checkpoints") / f"{cell.backbone}-{cell.dataset}-{cell.key}-{code}.safetensors"


GRAD_LOG_LAST = 1000  # DPN Fig. 2: per-layer gradient norms over the last 1,000 steps of upstream training


def recipe(name: str, hp: PretrainSettings) -> dict:
    """What App. C sets per model size, resolved for backbone `name`: aug (its RandAugment and mixup), rep_size,
    dropout. `aug: auto` and `rep_size: auto` follow App. C's table; a size the table lacks needs them set."""
    try:
        parsed = parse_name(name)
    except UserError:
        parsed = None  # a plugin backbone: no size to go by
    size = augreg.size_key(parsed, name) if parsed else name
    aug = hp.aug
    if aug == "auto":
        if size not in augreg.AUG:
            raise UserError(
                f"aug=auto: DPN App. C gives no augmentation for {name!r} (it covers "
                f"{', '.join(augreg.AUG)}); set --set aug={'|'.join(RANDAUG)}"
            )
        aug = augreg.AUG[size]
    rep = hp.rep_size
    if rep == "auto":
        rep = size not in augreg.NO_REP if size in augreg.AUG else bool(parsed and parsed.get("rep_size"))
    else:
        rep = rep in ("on", True)
    big = bool(parsed) and size[0] in augreg.BIG
    return {
        "aug": aug,
        "randaug": RANDAUG[aug],
        "mixup": MIXUP[aug],
        "rep_size": (parsed["embed_dim"] if parsed else 0) if rep else 0,
        "dropout": hp.dropout_b_l if big else 0.0,
    }


class PretrainAdapter(Adapter):
    name = "pretrain"
    dataset_schema = PretrainDataset
    settings = PretrainSettings

    def plan(self, task, backbone, results):
        if backbone.name.startswith(("timm:", "py:")):
            raise UserError(
                f"backbone {backbone.name!r}: pretrain trains transferbench's own ViT names (App. C's recipe per "
                "size); a timm: or py: backbone brings its weights as @FILE (or a cached tag) to the transfer tasks"
            )
        return plan_select_then_final(task, backbone, results)

    def run(self, cell, ctx):
        hp = self.settings_of(cell)
        pin = shipped_precision(cell, hp.bf16)
        if pin is not None:
            pin_next(pin, "the shipped profile: its checkpoints were trained in fp32")
        torch.manual_seed(cell.seed)
        train, test = load_split(cell, "train", ctx.data_dir), load_split(cell, "test", ctx.data_dir)
        name = cell.backbone_name  # the spec may name a checkpoint to continue from
        r = recipe(name, hp)
        reg = dict(drop_rate=r["dropout"], drop_path_rate=r["dropout"]) if r["dropout"] else {}
        model = create_backbone(
            name,
            img_size=hp.resolution,
            checkpoint=cell.checkpoint,
            **({"rep_size": r["rep_size"]} if cell.checkpoint is None else {}),
            **reg,
        )
        model.reset_classifier(train.num_classes, bias=hp.init_head_bias)
        model.to(ctx.device)
        opt = augreg.adamw(
            model, lr=hp.lr, wd=hp.wd, betas=(hp.beta1, hp.beta2), device=ctx.device, dtn_lr_mult=hp.dtn_lr_mult
        )
        px = hp.pixels
        transform = train_transform(hp.resolution, hp.augment, pixels=px, randaug=augreg.randaugment(r["aug"]))
        mixup = (lambda b: augreg.mixup_batches(b, r["mixup"], train.num_classes, cell.seed)) if r["mixup"] else None
        targets = augreg.TargetEntropy()  # what the loss is fed: a probe signal of mixup
        log = TrainingLog(model, hp.steps, last=GRAD_LOG_LAST)
        out, data_path, train_seconds = fit_protocol(
            model,
            train,
            transform,
            opt,
            hp,
            cell.seed,
            ctx,
            wrap=lambda b: targets.watch(mixup(b) if mixup else b),
            loss_fn=LOSSES[hp.loss],
            desc=f"pretrain {cell.backbone}",
            on_step=log,
            loss_at=loss_points(hp.steps),
        )
        metrics = evaluate(model, cell, hp, test, Evaluation.of(ctx, out["bf16"]), ctx, targets)
        acc = metrics["test"]["accuracy"]
        path = save_checkpoint(
            model.cpu(),
            checkpoint_path(cell),
            task="pretrain",
            dataset=cell.dataset,
            cell_key=cell.key,
            steps=hp.steps,
            pretraining=pretraining_name(cell, hp.steps),
            test_accuracy=acc,
            pixels=px,
        )
        log_file = write_training_log(path, log.to_dict())
        return {**metrics, "info": _info(out, data_path, r, hp, path, log_file, train_seconds)}


def _info(out: dict, data_path: dict, r: dict, hp, path, log_file, train_seconds: float) -> dict:
    """A pretraining cell's info: the loop's and the data path's, App. C's recipe as it ran, the checkpoint and its
    training log, and the training's pace."""
    return {
        **out,
        **data_path,
        **{k: v for k, v in r.items() if k != "randaug"},
        "randaug": list(r["randaug"]) if r["randaug"] else None,
        "randaug_torchvision_magnitude": augreg.torchvision_magnitude(r["randaug"][1]) if r["randaug"] else None,
        "adamw_weight_decay": augreg.decoupled_wd(hp.wd, hp.lr),
        "checkpoint": portable(path),
        "checkpoint_sha256": file_sha256(path),
        "training_log": portable(log_file),
        "train_seconds": round(train_seconds, 1),
        "images_per_second": round(hp.steps * hp.batch / max(train_seconds, 1e-9), 1),
    }


def evaluate(model, cell, hp, test, how, ctx, targets) -> dict:
    """A pretrained model's metrics: the upstream accuracy (and minival's, where the set has one) and the training
    signals the regression gate compares besides it (docs/regression.md): the loss on the held-out split (one fixed
    point of the curve), the norm of the decayed weights (the weight decay applied), the entropy of the targets the
    loss saw (`targets`, mixup)."""
    transform = eval_transform(hp.resolution, resize_small=hp.eval_resize_small, pixels=hp.pixels)
    metrics = {"test": {"accuracy": accuracy(model, test, transform, how)}}
    metrics["train"] = {
        "loss_heldout": heldout_loss(model, test, transform, how, LOSSES[hp.loss]),
        "decayed_norm": augreg.decayed_norm(model),
        "target_entropy": targets.value(),
    }
    if cell.dataset_config.get("minival"):
        minival = load_split(cell, "minival", ctx.data_dir)
        metrics["minival"] = {"accuracy": accuracy(model, minival, transform, how)}
    return metrics


def loss_points(steps: int) -> tuple[int, ...]:
    """The steps (counted from 1) whose batch loss a pretraining record keeps: a quarter, half, three quarters and
    all of training."""
    return tuple(sorted({max(1, steps * k // 4) for k in range(1, 5)}))


def write_training_log(checkpoint, log: dict) -> Path:
    """The training log as the checkpoint's side file (`backbones.checkpoint.training_log_path`), written
    aside and renamed into place; the checkpoint file itself (and so its sha256) is left as it is."""
    path = training_log_path(checkpoint)
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(log))
    return path


PRETRAINED = {"embedded": "embedded"}  # NAME@<this> -> the pretrain task's suite that makes the weights
PRETRAIN_SETS: tuple = ()  # --set overrides for that suite (tests shorten it; users keep the spec's)
# checkpoints of the pretrain task that ship with the package, named {backbone}-{dataset}-{cell key}
SHIPPED = Path(__file__).resolve().parent.parent / "weights"


def embedded_checkpoint(name: str) -> Path:
    """The weights provider of `NAME@embedded` (entry point group transferbench.weights)."""
    return pretrained_checkpoint(name, "embedded")


def _pretrain_cell(name: str, source: str):
    """(task, backbone ref, final cell, records folder) of the pretraining that makes `name`@`source`."""
    task = prepare_task("pretrain", suite=PRETRAINED[source], sets=PRETRAIN_SETS)
    out = cache("pretrain")
    ref = BackboneRef(name, name, None, RANDOM_INIT)
    (cell,) = [c for c in task.adapter.plan(task, ref, Results(RecordStore(out))) if c.stage == "final"]
    return task, ref, cell, out


def shipped_checkpoint(name: str, source: str = "embedded") -> Path:
    """Where the shipped checkpoint of `name`@`source` for the current profile lies (it may not exist): the name
    holds the pretraining cell's key, which covers the profile, the data generator's version and the protocol."""
    _, _, cell, _ = _pretrain_cell(name, source)
    return _shipped_path(name, cell)


# the precision each pretraining suite whose checkpoints ship was trained in (the shipped mu4, mu4_dpn and mu4_dtn:
# fp32, the choice of `bf16: auto` on the idle machine that made them): retraining them takes it again, whatever a
# probe on a loaded machine would say, so that they rebuild bit for bit from one command
SHIPPED_PRECISION = {"embedded": False}


def shipped_precision(cell, setting) -> bool | None:
    """The precision a pretraining cell must train in where it makes a checkpoint that ships (its `bf16` is
    `auto` and transferbench/weights holds the checkpoint of exactly this cell); None elsewhere."""
    if setting != "auto" or cell.suite not in SHIPPED_PRECISION:
        return None
    if not _shipped_path(cell.backbone_name, cell).is_file():
        return None
    return SHIPPED_PRECISION[cell.suite]


def _shipped_path(name: str, cell) -> Path:
    return SHIPPED / f"{name}-{cell.dataset}-{cell.key}.safetensors"


def pretrained_checkpoint(name: str, source: str, *, show_progress: bool = True) -> Path | None:
    """The checkpoint of task `pretrain` (suite `source`) for backbone `name`, or None when `source` is
    not a pretraining suite (a file path, then): the one shipped in transferbench/weights when its cell
    key matches (same profile, data and protocol version), else the record's, pretraining first when
    the record is missing (a record is reused, as for any cell)."""

    if source not in PRETRAINED:
        return None
    task, ref, cell, out = _pretrain_cell(name, source)
    shipped = _shipped_path(name, cell)
    if shipped.is_file():  # made by exactly this cell (same profile, data version and code protocol)
        why = damage(shipped)  # its size and checksum ship beside it (NAME.digest)
        if why:
            raise UserError(
                f"shipped checkpoint {shipped} is damaged ({why}): reinstall transferbench "
                "(pip install --force-reinstall transferbench, or `git checkout` it in a clone)"
            )
        return shipped
    for _attempt in range(2):
        store = RecordStore(out)  # read afresh: a record set aside below is not remembered
        if show_progress and not store.finished(cell):
            print(
                f"{name}@{source}: no shipped checkpoint for this pretraining profile; pretraining it now "
                f"(the record under {out} is reused afterwards)",
                file=sys.stderr,
            )
        # a cache, not a user's records: a pretraining record of other code is computed again, never kept
        run_task(task, [ref], out, RunOptions(show_progress=show_progress, stale="recompute"))
        rec = store.get(cell)
        if rec is None or rec["status"] != "ok":
            why = rec["reason"] if rec else "no record"
            raise UserError(f"pretraining {name} on the {source} suite did not finish ({why}); see {store.path(cell)}")
        path = expand(rec["info"]["checkpoint"])
        if path.is_file() and file_sha256(path) == rec["info"]["checkpoint_sha256"]:
            return path
        # the record's checkpoint is gone or damaged: both are set aside and the pretraining runs again
        state = "damaged" if path.is_file() else "missing"
        quarantine(path, "its sha256 is not the one its pretraining record holds", "pretrained checkpoint")
        quarantine(store.path(cell), f"its checkpoint {path.name} is {state}", "pretraining record")
    raise UserError(
        f"checkpoint {path} of {name}@{source} did not match its record after pretraining again; "
        f"is something else writing to {cache('checkpoints')}?"
    )
