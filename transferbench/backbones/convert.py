"""What a checkpoint is in transferbench's names and layouts (`Checkpoint`), and the converters of outside formats
into it: timm's VisionTransformer state dicts and big_vision's `.npz` files. Keys a converter does not understand
keep their original names, so the strict key check lists them as unexpected."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import torch

from ..errors import UserError


class CheckpointError(UserError):
    """A checkpoint that cannot be read, or does not fit the backbone it is loaded into."""


@dataclass
class Checkpoint:
    state_dict: dict[str, torch.Tensor]
    source: str  # transferbench | timm | big_vision
    path: str = ""
    config: dict = field(default_factory=dict)  # architecture facts the file states
    img_size: tuple[int, int] | None = None
    name: str | None = None
    metadata: dict = field(default_factory=dict)
    pixels: str | None = None  # the pixel normalisation the weights were trained with, where the file says


def unwrap_state_dict(sd) -> dict[str, torch.Tensor]:
    """A training script's checkpoint -> its model's tensors: the wrappers in the order of timm's
    load_state_dict(use_ema=True) (EMA weights first; DeepSpeed's `module` last), then timm's clean_state_dict
    (DDP and torch.compile prefixes, in either order)."""
    if not isinstance(sd, dict):
        raise CheckpointError(f"expected a state dict, got {type(sd).__name__}")
    for key in ("state_dict_ema", "model_ema", "state_dict", "model", "module"):
        if isinstance(sd.get(key), dict):
            sd = sd[key]
            break
    return {re.sub(r"^(?:_orig_mod\.|module\.)*", "", k): v for k, v in sd.items() if isinstance(v, torch.Tensor)}


def convert_timm(sd) -> Checkpoint:
    """timm VisionTransformer state dict -> ours. The only layout change is the conv stem:
    (D, C, p, p) -> Linear over (p1 p2 c), i.e. `permute(0, 2, 3, 1).flatten(1)`."""
    sd = unwrap_state_dict(sd)
    if "patch_embed.proj.weight" not in sd or "pos_embed" not in sd:
        raise CheckpointError("not a timm ViT state dict: no patch_embed.proj.weight / pos_embed")
    w = sd["patch_embed.proj.weight"]
    metadata = {}
    if w.ndim == 4:
        sd["patch_embed.proj.weight"] = w.permute(0, 2, 3, 1).flatten(1)
        patch, in_chans = w.shape[-1], w.shape[1]
    else:  # an old 2-D stem weight in conv order: load_checkpoint reshapes it as timm does
        patch, in_chans = None, None
        metadata["patch_embed_layout"] = "timm_flat"
    cls = "cls_token" in sd
    pos = sd["pos_embed"]
    grid = _square_grid(pos.shape[1], cls)
    if grid is None:
        raise CheckpointError(f"cannot infer a square patch grid from pos_embed {tuple(pos.shape)}")
    if cls and grid * grid == pos.shape[1]:  # timm no_embed_class: the cls token gets no position
        sd["pos_embed"] = torch.cat([pos.new_zeros(1, 1, pos.shape[-1]), pos], dim=1)
    depth = len({k.split(".")[1] for k in sd if k.startswith("blocks.")})
    config = dict(embed_dim=pos.shape[-1], depth=depth, class_token=cls)
    if "blocks.0.mlp.fc1.weight" in sd:
        config["mlp_dim"] = sd["blocks.0.mlp.fc1.weight"].shape[0]
    if patch:
        config.update(patch_size=patch, in_chans=in_chans)
    if "pre_logits.fc.weight" in sd:  # timm's former representation layer (representation_size)
        config["rep_size"] = int(sd["pre_logits.fc.weight"].shape[0])
    return Checkpoint(sd, "timm", config=config, img_size=(grid * patch,) * 2 if patch else None, metadata=metadata)


def _square_grid(tokens: int, cls: bool) -> int | None:
    """Grid side of a position table that may or may not hold a cls position."""
    for n in (tokens - 1, tokens) if cls else (tokens,):
        g = int(round(n**0.5))
        if n > 0 and g * g == n:
            return g
    return None


def convert_big_vision(arrays: dict[str, np.ndarray]) -> Checkpoint:
    """big_vision ViT `.npz` (flax names joined by '/') -> ours.

    Covers `models/vit.py` (conv `embedding`, `cls`, `pos_embedding`, `Transformer/encoderblock_{i}`,
    scanned `Transformer/encoderblock`, and the original ViT repo's `posembed_input`,
    `MultiHeadDotProductAttention_1`, `LayerNorm_2`, `MlpBlock_3` names) and
    naflex's Dense `embedding` with the Dual PatchNorm `patchln_pre`/`patchln_post` LayerNorms.
    big_vision's MLP uses flax's tanh-approximated GELU, so the config says act='gelu_tanh'.
    """
    prefix = next((p for p in ("", "params/", "opt/target/", "params/img/") if f"{p}embedding/kernel" in arrays), None)
    if prefix is None:
        raise CheckpointError("not a big_vision ViT .npz: no 'embedding/kernel' array")
    rest = {k[len(prefix) :]: v for k, v in arrays.items() if k.startswith(prefix)}
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32))  # noqa: E731
    take = rest.pop
    sd: dict[str, torch.Tensor] = {}

    patch, in_chans, width, stem = _big_vision_stem(rest, sd, t)
    cls = "cls" in rest
    if cls:
        sd["cls_token"] = t(take("cls")).reshape(1, 1, width)
    sd["pos_embed"], grid = _big_vision_pos_embed(rest, t, width, cls)
    depth, num_heads = _big_vision_blocks(rest, sd, t, width)
    sd["norm.weight"], sd["norm.bias"] = (
        t(take("Transformer/encoder_norm/scale")),
        t(take("Transformer/encoder_norm/bias")),
    )
    if "pre_logits/kernel" in rest:  # rep_size: Dense 'pre_logits' + tanh before the head
        sd["pre_logits.fc.weight"], sd["pre_logits.fc.bias"] = (
            t(take("pre_logits/kernel").T),
            t(take("pre_logits/bias")),
        )
    if "head/kernel" in rest:
        sd["head.weight"], sd["head.bias"] = t(take("head/kernel").T), t(take("head/bias"))
    sd.update({k: t(v) for k, v in rest.items()})  # unconverted (MAP head, ...): reported as unexpected
    config = {
        "embed_dim": width,
        "depth": depth,
        "num_heads": num_heads,
        "patch_size": patch,
        "in_chans": in_chans,
        "stem": stem,
        "class_token": cls,
        "pool": "tok" if cls else "gap",
        "act": "gelu_tanh",
    }
    if depth:
        config["mlp_dim"] = sd["blocks.0.mlp.fc1.weight"].shape[0]
    if "pre_logits.fc.weight" in sd:
        config["rep_size"] = int(sd["pre_logits.fc.weight"].shape[0])
    return Checkpoint(sd, "big_vision", config=config, img_size=(grid * patch,) * 2, pixels="inception")


def _big_vision_stem(rest: dict, sd: dict, t) -> tuple[int, int, int, str]:
    """The patch embedding (conv, or naflex's Dense over flattened patches) and Dual PatchNorm's LayerNorms of a
    big_vision .npz (`rest`, flax names, taken from it) into `sd`: (patch size, input channels, width, stem)."""
    kernel = rest.pop("embedding/kernel")
    if kernel.ndim == 4:  # conv (p, p, C, D): its HWC flattening is our (p1 p2 c)
        patch, in_chans = kernel.shape[0], kernel.shape[2]
    else:  # naflex Dense over flattened (p p 3) patches
        in_chans = 3
        patch = int(round((kernel.shape[0] / in_chans) ** 0.5))
    width = kernel.shape[-1]
    sd["patch_embed.proj.weight"] = t(kernel.reshape(-1, width).T)
    sd["patch_embed.proj.bias"] = t(rest.pop("embedding/bias"))
    for flax_name, ours in (("patchln_pre", "patch_embed.norm_pre"), ("patchln_post", "patch_embed.norm")):
        if f"{flax_name}/scale" in rest:
            sd[f"{ours}.weight"], sd[f"{ours}.bias"] = (
                t(rest.pop(f"{flax_name}/scale")),
                t(rest.pop(f"{flax_name}/bias")),
            )
    stem = {(True, True): "dpn", (True, False): "pre", (False, True): "post", (False, False): ""}[
        ("patch_embed.norm_pre.weight" in sd, "patch_embed.norm.weight" in sd)
    ]
    return patch, in_chans, width, stem


def _big_vision_pos_embed(rest: dict, t, width: int, cls: bool):
    """(our pos_embed, the patch grid's side) from a big_vision .npz's learnt position embedding (taken from
    `rest`): big_vision adds it before concatenating the class token, so the class token's row is zeros."""
    pe = next((rest.pop(k) for k in ("pos_embedding", "Transformer/posembed_input/pos_embedding") if k in rest), None)
    if pe is None:
        raise CheckpointError("big_vision .npz has no learnt pos_embedding (sincos2d models are not supported)")
    pe = t(pe).reshape(1, -1, width)  # naflex stores a (G, G, D) grid
    grid = _square_grid(pe.shape[1], cls)
    if grid is None:
        raise CheckpointError(f"cannot infer a square patch grid from pos_embedding {tuple(pe.shape)}")
    if cls and grid * grid == pe.shape[1]:  # big_vision adds posemb before concatenating cls
        pe = torch.cat([pe.new_zeros(1, 1, width), pe], dim=1)
    return pe, grid


def _big_vision_blocks(rest: dict, sd: dict, t, width: int) -> tuple[int, int | None]:
    """The encoder blocks of a big_vision .npz (`rest`, flax names) into `sd` (ours), as `models/vit.py` and the
    original ViT repo name them, scanned or not; the converted arrays leave `rest`. Returns (depth, heads)."""
    scanned = "Transformer/encoderblock/LayerNorm_0/scale" in rest
    if scanned:
        depth = rest["Transformer/encoderblock/LayerNorm_0/scale"].shape[0]
    else:
        depth = len({m[1] for k in rest if (m := re.match(r"Transformer/encoderblock_(\d+)/", k))})
    num_heads = None
    for i in range(depth):
        blk = "Transformer/encoderblock/" if scanned else f"Transformer/encoderblock_{i}/"
        # scanned arrays stack all blocks: slice them now, drop them after the last block
        get = (lambda n, b=blk, i=i: rest[b + n][i]) if scanned else (lambda n, b=blk: rest.pop(b + n))
        ln2 = "LayerNorm_1" if f"{blk}LayerNorm_1/scale" in rest else "LayerNorm_2"
        mlp = "MlpBlock_0" if f"{blk}MlpBlock_0/Dense_0/kernel" in rest else "MlpBlock_3"
        att = (
            "MultiHeadDotProductAttention_0"
            if f"{blk}MultiHeadDotProductAttention_0/out/bias" in rest
            else "MultiHeadDotProductAttention_1"
        )
        q, k, v = (get(f"{att}/{n}/kernel") for n in ("query", "key", "value"))  # (D, H, hd)
        num_heads = q.shape[1]
        o = f"blocks.{i}."
        sd[o + "norm1.weight"], sd[o + "norm1.bias"] = t(get("LayerNorm_0/scale")), t(get("LayerNorm_0/bias"))
        sd[o + "attn.qkv.weight"] = t(np.concatenate([a.reshape(width, -1).T for a in (q, k, v)]))
        sd[o + "attn.qkv.bias"] = t(
            np.concatenate([get(f"{att}/{n}/bias").reshape(-1) for n in ("query", "key", "value")])
        )
        sd[o + "attn.proj.weight"] = t(get(f"{att}/out/kernel").reshape(-1, width).T)  # (H, hd, D)
        sd[o + "attn.proj.bias"] = t(get(f"{att}/out/bias"))
        sd[o + "norm2.weight"], sd[o + "norm2.bias"] = t(get(f"{ln2}/scale")), t(get(f"{ln2}/bias"))
        for j in (0, 1):
            sd[o + f"mlp.fc{j + 1}.weight"] = t(get(f"{mlp}/Dense_{j}/kernel").T)
            sd[o + f"mlp.fc{j + 1}.bias"] = t(get(f"{mlp}/Dense_{j}/bias"))
    if scanned:
        for key in [k for k in rest if k.startswith("Transformer/encoderblock/")]:
            del rest[key]
    return depth, num_heads
