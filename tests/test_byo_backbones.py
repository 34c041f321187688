"""Bring your own ViT through every task: `py:MODULE:FACTORY[@FILE]`, and `timm:` / `py:` models on the grid
tasks (ADE20K's decoder, diagnostics' attention maps), at another resolution (their own set_input_size), as
ImageNet-C's cached classifier, pooled as LiT and few-shot ask, and compared with `--reference`."""

import hashlib
import json
import logging
import textwrap
from types import SimpleNamespace

import pytest
import timm
import torch
from conftest import randomize_
from kit import cli
from safetensors.torch import save_file

from transferbench import create_backbone
from transferbench.backbones.weights import resolve_backbone
from transferbench.errors import UserError

FACTORY = """
    import timm
    from torch import nn


    def make_model(**kwargs):
        return timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, num_classes=0, **kwargs)


    def fixed(img_size=None):
        return timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=0)


    class Pooled(nn.Module):
        '''timm's feature API without a patch grid.'''

        def __init__(self):
            super().__init__()
            self.conv, self.head = nn.Conv2d(3, 8, 8, 8), nn.Identity()

        def forward_features(self, x):
            return self.conv(x).flatten(2).transpose(1, 2)

        def forward_head(self, x, pre_logits=False):
            return x.mean(1) if pre_logits else self.head(x.mean(1))

        def reset_classifier(self, n):
            self.head = nn.Linear(8, n) if n else nn.Identity()


    def broken():
        raise RuntimeError("no GPU found")
"""


@pytest.fixture()
def byo(tmp_path, monkeypatch):
    """A module `byo_models` in the current directory (not installed: found as `python -m` would find it) and
    the weights of its `make_model`, perturbed, saved as timm saves them."""
    (tmp_path / "byo_models.py").write_text(textwrap.dedent(FACTORY))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.path", [p for p in __import__("sys").path if p not in ("", str(tmp_path))])
    torch.manual_seed(0)
    model = randomize_(
        timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, num_classes=0), scale=0.05
    )
    path = tmp_path / "w.safetensors"
    save_file(model.state_dict(), str(path))
    yield model.eval(), path
    __import__("sys").modules.pop("byo_models", None)


def test_a_py_factory_gives_its_own_model_its_weights_and_its_own_resampling(byo):
    reference, path = byo
    ref = resolve_backbone(f"py:byo_models:make_model@{path}")
    assert ref.sha256 == hashlib.sha256(path.read_bytes()).hexdigest() and ref.checkpoint == str(path)
    pre = dict(ref.preprocess)
    assert pre["input_size"] == 32 and pre["posemb"] == "set_input_size"  # patch_embed.img_size; its own resampling
    ours = create_backbone(ref.name, checkpoint=ref.checkpoint).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(ours.forward_features(x), reference.forward_features(x), rtol=0, atol=0)
    # 48 px: timm's set_input_size, i.e. resample_abs_pos_embed of the loaded weights from 2x2 to 3x3 patches
    big = create_backbone(ref.name, checkpoint=ref.checkpoint, img_size=48, num_classes=5)
    expected = timm.layers.resample_abs_pos_embed(reference.pos_embed.detach(), (3, 3), num_prefix_tokens=1)
    torch.testing.assert_close(big.pos_embed.detach(), expected, rtol=0, atol=0)
    assert big.patch_embed.grid_size == (3, 3) and big.posemb_resample == "set_input_size"
    assert big.get_classifier().out_features == 5
    # pool=gap (embedded few-shot, LiT): timm's avg pooling over the final-normed patch tokens, no fc_norm,
    # the same pre-logits as transferbench's own ViT pools
    gap = create_backbone(ref.name, checkpoint=ref.checkpoint, pool="gap").eval()
    with torch.no_grad():
        torch.testing.assert_close(
            gap.forward_head(gap.forward_features(x), pre_logits=True), reference.forward_features(x)[:, 1:].mean(1)
        )


def test_pooling_as_a_task_asks_keeps_the_arrangement_a_model_already_has():
    """pool=gap on a timm ViT (token pooling by default) averages the final-normed patch tokens (no fc_norm); on
    EVA-02, which averages already, it leaves the model as built (its fc_norm after the average)."""
    from transferbench.backbones.api import pool_arguments

    with torch.device("meta"):
        vit, eva = (timm.create_model(n) for n in ("vit_tiny_patch16_224", "eva02_tiny_patch14_224"))
    assert pool_arguments(vit, "gap") == {"global_pool": "avg", "fc_norm": False}
    assert pool_arguments(vit, "tok") == {} and pool_arguments(eva, "gap") == {}
    assert pool_arguments(eva, "tok") == {"global_pool": "token"}
    torch.manual_seed(0)
    own = randomize_(timm.create_model("eva02_tiny_patch14_224", img_size=28, num_classes=0), 0.05).eval()
    gap = create_backbone("timm:eva02_tiny_patch14_224", img_size=28, pool="gap").eval()
    gap.load_state_dict(own.state_dict())  # the same modules: strict load
    x = torch.randn(2, 3, 28, 28)
    with torch.no_grad():
        torch.testing.assert_close(
            gap.forward_head(gap.forward_features(x), pre_logits=True),
            own.fc_norm(own.forward_features(x)[:, 1:].mean(1)),
        )


def test_a_py_factory_is_refused_in_one_line_for_what_it_cannot_do(byo):
    for spec, words in (
        ("py:byo_models", "write py:MODULE:FACTORY"),
        ("py:no_such_module:make", "cannot import no_such_module .*No module named 'no_such_module'.*PYTHONPATH"),
        ("py:byo_models:nothing", "has no function nothing"),
        ("py:byo_models:broken", r"broken\(\) raised RuntimeError: no GPU found"),
        ("py:byo_models:make_model@missing.safetensors", "weights file missing.safetensors does not exist"),
    ):
        with pytest.raises(UserError, match=words) as e:
            resolve_backbone(spec)
        assert "\n" not in str(e.value)
    # a factory that builds at one size and cannot take another, or takes no task option it is asked for
    with pytest.raises(UserError, match="does not take|takes no such argument.*--set drop_path=0") as e:
        create_backbone("py:byo_models:fixed", drop_path_rate=0.1)
    assert "\n" not in str(e.value)
    model = create_backbone("py:byo_models:fixed", drop_path_rate=0.0)  # asks for nothing: accepted
    assert model.patch_embed.grid_size == (14, 14)


def test_ade20k_refuses_a_module_without_a_patch_grid_and_pretrain_any_byo_before_any_cell(byo, tmp_path, capsys):

    out = tmp_path / "out"
    assert cli(f"run ade20k --suite embedded --backbone py:byo_models:Pooled --out {out}") == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "cannot run ade20k: it lacks patch grid" in err and "forward_intermediates" in err
    assert "--set decoder_tokens=norm" in err  # the setting that needs no forward_intermediates
    assert not list(out.rglob("*.json"))  # nothing ran
    # upstream pretraining is App. C's recipe for transferbench's own sizes: a py: or timm: name is refused
    assert cli("run pretrain --suite embedded --backbone py:byo_models:make_model") == 2
    assert "pretrain trains transferbench's own ViT names" in capsys.readouterr().err.strip().splitlines()[-1]


def test_the_seg_decoder_reads_a_timm_models_last_block_on_its_grid():
    """decoder_tokens=prenorm: timm's forward_intermediates, i.e. the last block's patch tokens by hand (prefix
    dropped, before the final norm), on patch_embed.grid_size."""
    from transferbench.adapters.seg.adapter import LinearSegmenter

    torch.manual_seed(0)
    backbone = randomize_(timm.create_model("vit_tiny_patch16_224", img_size=64, num_classes=0), 0.05).eval()
    seg = LinearSegmenter(backbone, 5, tokens="prenorm").eval()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        h = backbone._pos_embed(backbone.patch_embed(x))
        for block in backbone.blocks:
            h = block(h)
        expected = seg.head(h[:, 1:]).reshape(2, 4, 4, 5).permute(0, 3, 1, 2)
        torch.testing.assert_close(seg.grid_logits(x), expected)
        normed = LinearSegmenter(backbone, 5, tokens="norm")
        normed.head.load_state_dict(seg.head.state_dict())
        assert not torch.allclose(normed.grid_logits(x), expected)  # the final norm makes a difference


def test_diagnostics_read_timm_attention_and_skip_what_a_model_hides(caplog):
    """The attention maps hooked from timm's Attention are the probabilities its non-fused path computes (the
    input of its attn_drop), and the blocks' outputs stay as they were; an EVA (rotary attention) has its
    attention measures skipped with one line."""
    from transferbench.adapters.diagnose import forward_diagnostics
    from transferbench.backbones.api import attention_maps
    from transferbench.backbones.measures import Probe
    from transferbench.settings.finetune import DiagnoseSettings

    torch.manual_seed(0)
    model = randomize_(timm.create_model("vit_tiny_patch16_224", img_size=32, num_classes=0), 0.05).eval()
    x = torch.randn(2, 3, 32, 32)
    hooked = {}
    with torch.no_grad():
        plain = model.forward_features(x)
        with attention_maps(model, lambda i, p: hooked.setdefault(i, p)):
            assert torch.equal(model.forward_features(x), plain)
        seen = {}
        for i, block in enumerate(model.blocks):
            block.attn.fused_attn = False
            block.attn.attn_drop.register_forward_hook(lambda m, a, o, i=i: seen.setdefault(i, a[0]))
        model.forward_features(x)
    assert sorted(hooked) == list(range(12))
    for i in range(12):
        torch.testing.assert_close(hooked[i], seen[i], rtol=1e-5, atol=1e-6)
    assert not Probe(model).skipped

    eva = timm.create_model("eva02_tiny_patch14_224", img_size=28, num_classes=0).eval()
    data = [(torch.rand(3, 28, 28), 0) for _ in range(4)]
    ctx = SimpleNamespace(device="cpu", workers=0, progress=lambda it, **_: it)
    hp = {"images": 4, "resolution": 28, "bf16": "off", "eval_batch": 4, "pixels": "inception"}
    with caplog.at_level(logging.WARNING):
        summary = forward_diagnostics(eva, _Images(data), DiagnoseSettings.of(hp), ctx)
    assert set(summary["skipped"]) == {"attn_std", "attn_distance"} and "attn_std" not in summary
    assert len(summary["patch_cosine"]["mean"]) == 12  # the token measures still run
    lines = [r.getMessage() for r in caplog.records if "skipping" in r.getMessage()]
    assert len(lines) == 1 and "attn_std, attn_distance" in lines[0] and "EvaAttention" in lines[0]


class _Images(torch.utils.data.Dataset):
    def __init__(self, items):
        self.items = items

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        from PIL import Image

        img, label = self.items[i]
        return Image.fromarray((img.permute(1, 2, 0).numpy() * 255).astype("uint8")), label


def test_a_timm_classifier_survives_the_imagenet_c_classifier_cache(tmp_path):
    """The fine-tuned classifier of a timm: backbone is cached as its own state dict and read back exactly."""
    from transferbench.backbones import save_checkpoint

    torch.manual_seed(0)
    model = create_backbone("timm:vit_tiny_patch16_224", img_size=32, num_classes=10).eval()
    randomize_(model, 0.05)
    path = save_checkpoint(model, tmp_path / "c.safetensors", info={"classifier": "fine-tuned"})
    again = create_backbone("timm:vit_tiny_patch16_224", img_size=32, num_classes=10, checkpoint=path).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(again(x), model(x), rtol=0, atol=0)


def test_hires_and_ade20k_cells_take_the_models_own_resolution_and_resampling(byo):
    """A timm tag states its input size (base_resolution: checkpoint = 224 for an in21k tag, whatever the file)
    and a py: model its patch_embed.img_size; both resample position embeddings themselves, which the cell
    records in place of the protocol's big_vision/scenic method (ours keep it)."""
    from transferbench.adapters import prepare_task
    from transferbench.adapters.hires import base_resolution
    from transferbench.cell import BackboneRef, make_cell

    _, path = byo
    hires = prepare_task("hires", suite="embedded", seeds=[0])
    hp = next(iter(hires.grid()))
    assert hp["posemb"] == "big_vision" and hp["base_resolution"] == "checkpoint"
    py = resolve_backbone(f"py:byo_models:make_model@{path}")
    tagged = BackboneRef("t", "timm:vit_tiny_patch16_224.augreg_in21k", str(path), "x", "inception")
    tagged = BackboneRef(**{**tagged.__dict__, "preprocess": (("input_size", 224), ("posemb", "timm"))})
    assert base_resolution(hp, py) == 32 and base_resolution(hp, tagged) == 224
    ds = hires.datasets[0]
    assert make_cell(hires, ds, py, hp, 0).hparams["posemb"] == "set_input_size"
    assert make_cell(hires, ds, tagged, hp, 0).hparams["posemb"] == "timm"
    own = BackboneRef("mu4", "mu4", None, "random-init")
    assert make_cell(hires, ds, own, hp, 0).hparams["posemb"] == "big_vision"


@pytest.mark.slow
def test_py_and_timm_cells_of_the_same_weights_agree_and_compare_in_one_table(suite_home, byo, tmp_path, capsys):
    """A py: factory that builds timm's ViT-Ti and the timm: name, on the same file: VTAB and few-shot cells on
    the embedded suite give the same numbers (the same model through two families), and the report with
    `--reference timm:...` puts both in one table with a paired difference of 0."""
    from transferbench.adapters import prepare_task
    from transferbench.cli import main
    from transferbench.engine.runner import RunOptions, run_task
    from transferbench.records.store import load_records

    reference, _ = byo
    path = tmp_path / "ti.safetensors"
    torch.manual_seed(1)
    full = randomize_(timm.create_model("vit_tiny_patch16_224", num_classes=0), 0.05)
    save_file(full.state_dict(), str(path))
    (tmp_path / "byo_ti.py").write_text(
        "import timm\n\ndef make(**kw):\n    return timm.create_model('vit_tiny_patch16_224', num_classes=0, **kw)\n"
    )
    specs = [f"timm:vit_tiny_patch16_224@{path}", f"py:byo_ti:make@{path}"]
    refs = [resolve_backbone(s) for s in specs]
    out = tmp_path / "out"
    for name in ("vtab", "fewshot"):  # fp32: bf16 auto is a timing probe per backbone, which may choose differently
        task = prepare_task(name, suite="embedded", datasets=["mini_digits"], seeds=[0], sets=["bf16=off"])
        assert run_task(task, refs, out, RunOptions(show_progress=False)).failed == 0
    records = load_records([out])

    def cell(r):  # what the two families' cells share: all but the backbone and what it states of itself
        hp = {k: v for k, v in r["hparams"].items() if k != "backbone_preprocess"}
        return r["task"], r["stage"], json.dumps(hp, sort_keys=True)

    by = {(*cell(r), r["backbone"].partition(":")[0]): r for r in records}
    assert len(by) == len(records) and {k[0] for k in by} == {"vtab", "fewshot"}
    for (*same, family), r in by.items():
        if family == "py":
            twin = by[(*same, "timm")]["metrics"]
            for split in r["metrics"]:
                assert r["metrics"][split]["accuracy"] == pytest.approx(twin[split]["accuracy"], abs=1e-6)
    vtab = [r["metrics"]["test"]["accuracy"] for r in records if r["task"] == "vtab"]
    assert all(a > 100 / 10 + 5 for a in vtab)  # ten digit classes: above chance after fine-tuning
    capsys.readouterr()
    assert main(["report", str(out), "--task", "vtab", "--reference", specs[0]]) == 0
    text = capsys.readouterr().out
    assert text.count("### vtab") == 1 and "Paired difference vs timm:vit_tiny_patch16_224" in text
    rows = [line for line in text.splitlines() if line.startswith("| py:byo_ti:make")]
    assert len(rows) == 2 and "| +0.0 n/a (one seed) |" in rows[1]  # the leaderboard's row, then the difference
