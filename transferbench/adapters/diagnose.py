"""Diagnostics (docs/diagnostics.md; DPN §8, the over-smoothing slides, DTN App. B.1): what happens inside
a backbone, measured per layer and head, recorded like every task's cells so that they resume, cache and compare.

Cells, per dataset and seed:
    stage 'forward':    the backbone (with its weights; random-init seeded by the cell's seed) over `images`
                        images of split `image_split` (the over-smoothing slides: 10,000 images subsampled from
                        ImageNet's training set, seeded by the cell's seed) at `resolution`: per layer the patch
                        tokens' mean pairwise cosine similarity, the std of the patch queries' attention rows over
                        the patch keys, the mean token norm; per layer and head the mean attention distance in
                        patches and pixels (backbones.measures.Probe); what the weights alone show: DPN's stem
                        scale maps, DTN's mixing weights, kernel widths and kernels P^h; and, for a checkpoint
                        whose pretraining logged them (`upstream`), the per-layer gradient norms of its last
                        1,000 upstream steps (DPN Fig. 2) and DTN's λ over training (DTN Fig. 4).
                        Metric `patch_cosine` at the last layer (lower: less over-smoothed).
    stage 'gradients':  gradient norms while fine-tuning (not DPN Fig. 2's upstream ones):
                        `steps` steps of the VTAB fine-tuning recipe (adapters.classify.finetune, the one loop) on the
                        `train` split; after each step's backward the L2 norm of every block's parameter gradients
                        and of the patch embedding's (before clipping). Per layer: mean over the last `grad_last`
                        steps; the patch embedding's over every step. Metric `embed_grad_norm` (mean over the last
                        `grad_last` steps).
The per-layer arrays live in the record's info["diagnostics"] as {"mean", "sd", "n"}; reporting/diagnostics.py makes
the tables (one per measure) and the figures.
"""

from __future__ import annotations

import logging
import time

import numpy as np
import torch

from ..backbones import create_backbone
from ..backbones.api import patch_grid, patch_size, require
from ..backbones.checkpoint import read_training_log
from ..backbones.measures import Probe, layer_grad_norms, summarise, weight_measures
from ..cell import DIAGNOSTICS_REPORT, make_cell
from ..data.transforms import eval_transform
from ..engine.batches import eval_batches
from ..engine.precision import autocast, for_forward
from ..errors import UserError
from ..settings.choices import IMAGE_SAMPLES
from ..settings.finetune import DiagnoseSettings
from .classify import ClassificationAdapter, finetune, open_split

log = logging.getLogger(__name__)
NEEDS = {
    "forward_intermediates": "the per-layer token measures",
    "patch grid": "attention distance on the grid",
    "blocks": "per-block gradient norms",
}
ATTENTION_DISTANCES = ("attn_distance", "attn_distance_patches")
STAGES = {"forward": ("patch_cosine", "min"), "gradients": ("embed_grad_norm", "min")}


def backbone_for(cell, ctx):
    """The backbone under study at the cell's resolution: its checkpoint, or random-init seeded by the cell's seed."""
    torch.manual_seed(cell.seed)
    model = create_backbone(cell.backbone_name, img_size=int(cell.hparams["resolution"]), checkpoint=cell.checkpoint)
    return model.to(ctx.device).eval()


def image_indices(size: int, n: int, how: str, seed: int) -> np.ndarray:
    """Which `n` of a split's `size` images the forward measures see: 'random' (the over-smoothing slides'
    subsample: n distinct indices drawn by np.random.default_rng(seed), in ascending order) or 'first'."""
    n = min(int(n), size)
    if how == "first":
        return np.arange(n)
    if how != "random":
        raise ValueError(f"image_sample {how!r}: choose one of {', '.join(IMAGE_SAMPLES)}")
    return np.sort(np.random.default_rng(seed).choice(size, n, replace=False))


def forward_diagnostics(model, data, hp: DiagnoseSettings, ctx, seed: int = 0) -> dict:
    """Probe `model` over `images` images of `data` (`image_indices`); returns the per-layer summaries."""

    idx = image_indices(len(data), hp.images, hp.image_sample, seed)
    n = len(idx)
    subset = torch.utils.data.Subset(data, idx.tolist())
    batch = hp.eval_batch
    probe = Probe(model, hp.attn_std_tokens)
    use_bf16 = for_forward(hp.bf16, ctx.device, model, batch, hp.resolution).bf16
    batches = eval_batches(subset, eval_transform(hp.resolution, pixels=hp.pixels), batch=batch, workers=ctx.workers)
    for x, _ in ctx.progress(batches, total=-(-n // batch), desc="diagnostics forward"):
        with autocast(ctx.device, use_bf16):
            probe(x.to(ctx.device))
    summary = probe.summary()
    if "attn_distance" in summary:
        patch = float(probe.patch)
        summary["attn_distance_patches"] = {
            "mean": (np.asarray(summary["attn_distance"]["mean"]) / patch).tolist(),
            "sd": (np.asarray(summary["attn_distance"]["sd"]) / patch).tolist(),
            "n": summary["attn_distance"]["n"],
        }
    if probe.skipped:
        summary["skipped"] = probe.skipped
        why = sorted(set(probe.skipped.values()))
        log.warning(
            "diagnose %s: skipping %s (%s)", getattr(model, "name", ""), ", ".join(probe.skipped), "; ".join(why)
        )
    return summary


def gradient_diagnostics(cell, hp: DiagnoseSettings, data, classes: int, augment: str, ctx) -> dict:
    """Per-step gradient norms of every block and of the patch embedding over the VTAB recipe's steps."""

    layers, embed = [], []

    def record(model, step):
        per_layer, e = layer_grad_norms(model)
        layers.append(per_layer)
        embed.append(e)

    _, info = finetune(
        cell, hp, data, classes, augment, ctx, on_step=record, desc=f"{cell.dataset} gradients seed={cell.seed}"
    )
    k = max(1, min(hp.grad_last, len(layers)))
    return {
        "grad_norm": summarise(layers[-k:]),  # (k steps, depth)
        "embed_grad_norm_steps": embed,
        "train": {k2: info[k2] for k2 in ("final_loss", "bf16", "train_seconds", "head") if k2 in info},
    }


class DiagnoseAdapter(ClassificationAdapter):
    name = "diagnose"
    settings = DiagnoseSettings

    data_name = "diagnostics"

    def training_images(self, cell) -> int:
        """Measures of a forward pass: no training."""
        return 0

    def plan(self, task, backbone, results):
        for hp in task.grid():  # what every diagnostic reads; attention maps are skipped where unreadable
            grid = patch_grid(require(backbone.name, task.spec.task, NEEDS, img_size=int(hp["resolution"])))
            if grid[0] * grid[1] < 2:
                raise UserError(
                    f"resolution={hp['resolution']} gives backbone {backbone.name!r} a {grid[0]}x{grid[1]} patch "
                    "grid: the token measures compare at least 2 patches (set --set resolution=N)"
                )
        cells = []
        for ds in task.datasets:
            for hp in task.grid():
                for seed in task.seeds:
                    for stage, (metric, mode) in STAGES.items():
                        cells.append(
                            make_cell(
                                task, ds, backbone, hp, seed, stage, metric=metric, mode=mode, report=DIAGNOSTICS_REPORT
                            )
                        )
        return cells

    def run(self, cell, ctx):

        hp, ds = self.settings_of(cell), self.entry(cell.dataset, cell.dataset_config)
        started = time.time()
        if cell.stage == "forward":
            model = backbone_for(cell, ctx)
            data = open_split(ds, hp.image_split, ctx.data_dir)
            summary = forward_diagnostics(model, data, hp, ctx, seed=cell.seed)
            diag = {
                **summary,
                **weight_measures(model),
                "depth": len(model.blocks),
                "heads": getattr(model.blocks[0].attn, "num_heads", None),
                "patch_size": patch_size(model),
                "grid": list(patch_grid(model)),
                "dtn_layers": int(getattr(model, "dtn_layers", 0)),
                "upstream": read_training_log(cell.checkpoint),
            }
            metrics = {
                k: summary[k]["mean"][-1] for k in ("patch_cosine", "attn_std", "token_norm") if k in summary
            } | {k: float(np.mean(summary[k]["mean"])) for k in ATTENTION_DISTANCES if k in summary}
        else:
            data = open_split(ds, "train", ctx.data_dir)
            diag = gradient_diagnostics(cell, hp, data, ds["classes"], ds["augment"], ctx)
            k = diag["grad_norm"]["n"]
            metrics = {
                "embed_grad_norm": float(np.mean(diag["embed_grad_norm_steps"][-k:])),
                "grad_norm": float(np.mean(diag["grad_norm"]["mean"])),
            }
        return {"test": metrics, "info": {"diagnostics": diag, "seconds_total": round(time.time() - started, 2)}}
