"""Backbone names: `{size}{patch}[_{stem}][_dtn][_rep]`, e.g. `b32`, `b32_dpn`, `s16_dtn`, `mu4_dpn_dtn`, `b16_rep`.
`_rep` adds big_vision's representation layer (`rep_size=True`: a dense layer of the model width + tanh
before the head, as AugReg and the DPN paper train B and L); a checkpoint that has one brings it along anyway.

Sizes are the ViT paper's (Dosovitskiy et al. Table 1; ti from DeiT) plus `mu`, a CPU size for the
embedded offline suite. Backbones come in families found through the `transferbench.backbones` entry
point (this grammar is the built-in family `vit`); `register_backbone` adds one name in-process.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from torch import nn

from ..errors import UserError, close_matches
from ..names import model_name
from ..plugins import load_group
from .stems import STEMS


@dataclass(frozen=True)
class Size:
    embed_dim: int
    depth: int
    num_heads: int
    mlp_dim: int
    img_size: int  # default input resolution


SIZES: dict[str, Size] = {
    "mu": Size(128, 6, 4, 512, 32),
    "ti": Size(192, 12, 3, 768, 224),
    "s": Size(384, 12, 6, 1536, 224),
    "b": Size(768, 12, 12, 3072, 224),
    "l": Size(1024, 24, 16, 4096, 224),
}
GRAMMAR = "{size}{patch}[_{stem}][_dtn][_rep]"
_NAME = re.compile(r"(?P<size>[a-z]+?)(?P<patch>\d+)(?:_(?P<stem>[a-z]+))?")
_LISTED = ["ti16", "s16", "s32", "b16", "b32", "l16", "mu4", "mu8"]
_EXTRA: dict[str, _Single] = {}


class UnknownBackboneError(UserError):
    """A backbone name that no installed backbone family knows."""


class ViTFamily:
    """The built-in family: every name of the grammar (registered as entry point `vit`)."""

    def names(self) -> list[str]:
        names = []
        for base in _LISTED:
            names += [base, f"{base}_dpn", f"{base}_dtn"]
        names += [f"{base}{stem}_rep" for base in ("b16", "b32", "l16") for stem in ("", "_dpn")]
        return names + [f"b32_{stem}" for stem in STEMS if stem and stem != "dpn"]

    def accepts(self, name: str) -> bool:
        try:
            parse_name(name, _raise=False)
            return True
        except KeyError:
            return False

    def create(self, name, *, img_size=None, num_classes=0, checkpoint=None, **overrides):
        return _create_vit(name, img_size=img_size, num_classes=num_classes, checkpoint=checkpoint, **overrides)


VIT = ViTFamily()


class _Single:
    """A family of one name, made by `register_backbone`."""

    def __init__(self, name, fn):
        self.name, self.fn = name, fn

    def names(self):
        return [self.name]

    def accepts(self, name):
        return name == self.name

    def create(self, name, *, img_size=None, num_classes=0, checkpoint=None, **overrides):
        if checkpoint is not None:
            raise UserError(
                f"backbone {name!r} is a plugin without checkpoint support; "
                "load weights with load_checkpoint(model, path)"
            )
        return self.fn(img_size=img_size, num_classes=num_classes, **overrides)


def register_backbone(name: str):
    """Decorator registering `fn(*, img_size=None, num_classes=0, **overrides) -> nn.Module` as `name`
    in this process. Packages register families through the `transferbench.backbones` entry point."""

    def wrap(fn):
        if name in _EXTRA or any(f.accepts(name) for f in _families()):
            raise ValueError(f"backbone {name!r} is registered twice")
        _EXTRA[name] = _Single(name, fn)
        return fn

    return wrap


def _families() -> list:
    """Installed families (entry points; the built-in grammar among them), then in-process ones."""
    return [f() if isinstance(f, type) else f for f in load_group("transferbench.backbones").values()] + list(
        _EXTRA.values()
    )


def list_backbones() -> list[str]:
    """The canonical names of every family (any valid grammar name works too)."""
    return [n for fam in _families() for n in fam.names()]


def find_family(name: str):
    for fam in _families():
        if fam.accepts(name):
            return fam
    raise _unknown(name)


def backbone_code(spec: str) -> tuple[str, ...]:
    """The modules whose code builds backbone `spec` (`NAME[@WEIGHTS]`), as roots of a fingerprint: its family's
    module (transferbench's ViT, timm:, py:, a plugin's), and what the family adds (a `py:` model's own module)."""
    name = model_name(spec)
    family = find_family(name)
    roots = (family.fn.__module__ if isinstance(family, _Single) else type(family).__module__,)
    if hasattr(family, "code_roots"):
        roots += tuple(family.code_roots(name))
    return roots


def parse_name(name: str, _raise: bool = True) -> dict:
    """Name -> VisionTransformer keyword arguments (architecture + default img_size)."""
    rep = name.endswith("_rep")
    name_ = name[:-4] if rep else name
    dtn = name_.endswith("_dtn")
    m = _NAME.fullmatch(name_[:-4] if dtn else name_)
    if not m or m["size"] not in SIZES or int(m["patch"]) < 1 or (m["stem"] or "") not in STEMS:
        raise _unknown(name) if _raise else KeyError(name)
    size = SIZES[m["size"]]
    return dict(
        img_size=size.img_size,
        patch_size=int(m["patch"]),
        embed_dim=size.embed_dim,
        depth=size.depth,
        num_heads=size.num_heads,
        mlp_dim=size.mlp_dim,
        stem=m["stem"] or "",
        dtn_layers=size.depth - 2 if dtn else 0,  # DTN paper: LN kept in the last 2 blocks
        rep_size=size.embed_dim if rep else 0,
    )  # big_vision rep_size=True: the model width


def _unknown(name: str) -> UnknownBackboneError:
    return UnknownBackboneError(
        f"unknown backbone {name!r}{close_matches(name, list_backbones())}; names follow {GRAMMAR} with size in "
        f"{'/'.join(SIZES)}, stem in {'/'.join(s for s in STEMS if s)} (see `transferbench list backbones`)"
    )


def create_backbone(name: str, *, img_size=None, num_classes: int = 0, checkpoint=None, **overrides) -> nn.Module:
    """Build backbone `name`; with `checkpoint` (transferbench/timm .safetensors, timm .pth, big_vision
    .npz) load its weights, resizing position embeddings when `img_size` differs from the checkpoint's.

    `overrides` go to VisionTransformer: pool ('tok'|'gap'), class_token, drop_rate, drop_path_rate,
    attn_drop_rate, dtn_layers, act ('gelu'|'gelu_tanh'), in_chans, rep_size, ...; and `posemb` ('big_vision' |
    'timm') to the loader: how the checkpoint's position embeddings are resampled (default: as its own code does).
    """
    return find_family(name).create(
        name, img_size=img_size, num_classes=num_classes, checkpoint=checkpoint, **overrides
    )


def _create_vit(name, *, img_size=None, num_classes=0, checkpoint=None, **overrides) -> nn.Module:
    from .checkpoint import load_checkpoint, read_checkpoint
    from .vit import VisionTransformer

    kwargs = parse_name(name)
    posemb = overrides.pop("posemb", None)  # how a checkpoint's position embeddings are resampled (load_checkpoint)
    ckpt = read_checkpoint(checkpoint) if checkpoint is not None else None
    if ckpt is not None:
        # What the weights fix but their shapes do not show (pool, cls token, activation) comes from the
        # checkpoint unless the caller overrides it; the rest is checked against the name when loading.
        kwargs.update({k: ckpt.config[k] for k in ("pool", "class_token", "act") if k in ckpt.config})
        if ckpt.config.get("rep_size"):  # a representation layer in the file comes along (only the head is dropped)
            kwargs["rep_size"] = ckpt.config["rep_size"]
        if ckpt.img_size is not None:
            kwargs["img_size"] = ckpt.img_size
    kwargs.update(overrides)
    if img_size is not None:
        kwargs["img_size"] = img_size
    model = VisionTransformer(num_classes=num_classes, name=name, **kwargs)
    if ckpt is not None:
        load_checkpoint(model, ckpt, posemb=posemb)
    return model


BACKBONE_COLUMNS = [
    "backbone",
    "width",
    "depth",
    "heads",
    "patch",
    "stem",
    "dtn blocks",
    "rep_size",
    "params (M, no head)",
]


def backbone_rows() -> list[list]:
    """`transferbench list backbones`: each registered name's shape and parameter count (built on the meta device)."""
    import torch

    rows = []
    for name in list_backbones():
        with torch.device("meta"):  # shapes only
            m = create_backbone(name)
        cfg = getattr(m, "config", {})
        rows.append(
            [
                name,
                cfg.get("embed_dim"),
                cfg.get("depth"),
                cfg.get("num_heads"),
                cfg.get("patch_size"),
                cfg.get("stem") or "-",
                cfg.get("dtn_layers"),
                cfg.get("rep_size") or "-",
                f"{sum(p.numel() for p in m.parameters()) / 1e6:.1f}",
            ]
        )
    return rows
