"""DTN's statistics as fused Triton kernels: a head's tile of tokens stays on chip (the GPU's default path).

The torch formulation (`dtn._DTN`, `dtn.dtn_plain`) writes [x, x^2] and [P x, P x^2] per head as fp32 tensors twice
an activation's size and passes over them about 20 times. Here one program owns a block of target tokens of one head
and one example, and P^h (T x T, dense: its Kronecker factors are assembled by torch, which also derives their
gradients) meets x on chip:

- forward: per (target block, head, example), m = [P x, P x^2] by two `tl.dot`s over source blocks, then eq. 4-6 in
  registers; only y leaves the chip. Nothing of size T x C is saved but x itself; the backward recomputes m.
- backward, three kernels:
  1. per (target block, head, example): m again, then dL/dm, the direct term dL/d(x - mu), the per-token sums that
     feed LayerNorm's statistics and the partial sums of the mixing and affine gradients;
  2. per (source block, head, example): dL/dx = direct + P^T dL/dm terms + LayerNorm's terms;
  3. per (target block, source block, head): dL/dP^h = sum over examples and channels of dL/dm x^T, as one GEMM with
     K = B d that runs over the batch on chip.

Precision: fp32 statistics throughout, as LayerNorm. `precise=True` (the layer outside autocast) runs every product
in IEEE fp32, so a fp32 run matches the float64 equations to fp32 rounding; under autocast the statistics' products
use three-pass TF32 (`tf32x3`, fp32-accurate on tensor cores) and dL/dP one-pass TF32, as the torch path's Gram
product does.

On a CPU the same kernels run in Triton's interpreter (`triton.runtime.interpreter`), which the tests use to check
them against the float64 equations on every machine; the CPU's training path never calls them.
"""

from __future__ import annotations

import torch

try:  # Triton ships with torch's CUDA wheels; the CPU path never needs it
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the wheel
    triton = tl = None


def available() -> bool:
    """Whether Triton can be imported (the fused kernels' only requirement besides a CUDA tensor or the interpreter)."""
    return triton is not None


# kernels and their helpers are jit-compiled at import: Triton binds its own library functions to the interpreter or
# the compiler at that moment (TRITON_INTERPRET), so the choice is the process's
_jit = triton.jit if triton is not None else (lambda fn: fn)


@_jit
def _moments(
    X, P, base, h, offs_t, mask_t, offs_d, mask_d, T, C,
    BLOCK_S: tl.constexpr, PREC: tl.constexpr, ACC: tl.constexpr,
):  # fmt: skip
    """[P x, P x^2] of one block of target tokens of one head and example: two products over source blocks."""
    m1 = tl.zeros((offs_t.shape[0], offs_d.shape[0]), dtype=ACC)
    m2 = tl.zeros((offs_t.shape[0], offs_d.shape[0]), dtype=ACC)
    for s0 in range(0, T, BLOCK_S):
        offs_s = s0 + tl.arange(0, BLOCK_S)
        mask_s = offs_s < T
        p = tl.load(
            P + h * T * T + offs_t[:, None] * T + offs_s[None, :], mask=mask_t[:, None] & mask_s[None, :], other=0.0
        )
        xs = tl.load(
            X + base + offs_s[:, None] * C + offs_d[None, :], mask=mask_s[:, None] & mask_d[None, :], other=0.0
        )
        xs = xs.to(ACC)
        m1 += tl.dot(p, xs, input_precision=PREC)
        m2 += tl.dot(p, xs * xs, input_precision=PREC)
    return m1, m2


@_jit
def _target_block(
    X, P, h, b, T, C, D,
    BLOCK_T: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, PREC: tl.constexpr, ACC: tl.constexpr,
):  # fmt: skip
    """This program's block of target tokens (axis 0) of head h and example b: its tokens and channels with their
    masks, its elements' addresses and mask, and [P x, P x^2] there."""
    offs_t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_d = tl.arange(0, BLOCK_D)
    mask_t, mask_d = offs_t < T, offs_d < D
    base = b * T * C + h * D
    m1, m2 = _moments(X, P, base, h, offs_t, mask_t, offs_d, mask_d, T, C, BLOCK_S, PREC, ACC)
    mask = mask_t[:, None] & mask_d[None, :]
    at = base + offs_t[:, None] * C + offs_d[None, :]
    return offs_t, mask_t, offs_d, mask_d, at, mask, m1, m2


@_jit
def _normalised(X, LN, LAM, at, mask, b, h, offs_t, mask_t, T, m1, m2, eps, ACC: tl.constexpr):
    """Eq. 4-6 for a block: (x_hat, 1/sigma, the inter-token variance, mu_LN, sigma^2_LN, l_mu, l_sig)."""
    xt = tl.load(X + at, mask=mask, other=0.0).to(ACC)
    mean_ln = tl.load(LN + (b * T + offs_t) * 2, mask=mask_t, other=0.0)
    var_ln = tl.load(LN + (b * T + offs_t) * 2 + 1, mask=mask_t, other=0.0)
    lam_mu = tl.load(LAM + h * 2)
    lam_sig = tl.load(LAM + h * 2 + 1)
    var_in = tl.maximum(m2 - m1 * m1, 0.0)
    rstd = 1.0 / tl.sqrt(lam_sig * var_ln[:, None] + (1.0 - lam_sig) * var_in + eps)
    x_hat = (xt - lam_mu * mean_ln[:, None] - (1.0 - lam_mu) * m1) * rstd
    return x_hat, rstd, var_in, mean_ln, var_ln, lam_mu, lam_sig


@_jit
def _fwd(
    X, P, LN, LAM, W, BIAS, Y,
    T, C, D, eps,
    BLOCK_T: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, PREC: tl.constexpr, ACC: tl.constexpr,
):  # fmt: skip
    h, b = tl.program_id(1), tl.program_id(2)
    offs_t, mask_t, offs_d, mask_d, at, mask, m1, m2 = _target_block(
        X, P, h, b, T, C, D, BLOCK_T, BLOCK_S, BLOCK_D, PREC, ACC
    )
    x_hat = _normalised(X, LN, LAM, at, mask, b, h, offs_t, mask_t, T, m1, m2, eps, ACC)[0]
    w = tl.load(W + h * D + offs_d, mask=mask_d, other=0.0)
    bias = tl.load(BIAS + h * D + offs_d, mask=mask_d, other=0.0)
    tl.store(Y + at, x_hat * w[None, :] + bias[None, :], mask=mask)


@_jit
def _bwd_stats(
    X, P, LN, LAM, W, G, DM1, DM2, DC, TOK, PART, GW,
    T, C, D, H, eps,
    BLOCK_T: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, PREC: tl.constexpr, ACC: tl.constexpr,
):  # fmt: skip
    pid_t, h, b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    n_t = tl.num_programs(0)
    offs_t, mask_t, offs_d, mask_d, at, mask, m1, m2 = _target_block(
        X, P, h, b, T, C, D, BLOCK_T, BLOCK_S, BLOCK_D, PREC, ACC
    )
    x_hat, rstd, var_in, mean_ln, var_ln, lam_mu, lam_sig = _normalised(
        X, LN, LAM, at, mask, b, h, offs_t, mask_t, T, m1, m2, eps, ACC
    )
    g = tl.load(G + at, mask=mask, other=0.0).to(ACC)
    w = tl.load(W + h * D + offs_d, mask=mask_d, other=0.0)
    d_c = g * w[None, :] * rstd  # dL/d(x - mu)
    d_v = -0.5 * d_c * x_hat * rstd  # dL/d(sigma^2)
    d_m2 = (1.0 - lam_sig) * d_v
    d_m1 = (lam_mu - 1.0) * d_c - 2.0 * m1 * d_m2
    tl.store(DM1 + at, d_m1, mask=mask)
    tl.store(DM2 + at, d_m2, mask=mask)
    tl.store(DC + at, d_c, mask=mask)
    # LayerNorm's statistics: this head's share of dL/d mu_LN and dL/d sigma^2_LN per token
    tok = ((h * tl.num_programs(2) + b) * T + offs_t) * 2
    tl.store(TOK + tok, -lam_mu * tl.sum(d_c, axis=1), mask=mask_t)
    tl.store(TOK + tok + 1, lam_sig * tl.sum(d_v, axis=1), mask=mask_t)
    part = ((b * H + h) * n_t + pid_t) * 2
    tl.store(PART + part, tl.sum(tl.sum(d_c * (m1 - mean_ln[:, None]), axis=1), axis=0))
    tl.store(PART + part + 1, tl.sum(tl.sum(d_v * (var_ln[:, None] - var_in), axis=1), axis=0))
    tl.store(GW + (b * n_t + pid_t) * C + h * D + offs_d, tl.sum(g * x_hat, axis=0), mask=mask_d)


@_jit
def _bwd_dx(
    X, P, LN, TOKSUM, DM1, DM2, DC, DX,
    T, C, D,
    BLOCK_T: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, PREC: tl.constexpr, ACC: tl.constexpr,
):  # fmt: skip
    pid_s, h, b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    offs_s = pid_s * BLOCK_S + tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    mask_s, mask_d = offs_s < T, offs_d < D
    base = b * T * C + h * D
    a1 = tl.zeros((BLOCK_S, BLOCK_D), dtype=ACC)
    a2 = tl.zeros((BLOCK_S, BLOCK_D), dtype=ACC)
    for t0 in range(0, T, BLOCK_T):
        offs_t = t0 + tl.arange(0, BLOCK_T)
        mask_t = offs_t < T
        pt = tl.load(
            P + h * T * T + offs_t[None, :] * T + offs_s[:, None], mask=mask_s[:, None] & mask_t[None, :], other=0.0
        )
        m = mask_t[:, None] & mask_d[None, :]
        at = base + offs_t[:, None] * C + offs_d[None, :]
        a1 += tl.dot(pt, tl.load(DM1 + at, mask=m, other=0.0), input_precision=PREC)
        a2 += tl.dot(pt, tl.load(DM2 + at, mask=m, other=0.0), input_precision=PREC)
    mask = mask_s[:, None] & mask_d[None, :]
    at = base + offs_s[:, None] * C + offs_d[None, :]
    xs = tl.load(X + at, mask=mask, other=0.0).to(ACC)
    d_c = tl.load(DC + at, mask=mask, other=0.0)
    mean_ln = tl.load(LN + (b * T + offs_s) * 2, mask=mask_s, other=0.0)
    d_mean = tl.load(TOKSUM + (b * T + offs_s) * 2, mask=mask_s, other=0.0)
    d_var = tl.load(TOKSUM + (b * T + offs_s) * 2 + 1, mask=mask_s, other=0.0)
    # d mu_LN / dx = 1/C and d sigma^2_LN / dx = 2 (x - mu_LN) / C
    shift = (d_mean - 2.0 * mean_ln * d_var) / C
    dx = d_c + a1 + 2.0 * xs * a2 + shift[:, None] + 2.0 * d_var[:, None] * xs / C  # (2.0 / C) alone would be fp32
    tl.store(DX + at, dx, mask=mask)


@_jit
def _bwd_dp(
    X, DM1, DM2, DP,
    T, C, D, B,
    BLOCK_T: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, PREC: tl.constexpr, ACC: tl.constexpr,
):  # fmt: skip
    pid_t, pid_s, h = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    offs_t = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_s = pid_s * BLOCK_S + tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    mask_t, mask_s, mask_d = offs_t < T, offs_s < T, offs_d < D
    mt = mask_t[:, None] & mask_d[None, :]
    ms = mask_s[:, None] & mask_d[None, :]
    acc = tl.zeros((BLOCK_T, BLOCK_S), dtype=ACC)
    for b in range(0, B):
        base = b * T * C + h * D
        d_m1 = tl.load(DM1 + base + offs_t[:, None] * C + offs_d[None, :], mask=mt, other=0.0)
        d_m2 = tl.load(DM2 + base + offs_t[:, None] * C + offs_d[None, :], mask=mt, other=0.0)
        xs = tl.load(X + base + offs_s[:, None] * C + offs_d[None, :], mask=ms, other=0.0).to(ACC)
        acc += tl.dot(d_m1, tl.trans(xs), input_precision=PREC)
        acc += tl.dot(d_m2, tl.trans(xs * xs), input_precision=PREC)
    tl.store(DP + h * T * T + offs_t[:, None] * T + offs_s[None, :], acc, mask=mask_t[:, None] & mask_s[None, :])


_KERNELS = {"_fwd": _fwd, "_bwd_stats": _bwd_stats, "_bwd_dx": _bwd_dx, "_bwd_dp": _bwd_dp}


def _kernel(name: str, x: torch.Tensor):
    """The kernel for x's device: compiled for a GPU, or run by Triton's interpreter on CPU tensors. The interpreter
    must be chosen before Triton is first imported (`TRITON_INTERPRET=1`): Triton's own library functions are bound
    to one mode at import."""
    if x.device.type == "cpu" and not triton.knobs.runtime.interpret:
        raise RuntimeError(
            "the fused DTN kernels run on CPU tensors only in Triton's interpreter: set TRITON_INTERPRET=1 before "
            "Python starts (the CPU's training path uses transferbench.backbones.dtn's torch formulation instead)"
        )
    return _KERNELS[name]


def _blocks(x: torch.Tensor, d: int) -> dict:
    """Tile sizes: 64 tokens by the head's width on a GPU; the interpreter takes the smallest `tl.dot` allows."""
    block_d = max(16, triton.next_power_of_2(d))
    if x.device.type == "cpu":
        return dict(BLOCK_T=16, BLOCK_S=16, BLOCK_D=block_d)
    return dict(BLOCK_T=64, BLOCK_S=64, BLOCK_D=block_d, num_warps=4 if block_d <= 64 else 8)


def _precision(precise: bool) -> tuple[str, str]:
    """(statistics' products, dL/dP's product): IEEE fp32 outside autocast, TF32 passes under it."""
    return ("ieee", "ieee") if precise else ("tf32x3", "tf32")  # float64 products are IEEE whatever is asked


def ln_statistics(x: torch.Tensor) -> torch.Tensor:
    """(B, T, 2): each token's LayerNorm mean and biased variance over all C channels, in `_acc(x)`."""
    var, mean = torch.var_mean(x.to(_acc(x)), dim=-1, correction=0)
    return torch.stack([mean, var], dim=-1).contiguous()


def forward(x, P, lam, weight, bias, eps: float, precise: bool):
    """y (B, T, C) of eq. 4-7 and the LayerNorm statistics (B, T, 2) the backward reuses.

    x (B, T, C) contiguous, P (H, T, T) = kron(P_rows, P_cols) per head, lam (H, 2) = sigmoid of the mixing logits
    [mean, variance], weight and bias (C,), all fp32."""
    B, T, C = x.shape
    H = P.shape[0]
    D = C // H
    stats = ln_statistics(x)
    y = torch.empty(B, T, C, device=x.device, dtype=_acc(x))
    blocks = _blocks(x, D)
    grid = (triton.cdiv(T, blocks["BLOCK_T"]), H, B)
    _kernel("_fwd", x)[grid](
        x,
        P,
        stats,
        lam,
        weight,
        bias,
        y,
        T,
        C,
        D,
        eps,
        **blocks,
        PREC=_precision(precise or x.dtype == torch.float64)[0],
        ACC=_tl_acc(x),
    )
    return y, stats


def backward(g, x, P, lam, weight, stats, eps: float, precise: bool):
    """(dL/dx, dL/dP (H, T, T), dL/dlam (H, 2), dL/dweight, dL/dbias) for dL/dy = g."""
    B, T, C = x.shape
    H = P.shape[0]
    D = C // H
    g = g.contiguous()
    blocks = _blocks(x, D)
    stat_prec, gram_prec = _precision(precise or x.dtype == torch.float64)
    n_t = triton.cdiv(T, blocks["BLOCK_T"])
    f32 = dict(device=x.device, dtype=_acc(x))
    d_m1, d_m2, d_c = (torch.empty(B, T, C, **f32) for _ in range(3))
    tok = torch.empty(H, B, T, 2, **f32)
    part = torch.empty(B, H, n_t, 2, **f32)
    g_w = torch.empty(B, n_t, C, **f32)
    _kernel("_bwd_stats", x)[(n_t, H, B)](
        x,
        P,
        stats,
        lam,
        weight,
        g,
        d_m1,
        d_m2,
        d_c,
        tok,
        part,
        g_w,
        T,
        C,
        D,
        H,
        eps,
        **blocks,
        PREC=stat_prec,
        ACC=_tl_acc(x),
    )
    tok_sum = tok.sum(0).contiguous()
    dx = torch.empty(B, T, C, **f32)
    n_s = triton.cdiv(T, blocks["BLOCK_S"])
    _kernel("_bwd_dx", x)[(n_s, H, B)](
        x, P, stats, tok_sum, d_m1, d_m2, d_c, dx, T, C, D, **blocks, PREC=stat_prec, ACC=_tl_acc(x)
    )
    dP = torch.empty(H, T, T, **f32)
    _kernel("_bwd_dp", x)[(n_t, n_s, H)](x, d_m1, d_m2, dP, T, C, D, B, **blocks, PREC=gram_prec, ACC=_tl_acc(x))
    return dx, dP, _total(part, (0, 2)), _total(g_w, (0, 1)), _total(g, (0, 1))


def _total(t: torch.Tensor, dims) -> torch.Tensor:
    """A sum over `dims` accumulated in float64 (the reduction casts as it reads: no float64 copy of `t`, which for the
    bias gradient is a whole activation), returned in the statistics' dtype."""
    return t.sum(dims, dtype=torch.float64).to(_acc(t))


def _acc(x: torch.Tensor) -> torch.dtype:
    """The statistics' dtype: fp32, or float64 for float64 inputs (the tests' exact check of every derivative)."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _tl_acc(x: torch.Tensor):
    return tl.float64 if x.dtype == torch.float64 else tl.float32
