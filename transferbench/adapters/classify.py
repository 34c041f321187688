"""The fine-tuning recipe that several protocols share (VTAB-1k, the robustness classifier, high-res fine-tuning,
the gradient diagnostics): VTAB-style dataset entries and their splits (tfds, export-vtab folders, embedded
sets), the data check before a run, and `finetune`, the recipe itself (DPN App. E: a new zero-initialised
head, SGD with momentum, warm-up then cosine, clipping, per-task augmentation, position embeddings resized to
the resolution's grid). Each protocol's adapter is its own module; this one holds what they have in common.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import numpy as np
import torch

from ..backbones import create_backbone
from ..backbones.checkpoint import head_classes
from ..data import sources
from ..data import vtab as vtab_data
from ..data.folder import FolderDataset
from ..data.sources import DatasetEntry
from ..data.transforms import AUGMENTATIONS, train_transform
from ..engine.losses import LOSSES
from ..engine.train import fit_protocol, optimizer_options
from ..settings.finetune import FinetuneSettings
from ..spec import SpecError
from .base import Adapter


class VtabDataset(DatasetEntry):
    val: str
    classes: int
    label: str = "label"  # a rule of transferbench.data.vtab_data.LABEL_RULES
    augment: Literal[AUGMENTATIONS] = "crop_flip"  # type: ignore[valid-type]


class ClassificationDataset(VtabDataset):
    """A VTAB-style entry for protocols without selection (high-res fine-tune, diagnostics): `val` unused;
    `minival`, a held-out part of the training data evaluated as well (high-res ImageNet: train[99%:])."""

    val: str | None = None  # type: ignore[assignment]
    minival: str | None = None


def validate_entries(spec, source: str) -> None:
    """What the schema cannot say about VTAB-style entries (VTAB, high-res, diagnostics): a tfds dataset names
    its tfds builder, and the label rule exists."""
    for i, ds in enumerate(spec.datasets):
        d = ds.model_dump()
        sources.require_tfds_name(source, i, {"source": "tfds", **d})
        if d.get("label", "label") not in vtab_data.LABEL_RULES:
            raise SpecError(
                f"{source}: datasets.{i}.label: unknown rule {d['label']!r}; rules: "
                f"{', '.join(vtab_data.LABEL_RULES)} (dataset {ds.name!r})"
            )


def require_splits(task, ctx, what: str, roles, *, entry, unit: str = "datasets") -> None:
    """Before any cell of a protocol on VTAB-style entries (VTAB, high-res, diagnostics): every dataset's `roles`
    open, or one line names the missing datasets, where they were looked for and how to prepare them. `entry(name,
    fields)` fills an entry's defaults (an adapter's `entry`)."""
    entries = [entry(ds.name, ds.model_dump()) for ds in task.datasets]
    missing = sources.missing(entries, lambda e: list(roles), opener=lambda e, role: open_split(e, role, ctx.data_dir))
    if missing:
        raise sources.missing_data(what, missing, len(task.datasets), ctx.data_dir, unit=unit, export=True)


class ClassificationAdapter(Adapter):
    """An adapter on VTAB-style entries (VTAB, high-res, diagnostics): the entries are validated (a tfds dataset
    names its builder, the label rule exists), and before a run the protocol's own hyper-parameter checks
    (`check_hparams`) and then every dataset's `roles` open, or one line says what is missing and where."""

    dataset_schema = ClassificationDataset
    data_name = ""  # what the missing-data message calls the data ('VTAB', 'high-res', ...)
    roles: tuple = ("train", "test")
    unit = "datasets"

    def validate(self, spec, source="<spec>"):
        super().validate(spec, source)
        validate_entries(spec, source)

    def check_hparams(self, task) -> None:
        """What the protocol cannot run with, as one UserError (nothing by default)."""

    def check_data(self, task, ctx) -> None:
        self.check_hparams(task)
        require_splits(
            task,
            ctx,
            self.data_name,
            self.roles,
            unit=self.unit,
            entry=self.entry,
        )


class Joined(torch.utils.data.Dataset):
    """train800 + val200 of an image folder, keeping the folder's fast decoded-array access."""

    def __init__(self, parts):
        self.parts = parts
        self.labels = np.concatenate([p.labels for p in parts])
        self.num_classes = parts[0].num_classes

    def __len__(self) -> int:
        return len(self.labels)

    def array(self) -> np.ndarray:
        return np.concatenate([p.array() for p in self.parts])


def is_export(data_dir, name: str) -> bool:
    """A folder written by `transferbench data export-vtab` (as opposed to a tfds data dir)."""
    return data_dir is not None and (Path(data_dir).expanduser() / name / "train800.txt").is_file()


def open_split(ds: dict, role: str, data_dir=None):
    """The dataset of role train | val | trainval | test for a resolved dataset config."""

    roles = ("train", "val") if role == "trainval" else (role,)
    if ds["source"] == "tfds" and is_export(data_dir, ds["name"]):  # export-vtab wrote train800 / val200 / test
        folder = {"train": "train800", "val": "val200", "test": "test"}
        parts = [FolderDataset(Path(data_dir).expanduser(), ds["name"], folder[r]) for r in roles]
    elif ds["source"] == "embedded":
        parts = [sources.open_split(ds, ds[r]) for r in roles]
    else:
        split = "+".join(ds[r] for r in roles)
        return sources.open_split(ds, split, data_dir, vtab_data.LABEL_RULES[ds["label"]], label_rule=ds["label"])
    return parts[0] if len(parts) == 1 else Joined(parts)


def finetune(
    cell,
    s: FinetuneSettings,
    train,
    classes: int,
    augment: str,
    ctx,
    desc: str = "",
    *,
    keep_head: bool = False,
    on_step=None,
    posemb: str | None = None,
):
    """The VTAB fine-tuning recipe on `train` for `cell` (its backbone, checkpoint and seed) with settings `s`:
    a new zero-initialised head of `classes` on the checkpoint's representation layer (with `keep_head`, the
    checkpoint's own head where it has `classes` outputs), SGD with momentum, warm-up then cosine, clipping,
    `augment`, loss `s.loss` (sigmoid: big_vision's sigmoid_xent; softmax). The
    position embeddings are resampled to the resolution's grid (`posemb`: the method, default the weights' own
    code's, backbones.checkpoint.load_checkpoint) and DTN's grid factors rebuilt for it. `on_step(model, step)` sees
    each step's complete gradients (engine.train.fit). Returns (model, info); other adapters that need a fine-tuned
    classifier (robustness, high-res, diagnostics) call it too."""

    torch.manual_seed(cell.seed)
    head_kept = keep_head and cell.checkpoint is not None and head_classes(cell.checkpoint) == classes
    model = create_backbone(
        cell.backbone_name,
        img_size=s.resolution,
        checkpoint=cell.checkpoint,
        num_classes=classes if head_kept else 0,
        **({"posemb": posemb} if posemb else {}),
    )
    if not head_kept:
        model.reset_classifier(classes)  # a new zero-initialised head, whatever the checkpoint had
        head = model.get_classifier() if hasattr(model, "get_classifier") else None
        if isinstance(head, torch.nn.Linear):  # timm's reset_classifier initialises it at random
            torch.nn.init.zeros_(head.weight)
            torch.nn.init.zeros_(head.bias)
    model.to(ctx.device)
    opt = torch.optim.SGD(
        model.parameters(),
        lr=s.lr,
        momentum=s.momentum,
        weight_decay=s.weight_decay,
        **optimizer_options(ctx.device),
    )
    transform = train_transform(s.resolution, augment, pixels=s.pixels)
    options = {"loss_fn": LOSSES[s.loss], "desc": desc or f"{cell.dataset} lr={s.lr} seed={cell.seed}"}
    options["on_step"] = None if on_step is None else (lambda i: on_step(model, i))
    out, data_info, train_seconds = fit_protocol(model, train, transform, opt, s, cell.seed, ctx, **options)
    return model, {
        **out,
        **data_info,
        "train_examples": len(train),
        "head": "checkpoint" if head_kept else "new",
        "loss": s.loss,
        "rep_size": int(getattr(model, "config", {}).get("rep_size", 0)),
        "posemb_resample": getattr(model, "posemb_resample", None),
        "train_seconds": round(train_seconds, 2),
        "images_per_second": round(s.steps * s.batch / max(train_seconds, 1e-9), 1),
    }
