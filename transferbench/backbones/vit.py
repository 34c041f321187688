"""Vision Transformer with pluggable stems (Dual PatchNorm + ablations) and Dynamic Token Normalization.

Module names and the timm API (`forward_features`, `forward_head`, `reset_classifier`) match
timm's VisionTransformer, so its state dicts load after one reshape of the conv stem.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial

import torch
import torch.nn.functional as F
from timm.layers import DropPath, trunc_normal_
from torch import nn

from .dtn import DynamicTokenNorm
from .stems import NORM_EPS, STEMS, PatchEmbed

ACTIVATIONS = {
    "gelu": partial(nn.GELU, approximate="none"),  # timm
    "gelu_tanh": partial(nn.GELU, approximate="tanh"),
}  # flax's nn.gelu, so big_vision weights


def to_2tuple(v: int | tuple[int, int]) -> tuple[int, int]:
    return (int(v), int(v)) if isinstance(v, int) else (int(v[0]), int(v[1]))


class Attention(nn.Module):
    """Multi-head self-attention through `scaled_dot_product_attention`. While `capture` is set (see
    `attention_maps`), the softmax probabilities are formed explicitly and passed to it; unset, the forward is
    the fused kernel alone."""

    capture: Callable[[torch.Tensor], None] | None = None

    def __init__(self, dim: int, num_heads: int, attn_drop: float = 0.0, proj_drop: float = 0.0):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"embed_dim {dim} is not divisible by num_heads {num_heads}")
        self.num_heads = num_heads
        self.scale = (dim // num_heads) ** -0.5
        self.qkv = nn.Linear(dim, 3 * dim)  # fused q, k, v
        self.attn_drop = attn_drop
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, N, C = x.shape
        q, k, v = self.qkv(x).view(B, N, 3, self.num_heads, C // self.num_heads).permute(2, 0, 3, 1, 4)
        if self.capture is None:
            x = F.scaled_dot_product_attention(q, k, v, dropout_p=self.attn_drop if self.training else 0.0)
        else:
            probs = ((q * self.scale) @ k.transpose(-2, -1)).softmax(dim=-1)  # (B, heads, N queries, N keys)
            self.capture(probs)
            x = F.dropout(probs, self.attn_drop, self.training) @ v
        return self.proj_drop(self.proj(x.transpose(1, 2).reshape(B, N, C)))


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int, act: str = "gelu", drop: float = 0.0):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = ACTIVATIONS[act]()
        self.fc2 = nn.Linear(hidden, dim)
        self.drop = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.fc2(self.drop(self.act(self.fc1(x)))))


class Block(nn.Module):
    """Pre-norm transformer block; `norm_layer` is LayerNorm, or DynamicTokenNorm in DTN blocks."""

    def __init__(self, dim, num_heads, mlp_dim, norm_layer, act="gelu", drop=0.0, attn_drop=0.0, drop_path=0.0):
        super().__init__()
        self.norm1 = norm_layer(dim)
        self.attn = Attention(dim, num_heads, attn_drop=attn_drop, proj_drop=drop)
        self.drop_path1 = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = norm_layer(dim)
        self.mlp = Mlp(dim, mlp_dim, act=act, drop=drop)
        self.drop_path2 = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop_path1(self.attn(self.norm1(x)))
        return x + self.drop_path2(self.mlp(self.norm2(x)))


def _check_config(img_size, patch_size, stem, pool, class_token, dtn_layers, depth, act) -> None:
    """A ViT configuration that cannot be built, as one ValueError saying what to pass instead."""
    if img_size[0] % patch_size or img_size[1] % patch_size:
        fit = tuple(-(-s // patch_size) * patch_size for s in img_size)
        raise ValueError(
            f"img_size {img_size} is not a multiple of patch size {patch_size}; "
            f"pass img_size={fit if fit[0] != fit[1] else fit[0]}"
        )
    if stem not in STEMS:
        raise ValueError(f"unknown stem {stem!r}; choose one of {sorted(STEMS)}")
    if pool not in ("tok", "gap"):
        raise ValueError(f"unknown pool {pool!r}; choose 'tok' (cls token) or 'gap' (mean of patch tokens)")
    if pool == "tok" and not class_token:
        raise ValueError("pool='tok' needs class_token=True; use pool='gap' for a model without a cls token")
    if not 0 <= dtn_layers <= depth:
        raise ValueError(f"dtn_layers={dtn_layers} must lie in [0, depth={depth}]")
    if act not in ACTIVATIONS:
        raise ValueError(f"unknown act {act!r}; choose one of {sorted(ACTIVATIONS)}")


# the constructor's arguments that make up a model's `config`, in its order
CONFIG = (
    "patch_size",
    "in_chans",
    "embed_dim",
    "depth",
    "num_heads",
    "mlp_dim",
    "stem",
    "dtn_layers",
    "pool",
    "class_token",
    "act",
    "dtn_eps",
    "rep_size",
)


class VisionTransformer(nn.Module):
    """ViT (Dosovitskiy et al.) whose stem and normaliser are the subject of the benchmark.

    stem: a key of `stems.STEMS` ('' baseline, 'dpn', 'pre', 'post', 'postpos', 'rms', 'nolearn',
    'onlylearn'). dtn_layers: the first `dtn_layers` blocks use DynamicTokenNorm and see patch
    tokens only; the cls token joins right after them (DTN paper App. A.1).
    pool: 'tok' (cls token) or 'gap' (mean of patch tokens after the final norm, as big_vision).
    rep_size: width of big_vision's representation layer (`rep_size`; a dense layer + tanh between the pooled
    token and the head, named `pre_logits`, as old timm checkpoints name it too); 0: none.
    """

    def __init__(
        self,
        *,
        img_size=224,
        patch_size=16,
        in_chans=3,
        num_classes=0,
        embed_dim=768,
        depth=12,
        num_heads=12,
        mlp_dim=None,
        stem="",
        dtn_layers=0,
        pool="tok",
        class_token=True,
        act="gelu",
        drop_rate=0.0,
        attn_drop_rate=0.0,
        drop_path_rate=0.0,
        dtn_eps=1e-5,
        rep_size=0,
        name=None,
    ):
        super().__init__()
        img_size = to_2tuple(img_size)
        _check_config(img_size, patch_size, stem, pool, class_token, dtn_layers, depth, act)
        mlp_dim, rep_size = mlp_dim or 4 * embed_dim, int(rep_size)
        self.name = name
        given = locals()
        self.config = {k: given[k] for k in CONFIG}  # what rebuilds this model (its architecture)
        self.img_size, self.patch_size = img_size, patch_size
        self.grid_size = (img_size[0] // patch_size, img_size[1] // patch_size)
        self.num_classes, self.pool, self.dtn_layers = num_classes, pool, dtn_layers
        self.embed_dim = embed_dim
        self.num_features = rep_size or embed_dim  # what the head sees
        self.num_prefix_tokens = 1 if class_token else 0
        num_patches = self.grid_size[0] * self.grid_size[1]

        self.patch_embed = PatchEmbed(patch_size, in_chans, embed_dim, stem)
        self.patch_embed.img_size, self.patch_embed.grid_size = img_size, self.grid_size  # timm's PatchEmbed API
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim)) if class_token else None
        self.pos_embed = nn.Parameter(torch.zeros(1, self.num_prefix_tokens + num_patches, embed_dim))
        self.pos_drop = nn.Dropout(drop_rate)
        ln = partial(nn.LayerNorm, eps=NORM_EPS)
        dtn = partial(DynamicTokenNorm, num_heads=num_heads, grid=self.grid_size, eps=dtn_eps)
        dpr = [drop_path_rate * i / max(depth - 1, 1) for i in range(depth)]  # stochastic depth grows with depth
        norms = [dtn if i < dtn_layers else ln for i in range(depth)]
        block = partial(Block, embed_dim, num_heads, mlp_dim, act=act, drop=drop_rate, attn_drop=attn_drop_rate)
        self.blocks = nn.Sequential(*[block(norms[i], drop_path=dpr[i]) for i in range(depth)])
        self.norm = ln(embed_dim)
        self.pre_logits = (
            nn.Sequential(OrderedDict(fc=nn.Linear(embed_dim, rep_size), act=nn.Tanh())) if rep_size else nn.Identity()
        )
        self.head_drop = nn.Dropout(drop_rate)
        self.head = nn.Linear(self.num_features, num_classes) if num_classes else nn.Identity()
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        for m in self.modules():
            if isinstance(m, nn.Linear):
                trunc_normal_(m.weight, std=0.02)
                nn.init.zeros_(m.bias)
        trunc_normal_(self.pos_embed, std=0.02)
        if self.cls_token is not None:
            nn.init.normal_(self.cls_token, std=1e-6)
        if isinstance(self.head, nn.Linear):  # zero-init head, as big_vision and the VTAB protocol
            nn.init.zeros_(self.head.weight)

    def reset_classifier(self, num_classes: int, bias: float = 0.0) -> None:
        """New zero-initialised head (timm's name for it; big_vision's `head_zeroinit`), its bias `bias`
        (AugReg pretraining: `init_head_bias = -6.9`). The representation layer stays."""
        self.num_classes = num_classes
        ref = self.pos_embed
        self.head = (
            nn.Linear(self.num_features, num_classes, device=ref.device, dtype=ref.dtype)
            if num_classes
            else nn.Identity()
        )
        if num_classes:
            nn.init.zeros_(self.head.weight)
            nn.init.constant_(self.head.bias, float(bias))

    @property
    def dtn_norms(self) -> list[DynamicTokenNorm]:
        return [m for m in self.modules() if isinstance(m, DynamicTokenNorm)]

    def _embed(self, x: torch.Tensor) -> torch.Tensor:
        if tuple(x.shape[-2:]) != self.img_size:
            raise ValueError(
                f"input is {tuple(x.shape[-2:])} px but this backbone was built for {self.img_size}; "
                f"resize the input or create_backbone(..., img_size={tuple(x.shape[-2:])})"
            )
        x = self.patch_embed(x) + self.pos_embed[:, self.num_prefix_tokens :]
        if self.patch_embed.norm_after_pos:  # 'postpos' stem: LN after adding the position embedding
            x = self.patch_embed.norm(x)
        return self.pos_drop(x)

    def _run_blocks(self, x: torch.Tensor, last: int | None = None) -> Iterator[torch.Tensor]:
        """Each block's output tokens in turn, up to block `last`; the cls token joins after the DTN blocks
        (the blocks before it see patch tokens only)."""
        for i, block in enumerate(self.blocks[: None if last is None else last + 1]):
            if i == self.dtn_layers:
                x = self._prepend_cls(x)
            x = block(x)
            if i + 1 == len(self.blocks) == self.dtn_layers:
                x = self._prepend_cls(x)
            yield x

    def prefix_tokens_at(self, index: int) -> int:
        """Prefix (cls) tokens in block `index`'s output: none in a DTN block's that precedes the cls token."""
        return self.num_prefix_tokens if index >= self.dtn_layers or index + 1 == len(self.blocks) else 0

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Images (B, C, H, W), pixels as the checkpoint was trained (big_vision: [-1, 1]) ->
        tokens (B, prefix + N, D) after the final norm."""
        for x in self._run_blocks(self._embed(x)):  # noqa: B007, B020 - keeps the last block's output only
            pass
        return self.norm(x)

    def forward_intermediates(
        self,
        x: torch.Tensor,
        indices: int | list[int] | None = None,
        return_prefix_tokens: bool = False,
        norm: bool = False,
        stop_early: bool = False,
        output_fmt: str = "NCHW",
        intermediates_only: bool = False,
    ):
        """timm's API: the outputs of the blocks in `indices` (None: all; an int n: the last n; a list: those
        indices, negative from the end), optionally through the final norm (`norm`), as (B, D, h, w) maps
        ('NCHW') or (B, N, D) patch tokens ('NLC'); with `return_prefix_tokens` each is (patch, prefix) where
        prefix is (B, prefix, D) (no tokens for a DTN block before the cls token joins), and, as in timm, a
        model without prefix tokens (no cls token) returns the plain patch tensors. Returns
        (final normed tokens, intermediates), or the intermediates alone with `intermediates_only`;
        `stop_early` stops after the last block asked for (the final tokens are then that block's, normed,
        as in timm)."""
        from timm.models._features import feature_take_indices

        if output_fmt not in ("NCHW", "NLC"):
            raise ValueError(f"output_fmt must be 'NCHW' or 'NLC', got {output_fmt!r}")
        take, last = feature_take_indices(len(self.blocks), indices)
        B = x.shape[0]
        gh, gw = self.grid_size
        pairs = return_prefix_tokens and self.num_prefix_tokens > 0  # timm: plain tensors for a model without any
        out = []
        for i, x in enumerate(self._run_blocks(self._embed(x), last if stop_early else None)):  # noqa: B020 - x is read once, first
            if i not in take:
                continue
            y = self.norm(x) if norm else x
            p = self.prefix_tokens_at(i)
            patches = y[:, p:]
            if output_fmt == "NCHW":
                patches = patches.reshape(B, gh, gw, -1).permute(0, 3, 1, 2).contiguous()
            out.append((patches, y[:, :p]) if pairs else patches)
        if intermediates_only:
            return out
        return self.norm(x), out

    def _prepend_cls(self, x: torch.Tensor) -> torch.Tensor:
        if self.cls_token is None:
            return x
        cls = (self.cls_token + self.pos_embed[:, :1]).to(x.dtype)
        return torch.cat([cls.expand(x.shape[0], -1, -1), x], dim=1)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """Pooled token -> representation layer (where there is one) -> head; `pre_logits`: the representation
        (big_vision's `out['pre_logits']`, what its few-shot evaluator probes)."""
        x = x[:, 0] if self.pool == "tok" else x[:, self.num_prefix_tokens :].mean(dim=1)
        x = self.head_drop(self.pre_logits(x))
        return x if pre_logits else self.head(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))


@contextmanager
def attention_maps(model: nn.Module, fn: Callable[[int, torch.Tensor], None] | None = None):
    """Softmax attention probabilities of every block of `model` while the block runs. With `fn`, each
    block's attention module calls `fn(block_index, probs)`, probs (B, heads, N queries, N keys) with rows
    summing to 1 (reduce them there: at b16, storing every layer's costs 1.8 MB per image); without, the
    context yields a list that collects `(block_index, probs)`. Outside the context the blocks run the fused
    kernel again: no cost when unused.

        with attention_maps(model) as maps:
            model(x)
        layer, probs = maps[0]
    """
    collected: list = []
    store = fn or (lambda i, p: collected.append((i, p.detach())))
    attns = [b.attn for b in model.blocks]
    try:
        for i, a in enumerate(attns):
            a.capture = partial(store, i)
        yield collected
    finally:
        for a in attns:
            a.capture = None
