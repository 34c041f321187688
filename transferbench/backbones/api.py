"""What transferbench reads of a backbone: timm's Vision Transformer API, in one place.

Every backbone (the built-in ViT, `timm:` models, `py:` factories, plugin families) is an `nn.Module` that has

- `forward_features(x) -> (B, prefix + N, D)`: every token after the final norm, prefix tokens (class,
  registers) first, then the N patch tokens in row-major grid order;
- `forward_head(tokens, pre_logits=False)`: the pooled representation (`pre_logits=True`: what few-shot probes
  and LiT's locked tower read) or the logits;
- `reset_classifier(num_classes)`: a new head of `num_classes` outputs (0: none); VTAB's head is zeroed after it.

Tasks that read the patch grid also need

- `patch_embed.grid_size -> (h, w)` and `num_prefix_tokens -> int` (ADE20K's decoder, diagnostics);
- `forward_intermediates(x, indices=, norm=, output_fmt='NLC', intermediates_only=True)`: each asked-for block's
  patch tokens (prefix dropped), as timm returns them (ADE20K's `decoder_tokens: prenorm`, diagnostics);
- `set_input_size(img_size=(h, w))`, or a factory that builds at the size asked for, for another resolution
  (high-res fine-tuning at 384 px, ADE20K's 512 px crops) with the model's own position-embedding resampling;
- `blocks` (each block's parameters, the patch embedding's in `patch_embed`: per-block gradient norms), each
  `blocks[i].attn` timm's `Attention` (or the built-in ViT's) for the attention-map diagnostics (a model whose
  attention cannot be read has those measures skipped, with one line saying so);
- `embed_dim`: the width of the patch tokens (ADE20K's linear decoder).

`check_api` refuses a model without the first three in one line; `require` refuses, before any cell runs, a
model without what a task reads.
"""

from __future__ import annotations

from contextlib import contextmanager
from functools import partial

import torch
from torch import nn

from ..errors import UserError

FEATURE_API = ("forward_features", "forward_head", "reset_classifier")
DOCS = "docs/backbones.md#the-backbone-api"


def check_api(model, name: str, *, grid: bool = True) -> None:
    """One UserError naming what `model` lacks of timm's API (and, with `grid`, of a patch grid)."""
    if not isinstance(model, nn.Module):
        raise UserError(f"backbone {name!r} is a {type(model).__name__}, not a torch.nn.Module (see {DOCS})")
    missing = [attr for attr in FEATURE_API if not callable(getattr(model, attr, None))]
    if grid:
        missing += [] if patch_grid(model) else ["patch_embed.grid_size"]
        missing += [] if isinstance(getattr(model, "num_prefix_tokens", None), int) else ["num_prefix_tokens"]
    if missing:
        raise UserError(
            f"backbone {name!r} ({type(model).__name__}) lacks {', '.join(missing)}: transferbench takes a Vision "
            f"Transformer with timm's API (see {DOCS})"
        )


def patch_grid(model) -> tuple[int, int] | None:
    """`patch_embed.grid_size` as (h, w), or None where the model has no patch grid."""
    grid = getattr(getattr(model, "patch_embed", None), "grid_size", None)
    return tuple(int(g) for g in grid) if grid is not None and len(grid) == 2 else None


def patch_size(model) -> int | None:
    """The side of a (square) patch in pixels: `patch_embed.patch_size` (an int or timm's (h, w))."""
    p = getattr(getattr(model, "patch_embed", None), "patch_size", None)
    if isinstance(p, (tuple, list)):
        return int(p[0]) if len(p) == 2 and p[0] == p[1] else None
    return int(p) if isinstance(p, int) else None


def input_size(model) -> int | None:
    """The (square) input the model is built for, `patch_embed.img_size`; None where it does not say."""
    size = getattr(getattr(model, "patch_embed", None), "img_size", None)
    if isinstance(size, (tuple, list)):
        return int(size[0]) if len(size) == 2 and size[0] == size[1] else None
    return int(size) if isinstance(size, int) else None


def resize_input(model, img_size: int, name: str) -> str | None:
    """Make `model` take `img_size` px inputs through its own `set_input_size` (its own position-embedding
    resampling); returns 'set_input_size', or None when it already does. One UserError when it cannot."""
    if input_size(model) in (None, int(img_size)):
        return None
    if not callable(getattr(model, "set_input_size", None)):
        raise UserError(
            f"backbone {name!r} is built for {input_size(model)} px and has no set_input_size(img_size=) to take "
            f"{img_size} px: add one (timm's VisionTransformer has it) or run the task at {input_size(model)} px "
            f"(see {DOCS})"
        )
    model.set_input_size(img_size=(int(img_size), int(img_size)))
    return "set_input_size"


POOLS = {"tok": "token", "gap": "avg"}  # transferbench's pool names -> timm's global_pool


def pool_arguments(plain: nn.Module, pool: str) -> dict:
    """The model arguments that make `plain` (the model as built without them) pool as `pool` asks ('tok',
    'gap', or timm's own names). None where it already pools so (its own arrangement kept: EVA's fc_norm after
    the average); else timm's `global_pool`, and for an average the final norm kept before it (`fc_norm=False`,
    or EVA's `use_fc_norm=False`), as transferbench's ViT pools."""
    import inspect

    want = POOLS.get(pool, pool)
    if getattr(plain, "global_pool", None) == want:
        return {}
    out = {"global_pool": want}
    if want == "avg":
        params = inspect.signature(type(plain).__init__).parameters
        for key in ("fc_norm", "use_fc_norm"):
            if key in params:
                out[key] = False
                break
    return out


def attention_kind(model) -> str | None:
    """How `attention_maps` reads the model's attention: 'builtin' (transferbench's ViT), 'timm' (every block's
    `attn` is timm's `Attention`), or None (it cannot)."""
    blocks = getattr(model, "blocks", None)
    if blocks is None or len(blocks) == 0:
        return None
    attns = [getattr(b, "attn", None) for b in blocks]
    if all(hasattr(a, "capture") for a in attns):
        return "builtin"
    from timm.layers import Attention

    return "timm" if all(type(a) is Attention for a in attns) else None


@contextmanager
def attention_maps(model: nn.Module, fn):
    """While inside, every block of `model` calls `fn(block_index, probs)` with its softmax attention
    probabilities (B, heads, N, N). The built-in ViT computes them itself (`vit.attention_maps`); for timm's
    `Attention` they are recomputed from the block's input as its non-fused path does (qkv, q_norm/k_norm,
    scale, softmax; no mask), leaving the block's output as it was."""
    kind = attention_kind(model)
    if kind == "builtin":
        from .vit import attention_maps as builtin

        with builtin(model, fn):
            yield
        return
    if kind != "timm":
        raise ValueError(f"{type(model).__name__}: its attention maps cannot be read")
    handles = [b.attn.register_forward_pre_hook(partial(_timm_probs, i, fn)) for i, b in enumerate(model.blocks)]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def _timm_probs(index: int, fn, attn, args) -> None:
    x = args[0]
    B, N, _ = x.shape
    qkv = attn.qkv(x).reshape(B, N, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4)
    q, k = attn.q_norm(qkv[0]), attn.k_norm(qkv[1])
    fn(index, ((q * attn.scale) @ k.transpose(-2, -1)).float().softmax(dim=-1))


def capabilities(model) -> dict:
    """What of the grid API `model` has: a patch grid, forward_intermediates, attention maps, blocks (a
    sequence `blocks` and a `patch_embed` module: per-block gradient norms)."""
    return {
        "patch grid": patch_grid(model) is not None and isinstance(getattr(model, "num_prefix_tokens", None), int),
        "forward_intermediates": callable(getattr(model, "forward_intermediates", None)),
        "attention maps": attention_kind(model) is not None,
        "blocks": len(getattr(model, "blocks", ())) > 0 and isinstance(getattr(model, "patch_embed", None), nn.Module),
    }


def require(name: str, task: str, needs: dict[str, str], *, img_size: int | None = None) -> nn.Module:
    """Refuse, in one line, backbone `name` for `task` when its model lacks one of `needs` (a capability of
    `capabilities` -> what the task reads it for). The model is built on the meta device (no weights) and
    returned for further checks."""
    from .registry import create_backbone

    with torch.device("meta"):
        model = create_backbone(name, **({"img_size": img_size} if img_size else {}))
    have = capabilities(model)
    missing = [f"{what} ({why})" for what, why in needs.items() if not have[what]]
    if missing:
        raise UserError(
            f"backbone {name!r} ({type(model).__name__}) cannot run {task}: it lacks {'; '.join(missing)} (see {DOCS})"
        )
    return model
