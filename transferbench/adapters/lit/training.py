"""LiT's text tower: trained contrastively on the locked image tower's cached pair features (with big_vision's
flip_lr as a draw between cached views), and cached itself per (pairs, training settings, seed), so every
zero-shot dataset's cell of that seed evaluates the same tower."""

from __future__ import annotations

import json
import time

import numpy as np
import torch

from ...engine.batches import tensor_batches
from ...engine.train import fit_settings, optimizer_options
from ...fingerprint import for_cache
from ...hashing import digest
from ...paths.entries import sealed, verified
from ...paths.home import cache
from ...settings.lit import LitSettings
from .towers import LitModel, contrastive_loss, parameter_groups, text_config, tokenizer


def tower_options(s: LitSettings) -> dict:
    """LitModel's initial values under settings `s`: the temperature and SigLIP's bias."""
    return {"temperature_init": s.temperature_init, "bias_init": s.siglip_bias}


def home_dir():
    return cache("lit")


def tower_key(pairs_key: str, s: LitSettings, seed: int) -> str:
    """The text tower's identity: the cached pair features it trains on (their key holds the image tower's code),
    every hyper-parameter that shapes training (not the zero-shot ones), the seed, and the fingerprint of the code
    and libraries that train it (the tower, its loss, the training loop, open_clip's tokenizer)."""
    shaping = {k: s[k] for k in TRAIN_KEYS}
    return digest({"code": for_cache("lit").digest, "pairs": pairs_key, "hp": shaping, "seed": seed})


TRAIN_KEYS = (
    "heldout",
    "image_head",
    "loss",
    "temperature_init",
    "text_width",
    "text_layers",
    "text_heads",
    "context_length",
    "batch",
    "steps",
    "lr",
    "weight_decay",
    "decay",
    "augment",
    "warmup_steps",
    "clip",
    "beta1",
    "beta2",
    "siglip_bias",
    "bf16",
)


def view_batches(tokens: torch.Tensor, views: list[torch.Tensor], *, batch: int, steps: int, seed: int):
    """`tensor_batches` of (tokens, image features) where each example's features come from one of `views`
    (the original and, with `augment: flip`, the mirrored image), drawn uniformly per example and step from
    a generator seeded by `seed`: big_vision's `flip_lr` (p = 0.5) on cached features."""
    if len(views) == 1:
        yield from tensor_batches(tokens, views[0], batch=batch, steps=steps, seed=seed)
        return
    rng = torch.Generator().manual_seed(int(seed) + 7919)
    stacked = torch.stack(views, 1)  # (N, V, D)
    for t, f in tensor_batches(tokens, stacked, batch=batch, steps=steps, seed=seed):
        pick = torch.randint(len(views), (len(t),), generator=rng)
        yield t, f[torch.arange(len(t)), pick]


def _train_tower(model, captions, views: list, s: LitSettings, seed: int, ctx) -> dict:
    """Train `model`'s text tower on the caption and image-feature pairs (data order from `seed`) with LiT's AdamW;
    its training info."""
    tokens = tokenizer(s.context_length)(list(captions))
    batches = view_batches(tokens, views, batch=s.batch, steps=s.steps, seed=seed)
    groups = parameter_groups(model, s.weight_decay, lr=s.lr, decay=s.decay)
    opt = torch.optim.AdamW(groups, lr=s.lr, betas=(s.beta1, s.beta2), **optimizer_options(ctx.device))
    started = time.time()
    loss = contrastive_loss(model)
    out = fit_settings(model, batches, opt, s, ctx, loss_fn=loss, desc=f"text tower seed={seed}", splittable=False)
    return {
        "final_loss": out["final_loss"],
        "steps": s.steps,
        "text_bf16": out["bf16"],
        "adamw_weight_decay": groups[0]["weight_decay"],
        "decayed_tensors": len(groups[0]["params"]),
        **({"text_bf16_choice": out["bf16_choice"]} if "bf16_choice" in out else {}),
        "train_seconds": round(time.time() - started, 2),
        "temperature": round(float(model.scale().detach()), 4),
        **({"logit_bias": round(float(model.logit_bias.detach()), 4)} if model.logit_bias is not None else {}),
    }


def text_tower(features: list, captions, s: LitSettings, seed: int, pairs_key: str, ctx):
    """The trained LitModel for these pairs, settings and seed: from the tower cache, or trained (text-tower
    init and data order from `seed`) and stored. `features`: one (N, D) array of image features per view of
    the same images (`view_batches`). Returns (model, info)."""
    views = [torch.from_numpy(np.asarray(v)) for v in features]
    from filelock import FileLock
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    key = tower_key(pairs_key, s, seed)
    folder = home_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{key}.safetensors"  # the weights, with the training info in the file's metadata

    def build():
        torch.manual_seed(seed)
        return LitModel(
            views[0].shape[1],
            text_config(s),
            image_head=s.image_head,
            loss=s.loss,
            **tower_options(s),
        )

    with FileLock(str(folder / f"{key}.lock")):
        if verified(path, "LiT text tower cache entry"):
            model = build()
            model.load_state_dict(load_file(str(path)))
            with safe_open(str(path), "pt") as f:
                info = json.loads(f.metadata()["info"])
            return model, {**info, "tower_cache_hit": True}
        model = build().to(ctx.device)
        info = _train_tower(model, captions, views, s, seed, ctx)
        model = model.cpu()
        with sealed(path) as tmp:
            save_file(
                {k: v.contiguous() for k, v in model.state_dict().items()},
                str(tmp),
                metadata={"info": json.dumps(info)},
            )
        return model, {**info, "tower_cache_hit": False}
