import pytest
import torch
from conftest import randomize_

from transferbench import create_backbone
from transferbench.backbones import DynamicTokenNorm, save_checkpoint


def test_forward_head_pools_by_hand():
    img = torch.randn(2, 3, 32, 32)
    tok = randomize_(create_backbone("mu4", num_classes=5))
    feats = tok.forward_features(img)
    assert feats.shape == (2, 1 + 64, 128)
    torch.testing.assert_close(tok.forward_head(feats, pre_logits=True), feats[:, 0])
    torch.testing.assert_close(tok(img), feats[:, 0] @ tok.head.weight.T + tok.head.bias)
    gap = randomize_(create_backbone("mu4", pool="gap"))
    feats = gap.forward_features(img)
    torch.testing.assert_close(gap.forward_head(feats, pre_logits=True), feats[:, 1:].mean(1))  # cls excluded
    nocls = randomize_(create_backbone("mu4", pool="gap", class_token=False))
    assert nocls.forward_features(img).shape == (2, 64, 128)


def test_new_head_is_zero_initialised():
    m = create_backbone("mu4", num_classes=7)
    assert m.head.weight.abs().sum() == 0 and m.head.bias.abs().sum() == 0
    m.reset_classifier(3)
    assert m.head.weight.shape == (3, 128) and m.head.weight.abs().sum() == 0


def test_dtn_blocks_see_patch_tokens_only():
    m = randomize_(create_backbone("mu4_dtn"))
    assert m.dtn_layers == 4
    assert [isinstance(b.norm1, DynamicTokenNorm) for b in m.blocks] == [True] * 4 + [False] * 2
    lengths = []
    for b in m.blocks:
        b.register_forward_pre_hook(lambda mod, args: lengths.append(args[0].shape[1]))
    img = torch.randn(2, 3, 32, 32)
    out = m.forward_features(img)
    assert lengths == [64] * 4 + [65] * 2  # cls concatenated right after the DTN blocks
    # the cls token cannot influence anything that happens before it joins
    with torch.no_grad():
        m.cls_token.add_(5.0)
    out2 = m.forward_features(img)
    assert not torch.allclose(out[:, 0], out2[:, 0])
    before = []
    m.blocks[4].register_forward_pre_hook(lambda mod, args: before.append(args[0][:, 1:].clone()))
    m.forward_features(img)
    m.cls_token.data.sub_(5.0)
    m.forward_features(img)
    torch.testing.assert_close(before[0], before[1], rtol=0, atol=0)


def test_wrong_input_size_says_how_to_fix_it():
    m = create_backbone("mu4")
    with pytest.raises(ValueError, match=r"built for \(32, 32\).*img_size=\(48, 48\)"):
        m(torch.randn(1, 3, 48, 48))


def test_rectangular_images_get_a_rectangular_patch_grid():
    m = randomize_(create_backbone("mu4_dtn", img_size=(32, 48)))
    assert m.grid_size == (8, 12) and m.dtn_norms[0].grid == (8, 12)
    assert m.forward_features(torch.randn(1, 3, 32, 48)).shape == (1, 97, 128)


def test_pos_embed_resizes_as_big_vision_by_hand(tmp_path):
    # our checkpoints follow big_vision's resample_posemb (scipy.ndimage.zoom order=1: corner samples kept):
    # a 2x2 grid holding x-ramps [0, 1] upsampled to 4x4 samples x at 0, 1/3, 2/3, 1
    m = create_backbone("mu4", img_size=8)
    with torch.no_grad():
        ramp = torch.tensor([0.0, 1.0, 0.0, 1.0])  # row-major 2x2: x = 0, 1 in each row
        m.pos_embed[0, 1:] = ramp[:, None] * torch.arange(1, 129)[None, :]
        m.pos_embed[0, 0] = 7.0
    path = save_checkpoint(m, tmp_path / "m.safetensors")
    big = create_backbone("mu4", img_size=16, checkpoint=path)
    assert big.posemb_resample == "big_vision"
    pe = big.pos_embed[0, 1:, 0].view(4, 4)
    torch.testing.assert_close(pe, torch.tensor([[0.0, 1 / 3, 2 / 3, 1.0]] * 4))
    torch.testing.assert_close(big.pos_embed[0, 1:, 9].view(4, 4), 10 * pe)  # every channel alike
    assert (big.pos_embed[0, 0] == 7.0).all()  # the cls position is not resampled


def test_high_res_dtn_rebuilds_R_and_keeps_weights(tmp_path):
    m = randomize_(create_backbone("mu4_dtn"))
    path = save_checkpoint(m, tmp_path / "dtn.safetensors")
    hi = create_backbone("mu4_dtn", img_size=48, checkpoint=path)
    assert hi.dtn_norms[0].grid == (12, 12) and hi.dtn_norms[0].positional_weights().shape == (4, 144, 144)
    torch.testing.assert_close(hi.blocks[0].norm1.pos_weight, m.blocks[0].norm1.pos_weight)
    assert hi.forward_features(torch.randn(1, 3, 48, 48)).shape == (1, 145, 128)


def test_drop_path_only_in_training():
    m = randomize_(create_backbone("mu4", drop_path_rate=0.5, drop_rate=0.1))
    img = torch.randn(4, 3, 32, 32)
    torch.testing.assert_close(m(img), m(img))  # eval: deterministic
    m.train()
    torch.manual_seed(1)
    a = m.forward_features(img)
    torch.manual_seed(2)
    assert not torch.allclose(a, m.forward_features(img))
    assert m.blocks[0].drop_path1.__class__.__name__ == "Identity"  # linear rule: 0 for the first block
    assert m.blocks[-1].drop_path1.drop_prob == pytest.approx(0.5)


@pytest.mark.parametrize(
    "device",
    ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"))],
)
def test_bf16_autocast_close_to_fp32(device):
    """The engine's autocast (engine.precision.autocast, which every cell's bf16 runs under) runs the linear layers
    in bf16 and stays within bf16's rounding of fp32: bf16 keeps 8 significant bits, a relative rounding error of
    up to 2**-8 = 0.39% per product input (fp16, 11 bits: 2**-11). Measured on this model's 2 x 65 x 128 outputs:
    a mean relative error of 0.34% and a largest of 0.44% of the largest output, alike with and without bf16 units
    (oneDNN emulates them); fp32 (autocast off) gives 0 and fp16 0.04% and 0.05%."""
    from transferbench.engine.precision import autocast

    m = randomize_(create_backbone("mu4_dpn_dtn", num_classes=10), scale=0.02).to(device)
    img = torch.randn(2, 3, 32, 32).to(device)
    with torch.no_grad():
        ref = m.forward_features(img)
        dtypes = []
        hook = m.blocks[0].mlp.fc1.register_forward_hook(lambda mod, args, y: dtypes.append(y.dtype))
        with autocast(device, True):
            out = m.forward_features(img)
        hook.remove()
    assert dtypes == [torch.bfloat16]  # the block's linear layer ran in bf16
    err = (out.float() - ref).abs()
    mean_rel = float(err.mean() / ref.abs().mean())
    assert 0.001 < mean_rel < 0.01  # bf16's rounding, 3x either side of 0.0034: neither fp32's 0 nor fp16's 0.0004
    assert float(err.max()) < 0.015 * float(ref.abs().max())  # about 3x the measured 0.44%
