"""Each paper-scale default pinned against its source: big_vision's losses, weight decay, mixup, resample_posemb,
fewshot resize, AugReg's per-size table (DPN App. C), the VTAB reported score (DPN §6.1), the high-res head
(App. D), timm's loader for three checkpoint forms, and the pixel normalisation that travels with the weights."""

import types

import kit
import numpy as np
import pytest
import timm
import torch
from conftest import randomize_
from PIL import Image

from transferbench import create_backbone
from transferbench.adapters import prepare_task
from transferbench.adapters.classify import finetune
from transferbench.adapters.pretrain import recipe
from transferbench.adapters.vtab import VtabAdapter
from transferbench.backbones import save_checkpoint
from transferbench.backbones.checkpoint import checkpoint_pixels, resample_posemb
from transferbench.backbones.weights import resolve_backbone
from transferbench.cell import make_cell
from transferbench.data.pixels import stats
from transferbench.data.transforms import eval_transform
from transferbench.engine import augreg
from transferbench.engine.losses import sigmoid_cross_entropy
from transferbench.errors import UserError
from transferbench.records.aggregate import aggregate
from transferbench.settings.finetune import FinetuneSettings
from transferbench.settings.pretrain import PretrainSettings

# --- losses -----------------------------------------------------------------------------------------


def big_vision_sigmoid_xent(logits, labels):
    """big_vision losses.sigmoid_xent, transcribed in numpy: -sum(labels * log_sigmoid(z) + (1 - labels) *
    log_sigmoid(-z), axis=-1), then the mean over the batch."""
    log_sigmoid = lambda z: -np.logaddexp(0.0, -z)  # noqa: E731
    nll = -np.sum(labels * log_sigmoid(logits) + (1.0 - labels) * log_sigmoid(-logits), axis=-1)
    return nll.mean()


def test_sigmoid_xent_equals_big_vision_on_random_logits():
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 3, (7, 11))
    y = rng.integers(0, 11, 7)
    onehot = np.eye(11)[y]
    expected = big_vision_sigmoid_xent(logits, onehot)
    got = float(sigmoid_cross_entropy(torch.from_numpy(logits), torch.from_numpy(y)))
    assert got == pytest.approx(expected, rel=1e-9)
    soft = 0.7 * onehot + 0.3 * np.roll(onehot, 1, axis=0)  # mixup targets
    got = float(sigmoid_cross_entropy(torch.from_numpy(logits), torch.from_numpy(soft)))
    assert got == pytest.approx(big_vision_sigmoid_xent(logits, soft), rel=1e-9)


# --- the VTAB score ---------------------------------------------------------------------------------


def _record(lr, seed, val, test, stage="select", final="none"):
    metrics = {k: {"accuracy": v} for k, v in (("val", val), ("test", test)) if v is not None}
    hp = {"lr": lr, "final": final}
    return kit.record(
        "vtab", "d", "b", seed, metrics, stage=stage, hparams=hp, select=["lr"], finished_at=f"{stage}{seed}"
    )


def test_vtab_reports_the_test_accuracy_of_the_val_selected_train800_runs():
    # lr 0.001 has the best mean val (80 vs 70) though its test accuracy is the lower one: the report must
    # take the test accuracy of those same runs, not the best test
    recs = [_record(0.001, s, 80 + s, 50 + s) for s in range(3)] + [_record(0.003, s, 70 + s, 90 + s) for s in range(3)]
    (entry,) = aggregate(recs)
    assert entry.selected == {"lr": 0.001} and entry.per_seed == {0: 50.0, 1: 51.0, 2: 52.0}


def test_vtab_default_plans_no_final_stage_and_retrain_keeps_it():
    class Won:  # a finished first stage whose winner is its last learning rate
        def best(self, cells):
            return {"lr": cells[-1].hparams["lr"]}

    ref = resolve_backbone("mu4")
    default = prepare_task("vtab", suite="embedded", datasets=["mini_digits"])
    assert default.hparams["final"] == "none"
    paper = prepare_task("vtab").hparams  # the default suite: App. E's numbers
    assert (paper["loss"], paper["optimizer"], paper["momentum"], paper["weight_decay"], paper["clip"]) == (
        "sigmoid",
        "sgd",
        0.9,
        0.0,
        1.0,
    )
    assert (paper["batch"], paper["steps"], paper["warmup_steps"], paper["resolution"]) == (512, 2500, 200, 224)
    cells = VtabAdapter().plan(default, ref, Won())
    assert {c.stage for c in cells} == {"select"} and len(cells) == len(default.seeds) * len(default.sweep["lr"])
    retrain = prepare_task("vtab", suite="embedded", datasets=["mini_digits"], sets=["final=retrain"])
    cells = VtabAdapter().plan(retrain, ref, Won())
    finals = [c for c in cells if c.stage == "final"]
    assert len(finals) == len(retrain.seeds) and {c.hparams["lr"] for c in finals} == {retrain.sweep["lr"][-1]}
    # retrain: the reported number is the final stage's test accuracy, as before
    recs = [_record(0.001, s, 80, None, final="retrain") for s in range(3)]
    recs += [_record(0.001, s, None, 60 + s, stage="final", final="retrain") for s in range(3)]
    (entry,) = aggregate(recs)
    assert entry.per_seed == {0: 60.0, 1: 61.0, 2: 62.0}


def test_cells_of_two_protocol_versions_never_share_a_table():
    from transferbench.reporting.tables import build_tables

    old = [{**_record(0.01, s, 70, 60, stage="final", final="retrain"), "protocol_version": "1"} for s in range(3)]
    new = [_record(0.001, s, 80, 50) for s in range(3)]
    tables = build_tables(aggregate(old + new))
    assert [t.protocol_versions for t in tables] == [["2"], ["1"]]  # the newest first
    assert [t.rows["b"]["d"].estimate.mean for t in tables] == [50.0, 60.0]


def test_vtab_sweep_holds_app_e_learning_rate():
    """The default suite sweeps lr over App. E's printed 0.0003 and the next two steps of the 1-3-10 grid (the grid
    of task_adaptation's sweeps), 0.001 and 0.003, in that order and nothing else; the lr is selected per task on
    val200 over seeds 0, 1, 2 (DPN §6.1), so 3 x 3 = 9 cells a task (docs/vtab.md)."""
    task = prepare_task("vtab")
    assert task.sweep == {"lr": [0.0003, 0.001, 0.003]}
    lr = FinetuneSettings.model_fields["lr"]
    assert lr.default == task.sweep["lr"][0] == 0.0003  # the setting's default is the value App. E prints ...
    assert lr.json_schema_extra["source"] == "DPN App. E (its big_vision config) prints 0.0003"  # ... as sourced
    grid = [m * 10.0**e for e in range(-5, 0) for m in (1, 3)]  # 1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2
    start = grid.index(pytest.approx(0.0003, rel=1e-9))
    assert task.sweep["lr"] == pytest.approx(grid[start : start + 3], rel=1e-9)
    assert [g["lr"] for g in task.grid()] == [0.0003, 0.001, 0.003]  # the cells' settings, one per lr
    assert task.select_keys() == ("lr",) and task.seeds == (0, 1, 2)


# --- high-res (App. D) ------------------------------------------------------------------------------


class _Images:
    def __init__(self, n=4, size=16, classes=10):
        self.labels = np.arange(n) % classes

    def __len__(self):
        return len(self.labels)

    def array(self):
        return np.zeros((len(self.labels), 16, 16, 3), np.uint8)


def test_hires_reinitialises_the_head_even_when_the_class_count_matches(tmp_path):
    task = prepare_task("hires")
    assert (
        task.hparams["head"] == "new" and task.hparams["loss"] == "sigmoid" and task.hparams["posemb"] == "big_vision"
    )
    src = randomize_(create_backbone("mu4", num_classes=10, img_size=16))
    path = save_checkpoint(src, tmp_path / "ten.safetensors")
    hp = dict(
        resolution=32,
        optimizer="sgd",
        lr=0.03,
        momentum=0.9,
        weight_decay=0.0,
        batch=4,
        steps=0,
        warmup_steps=0,
        clip=1.0,
        loss="sigmoid",
        bf16=False,
        pixels="inception",
    )
    cell = types.SimpleNamespace(
        hparams=hp, seed=0, backbone="mu4", backbone_name="mu4", checkpoint=str(path), dataset="d"
    )
    ctx = types.SimpleNamespace(device="cpu", workers=0, micro_batch=None, progress=None, compile=False, log=None)
    s = FinetuneSettings.model_construct(**hp)  # 0 steps: the head as it starts
    model, info = finetune(
        cell, s, _Images(), 10, "none", ctx, keep_head=task.hparams["head"] == "auto", posemb=task.hparams["posemb"]
    )
    assert info["head"] == "new" and info["posemb_resample"] == "big_vision"
    assert float(model.head.weight.detach().abs().sum()) == 0.0 and float(src.head.weight.detach().abs().sum()) > 0
    assert (task.datasets[0].model_dump()["train"], task.datasets[0].model_dump()["minival"]) == (
        "train[:99%]",
        "train[99%:]",
    )


def test_resample_posemb_equals_scipy_zoom_order_1():
    ndimage = pytest.importorskip("scipy.ndimage")
    rng = np.random.default_rng(0)
    old = rng.normal(size=(7, 7, 5))
    expected = ndimage.zoom(old, (12 / 7, 12 / 7, 1), order=1)  # big_vision models/vit.py resample_posemb
    pe = torch.from_numpy(np.concatenate([np.full((1, 5), 9.0), old.reshape(49, 5)]))[None]
    got = resample_posemb(pe, (12, 12), (7, 7), num_prefix_tokens=1)
    np.testing.assert_allclose(got[0, 1:].numpy().reshape(12, 12, 5), expected, atol=1e-6, rtol=0)
    assert (got[0, 0] == 9.0).all()
    half_pixel = (
        torch.nn.functional.interpolate(
            torch.from_numpy(old).permute(2, 0, 1)[None], size=(12, 12), mode="bilinear", align_corners=False
        )[0]
        .permute(1, 2, 0)
        .numpy()
    )
    assert np.abs(half_pixel - expected).max() > 1e-2  # align_corners=False is another method


# --- few-shot (big_vision common_fewshot) ----------------------------------------------------------


def test_fewshot_transform_is_a_square_resize_then_a_central_crop():
    task = prepare_task("fewshot")
    hp = task.hparams
    assert (hp["resize"], hp["resize_mode"], hp["resolution"]) == (256, "square", 224)
    x = np.linspace(0, 255, 300)[None, :, None].repeat(200, 0).repeat(3, 2).astype(np.uint8)  # 300 wide, 200 high
    img = Image.fromarray(x)
    got = eval_transform(224, resize_square=256)(img)
    # by hand: 300 x 200 -> 256 x 256 (aspect not kept), rows/cols 16..239 kept, then x / 127.5 - 1
    square = np.asarray(img.resize((256, 256), Image.BILINEAR), np.float64)[16:240, 16:240]
    np.testing.assert_allclose(got.permute(1, 2, 0).double().numpy(), square / 127.5 - 1, atol=2.5 / 127.5)
    short_side = eval_transform(224, resize_small=256)(img)  # 384 x 256, then the central 224: another crop
    assert float((short_side - got).abs().max()) > 0.2


# --- pretraining (App. C, AugReg) -------------------------------------------------------------------


@pytest.mark.parametrize(
    "name,aug,randaug,mixup,rep,dropout",
    [
        ("ti16", "light1", (2, 0), 0.0, 192, 0.0),
        ("s32", "medium1", (2, 15), 0.2, 0, 0.0),
        ("s16", "medium2", (2, 15), 0.5, 384, 0.0),
        ("b32_dpn", "medium2", (2, 15), 0.5, 768, 0.1),
        ("b16", "medium2", (2, 15), 0.5, 768, 0.1),
        ("l16", "medium2", (2, 15), 0.5, 1024, 0.1),
    ],
)
def test_augreg_settings_per_size_follow_app_c(name, aug, randaug, mixup, rep, dropout):
    hp = prepare_task("pretrain", suite="default").hparams
    assert (hp["lr"], hp["wd"], hp["init_head_bias"], hp["loss"], hp["batch"], hp["steps"], hp["warmup_steps"]) == (
        0.001,
        0.0001,
        -6.9,
        "sigmoid",
        4096,
        93000,
        10000,
    )
    r = recipe(name, PretrainSettings.of(hp))
    assert (r["aug"], r["randaug"], r["mixup"], r["rep_size"], r["dropout"]) == (aug, randaug, mixup, rep, dropout)
    ra = augreg.randaugment(aug)
    assert ra.num_ops == 2 and ra.magnitude == min(30, 3 * randaug[1]) and ra.num_magnitude_bins == 31


def test_light1_randaugment_is_not_nothing():
    # big_vision: light1 = randaug(2, 0), "Actually not nothing!": at magnitude 0 the geometric and colour ops are
    # the identity, but AutoContrast, Equalize and Solarize (threshold 255 at bin 0) still change an image
    ra = augreg.randaugment("light1")
    assert ra.magnitude == 0
    img = torch.arange(64, dtype=torch.uint8).view(1, 8, 8).repeat(3, 1, 1) * 3 + 40  # low contrast, 40..229
    changed = []
    for seed in range(20):
        torch.manual_seed(seed)
        changed.append(not torch.equal(ra(img), img))
    assert any(changed) and not all(changed)  # some draws are identity-only, some are not
    autocontrast = ((img.float() - 40) * (255 / 189)).floor().clamp(0, 255).to(torch.uint8)  # by hand
    from torchvision.transforms.v2 import functional as F

    assert torch.equal(F.autocontrast(img), autocontrast)


def test_aug_auto_refuses_a_size_app_c_does_not_cover():
    with pytest.raises(UserError, match="aug=auto"):
        recipe("mu4", PretrainSettings(aug="auto", rep_size="auto"))


def test_mixup_mixes_each_example_with_the_previous_one_as_computed_by_hand():
    x = torch.tensor([[1.0], [10.0], [100.0]])
    y = torch.eye(3)
    rng = np.random.default_rng(5)
    a = np.sort(np.random.default_rng(5).dirichlet([0.5, 0.5]))[::-1]
    mx, my = augreg.mixup(x, y, 0.5, rng)
    # roll(batch, 1): example i is mixed with example i - 1 (the first with the last)
    expected = [a[0] * 1 + a[1] * 100, a[0] * 10 + a[1] * 1, a[0] * 100 + a[1] * 10]
    np.testing.assert_allclose(mx[:, 0].numpy(), expected, rtol=1e-6)
    np.testing.assert_allclose(my[0].numpy(), [a[0], 0, a[1]], rtol=1e-6)
    assert a[0] >= a[1] and a.sum() == pytest.approx(1.0)
    same_x, same_y = augreg.mixup(x, y, 0.0, rng)  # p = 0 (light1): no mixing at all
    assert same_x is x and same_y is y


def test_weight_decay_per_step_is_big_vision_s():
    # big_vision: param -= sched(t) * (lr * adam_update + wd * param) on kernels only; with zero gradients Adam's
    # update is 0, so one step at schedule value 0.5 multiplies each kernel by (1 - 0.5 * wd) and nothing else moves
    model = randomize_(create_backbone("mu4", num_classes=3, img_size=8))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    lr, wd, sched = 1e-3, 1e-4, 0.5
    opt = augreg.adamw(model, lr=lr, wd=wd, betas=(0.9, 0.999))
    for g in opt.param_groups:
        g["lr"] = lr * sched  # engine.train.fit sets lr x schedule each step
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    kernels = {id(p) for p in augreg.kernels(model)}
    for n, p in model.named_parameters():
        factor = 1 - sched * wd if id(p) in kernels else 1.0
        torch.testing.assert_close(p.detach(), before[n] * factor, rtol=0, atol=1e-9)
    names = {n for n, p in model.named_parameters() if id(p) in kernels}
    assert "blocks.0.attn.qkv.weight" in names and "head.weight" in names and "patch_embed.proj.weight" in names
    assert not {"pos_embed", "cls_token", "blocks.0.norm1.weight", "blocks.0.attn.qkv.bias"} & names


def test_dtn_lr_mult_scales_only_dtns_own_parameters_and_keeps_the_decay():
    """Adam's first step moves a parameter by lr * g / (|g| + eps), about lr: with `dtn_lr_mult` 10 DTN's mixing
    logits and positional weights move 10 times as far and every other parameter exactly as far as without it;
    with zero gradients the kernels decay by the same sched(t) * wd (big_vision's), whatever the multiplier."""
    from transferbench.engine.train import fit

    names = augreg.dtn_parameter_names(create_backbone("mu4_dtn", num_classes=3, img_size=16))
    assert names[:3] == ["blocks.0.norm1.mix_mean", "blocks.0.norm1.mix_var", "blocks.0.norm1.pos_weight"]
    assert len(names) == 3 * 2 * 4  # 3 parameters x 2 norms x the first depth - 2 = 4 blocks of mu4_dtn

    def moved(mult, grads, wd=1e-4):
        torch.manual_seed(0)
        model = randomize_(create_backbone("mu4_dtn", num_classes=3, img_size=16))
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        opt = augreg.adamw(model, lr=1e-3, wd=wd, betas=(0.9, 0.999), dtn_lr_mult=mult)
        x, y = torch.randn(4, 3, 16, 16), torch.tensor([0, 1, 2, 0])
        loss = (lambda out, t: out.sum() * 0) if not grads else torch.nn.functional.cross_entropy
        fit(model, iter([(x, y)]), opt, steps=1, base_lr=1e-3, warmup=0, clip=0, loss_fn=loss, device="cpu", bf16=False)
        return {n: (p.detach() - before[n]) for n, p in model.named_parameters()}, before

    plain, _ = moved(1.0, True, wd=0.0)
    ten, _ = moved(10.0, True, wd=0.0)
    for n in plain:
        if n in names:
            torch.testing.assert_close(ten[n], 10 * plain[n], rtol=1e-4, atol=1e-9)
            assert plain[n].abs().max() > 0.5e-3  # it moved by about lr
        else:
            torch.testing.assert_close(ten[n], plain[n], rtol=0, atol=0)
    still, before = moved(10.0, False)  # zero gradients: only big_vision's decay acts (sched(0) = 1 at step 0)
    kernels = set(augreg.kernel_names(create_backbone("mu4_dtn", num_classes=3, img_size=16)))
    for n, d in still.items():
        factor = 1 - 1e-4 if n in kernels else 1.0
        torch.testing.assert_close(before[n] + d, before[n] * factor, rtol=0, atol=1e-9)
    assert set(names) & kernels == {n for n in names if n.endswith("pos_weight")}


def test_dtn_decays_its_positional_weights_as_the_papers_deit_recipe_does():
    """DTN trains in DeiT's framework: timm's `param_groups_weight_decay` decays every parameter of 2 or more
    dimensions but biases. Of DTN's own parameters that is `pos_weight` (H, 3), the reference's dense layer from R
    to the heads, and not the mixing logits (H): our big_vision mask decays the same ones."""
    from timm.optim import param_groups_weight_decay

    model = create_backbone("mu4_dtn", num_classes=3, img_size=16)
    groups = param_groups_weight_decay(model, weight_decay=0.05)
    by_id = {id(p): n for n, p in model.named_parameters()}
    timm_decayed = {by_id[id(p)] for g in groups if g["weight_decay"] > 0 for p in g["params"]}
    own = set(augreg.dtn_parameter_names(model))
    ours = set(augreg.kernel_names(model))
    assert own & timm_decayed == own & ours == {n for n in own if n.endswith("pos_weight")} != set()


# --- timm's loader ------------------------------------------------------------------------------------


def _timm_logits(model, sd, img):
    model.load_state_dict(sd)
    with torch.no_grad():
        return model.eval()(img)


@pytest.mark.parametrize("form", ["compiled", "ema", "flat_patch_embed"])
def test_timm_file_forms_load_as_timm_loads_them(tmp_path, form):
    from timm.models._helpers import load_state_dict
    from timm.models.vision_transformer import checkpoint_filter_fn

    torch.manual_seed(0)
    ref = randomize_(timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=7))
    sd = ref.state_dict()
    path = tmp_path / "t.pth"
    if form == "compiled":
        torch.save({f"_orig_mod.{k}": v for k, v in sd.items()}, path)
    elif form == "ema":
        ema = {k: v + 0.05 * torch.randn_like(v) for k, v in sd.items()}
        torch.save({"state_dict": sd, "state_dict_ema": ema}, path)
    else:
        torch.save({**sd, "patch_embed.proj.weight": sd["patch_embed.proj.weight"].reshape(192, -1)}, path)
    loaded = checkpoint_filter_fn(load_state_dict(str(path), use_ema=True), ref)  # timm's own reading
    img = torch.randn(2, 3, 224, 224)
    expected = _timm_logits(ref, loaded, img)
    ours = create_backbone("ti16", num_classes=7, checkpoint=path).eval()
    with torch.no_grad():
        torch.testing.assert_close(ours(img), expected, atol=1e-5, rtol=0)


def test_timm_state_dict_with_pre_logits_keeps_its_representation_layer(tmp_path):
    torch.manual_seed(0)
    ref = randomize_(timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=0))
    fc, head = torch.nn.Linear(192, 48), torch.nn.Linear(48, 5)
    sd = {
        **ref.state_dict(),
        "pre_logits.fc.weight": fc.weight.detach(),
        "pre_logits.fc.bias": fc.bias.detach(),
        "head.weight": head.weight.detach(),
        "head.bias": head.bias.detach(),
    }
    torch.save(sd, tmp_path / "rep.pth")
    ours = create_backbone("ti16", num_classes=5, checkpoint=tmp_path / "rep.pth").eval()
    img = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        pooled = ref.eval().forward_head(ref.forward_features(img), pre_logits=True)
        torch.testing.assert_close(ours(img), head(torch.tanh(fc(pooled))), atol=1e-5, rtol=0)
        torch.testing.assert_close(
            ours.forward_head(ours.forward_features(img), pre_logits=True), torch.tanh(fc(pooled)), atol=1e-5, rtol=0
        )
    transfer = create_backbone("ti16", checkpoint=tmp_path / "rep.pth")  # transfer: only the head goes
    transfer.reset_classifier(3)
    assert transfer.config["rep_size"] == 48 and transfer.head.in_features == 48


def test_timm_resize_follows_checkpoint_filter_fn(tmp_path):
    from timm.layers import resample_abs_pos_embed

    ref = randomize_(timm.create_model("vit_tiny_patch16_224", pretrained=False))
    torch.save(ref.state_dict(), tmp_path / "t.pth")
    ours = create_backbone("ti16", img_size=384, checkpoint=tmp_path / "t.pth")
    expected = resample_abs_pos_embed(
        ref.pos_embed.detach(), [24, 24], [14, 14], num_prefix_tokens=1, interpolation="bicubic", antialias=True
    )
    assert ours.posemb_resample == "timm"
    torch.testing.assert_close(ours.pos_embed.detach(), expected, atol=1e-6, rtol=0)


# --- pixel normalisation ------------------------------------------------------------------------------


def test_normalisation_presets_on_a_known_image():
    img = Image.fromarray(np.array([[[0, 0, 0], [255, 255, 255]]], np.uint8))  # one black, one white pixel
    inception = eval_transform(1, resize_small=None, pixels="inception").pipeline(img)  # no resize at 1 x 2
    imagenet = eval_transform(1, pixels="imagenet").pipeline(img)
    assert inception.shape[-2:] == (1, 1)
    black, white = (torch.tensor([[[0, 255]] * 1] * 3, dtype=torch.uint8) for _ in range(2))
    from torchvision.transforms import v2

    from transferbench.data.transforms import normalise

    x = v2.Compose(normalise("imagenet"))(torch.tensor([0, 255], dtype=torch.uint8).view(1, 1, 2).repeat(3, 1, 1))
    np.testing.assert_allclose(x[:, 0, 0].numpy(), [-0.485 / 0.229, -0.456 / 0.224, -0.406 / 0.225], rtol=1e-6)
    np.testing.assert_allclose(x[:, 0, 1].numpy(), [0.515 / 0.229, 0.544 / 0.224, 0.594 / 0.225], rtol=1e-6)
    y = v2.Compose(normalise("inception"))(torch.tensor([0, 255], dtype=torch.uint8).view(1, 1, 2).repeat(3, 1, 1))
    assert y[:, 0, 0].tolist() == [-1.0] * 3 and y[:, 0, 1].tolist() == [1.0] * 3
    assert stats("mean=0.1,0.2,0.3/std=1,2,3") == ((0.1, 0.2, 0.3), (1.0, 2.0, 3.0))
    with pytest.raises(UserError, match="pixels="):
        stats("mean=0.1/std=1")
    del inception, imagenet, black, white


def test_normalisation_travels_with_the_weights_into_the_cell_key(tmp_path):
    m = create_backbone("mu4", img_size=16)
    ours = save_checkpoint(m, tmp_path / "in.safetensors", pixels="imagenet")
    bare = save_checkpoint(m, tmp_path / "bare.safetensors")
    assert checkpoint_pixels(ours) == "imagenet" and checkpoint_pixels(bare) is None
    task = prepare_task("vtab", suite="embedded", datasets=["mini_digits"])
    ds, hp = task.datasets[0], dict(task.grid()[0])
    assert hp["pixels"] == "auto"
    a = make_cell(task, ds, resolve_backbone(f"mu4@{ours}"), hp, 0, "select")
    b = make_cell(task, ds, resolve_backbone(f"mu4@{bare}"), hp, 0, "select")
    assert a.hparams["pixels"] == "imagenet" and b.hparams["pixels"] == "inception"  # the documented default
    forced = make_cell(task, ds, resolve_backbone(f"mu4@{ours}"), {**hp, "pixels": "inception"}, 0, "select")
    assert forced.hparams["pixels"] == "inception" and forced.key != a.key
    with pytest.raises(UserError, match="pixels="):
        prepare_task("vtab", sets=["pixels=imagenett"])


def test_a_checkpoint_without_stated_pixels_is_named_once(suite_home, tmp_path, caplog):
    import logging

    path = save_checkpoint(create_backbone("mu4", img_size=16), tmp_path / "bare.safetensors")
    line = f"run vtab --suite embedded --datasets mini_digits --backbone mu4@{path} {kit.tiny_args('vtab', steps=1)}"
    with caplog.at_level(logging.WARNING, logger="transferbench"):
        assert kit.cli(f"{line} --out", tmp_path / "o") == 0
    said = [r.getMessage() for r in caplog.records if "states no pixel normalisation" in r.getMessage()]
    assert len(said) == 1 and "using 'inception'" in said[0]  # 4 cells, one line
