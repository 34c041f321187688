"""Upstream pretraining (DPN App. C: the AugReg recipe), one cell per backbone, writing a checkpoint.

Protocol (numbers in tasks/pretrain.yaml): Adam with decoupled weight decay, linear warm-up then cosine
to 0, sigmoid cross-entropy on one-hot targets, gradient clip 1.0, dropout and stochastic depth 0.1 for
B and L. The record's info holds the checkpoint path and sha256; `NAME@embedded` backbones resolve to it
(engine.cells.resolve_backbone) and pretrain on demand.
"""
from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict

from ..data import embedded
from ..data.folder import FolderDataset
from ..data.transforms import eval_transform, train_transform
from ..errors import UserError
from . import Adapter, plan_select_then_final


class PretrainDataset(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    group: str | None = None
    version: str = ""
    source: str  # embedded | tfds
    tfds: str | None = None
    train: str
    test: str


def bf16_enabled(setting, device: str) -> bool:
    """'auto': bf16 autocast where the hardware has bf16 matrix units (CUDA with bf16, or a CPU with
    AVX512-BF16 / AMX); elsewhere bf16 is emulated and slower than fp32."""
    if setting in (True, "true", "on"):
        return True
    if setting in (False, "false", "off"):
        return False
    if device.startswith("cuda"):
        return torch.cuda.is_bf16_supported()
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def cosine_lr(step: int, *, base: float, warmup: int, total: int) -> float:
    if step < warmup:
        return base * (step + 1) / warmup
    return 0.5 * base * (1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))


def load_split(cell, split: str):
    cfg = cell.dataset_config
    if cfg["source"] == "embedded":
        root = embedded.ensure([cell.dataset])
        return FolderDataset(root, cell.dataset, cfg[split])
    from ..data.tfds_source import TfdsDataset
    return TfdsDataset(cfg["tfds"], cfg[split])


def checkpoint_path(cell) -> Path:
    return embedded.home() / "checkpoints" / f"{cell.backbone}-{cell.dataset}-{cell.key}.safetensors"


class PretrainAdapter(Adapter):
    name = "pretrain"
    dataset_schema = PretrainDataset

    def plan(self, task, backbone, results):
        return plan_select_then_final(task, backbone, results)

    def run(self, cell, ctx):
        from ..backbones import SIZES, create_backbone, parse_name, save_checkpoint
        from ..engine.cells import file_sha256
        from ..engine.runner import check_finite

        hp = cell.hparams
        torch.manual_seed(cell.seed)
        rng = np.random.default_rng(cell.seed)
        train, test = load_split(cell, "train"), load_split(cell, "test")
        name = cell.backbone.partition("@")[0]  # the spec may name a checkpoint to continue from
        try:
            big = parse_name(name)["embed_dim"] >= SIZES["b"].embed_dim  # AugReg regularises B and L only
        except UserError:
            big = False  # a plugin backbone: no size to go by
        reg = dict(drop_rate=hp["dropout_b_l"], drop_path_rate=hp["dropout_b_l"]) if big else {}
        model = create_backbone(name, img_size=hp["resolution"], num_classes=train.num_classes,
                                checkpoint=cell.checkpoint, **reg)
        model.to(ctx.device).train()
        decay = [p for n, p in model.named_parameters() if p.ndim > 1 and "pos_embed" not in n]
        rest = [p for n, p in model.named_parameters() if not (p.ndim > 1 and "pos_embed" not in n)]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": hp["weight_decay"]},
                                 {"params": rest, "weight_decay": 0.0}], lr=hp["lr"], betas=(0.9, hp["beta2"]))
        use_bf16 = bf16_enabled(hp["bf16"], ctx.device)
        tf = train_transform(hp["resolution"], hp["augment"])
        fetch = _examples(train)
        started, seen, loss_value = time.time(), 0, float("nan")
        for step in ctx.progress(range(hp["steps"]), desc=f"pretrain {cell.backbone}"):
            idx = rng.integers(0, len(train), hp["batch"])
            images, labels = zip(*(fetch(int(i)) for i in idx))
            x = torch.stack([tf(im) for im in images]).to(ctx.device)
            y = torch.as_tensor(labels, device=ctx.device)
            for group in opt.param_groups:
                group["lr"] = cosine_lr(step, base=hp["lr"], warmup=hp["warmup_steps"], total=hp["steps"])
            with torch.autocast(device_type=ctx.device.split(":")[0], dtype=torch.bfloat16, enabled=use_bf16):
                logits = model(x)
            loss = _loss(logits.float(), y, hp["loss"])
            check_finite(loss.detach(), step=step)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), hp["clip"])
            opt.step()
            seen += len(idx)
            loss_value = float(loss.detach())
        train_seconds = time.time() - started
        accuracy = evaluate(model, test, hp["resolution"], ctx.device, use_bf16)
        path = save_checkpoint(model.cpu(), checkpoint_path(cell), task="pretrain", dataset=cell.dataset,
                               cell_key=cell.key, steps=hp["steps"], test_accuracy=accuracy)
        return {"test": {"accuracy": accuracy},
                "info": {"checkpoint": str(path), "checkpoint_sha256": file_sha256(path), "final_loss": loss_value,
                         "train_seconds": round(train_seconds, 1), "images_per_second": round(seen / train_seconds, 1),
                         "bf16": use_bf16}}


def _examples(dataset):
    """i -> (image, label) for the transforms: image folders are decoded once into uint8 CHW tensors;
    tfds sources are read lazily (PIL images)."""
    if hasattr(dataset, "array"):
        arr = torch.from_numpy(dataset.array()).permute(0, 3, 1, 2)
        return lambda i: (arr[i], int(dataset.labels[i]))
    return lambda i: dataset[i]


def _loss(logits: torch.Tensor, y: torch.Tensor, kind: str) -> torch.Tensor:
    if kind == "sigmoid":  # AugReg: sigmoid cross-entropy on one-hot targets, summed over classes
        target = F.one_hot(y, logits.shape[-1]).float()
        return F.binary_cross_entropy_with_logits(logits, target, reduction="sum") / len(y)
    return F.cross_entropy(logits, y)


@torch.inference_mode()
def evaluate(model, dataset, resolution: int, device: str, bf16: bool, batch: int = 256) -> float:
    """Top-1 accuracy in percent."""
    model.eval()
    tf = eval_transform(resolution)
    fetch = _examples(dataset)
    correct = 0
    for start in range(0, len(dataset), batch):
        images, labels = zip(*(fetch(i) for i in range(start, min(start + batch, len(dataset)))))
        x = torch.stack([tf(im) for im in images]).to(device)
        with torch.autocast(device_type=device.split(":")[0], dtype=torch.bfloat16, enabled=bf16):
            pred = model(x).argmax(-1).cpu().numpy()
        correct += int((pred == np.asarray(labels)).sum())
    return 100.0 * correct / len(dataset)
