"""The ADE20K, LiT and diagnostics defaults against their sources: DPN App. G's scenic config and scenic's
optimizers.py; DPN §6.2, big_vision's lit_coco config, optax.py and prompt_engineering.py; the over-smoothing
slides, the DTN paper (App. B.1, Figs. 4, 7, 8) and DPN Fig. 2. Each test computes the expected numbers by hand."""

from __future__ import annotations

import math
import re
import string

import numpy as np
import pytest
import torch
from torch import nn

from transferbench.backbones import create_backbone
from transferbench.spec import load_task as load_spec


def spec_hparams(task: str, suite: str | None = None) -> dict:
    spec = load_spec(task)
    hp = dict(spec.hparams)
    if suite:
        hp.update(spec.suites[suite].hparams or {})
    return hp


# ---------------------------------------------------------------- ADE20K (DPN App. G) ---------------------


def test_ade20k_spec_states_app_g():
    hp = spec_hparams("ade20k")
    assert (hp["lr"], hp["weight_decay"], hp["batch"], hp["epochs"]) == (3e-5, 0.01, 16, 128)
    assert hp["drop_path"] == 0.1 and hp["skip_scale_and_bias"] is True
    assert hp["pixels"] == "imagenet" and hp["epoch"] == "pool"
    assert hp["decoder_tokens"] == "prenorm" and hp["posemb"] == "scenic"
    assert load_spec("ade20k").protocol_version == "2"
    assert "160k" not in load_spec("ade20k").description


def test_no_decay_on_exactly_the_scale_and_bias_parameters():
    """scenic: mask = x.ndim != 1. By hand from the module types: every LayerNorm's weight and bias, every
    Linear's and conv's bias; nothing else (pos_embed, cls_token and kernels keep their decay)."""
    from transferbench.adapters.seg import LinearSegmenter
    from transferbench.engine.augreg import scale_and_bias, scenic_adamw

    model = LinearSegmenter(create_backbone("mu4_dpn", img_size=32), 4)
    expected = set()
    for prefix, m in model.named_modules():
        if isinstance(m, nn.LayerNorm) and m.elementwise_affine:
            expected |= {f"{prefix}.weight", f"{prefix}.bias"}
        elif isinstance(m, (nn.Linear, nn.Conv2d)) and m.bias is not None:
            expected.add(f"{prefix}.bias")
    assert set(scale_and_bias(model)) == expected
    assert "backbone.patch_embed.norm_pre.weight" in expected  # DPN's first LayerNorm over p*p*3
    assert not {"backbone.pos_embed", "backbone.cls_token", "head.weight"} & expected

    # one AdamW step with zero gradients moves nothing but the decay: p <- p (1 - lr * wd) on the decayed set
    opt = scenic_adamw(model, lr=0.5, weight_decay=0.2, betas=(0.9, 0.999))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    for n, p in model.named_parameters():
        factor = 1.0 if n in expected else 1 - 0.5 * 0.2
        torch.testing.assert_close(p.detach(), before[n] * factor)


def test_imagenet_standardisation_of_a_known_image():
    """App. G's pp: value_range(0, 1) then (x - [0.485, 0.456, 0.406]) / [0.229, 0.224, 0.225]."""
    from transferbench.data import pixels

    image = torch.tensor([255, 0, 128], dtype=torch.uint8).reshape(3, 1, 1).expand(3, 2, 2).contiguous()
    out = pixels.normalise_uint8(image, spec_hparams("ade20k")["pixels"])
    want = [(1 - 0.485) / 0.229, (0 - 0.456) / 0.224, (128 / 255 - 0.406) / 0.225]
    torch.testing.assert_close(out[:, 0, 0].float(), torch.tensor(want), atol=1e-5, rtol=0)


@pytest.mark.parametrize("fraction", [0.0625, 0.125, 0.25, 0.5, 1.0])
def test_steps_do_not_depend_on_the_fraction(fraction):
    """App. G: steps_per_epoch = 20210 // 16 = 1263 for every train_data_pct: 128 x 1263 = 161,664 steps."""
    from transferbench.adapters.seg.adapter import subset, train_steps
    from transferbench.settings.seg import SegSettings

    hp = SegSettings.of(spec_hparams("ade20k"))
    n = len(subset(20210, fraction, seed=0))
    assert train_steps(hp, n, 20210) == 128 * 1263 == 161664
    # the option: passes over the fraction's own images
    assert train_steps(hp.model_copy(update={"epoch": "fraction"}), n, 20210) == math.ceil(128 * n / 16)
    # the embedded profile: 8 epochs of 512 // 8 steps whatever the fraction
    emb = SegSettings.of(spec_hparams("ade20k", "embedded"))
    assert train_steps(emb, len(subset(512, fraction, 0)), 512) == 512


def test_decoder_reads_the_tokens_before_the_final_norm():
    """out_with_norm = False: the decoder's input is the last block's output; `norm` applies the final norm."""
    from transferbench.adapters.seg import LinearSegmenter

    torch.manual_seed(0)
    backbone = create_backbone("mu4", img_size=32).eval()
    with torch.no_grad():
        backbone.norm.weight.mul_(3.0).add_(0.5)  # a final norm that visibly changes the tokens
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        t = backbone._embed(x)
        for t in backbone._run_blocks(t):  # noqa: B007, B020 - the last block's output
            pass
        by_hand = t[:, backbone.num_prefix_tokens :]
        pre = LinearSegmenter(backbone, 4, tokens="prenorm").patch_tokens(x)
        post = LinearSegmenter(backbone, 4, tokens="norm").patch_tokens(x)
    torch.testing.assert_close(pre, by_hand)
    torch.testing.assert_close(post, backbone.norm(by_hand))
    assert (pre - post).abs().max() > 0.1


def test_scenic_posemb_is_half_pixel_bilinear():
    """jax.image.resize(..., 'bilinear') from 2 to 4 samples at source positions (i + 0.5) / 2 - 0.5 =
    -0.25, 0.25, 0.75, 1.25 (edges clamped): a, 0.75a + 0.25b, 0.25a + 0.75b, b along each axis."""
    from transferbench.backbones.checkpoint import resample_posemb

    a, b, c, d = 1.0, 3.0, 5.0, 11.0
    table = torch.tensor([[[9.0], [a], [b], [c], [d]]])  # a cls position, then the 2 x 2 grid
    out = resample_posemb(table, (4, 4), (2, 2), 1, method="scenic")
    assert out[0, 0, 0] == 9.0
    w = torch.tensor([[1, 0], [0.75, 0.25], [0.25, 0.75], [0, 1]])
    want = w @ torch.tensor([[a, b], [c, d]]) @ w.T
    torch.testing.assert_close(out[0, 1:, 0].reshape(4, 4), want)
    # big_vision's (corners aligned) differs: its second sample is a + (b - a) / 3
    bv = resample_posemb(table, (4, 4), (2, 2), 1, method="big_vision")
    assert abs(float(bv[0, 2, 0]) - (a + (b - a) / 3)) < 1e-6


def test_stochastic_depth_grows_to_point_one():
    from timm.layers import DropPath

    model = create_backbone("mu4", img_size=32, drop_path_rate=spec_hparams("ade20k")["drop_path"])
    rates = [blk.drop_path1.drop_prob if isinstance(blk.drop_path1, DropPath) else 0.0 for blk in model.blocks]
    depth = len(model.blocks)
    assert rates == pytest.approx([0.1 * i / (depth - 1) for i in range(depth)])


# ---------------------------------------------------------------- LiT (DPN §6.2, big_vision) --------------


def test_lit_spec_states_the_paper_and_lit_coco():
    from transferbench.adapters import prepare_task

    spec = load_spec("lit")
    hp = spec_hparams("lit")
    assert (hp["steps"], hp["batch"]) == (55000, 16384)  # DPN §6.2
    assert (hp["lr"], hp["weight_decay"], hp["temperature_init"], hp["context_length"]) == (1e-3, 0.01, 10.0, 16)
    assert hp["warmup_steps"] is None  # stored as lit_coco's rule, resolved per run:
    assert prepare_task("lit").hparams["warmup_steps"] == max(int(0.03 * 55000), 100) == 1650
    assert (hp["decay"], hp["prompts"], hp["augment"]) == ("big_vision", "big_vision", "flip")
    coco = spec.suites["lit_coco"].hparams
    assert (coco["steps"], coco["batch"]) == (5000, 4096) and "warmup_steps" not in coco
    assert prepare_task("lit", suite="lit_coco").hparams["warmup_steps"] == max(int(0.03 * 5000), 100) == 150
    assert spec.protocol_version == "2"


def test_big_vision_weight_decay_per_step():
    """big_vision optax.make: update = -sched(t) * (lr * adam(g) + wd * p) on `.*/kernel$`. With zero gradients
    (adam's update is 0) one step at schedule value s leaves kernels at p (1 - s * wd) and the rest unchanged."""
    from transferbench.adapters.lit import LitModel, parameter_groups
    from transferbench.adapters.lit.towers import kernel_names
    from transferbench.adapters.lit.training import tower_options
    from transferbench.settings.lit import LitSettings

    torch.manual_seed(0)
    model = LitModel(
        32,
        {"context_length": 16, "vocab_size": 49408, "width": 64, "heads": 2, "layers": 1},
        image_head="linear",
        **tower_options(LitSettings()),
    )
    lr, wd, s = 1e-3, 0.01, 0.37
    opt = torch.optim.AdamW(parameter_groups(model, wd, lr=lr, decay="big_vision"), lr=lr)
    for g in opt.param_groups:
        g["lr"] = lr * s  # what engine.train.fit sets at a step where the schedule is s
    kernels = set(kernel_names(model))
    assert {
        "text.text_projection",
        "image_head.weight",
        "text.transformer.resblocks.0.attn.in_proj_weight",
        "text.transformer.resblocks.0.mlp.c_fc.weight",
    } <= kernels
    assert (
        not {
            "text.token_embedding.weight",
            "text.positional_embedding",
            "logit_scale",
            "text.ln_final.weight",
            "image_head.bias",
        }
        & kernels
    )
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    for n, p in model.named_parameters():
        factor = 1 - s * wd if n in kernels else 1.0
        torch.testing.assert_close(p.detach(), before[n] * factor)
    # open_clip's semantics decay by lr_t * wd: 1000x weaker at lr 1e-3
    (g_decay, _) = parameter_groups(model, wd, decay="open_clip")
    assert g_decay["weight_decay"] == wd


def _bv_canonicalize(text, *, keep_punctuation_exact_string=None):
    """A transcription of big_vision's prompt_engineering._canonicalize."""
    text = text.replace("_", " ")
    if keep_punctuation_exact_string:
        text = keep_punctuation_exact_string.join(
            part.translate(str.maketrans("", "", string.punctuation))
            for part in text.split(keep_punctuation_exact_string)
        )
    else:
        text = text.translate(str.maketrans("", "", string.punctuation))
    text = text.lower()
    text = re.sub(r"\s+", " ", text)
    return text.strip()


def test_prompts_canonicalised_as_big_vision():
    import open_clip

    from transferbench.adapters.lit import class_names_for, templates_for

    templates = templates_for("imagenet", "big_vision")
    raw = [t("{}") for t in open_clip.OPENAI_IMAGENET_TEMPLATES] + ["{}"]  # big_vision's clip_paper: 80 + '{}'
    assert len(templates) == 81
    assert [t("{}") for t in templates] == [_bv_canonicalize(t, keep_punctuation_exact_string="{}") for t in raw]
    assert templates[20]("tench") == "a closeup photo of a tench"  # 'a close-up photo of a {}.'
    names = class_names_for("imagenet", prompts="big_vision")
    want = [_bv_canonicalize(n, keep_punctuation_exact_string=",").split(",")[0] for n in open_clip.IMAGENET_CLASSNAMES]
    assert names == want
    assert "frillednecked lizard" in names and "st bernard" in names  # "frilled-necked lizard", "St. Bernard"
    # the option keeps open_clip's text
    assert templates_for("imagenet", "open_clip")[0]("tench") == "a bad photo of a tench."
    assert class_names_for(["Aquarium_Fish, fish tank"], prompts="big_vision") == ["aquarium fish"]


def test_flip_view_draws_each_view_per_example():
    """augment: flip: each example of each step takes the original or the mirrored features, p = 0.5, drawn per
    example (not one view per batch, nor one fixed view per example), and always its own example's features."""
    from transferbench.adapters.lit.training import view_batches

    tokens = torch.arange(64)[:, None]
    orig, flip = 2 * tokens.float(), 2 * tokens.float() + 1  # a feature names its example (f // 2), its view (f % 2)
    batches = list(view_batches(tokens, [orig, flip], batch=32, steps=50, seed=3))
    assert len(batches) == 50
    seen = {i: [] for i in range(64)}  # each example's views over the steps
    spread = []  # the variance of the picks within each batch
    for t, f in batches:
        assert torch.equal(torch.div(f, 2, rounding_mode="floor").long(), t)  # each row its own example's features
        pick = (f % 2).flatten()
        for i, v in zip(t.flatten().tolist(), pick.tolist()):
            seen[i].append(v)
        spread.append(float(pick.mean() * (1 - pick.mean())))
    # one view per batch makes each batch all 0 or all 1 (spread 0); drawn per example, a batch of 32 misses a view
    # with p = 2 * 2**-32 and its spread is p(1 - p) = 0.25 on average (31/32 of it, as a plug-in estimate)
    assert all(s > 0 for s in spread) and sum(spread) / len(spread) > 0.2
    # 1600 fair draws: mean 0.5 with standard deviation sqrt(0.25 / 1600) = 0.0125; within 4 of them
    picks = [v for vs in seen.values() for v in vs]
    assert len(picks) == 50 * 32 and abs(sum(picks) / len(picks) - 0.5) < 4 * 0.0125
    # drawn anew at each step, not once per example: every example (seen about 25 times) takes both views
    assert min(len(v) for v in seen.values()) >= 10 and all(0 < sum(v) < len(v) for v in seen.values())
    # a single view is tensor_batches itself
    from transferbench.engine.batches import tensor_batches

    for (t1, f1), (t2, f2) in zip(
        view_batches(tokens, [orig], batch=8, steps=3, seed=1), tensor_batches(tokens, orig, batch=8, steps=3, seed=1)
    ):
        assert torch.equal(t1, t2) and torch.equal(f1, f2)


# ---------------------------------------------------------------- diagnostics ------------------------------


def test_attention_std_over_patches_only():
    """A 1 + 4 token map whose cls row and column differ from the patch block: the slides' measure sees only
    the 4 x 4 patch block."""
    from transferbench.backbones.measures import attention_row_std

    probs = torch.zeros(1, 1, 5, 5)
    probs[0, 0, 0] = torch.tensor([0.96, 0.01, 0.01, 0.01, 0.01])  # the cls query
    patch_rows = torch.tensor(
        [[0.2, 0.4, 0.2, 0.1, 0.1], [0.2, 0.2, 0.2, 0.2, 0.2], [0.0, 0.1, 0.1, 0.4, 0.4], [0.6, 0.1, 0.1, 0.1, 0.1]]
    )
    probs[0, 0, 1:] = patch_rows
    sub = patch_rows[:, 1:]
    want = np.mean([np.std(r.numpy()) for r in sub])
    assert float(attention_row_std(probs, prefix=1)) == pytest.approx(want, abs=1e-6)
    every = np.mean([np.std(r.numpy()) for r in probs[0, 0]])
    assert float(attention_row_std(probs, prefix=0)) == pytest.approx(every, abs=1e-6)
    assert abs(want - every) > 0.05


def test_attention_distance_in_patches_is_pixels_over_patch_size():
    from transferbench.adapters.diagnose import forward_diagnostics
    from transferbench.engine.compute import CellContext
    from transferbench.settings.finetune import DiagnoseSettings

    class Images(torch.utils.data.Dataset):
        def __len__(self):
            return 10

        def __getitem__(self, i):
            g = torch.Generator().manual_seed(i)
            return torch.randint(0, 256, (3, 16, 16), dtype=torch.uint8, generator=g).numpy().transpose(1, 2, 0), 0

    torch.manual_seed(0)
    model = create_backbone("mu4", img_size=16).eval()
    ctx = CellContext("cpu", show_progress=False)
    hp = {
        "images": 6,
        "image_sample": "random",
        "resolution": 16,
        "eval_batch": 4,
        "bf16": "off",
        "pixels": "inception",
        "attn_std_tokens": "patches",
    }
    s = forward_diagnostics(model, Images(), DiagnoseSettings.of(hp), ctx, seed=1)
    assert s["attn_distance"]["n"] == 6
    np.testing.assert_allclose(
        np.asarray(s["attn_distance_patches"]["mean"]) * model.patch_size, s["attn_distance"]["mean"], rtol=1e-12
    )


def test_forward_images_are_a_seeded_subsample():
    from transferbench.adapters.diagnose import image_indices

    idx = image_indices(1_281_167, 10_000, "random", seed=0)
    assert len(set(idx.tolist())) == 10_000 and np.all(np.diff(idx) > 0)
    assert idx.tolist() == np.sort(np.random.default_rng(0).choice(1_281_167, 10_000, replace=False)).tolist()
    assert not np.array_equal(idx, image_indices(1_281_167, 10_000, "random", seed=1))
    assert image_indices(50, 10, "first", 0).tolist() == list(range(10))
    hp = spec_hparams("diagnose")
    assert (hp["images"], hp["image_split"], hp["image_sample"], hp["attn_std_tokens"]) == (
        10000,
        "train",
        "random",
        "patches",
    )


def test_pretraining_logs_gradient_norms_and_lambdas_that_diagnose_reads(suite_home, tmp_path, monkeypatch):
    """A tiny pretraining of mu4_dtn leaves NAME.log.json beside its checkpoint: per-layer gradient norms over
    the last steps (DPN Fig. 2), the stem's over all steps, DTN's λ over training (DTN Fig. 4); its last λ
    entry equals sigmoid of the saved mixing logits; `diagnose` carries the log into its record and tables."""
    from safetensors.torch import load_file

    from transferbench.adapters import prepare_task, pretrain, resolve_backbone
    from transferbench.backbones.checkpoint import read_training_log, training_log_path
    from transferbench.engine.runner import RunOptions, run_task
    from transferbench.records.store import load_records
    from transferbench.reporting.diagnostics import tables

    monkeypatch.setattr(pretrain, "PRETRAIN_SETS", ("steps=5", "batch=8", "warmup_steps=1"))
    monkeypatch.setattr(pretrain, "GRAD_LOG_LAST", 2)
    ref = resolve_backbone("mu4_dtn@embedded")
    assert training_log_path(ref.checkpoint).is_file()
    log = read_training_log(ref.checkpoint)
    depth = len(create_backbone("mu4_dtn").blocks)
    assert log["steps"] == 5 and log["last"] == 2 and len(log["grad_norm_last"]) == depth
    assert all(v > 0 and np.isfinite(v) for v in log["grad_norm_last"])
    assert len(log["embed_grad_norm"]["value"]) == 5  # 5 steps in bins of ceil(5 / 100) = 1
    assert log["embed_grad_norm_last"] == pytest.approx(np.mean(log["embed_grad_norm"]["value"][-2:]))
    assert [e["step"] for e in log["dtn_lambda"]] == [0, 1, 2, 3, 4, 5]  # after 0 .. 5 updates
    assert log["dtn_lambda"][0]["norms"][0]["lambda_mean"] == pytest.approx([0.5] * 4)  # mix logits start at 0
    last = log["dtn_lambda"][-1]
    sd = load_file(str(ref.checkpoint))
    for n in last["norms"]:
        want = torch.sigmoid(sd[f"blocks.{n['name']}.mix_mean"]).tolist()
        assert n["lambda_mean"] == pytest.approx(want, abs=1e-6)

    task = prepare_task(
        "diagnose",
        suite="embedded",
        datasets=["mini_photos"],
        seeds=[0],
        sets=["images=8", "steps=2", "warmup_steps=1", "grad_last=1", "eval_batch=8"],
    )
    out = tmp_path / "runs"
    run_task(task, [ref], out, RunOptions(show_progress=False))
    (fwd,) = [r for r in load_records([out]) if r["stage"] == "forward"]
    assert fwd["info"]["diagnostics"]["upstream"]["grad_norm_last"] == pytest.approx(log["grad_norm_last"])
    (up,) = [t for t in tables(load_records([out])) if t.metric.startswith("upstream gradient norm")]
    assert up.rows["mu4_dtn@embedded"]["L0"].estimate.mean == pytest.approx(log["grad_norm_last"][0])
