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

Speed: the forward works head-major and rearranges eq. 5-6 into fused ops; the backward is written by
hand (`_DTN`), since autograd through the forward costs ~4x the forward; on CPU the batch goes through
in cache-sized slices. benchmarks/dtn_layer.py measures it against the plain per-head T x T algorithm.
On a GPU the kernels' gradients come from one Gram product per head (`_kernel_gradients`), a GEMM shape that
fills the chip, where the CPU's two products with 14 x 14 outputs and a K of B.T.2d/14 leave it idle. Under
torch.compile the layer is plain tensor ops around one custom op, the Kronecker application (`dtn_kron`), so the
compiler fuses the elementwise passes and derives their backward itself.

Differences from the authors' released code, on purpose: that code l2-normalises each head before
the statistics and uses the unbiased LN variance; this module follows the paper's eq. 4-7 as written above.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from . import dtn_kernels
from .dtn_ops import _kron, _kron_backward, dtn_fused_layer, dtn_kron


@dataclass(frozen=True)
class Plan:
    """How one forward of the layer computes, decided once in `DynamicTokenNorm.forward` (as timm's Attention decides
    `fused_attn`) and passed down:
    - `path`: "fused", the Triton kernels (CUDA tensors where Triton imports, unless KERNELS is "off"); "graph", plain
      ops around `dtn_kron` for torch.compile to trace; else "hand", `_DTN`'s hand-written backward;
    - `tf32`: the layer runs under autocast, so the kernels' gradient may take TF32 products on a GPU (an fp32 run
      stays fp32 throughout);
    - `gram`: the kernels' gradient as one Gram product per head (a GPU), not two small products (a CPU, which pays
      for the Gram product's 14x multiply-adds);
    - `rows`: examples per slice of the batch (a CPU: about 1 MiB of x each, so DTN's ~10 full-size temporaries per
      slice stay in cache: s16_dtn forward+backward at batch 32 costs +15% over s16 in slices, +34% whole, on 2 cores;
      elsewhere the whole batch). The statistics are per example: slicing changes no result."""

    path: str
    tf32: bool
    gram: bool
    rows: int

    def slices(self, batch: int) -> list[slice]:
        return [slice(i, min(i + self.rows, batch)) for i in range(0, batch, self.rows)]


def plan_for(x: torch.Tensor, autocast: bool) -> Plan:
    """The plan for `x` (B, T, C), already in the statistics' dtype, under autocast or not."""
    B, T, C = x.shape
    path = "fused" if fused_on(x) else "graph" if torch.compiler.is_compiling() else "hand"
    cpu = x.device.type == "cpu"
    rows = max(1, _SLICE_BYTES // (T * C * x.element_size())) if cpu else B
    return Plan(path, tf32=autocast, gram=x.device.type == "cuda", rows=rows)


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
        a = self.pos_weight.to(torch.promote_types(self.pos_weight.dtype, torch.float32))
        R = relative_positions(self.grid).to(a)
        return (R @ a.t()).permute(2, 0, 1).softmax(dim=-1)

    def factored_weights(self, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
        """P_rows (H, h, h) and P_cols (H, w, w) with P^h = kron(P_rows^h, P_cols^h)."""
        a = self.pos_weight.to(dtype)
        rows = self.rel_rows[None] ** 2 * a[:, 0, None, None] + self.rel_rows[None] * a[:, 2, None, None]
        cols = self.rel_cols[None] ** 2 * a[:, 0, None, None] + self.rel_cols[None] * a[:, 1, None, None]
        return rows.softmax(dim=-1), cols.softmax(dim=-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        gh, gw = self.grid
        if T != gh * gw:
            raise ValueError(
                f"DynamicTokenNorm got {T} tokens but its grid {self.grid} has {gh * gw}; "
                "DTN sees patch tokens only (no cls) - rebuild the backbone with the right img_size"
            )
        # Statistics in fp32 even under autocast, as LayerNorm does: eq. 6 subtracts two moments. Only the
        # kernels' gradient may use TF32 products on a GPU, and only where the model runs under autocast (whose
        # own matrix products round to bf16): an fp32 run stays fp32 throughout.
        autocast = torch.is_autocast_enabled(x.device.type)
        with torch.autocast(device_type=x.device.type, enabled=False):
            f = torch.promote_types(x.dtype, torch.float32)  # float64 stays float64 (tests)
            p_rows, p_cols = self.factored_weights(f)
            x = x.to(f)
            plan = plan_for(x, autocast)
            args = (
                x,
                p_rows,
                p_cols,
                torch.sigmoid(self.mix_mean.to(f)),
                torch.sigmoid(self.mix_var.to(f)),
                self.weight.to(f),
                self.bias.to(f),
                self.eps,
                plan,
            )
            return {"fused": dtn_fused_layer, "graph": dtn_plain, "hand": _DTN.apply}[plan.path](*args)

    def extra_repr(self) -> str:
        return f"{self.dim}, num_heads={self.num_heads}, grid={self.grid}, eps={self.eps}"


def _head_major(t: torch.Tensor, grid: tuple[int, int], heads: int = 1) -> torch.Tensor:
    """(B, T, C) -> view (H, gh, gw, B, C/H); a per-token (B, T, 1) with heads=1 -> (1, gh, gw, B, 1)."""
    B, T, C = t.shape
    return t.view(B, grid[0], grid[1], heads, C // heads).permute(3, 1, 2, 0, 4)


def _token_major(t: torch.Tensor) -> torch.Tensor:
    """(H, gh, gw, B, d) -> (B, T, C), a copy only where the layout needs one."""
    H, gh, gw, B, d = t.shape
    return t.permute(3, 1, 2, 0, 4).reshape(B, gh * gw, H * d)


def _moments(xh: torch.Tensor) -> torch.Tensor:
    """[x, x*x] head-major (H, gh, gw, B, 2d), contiguous, written in place (no x*x temporary)."""
    moments = xh.new_empty(*xh.shape[:-1], 2 * xh.shape[-1])
    first = moments[..., : xh.shape[-1]].copy_(xh)
    torch.mul(first, first, out=moments[..., xh.shape[-1] :])
    return moments


def _dtn_statistics(x, p_rows, p_cols, heads, grid):
    """LN statistics per token and [P x, P (x*x)] per head and channel, head-major (H, gh, gw, B, 2d).

    Head-major layout makes both contractions left-multiplications by a small matrix with a long
    contiguous right-hand side, the GEMM shape that runs fast (a right-multiplication by a 14 x 14
    matrix runs at half the speed, and einsum's own permutes cost as much again)."""
    B, T, C = x.shape
    gh, gw = grid
    mean_ln = x.mean(dim=-1, keepdim=True)
    # biased variance; vector_norm is a fused reduction, several times faster than var_mean on CPU
    var_ln = torch.linalg.vector_norm(x - mean_ln, dim=-1, keepdim=True).square() / C
    xh = _head_major(x, grid, heads)
    m = _kron(p_rows, p_cols, _moments(xh).view(heads, gh, gw, -1))
    return mean_ln, var_ln, m.view(heads, gh, gw, B, -1)


def _dtn_normalise(xh, m, mean_ln, var_ln, lam_mu, lam_sig, eps):
    """Eq. 4-6 head-major, rearranged so that each full-size step is one fused op (a lerp with a tensor
    weight is several times slower): x - mu = (x - l_mu mu_LN) + (l_mu - 1) P x and
    sig^2 + eps = (1 - l_sig) var_in + (l_sig sig2_LN + eps); the bracketed terms are per (head, token).
    Returns (x - mu) and 1/sqrt(sig^2 + eps)."""
    H = m.shape[0]
    heads = (H, 1, 1, 1, 1)
    m1, m2 = m.chunk(2, dim=-1)
    ln_mean = _head_major(mean_ln, xh.shape[1:3]) * lam_mu.view(heads)  # (H, gh, gw, B, 1)
    ln_var = _head_major(var_ln, xh.shape[1:3]) * lam_sig.view(heads) + eps
    var_in = torch.addcmul(m2, m1, m1, value=-1).clamp_min_(0)  # >= 0 exactly (Jensen); clamp rounding
    rstd = torch.addcmul(ln_var, var_in, (1 - lam_sig).view(heads)).rsqrt_()
    centred = torch.addcmul(xh, m1, (lam_mu - 1).view(heads)).sub_(ln_mean)
    return centred, rstd


def _forward(x, p_rows, p_cols, lam_mu, lam_sig, weight, bias, eps, out):
    """Eq. 4-7 for a slice of the batch, written into `out`; returns what the backward needs."""
    H = p_rows.shape[0]
    grid = (p_rows.shape[1], p_cols.shape[1])
    mean_ln, var_ln, m = _dtn_statistics(x, p_rows, p_cols, H, grid)
    centred, rstd = _dtn_normalise(_head_major(x, grid, H), m, mean_ln, var_ln, lam_mu, lam_sig, eps)
    y_hat = centred.mul_(rstd)
    torch.addcmul(bias, _token_major(y_hat), weight, out=out)
    return mean_ln, var_ln, m, rstd, y_hat


def _backward(grad, x, p_rows, p_cols, lam_mu, lam_sig, weight, plan, mean_ln, var_ln, m, rstd, y_hat, g_x):
    """Gradients for a slice of the batch: dL/dx into `g_x`, the parameters' returned (to be summed)."""
    B, T, C = x.shape
    H, gh, gw = p_rows.shape[0], p_rows.shape[1], p_cols.shape[1]
    d = C // H
    heads = (H, 1, 1, 1, 1)
    xh = _head_major(x, (gh, gw), H)
    m1, m2 = m[..., :d], m[..., d:]
    g_bias = grad.sum((0, 1))
    g_weight = (grad * _token_major(y_hat)).sum((0, 1))
    d_centred = _head_major(grad * weight, (gh, gw), H).mul(rstd)  # dL/d(x - mu)
    d_sig = d_centred.mul(y_hat).mul_(rstd)  # = -2 dL/d(sig^2 + eps)
    # dL/d[P x, P x^2] written straight into one buffer for the GEMMs: eq. 6 gives
    # d(P x^2) = (1 - l_sig) d var and d(P x) = (l_mu - 1) d_centred - 2 P x d(P x^2)
    d_m = torch.empty_like(m)
    d_m2 = torch.mul(d_sig, (-0.5 * (1 - lam_sig)).view(heads), out=d_m[..., d:])
    torch.mul(d_centred, (lam_mu - 1).view(heads), out=d_m[..., :d]).addcmul_(m1, d_m2, value=-2)
    # per-token sums give dL/d mu_LN, dL/d sig2_LN and the LN parts of the mixing gradients
    sum_centred, sum_sig = d_centred.sum(-1), d_sig.sum(-1)  # (H, gh, gw, B)
    mu, var = _head_major(mean_ln, (gh, gw))[..., 0], _head_major(var_ln, (gh, gw))[..., 0]
    g_lam_mu = (d_centred * m1).sum((1, 2, 3, 4)) - (sum_centred * mu).sum((1, 2, 3))
    var_in = torch.addcmul(m2, m1, m1, value=-1)
    g_lam_sig = -0.5 * ((sum_sig * var).sum((1, 2, 3)) - (d_sig * var_in).sum((1, 2, 3, 4)))
    d_mean_ln = -(sum_centred * lam_mu.view(H, 1, 1, 1)).sum(0)  # (gh, gw, B)
    d_var_ln = -0.5 * (sum_sig * lam_sig.view(H, 1, 1, 1)).sum(0)
    # through P = kron(P_rows, P_cols): transposed kernels back, and the kernels' own gradients
    moments = _moments(xh)
    g_rows, g_cols, d_moments = _kron_backward(
        d_m.view(H, gh, gw, -1), moments.view(H, gh, gw, -1), p_rows, p_cols, plan.tf32, plan.gram
    )
    d_moments = d_moments.view(H, gh, gw, B, -1)
    d_xh = torch.addcmul(d_centred.add_(d_moments[..., :d]), xh, d_moments[..., d:], value=2)
    # LN statistics: d mu_LN / dx = 1/C, d sig2_LN / dx = 2 (x - mu_LN) / C; as one addcmul with
    # per-token terms: g_x = d_xh + 2/C d_var_ln x + (d_mean_ln - 2 mu_LN d_var_ln) / C
    d_mean_ln, d_var_ln = (t.permute(2, 0, 1).reshape(B, T, 1) for t in (d_mean_ln, d_var_ln))
    shift = (d_mean_ln - 2 * mean_ln * d_var_ln) / C
    torch.addcmul(_token_major(d_xh).add_(shift), x, d_var_ln, value=2 / C, out=g_x)
    return g_rows, g_cols, g_lam_mu, g_lam_sig, g_weight, g_bias


def dtn_plain(x, p_rows, p_cols, lam_mu, lam_sig, weight, bias, eps, plan: Plan):
    """Eq. 4-7 as plain tensor ops around `dtn_kron`: what torch.compile sees (it fuses the elementwise passes and
    derives their backward); the same function as `_DTN` up to floating-point rounding (tested)."""
    B, T, C = x.shape
    H, gh, gw = p_rows.shape[0], p_rows.shape[1], p_cols.shape[1]
    d = C // H
    mean_ln = x.mean(dim=-1, keepdim=True)
    var_ln = (x - mean_ln).square().mean(dim=-1, keepdim=True)
    xh = x.view(B, gh, gw, H, d).permute(3, 1, 2, 0, 4)  # (H, gh, gw, B, d)
    moments = torch.cat([xh, xh * xh], dim=-1).reshape(H, gh, gw, B * 2 * d)
    m = dtn_kron(p_rows, p_cols, moments, plan.tf32, plan.gram).view(H, gh, gw, B, 2 * d)
    m1, m2 = m[..., :d], m[..., d:]
    heads = (H, 1, 1, 1, 1)
    mu_ln = mean_ln.view(B, gh, gw, 1).permute(1, 2, 0, 3)[None]  # (1, gh, gw, B, 1)
    sig_ln = var_ln.view(B, gh, gw, 1).permute(1, 2, 0, 3)[None]
    mu = lam_mu.view(heads) * mu_ln + (1 - lam_mu.view(heads)) * m1
    var = lam_sig.view(heads) * sig_ln + (1 - lam_sig.view(heads)) * (m2 - m1 * m1).clamp_min(0)
    y = (xh - mu) * torch.rsqrt(var + eps)
    return _token_major(y) * weight + bias


# The GPU's path: Triton kernels (`dtn_kernels`) that keep a head's tile of tokens on chip, one custom operator
# forward and one backward, which torch.compile keeps whole. "auto": on CUDA tensors where Triton imports; "off": the
# torch formulation everywhere (benchmarks/dtn_layer.py times both). The CPU never takes it: its records stay those of
# `_DTN` and `dtn_plain`.
KERNELS = "auto"


def fused_on(x: torch.Tensor) -> bool:
    """Whether the layer runs the fused kernels for x: CUDA tensors with Triton importable, unless KERNELS is "off".
    A CUDA machine without Triton is refused in one line, never silently slower."""
    if KERNELS == "off" or x.device.type != "cuda":
        return False
    if not dtn_kernels.available():
        raise RuntimeError(
            "DTN on CUDA needs Triton (it ships with torch's CUDA wheels): pip install triton, or set "
            "transferbench.backbones.dtn.KERNELS = 'off' for the slower torch formulation"
        )
    return True


_SLICE_BYTES = 1 << 20  # Plan.rows: the bytes of x one slice of the batch holds on a CPU


class _DTN(torch.autograd.Function):
    """DTN's forward and a hand-written backward. Autograd through the fused forward spends ~4x the
    forward's time in broadcast multiplies and per-head reductions; this backward is ~20 fused
    elementwise passes and five small GEMMs. Saved per slice: the head-major moments [P x, P x^2],
    1/sigma and the normalised x, with x itself (5 activations' worth; eager autograd kept more)."""

    @staticmethod
    def forward(ctx, x, p_rows, p_cols, lam_mu, lam_sig, weight, bias, eps, plan):
        x = x.contiguous()
        ctx.plan = plan
        out = torch.empty_like(x)
        ctx.slices = plan.slices(x.shape[0])
        ctx.per_slice = [
            _forward(x[sl], p_rows, p_cols, lam_mu, lam_sig, weight, bias, eps, out[sl]) for sl in ctx.slices
        ]
        ctx.save_for_backward(x, p_rows, p_cols, lam_mu, lam_sig, weight)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        x, p_rows, p_cols, lam_mu, lam_sig, weight = ctx.saved_tensors
        grad = grad.contiguous()
        g_x = torch.empty_like(x)
        totals = None
        # fp32 like the forward, also where backward() is called inside an autocast region
        with torch.autocast(device_type=x.device.type, enabled=False):
            for sl, saved in zip(ctx.slices, ctx.per_slice):
                g = _backward(grad[sl], x[sl], p_rows, p_cols, lam_mu, lam_sig, weight, ctx.plan, *saved, g_x[sl])
                totals = g if totals is None else [a.add_(b) for a, b in zip(totals, g)]
        ctx.per_slice = None
        return (g_x, *totals, None, None)
