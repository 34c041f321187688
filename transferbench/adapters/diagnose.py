"""Diagnostics (docs/diagnostics.md; DPN §8, the over-smoothing slides, DTN App. B.1): what happens inside
a backbone, measured per layer and head, recorded like every task's cells so that they resume, cache and compare.

Cells, per dataset and seed:
    stage 'forward':    the backbone (with its weights; random-init seeded by the cell's seed) over the first
                        `images` images of the `test` split at `resolution`: per layer the patch tokens' mean
                        pairwise cosine similarity, the std of the attention rows, the mean token norm; per layer
                        and head the mean attention distance in pixels (backbones.measures.Probe); and what the
                        weights alone show: DPN's stem scale maps, DTN's mixing weights and kernel widths.
                        Metric `patch_cosine` at the last layer (lower: less over-smoothed).
    stage 'gradients':  `steps` steps of the VTAB fine-tuning recipe (adapters.classify.finetune, the one loop) on the
                        `train` split; after each step's backward the L2 norm of every block's parameter gradients
                        and of the patch embedding's (before clipping). Per layer: mean over the last `grad_last`
                        steps; the patch embedding's over every step. Metric `embed_grad_norm` (mean over the last
                        `grad_last` steps).
The per-layer arrays live in the record's info["diagnostics"] as {"mean", "sd", "n"}; reporting/diagnostics.py makes
the tables (one per measure) and the figures.
"""
from __future__ import annotations

import time

import numpy as np
import torch

from ..backbones import create_backbone
from ..backbones.measures import Probe, layer_grad_norms, summarise, weight_measures
from ..cell import make_cell
from ..data import pixels
from ..data.transforms import eval_transform
from ..engine.precision import for_forward
from ..engine.train import BF16_SETTINGS, autocast, eval_batches
from ..errors import UserError
from ..reporting.diagnostics import REPORT
from .classify import ClassificationAdapter, classification_entry as entry, finetune, open_split

STAGES = {"forward": ("patch_cosine", "min"), "gradients": ("embed_grad_norm", "min")}


def backbone_for(cell, ctx):
    """The backbone under study at the cell's resolution: its checkpoint, or random-init seeded by the cell's seed."""
    torch.manual_seed(cell.seed)
    model = create_backbone(cell.backbone.partition("@")[0], img_size=int(cell.hparams["resolution"]),
                            checkpoint=cell.checkpoint)
    return model.to(ctx.device).eval()


def forward_diagnostics(model, data, hp: dict, ctx) -> dict:
    """Probe `model` over the first `images` images of `data`; returns the per-layer summaries."""

    n = min(int(hp["images"]), len(data))
    subset = torch.utils.data.Subset(data, range(n))
    batch = int(hp.get("eval_batch", 64))
    probe = Probe(model)
    use_bf16 = for_forward(hp.get("bf16", "auto"), ctx.device, model, batch, int(hp["resolution"])).bf16
    batches = eval_batches(subset, eval_transform(int(hp["resolution"]), pixels=pixels.of(hp)), batch=batch, workers=ctx.workers)
    for x, _ in ctx.progress(batches, total=-(-n // batch), desc="diagnostics forward"):
        with autocast(ctx.device, use_bf16):
            probe(x.to(ctx.device))
    return probe.summary()


def gradient_diagnostics(cell, data, classes: int, augment: str, ctx) -> dict:
    """Per-step gradient norms of every block and of the patch embedding over the VTAB recipe's steps."""

    layers, embed = [], []

    def record(model, step):
        per_layer, e = layer_grad_norms(model)
        layers.append(per_layer)
        embed.append(e)

    _, info = finetune(cell, data, classes, augment, ctx, on_step=record,
                       desc=f"{cell.dataset} gradients seed={cell.seed}")
    k = max(1, min(int(cell.hparams["grad_last"]), len(layers)))
    return {"grad_norm": summarise(layers[-k:]),  # (k steps, depth)
            "embed_grad_norm_steps": embed,
            "train": {k2: info[k2] for k2 in ("final_loss", "bf16", "train_seconds", "head") if k2 in info}}


class DiagnoseAdapter(ClassificationAdapter):
    name = "diagnose"
    hparam_choices = {"optimizer": ("sgd",), "bf16": BF16_SETTINGS}

    data_name = "diagnostics"

    def check_hparams(self, task) -> None:
        for hp in task.grid():
            if int(hp["images"]) < 1 or int(hp["steps"]) < 1 or int(hp["grad_last"]) < 1:
                raise UserError(f"images={hp['images']}, steps={hp['steps']}, grad_last={hp['grad_last']}: each must "
                                "be at least 1 (set them with --set KEY=N)")

    def plan(self, task, backbone, results):
        cells = []
        for ds in task.datasets:
            for hp in task.grid():
                for seed in task.seeds:
                    for stage, (metric, mode) in STAGES.items():
                        cells.append(make_cell(task, ds, backbone, hp, seed, stage, metric=metric, mode=mode,
                                               report=REPORT))
        return cells

    def run(self, cell, ctx):

        hp, ds = cell.hparams, entry(cell.dataset, cell.dataset_config)
        started = time.time()
        if cell.stage == "forward":
            model = backbone_for(cell, ctx)
            data = open_split(ds, "test", ctx.data_dir)
            summary = forward_diagnostics(model, data, hp, ctx)
            diag = {**summary, **weight_measures(model), "depth": len(model.blocks), "heads": model.blocks[0].attn.num_heads,
                    "patch_size": model.patch_size, "grid": list(model.grid_size), "dtn_layers": model.dtn_layers}
            metrics = {"patch_cosine": summary["patch_cosine"]["mean"][-1],
                       "attn_std": summary["attn_std"]["mean"][-1],
                       "token_norm": summary["token_norm"]["mean"][-1],
                       "attn_distance": float(np.mean(summary["attn_distance"]["mean"]))}
        else:
            data = open_split(ds, "train", ctx.data_dir)
            diag = gradient_diagnostics(cell, data, ds["classes"], ds["augment"], ctx)
            k = diag["grad_norm"]["n"]
            metrics = {"embed_grad_norm": float(np.mean(diag["embed_grad_norm_steps"][-k:])),
                       "grad_norm": float(np.mean(diag["grad_norm"]["mean"]))}
        return {"test": metrics, "info": {"diagnostics": diag, "seconds_total": round(time.time() - started, 2)}}
