"""The corruption adapter: a classifier cell, then one cell per corruption at severities 1-5."""

from __future__ import annotations

import time

import numpy as np

from ...cell import CORRUPTION_REPORT, make_cell
from ...data.corruptions import INSTALL, LAYOUT, generator_identity
from ...data.folder import DataMissingError
from ...data.imagenet_c import CORRUPTIONS
from ...data.sources import require_tfds_name
from ...engine.precision import for_forward
from ...errors import UserError
from ...fingerprint import CORRUPT
from ...settings.finetune import CorruptionSettings
from ...spec import SpecError
from ..base import Adapter
from .classifier import classifier
from .dataset import CorruptionDataset, corruption_list, entry
from .images import generated, open_clean, open_released, released_path, top1_error


class CorruptionAdapter(Adapter):
    name = "corruption"
    libraries = CORRUPT
    dataset_schema = CorruptionDataset
    settings = CorruptionSettings

    def validate(self, spec, source="<spec>"):
        super().validate(spec, source)
        for i, d in enumerate(spec.datasets):
            ds = CorruptionDataset.model_validate(d.model_dump())
            require_tfds_name(source, i, ds.model_dump())
            if ds.corrupted in ("folder", "npy") and not ds.path:
                raise SpecError(
                    f"{source}: datasets.{i}.path: released {ds.corrupted} data needs its folder under "
                    f"--data-dir (dataset {ds.name!r})"
                )
            if not 0 < ds.crop_pct <= 1:
                raise SpecError(
                    f"{source}: datasets.{i}.crop_pct: {ds.crop_pct} is not in (0, 1] (dataset {ds.name!r})"
                )
        try:
            corruption_list(spec.hparams["corruptions"])
        except UserError as e:
            raise SpecError(f"{source}: hparams.corruptions: {e}") from None

    def training_images(self, cell) -> int:
        """Only the classifier stage fine-tunes; the corruption cells evaluate it."""
        return super().training_images(cell) if cell.stage == "classifier" else 0

    def extras(self, task) -> set[str]:
        """Generating corruptions needs imagecorruptions-imaug (the `corruptions` extra)."""
        kinds = {CorruptionDataset.model_validate(d.model_dump()).corrupted for d in task.datasets}
        return {"corruptions"} if "generate" in kinds else set()

    def check_data(self, task, ctx) -> None:
        """Before any cell: every dataset's clean splits open, released corrupted data is present (its first
        and last corruption at severities 1 and 5), and generation has its package."""
        from ...data.tfds_source import data_dir

        for hp in task.grid():
            corruption_list(hp["corruptions"])
        problems = []
        for spec in task.datasets:
            ds = CorruptionDataset.model_validate(spec.model_dump()).model_dump()
            try:
                open_clean(ds, ds["test"], ctx.data_dir)
                if ds["train"]:
                    open_clean(ds, ds["train"], ctx.data_dir)
            except DataMissingError as e:
                problems.append(f"{ds['name']} clean: {e}")
                continue
            if ds["corrupted"] == "generate":
                generator_identity()
                continue
            try:
                for c, s in ((CORRUPTIONS[0], 1), (CORRUPTIONS[-1], 5)):
                    open_released(ds, c, s, ctx.data_dir)
            except DataMissingError as e:
                how = {
                    "folder": f"download ImageNet-C (https://zenodo.org/record/2235448) and untar it so that "
                    f"{released_path(ds, ctx.data_dir)} follows {LAYOUT}",
                    "npy": f"download CIFAR-10-C (https://zenodo.org/record/2535967) into "
                    f"{released_path(ds, ctx.data_dir)}",
                    "tfds": f"prepare {ds['tfds_corrupted']} with tfds under {data_dir(ctx.data_dir)}",
                }[ds["corrupted"]]
                problems.append(
                    f"{ds['name']}: {str(e).split(';')[0]}; {how} (or score corruptions generated here: "
                    f"a dataset entry with `corrupted: generate`, e.g. imagenet2012_generated)"
                )
        if problems:
            raise UserError(
                f"robustness data missing: {' | '.join(problems)}; or try `--suite embedded`, which "
                f"needs no download (generating corruptions needs {INSTALL})"
            )

    def plan(self, task, backbone, results):
        cells = []
        for ds in task.datasets:
            for hp in task.grid():
                names = corruption_list(hp["corruptions"])
                base = {k: v for k, v in hp.items() if k != "corruptions"}
                for seed in task.seeds:
                    clf = make_cell(task, ds, backbone, base, seed, "classifier", report=CORRUPTION_REPORT)
                    cells.append(clf)
                    rec = results.store.get(clf)
                    if rec is not None and rec["status"] == "ok":
                        cells += [
                            make_cell(
                                task,
                                ds,
                                backbone,
                                {**base, "corruption": c},
                                seed,
                                "corruption",
                                report=CORRUPTION_REPORT,
                            )
                            for c in names
                        ]
        return cells

    def run(self, cell, ctx):
        hp, ds = self.settings_of(cell), entry(cell)
        started = time.time()
        model, info = classifier(cell, ctx)
        res = hp.resolution
        choice = for_forward(hp.bf16, ctx.device, model, hp.eval_batch, res)
        use_bf16 = choice.bf16
        if "bf16" in info:  # what the fine-tuning ran in; evaluation decides for itself
            info = {**{k: v for k, v in info.items() if k not in ("bf16", "bf16_choice")}, "train_bf16": info["bf16"]}
        info = {**info, "bf16": use_bf16, "bf16_choice": choice.info}
        if cell.stage == "classifier":
            if ds["corrupted"] == "generate":
                data, hit = generated(ds, cell.data_version, hp, "clean", 0, ctx)
                err = top1_error(model, data, hp, ctx, use_bf16)
            else:
                data, hit = open_clean(ds, ds["test"], ctx.data_dir), None
                err = top1_error(model, data, hp, ctx, use_bf16, resize_small=round(res / ds["crop_pct"]))
            return {
                "test": {"error": err, "accuracy": 100.0 - err},
                "info": {
                    **info,
                    "eval_examples": len(data),
                    "image_cache_hit": hit,
                    "seconds_total": round(time.time() - started, 2),
                },
            }
        corruption = hp.corruption
        errors, hits, n = {}, [], 0
        gen_seconds = 0.0
        for s in (1, 2, 3, 4, 5):
            t0 = time.time()
            if ds["corrupted"] == "generate":
                data, hit = generated(ds, cell.data_version, hp, corruption, s, ctx)
                hits.append(hit)
            else:
                data = open_released(ds, corruption, s, ctx.data_dir)
            gen_seconds += time.time() - t0
            errors[f"error_{s}"] = top1_error(model, data, hp, ctx, use_bf16)
            n = len(data)
        mean = float(np.mean(list(errors.values())))
        return {
            "test": {"error": mean, "accuracy": 100.0 - mean, **errors},
            "info": {
                **{k: v for k, v in info.items() if k.startswith("classifier")},
                "bf16": use_bf16,
                "bf16_choice": choice.info,
                "eval_examples_per_severity": n,
                "image_cache_hits": hits,
                "image_seconds": round(gen_seconds, 2),
                "seconds_total": round(time.time() - started, 2),
            },
        }
