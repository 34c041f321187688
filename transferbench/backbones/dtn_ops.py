"""DTN's operators (transferbench.backbones.dtn): the Kronecker application P^h = P_rows^h (kron) P_cols^h of the
position kernels to the moments and its backward (one Gram product per head on a GPU, two small products on a CPU),
as functions and as the custom operator `dtn_kron` that torch.compile keeps whole; and the fused Triton kernels'
operators (`dtn_fused`, `dtn_fused_backward`: `dtn_kernels`) behind `dtn_fused_layer`, the GPU's path."""

from __future__ import annotations

from contextlib import contextmanager

import torch

from . import dtn_kernels


@contextmanager
def _tf32(enabled: bool):
    """TF32 products for the block (a CUDA setting; CPUs ignore it), restored after."""
    if not enabled:
        yield
        return
    flags = torch.backends.cuda.matmul
    before = flags.allow_tf32
    flags.allow_tf32 = True
    try:
        yield
    finally:
        flags.allow_tf32 = before


def _kernel_gradients(d_m, moments, p_rows, p_cols, tf32: bool = False):
    """dL/dP_rows (H, gh, gh) and dL/dP_cols (H, gw, gw) from one Gram product per head.

    With m = (P_rows kron P_cols) moments over the token grid, dL/dP_rows[i, j] = sum_cd P_cols[c, d] G[(i c), (j d)]
    and dL/dP_cols[c, d] = sum_ij P_rows[i, j] G[(i c), (j d)], where G = d_m moments^T (T x T per head) sums over
    the batch and the channels, K = B.2d. One (T x K) by (K x T) product per head runs on a GPU near its matrix
    rate (TF32 where the layer ran under autocast, `tf32`); the contractions with the kernels are tiny.
    `d_m`, `moments`: (H, gh, gw, K)."""
    H, gh, gw = d_m.shape[:3]
    T = gh * gw
    with _tf32(tf32):
        gram = torch.bmm(d_m.reshape(H, T, -1), moments.reshape(H, T, -1).transpose(1, 2))
    gram = gram.view(H, gh, gw, gh, gw)  # [head, target row, target col, source row, source col]
    g_rows = torch.einsum("hicjd,hcd->hij", gram, p_cols)
    g_cols = torch.einsum("hicjd,hij->hcd", gram, p_rows)
    return g_rows, g_cols


def _kron_backward(d_m, moments, p_rows, p_cols, tf32: bool = False, gram: bool = False):
    """Back through m = (P_rows kron P_cols) moments, all (H, gh, gw, K): (dL/dP_rows, dL/dP_cols, dL/dmoments); the
    kernels' gradients by one Gram product per head where `gram` (Plan.gram), else by two small products."""
    H, gh, gw = d_m.shape[:3]
    d_rows = torch.matmul(p_cols.transpose(-1, -2)[:, None], d_m).view(H, gh, -1)
    if gram:
        g_rows, g_cols = _kernel_gradients(d_m, moments, p_rows, p_cols, tf32)
    else:
        rows = torch.bmm(p_rows, moments.reshape(H, gh, -1)).view(H, gh, gw, -1)
        g_cols = torch.matmul(d_m, rows.transpose(-1, -2)).sum(1)  # (H, gw, gw)
        g_rows = torch.bmm(d_rows, moments.reshape(H, gh, -1).transpose(1, 2))  # (H, gh, gh)
    d_moments = torch.bmm(p_rows.transpose(1, 2), d_rows)
    return g_rows, g_cols, d_moments.view(d_m.shape)


def _kron(p_rows, p_cols, moments):
    """(P_rows kron P_cols) applied to moments (H, gh, gw, K) laid out on the token grid."""
    H, gh, gw = moments.shape[:3]
    rows = torch.bmm(p_rows, moments.reshape(H, gh, -1))  # (H, gh, gh) @ (H, gh, gw*K)
    return torch.matmul(p_cols[:, None], rows.view(H, gh, gw, -1))  # per (head, row): (gw, gw) @ (gw, K)


@torch.library.custom_op("transferbench::dtn_kron", mutates_args=())
def dtn_kron(p_rows: torch.Tensor, p_cols: torch.Tensor, moments: torch.Tensor, tf32: bool, gram: bool) -> torch.Tensor:
    """The Kronecker application as one operator that torch.compile keeps whole (its backward is
    `dtn_kron_backward`, whose Gram product the compiler would otherwise split into the two slow shapes)."""
    return _kron(p_rows, p_cols, moments.contiguous())


@dtn_kron.register_fake
def _(p_rows, p_cols, moments, tf32, gram):
    return moments.new_empty(moments.shape)


@torch.library.custom_op("transferbench::dtn_kron_backward", mutates_args=())
def dtn_kron_backward(
    grad: torch.Tensor, moments: torch.Tensor, p_rows: torch.Tensor, p_cols: torch.Tensor, tf32: bool, gram: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _kron_backward(grad.contiguous(), moments.contiguous(), p_rows, p_cols, tf32, gram)


@dtn_kron_backward.register_fake
def _(grad, moments, p_rows, p_cols, tf32, gram):
    H, gh, gw = moments.shape[:3]
    return p_rows.new_empty(H, gh, gh), p_cols.new_empty(H, gw, gw), moments.new_empty(moments.shape)


def _kron_setup(ctx, inputs, output):
    p_rows, p_cols, moments, tf32, gram = inputs
    ctx.save_for_backward(p_rows, p_cols, moments)
    ctx.tf32, ctx.gram = tf32, gram


def _kron_grad(ctx, grad):
    p_rows, p_cols, moments = ctx.saved_tensors
    with torch.autocast(device_type=grad.device.type, enabled=False):
        g_rows, g_cols, d_moments = dtn_kron_backward(grad, moments, p_rows, p_cols, ctx.tf32, ctx.gram)
    return g_rows, g_cols, d_moments, None, None


dtn_kron.register_autograd(_kron_grad, setup_context=_kron_setup)


def _full_kernel(p_rows: torch.Tensor, p_cols: torch.Tensor) -> torch.Tensor:
    """P^h = kron(P_rows^h, P_cols^h) as dense (H, T, T): the kernels' operand; autograd takes dL/dP to the factors."""
    H, gh, gw = p_rows.shape[0], p_rows.shape[1], p_cols.shape[1]
    return (p_rows[:, :, None, :, None] * p_cols[:, None, :, None, :]).reshape(H, gh * gw, gh * gw)


def dtn_fused_layer(x, p_rows, p_cols, lam_mu, lam_sig, weight, bias, eps, plan):
    """Eq. 4-7 through the fused kernels (`dtn_fused`), under `plan` (dtn.Plan): the same function as `_DTN` up to
    floating-point rounding (tested under Triton's interpreter against the float64 equations). Outside autocast
    (`plan.tf32` False) every product is IEEE fp32; under it the statistics take three-pass TF32 and dL/dP one-pass
    TF32."""
    P = _full_kernel(p_rows, p_cols)
    lam = torch.stack([lam_mu, lam_sig], dim=-1)
    y, _ = dtn_fused(x, P, lam, weight, bias, float(eps), not plan.tf32)
    return y


@torch.library.custom_op("transferbench::dtn_fused", mutates_args=())
def dtn_fused(
    x: torch.Tensor,
    P: torch.Tensor,
    lam: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    eps: float,
    precise: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, LayerNorm statistics (B, T, 2)) of eq. 4-7 from the fused forward kernel."""
    args = (t.contiguous() for t in (x, P, lam, weight, bias))
    return dtn_kernels.forward(*args, eps, precise)


@dtn_fused.register_fake
def _(x, P, lam, weight, bias, eps, precise):
    return x.new_empty(x.shape), x.new_empty(*x.shape[:2], 2)


@torch.library.custom_op("transferbench::dtn_fused_backward", mutates_args=())
def dtn_fused_backward(
    grad: torch.Tensor,
    x: torch.Tensor,
    P: torch.Tensor,
    lam: torch.Tensor,
    weight: torch.Tensor,
    stats: torch.Tensor,
    eps: float,
    precise: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dL/dx, dL/dP, dL/dlam, dL/dweight, dL/dbias) from the three fused backward kernels."""
    args = (t.contiguous() for t in (grad, x, P, lam, weight, stats))
    return dtn_kernels.backward(*args, eps, precise)


@dtn_fused_backward.register_fake
def _(grad, x, P, lam, weight, stats, eps, precise):
    return (
        x.new_empty(x.shape),
        P.new_empty(P.shape),
        lam.new_empty(lam.shape),
        weight.new_empty(weight.shape),
        (weight.new_empty(weight.shape)),
    )


def _fused_setup(ctx, inputs, output):
    x, P, lam, weight, bias, eps, precise = inputs
    ctx.save_for_backward(x, P, lam, weight, output[1])
    ctx.eps, ctx.precise = eps, precise


def _fused_grad(ctx, grad, grad_stats):
    x, P, lam, weight, stats = ctx.saved_tensors
    with torch.autocast(device_type=grad.device.type, enabled=False):
        dx, dP, dlam, dw, db = dtn_fused_backward(grad, x, P, lam, weight, stats, ctx.eps, ctx.precise)
    return dx, dP, dlam, dw, db, None, None


dtn_fused.register_autograd(_fused_grad, setup_context=_fused_setup)
