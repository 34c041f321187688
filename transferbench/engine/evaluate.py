"""Evaluation loops: predictions, accuracy, the per-example hits and a held-out loss, all with one signature
(`Evaluation`: device, precision, batch, workers)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from ..arithmetic import output
from ..data.pixels import DEFAULT_PIXELS
from ..settings.base import EVAL_BATCH
from .batches import array_batches, eval_batches
from .precision import autocast


@torch.inference_mode()
def predict(model, batches: Iterator, device: str, bf16: bool) -> tuple[np.ndarray, np.ndarray]:
    """(predicted class, label) over every batch."""
    model.eval()
    preds, labels = [], []
    for x, y in batches:
        with autocast(device, bf16):
            logits = model(x.to(device))
        output("logits", logits)
        preds.append(logits.argmax(-1).cpu().numpy())
        labels.append(np.asarray(y))
    return np.concatenate(preds), np.concatenate(labels)


@dataclass(frozen=True)
class Evaluation:
    """How an evaluation loop runs after (model, data, transform): the one signature of `hits`, `accuracy` and
    engine.features' `extract` and `extract_pairs`. `pixels`: the normalisation of a set read as an array
    (transform=None)."""

    device: str
    bf16: bool
    batch: int = EVAL_BATCH
    workers: int = 0
    progress: object = None
    desc: str = "evaluate"
    pixels: str = DEFAULT_PIXELS

    @classmethod
    def of(cls, ctx, bf16: bool, **options) -> Evaluation:
        """A cell context's device and workers, at `bf16` (what the cell's training ran in)."""
        return cls(ctx.device, bf16, workers=ctx.workers, **options)


def accuracy(model, dataset, transform, how: Evaluation) -> float:
    """Top-1 accuracy in percent. `transform=None`: the dataset's `array()` holds images at the model's input
    size, which are only normalised (`how.pixels`; batched, no per-image transform)."""
    return 100.0 * float(hits(model, dataset, transform, how).mean())


def heldout_loss(model, dataset, transform, how: Evaluation, loss_fn) -> float:
    """The training loss (`loss_fn`, on one-hot targets) of `model` over every example of `dataset`, in eval mode:
    a fixed held-out point of the training curve, less noisy than one training batch's loss."""
    model.eval()
    total, n = torch.zeros((), dtype=torch.float64, device=how.device), 0
    with torch.no_grad():
        for x, y in eval_batches(dataset, transform, batch=how.batch, workers=how.workers):
            with autocast(how.device, how.bf16):
                logits = model(x.to(how.device))
            y = torch.as_tensor(y, device=how.device)
            total += loss_fn(logits.float(), y).double() * len(y)
            n += len(y)
    return float(total / max(n, 1))


def hits(model, dataset, transform, how: Evaluation) -> np.ndarray:
    """Per example of `dataset`, in its order: whether the top-1 prediction is right (what `accuracy` averages,
    and what --log-samples keeps for per-example paired tests)."""
    if transform is None:
        batches = array_batches(dataset.array(), dataset.labels, batch=how.batch, pixels=how.pixels)
    else:
        batches = eval_batches(dataset, transform, batch=how.batch, workers=how.workers)
    pred, label = predict(model, batches, how.device, how.bf16)
    return pred == label
