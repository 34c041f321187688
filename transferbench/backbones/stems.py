"""Patch-embedding stems: the ViT paper's patchify->dense, and Dual PatchNorm with its ablations.

Dual PatchNorm (Kumar et al. 2023, eq. 3): x = LN(Dense(LN(patches))). Table 6 ablates where the
norms go and what they learn; each row is one entry of STEMS below.
"""

from __future__ import annotations

import torch
from einops.layers.torch import Rearrange
from torch import nn

NORM_EPS = 1e-6  # timm's and big_vision's (flax) LayerNorm epsilon; weights move between them exactly


class Affine(nn.Module):
    """'onlylearn' (DPN Table 6): LayerNorm's learnable scale and shift without the standardisation."""

    def __init__(self, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight + self.bias


def _norm(kind: str | None, dim: int) -> nn.Module:
    if kind is None:
        return nn.Identity()
    if kind == "ln":
        return nn.LayerNorm(dim, eps=NORM_EPS)
    if kind == "ln_noaffine":
        return nn.LayerNorm(dim, eps=NORM_EPS, elementwise_affine=False)
    if kind == "rms":
        return nn.RMSNorm(dim, eps=NORM_EPS)
    if kind == "affine":
        return Affine(dim)
    raise ValueError(f"unknown stem norm kind {kind!r}")


# stem suffix -> (norm on the p*p*3 patch pixels, norm on the D-dim embedding, description)
STEMS: dict[str, tuple[str | None, str | None, str]] = {
    "": (None, None, "patchify -> dense (ViT baseline)"),
    "dpn": ("ln", "ln", "LN -> dense -> LN (Dual PatchNorm)"),
    "pre": ("ln", None, "LN -> dense"),
    "post": (None, "ln", "dense -> LN"),
    "postpos": (None, "ln", "dense -> +pos-emb -> LN"),
    "rms": ("rms", "rms", "RMSNorm -> dense -> RMSNorm"),
    "nolearn": ("ln_noaffine", "ln_noaffine", "LN without scale/shift on both sides"),
    "onlylearn": ("affine", "affine", "scale/shift without standardisation on both sides"),
}


class PatchEmbed(nn.Module):
    """Patchify (einops, (p1 p2 c) order) -> [norm_pre] -> Linear -> [norm].

    With no norms this is numerically timm's conv stem: conv weight (D, C, p, p) maps to
    `proj.weight` by `permute(0, 2, 3, 1).flatten(1)`. For the 'postpos' stem `norm` is applied by
    the ViT after the position embedding is added (`norm_after_pos`).
    """

    def __init__(self, patch_size: int, in_chans: int, embed_dim: int, stem: str = ""):
        super().__init__()
        pre, post, _ = STEMS[stem]
        patch_dim = patch_size * patch_size * in_chans
        self.patch_size = patch_size
        self.norm_after_pos = stem == "postpos"
        self.patchify = Rearrange("b c (h p1) (w p2) -> b (h w) (p1 p2 c)", p1=patch_size, p2=patch_size)
        self.norm_pre = _norm(pre, patch_dim)
        self.proj = nn.Linear(patch_dim, embed_dim)
        self.norm = _norm(post, embed_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.proj(self.norm_pre(self.patchify(x)))
        return x if self.norm_after_pos else self.norm(x)
