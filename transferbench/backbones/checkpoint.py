"""Weights in and out: our safetensors format written and read, outside files read through their converters
(`backbones.convert`: timm, big_vision), checked against the backbone they load into.

Every reader returns a `Checkpoint` in transferbench's state-dict names and layouts. Pickles are
never executed: `.pth` files load with `torch.load(weights_only=True)`.
"""

from __future__ import annotations

import json
import logging
import zipfile
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from timm.layers import resample_abs_pos_embed
from torch import nn

from ..paths.writes import atomic_path
from ..settings.choices import POSEMB_METHODS
from .convert import Checkpoint, CheckpointError, convert_big_vision, convert_timm, unwrap_state_dict

log = logging.getLogger("transferbench")


FORMAT = "transferbench"


_TORCH_SUFFIXES = (".pth", ".pt", ".bin", ".ckpt")


_UNCHECKED = ("pool",)  # weights do not depend on it: a 'tok' checkpoint may be pooled with 'gap'


def save_checkpoint(model: nn.Module, path, **metadata) -> Path:
    """Write `model`'s weights as safetensors with its name, img size, classes and config in the
    header (a timm: or py: model: its state dict under its own keys and its name; its family rebuilds it).
    Atomic (temp file + rename): a killed run never leaves a torn checkpoint."""
    path = Path(path)
    if path.suffix != ".safetensors":
        raise CheckpointError(f"save_checkpoint writes safetensors; name the file '{path.stem}.safetensors'")
    meta = {k: v if isinstance(v, str) else json.dumps(v) for k, v in metadata.items()}
    meta["name"] = getattr(model, "name", None) or ""
    if isinstance(getattr(model, "config", None), dict):  # transferbench's ViT: the header makes it rebuildable
        meta.update(
            format=FORMAT,
            format_version="1",
            img_size=json.dumps(list(model.img_size)),
            num_classes=str(model.num_classes),
            config=json.dumps(model.config, sort_keys=True),
        )
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata=meta)
    return path


def check_checkpoint_file(path) -> Path:
    """That `path` is a checkpoint file of a supported kind, from its header only (no tensor is read):
    a safetensors header, a zip archive of arrays (.npz), a torch file. Otherwise one CheckpointError
    naming the file and what it is not."""
    p = Path(path)
    if not p.is_file():
        raise CheckpointError(f"checkpoint {p} does not exist (give a .safetensors, .pth or big_vision .npz file)")
    if p.suffix == ".safetensors":
        try:
            with safe_open(str(p), framework="pt") as f:
                f.keys()
        except Exception as e:  # noqa: BLE001 - safetensors' own error type says what is wrong
            raise CheckpointError(f"checkpoint {p} is not a valid safetensors file ({_first_line(e)})") from None
    elif p.suffix == ".npz":
        if not zipfile.is_zipfile(p):
            raise CheckpointError(f"checkpoint {p} is not a valid .npz file (not a zip archive of arrays)")
    elif p.suffix in _TORCH_SUFFIXES:
        with open(p, "rb") as f:
            head = f.read(2)
        if not zipfile.is_zipfile(p) and head[:1] != b"\x80":  # torch's zip format, or a legacy pickle
            raise CheckpointError(
                f"checkpoint {p} is not a PyTorch checkpoint (neither torch's zip format nor a pickle)"
            )
    else:
        raise CheckpointError(
            f"unsupported checkpoint type {p.suffix!r} for {p}; "
            f"use .safetensors, {'/'.join(_TORCH_SUFFIXES)} or big_vision .npz"
        )
    return p


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def read_checkpoint(path) -> Checkpoint:
    """Read any supported file into transferbench names: ours or timm's `.safetensors`, timm
    `.pth/.pt/.bin`, big_vision `.npz`."""
    if isinstance(path, Checkpoint):
        return path
    p = check_checkpoint_file(path)
    if p.suffix == ".npz":
        with np.load(p, allow_pickle=False) as npz:
            ckpt = convert_big_vision({k: npz[k] for k in npz.files})
    elif p.suffix == ".safetensors":
        with safe_open(str(p), framework="pt") as f:
            meta = f.metadata() or {}
            sd = {k: f.get_tensor(k) for k in f.keys()}
        if meta.get("format") == FORMAT:
            ckpt = Checkpoint(
                sd,
                FORMAT,
                config=json.loads(meta["config"]),
                img_size=tuple(json.loads(meta["img_size"])),
                name=meta.get("name") or None,
                metadata=meta,
                pixels=meta.get("pixels") or None,
            )
        else:
            ckpt = convert_timm(sd)
    elif p.suffix in _TORCH_SUFFIXES:
        ckpt = convert_timm(_torch_load(p))
    ckpt.path = str(p)
    return ckpt


def _torch_load(p: Path):
    try:
        return torch.load(p, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - the unpickler's message says which global it refused
        raise CheckpointError(
            f"refusing to load {p}: it is not a plain tensor state dict "
            f"(weights_only=True: {_first_line(e)}); re-save it as a state dict or "
            "safetensors"
        ) from None


def read_state_dict(path) -> dict[str, torch.Tensor]:
    """A `.safetensors` or torch file's tensors under the file's own keys (no conversion), unwrapped as
    `unwrap_state_dict` does; a file that is not one is one CheckpointError (`check_checkpoint_file`)."""
    p = check_checkpoint_file(path)
    if p.suffix == ".safetensors":
        with safe_open(str(p), framework="pt") as f:
            return {k: f.get_tensor(k) for k in f.keys()}
    if p.suffix not in _TORCH_SUFFIXES:
        raise CheckpointError(
            f"{p}: give the weights as .safetensors or a torch state dict ({', '.join(_TORCH_SUFFIXES)})"
        )
    return unwrap_state_dict(_torch_load(p))


def _own_header(p: Path) -> dict:
    """The header of a checkpoint file this package wrote (`save_checkpoint`: FORMAT); {} for any other file."""
    if p.suffix != ".safetensors":
        return {}
    with safe_open(str(p), framework="pt") as f:
        meta = f.metadata() or {}
    return meta if meta.get("format") == FORMAT else {}


def checkpoint_resolution(path) -> tuple[int, int] | None:
    """The input resolution a checkpoint was trained at: our files state it in their header; timm and big_vision
    files give it through their position-embedding grid (None where the grid or patch size cannot be read)."""
    p = check_checkpoint_file(path)
    meta = _own_header(p)
    if meta.get("img_size"):
        return tuple(json.loads(meta["img_size"]))
    return read_checkpoint(p).img_size


def checkpoint_pixels(path) -> str | None:
    """The pixel normalisation a checkpoint states: ours in their header (`pixels`), a big_vision `.npz` always
    [-1, 1] ('inception': big_vision's `value_range(-1, 1)`); None where the file does not say (timm files,
    ours written before the field existed)."""
    p = check_checkpoint_file(path)
    if p.suffix == ".npz":
        return "inception"
    return _own_header(p).get("pixels") or None


def checkpoint_pretraining(path) -> str:
    """What a checkpoint states it was pretrained on: ours of the `pretrain` task in their header's `pretraining`
    (cell.pretraining_name); one written before that field, `pretrain:DATASET:STEPS`, which claims no protocol;
    '' for any other file."""
    meta = _own_header(check_checkpoint_file(path))
    if meta.get("task") != "pretrain" or not meta.get("dataset"):
        return ""
    return meta.get("pretraining") or f"pretrain:{meta['dataset']}:{int(meta.get('steps') or 0)}"


def training_log_path(path) -> Path:
    """The side file of a checkpoint with what its training logged (`measures.TrainingLog`): NAME.log.json."""
    p = Path(path)
    return p.with_name(p.name.removesuffix(p.suffix) + ".log.json")


def read_training_log(path) -> dict | None:
    """The training log beside checkpoint `path`, or None when it has none. A log that does not parse is an
    error naming the file (it is never half-trusted)."""
    if path is None:
        return None
    log_file = training_log_path(path)
    if not log_file.is_file():
        return None
    try:
        return json.loads(log_file.read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(
            f"training log {log_file} is unreadable ({e}); delete it (the checkpoint stays usable) or restore it"
        ) from None


def resample_posemb(
    pos_embed: torch.Tensor, new_grid, old_grid, num_prefix_tokens: int, method: str = "big_vision"
) -> torch.Tensor:
    """The patch grid's table resized bilinearly, prefix (cls) positions unchanged.

    'big_vision': big_vision's `resample_posemb` (models/vit.py), `scipy.ndimage.zoom(order=1)`, which is
    bilinear interpolation with the corner samples kept (`align_corners=True`).
    'scenic': scenic's `pos_interpolation_method='bilinear'`, `jax.image.resize(posemb, ..., 'bilinear')`:
    half-pixel centres (`align_corners=False`), antialiased when the grid shrinks (jax's default)."""
    prefix, grid = pos_embed[:, :num_prefix_tokens], pos_embed[:, num_prefix_tokens:]
    dim = grid.shape[-1]
    grid = grid.reshape(1, old_grid[0], old_grid[1], dim).permute(0, 3, 1, 2)
    grid = grid.to(torch.promote_types(grid.dtype, torch.float32))
    if method == "scenic":
        shrink = any(n < o for n, o in zip(new_grid, old_grid))
        grid = torch.nn.functional.interpolate(
            grid, size=tuple(new_grid), mode="bilinear", align_corners=False, antialias=shrink
        )
    else:
        grid = torch.nn.functional.interpolate(grid, size=tuple(new_grid), mode="bilinear", align_corners=True)
    grid = grid.permute(0, 2, 3, 1).reshape(1, -1, dim).to(pos_embed.dtype)
    return torch.cat([prefix, grid], dim=1)


def head_classes(path) -> int | None:
    """The number of classes of a checkpoint's head, or None without one. A safetensors file (ours or timm's:
    both name it `head.weight`) answers from its header; other formats are read."""
    p = check_checkpoint_file(path)
    if p.suffix == ".safetensors":
        with safe_open(str(p), framework="pt") as f:
            if "head.weight" not in f.keys():
                return None
            shape = f.get_slice("head.weight").get_shape()
        return int(shape[0]) if len(shape) == 2 else None
    w = read_checkpoint(p).state_dict.get("head.weight")
    return int(w.shape[0]) if w is not None and w.ndim == 2 else None


def load_checkpoint(model: nn.Module, path, posemb: str | None = None) -> Checkpoint:
    """Load a checkpoint into `model` strictly, resizing position embeddings to its grid. A head of
    a different size (or none in `model`) is not loaded: `model` keeps its zero-initialised head.

    Position embeddings of another grid are resampled the way the weights' own code does it (`posemb`
    None), or by the method `posemb` names: 'big_vision' (`resample_posemb`: bilinear, corners aligned; big_vision
    `.npz` and our own files), 'scenic' (bilinear, half-pixel centres, as `jax.image.resize`) or 'timm'
    (`checkpoint_filter_fn`: bicubic with antialias; timm files). The
    method used is left in `model.posemb_resample` (None: no resampling)."""
    ckpt = read_checkpoint(path)
    if posemb is not None and posemb not in POSEMB_METHODS:
        raise CheckpointError(f"posemb={posemb!r}: choose one of {', '.join(POSEMB_METHODS)}")
    where = f"checkpoint {ckpt.path or '(in memory)'}" + (f" (saved from {ckpt.name!r})" if ckpt.name else "")
    differ = [
        f"{k}: checkpoint {v!r} vs backbone {model.config[k]!r}"
        for k, v in ckpt.config.items()
        if k in model.config and k not in _UNCHECKED and model.config[k] != v
    ]
    if differ:
        raise CheckpointError(f"{where} does not fit backbone {model.name!r}: {'; '.join(differ)}")
    sd = dict(ckpt.state_dict)
    own = model.state_dict()
    w = sd.get("patch_embed.proj.weight")
    if ckpt.metadata.get("patch_embed_layout") == "timm_flat" and w is not None and w.ndim == 2:
        # timm's checkpoint_filter_fn: an old 2-D stem weight is (O, C*p*p) in conv order, reshaped to
        # (O, -1, p, p) with the model's patch size; ours flattens (p1 p2 c)
        p = model.patch_size
        sd["patch_embed.proj.weight"] = w.reshape(w.shape[0], -1, p, p).permute(0, 2, 3, 1).flatten(1)
    model.posemb_resample = None
    if "pos_embed" in sd and sd["pos_embed"].shape != own["pos_embed"].shape and ckpt.img_size:
        method = posemb or ("timm" if ckpt.source == "timm" else "big_vision")
        sd["pos_embed"] = _resized_pos_embed(
            model, sd["pos_embed"], [s // model.patch_size for s in ckpt.img_size], method
        )
        model.posemb_resample = method
    head = [k for k in sd if k.startswith("head.")]
    drop_head = bool(head) and any(k not in own or own[k].shape != sd[k].shape for k in head)
    if drop_head:
        log.info(
            "not loading the checkpoint's head (%s): the backbone has num_classes=%d",
            tuple(sd["head.weight"].shape) if "head.weight" in sd else "?",
            model.num_classes,
        )
        for k in head:
            del sd[k]
        own = {k: v for k, v in own.items() if not k.startswith("head.")}
    _check_keys(sd, own, f"{where} does not fit backbone {model.name!r}")
    model.load_state_dict(sd, strict=not drop_head)  # keys checked above; only a dropped head may be absent
    return ckpt


def _resized_pos_embed(model, pe, old_grid: list, method: str):
    """A checkpoint's position embedding `pe` of grid `old_grid` resampled to `model`'s grid by `method` (timm's
    bicubic with antialias, or `resample_posemb`'s big_vision or scenic bilinear)."""
    log.info("resizing pos_embed from grid %s to %s (%s)", old_grid, list(model.grid_size), method)
    if method == "timm":
        return resample_abs_pos_embed(
            pe.float(),
            list(model.grid_size),
            old_grid,
            num_prefix_tokens=model.num_prefix_tokens,
            interpolation="bicubic",
            antialias=True,
        )
    return resample_posemb(pe.float(), model.grid_size, old_grid, model.num_prefix_tokens, method=method)


def _check_keys(sd: dict, own: dict, problem: str) -> None:
    """A CheckpointError, `problem` and what differs, where the state dict `sd` lacks a key of `own`, has one more,
    or a shape differs."""
    missing = [k for k in own if k not in sd]
    unexpected = [k for k in sd if k not in own]
    shapes = [
        f"{k} {tuple(sd[k].shape)} vs {tuple(own[k].shape)}" for k in own if k in sd and sd[k].shape != own[k].shape
    ]
    parts = [
        f"{label} [{_few(items)}]"
        for label, items in (
            ("missing", missing),
            ("unexpected", unexpected),
            ("shape checkpoint vs backbone", shapes),
        )
        if items
    ]
    if parts:
        raise CheckpointError(f"{problem}: {'; '.join(parts)}")


def _few(items: list[str], n: int = 6) -> str:
    return ", ".join(items[:n]) + (f", ... +{len(items) - n} more" if len(items) > n else "")
