"""`timm:<model>[.<tag>][@<weights file>]`: any timm Vision Transformer as a backbone.

The model is built by `timm.create_model(..., pretrained=False)` (never a download). Its weights come from the
file after `@`, or, for a tagged name without one, from the local Hugging Face cache where the tag's weights were
fetched before (`huggingface_hub.try_to_load_from_cache`: offline). A name without a tag and without a file is
randomly initialised, like the registry's own names.

What the weights expect comes from timm's `pretrained_cfg` for the tag: the pixel normalisation (mean and std:
`pixels=auto` resolves to it, so it is in every cell's key), and the input size, crop fraction and interpolation,
recorded in the backbone's reference.

A model is accepted when it has timm's feature API (`forward_features`, `forward_head(x, pre_logits=True)`,
`reset_classifier`) and a patch grid (`patch_embed.grid_size`, `num_prefix_tokens`); anything else is refused in
one line naming what it lacks.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

from ..errors import UserError, close_matches
from .api import check_api, pool_arguments
from .checkpoint import read_state_dict

PREFIX = "timm:"
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", "open_clip_pytorch_model.bin")


def split(name: str) -> tuple[str, str]:
    """'timm:vit_base_patch16_224.augreg_in21k' -> ('vit_base_patch16_224', 'augreg_in21k'); no tag: ''."""
    arch, _, tag = name[len(PREFIX) :].partition(".")
    return arch, tag


def check_name(name: str) -> None:
    """One UserError for a model timm does not have, or a tag it does not know for that model."""
    import timm

    arch, tag = split(name)
    if not arch:
        raise UserError(f"backbone {name!r}: give a timm model name after 'timm:', e.g. timm:vit_base_patch16_224")
    if not timm.is_model(arch):
        vits = timm.list_models("*vit*") + timm.list_models("*deit*") + timm.list_models("*eva*")
        raise UserError(f"backbone {name!r}: timm {timm.__version__} has no model {arch!r}{close_matches(arch, vits)}")
    if tag and f"{arch}.{tag}" not in timm.list_pretrained(f"{arch}.*"):
        tags = [t.partition(".")[2] for t in timm.list_pretrained(f"{arch}.*")]
        raise UserError(
            f"backbone {name!r}: timm {timm.__version__} knows no tag {tag!r} for {arch}{close_matches(tag, tags)}"
            + (f"; its tags: {', '.join(tags)}" if tags else "")
        )


def pretrained_cfg(name: str) -> dict:
    """timm's pretrained_cfg for the tag (its default tag's for a name without one)."""
    import timm

    arch, tag = split(name)
    cfg = timm.models.get_pretrained_cfg(f"{arch}.{tag}" if tag else arch)
    return cfg.to_dict() if cfg is not None else {}


def preprocessing(name: str) -> dict:
    """What the tag's weights expect: pixels (data.pixels form), input size, crop fraction, interpolation, and
    the position-embedding resampling a timm model does (its own: 'timm')."""
    return {"posemb": "timm", **preprocessing_of(pretrained_cfg(name))}


def preprocessing_of(cfg: dict) -> dict:
    """A pretrained_cfg's pixels (data.pixels form; '' where it states none), input size, crop fraction and
    interpolation."""
    from ..data.pixels import PRESETS

    mean, std = tuple(cfg.get("mean", ())), tuple(cfg.get("std", ()))
    pixels = next((k for k, (m, s) in PRESETS.items() if _close(m, mean) and _close(s, std)), "")
    if not pixels and len(mean) == 3 and len(std) == 3:
        pixels = f"mean={','.join(f'{v:g}' for v in mean)}/std={','.join(f'{v:g}' for v in std)}"
    out = {"pixels": pixels}
    if cfg.get("input_size"):
        out["input_size"] = int(cfg["input_size"][-1])
    for key in ("crop_pct", "interpolation"):
        if cfg.get(key) is not None:
            out[key] = cfg[key]
    return out


def _close(a, b) -> bool:
    return len(a) == len(b) == 3 and all(abs(x - y) < 1e-4 for x, y in zip(a, b))


def hub_cache() -> Path:
    """Where huggingface_hub keeps downloads: $HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    return Path(os.environ.get("HF_HOME") or "~/.cache/huggingface").expanduser() / "hub"


def cached_weights(name: str) -> Path:
    """The tag's weights file in the local Hugging Face cache; one UserError saying where it looked and how to
    fetch it on a connected machine when it is not there."""
    from huggingface_hub import try_to_load_from_cache

    cfg = pretrained_cfg(name)
    repo = cfg.get("hf_hub_id")
    if not repo:
        raise UserError(
            f"backbone {name!r}: timm states no Hugging Face repository for this tag; give the weights as a file: "
            f"{name}@PATH"
        )
    where = hub_cache()
    for filename in ([cfg["hf_hub_filename"]] if cfg.get("hf_hub_filename") else []) + list(WEIGHT_FILES):
        found = try_to_load_from_cache(repo, filename, cache_dir=str(where))
        if isinstance(found, str) and Path(found).is_file():
            return Path(found)
    arch, tag = split(name)
    raise UserError(
        f"backbone {name!r}: the weights of {repo} are not in the Hugging Face cache {where} (searched $HF_HUB_CACHE, "
        "$HF_HOME/hub, ~/.cache/huggingface/hub; nothing is downloaded at run time); on a connected machine run "
        f"python -c \"import timm; timm.create_model('{arch}.{tag}', pretrained=True)\" and copy the cache over, "
        f"or give the file: {name}@PATH"
    )


def load_weights(model, path, name: str) -> None:
    """The file's weights into `model`, through the model module's own `checkpoint_filter_fn` where timm has one
    (its key conversions and position-embedding resampling to the model's grid); a classifier of another shape
    is left as the model made it (a new head). Keys that do not fit are one UserError."""
    sd = read_state_dict(path)  # one CheckpointError line for a file that is not weights
    module = sys.modules.get(type(model).__module__)
    filter_fn = getattr(module, "checkpoint_filter_fn", None)
    before = tuple(sd["pos_embed"].shape) if isinstance(sd.get("pos_embed"), torch.Tensor) else None
    if filter_fn is not None:
        sd = filter_fn(sd, model)
    after = tuple(sd["pos_embed"].shape) if isinstance(sd.get("pos_embed"), torch.Tensor) else None
    model.posemb_resample = "checkpoint_filter_fn" if before != after else None  # recorded as info.posemb_resample
    own = model.state_dict()
    head = str(getattr(model, "pretrained_cfg", {}).get("classifier") or "head")
    heads = {k for k in sd if k.startswith(head + ".") and (k not in own or own[k].shape != sd[k].shape)}
    sd = {k: v for k, v in sd.items() if k not in heads}
    missing, unexpected = [], []
    shapes = [k for k, v in sd.items() if k in own and own[k].shape != v.shape]
    if not shapes:
        missing, unexpected = model.load_state_dict(sd, strict=False)
        missing = [k for k in missing if not k.startswith(head + ".")]
    if shapes or missing or unexpected:
        raise UserError(
            f"backbone {name!r}: {path} does not fit its {type(model).__name__}: "
            + "; ".join(
                f"{what} {', '.join(keys[:4])}{' …' if len(keys) > 4 else ''}"
                for what, keys in (("other shapes", shapes), ("missing", missing), ("unexpected", unexpected))
                if keys
            )
        )


class TimmFamily:
    """Every `timm:` name (registered as entry point `timm`)."""

    def names(self) -> list[str]:
        return []  # any timm ViT: `timm:<model>[.<tag>]`; `timm.list_models('*vit*')` lists them

    def accepts(self, name: str) -> bool:
        return name.startswith(PREFIX)

    def resolve(self, spec: str, name: str, checkpoint: str):
        """The reference of `timm:NAME[.TAG][@FILE]`: the weights file (given, or the tag's in the HF cache) and
        its sha256, the tag's pixel normalisation and preprocessing."""
        import timm

        from ..cell import RANDOM_INIT, BackboneRef
        from ..hashing import file_sha256

        check_name(name)
        with torch.device("meta"):  # the API check without weights in memory
            check_api(timm.create_model(split(name)[0], pretrained=False), name)
        pre = preprocessing(name)
        if not checkpoint and split(name)[1]:
            path = cached_weights(name)
        elif checkpoint:
            path = Path(checkpoint).expanduser()
            if not path.is_file():
                raise UserError(f"backbone {spec!r}: weights file {checkpoint} does not exist")
        else:
            return BackboneRef(spec, name, None, RANDOM_INIT, pre["pixels"], tuple(sorted(pre.items())))
        return BackboneRef(spec, name, str(path), file_sha256(path), pre["pixels"], tuple(sorted(pre.items())))

    def create(self, name, *, img_size=None, num_classes=0, checkpoint=None, **overrides):
        import timm

        check_name(name)
        posemb = overrides.pop("posemb", None)
        if posemb not in (None, "timm"):
            raise UserError(f"backbone {name!r}: timm models resample position embeddings as timm does (posemb=timm)")
        arch, _ = split(name)
        kwargs = {"img_size": img_size} if img_size is not None else {}
        if "pool" in overrides:  # ours: tok | gap -> timm's global_pool (+ where the final norm goes)
            with torch.device("meta"):
                kwargs.update(pool_arguments(timm.create_model(arch, pretrained=False), overrides.pop("pool")))
        try:
            model = timm.create_model(arch, pretrained=False, num_classes=num_classes, **kwargs, **overrides)
        except TypeError as e:
            raise UserError(f"backbone {name!r}: timm's {arch} does not take {e}") from None
        check_api(model, name)
        if checkpoint is not None:
            load_weights(model, checkpoint, name)
        model.name = name
        return model


TIMM = TimmFamily()
