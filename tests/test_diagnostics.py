"""Intermediates and attention maps of the backbone, the diagnostics measures against hand computations, and the
diagnose adapter's cells, tables and figures."""

import math

import numpy as np
import pytest
import torch
from conftest import randomize_

from transferbench.backbones import create_backbone
from transferbench.backbones import measures as M
from transferbench.backbones.vit import attention_maps
from transferbench.records.stats import pool


def manual_blocks(m, x):
    """Block by block, written out: embed, (cls after the DTN blocks), each block's output."""
    t = m.patch_embed(x) + m.pos_embed[:, m.num_prefix_tokens :]
    outs = []
    for i, blk in enumerate(m.blocks):
        if i == m.dtn_layers:
            cls = (m.cls_token + m.pos_embed[:, :1]).expand(len(x), -1, -1)
            t = torch.cat([cls, t], dim=1)
        t = blk(t)
        outs.append(t)
    return outs


@pytest.mark.parametrize("name", ["mu4", "mu4_dpn", "mu4_dtn"])
def test_intermediates_equal_a_manual_block_by_block_forward(name):
    m = randomize_(create_backbone(name, img_size=16))
    x = torch.randn(2, 3, 16, 16)
    ref = manual_blocks(m, x)
    final, inter = m.forward_intermediates(x, output_fmt="NLC", return_prefix_tokens=True)
    torch.testing.assert_close(final, m.norm(ref[-1]))
    torch.testing.assert_close(final, m.forward_features(x))
    for i, (patches, prefix) in enumerate(inter):
        p = 1 if i >= m.dtn_layers else 0  # DTN blocks see patch tokens only
        assert prefix.shape == (2, p, 128)
        torch.testing.assert_close(patches, ref[i][:, p:])
    # timm's index rules: an int takes the last n, negatives count from the end; norm and NCHW maps
    last2 = m.forward_intermediates(x, indices=2, norm=True, intermediates_only=True)
    picked = m.forward_intermediates(x, indices=[-2, 5], norm=True, intermediates_only=True)
    for a, b, r in zip(last2, picked, ref[-2:]):
        assert a.shape == (2, 128, 4, 4)
        torch.testing.assert_close(a, b)
        torch.testing.assert_close(a, m.norm(r)[:, 1:].reshape(2, 4, 4, 128).permute(0, 3, 1, 2))
    early = m.forward_intermediates(x, indices=[1], stop_early=True, intermediates_only=True, output_fmt="NLC")
    torch.testing.assert_close(early[0], ref[1][:, 1 if m.dtn_layers <= 1 else 0 :])
    with pytest.raises(AssertionError):
        m.forward_intermediates(x, indices=[6])


def test_attention_maps_rows_sum_to_one_and_match_the_fused_kernel():
    m = randomize_(create_backbone("mu4_dtn", img_size=16), scale=0.3)
    x = torch.randn(3, 3, 16, 16)
    plain = m.forward_features(x)
    with attention_maps(m) as maps:
        captured = m.forward_features(x)
    torch.testing.assert_close(captured, plain, atol=1e-4, rtol=1e-3)  # explicit softmax == SDPA (float rounding)
    assert [i for i, _ in maps] == list(range(6))
    for i, p in maps:
        n = 16 if i < m.dtn_layers else 17
        assert p.shape == (3, 4, n, n)
        torch.testing.assert_close(p.sum(-1), torch.ones(3, 4, n))
        assert p.std() > 0.01  # randomised weights: not uniform
    assert all(b.attn.capture is None for b in m.blocks)  # the fused kernel again outside the context


def test_patch_cosine_is_one_for_identical_and_zero_for_orthogonal_tokens():
    same = torch.randn(1, 1, 32).expand(2, 10, 32) * torch.tensor([1.0, 3.0]).view(2, 1, 1)
    torch.testing.assert_close(M.patch_cosine(same), torch.ones(2))
    q, _ = torch.linalg.qr(torch.randn(64, 64))
    ortho = (q[:16] * torch.rand(16, 1).add(0.5)).unsqueeze(0)  # 16 orthogonal tokens, any lengths
    assert M.patch_cosine(ortho).abs().item() < 1e-6
    # against the O(N^2) definition on random tokens
    t = torch.randn(3, 7, 5)
    u = torch.nn.functional.normalize(t, dim=-1)
    sim = u @ u.transpose(1, 2)
    want = (sim.sum((1, 2)) - sim.diagonal(dim1=1, dim2=2).sum(-1)) / (7 * 6)
    torch.testing.assert_close(M.patch_cosine(t), want)


def test_attention_distance_zero_for_identity_and_by_hand_for_uniform():
    eye = torch.eye(4).expand(1, 2, 4, 4)
    assert M.attention_distance(eye, (2, 2), 16).abs().max() == 0
    # 2 x 2 grid of 16 px patches: from any patch, keys at 0, 16, 16 and 16*sqrt(2) px
    uniform = torch.full((1, 1, 4, 4), 0.25)
    want = 16 * (0 + 1 + 1 + math.sqrt(2)) / 4
    assert M.attention_distance(uniform, (2, 2), 16).item() == pytest.approx(want)
    # a cls token: left out as query and key, the rows renormalised over the patch keys
    with_cls = torch.zeros(1, 1, 5, 5)
    with_cls[..., 0] = 0.5
    with_cls[..., 1:] = 0.125
    assert M.attention_distance(with_cls, (2, 2), 16, prefix=1).item() == pytest.approx(want)
    # 1 x 3 grid, uniform: mean over queries of (0+1+2)/3, (1+0+1)/3, (2+1+0)/3 = 8/9 patches
    assert M.attention_distance(torch.full((1, 1, 3, 3), 1 / 3), (1, 3)).item() == pytest.approx(8 / 9)


def test_attention_row_std_by_hand():
    rows = torch.tensor([[0.25, 0.25, 0.25, 0.25], [1.0, 0.0, 0.0, 0.0]]).view(1, 1, 2, 4)
    assert M.attention_row_std(rows).item() == pytest.approx((0 + math.sqrt(3) / 4) / 2)


def test_dpn_scale_maps_follow_the_stems_p1_p2_c_order():
    m = create_backbone("mu4_dpn", img_size=16)
    with torch.no_grad():
        w = m.patch_embed.norm_pre.weight
        w.fill_(1.0)
        y, x, c = 1, 3, 2  # row 1, column 3 of the 4 x 4 patch, blue
        w[(y * 4 + x) * 3 + c] = 5.0
    maps = M.stem_scale_maps(m)
    assert maps.shape == (3, 4, 4) and maps[c, y, x] == 5.0 and (maps == 5.0).sum() == 1
    # and that index is the pixel the patchify sends there: a one-hot image lands on that weight
    img = torch.zeros(1, 3, 16, 16)
    img[0, c, 4 + y, 8 + x] = 1.0  # patch (1, 2) of the 4 x 4 grid
    flat = m.patch_embed.patchify(img)[0, 1 * 4 + 2]
    assert flat.argmax().item() == (y * 4 + x) * 3 + c
    assert M.stem_scale_maps(create_backbone("mu4", img_size=16)) is None


def test_dtn_statistics_are_sigmoids_and_widths_of_the_kernel():
    m = create_backbone("mu4_dtn", img_size=16)
    with torch.no_grad():
        m.blocks[0].norm1.mix_mean.copy_(torch.tensor([0.0, 2.0, -2.0, 1.0]))
        m.blocks[0].norm1.pos_weight[0] = torch.tensor([-1e4, 0.0, 0.0])  # a kernel on the token itself: width 0
    stats = M.dtn_statistics(m)
    assert [s["name"] for s in stats][:2] == ["0.norm1", "0.norm2"] and len(stats) == 8  # 4 DTN blocks x 2
    assert stats[0]["lambda_mean"] == pytest.approx(torch.sigmoid(torch.tensor([0.0, 2.0, -2.0, 1.0])).tolist())
    assert stats[0]["width"][0] == pytest.approx(0.0, abs=1e-6)
    with torch.no_grad():
        m.blocks[0].norm1.pos_weight[1] = 0.0  # a flat kernel: the uniform mean distance of the 4 x 4 grid
    d = M.grid_distances((4, 4), 4)
    assert M.dtn_statistics(m)[0]["width"][1] == pytest.approx(float(d.mean()), rel=1e-5)


def test_pooled_summaries_equal_the_statistics_of_all_samples():
    rng = np.random.default_rng(0)
    parts = [rng.normal(size=(n, 3)) for n in (5, 8, 2)]
    summaries = [{"mean": p.mean(0), "sd": p.std(0, ddof=1), "n": len(p)} for p in parts]
    pooled = pool(summaries)
    everything = np.concatenate(parts)
    np.testing.assert_allclose(pooled["mean"], everything.mean(0))
    np.testing.assert_allclose(pooled["sd"], everything.std(0, ddof=1))
    assert pooled["n"] == 15


def test_layer_gradient_norms_are_seen_before_clipping():
    from transferbench.engine.losses import cross_entropy
    from transferbench.engine.train import fit

    m = create_backbone("mu4", img_size=16, num_classes=3)
    torch.nn.init.normal_(m.head.weight)
    seen = []

    def on_step(step):
        layers, embed = M.layer_grad_norms(m)
        grads = [p.grad for p in m.blocks[2].parameters()]
        seen.append((layers, embed, float(torch.cat([g.flatten() for g in grads]).norm())))

    x, y = torch.randn(8, 3, 16, 16), torch.randint(0, 3, (8,))
    opt = torch.optim.SGD(m.parameters(), lr=0.0)
    fit(
        m,
        iter([(x, y)] * 2),
        opt,
        steps=2,
        base_lr=0.0,
        warmup=1,
        clip=1e-6,
        loss_fn=cross_entropy,
        device="cpu",
        bf16=False,
        on_step=on_step,
    )
    assert len(seen) == 2
    layers, embed, block2 = seen[0]
    assert layers[2] == pytest.approx(block2, rel=1e-5) and embed > 1e-3  # not the clipped 1e-6


# --- the adapter ------------------------------------------------------------------------------------------


def _task(**sets):
    from transferbench.adapters import prepare_task

    base = {"images": "24", "steps": "4", "warmup_steps": "1", "grad_last": "2", "eval_batch": "10"}
    return prepare_task(
        "diagnose",
        suite="embedded",
        datasets=["mini_photos"],
        seeds=[0, 1],
        sets=[f"{k}={v}" for k, v in {**base, **sets}.items()],
    )


def test_diagnose_cells_records_tables_and_figures(suite_home, tmp_path):
    from transferbench.adapters import resolve_backbone
    from transferbench.engine.runner import RunOptions, run_task
    from transferbench.records.store import load_records
    from transferbench.reporting.diagnostics import figures
    from transferbench.reporting.formats import render
    from transferbench.reporting.kinds import report_tables

    task = _task()
    out = tmp_path / "runs"
    backbones = [resolve_backbone(b) for b in ("mu4", "mu4_dpn@embedded")]
    summary = run_task(task, backbones, out, RunOptions(show_progress=False))
    assert summary.ok == 2 * 2 * 2 and summary.failed == 0  # backbones x seeds x (forward, gradients)
    recs = load_records([out])
    fwd = {(r["backbone"], r["seed"]): r for r in recs if r["stage"] == "forward"}
    for r in fwd.values():
        d = r["info"]["diagnostics"]
        assert d["patch_cosine"]["n"] == 24 and len(d["attn_distance"]["mean"]) == 6
        assert len(d["attn_distance"]["mean"][0]) == 4  # heads
        assert r["metrics"]["test"]["patch_cosine"] == pytest.approx(d["patch_cosine"]["mean"][-1])
    # random init attends almost uniformly (weights of std 0.02: tiny logits); the pretrained model does not
    rand = fwd[("mu4", 0)]["info"]["diagnostics"]["attn_std"]["mean"]
    pre = fwd[("mu4_dpn@embedded", 0)]["info"]["diagnostics"]["attn_std"]["mean"]
    assert max(rand) < 0.01 < min(pre)
    # random init depends on the seed; so does the image subsample (the slides' seeded draw): a checkpoint's
    # forward measures differ between seeds, its weight measures do not
    assert fwd[("mu4", 0)]["metrics"]["test"] != fwd[("mu4", 1)]["metrics"]["test"]
    assert fwd[("mu4_dpn@embedded", 0)]["metrics"]["test"] != fwd[("mu4_dpn@embedded", 1)]["metrics"]["test"]
    assert (
        fwd[("mu4_dpn@embedded", 0)]["info"]["diagnostics"]["stem_scale_maps"]
        == fwd[("mu4_dpn@embedded", 1)]["info"]["diagnostics"]["stem_scale_maps"]
    )
    assert fwd[("mu4_dpn@embedded", 0)]["info"]["diagnostics"]["stem_scale_maps"] is not None
    assert fwd[("mu4", 0)]["info"]["diagnostics"]["stem_scale_maps"] is None
    grads = [r for r in recs if r["stage"] == "gradients"]
    assert all(
        len(r["info"]["diagnostics"]["embed_grad_norm_steps"]) == 4 and r["metric"] == "embed_grad_norm" for r in grads
    )
    tables = report_tables(recs)
    titles = [t.metric for t in tables]
    assert titles[:6] == [
        "patch cosine similarity",
        "attention row std",
        "token norm",
        "mean attention distance (px, mean over heads)",
        "mean attention distance (patches, mean over heads)",
        "gradient norm (last fine-tuning steps)",
    ]
    cos = tables[0]
    pooled = np.mean([fwd[("mu4", s)]["info"]["diagnostics"]["patch_cosine"]["mean"][5] for s in (0, 1)])
    assert cos.rows["mu4"]["L5"].estimate.mean == pytest.approx(pooled) and cos.rows["mu4"]["L5"].estimate.n == 48
    assert "stem LayerNorm scale per colour channel" in titles
    assert "| mu4_dpn@embedded" in render(tables) and ",mu4,L5,dataset," in render(tables, "csv")
    pngs = figures(recs, tmp_path / "fig", "lb")
    kinds = {p.name.rsplit("_", 1)[-1] for _, _, p in pngs}
    assert {"depth.png", "distance.png", "stem.png", "grad.png"} <= kinds and all(
        p.stat().st_size > 5000 for _, _, p in pngs
    )
    assert (
        run_task(task, backbones, out, RunOptions(show_progress=False)).skipped == 8
    )  # a rerun resumes: nothing to do


def test_bad_settings_are_one_line(suite_home):
    """The settings model's bounds stop a run before anything is checked or computed, naming the fix."""
    from transferbench.errors import UserError

    for key in ("images", "steps", "grad_last"):
        match = rf"task 'diagnose': {key} = 0: .*greater than or equal to 1 .*--set {key}="
        with pytest.raises(UserError, match=match):
            _task(**{key: "0"})


@pytest.mark.parametrize("class_token", [True, False])
def test_forward_intermediates_returns_what_timm_returns(class_token):
    """timm's contract to the letter: with `return_prefix_tokens`, (patches, prefix) pairs for a model with prefix
    tokens and plain patch tensors for one without; timm's own ViT of the same shape and weights is the reference."""
    import timm

    kw = dict(img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=2, num_classes=0)
    pool = "token" if class_token else "avg"
    ref = randomize_(timm.create_model("vit_tiny_patch16_224", class_token=class_token, global_pool=pool, **kw))
    from transferbench.backbones import VisionTransformer

    ours = VisionTransformer(**{**kw, "num_classes": 0}, class_token=class_token, pool="tok" if class_token else "gap")
    from transferbench.backbones.convert import convert_timm

    ours.load_state_dict(convert_timm(ref.state_dict()).state_dict, strict=False)
    x = torch.randn(2, 3, 16, 16)
    want = ref.forward_intermediates(x, return_prefix_tokens=True, output_fmt="NLC", intermediates_only=True)
    got = ours.forward_intermediates(x, return_prefix_tokens=True, output_fmt="NLC", intermediates_only=True)
    assert [type(w) for w in want] == [type(g) for g in got] == [tuple if class_token else torch.Tensor] * 2
    for w, g in zip(want, got):
        for a, b in zip(w if class_token else [w], g if class_token else [g]):
            torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)
