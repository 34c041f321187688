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

Computing P^h x cheaply, exactly: R_ts . a^h = (a0 dx^2 + a1 dx) + (a0 dy^2 + a2 dy) splits into a
column part and a row part, and the source tokens form the product set rows x columns, so the softmax
over s factorises: P^h = P_rows^h (kron) P_cols^h. P^h x is then one (h x h) matmul along the rows
and one (w x w) along the columns of the token grid: O(T (h + w) C) instead of O(T^2 C).

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


def _offsets(n: int) -> torch.Tensor:
    """(n, n) with [t, s] = s - t along one axis of the grid."""
    idx = torch.arange(n, dtype=torch.float32)
    return idx[None, :] - idx[:, None]


def neighbourhood_offsets(num_heads: int) -> list[tuple[float, float]]:
    """Offsets (dx, dy) of the first k*k heads, k = floor(sqrt(H)), row-major over a k x k window
    centred on the token (half-integer offsets when k is even, as in ConViT's local init)."""
    k = math.isqrt(num_heads)
    centre = (k - 1) / 2
    return [(ix - centre, iy - centre) for iy in range(k) for ix in range(k)]


class DynamicTokenNorm(nn.Module):
    """Drop-in replacement for LayerNorm on (B, T, C) patch tokens laid out on `grid`.

    Parameters: `weight`, `bias` (C), `mix_mean`, `mix_var` (H logits), `pos_weight` (H, 3) in R's
    order. They are resolution-free: `set_grid` rebuilds R's cached factors for a new patch grid
    (high-res fine-tune).
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
        """Cache R's factors for a patch grid: 1-D offsets (source minus target) along rows and columns."""
        self.grid = gh, gw = (int(grid[0]), int(grid[1]))
        dev = self.weight.device
        self.register_buffer("rel_rows", _offsets(gh).to(dev), persistent=False)
        self.register_buffer("rel_cols", _offsets(gw).to(dev), persistent=False)

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
        """The full P (H, T_target, T_source) of eq. 7, rows summing to 1 (for analysis; forward uses
        its factors)."""
        R = relative_positions(self.grid).to(self.pos_weight.device)
        return (R @ self.pos_weight.float().t()).permute(2, 0, 1).softmax(dim=-1)

    def factored_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """P_rows (H, h, h) and P_cols (H, w, w) with P^h = kron(P_rows^h, P_cols^h)."""
        a = self.pos_weight.float()
        rows = self.rel_rows[None] ** 2 * a[:, 0, None, None] + self.rel_rows[None] * a[:, 2, None, None]
        cols = self.rel_cols[None] ** 2 * a[:, 0, None, None] + self.rel_cols[None] * a[:, 1, None, None]
        return rows.softmax(dim=-1), cols.softmax(dim=-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        gh, gw = self.grid
        if T != gh * gw:
            raise ValueError(
                f"DynamicTokenNorm got {T} tokens but its grid {self.grid} has {gh * gw}; "
                "DTN sees patch tokens only (no cls) - rebuild the backbone with the right img_size")
        H = self.num_heads
        # Statistics in fp32 even under autocast, as LayerNorm does: eq. 6 subtracts two moments.
        with torch.autocast(device_type=x.device.type, enabled=False):
            x = x.float()
            # eq. 5-6, intra-token: LN statistics over C (biased). vector_norm is a fused reduction,
            # several times faster than var_mean on CPU.
            mean_ln = x.mean(dim=-1, keepdim=True)
            var_ln = torch.linalg.vector_norm(x - mean_ln, dim=-1, keepdim=True).square() / C
            # inter-token: P^h x and P^h (x*x) together, on the (rows, cols, head, channel) grid
            xg = x.view(B, gh, gw, H, C // H)
            m = torch.cat([xg, xg * xg], dim=-1)
            p_rows, p_cols = self.factored_weights()
            m = torch.einsum("hij,bjwhc->biwhc", p_rows, m)
            m1, m2 = torch.einsum("hvw,biwhc->bivhc", p_cols, m).chunk(2, dim=-1)
            var_in = torch.addcmul(m2, m1, m1, value=-1).clamp_min(0)  # >= 0 exactly (Jensen); clamp rounding
            lam_mu = torch.sigmoid(self.mix_mean.float()).view(H, 1)
            lam_sig = torch.sigmoid(self.mix_var.float()).view(H, 1)
            mean = torch.lerp(m1, mean_ln.view(B, gh, gw, 1, 1), lam_mu)  # eq. 5
            var = torch.lerp(var_in, var_ln.view(B, gh, gw, 1, 1), lam_sig)  # eq. 6
            y = (xg - mean) * torch.rsqrt(var + self.eps)  # eq. 4
            return torch.addcmul(self.bias.float(), y.reshape(B, T, C), self.weight.float())

    def extra_repr(self) -> str:
        return f"{self.dim}, num_heads={self.num_heads}, grid={self.grid}, eps={self.eps}"
