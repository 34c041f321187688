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
from functools import partial
from itertools import chain

import torch

from ..arithmetic import note_compiled, note_micro_batch, output
from ..settings.choices import SCHEDULES
from .batches import train_batches
from .compute import check_finite, compiles
from .precision import autocast, resolve, shapes, training_step

log = logging.getLogger("transferbench")


def cosine_lr(step: int, *, base: float, warmup: int, total: int) -> float:
    """Linear warm-up over `warmup` steps, then cosine from `base` to 0 at `total`."""
    if step < warmup:
        return base * (step + 1) / warmup
    return 0.5 * base * (1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))


def poly_lr(step: int, *, base: float, warmup: int, total: int, power: float) -> float:
    """Linear warm-up over `warmup` steps, then polynomial decay base * (1 - t/T)^power to 0 at `total`
    (mmseg's PolyLR with eta_min 0, the Segmenter/ADE20K schedule)."""
    if step < warmup:
        return base * (step + 1) / warmup
    return base * (1 - (step - warmup) / max(1, total - warmup)) ** power


def optimizer_options(device) -> dict:
    """Keyword arguments for torch's SGD and AdamW on `device`: on CUDA the fused update (one kernel for every
    parameter: the step's optimizer time falls from a launch per tensor to one); elsewhere torch's default (the
    per-tensor loop on the CPU, where the fused kernel has shown no gain). Same update up to float rounding
    (tested)."""
    return {"fused": True} if str(device).startswith("cuda") else {}


def schedule_lr(name: str, step: int, *, base: float, warmup: int, total: int, power: float | None = None) -> float:
    """The learning rate at `step` of schedule `name` (`power`: the poly schedule's, from the protocol's settings)."""
    if name == "cosine":
        return cosine_lr(step, base=base, warmup=warmup, total=total)
    if name == "poly":
        if power is None:
            raise ValueError("the poly schedule needs its power (the protocol's `power` setting)")
        return poly_lr(step, base=base, warmup=warmup, total=total, power=power)
    raise ValueError(f"unknown schedule {name!r}; choose one of {SCHEDULES}")


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
    power: float | None = None,
    splittable: bool = True,
    on_step: Callable[[int], None] | None = None,
    compile: bool = False,
    loss_at: tuple[int, ...] = (),
    log=None,
) -> dict:
    """Train `steps` optimizer steps, each batch in micro-batches of at most `micro_batch` examples (the loss is the
    batch mean either way); running out of memory halves the micro-batch and retries the step. `schedule`: 'cosine'
    (warm-up then cosine to 0) or 'poly' (warm-up then (1 - t/T)^power to 0). A loss over the whole batch
    (contrastive) is `splittable=False`: never split, and out of memory is an error that says to lower the batch.
    `on_step(step)`: called once the step's gradients are complete, before clipping (diagnostics read them there).
    `compile` (a bool, or auto | on | off: engine.compute.compiles): the steps run through torch.compile (`_Compiled`;
    equal to eager up to summation order); the result's `compile_s` is the first step's seconds. The loss stays on
    the device: the host reads it every LOSS_EVERY steps and at the end (the loop's only synchronisations; the cell's
    trackers get the steps' losses there), and a non-finite loss raises Diverged there, naming its first step.
    `loss_at`: steps (from 1) whose batch loss the result's `loss_at` holds. `bf16`: True/False, or auto | on | off
    resolved by engine.precision on the first batch's shape; the result's `bf16` and `bf16_choice` say what ran.
    `log`: the cell's entry in its trackers (tracking.CellLog, from the cell's context), which gets this loop's
    curve under `desc`; None: logged nowhere."""
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; choose one of {SCHEDULES}")
    if micro_batch and not splittable:
        raise ValueError("micro_batch splits the batch, which this loss does not allow (splittable=False)")
    model.train()
    batches, bf16, choice = _resolve_bf16(model, batches, bf16, device, micro_batch, loss_fn)
    lr_at = partial(schedule_lr, schedule, base=base_lr, warmup=warmup, total=steps, power=power)  # lr_at(step)
    losses = _Losses(device, set(loss_at), log.curve(desc) if log is not None else None, lr_at)
    steps_iter = range(steps) if progress is None else progress(range(steps), desc=desc)
    step = partial(_accumulate, loss_fn=loss_fn, device=device, bf16=bf16, splittable=splittable)
    loop = (steps_iter, step, losses, compile, micro_batch, clip, on_step)
    micro, compile, compile_s = _steps(model, batches, optimizer, steps, *loop)
    note_micro_batch(micro or 0)
    curve = torch.stack(losses.curve) if losses.curve else torch.zeros(0)
    output(desc, {"loss_curve": curve, "weights": model.state_dict()})
    return {
        "final_loss": float(losses.last),
        **({"loss_at": {k: float(v) for k, v in sorted(losses.kept.items())}} if loss_at else {}),
        **{"micro_batch": micro or 0, "bf16": bf16},
        **({"compiled": True, "compile_s": round(compile_s, 3)} if steps and compile else {}),
        **({"bf16_choice": choice.info} if choice else {}),
    }


def _steps(model, batches, optimizer, steps: int, steps_iter, accumulate, losses, setting, micro, clip, on_step):
    """`fit`'s loop: each step's batch through `accumulate` (`_accumulate`, its micro-batch halved where memory ran
    out), `on_step`, clipping and the optimizer's step, its loss into `losses`; every LOSS_EVERY steps and at the
    end the host reads the losses (to the trackers, and a non-finite one raises Diverged). Returns the micro-batch
    it ended with, whether the steps were compiled (`setting`, decided on the loop's size) and the first step's
    seconds where they were."""
    compile, compile_s, step_model = False, 0.0, model
    for step in steps_iter:
        x, y = next(batches)
        if step == 0:  # compiled or not, decided on the loop's size (engine.compute.compiles)
            compile, step_model = _step_model(model, setting, losses.device, steps * len(x))
            started = time.perf_counter()
        _set_lr(optimizer, losses.lr_at(step))
        total, micro = accumulate(step_model, optimizer, x, y, micro=micro)
        if step == 0 and compile:
            total.item()  # the first step's work done: its time is the compilation's
            compile_s = time.perf_counter() - started
        losses.add(step, total)
        if on_step is not None:
            on_step(step)
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        if (step + 1) % LOSS_EVERY == 0 or step == steps - 1:
            losses.read()
    return micro, compile, compile_s


class _Losses:
    """What a training loop keeps of its losses, on the device (no host read but `read`): the step counter, the first
    non-finite step and its loss, the last loss, each step's loss (the curve) and those of the steps in `points`;
    `track` (a tracking.Curve, or None) gets the curve, with the rates of `lr_at(step)`, at each read."""

    def __init__(self, device: str, points: set, track, lr_at):
        self.device, self.points, self.track, self.lr_at = device, points, track, lr_at
        self.at, self.bad_step, self.bad_loss, self.last = _on_device(device)
        self.curve, self.kept = [], {}

    def add(self, step: int, total) -> None:
        """Step `step`'s (from 0) batch loss `total`."""
        first = (self.bad_step < 0) & ~torch.isfinite(total)
        self.bad_step = torch.where(first, self.at, self.bad_step)
        self.bad_loss = torch.where(first, total, self.bad_loss)
        self.at += 1
        self.last = total
        self.curve.append(total.detach())
        if step + 1 in self.points:
            self.kept[step + 1] = total

    def read(self) -> None:
        """The host reads the losses: the steps' losses since the last read to the cell's trackers, and Diverged
        where one was not finite."""
        if self.track is not None:
            self.track.send(self.curve, self.lr_at)
        _raise_if_diverged(self.bad_step, self.bad_loss)


COMPILE_BACKEND = "inductor"  # torch.compile's backend for training steps (tests count compilations with their own)


def _on_device(device: str):
    """The loop's counters, kept on the device: the step, the first non-finite step and its loss, the last loss."""
    at = torch.zeros((), dtype=torch.long, device=device)
    bad_step = torch.full((), -1, dtype=torch.long, device=device)
    return at, bad_step, torch.zeros((), device=device), torch.full((), float("nan"), device=device)


def _set_lr(optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr * group["lr_mult"] if "lr_mult" in group else lr


def _step_model(model, setting, device: str, examples: int):
    """(compiled, what the steps call) for a loop of `examples` (steps x batch), noted in the cell's arithmetic."""
    compile = compiles(setting, device, examples)
    note_compiled(compile)
    return compile, _Compiled(model) if compile else model  # the same parameters, compiled kernels


class _Compiled:
    """A model's forward through torch.compile for one batch size (the first it is called with, fixed shapes),
    its other sizes eager: the remainder micro-batch, a micro-batch halved after an out-of-memory and evaluation
    (which calls the model itself) never recompile. Dynamo reuses the compilation for another instance of the same
    class and shapes (a later cell's model)."""

    def __init__(self, model):
        self.model = model
        self.compiled = torch.compile(model, backend=COMPILE_BACKEND, dynamic=False)
        self.size = None

    def __call__(self, x):
        if self.size is None:
            self.size = len(x)
        return self.compiled(x) if len(x) == self.size else self.model(x)


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
    micro-batch, progress display, compile flag and tracker entry (LiT's text tower trains on its own batches
    through it).
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
        log=ctx.log,
        **options,
    )
