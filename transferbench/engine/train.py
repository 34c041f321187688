"""The training loop the adapters share: seeded batch streams, warm-up + cosine (or poly) schedule, gradient
accumulation, bf16 autocast where it measures faster (engine.precision), clipping, and batched evaluation.

Determinism: every training example is transformed under its own seed, drawn from (cell seed, epoch,
position), so a cell's metrics are the same for any number of DataLoader workers and any micro-batch
size (up to float summation order) on the same machine.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import chain

import numpy as np
import torch
import torch.nn.functional as F

from ..arithmetic import note_micro_batch, output
from ..data.pixels import DEFAULT_PIXELS, normalise_uint8
from .compute import check_finite
from .precision import BF16_SETTINGS, autocast, resolve, shapes, training_step  # noqa: F401 (BF16_SETTINGS: the adapters' choices)

log = logging.getLogger("transferbench")


def cosine_lr(step: int, *, base: float, warmup: int, total: int) -> float:
    """Linear warm-up over `warmup` steps, then cosine from `base` to 0 at `total`."""
    if step < warmup:
        return base * (step + 1) / warmup
    return 0.5 * base * (1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))


def poly_lr(step: int, *, base: float, warmup: int, total: int, power: float = 0.9) -> float:
    """Linear warm-up over `warmup` steps, then polynomial decay base * (1 - t/T)^power to 0 at `total`
    (mmseg's PolyLR with eta_min 0, the Segmenter/ADE20K schedule)."""
    if step < warmup:
        return base * (step + 1) / warmup
    return base * (1 - (step - warmup) / max(1, total - warmup)) ** power


SCHEDULES = ("cosine", "poly")


def optimizer_options(device) -> dict:
    """Keyword arguments for torch's SGD and AdamW on `device`: on CUDA the fused update (one kernel for every
    parameter: the step's optimizer time falls from a launch per tensor to one); elsewhere torch's default (the
    per-tensor loop on the CPU, where the fused kernel has shown no gain). Same update up to float rounding
    (tested)."""
    return {"fused": True} if str(device).startswith("cuda") else {}


def schedule_lr(name: str, step: int, *, base: float, warmup: int, total: int, power: float = 0.9) -> float:
    if name == "cosine":
        return cosine_lr(step, base=base, warmup=warmup, total=total)
    if name == "poly":
        return poly_lr(step, base=base, warmup=warmup, total=total, power=power)
    raise ValueError(f"unknown schedule {name!r}; choose one of {SCHEDULES}")


def examples(dataset) -> Callable[[int], tuple]:
    """i -> (image, label). Image folders are decoded once into a uint8 NCHW tensor (fast random access
    for small sets); other datasets (tfds) are read lazily as PIL images."""
    if hasattr(dataset, "array"):
        arr = torch.from_numpy(dataset.array()).permute(0, 3, 1, 2)
        labels = np.asarray(dataset.labels)
        return lambda i: (arr[i], int(labels[i]))
    return lambda i: dataset[i]


class _Seeded(torch.utils.data.Dataset):
    """Maps (index, seed) to (transform(image), label) with the transform's randomness seeded per
    example. Workers and the main process produce the same tensors. With `joint` the transform takes
    and returns (image, target) together: a segmentation mask goes through the same random resize,
    crop and flip as its image."""

    def __init__(self, dataset, transform, joint: bool = False):
        self.dataset, self.transform, self.joint, self.fetch = dataset, transform, joint, None

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, item):
        if self.fetch is None:  # built lazily: in a worker, after the fork
            self.fetch = examples(self.dataset)
        i, seed = item
        image, label = self.fetch(i)
        if seed is not None:
            # the CPU generator alone: torch.manual_seed also seeds CUDA, which on a CUDA build without an
            # initialised GPU formats a stack trace per call (about 1 ms an example)
            torch.random.default_generator.manual_seed(seed)
        if self.joint:
            return self.transform(image, label)
        return self.transform(image), label


class _EpochSampler(torch.utils.data.Sampler):
    """Successive seeded permutations of the dataset (shuffle + repeat), each index with its example seed."""

    def __init__(self, n: int, seed: int, total: int):
        self.n, self.seed, self.total = n, seed, total

    def __len__(self) -> int:
        return self.total

    def __iter__(self):
        epoch, given = 0, 0
        while given < self.total:
            rng = np.random.default_rng([self.seed, epoch])
            order, seeds = rng.permutation(self.n), rng.integers(0, 2**62, self.n)
            for i, s in zip(order.tolist(), seeds.tolist()):
                if given == self.total:
                    return
                yield i, s
                given += 1
            epoch += 1


def batched(dataset, transform) -> bool:
    """Whether a dataset and transform take the batched evaluation path: an in-memory set (decoded once into an
    array of equal-size images) and a transform that can run on a whole batch (data.transforms.ImageTransform)."""
    return hasattr(dataset, "array") and hasattr(transform, "batch") and getattr(transform, "batchable", True)


class Batches:
    """An iterator of training batches that says which data path made them (`info()`: engine.resident.Plan)."""

    def __init__(self, it: Iterator, plan):
        self.it, self.plan = it, plan

    def __iter__(self):
        return self

    def __next__(self):
        return next(self.it)

    def info(self) -> dict:
        return self.plan.info()


def train_batches(
    dataset,
    transform,
    *,
    batch: int,
    steps: int,
    seed: int,
    workers: int = 0,
    joint: bool = False,
    per_example: bool = False,
    device: str = "cpu",
) -> Batches:
    """`steps` batches of (images, labels) from the shuffled, repeated dataset; `joint`: the transform
    maps (image, target) pairs (segmentation). A small set (engine.resident: under RESIDENT_BYTES once resized) is
    decoded once, held on `device`, and augmented there a batch at a time from the same per-example seeds and
    draws (the per-example path's tensors; an inception crop's up to interpolation); `per_example` forces the
    worker pipeline, for the tests and benchmarks that compare the two."""
    from . import resident

    sampler = _EpochSampler(len(dataset), seed, batch * steps)
    if joint:
        chosen = resident.Plan("workers", 0, "joint image-and-target transforms run per example")
    elif per_example:
        chosen = resident.Plan("workers", 0, "the per-example path was asked for")
    else:
        chosen = resident.plan(dataset, transform)
    log.debug("training data path: %s (%s)", chosen.path, chosen.why)
    if chosen.path == "resident":
        data = resident.images(dataset, transform, workers=workers)
        it = resident.batches(data, transform, sampler, batch=batch, device=device, workers=workers)
        return Batches(it, chosen)
    loader = torch.utils.data.DataLoader(
        _Seeded(dataset, transform, joint),
        batch_size=batch,
        sampler=sampler,
        num_workers=workers,
        persistent_workers=False,
        prefetch_factor=4 if workers else None,
        pin_memory=str(device).startswith("cuda"),
    )
    return Batches(iter(loader), chosen)


def tensor_batches(*tensors: torch.Tensor, batch: int, steps: int, seed: int) -> Iterator:
    """`steps` batches of rows of `tensors` (same first dimension: e.g. tokens and cached image features)
    in the order `train_batches` visits a dataset of that size: successive seeded permutations, drawn one
    epoch at a time (a paper-scale run's 20M indices are never listed at once)."""
    n = len(tensors[0])
    pending, epoch = np.empty(0, np.int64), 0
    for _ in range(steps):
        while len(pending) < batch:  # _EpochSampler's order: the permutation is each epoch's first draw
            pending = np.concatenate([pending, np.random.default_rng([seed, epoch]).permutation(n)])
            epoch += 1
        idx, pending = torch.from_numpy(pending[:batch]), pending[batch:]
        yield tuple(t[idx] for t in tensors)


class _InOrder(_Seeded):
    """Index -> (transform(image), label) without reseeding: evaluation transforms are deterministic."""

    def __getitem__(self, i):
        return super().__getitem__((i, None))


def eval_batches(dataset, transform, *, batch: int = 256, workers: int = 0, per_example: bool = False) -> Iterator:
    if not per_example and batched(dataset, transform):
        return _array_eval_batches(dataset, transform, batch)
    return iter(
        torch.utils.data.DataLoader(_InOrder(dataset, transform), batch_size=batch, shuffle=False, num_workers=workers)
    )


def _array_eval_batches(dataset, transform, batch: int) -> Iterator:
    images = torch.from_numpy(dataset.array()).permute(0, 3, 1, 2)
    labels = torch.as_tensor(np.asarray(dataset.labels), dtype=torch.int64)
    for i in range(0, len(images), batch):
        yield transform.batch(transform.prepare(images[i : i + batch])), labels[i : i + batch]


def _is_oom(err: BaseException) -> bool:
    return isinstance(err, torch.cuda.OutOfMemoryError) or "can't allocate memory" in str(err)


def fit(
    model,
    batches: Iterator,
    optimizer,
    *,
    steps: int,
    base_lr: float,
    warmup: int,
    clip: float | None,
    loss_fn: Callable,
    device: str,
    bf16: bool | str,
    micro_batch: int | None = None,
    progress=None,
    desc: str = "train",
    schedule: str = "cosine",
    power: float = 0.9,
    splittable: bool = True,
    on_step: Callable[[int], None] | None = None,
    compile: bool = False,
    loss_at: tuple[int, ...] = (),
) -> dict:
    """Train `steps` optimizer steps. Each batch is split into micro-batches of at most `micro_batch`
    examples (gradient accumulation; the loss is the batch mean either way). Running out of memory
    halves the micro-batch and retries the step, so a batch of 512 fits where it can. `schedule`:
    'cosine' (warm-up then cosine to 0) or 'poly' (warm-up then (1 - t/T)^power to 0). A loss over the
    batch as a whole (contrastive: every other example is a negative) is `splittable=False`: the batch is
    never split, and running out of memory is an error that says to lower the batch. `on_step(step)` is called
    once the step's gradients are complete, before clipping (diagnostics read the gradient norms there).
    `compile`: the forward and backward run through torch.compile (same parameters; results equal the eager
    ones up to floating-point summation order). The loss stays on the device: the host reads it every LOSS_EVERY
    steps and at the end (the only synchronisations of the loop), and a non-finite loss raises Diverged there,
    naming the first step that had one. `loss_at`: steps (counted from 1) whose batch loss the result's `loss_at`
    holds ({step: loss}: a training curve's fixed points, read once at the end).
    `bf16`: True/False, or a setting (auto | on | off) resolved by engine.precision on the first batch's
    shape; the result's `bf16` and `bf16_choice` say what ran and why."""
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; choose one of {SCHEDULES}")
    if micro_batch and not splittable:
        raise ValueError("micro_batch splits the batch, which this loss does not allow (splittable=False)")
    model.train()
    batches, bf16, choice = _resolve_bf16(model, batches, bf16, device, micro_batch, loss_fn)
    steps_iter = range(steps) if progress is None else progress(range(steps), desc=desc)
    micro = micro_batch
    step_model = torch.compile(model) if compile else model  # the same parameters, compiled kernels
    at = torch.zeros((), dtype=torch.long, device=device)  # the step, counted on the device
    bad_step = torch.full((), -1, dtype=torch.long, device=device)
    bad_loss = torch.zeros((), device=device)
    total = torch.full((), float("nan"), device=device)
    points, kept, curve = set(loss_at), {}, []
    for step in steps_iter:
        x, y = next(batches)
        lr = schedule_lr(schedule, step, base=base_lr, warmup=warmup, total=steps, power=power)
        for group in optimizer.param_groups:
            group["lr"] = lr
        total, micro = _accumulate(step_model, optimizer, x, y, loss_fn, device, bf16, micro, splittable)
        first = (bad_step < 0) & ~torch.isfinite(total)
        bad_step = torch.where(first, at, bad_step)
        bad_loss = torch.where(first, total, bad_loss)
        at += 1
        curve.append(total.detach())
        if step + 1 in points:
            kept[step + 1] = total
        if on_step is not None:
            on_step(step)
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        if (step + 1) % LOSS_EVERY == 0 or step == steps - 1:
            _raise_if_diverged(bad_step, bad_loss)
    note_micro_batch(micro or 0)
    output(desc, {"loss_curve": torch.stack(curve) if curve else torch.zeros(0), "weights": model.state_dict()})
    return {
        "final_loss": float(total),
        **({"loss_at": {k: float(v) for k, v in sorted(kept.items())}} if loss_at else {}),
        "micro_batch": micro or 0,
        "bf16": bf16,
        **({"compiled": True} if compile else {}),
        **({"bf16_choice": choice.info} if choice else {}),
    }


def _resolve_bf16(model, batches, bf16, device: str, micro_batch, loss_fn):
    """(batches, bf16, choice): a bf16 setting (auto | on | off) resolved by engine.precision on the first batch's
    shape (which goes back in front of `batches`); a bool stays as it is, with no choice."""
    if isinstance(bf16, bool):
        return batches, bf16, None
    first = next(batches)
    x, y = first[0][: micro_batch or None], first[1][: micro_batch or None]
    shape = {
        "mode": "train",
        "model": shapes(model),
        "x": [list(x.shape), str(x.dtype)],
        "y": [list(y.shape), str(y.dtype)],
    }
    choice = resolve(bf16, device, shape, lambda: training_step(model, x, y, loss_fn, device))
    return chain([first], batches), choice.bf16, choice


def _accumulate(step_model, optimizer, x, y, loss_fn, device: str, bf16: bool, micro, splittable: bool):
    """One step's gradients of batch (x, y) in micro-batches of at most `micro` (None: the whole batch), the loss
    the batch mean either way; out of memory halves the micro-batch and tries again. Returns (loss, micro)."""
    while True:
        size = micro or len(x)
        try:
            optimizer.zero_grad(set_to_none=True)
            total = torch.zeros((), device=device)
            for start in range(0, len(x), size):
                xb = x[start : start + size].to(device, non_blocking=True)
                yb = y[start : start + size].to(device, non_blocking=True)
                with autocast(device, bf16):
                    logits = step_model(xb)
                loss = loss_fn(logits.float(), yb)
                (loss * (len(xb) / len(x))).backward()
                total = total + loss.detach() * (len(xb) / len(x))
            return total, micro
        except (torch.cuda.OutOfMemoryError, RuntimeError) as err:
            if not _is_oom(err) or size == 1:
                raise
            if not splittable:
                from ..errors import UserError

                raise UserError(
                    f"out of memory at a batch of {len(x)} on {device}; this loss needs the whole "
                    "batch at once (no gradient accumulation): lower it with --set batch=N"
                ) from None
            micro = max(1, size // 2)
            optimizer.zero_grad(set_to_none=True)
            if device.startswith("cuda"):
                torch.cuda.empty_cache()


LOSS_EVERY = 50  # steps between the host's reads of the loss (each one waits for the device)


def _raise_if_diverged(bad_step: torch.Tensor, bad_loss: torch.Tensor) -> None:
    """Diverged at the first step whose loss was not finite, if any (one host synchronisation)."""
    step = int(bad_step)
    if step >= 0:
        check_finite(float(bad_loss), step=step)


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


def array_batches(images: np.ndarray, labels, *, batch: int = 256, pixels: str = DEFAULT_PIXELS) -> Iterator:
    """Batches of uint8 (N, H, W, 3) images already at the input size, normalised as the eval transform
    normalises them (`pixels`, data.pixels), converted a batch at a time."""
    labels = np.asarray(labels)
    for i in range(0, len(images), batch):
        x = torch.from_numpy(np.array(images[i : i + batch])).permute(0, 3, 1, 2)  # a copy: memmaps are read-only
        yield normalise_uint8(x, pixels), labels[i : i + batch]


@dataclass(frozen=True)
class Evaluation:
    """How an evaluation loop runs after (model, data, transform): the one signature of `hits`, `accuracy` and
    engine.features' `extract` and `extract_pairs`. `pixels`: the normalisation of a set read as an array
    (transform=None)."""

    device: str
    bf16: bool
    batch: int = 256
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


def _targets(y: torch.Tensor, classes: int) -> torch.Tensor:
    """Class indices -> one-hot; soft targets (mixup) as they are."""
    return y.float() if y.is_floating_point() else F.one_hot(y, classes).float()


def cross_entropy(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Softmax cross-entropy (big_vision's `softmax_xent`), mean over examples; `y` indices or soft targets."""
    if y.is_floating_point():
        return -(y * F.log_softmax(logits, dim=-1)).sum(-1).mean()
    return F.cross_entropy(logits, y)


def sigmoid_cross_entropy(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """big_vision's `sigmoid_xent`: per example the binary cross-entropy of every class against its one-hot (or
    soft) target, summed over classes; mean over examples."""
    target = _targets(y, logits.shape[-1]).to(logits.dtype)
    return F.binary_cross_entropy_with_logits(logits, target, reduction="sum") / len(y)


LOSSES = {"sigmoid": sigmoid_cross_entropy, "softmax": cross_entropy}  # the `loss` hyper-parameter's choices


def fit_protocol(
    model, data, transform, optimizer, s, seed: int, ctx, *, steps=None, joint=False, wrap=None, **options
):
    """The one training entry of classify, segmentation and pretraining: `train_batches` of `data` for a protocol's
    settings `s` (batch, steps) and a cell's `seed`, optionally wrapped (`wrap(batches)`: mixup), through
    `fit_settings`. Returns (fit's result, the data path's info, training seconds)."""
    steps = s.steps if steps is None else steps
    batches = train_batches(
        data, transform, batch=s.batch, steps=steps, seed=seed, workers=ctx.workers, device=ctx.device, joint=joint
    )
    data_info = batches.info()
    started = time.time()
    out = fit_settings(model, wrap(batches) if wrap else batches, optimizer, s, ctx, steps=steps, **options)
    return out, data_info, time.time() - started


def fit_settings(model, batches, optimizer, s, ctx, *, steps: int | None = None, **options) -> dict:
    """`fit` with a protocol's settings `s` (steps, lr, warmup_steps, clip, bf16) and a cell context's device,
    micro-batch, progress display and compile flag (LiT's text tower trains on its own batches through it).
    `options`: fit's own (loss_fn, desc, schedule, on_step, ...)."""
    return fit(
        model,
        batches,
        optimizer,
        steps=s.steps if steps is None else steps,
        base_lr=s.lr,
        warmup=s.warmup_steps,
        clip=s.clip,
        device=ctx.device,
        bf16=s.bf16,
        micro_batch=ctx.micro_batch,
        progress=ctx.progress,
        compile=ctx.compile,
        **options,
    )
