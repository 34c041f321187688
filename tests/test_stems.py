"""Each stem of the DPN paper's Table 6 against a hand-written numpy version of its definition."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import randomize_

from transferbench import create_backbone
from transferbench.backbones.stems import STEMS

EPS = 1e-6


def patches_by_hand(img: np.ndarray, p: int) -> np.ndarray:
    """(B, C, H, W) -> (B, N, p*p*C), patches row-major, each flattened as (row, col, channel)."""
    B, C, H, W = img.shape
    out = []
    for i in range(H // p):
        for j in range(W // p):
            block = img[:, :, i * p : (i + 1) * p, j * p : (j + 1) * p]  # (B, C, p, p)
            out.append(block.transpose(0, 2, 3, 1).reshape(B, -1))
    return np.stack(out, axis=1)


def ln(x, w=None, b=None):
    mu = x.mean(-1, keepdims=True)
    y = (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + EPS)
    return y if w is None else y * w + b


def rms(x, w):
    return x / np.sqrt((x**2).mean(-1, keepdims=True) + EPS) * w


def _norms(g: dict, name: str, own: str) -> dict:
    """Each stem's norm at `patch_embed.NAME` (`own`: the stem with this norm alone), per Table 6."""
    w, b = g.get(f"patch_embed.{name}.weight"), g.get(f"patch_embed.{name}.bias")
    return {
        "dpn": lambda x: ln(x, w, b),
        own: lambda x: ln(x, w, b),
        "rms": lambda x: rms(x, w),
        "nolearn": ln,
        "onlylearn": lambda x: x * w + b,
    }


def numpy_stem(stem, sd, img, p, pos):
    """Tokens after the stem (+ position embedding) for patch tokens, per Table 6."""
    g = {k: v.double().numpy() for k, v in sd.items()}
    x = patches_by_hand(img, p)
    pre, post = _norms(g, "norm_pre", "pre"), _norms(g, "norm", "post")
    x = pre.get(stem, lambda x: x)(x)
    x = x @ g["patch_embed.proj.weight"].T + g["patch_embed.proj.bias"]
    x = post.get(stem, lambda x: x)(x)
    x = x + pos
    if stem == "postpos":
        x = ln(x, g["patch_embed.norm.weight"], g["patch_embed.norm.bias"])
    return x


@pytest.mark.parametrize("stem", [s for s in STEMS])
def test_stem_matches_its_definition(stem):
    name = "mu4" + (f"_{stem}" if stem else "")
    m = randomize_(create_backbone(name, img_size=16, depth=1), scale=0.3)
    img = torch.randn(2, 3, 16, 16) * 2 + 0.3
    captured = {}
    m.blocks[0].register_forward_pre_hook(lambda mod, args: captured.setdefault("x", args[0]))
    m.forward_features(img)
    sd = m.state_dict()
    pos = sd["pos_embed"][:, 1:].double().numpy()
    expected = numpy_stem(stem, sd, img.double().numpy(), 4, pos)
    got = captured["x"][:, 1:]  # the cls token joins before block 0
    np.testing.assert_allclose(got.detach().double().numpy(), expected, atol=2e-5, rtol=1e-5)


def test_stem_parameters_follow_table_6():
    keys = {
        s: sorted(
            k for k in create_backbone("mu4" + (f"_{s}" if s else "")).state_dict() if k.startswith("patch_embed.norm")
        )
        for s in STEMS
    }
    both = [
        "patch_embed.norm.bias",
        "patch_embed.norm.weight",
        "patch_embed.norm_pre.bias",
        "patch_embed.norm_pre.weight",
    ]
    assert keys[""] == [] and keys["nolearn"] == []  # nolearn: standardisation only, nothing to learn
    assert keys["dpn"] == both and keys["onlylearn"] == both
    assert keys["pre"] == both[2:] and keys["post"] == both[:2] and keys["postpos"] == both[:2]
    assert keys["rms"] == ["patch_embed.norm.weight", "patch_embed.norm_pre.weight"]  # RMSNorm: scale only
    sd = create_backbone("b32_dpn").state_dict()
    assert sd["patch_embed.norm_pre.weight"].shape == (32 * 32 * 3,)  # LN over p*p*3 pixels
    assert sd["patch_embed.norm.weight"].shape == (768,)


def test_baseline_stem_is_the_conv_stem():
    m = randomize_(create_backbone("mu4", img_size=16))
    conv_w = torch.randn(128, 3, 4, 4)
    with torch.no_grad():
        m.patch_embed.proj.weight.copy_(conv_w.permute(0, 2, 3, 1).flatten(1))
    img = torch.randn(2, 3, 16, 16)
    conv = F.conv2d(img, conv_w, m.patch_embed.proj.bias, stride=4).flatten(2).transpose(1, 2)
    torch.testing.assert_close(m.patch_embed(img), conv, atol=1e-5, rtol=1e-5)
