"""What the seed papers measure inside a ViT (docs/diagnostics.md), as functions of tensors:

- patch cosine similarity (over-smoothing): mean over i != j of cos(h_i, h_j) over a layer's patch tokens,
  computed as (||sum_i u_i||^2 - N) / (N (N - 1)) with u_i = h_i / ||h_i||: O(N D), not O(N^2 D);
- attention smoothness (the over-smoothing slides' S(h_i) in R^n): the std of each patch query's softmax
  attention row over the n patch keys (the cls query row and cls key column left out; the row is not
  renormalised), averaged over heads and queries; a uniform row has std 0. `tokens='all'` keeps every query and key;
- mean attention distance per head (ViT paper Fig. 7, ConViT): sum_j A_ij ||pos_i - pos_j||, over patch
  queries and patch keys (the cls token has no position; rows are renormalised over the patch keys), averaged
  over queries; in patches as the DTN paper reports it and in pixels (patches x patch size);
- DPN's first LayerNorm scale (p*p*3 weights in the stem's (p1 p2 c) order) as three p x p maps;
- DTN per norm and head: sigmoid(mix_mean), sigmoid(mix_var) and the effective width of the positional kernel
  P^h (eq. 7): its mean distance sum_s P_ts ||pos_t - pos_s|| in pixels, averaged over target tokens.

`Probe` runs a backbone over image batches and keeps the per-image values of every layer: one forward through
`forward_intermediates` with `attention_maps` reducing each layer's probabilities as they are made.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..settings.choices import ATTN_STD_TOKENS


def patch_cosine(tokens: torch.Tensor) -> torch.Tensor:
    """(B, N, D) patch tokens -> (B,) mean pairwise cosine similarity over i != j."""
    n = tokens.shape[1]
    if n < 2:
        raise ValueError("patch_cosine needs at least 2 tokens")
    u = F.normalize(tokens.float(), dim=-1)
    total = u.sum(dim=1).pow(2).sum(dim=-1)  # sum over all i, j of u_i . u_j
    return (total - u.pow(2).sum(dim=(1, 2))) / (n * (n - 1))  # minus the diagonal (1 per nonzero token)


def token_norm(tokens: torch.Tensor) -> torch.Tensor:
    """(B, N, D) -> (B,) mean L2 norm of the tokens."""
    return tokens.float().norm(dim=-1).mean(dim=1)


def attention_row_std(probs: torch.Tensor, prefix: int = 0) -> torch.Tensor:
    """(B, H, prefix + N, prefix + N) attention probabilities -> (B,) population std of each patch query's row
    over the N patch keys, averaged over heads and patch queries (`prefix` 0: every query and key)."""
    return probs[..., prefix:, prefix:].float().std(dim=-1, unbiased=False).mean(dim=(1, 2))


@lru_cache(maxsize=16)
def _grid_distances(gh: int, gw: int, patch: float, device: str) -> torch.Tensor:
    ys, xs = torch.meshgrid(torch.arange(gh), torch.arange(gw), indexing="ij")
    pos = torch.stack([ys.flatten(), xs.flatten()], dim=-1).double() * patch
    return torch.cdist(pos, pos).float().to(device)


def grid_distances(grid: tuple[int, int], patch_size: float = 1.0, device="cpu") -> torch.Tensor:
    """(N, N) Euclidean distances between the centres of a row-major grid's patches, in pixels."""
    return _grid_distances(int(grid[0]), int(grid[1]), float(patch_size), str(device))


def attention_distance(
    probs: torch.Tensor, grid: tuple[int, int], patch_size: float = 1.0, prefix: int = 0
) -> torch.Tensor:
    """(B, H, prefix + N, prefix + N) probabilities on a grid of N patches -> (B, H) mean attention distance in
    pixels per head: over patch queries i, sum_j A_ij ||pos_i - pos_j|| / sum_j A_ij over patch keys j."""
    a = probs[..., prefix:, prefix:].float()
    d = grid_distances(grid, patch_size, a.device)
    if a.shape[-1] != d.shape[0]:
        raise ValueError(f"attention over {a.shape[-1]} patch keys but the grid {tuple(grid)} has {d.shape[0]} patches")
    mass = a.sum(dim=-1).clamp_min(torch.finfo(a.dtype).tiny)
    return (torch.einsum("bhij,ij->bhi", a, d) / mass).mean(dim=-1)


def stem_scale_maps(model: nn.Module) -> torch.Tensor | None:
    """The scale of the norm on the patch pixels (DPN's first LayerNorm) as (C, p, p) maps, or None for a stem
    without a learnable one. The stem flattens patches in (p1 p2 c) order, so weight[(y * p + x) * C + c]
    scales pixel (y, x) of channel c."""
    pe = getattr(model, "patch_embed", None)
    w = getattr(getattr(pe, "norm_pre", None), "weight", None)
    if w is None:
        return None
    p, c = pe.patch_size, w.numel() // (pe.patch_size**2)
    return w.detach().float().cpu().reshape(p, p, c).permute(2, 0, 1)


def dtn_statistics(model: nn.Module) -> list[dict]:
    """Per DynamicTokenNorm of `model` (block order; norm1 then norm2): its name, sigmoid(mix_mean),
    sigmoid(mix_var) and the positional kernel's effective width in pixels, each per head."""
    from .dtn import DynamicTokenNorm

    patch = float(getattr(model, "patch_size", 1))
    out = []
    for name, m in model.named_modules():
        if isinstance(m, DynamicTokenNorm):
            with torch.no_grad():
                width = attention_distance(m.positional_weights()[None], m.grid, patch)[0]
            out.append(
                {
                    "name": name.removeprefix("blocks."),
                    "lambda_mean": torch.sigmoid(m.mix_mean).tolist(),
                    "lambda_var": torch.sigmoid(m.mix_var).tolist(),
                    "width": width.tolist(),
                }
            )
    return out


def dtn_kernel_maps(model: nn.Module) -> list[dict]:
    """Per DynamicTokenNorm: the positional kernel P^h of each head as an (h, w) map of the weights the
    centre token gives every position (DTN Figs. 7-8: how far and in which directions it mixes)."""
    from .dtn import DynamicTokenNorm

    out = []
    for name, m in model.named_modules():
        if isinstance(m, DynamicTokenNorm):
            gh, gw = m.grid
            centre = (gh // 2) * gw + gw // 2
            with torch.no_grad():
                maps = m.positional_weights()[:, centre].reshape(-1, gh, gw)
            out.append(
                {
                    "name": name.removeprefix("blocks."),
                    "centre": [gh // 2, gw // 2],
                    "maps": maps.float().cpu().tolist(),
                }
            )
    return out


def weight_measures(model: nn.Module) -> dict:
    """What the weights alone show: DPN's stem scale maps, DTN's mixing weights, kernel widths and kernels."""
    maps = stem_scale_maps(model)
    return {
        "stem_scale_maps": None if maps is None else maps.tolist(),
        "dtn": dtn_statistics(model),
        "dtn_kernels": dtn_kernel_maps(model),
    }


def dtn_lambdas(model: nn.Module) -> list[dict]:
    """sigmoid(mix_mean) and sigmoid(mix_var) per head of every DynamicTokenNorm (the λ of DTN Fig. 4)."""
    from .dtn import DynamicTokenNorm

    return [
        {
            "name": n.removeprefix("blocks."),
            "lambda_mean": torch.sigmoid(m.mix_mean.detach()).tolist(),
            "lambda_var": torch.sigmoid(m.mix_var.detach()).tolist(),
        }
        for n, m in model.named_modules()
        if isinstance(m, DynamicTokenNorm)
    ]


class TrainingLog:
    """What upstream training shows and the final weights do not (DPN Fig. 2, DTN Fig. 4), gathered by an
    `on_step` hook of the training loop (after the backward, before clipping):

    - `grad_norm_last`: per block, the mean L2 norm of its parameter gradients over the last `last` steps
      (DPN Fig. 2: the last 1,000 steps of upstream training), and `embed_grad_norm_last`, the patch embedding's;
    - `embed_grad_norm`: the patch embedding's gradient norm over all of training, averaged in `points` bins;
    - `dtn_lambda`: DTN's λ per norm and head after `step` updates, at `points` evenly spaced steps (the hook
      runs before each step's update, so entry s holds the weights after s updates) and after the last."""

    def __init__(self, model: nn.Module, steps: int, last: int = 1000, points: int = 100):
        self.model, self.steps, self.last = model, int(steps), max(1, min(int(last), int(steps)))
        self.every = max(1, -(-int(steps) // int(points)))
        # sums kept on the gradients' device: the step loop reads nothing back but once per bin
        self.bin_sum, self.bin_n, self.embed_bins = None, 0, []
        self.last_sum, self.last_n = None, 0  # (depth + 1,): the blocks', then the patch embedding's
        self.lambdas: list[dict] = []
        self.has_dtn = bool(dtn_lambdas(model))

    def __call__(self, step: int) -> None:
        norms = grad_norms(self.model).double()
        self.bin_sum = norms[-1] if self.bin_sum is None else self.bin_sum + norms[-1]
        self.bin_n += 1
        if self.bin_n == self.every:
            self._close_bin()
        if step >= self.steps - self.last:
            self.last_sum = norms if self.last_sum is None else self.last_sum + norms
            self.last_n += 1
        if self.has_dtn and step % self.every == 0:
            self.lambdas.append({"step": step, "norms": dtn_lambdas(self.model)})

    def _close_bin(self) -> None:
        self.embed_bins.append(float(self.bin_sum) / self.bin_n)
        self.bin_sum, self.bin_n = None, 0

    def to_dict(self) -> dict:
        if self.bin_n:
            self._close_bin()
        k = self.last_n
        last = (self.last_sum / k).tolist() if k else []
        return {
            "steps": self.steps,
            "last": k,
            "grad_norm_last": last[:-1],
            "embed_grad_norm_last": last[-1] if k else None,
            "embed_grad_norm": {
                "step": [i * self.every for i in range(len(self.embed_bins))],
                "value": self.embed_bins,
            },
            "dtn_lambda": self.lambdas
            + ([{"step": self.steps, "norms": dtn_lambdas(self.model)}] if self.has_dtn else []),
        }


class Probe:
    """Per-image measures of every layer of a Vision Transformer with timm's API (backbones.api) over batches
    (inference mode): patch_cosine, token_norm, attn_std (each a list per layer of (B,) values) and attn_distance
    ((B, H)); `skipped` names the measures this model does not allow, with why."""

    MEASURES = ("patch_cosine", "attn_std", "token_norm", "attn_distance")

    ATTENTION = ("attn_std", "attn_distance")

    def __init__(self, model: nn.Module, attn_std_tokens: str = "patches"):
        from .api import attention_kind, patch_grid, patch_size

        if attn_std_tokens not in ATTN_STD_TOKENS:
            raise ValueError(f"attn_std_tokens {attn_std_tokens!r}: choose one of {', '.join(ATTN_STD_TOKENS)}")
        self.model, self.attn_std_tokens = model, attn_std_tokens
        self.grid, self.patch = patch_grid(model), patch_size(model) or 1
        self.dtn_layers = int(getattr(model, "dtn_layers", 0))
        # what cannot be measured on this model, and why (the attention of a block that is not timm's Attention
        # nor transferbench's cannot be read)
        self.skipped = (
            {}
            if attention_kind(model)
            else {k: f"{type(model.blocks[0].attn).__name__} attention maps cannot be read" for k in self.ATTENTION}
        )
        self.values = {k: [[] for _ in model.blocks] for k in self.MEASURES if k not in self.skipped}

    def _attention(self, layer: int, probs: torch.Tensor) -> None:
        prefix = self.model.num_prefix_tokens if layer >= self.dtn_layers else 0  # DTN blocks run before cls joins
        std_prefix = prefix if self.attn_std_tokens == "patches" else 0
        self.values["attn_std"][layer].append(attention_row_std(probs, std_prefix).cpu())
        self.values["attn_distance"][layer].append(attention_distance(probs, self.grid, self.patch, prefix).cpu())

    @torch.inference_mode()
    def __call__(self, x: torch.Tensor) -> None:
        from contextlib import nullcontext

        from .api import attention_maps

        with nullcontext() if self.skipped else attention_maps(self.model, self._attention):
            layers = self.model.forward_intermediates(x, output_fmt="NLC", intermediates_only=True)
        for i, tokens in enumerate(layers):
            self.values["patch_cosine"][i].append(patch_cosine(tokens).cpu())
            self.values["token_norm"][i].append(token_norm(tokens).cpu())

    def summary(self) -> dict:
        """measure -> {"mean": per layer (per head for attn_distance), "sd": same, "n": images}."""
        return {
            k: summarise(np.stack([torch.cat(v).double().numpy() for v in per_layer], axis=1))
            for k, per_layer in self.values.items()
        }


def summarise(samples) -> dict:
    """Samples (n, ...) -> {"mean", "sd" (ddof 1; 0 for one sample), "n"}, arrays as lists: what records keep;
    records.stats.pool combines them over seeds."""
    a = np.asarray(samples, dtype=np.float64)
    sd = a.std(axis=0, ddof=1) if len(a) > 1 else np.zeros(a.shape[1:])
    return {"mean": a.mean(axis=0).tolist(), "sd": sd.tolist(), "n": int(len(a))}


def grad_norms(model: nn.Module) -> torch.Tensor:
    """(depth + 1,) L2 norms of each block's parameter gradients, then the patch embedding's, from the current
    `.grad`s, left on their device (no read-back)."""
    device = next(model.parameters()).device

    def norm(module):
        gs = [p.grad.detach().float().pow(2).sum() for p in module.parameters() if p.grad is not None]
        return torch.stack(gs).sum().sqrt() if gs else torch.zeros((), device=device)

    return torch.stack([*(norm(b) for b in model.blocks), norm(model.patch_embed)])


def layer_grad_norms(model: nn.Module) -> tuple[list[float], float]:
    """(L2 norm of each block's parameter gradients, of the patch embedding's) from the current `.grad`s."""
    *per_layer, embed = grad_norms(model).tolist()
    return per_layer, embed
