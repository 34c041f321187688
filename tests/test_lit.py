"""LiT: prompts, towers, losses, zero-shot, retrieval, image-text readers and the embedded captions."""

from __future__ import annotations

import io
import math
import tarfile

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from transferbench.adapters.lit import (
    LitModel,
    LockedImageTower,
    clean_class_name,
    contrastive_loss,
    parameter_groups,
    retrieval_recall,
    templates_for,
    tokenizer,
    topk_accuracy,
    zero_shot_classifier,
)
from transferbench.adapters.lit.training import tower_options
from transferbench.data.folder import DataMissingError
from transferbench.data.image_text import CsvPairs, MalformedPairsError, ShardPairs, open_pairs, write_shards
from transferbench.settings.lit import LitSettings

TINY = {"context_length": 16, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1}


class StubTokenizer:
    """prompt -> a row holding the prompt's index in `prompts` (then the end-of-text id, as open_clip puts it)."""

    def __init__(self, prompts):
        self.index = {p: i for i, p in enumerate(prompts)}

    def __call__(self, texts):
        return torch.tensor([[self.index[t] + 1, 49407] for t in texts])


class StubText(torch.nn.Module):
    """encode_text returns a fixed vector per prompt (row = prompt index + 1)."""

    def __init__(self, table):
        super().__init__()
        self.table = torch.as_tensor(table, dtype=torch.float32)

    def encode_text(self, text, normalize=False, trim=False):
        x = self.table[text[:, 0] - 1]
        return F.normalize(x, dim=-1) if normalize else x


PAPER_TOWER = tower_options(LitSettings())  # the temperature and SigLIP bias of the paper's defaults


def test_prompt_average_and_normalisation_by_hand():
    # class A: templates give (3, 4) and (1, 0): normalised (0.6, 0.8) and (1, 0), mean (0.8, 0.4), normalised
    # (2, 1)/sqrt(5); class B: (0, 2) and (0, 5) -> (0, 1) both
    templates = ["x {}", "y {}"]
    prompts = ["x a", "y a", "x b", "y b"]
    model, tok = StubText([[3, 4], [1, 0], [0, 2], [0, 5]]), StubTokenizer(prompts)
    w = zero_shot_classifier(model, tok, ["a", "b"], templates_for(templates), batch=3)
    expected = torch.tensor([[2 / math.sqrt(5), 0.0], [1 / math.sqrt(5), 1.0]])
    assert torch.allclose(w, expected, atol=1e-6)
    import open_clip

    assert torch.allclose(w, open_clip.build_zero_shot_classifier(model, tok, ["a", "b"], templates), atol=1e-6)


def test_zero_shot_weights_equal_open_clips_on_a_real_text_tower():
    import open_clip

    torch.manual_seed(0)
    model = LitModel(24, TINY, **PAPER_TOWER).eval()
    names = [clean_class_name(n) for n in open_clip.IMAGENET_CLASSNAMES[:12]]
    templates = templates_for("imagenet")
    ours = zero_shot_classifier(model, tokenizer(16), names, templates, batch=100)
    theirs = open_clip.build_zero_shot_classifier(model, tokenizer(16), names, templates)
    assert ours.shape == (24, 12)
    assert (ours - theirs).abs().max() < 1e-5


def test_tokenizer_gives_open_clips_tokens():
    import open_clip

    ours, stock = tokenizer(16), open_clip.SimpleTokenizer(context_length=16)
    names = [clean_class_name(n) for n in open_clip.IMAGENET_CLASSNAMES[:150]]
    texts = [t(n) for n in names for t in templates_for("imagenet")]
    texts += ["Fish &amp; Chips", "caf\u00e9 au lait", "a  photo\tof a\ndog ", "the \ufb01sh", "don\u2019t", "  "]
    assert torch.equal(ours(texts), stock(texts))


def test_trimming_the_padding_changes_no_output():
    torch.manual_seed(0)
    model = LitModel(24, TINY, **PAPER_TOWER).eval()
    tokens = tokenizer(16)(["a cat", "a photo of a small brown dog on the grass"])
    with torch.no_grad():
        assert torch.allclose(model.encode_text(tokens, trim=True), model.encode_text(tokens), atol=1e-5)
    assert model.text.attn_mask.shape == (16, 16)  # restored after the trimmed forward


def test_templates_and_class_names():
    import open_clip

    t = templates_for("imagenet", "open_clip")  # as written: the 80 CLIP templates, then big_vision's '{}'
    assert len(t) == 81 and t[-1]("dog") == "dog" and t[0]("dog") == open_clip.OPENAI_IMAGENET_TEMPLATES[0]("dog")
    assert clean_class_name("Aquarium_Fish, fish tank", "open_clip") == "aquarium fish"
    assert clean_class_name("St. Bernard", "open_clip") == "st. bernard"
    assert clean_class_name("St. Bernard", "big_vision") == "st bernard"
    with pytest.raises(ValueError, match="one '\\{\\}'"):
        templates_for(["no placeholder"])


def test_temperature_parameterisation_and_clip_loss_by_hand():
    torch.manual_seed(0)
    model = LitModel(8, {**TINY, "width": 16}, **PAPER_TOWER)
    assert model.logit_scale.item() == pytest.approx(math.log(10.0))
    assert model.scale().item() == pytest.approx(10.0)
    img, txt = F.normalize(torch.randn(5, 8), dim=-1), F.normalize(torch.randn(5, 8), dim=-1)
    logits = 10.0 * img @ txt.T
    by_hand = (F.cross_entropy(logits, torch.arange(5)) + F.cross_entropy(logits.T, torch.arange(5))) / 2
    loss = contrastive_loss(model)(txt, img)  # image_head none: the features are the embedding
    assert loss.item() == pytest.approx(by_hand.item(), rel=1e-6)
    loss.backward()
    assert model.logit_scale.grad is not None and model.logit_scale.grad.abs() > 0
    with torch.no_grad():
        model.logit_scale.fill_(math.log(1000.0))
    assert model.scale().item() == pytest.approx(100.0)  # CLIP's clamp


def test_siglip_loss_by_hand():
    torch.manual_seed(0)
    model = LitModel(8, {**TINY, "width": 16}, loss="siglip", **PAPER_TOWER)
    assert model.logit_bias.item() == -10.0
    img, txt = F.normalize(torch.randn(4, 8), dim=-1), F.normalize(torch.randn(4, 8), dim=-1)
    signs = 2 * torch.eye(4) - 1
    by_hand = -F.logsigmoid(signs * (10.0 * img @ txt.T - 10.0)).sum() / 4
    assert contrastive_loss(model)(txt, img).item() == pytest.approx(by_hand.item(), rel=1e-6)


def test_weight_decay_groups_leave_out_gains_biases_and_temperature():
    model = LitModel(8, {**TINY, "width": 16}, image_head="linear", **PAPER_TOWER)
    names = {id(p): n for n, p in model.named_parameters()}
    decay, no_decay = parameter_groups(model, 0.01, decay="open_clip")
    assert {names[id(p)] for p in no_decay["params"]} >= {"logit_scale", "image_head.bias"}
    assert all(p.ndim >= 2 for p in decay["params"]) and decay["weight_decay"] == 0.01
    decay, no_decay = parameter_groups(model, 0.01, lr=1e-3, decay="big_vision")
    assert {names[id(p)] for p in no_decay["params"]} >= {
        "logit_scale",
        "image_head.bias",
        "text.token_embedding.weight",
        "text.positional_embedding",
    }
    assert decay["weight_decay"] == pytest.approx(10.0)  # wd / lr
    with pytest.raises(ValueError, match="learning rate"):
        parameter_groups(model, 0.01)


def test_locked_tower_gets_no_gradient_while_the_text_tower_trains():
    from transferbench.backbones import create_backbone
    from transferbench.engine.train import fit

    torch.manual_seed(0)
    backbone = create_backbone("mu4", img_size=16)
    before = {k: v.clone() for k, v in backbone.state_dict().items()}
    tower = LockedImageTower(backbone)
    model = LitModel(backbone.num_features, {**TINY, "width": 16}, **PAPER_TOWER)
    text_before = model.text.token_embedding.weight.clone()
    images = torch.randn(8, 3, 16, 16)
    tokens = tokenizer(16)([f"picture number {i}" for i in range(8)])

    def batches():
        while True:
            yield tokens, images

    loss = contrastive_loss(model)
    model.train()
    tower.train()  # stays in eval mode
    opt = torch.optim.AdamW(list(model.parameters()) + list(tower.parameters()), lr=1e-2)
    fit(
        model,
        batches(),
        opt,
        steps=3,
        base_lr=1e-2,
        warmup=0,
        clip=1.0,
        device="cpu",
        bf16=False,
        loss_fn=lambda text, imgs: loss(text, tower(imgs)),
        splittable=False,
    )
    assert not backbone.training
    assert all(p.grad is None for p in backbone.parameters())
    assert all(torch.equal(before[k], v) for k, v in backbone.state_dict().items())
    assert not torch.equal(text_before, model.text.token_embedding.weight)


def test_zero_shot_is_perfect_when_text_embeddings_are_the_class_means():
    rng = np.random.default_rng(0)
    k, d = 6, 16
    centres = rng.normal(size=(k, d)) * 3
    labels = rng.integers(0, k, 300)
    feats = centres[labels] + rng.normal(size=(300, d)) * 0.3
    means = np.stack([feats[labels == c].mean(0) for c in range(k)])
    names = [f"class{c}" for c in range(k)]
    model, tok = StubText(means), StubTokenizer([f"{n}" for n in names])
    weights = zero_shot_classifier(model, tok, names, templates_for(["{}"]))
    acc = topk_accuracy(F.normalize(torch.tensor(feats, dtype=torch.float32), dim=-1) @ weights, labels)
    assert acc[1] == 1.0 and acc[5] == 1.0
    shuffled = topk_accuracy(F.normalize(torch.tensor(feats, dtype=torch.float32), dim=-1) @ weights.roll(1, 1), labels)
    assert shuffled[1] == 0.0  # each class's mean moved to the next class: every prediction wrong


def test_retrieval_recall_by_hand_with_repeated_captions():
    img = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])
    txt = torch.tensor([[0.1, 0.995], [0.0, 1.0], [1.0, 0.0]])
    # similarities (rows images): [0.1, 0, 1], [0.995, 1, 0], [0.856, 0.8, 0.6]
    r = retrieval_recall(img, txt, ["a", "b", "c"], ks=(1, 2))
    assert r["i2t_r1"] == pytest.approx(1 / 3)  # image 1 -> text 1; image 0 -> text 2, image 2 -> text 0: misses
    assert r["i2t_r2"] == pytest.approx(2 / 3)  # image 0's second is text 0: a hit
    assert r["t2i_r1"] == pytest.approx(1 / 3)  # text 1 -> image 1 only
    same = retrieval_recall(img, txt, ["x", "y", "x"], ks=(1,))
    # repeated captions: a retrieved item whose caption equals the query's counts
    assert same["i2t_r1"] == pytest.approx(1.0)
    assert same["t2i_r1"] == pytest.approx(2 / 3)  # text 0 ('x') -> image 1 ('y'): the one miss


# --- readers -----------------------------------------------------------------------------------------------


def _image(seed: int, size=(6, 5)) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (*size, 3), dtype=np.uint8)


def test_csv_pairs_read_back_in_order(tmp_path):
    for i in range(3):
        Image.fromarray(_image(i)).save(tmp_path / f"im{i}.png")
    (tmp_path / "pairs.tsv").write_text("filepath\ttitle\n" + "".join(f"im{i}.png\tcaption {i}\n" for i in range(3)))
    pairs = open_pairs(str(tmp_path / "pairs.tsv"))
    assert isinstance(pairs, CsvPairs) and len(pairs) == 3
    got = list(pairs)
    assert [c for _, c in got] == ["caption 0", "caption 1", "caption 2"]
    assert all(np.array_equal(np.asarray(im), _image(i)) for i, (im, _) in enumerate(got))
    (tmp_path / "other.csv").write_text("image,text\nim0.png,hello\n")
    custom = open_pairs(str(tmp_path / "other.csv"), img_key="image", caption_key="text", sep=",")
    assert [c for _, c in custom] == ["hello"]


def test_a_malformed_or_missing_csv_of_pairs_is_a_one_line_error(tmp_path):
    with pytest.raises(DataMissingError, match="does not exist"):
        CsvPairs(tmp_path / "absent.csv")
    (tmp_path / "bad.csv").write_text("path\tcaption\nim.png\thi\n")
    with pytest.raises(MalformedPairsError, match=r"bad.csv: no column 'filepath' or 'title'.*found 'path', 'caption'"):
        CsvPairs(tmp_path / "bad.csv")
    (tmp_path / "empty.csv").write_text("filepath\ttitle\n")
    with pytest.raises(MalformedPairsError, match="no rows"):
        CsvPairs(tmp_path / "empty.csv")
    (tmp_path / "gone.csv").write_text("filepath\ttitle\nmissing.png\thi\n")
    with pytest.raises(DataMissingError, match="row 2 names image .*missing.png"):
        list(CsvPairs(tmp_path / "gone.csv"))


def test_shards_read_back_in_order(tmp_path):
    pairs = [(_image(i, (4 + i, 7)), f"caption {i}") for i in range(5)]
    folder = write_shards(tmp_path, "set", pairs, {"source": "test"}, shard_size=2)
    shards = sorted(folder.glob("pairs-*.tar"))
    assert [s.name for s in shards] == ["pairs-00000.tar", "pairs-00001.tar", "pairs-00002.tar"]
    for reader in (ShardPairs(shards), open_pairs(str(folder / "pairs-{00000..00002}.tar")), open_pairs(str(folder))):
        got = list(reader)
        assert [c for _, c in got] == [c for _, c in pairs]
        assert all(np.array_equal(np.asarray(im), img) for (im, _), (img, _) in zip(got, pairs))
    again = write_shards(tmp_path / "again", "set", pairs, {"source": "test"}, shard_size=2)
    assert (again / "MANIFEST.sha256").read_text() == (
        folder / "MANIFEST.sha256"
    ).read_text()  # bytes depend on pairs only


def test_a_malformed_or_missing_webdataset_shard_is_a_one_line_error(tmp_path):
    write_shards(tmp_path, "one", [(_image(0), "a caption")], {})
    with pytest.raises(DataMissingError, match=r"shard .*one/pairs-00001.tar does not exist$"):
        open_pairs(str(tmp_path / "one" / "pairs-{00000..00001}.tar"))
    bad = tmp_path / "bad.tar"
    with tarfile.open(bad, "w") as tar:
        buf = io.BytesIO()
        Image.fromarray(_image(0)).save(buf, format="PNG")
        info = tarfile.TarInfo("k1.png")
        info.size = len(buf.getvalue())
        tar.addfile(info, io.BytesIO(buf.getvalue()))
    with pytest.raises(
        MalformedPairsError, match=r"bad.tar sample 'k1' has png; expected KEY.jpg\|jpeg\|png\|webp with KEY.txt"
    ):
        list(open_pairs(str(bad)))
    (tmp_path / "junk.tar").write_bytes(b"not a tar file at all" * 40)
    with pytest.raises(MalformedPairsError, match="cannot be read as tar"):
        list(open_pairs(str(tmp_path / "junk.tar")))
    with pytest.raises(Exception, match="give a .csv/.tsv"):
        open_pairs(str(tmp_path / "pairs.json"))


# --- embedded captions -------------------------------------------------------------------------------------


def test_captions_state_what_the_images_show():
    from transferbench.data.embedded import scene_caption, sprite_caption

    rng = np.random.default_rng(0)
    objects = [(0, 8, 1, 0, 0.5), (0, 9, 1, 1, 0.5), (0, 10, 2, 1, 0.5)]  # red sphere, red cube, blue cube
    seen = {scene_caption(objects, rng) for _ in range(60)}
    assert "three objects on a floor" in seen
    assert "a scene with three objects: two red and one blue" in seen
    assert "three shapes, one sphere and two cubes" in seen
    sprites = {sprite_caption(1, 0.5, 0, 31, rng) for _ in range(40)}
    assert "a small ellipse at the bottom left" in sprites and "an ellipse shape at the bottom left" in sprites
    centre = sprite_caption(2, 1.0, 16, 16, rng)
    assert "in the centre" in centre and "heart" in centre


def test_the_embedded_captions_name_every_kind_of_picture(suite_home):
    from transferbench.data.embedded import embedded_pairs

    pairs = list(embedded_pairs())
    assert len(pairs) >= 10_000
    captions = [c for _, c in pairs]
    kinds = {
        "digit": sum("handwritten" in c or "digit" in c or "number" in c for c in captions),
        "sprite": sum(any(s in c for s in ("square", "ellipse", "heart")) for c in captions),
        "scene": sum("objects" in c or "shapes" in c for c in captions),
    }
    assert all(v >= 1500 for v in kinds.values()), kinds
    # 8 x 8 images are scikit-learn digits: their captions name a digit
    small = [c for im, c in pairs if im.size == (8, 8)]
    assert len(small) == 2000 and all(
        any(w in c for w in ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"))
        for c in small
    )


# --- the task ----------------------------------------------------------------------------------------------


def test_lit_cells_share_cached_features_and_the_text_tower(suite_home, tmp_path):
    from transferbench.adapters import prepare_task, resolve_backbone
    from transferbench.engine.runner import RunOptions, run_task
    from transferbench.records.store import load_records

    task = prepare_task(
        "lit",
        suite="embedded",
        seeds=[0],
        datasets=["mini_digits", "heldout_i2t"],
        sets=["steps=4", "text_layers=1", "batch=64"],
    )
    s = run_task(task, [resolve_backbone("mu4")], tmp_path, RunOptions(show_progress=False))
    assert (s.ok, s.failed) == (2, 0), s.failures
    recs = sorted(load_records([tmp_path]), key=lambda r: r["finished_at"])
    first, second = recs
    assert first["info"]["feature_cache_hit_pairs"] is False and second["info"]["feature_cache_hit_pairs"] is True
    assert first["info"]["tower_cache_hit"] is False and second["info"]["tower_cache_hit"] is True
    assert first["info"]["final_loss"] == second["info"]["final_loss"]
    assert first["info"]["pairs_train"] == 10_240 and first["info"]["pairs_heldout"] == 1024
    by_name = {r["dataset"]: r for r in recs}
    zs, ret = by_name["mini_digits"], by_name["heldout_i2t"]
    assert zs["info"]["classes"] == 10 and zs["info"]["templates"] == 3 and zs["info"]["eval_examples"] == 797
    assert ret["metrics"]["test"]["accuracy"] == ret["metrics"]["test"]["i2t_r1"]
    assert ret["metrics"]["test"]["i2t_r1"] <= ret["metrics"]["test"]["i2t_r5"]
    assert zs["info"]["image_head"] == "none" and zs["hparams"]["image_head"] == "none"


def test_lit_without_pairs_stops_with_one_line(tmp_path):
    from transferbench.adapters import prepare_task
    from transferbench.engine.compute import CellContext
    from transferbench.errors import UserError

    task = prepare_task("lit", datasets=["heldout_i2t"])
    with pytest.raises(UserError) as e:
        task.adapter.check_data(task, CellContext("cpu"))
    msg = str(e.value)
    assert "\n" not in msg and "--set pairs=" in msg and "filepath,title" in msg and "--suite embedded" in msg
    task = prepare_task("lit", datasets=["heldout_i2t"], sets=[f"pairs={tmp_path}/cc/{{00000..00009}}.tar"])
    with pytest.raises(UserError, match=r"shard .*cc/00000.tar does not exist \(and 9 more of 10\)"):
        task.adapter.check_data(task, CellContext("cpu"))
    task = prepare_task("lit", datasets=["heldout_i2t"], sets=["pairs=embedded"])
    with pytest.raises(UserError, match="--micro-batch"):
        task.adapter.check_data(task, CellContext("cpu", micro_batch=64))


def test_spec_checks_zero_shot_entries():
    from transferbench.adapters import get_adapter
    from transferbench.spec import SpecError, parse_spec

    base = {"task": "t", "adapter": "lit", "protocol_version": "1", "metric": "accuracy"}
    adapter = get_adapter("lit")
    for entry, message in (
        ({"name": "d", "source": "embedded", "set": "digits", "test": "test"}, "no tfds label names"),
        ({"name": "d", "source": "pairs"}, "retrieval: i2t\\|t2i"),
        ({"name": "d", "tfds": "x", "test": "test", "templates": ["a {} b {}"]}, "one '\\{\\}'"),
    ):
        with pytest.raises(SpecError, match=message):
            adapter.validate(parse_spec({**base, "datasets": [entry]}), "t.yaml")


def test_tfds_zero_shot_sets_take_their_label_names_cleaned():
    import tensorflow_datasets as tfds

    from transferbench.adapters.lit import class_names_for, open_zero_shot

    with tfds.testing.mock_data(num_examples=20):  # food101's label names ship with tfds ('apple_pie', ...)
        data = open_zero_shot({"name": "food101", "source": "tfds", "tfds": "food101:2.*.*", "test": "validation"})
        names = class_names_for("tfds", data)
    assert len(names) == 101 == data.num_classes
    assert names[:3] == ["apple pie", "baby back ribs", "baklava"] and names[-1] == "waffles"
    assert class_names_for("imagenet")[:2] == ["tench", "goldfish"] and len(class_names_for("imagenet")) == 1000


def test_tensor_batches_visit_rows_in_the_epoch_samplers_order():
    from transferbench.engine.batches import _EpochSampler, tensor_batches

    n, batch, steps = 37, 8, 20  # 160 rows: four full epochs and part of a fifth, batches across epoch ends
    expected = [i for i, _ in _EpochSampler(n, 5, batch * steps)]
    rows = torch.arange(n) * 10
    got = list(tensor_batches(torch.arange(n), rows, batch=batch, steps=steps, seed=5))
    assert len(got) == steps and all(len(i) == batch and torch.equal(r, i * 10) for i, r in got)
    assert torch.cat([i for i, _ in got]).tolist() == expected
    assert sorted(expected[:n]) == list(range(n))  # each epoch a permutation
