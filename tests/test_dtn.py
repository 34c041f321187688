"""DynamicTokenNorm against the DTN paper's eq. 4-7, written out token by token."""

import dataclasses
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from transferbench.backbones.dtn import DynamicTokenNorm, neighbourhood_offsets, relative_positions


def dtn_reference(x, m: DynamicTokenNorm, grid, eps=1e-5):
    """Straight from the equations, float64, explicit loops over heads, targets and sources."""
    weight, bias, mix_mean, mix_var, pos_weight = (
        p.detach() for p in (m.weight, m.bias, m.mix_mean, m.mix_var, m.pos_weight)
    )
    x = x.double().numpy()
    B, T, C = x.shape
    H = pos_weight.shape[0]
    c = C // H
    gh, gw = grid
    pos = [(t % gw, t // gw) for t in range(T)]  # (x, y) of token t in row-major order
    a = pos_weight.double().numpy()
    out = np.empty_like(x)
    for h in range(H):
        P = np.empty((T, T))
        for t in range(T):
            logits = []
            for s in range(T):
                dx, dy = pos[s][0] - pos[t][0], pos[s][1] - pos[t][1]
                logits.append(a[h, 0] * (dx * dx + dy * dy) + a[h, 1] * dx + a[h, 2] * dy)
            e = np.exp(np.array(logits) - max(logits))
            P[t] = e / e.sum()
        lm = 1 / (1 + math.exp(-float(mix_mean[h])))
        lv = 1 / (1 + math.exp(-float(mix_var[h])))
        ch = slice(h * c, (h + 1) * c)
        for b in range(B):
            xb = x[b]
            mu_ln = xb.mean(axis=1, keepdims=True)
            var_ln = ((xb - mu_ln) ** 2).mean(axis=1, keepdims=True)
            px = P @ xb[:, ch]
            pxx = P @ (xb[:, ch] ** 2)
            mu = lm * mu_ln + (1 - lm) * px
            var = lv * var_ln + (1 - lv) * (pxx - px * px)
            out[b, :, ch] = (xb[:, ch] - mu) / np.sqrt(var + eps)
    return torch.from_numpy(out * weight.double().numpy() + bias.double().numpy())


def _random_dtn(dim=12, heads=3, grid=(3, 4), seed=1):
    g = torch.Generator().manual_seed(seed)
    m = DynamicTokenNorm(dim, heads, grid)
    with torch.no_grad():
        m.weight.copy_(1 + 0.3 * torch.randn(dim, generator=g))
        m.bias.copy_(0.3 * torch.randn(dim, generator=g))
        m.mix_mean.copy_(torch.randn(heads, generator=g))
        m.mix_var.copy_(torch.randn(heads, generator=g))
        m.pos_weight.copy_(torch.randn(heads, 3, generator=g))
    return m


def test_matches_equations_on_a_rectangular_grid():
    m = _random_dtn()
    x = torch.randn(2, 12, 12) * 2 + 0.5
    ref = dtn_reference(x, m, m.grid)
    torch.testing.assert_close(m(x).detach().double(), ref, atol=2e-5, rtol=1e-5)


def test_relative_positions_by_hand():
    R = relative_positions((2, 3))  # tokens: t=0 at (x0,y0), t=5 at (x2,y1)
    assert R.shape == (6, 6, 3)
    assert R[0, 5].tolist() == [5.0, 2.0, 1.0]  # source 5 minus target 0: dx=2, dy=1
    assert R[5, 0].tolist() == [5.0, -2.0, -1.0]
    assert R[4, 4].tolist() == [0.0, 0.0, 0.0]


def test_mix_logits_large_positive_is_layernorm():
    m = _random_dtn(dim=16, heads=4, grid=(4, 4))
    with torch.no_grad():
        m.mix_mean.fill_(40.0)
        m.mix_var.fill_(40.0)
    x = torch.randn(3, 16, 16) * 3 + 1
    expected = F.layer_norm(x, (16,), m.weight, m.bias, eps=1e-5)
    torch.testing.assert_close(m(x), expected, atol=1e-5, rtol=0)


def test_mix_logits_large_negative_with_uniform_P_is_per_channel_norm_over_tokens():
    m = _random_dtn(dim=16, heads=4, grid=(4, 4))
    with torch.no_grad():
        m.mix_mean.fill_(-40.0)
        m.mix_var.fill_(-40.0)
        m.pos_weight.zero_()  # softmax of a constant: P = 1/T everywhere
    x = torch.randn(3, 16, 16) * 3 + 1
    mean = x.mean(dim=1, keepdim=True)
    var = x.var(dim=1, keepdim=True, unbiased=False)
    expected = (x - mean) / torch.sqrt(var + 1e-5) * m.weight + m.bias
    torch.testing.assert_close(m(x), expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("heads,grid", [(12, (7, 7)), (4, (6, 5)), (3, (4, 4))])
def test_P_rows_sum_to_one(heads, grid):
    P = DynamicTokenNorm(heads * 2, heads, grid).positional_weights()
    T = grid[0] * grid[1]
    assert P.shape == (heads, T, T)
    torch.testing.assert_close(P.sum(-1), torch.ones(heads, T))


def test_P_peaks_at_each_heads_offset_at_init():
    # ViT-B: 12 heads, a 3x3 neighbourhood (offsets -1, 0, 1) for heads 0..8, heads 9..11 random.
    grid = (7, 7)
    m = DynamicTokenNorm(768, 12, grid)
    P = m.positional_weights()
    t = 3 * 7 + 3  # the centre token, away from the border
    offsets = neighbourhood_offsets(12)
    assert len(offsets) == 9 and offsets[0] == (-1.0, -1.0) and offsets[4] == (0.0, 0.0) and offsets[8] == (1.0, 1.0)
    for h, (ox, oy) in enumerate(offsets):
        s = int(P[h, t].argmax())
        assert (s % 7 - 3, s // 7 - 3) == (ox, oy), f"head {h}"
        assert m.pos_weight[h].tolist() == [-1.0, 2 * ox, 2 * oy]
    # the extra heads start small: nearly uniform rows
    assert m.pos_weight[9:].abs().max() < 0.1


def test_even_neighbourhood_peaks_between_tokens():
    # mu: 4 heads -> 2x2 window, offsets +-0.5: the four tokens around the half-integer offset tie.
    m = DynamicTokenNorm(128, 4, (6, 6))
    P = m.positional_weights()
    t = 2 * 6 + 2
    ox, oy = neighbourhood_offsets(4)[3]
    assert (ox, oy) == (0.5, 0.5)
    top = set(torch.topk(P[3, t], 4).indices.tolist())
    assert top == {t, t + 1, t + 6, t + 7}
    torch.testing.assert_close(P[3, t, [t, t + 1, t + 6, t + 7]], P[3, t, t].expand(4))


def test_factored_P_is_the_full_softmax():
    m = _random_dtn(dim=12, heads=3, grid=(3, 5))
    p_rows, p_cols = m.factored_weights()
    kron = torch.stack([torch.kron(p_rows[h], p_cols[h]) for h in range(3)])
    torch.testing.assert_close(kron, m.positional_weights(), atol=1e-7, rtol=1e-6)


def test_batch_is_vectorised_not_mixed():
    m = _random_dtn(dim=16, heads=4, grid=(4, 4))
    x = torch.randn(5, 16, 16)
    together = m(x)
    alone = torch.cat([m(x[i : i + 1]) for i in range(5)])
    # mixing examples would move outputs by O(1); 1e-5 allows the GEMM's batch-dependent sum order
    torch.testing.assert_close(together, alone, atol=1e-4, rtol=1e-5)


def test_statistics_stay_fp32_under_bf16_autocast():
    m = _random_dtn(dim=16, heads=4, grid=(4, 4))
    x = torch.randn(2, 16, 16) * 50 + 200  # large mean: bf16 moments would cancel badly
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = m(x)
    assert y.dtype == torch.float32
    torch.testing.assert_close(y, m(x), atol=1e-6, rtol=0)


def test_set_grid_rebuilds_R_and_keeps_parameters():
    m = _random_dtn(dim=12, heads=3, grid=(3, 4))
    before = {k: v.clone() for k, v in m.state_dict().items()}
    m.set_grid((6, 8))
    assert m.rel_rows.shape == (6, 6) and m.rel_cols.shape == (8, 8)
    assert m.positional_weights().shape == (3, 48, 48)
    assert not {"rel_rows", "rel_cols"} & set(m.state_dict())  # R is derived, not a weight
    for k, v in m.state_dict().items():
        torch.testing.assert_close(v, before[k])
    x = torch.randn(1, 48, 12)
    ref = dtn_reference(x, m, (6, 8))
    torch.testing.assert_close(m(x).detach().double(), ref, atol=2e-5, rtol=1e-5)


def test_wrong_token_count_is_a_clear_error():
    m = DynamicTokenNorm(8, 2, (2, 2))
    with pytest.raises(ValueError, match="5 tokens but its grid"):
        m(torch.randn(1, 5, 8))


def test_parameter_count_is_2C_plus_5H():
    m = DynamicTokenNorm(384, 6, (14, 14))
    assert sum(p.numel() for p in m.parameters()) == 2 * 384 + 2 * 6 + 3 * 6


def _dtn_dense(x, m: DynamicTokenNorm):
    """Eq. 4-7 with the full (H, T, T) P and lerps, in torch so autograd can differentiate it."""
    B, T, C = x.shape
    H = m.num_heads
    xh = x.view(B, T, H, C // H).transpose(1, 2)  # (B, H, T, d)
    P = m.positional_weights().to(x.dtype)  # (H, T, T)
    m1, m2 = P @ xh, P @ (xh * xh)
    mean_ln = x.mean(-1, keepdim=True)[:, None]
    var_ln = x.var(-1, unbiased=False, keepdim=True)[:, None]
    lam_mu, lam_sig = (torch.sigmoid(p).to(x.dtype).view(H, 1, 1) for p in (m.mix_mean, m.mix_var))
    mean = torch.lerp(m1, mean_ln, lam_mu)
    var = torch.lerp(m2 - m1 * m1, var_ln, lam_sig)
    y = ((xh - mean) / torch.sqrt(var + m.eps)).transpose(1, 2).reshape(B, T, C)
    return y * m.weight + m.bias


def test_gradients_match_the_dense_equations():
    # the fused forward (head-major layout, rearranged eq. 5-6) must differentiate like eq. 4-7 written
    # plainly: inputs and every parameter, in float64
    m = _random_dtn(dim=12, heads=3, grid=(3, 4)).double()
    x = (torch.randn(2, 12, 12, dtype=torch.float64) * 2 + 0.5).requires_grad_()
    g = torch.randn(2, 12, 12, dtype=torch.float64)
    grads = []
    for f in (m, lambda x: _dtn_dense(x, m)):
        m.zero_grad()
        x.grad = None
        (f(x) * g).sum().backward()
        grads.append([x.grad.clone()] + [p.grad.clone() for p in m.parameters()])
    for ours, dense in zip(*grads):
        torch.testing.assert_close(ours, dense, atol=1e-10, rtol=1e-8)


def test_batch_slices_change_no_output_or_gradient(monkeypatch):
    # on CPU the fused function walks the batch in cache-sized slices; 1-example slices must give the
    # whole-batch outputs and gradients (parameter gradients summed over slices)
    import transferbench.backbones.dtn as dtn

    m = _random_dtn(dim=12, heads=3, grid=(3, 4))
    x = (torch.randn(5, 12, 12) * 2 + 0.5).requires_grad_()
    g = torch.randn(5, 12, 12)
    results = []
    for nbytes in (1 << 30, 1):
        monkeypatch.setattr(dtn, "_SLICE_BYTES", nbytes)
        assert len(dtn.plan_for(x.detach(), False).slices(5)) == (1 if nbytes > 1 else 5)
        m.zero_grad()
        x.grad = None
        out = m(x)
        (out * g).sum().backward()
        results.append([out.detach()] + [x.grad.clone()] + [p.grad.clone() for p in m.parameters()])
    for whole, sliced in zip(*results):
        torch.testing.assert_close(sliced, whole, atol=1e-5, rtol=1e-5)


def test_constant_token_has_finite_gradients():
    # a token with zero LN variance (e.g. a flat image patch): the fused norm must not divide by zero
    m = _random_dtn(dim=8, heads=2, grid=(2, 2))
    x = torch.randn(1, 4, 8)
    x[0, 1] = 3.0
    x.requires_grad_()
    m(x).square().sum().backward()
    assert torch.isfinite(x.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in m.parameters())


def _grads(f, m, x, g):
    m.zero_grad()
    x.grad = None
    out = f(x)
    (out * g).sum().backward()
    return [out.detach(), x.grad.clone()] + [p.grad.clone() for p in m.parameters()]


def test_gram_kernel_gradients_equal_the_two_products(monkeypatch):
    # the GPU's route to dL/dP_rows and dL/dP_cols (one Gram product per head, contracted with the other kernel)
    # must give the CPU's two direct products, in float64 to rounding
    import transferbench.backbones.dtn as dtn

    m = _random_dtn(dim=12, heads=3, grid=(3, 4)).double()
    x = (torch.randn(3, 12, 12, dtype=torch.float64) * 2 + 0.5).requires_grad_()
    g = torch.randn(3, 12, 12, dtype=torch.float64)
    direct = _grads(m, m, x, g)
    planned = dtn.plan_for
    monkeypatch.setattr(dtn, "plan_for", lambda t, autocast: dataclasses.replace(planned(t, autocast), gram=True))
    gram = _grads(m, m, x, g)
    assert m.pos_weight.grad.abs().max() > 1e-3  # the kernels' gradients are really exercised
    for a, b in zip(direct, gram):
        torch.testing.assert_close(b, a, atol=1e-11, rtol=1e-9)


def test_kron_operator_passes_torch_opcheck_and_gradcheck():
    # the custom operator torch.compile sees: its fake (meta) kernel, autograd registration and schema agree
    # with its eager kernel (torch.library.opcheck), and its backward is the true derivative (gradcheck)
    from transferbench.backbones.dtn_ops import dtn_kron

    gen = torch.Generator().manual_seed(0)
    p_rows = torch.rand(2, 3, 3, generator=gen, dtype=torch.float64).softmax(-1).requires_grad_()
    p_cols = torch.rand(2, 4, 4, generator=gen, dtype=torch.float64).softmax(-1).requires_grad_()
    moments = torch.randn(2, 3, 4, 5, generator=gen, dtype=torch.float64).requires_grad_()
    for gram in (False, True):
        torch.library.opcheck(dtn_kron, (p_rows, p_cols, moments, False, gram))
        kron = lambda a, b, c, gram=gram: dtn_kron(a, b, c, False, gram)  # noqa: E731
        assert torch.autograd.gradcheck(kron, (p_rows, p_cols, moments))


def test_compiler_visible_layer_is_the_hand_written_one():
    # under torch.compile the layer is plain ops around dtn_kron; forward and every gradient must be _DTN's
    # (float64, to rounding). aot_eager runs the compiler's tracing and its derived backward without codegen.
    import torch._dynamo

    m = _random_dtn(dim=12, heads=3, grid=(3, 4)).double()
    x = (torch.randn(2, 12, 12, dtype=torch.float64) * 2 + 0.5).requires_grad_()
    g = torch.randn(2, 12, 12, dtype=torch.float64)
    eager = _grads(m, m, x, g)
    torch._dynamo.reset()
    compiled = _grads(torch.compile(m, backend="aot_eager", fullgraph=True), m, x, g)
    for a, b in zip(eager, compiled):
        torch.testing.assert_close(b, a, atol=1e-10, rtol=1e-8)


def test_backward_stays_fp32_when_called_inside_autocast():
    # the statistics' gradients run in fp32 however backward() is called: inside an autocast region (a loss computed
    # under it) the hand-written backward's products would otherwise round to bf16
    m = _random_dtn(dim=12, heads=3, grid=(3, 4))
    x = (torch.randn(2, 12, 12) * 2 + 0.5).requires_grad_()
    g = torch.randn(2, 12, 12)
    outside = _grads(m, m, x, g)
    m.zero_grad()
    x.grad = None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        (m(x) * g).sum().backward()
    for a, b in zip(outside[1:], [x.grad] + [p.grad for p in m.parameters()]):
        torch.testing.assert_close(b, a, atol=1e-6, rtol=1e-5)
