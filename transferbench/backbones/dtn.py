"""Dynamic Token Normalization (Shao et al., ICLR 2022), eq. 4-7.

For tokens x in R^{T x C} split into H heads of C/H channels, head h normalises with

    mu    = l_mu  * mu_LN   + (1 - l_mu)  * P^h x                             (eq. 5)
    sig^2 = l_sig * sig2_LN + (1 - l_sig) * (P^h (x*x) - (P^h x) * (P^h x))   (eq. 6)
    P^h   = softmax_s(R_ts . a^h),  R_ts = [dx^2 + dy^2, dx, dy]               (eq. 7)
    DTN(x) = weight * (x - mu) / sqrt(sig^2 + eps) + bias                     (eq. 4)

mu_LN / sig2_LN are each token's LayerNorm statistics over all C channels (biased variance);
P^h x are per-channel statistics over tokens, weighted by a learnt, position-dependent kernel;
l = sigmoid(logit) per head (logits start at 0); (dx, dy) = position of source token s minus
position of target token t on the patch grid.

Differences from the authors' released code, on purpose: that code l2-normalises each head before
the statistics and uses the unbiased LN variance; we follow the paper's equations (see DESIGN.md).
"""
from __future__ import annotations

import math

import torch
from torch import nn


def relative_positions(grid: tuple[int, int]) -> torch.Tensor:
    """R (T, T, 3) with R[t, s] = [dx^2 + dy^2, dx, dy], tokens in row-major (h w) order."""
    gh, gw = grid
    ys, xs = torch.meshgrid(torch.arange(gh), torch.arange(gw), indexing="ij")
    ys, xs = ys.flatten().float(), xs.flatten().float()
    dx = xs[None, :] - xs[:, None]  # [t, s] = x_s - x_t
    dy = ys[None, :] - ys[:, None]
    return torch.stack([dx * dx + dy * dy, dx, dy], dim=-1)


def neighbourhood_offsets(num_heads: int) -> list[tuple[float, float]]:
    """Offsets (dx, dy) of the first k*k heads, k = floor(sqrt(H)), row-major over a k x k window
    centred on the token (half-integer offsets when k is even, as in ConViT's local init)."""
    k = math.isqrt(num_heads)
    centre = (k - 1) / 2
    return [(ix - centre, iy - centre) for iy in range(k) for ix in range(k)]


class DynamicTokenNorm(nn.Module):
    """Drop-in replacement for LayerNorm on (B, T, C) patch tokens laid out on `grid`.

    Parameters: `weight`, `bias` (C), `mix_mean`, `mix_var` (H logits), `pos_weight` (H, 3) in R's
    order. They are resolution-free: `set_grid` rebuilds R for a new patch grid (high-res fine-tune).
    """

    def __init__(self, dim: int, num_heads: int, grid: tuple[int, int], eps: float = 1e-5):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"DynamicTokenNorm: dim {dim} is not divisible by num_heads {num_heads}")
        self.dim, self.num_heads, self.eps = dim, num_heads, eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))
        self.mix_mean = nn.Parameter(torch.zeros(num_heads))
        self.mix_var = nn.Parameter(torch.zeros(num_heads))
        self.pos_weight = nn.Parameter(torch.empty(num_heads, 3))
        self.set_grid(grid)
        self.reset_parameters()

    def set_grid(self, grid: tuple[int, int]) -> None:
        self.grid = (int(grid[0]), int(grid[1]))
        self.register_buffer("rel_pos", relative_positions(self.grid).to(self.weight.device), persistent=False)

    @torch.no_grad()
    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)
        nn.init.zeros_(self.bias)
        nn.init.zeros_(self.mix_mean)
        nn.init.zeros_(self.mix_var)
        # a^h = [-1, 2*dx_h, 2*dy_h] makes R.a^h = |offset|^2 - |delta - offset|^2: P peaks at the
        # head's offset. Heads beyond the k*k square start small and random.
        nn.init.trunc_normal_(self.pos_weight, std=0.02)
        for h, (ox, oy) in enumerate(neighbourhood_offsets(self.num_heads)):
            self.pos_weight[h] = torch.tensor([-1.0, 2 * ox, 2 * oy])

    def positional_weights(self) -> torch.Tensor:
        """P (H, T_target, T_source); each row sums to 1 (eq. 7)."""
        logits = self.rel_pos @ self.pos_weight.float().t()  # (T, T, H)
        return logits.permute(2, 0, 1).softmax(dim=-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        if T != self.rel_pos.shape[0]:
            raise ValueError(
                f"DynamicTokenNorm got {T} tokens but its grid {self.grid} has {self.rel_pos.shape[0]}; "
                "DTN sees patch tokens only (no cls) - rebuild the backbone with the right img_size")
        H = self.num_heads
        # Statistics in fp32 even under autocast, as LayerNorm does: eq. 6 subtracts two moments.
        with torch.autocast(device_type=x.device.type, enabled=False):
            x = x.float()
            var_ln, mean_ln = torch.var_mean(x, dim=-1, correction=0, keepdim=True)  # (B, T, 1)
            xh = x.view(B, T, H, C // H).transpose(1, 2)  # (B, H, T, c)
            # P^h x and P^h (x*x) in one batched matmul; P is shared by the batch.
            m1, m2 = (self.positional_weights() @ torch.cat([xh, xh * xh], dim=-1)).chunk(2, dim=-1)
            var_in = (m2 - m1 * m1).clamp_min(0)  # >= 0 exactly (Jensen); clamp rounding only
            lam_mu = torch.sigmoid(self.mix_mean.float()).view(1, H, 1, 1)
            lam_sig = torch.sigmoid(self.mix_var.float()).view(1, H, 1, 1)
            mean = lam_mu * mean_ln.unsqueeze(1) + (1 - lam_mu) * m1  # eq. 5
            var = lam_sig * var_ln.unsqueeze(1) + (1 - lam_sig) * var_in  # eq. 6
            y = (xh - mean) * torch.rsqrt(var + self.eps)  # eq. 4
            y = y.transpose(1, 2).reshape(B, T, C)
            return y * self.weight.float() + self.bias.float()

    def extra_repr(self) -> str:
        return f"{self.dim}, num_heads={self.num_heads}, grid={self.grid}, eps={self.eps}"
