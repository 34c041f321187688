"""`timm:` backbones: weights from a file or the local Hugging Face cache (offline), timm's own outputs,
the tag's pixel normalisation in the cell, and one-line refusals."""

import hashlib

import numpy as np
import pytest
import timm
import torch
from conftest import randomize_
from safetensors.torch import save_file

from transferbench import create_backbone
from transferbench.backbones.weights import resolve_backbone
from transferbench.errors import UserError


@pytest.fixture(scope="module")
def tiny_file(tmp_path_factory):
    """A timm ViT-Ti/16 with every parameter perturbed, saved as timm saves weights."""
    torch.manual_seed(0)
    model = randomize_(timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=7), scale=0.05)
    path = tmp_path_factory.mktemp("timm") / "tiny.safetensors"
    save_file(model.state_dict(), str(path))
    return model, path


def test_a_timm_file_gives_timms_own_logits_features_and_resampling(tiny_file):
    reference, path = tiny_file
    ref = resolve_backbone(f"timm:vit_tiny_patch16_224@{path}")
    assert ref.sha256 == hashlib.sha256(path.read_bytes()).hexdigest() and ref.checkpoint == str(path)
    ours = create_backbone(ref.name, checkpoint=ref.checkpoint, num_classes=7).eval()
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), reference(x), rtol=0, atol=0)
        tokens = ours.forward_features(x)
        torch.testing.assert_close(tokens, reference.forward_features(x), rtol=0, atol=0)
        torch.testing.assert_close(ours.forward_head(tokens, pre_logits=True), tokens[:, 0], rtol=0, atol=0)
    # at 384 px the position embeddings are resampled as timm resamples them (its resample_abs_pos_embed)
    big = create_backbone(ref.name, checkpoint=ref.checkpoint, num_classes=3, img_size=384)
    expected = timm.layers.resample_abs_pos_embed(reference.pos_embed.detach(), (24, 24), num_prefix_tokens=1)
    assert big.patch_embed.grid_size == (24, 24) and big.posemb_resample == "checkpoint_filter_fn"
    assert ours.posemb_resample is None  # the file's own grid: nothing resampled
    torch.testing.assert_close(big.pos_embed.detach(), expected)
    assert big.get_classifier().out_features == 3  # a head of another size is new, not loaded


def test_a_tag_resolves_from_a_local_hugging_face_cache_offline(tmp_path, monkeypatch, tiny_file):
    """The cache laid out as huggingface_hub lays it out: models--ORG--NAME/{refs/main, snapshots/REV/FILE}."""
    _, path = tiny_file
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    name = "timm:vit_tiny_patch16_224.augreg_in21k"
    with pytest.raises(UserError, match="not in the Hugging Face cache .*hub.*pretrained=True"):
        resolve_backbone(name)
    repo = tmp_path / "hub" / "models--timm--vit_tiny_patch16_224.augreg_in21k"
    snapshot = repo / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123abcd")
    (snapshot / "model.safetensors").write_bytes(path.read_bytes())
    ref = resolve_backbone(name)
    assert ref.checkpoint == str(snapshot / "model.safetensors")
    assert ref.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert dict(ref.preprocess)["pixels"] == "inception"  # AugReg: mean = std = 0.5


def test_the_tags_normalisation_reaches_the_cell_and_the_transform(tiny_file):
    """DeiT's tag states ImageNet statistics and AugReg's [-1, 1]: with pixels=auto each cell gets its tag's, and a
    white pixel becomes (1 - 0.485) / 0.229 = 2.2489 against (1 - 0.5) / 0.5 = 1."""
    from transferbench.adapters import prepare_task
    from transferbench.cell import make_cell
    from transferbench.data.transforms import eval_transform

    _, path = tiny_file
    task = prepare_task("vtab", suite="embedded", datasets=["mini_digits"], seeds=[0])
    white = torch.full((3, 20, 20), 255, dtype=torch.uint8)
    got = {}
    for tag, want in (("deit_tiny_patch16_224.fb_in1k", 2.2489), ("vit_tiny_patch16_224.augreg_in21k", 1.0)):
        ref = resolve_backbone(f"timm:{tag}@{path}")
        cell = make_cell(task, task.datasets[0], ref, {**task.grid()[0], "pixels": "auto"}, 0, "final")
        got[tag] = cell
        x = eval_transform(16, pixels=cell.hparams["pixels"])(white)
        assert float(x[0, 0, 0]) == pytest.approx(want, abs=1e-4)
        assert cell.hparams["backbone_preprocess"]["input_size"] == 224
    deit, augreg = got.values()
    assert deit.hparams["pixels"] == "imagenet" and augreg.hparams["pixels"] == "inception"
    assert deit.hparams["backbone_preprocess"]["crop_pct"] == 0.9  # timm deit.py _cfg: crop_pct .9, bicubic
    assert deit.hparams["backbone_preprocess"]["interpolation"] == "bicubic" and deit.key != augreg.key


def test_what_timm_offers_that_is_not_a_vit_is_refused_in_one_line(tiny_file, tmp_path):
    _, path = tiny_file
    torn = tmp_path / "torn.safetensors"
    torn.write_bytes(path.read_bytes()[:1000])  # a copy cut short: detected, never trusted
    for spec, words in (
        (f"timm:vit_tiny_patch16_224@{torn}", "is not a valid safetensors file"),
        ("timm:resnet18", "lacks patch_embed.grid_size, num_prefix_tokens"),
        ("timm:vit_tinny_patch16_224", "has no model 'vit_tinny_patch16_224'; did you mean vit_tiny_patch16_224"),
        ("timm:vit_tiny_patch16_224.no_such_tag", "knows no tag 'no_such_tag'"),
        (f"timm:vit_small_patch16_224@{path}", "does not fit its VisionTransformer: other shapes"),
    ):
        with pytest.raises(UserError, match=words) as e:
            create_backbone(resolve_backbone(spec).name, checkpoint=resolve_backbone(spec).checkpoint)
        assert "\n" not in str(e.value)


def test_an_embedded_fewshot_cell_runs_a_timm_file(suite_home, tmp_path, tiny_file):
    """`run fewshot --suite embedded --backbone timm:...@FILE`: the features are timm's own pre-logits (the
    embedded protocol's gap pooling over its final norm), so the cell's accuracy is that of a ridge probe on them."""
    from transferbench.adapters import prepare_task
    from transferbench.engine.runner import RunOptions, run_task
    from transferbench.records.store import load_records

    _, path = tiny_file
    task = prepare_task("fewshot", suite="embedded", datasets=["mini_digits"], seeds=[0])
    assert (
        run_task(
            task, [resolve_backbone(f"timm:vit_tiny_patch16_224@{path}")], tmp_path, RunOptions(show_progress=False)
        ).failed
        == 0
    )
    records = load_records([tmp_path])
    assert records and all(r["backbone"].startswith("timm:vit_tiny_patch16_224@") for r in records)
    accuracies = [r["metrics"]["test"]["accuracy"] for r in records]
    assert all(10.0 < a <= 100.0 for a in accuracies) and len(set(np.round(accuracies, 3))) > 1
