"""Weights: our safetensors round trip, timm and big_vision converters giving the source model's logits,
and the errors a user sees for a wrong or unsafe file."""

import json
import math
import os
import pickle

import numpy as np
import pytest
import timm
import torch
from conftest import randomize_
from safetensors.torch import save_file

from transferbench import create_backbone
from transferbench.backbones import CheckpointError, read_checkpoint, save_checkpoint

# --- timm ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["pth", "safetensors"])
@pytest.mark.parametrize("pool,timm_kw", [("tok", {}), ("gap", dict(global_pool="avg", fc_norm=False))])
def test_timm_vit_tiny_gives_the_same_logits(tmp_path, fmt, pool, timm_kw):
    ref = randomize_(timm.create_model("vit_tiny_patch16_224", pretrained=False, **timm_kw))
    path = tmp_path / f"timm.{fmt}"
    if fmt == "pth":
        torch.save(ref.state_dict(), path)
    else:
        save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, str(path))
    ours = create_backbone("ti16", num_classes=1000, checkpoint=path, pool=pool).eval()
    img = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        torch.testing.assert_close(ours(img), ref(img), atol=1e-5, rtol=0)
        torch.testing.assert_close(ours.forward_features(img), ref.forward_features(img), atol=1e-5, rtol=0)


def test_timm_checkpoint_into_the_wrong_size_lists_shapes(tmp_path):
    ref = timm.create_model("vit_tiny_patch16_224", pretrained=False)
    torch.save(ref.state_dict(), tmp_path / "t.pth")
    with pytest.raises(CheckpointError) as e:
        create_backbone("s16", checkpoint=tmp_path / "t.pth")
    msg = str(e.value)
    assert "\n" not in msg and "embed_dim: checkpoint 192 vs backbone 384" in msg


# --- big_vision --------------------------------------------------------------------------------------


def bv_params(*, width=32, depth=2, heads=2, mlp=48, patch=4, grid=4, classes=5, cls=True, naflex=False, seed=0, rep=0):
    """Random arrays with the shapes of a big_vision ViT (flax layouts)."""
    rng = np.random.default_rng(seed)
    r = lambda *s, scale=0.3: (rng.standard_normal(s) * scale).astype(np.float32)  # noqa: E731
    p = {}
    if naflex:
        p["embedding/kernel"] = r(patch * patch * 3, width)
        p["patchln_pre/scale"], p["patchln_pre/bias"] = 1 + r(patch * patch * 3), r(patch * patch * 3)
        p["patchln_post/scale"], p["patchln_post/bias"] = 1 + r(width), r(width)
        p["pos_embedding"] = r(grid, grid, width)
    else:
        p["embedding/kernel"] = r(patch, patch, 3, width)
        p["pos_embedding"] = r(1, grid * grid, width)
    p["embedding/bias"] = r(width)
    if cls:
        p["cls"] = r(1, 1, width)
    hd = width // heads
    for i in range(depth):
        b = f"Transformer/encoderblock_{i}/"
        for ln in ("LayerNorm_0", "LayerNorm_1"):
            p[b + ln + "/scale"], p[b + ln + "/bias"] = 1 + r(width), r(width)
        for n in ("query", "key", "value"):
            p[b + f"MultiHeadDotProductAttention_0/{n}/kernel"] = r(width, heads, hd)
            p[b + f"MultiHeadDotProductAttention_0/{n}/bias"] = r(heads, hd)
        p[b + "MultiHeadDotProductAttention_0/out/kernel"] = r(heads, hd, width)
        p[b + "MultiHeadDotProductAttention_0/out/bias"] = r(width)
        p[b + "MlpBlock_0/Dense_0/kernel"], p[b + "MlpBlock_0/Dense_0/bias"] = r(width, mlp), r(mlp)
        p[b + "MlpBlock_0/Dense_1/kernel"], p[b + "MlpBlock_0/Dense_1/bias"] = r(mlp, width), r(width)
    p["Transformer/encoder_norm/scale"], p["Transformer/encoder_norm/bias"] = 1 + r(width), r(width)
    if rep:  # rep_size: Dense 'pre_logits' + tanh before the head
        p["pre_logits/kernel"], p["pre_logits/bias"] = r(width, rep), r(rep)
    p["head/kernel"], p["head/bias"] = r(rep or width, classes), r(classes)
    return p


def bv_forward(p, img_nhwc, patch, naflex=False):
    """big_vision's ViT forward (models/vit.py, naflex_vit.py) in float64 numpy from the flax arrays."""
    p = {k: v.astype(np.float64) for k, v in p.items()}
    n, H, W, C = img_nhwc.shape
    gh, gw = H // patch, W // patch
    blocks6 = img_nhwc.reshape(n, gh, patch, gw, patch, C).transpose(0, 1, 3, 2, 4, 5)  # n, i, j, a, b, c
    if naflex:  # patches flattened (h w c), then LayerNorm, Dense, LayerNorm
        x = ln(blocks6.reshape(n, gh * gw, -1), p["patchln_pre/scale"], p["patchln_pre/bias"])
        x = x @ p["embedding/kernel"] + p["embedding/bias"]
        x = ln(x, p["patchln_post/scale"], p["patchln_post/bias"])
    else:  # VALID conv with stride = kernel size
        x = np.einsum("nijabc,abcd->nijd", blocks6, p["embedding/kernel"]).reshape(n, gh * gw, -1) + p["embedding/bias"]
    x = x + p["pos_embedding"].reshape(1, gh * gw, -1)
    if "cls" in p:
        x = np.concatenate([np.repeat(p["cls"], n, axis=0), x], axis=1)
    depth = len({k.split("/")[1] for k in p if k.startswith("Transformer/encoderblock_")})
    for i in range(depth):
        b = f"Transformer/encoderblock_{i}/"
        a = b + "MultiHeadDotProductAttention_0/"
        y = ln(x, p[b + "LayerNorm_0/scale"], p[b + "LayerNorm_0/bias"])
        q, k, v = (
            np.einsum("nld,dhk->nlhk", y, p[a + f"{m}/kernel"]) + p[a + f"{m}/bias"] for m in ("query", "key", "value")
        )
        logits = np.einsum("nqhk,nlhk->nhql", q, k) / math.sqrt(q.shape[-1])
        w = np.exp(logits - logits.max(-1, keepdims=True))
        w /= w.sum(-1, keepdims=True)
        y = np.einsum("nhql,nlhk->nqhk", w, v)
        x = x + np.einsum("nqhk,hkd->nqd", y, p[a + "out/kernel"]) + p[a + "out/bias"]
        y = ln(x, p[b + "LayerNorm_1/scale"], p[b + "LayerNorm_1/bias"])
        y = y @ p[b + "MlpBlock_0/Dense_0/kernel"] + p[b + "MlpBlock_0/Dense_0/bias"]
        y = 0.5 * y * (1 + np.tanh(math.sqrt(2 / math.pi) * (y + 0.044715 * y**3)))  # flax nn.gelu
        x = x + y @ p[b + "MlpBlock_0/Dense_1/kernel"] + p[b + "MlpBlock_0/Dense_1/bias"]
    x = ln(x, p["Transformer/encoder_norm/scale"], p["Transformer/encoder_norm/bias"])
    x = x[:, 0] if "cls" in p else x.mean(axis=1)
    if "pre_logits/kernel" in p:
        x = np.tanh(x @ p["pre_logits/kernel"] + p["pre_logits/bias"])
    return x @ p["head/kernel"] + p["head/bias"]


def ln(x, scale, bias, eps=1e-6):
    mu = x.mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps) * scale + bias


def old_names(p):
    """The same model as the original ViT repo wrote it: MultiHeadDotProductAttention_1, LayerNorm_2,
    MlpBlock_3, and a posemb that holds the cls slot."""
    out = {}
    for k, v in p.items():
        out[
            k.replace("MlpBlock_0", "MlpBlock_3")
            .replace("LayerNorm_1", "LayerNorm_2")
            .replace("MultiHeadDotProductAttention_0", "MultiHeadDotProductAttention_1")
        ] = v
    pe = out.pop("pos_embedding")
    out["Transformer/posembed_input/pos_embedding"] = np.concatenate([np.zeros_like(pe[:, :1]), pe], axis=1)
    return out


def scanned(p, depth=2):
    out = {k: v for k, v in p.items() if not k.startswith("Transformer/encoderblock_")}
    for k in {k.split("/", 2)[2] for k in p if k.startswith("Transformer/encoderblock_")}:
        out[f"Transformer/encoderblock/{k}"] = np.stack([p[f"Transformer/encoderblock_{i}/{k}"] for i in range(depth)])
    return out


@pytest.mark.parametrize(
    "variant", ["vit_tok", "vit_gap", "old_names", "scanned", "params_prefix", "naflex_dpn", "rep_size"]
)
def test_big_vision_npz_gives_the_same_logits(tmp_path, variant):
    naflex = variant == "naflex_dpn"
    p = bv_params(cls=variant not in ("vit_gap", "naflex_dpn"), naflex=naflex, rep=24 if variant == "rep_size" else 0)
    stored = {
        "old_names": old_names,
        "scanned": scanned,
        "params_prefix": lambda q: {f"params/{k}": v for k, v in q.items()},
    }.get(variant, lambda q: q)(p)
    np.savez(tmp_path / "bv.npz", **stored)
    img = np.random.default_rng(1).uniform(-1, 1, (2, 16, 16, 3))
    expected = bv_forward(p, img, 4, naflex=naflex)
    name = "mu4_dpn" if naflex else "mu4"
    ours = create_backbone(
        name, num_classes=5, checkpoint=tmp_path / "bv.npz", embed_dim=32, depth=2, num_heads=2, mlp_dim=48, img_size=16
    ).eval()
    assert ours.config["act"] == "gelu_tanh" and ours.pool == ("gap" if variant in ("vit_gap", "naflex_dpn") else "tok")
    assert ours.config["rep_size"] == (24 if variant == "rep_size" else 0)
    with torch.no_grad():
        got = ours(torch.from_numpy(img.transpose(0, 3, 1, 2)).float())
    np.testing.assert_allclose(got.double().numpy(), expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("layout", ["original_vit_repo_tok", "big_vision_gap"])
def test_big_vision_npz_agrees_with_timms_own_npz_loader(tmp_path, layout):
    tok = layout == "original_vit_repo_tok"
    p = bv_params(width=48, heads=3, mlp=96, grid=4, cls=tok)
    np.savez(tmp_path / "bv.npz", **(old_names(p) if tok else p))
    # timm reads cls models in the original repo's layout and big_vision's layout for models without cls
    ref = timm.models.vision_transformer.VisionTransformer(
        img_size=16,
        patch_size=4,
        embed_dim=48,
        depth=2,
        num_heads=3,
        mlp_ratio=2,
        num_classes=5,
        act_layer="gelu_tanh",
        class_token=tok,
        global_pool="token" if tok else "avg",
        fc_norm=False,
    )
    timm.models.vision_transformer._load_weights(ref, str(tmp_path / "bv.npz"))
    ours = create_backbone(
        "mu4",
        num_classes=5,
        checkpoint=tmp_path / "bv.npz",
        embed_dim=48,
        depth=2,
        num_heads=3,
        mlp_dim=96,
        img_size=16,
    )
    img = torch.rand(2, 3, 16, 16) * 2 - 1
    with torch.no_grad():
        torch.testing.assert_close(ours(img), ref.eval()(img), atol=1e-5, rtol=0)


def test_big_vision_heads_mismatch_is_caught(tmp_path):
    # same shapes after fusing q, k, v, but 2 heads are not 4: loading would silently change the model
    np.savez(tmp_path / "bv.npz", **bv_params())
    with pytest.raises(CheckpointError, match="num_heads: checkpoint 2 vs backbone 4"):
        create_backbone("mu4", checkpoint=tmp_path / "bv.npz", embed_dim=32, depth=2, mlp_dim=48, img_size=16)


def test_big_vision_unknown_arrays_are_listed(tmp_path):
    p = bv_params()
    p["MAPHead_0/probe"] = np.zeros((1, 1, 32), np.float32)
    np.savez(tmp_path / "bv.npz", **p)
    with pytest.raises(CheckpointError, match=r"unexpected \[MAPHead_0/probe\]"):
        create_backbone(
            "mu4",
            num_classes=5,
            checkpoint=tmp_path / "bv.npz",
            embed_dim=32,
            depth=2,
            num_heads=2,
            mlp_dim=48,
            img_size=16,
        )


# --- our format ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["mu4", "mu4_dpn", "mu4_dtn", "mu8_rms", "mu8_onlylearn"])
def test_round_trip_is_exact_with_metadata(tmp_path, name):
    m = randomize_(create_backbone(name, num_classes=3))
    path = save_checkpoint(m, tmp_path / f"{name}.safetensors", step=1200)
    ckpt = read_checkpoint(path)
    assert ckpt.name == name and ckpt.img_size == (32, 32) and ckpt.metadata["num_classes"] == "3"
    assert ckpt.metadata["step"] == "1200" and json.loads(ckpt.metadata["config"]) == m.config
    again = create_backbone(name, num_classes=3, checkpoint=path)
    img = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(again(img), m(img), rtol=0, atol=0)
    assert not [f for f in os.listdir(tmp_path) if ".tmp" in f]  # temp file renamed away


def test_checkpoint_from_another_stem_is_refused_with_keys(tmp_path):
    path = save_checkpoint(create_backbone("mu4"), tmp_path / "mu4.safetensors")
    with pytest.raises(CheckpointError) as e:
        create_backbone("mu4_dpn", checkpoint=path)
    msg = str(e.value)
    assert "\n" not in msg and "saved from 'mu4'" in msg and "stem: checkpoint '' vs backbone 'dpn'" in msg
    # post and postpos have identical keys; only the recorded config tells them apart
    path = save_checkpoint(create_backbone("mu4_post"), tmp_path / "post.safetensors")
    with pytest.raises(CheckpointError, match="stem: checkpoint 'post' vs backbone 'postpos'"):
        create_backbone("mu4_postpos", checkpoint=path)


def test_missing_and_unexpected_keys_are_listed(tmp_path):
    sd = create_backbone("mu4_dpn").state_dict()
    sd.pop("patch_embed.norm_pre.weight")
    sd["extra.weight"] = torch.zeros(2)
    torch.save(sd, tmp_path / "sd.pth")
    with pytest.raises(CheckpointError, match=r"missing \[patch_embed.norm_pre.weight\]; unexpected \[extra.weight\]"):
        create_backbone("mu4_dpn", checkpoint=tmp_path / "sd.pth")


def test_head_of_another_size_is_dropped_and_new_head_is_zero(tmp_path):
    m = randomize_(create_backbone("mu4", num_classes=10))
    path = save_checkpoint(m, tmp_path / "m.safetensors")
    new = create_backbone("mu4", num_classes=4, checkpoint=path)
    assert new.head.weight.abs().sum() == 0
    torch.testing.assert_close(new.blocks[0].attn.qkv.weight, m.blocks[0].attn.qkv.weight)
    feats = create_backbone("mu4", checkpoint=path)  # num_classes=0: features only
    img = torch.randn(1, 3, 32, 32)
    torch.testing.assert_close(feats(img), m.forward_head(m.forward_features(img), pre_logits=True))


class _Evil:
    def __reduce__(self):
        return (os.system, ("touch pwned_by_checkpoint",))


def test_pickles_are_never_executed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with open("evil.pth", "wb") as f:
        pickle.dump({"patch_embed.proj.weight": _Evil()}, f, protocol=2)
    with pytest.raises(CheckpointError, match="refusing to load .*evil.pth"):
        read_checkpoint("evil.pth")
    assert not os.path.exists("pwned_by_checkpoint")


def test_a_missing_unsupported_or_misnamed_checkpoint_path_is_a_one_line_error(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        read_checkpoint(tmp_path / "nope.safetensors")
    (tmp_path / "w.onnx").write_bytes(b"x")
    with pytest.raises(CheckpointError, match="unsupported checkpoint type '.onnx'"):
        read_checkpoint(tmp_path / "w.onnx")
    with pytest.raises(CheckpointError, match="writes safetensors"):
        save_checkpoint(create_backbone("mu8"), tmp_path / "m.pth")
