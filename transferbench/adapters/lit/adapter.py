"""The LiT adapter: dataset entries, the checks before a run, and one cell = the locked image tower's cached pair
features, the text tower trained on them (or reused), then zero-shot classification or retrieval."""

from __future__ import annotations

import time
from typing import Literal

import torch

from ...data.folder import DataMissingError
from ...data.sources import DatasetEntry, missing_data, open_split, require_tfds_name
from ...engine.features import FrozenFeatures
from ...errors import UserError
from ...fingerprint import TEXT
from ...settings.lit import LitSettings
from ...spec import SpecError
from ..base import Adapter, plan_select_then_final
from .pairs import pair_views, pairs_reader
from .retrieval import evaluate_retrieval
from .towers import text_config
from .training import text_tower
from .zeroshot import evaluate_zero_shot, templates_for


class LitDataset(DatasetEntry):
    """A zero-shot dataset (tfds or embedded: its `test` split, class names and templates) or, with
    `retrieval`, the held-out tail of the task's image-text pairs, scored one way (i2t or t2i). Nothing is
    trained on a zero-shot dataset: it has no `train` split."""

    source: Literal["tfds", "embedded", "pairs"] = "tfds"  # type: ignore[assignment]
    train: None = None  # type: ignore[assignment]
    test: str | None = None  # type: ignore[assignment]
    class_names: Literal["imagenet", "tfds", "info"] | list[str] = "tfds"
    templates: Literal["imagenet"] | list[str] = "imagenet"
    retrieval: Literal["i2t", "t2i"] | None = None


def open_zero_shot(ds: dict, data_dir=None):
    return open_split(ds, ds["test"], data_dir)


class LitAdapter(Adapter):
    name = "lit"
    libraries = TEXT
    dataset_schema = LitDataset
    settings = LitSettings

    def training_images(self, cell) -> int:
        """The image tower is locked: only the text tower trains, on cached features."""
        return 0

    def validate(self, spec, source="<spec>"):
        super().validate(spec, source)
        for i, d in enumerate(spec.datasets):
            ds = LitDataset.model_validate(d.model_dump())
            if ds.retrieval is None and (ds.source == "pairs" or not ds.test):
                raise SpecError(
                    f"{source}: datasets.{i}: a zero-shot dataset needs source tfds or embedded and a "
                    f"test split; the pairs' held-out tail takes `retrieval: i2t|t2i` (dataset {ds.name!r})"
                )
            if ds.source == "embedded" and ds.retrieval is None and ds.class_names == "tfds":
                raise SpecError(
                    f"{source}: datasets.{i}.class_names: an embedded set has no tfds label names; list "
                    f"them (dataset {ds.name!r})"
                )
            if ds.retrieval is None:
                require_tfds_name(source, i, ds.model_dump())
            if not isinstance(ds.templates, str):
                try:
                    templates_for(ds.templates)
                except ValueError as e:
                    raise SpecError(f"{source}: datasets.{i}.templates: {e} (dataset {ds.name!r})") from None

    def check_data(self, task, ctx) -> None:
        """Before any cell: the pairs open (CSV header, shards present) and every zero-shot split opens."""
        if ctx.micro_batch:
            raise UserError(
                "--micro-batch splits a batch, which changes a contrastive loss (every other pair in the "
                "batch is a negative); LiT trains on whole batches: lower --set batch=N instead"
            )
        for hp in task.grid():
            pairs_reader(LitSettings.of(hp))
        missing, zero_shot = [], 0
        for spec in task.datasets:
            ds = LitDataset.model_validate(spec.model_dump()).model_dump()
            if ds["retrieval"]:
                continue
            zero_shot += 1
            try:
                open_zero_shot(ds, ctx.data_dir)
            except DataMissingError:
                missing.append(ds["name"])
        if missing:
            raise missing_data("zero-shot", missing, zero_shot, ctx.data_dir)

    def plan(self, task, backbone, results):
        return plan_select_then_final(task, backbone, results)  # cells: (dataset, seed); nothing selected

    def run(self, cell, ctx):
        s = self.settings_of(cell)
        ds = self.entry(cell.dataset, cell.dataset_config)
        frozen = FrozenFeatures.of(cell, s, ctx)  # the locked image tower (the text tower picks its own precision)
        views, captions, pairs_hit, pairs_key = pair_views(frozen, s)
        if not s.heldout < len(captions):
            raise UserError(
                f"heldout={s.heldout} leaves no training pairs of {len(captions)}: set --set heldout=N with "
                f"0 < N < {len(captions)}"
            )
        train = slice(None, -s.heldout)
        model, train_info = text_tower([v[train] for v in views], captions[train], s, cell.seed, pairs_key, ctx)
        model = model.to(ctx.device).eval()
        started, samples = time.time(), {}  # per-example zero-shot hits (--log-samples); retrieval keeps none
        with torch.inference_mode():
            if ds["retrieval"]:
                held = slice(-s.heldout, None)
                test, extra = evaluate_retrieval(
                    model, views[0][held], captions[held], ds["retrieval"], s.context_length, ctx.device
                )
            else:
                data = open_zero_shot(ds, ctx.data_dir)
                identity = {k: ds[k] for k in ("name", "source", "tfds", "set")} | {"version": cell.data_version}
                test, samples, extra = evaluate_zero_shot(
                    model, frozen, data, ds, identity, s, ctx.device, ctx.progress
                )
        return {
            "test": test,
            "samples": samples,
            "info": {
                **train_info,
                **extra,
                "feature_cache_hit_pairs": pairs_hit,
                "bf16": frozen.bf16,
                "bf16_choice": frozen.choice.info,
                "pairs_train": int(len(captions) - s.heldout),
                "pairs_heldout": s.heldout,
                "image_head": s.image_head,
                "loss": s.loss,
                "text_config": text_config(s),
                "pair_views": len(views),
                "eval_seconds": round(time.time() - started, 2),
            },
        }
