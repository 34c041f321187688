"""ImageNet-C robustness: the corruption functions, mCE against published figures, the reference-normalised CE
and relative mCE by hand, the released-data readers on fixtures, the generator's determinism and cache, the
classifier stage and an end-to-end run."""

from pathlib import Path

import kit
import numpy as np
import pytest
import torch
from PIL import Image
from scipy.stats import spearmanr

from transferbench.data.corruptions import CORRUPTIONS, FAMILIES

pytest.importorskip("imagecorruptions")


def photos(size=64):
    import skimage.data

    return [
        np.asarray(Image.fromarray(getattr(skimage.data, n)()).convert("RGB").resize((size, size), Image.BILINEAR))
        for n in ("astronaut", "coffee", "chelsea")
    ]


# --- the 15 corruptions ---------------------------------------------------------------------------------


def test_the_fifteen_names_in_four_families_as_the_paper_groups_them():
    assert len(CORRUPTIONS) == 15 and sum(len(v) for v in FAMILIES.values()) == 15
    assert FAMILIES["weather"] == ("snow", "frost", "fog", "brightness")  # brightness is weather in the paper
    from imagecorruptions import get_corruption_names

    assert tuple(get_corruption_names("common")) == CORRUPTIONS


@pytest.mark.parametrize("name", CORRUPTIONS)
def test_each_corruption_changes_the_image_and_more_so_with_severity(name):
    from transferbench.data.corruptions import corrupt

    ims = photos()
    dist = [np.mean([np.abs(corrupt(im, name, s, 7).astype(float) - im).mean() for im in ims]) for s in range(1, 6)]
    assert min(dist) > 1.0, dist  # every severity changes the image (mean absolute difference in 0..255)
    assert dist[4] > 1.15 * dist[0], dist
    # the distance grows with severity (glass blur, frost and fog are not strictly monotone at every step: their
    # published parameters are not)
    assert spearmanr(range(5), dist).statistic >= 0.7, dist


def test_corruption_is_deterministic_in_its_seed():
    from transferbench.data.corruptions import corrupt, image_seed

    im = photos()[0]
    for name in ("gaussian_noise", "glass_blur", "impulse_noise", "frost", "elastic_transform"):
        a, b, c = corrupt(im, name, 3, 11), corrupt(im, name, 3, 11), corrupt(im, name, 3, 12)
        assert np.array_equal(a, b) and not np.array_equal(a, c), name
    seeds = {image_seed(5, i, c, s) for i in range(3) for c in CORRUPTIONS[:2] for s in (1, 2)}
    assert len(seeds) == 12  # distinct per image, corruption and severity


def test_corrupt_gives_the_packages_own_output_for_its_seed():
    """Seeding numpy's generator and passing the seed on reproduces the package called directly (the kept frost
    reads included)."""
    from imagecorruptions import corrupt as package

    from transferbench.data.corruptions import corrupt

    im = photos()[1]
    for name in ("frost", "snow", "glass_blur", "impulse_noise", "motion_blur"):
        np.random.seed(21)
        extra = {"seed": 21} if name in ("glass_blur", "impulse_noise") else {}
        expected = package(im, severity=4, corruption_name=name, **extra)
        for _ in range(2):  # the second frost call reads the kept frost image
            assert np.array_equal(corrupt(im, name, 4, 21), expected), name


def test_generation_in_a_process_pool_equals_one_process():
    from transferbench.data.corruptions import CHUNK, generate, image_seed

    ims = np.stack([photos(32)[i % 3] for i in range(CHUNK + 5)])  # two chunks
    seeds = [image_seed(1, i, "shot_noise", 2) for i in range(len(ims))]
    one = generate(ims, "shot_noise", 2, seeds, 16, processes=1)
    two = generate(ims, "shot_noise", 2, seeds, 16, processes=2)
    assert one.shape == (len(ims), 16, 16, 3) and np.array_equal(one, two)


def test_images_below_32_pixels_are_refused_with_the_fix():
    from transferbench.data.corruptions import generate

    with pytest.raises(ValueError, match="render=64"):
        generate(np.zeros((2, 16, 16, 3), np.uint8), "fog", 1, [0, 1], 16)


def test_the_original_package_is_refused_with_its_fork_named(monkeypatch):
    from importlib import metadata

    from transferbench.data import corruptions
    from transferbench.errors import UserError

    real = metadata.version

    def version(dist):
        if dist == "imagecorruptions-imaug":
            raise metadata.PackageNotFoundError(dist)
        return "1.1.2" if dist == "imagecorruptions" else real(dist)

    corruptions.generator_identity.cache_clear()
    monkeypatch.setattr(metadata, "version", version)
    try:
        with pytest.raises(UserError, match="glass_blur and fog fail.*imagecorruptions-imaug"):
            corruptions.generator_identity()
    finally:
        corruptions.generator_identity.cache_clear()


# --- mCE -------------------------------------------------------------------------------------------------


def test_alexnets_own_errors_give_ce_100_everywhere():
    from transferbench.adapters.corruption import ALEXNET_ERRORS, mce

    out = mce(ALEXNET_ERRORS, ALEXNET_ERRORS)
    assert all(v == pytest.approx(100.0) for v in out["ce"].values()) and out["mce"] == pytest.approx(100.0)
    per_severity = {c: [v] * 5 for c, v in ALEXNET_ERRORS.items()}  # sums over severities, same ratio
    assert mce(per_severity, ALEXNET_ERRORS)["mce"] == pytest.approx(100.0)


def test_resnet50s_published_ces_average_to_its_published_mce():
    from transferbench.adapters.corruption import ALEXNET_ERRORS, mce

    # Hendrycks & Dietterich (ICLR 2019), Table 1, ResNet-50: CE per corruption (rounded), mCE 76.7
    published = dict(zip(CORRUPTIONS, (80, 82, 83, 75, 89, 78, 80, 78, 75, 66, 57, 71, 85, 77, 77)))
    errors = {c: published[c] / 100 * ALEXNET_ERRORS[c] for c in CORRUPTIONS}  # the errors those CEs imply
    out = mce(errors, ALEXNET_ERRORS)
    assert all(out["ce"][c] == pytest.approx(published[c]) for c in CORRUPTIONS)
    assert abs(out["mce"] - 76.7) <= 0.5  # CEs rounded to integers: their mean is within 0.5 of the exact mCE
    # torchvision's ResNet-50 on ImageNet-C (mean top-1 accuracy over severities) and its CEs, two decimals
    measured = {
        "brightness": (68.02, 56.64),
        "contrast": (39.06, 71.43),
        "defocus_blur": (38.75, 74.71),
        "elastic_transform": (45.25, 84.75),
        "fog": (45.83, 66.11),
        "frost": (38.14, 74.84),
        "gaussian_noise": (29.29, 79.77),
        "glass_blur": (26.79, 88.61),
        "impulse_noise": (23.81, 82.58),
    }
    ce = mce({c: (100 - acc) / 100 for c, (acc, _) in measured.items()}, ALEXNET_ERRORS)["ce"]
    for c, (_, expected) in measured.items():
        assert ce[c] == pytest.approx(expected, abs=0.015), c  # both sides rounded to 0.01


def test_relative_mce_by_hand():
    from transferbench.adapters.corruption import relative_mce

    base = {"fog": [0.5, 0.6], "snow": [0.7, 0.9]}
    out = relative_mce({"fog": [0.3, 0.5], "snow": [0.4, 0.4]}, 0.2, base, 0.3)
    # fog: 100 * ((0.3 - 0.2) + (0.5 - 0.2)) / ((0.5 - 0.3) + (0.6 - 0.3)) = 100 * 0.4 / 0.5 = 80
    # snow: 100 * (0.2 + 0.2) / (0.4 + 0.6) = 40
    assert out["relative_ce"]["fog"] == pytest.approx(80.0) and out["relative_ce"]["snow"] == pytest.approx(40.0)
    assert out["relative_mce"] == pytest.approx(60.0)
    worse_clean = relative_mce({"fog": [0.3, 0.5]}, 0.2, {"fog": [0.2, 0.2]}, 0.3)  # the baseline never got worse
    assert np.isnan(worse_clean["relative_ce"]["fog"]) and np.isnan(worse_clean["relative_mce"])


def _records(values: dict, dataset="mini_x", baseline="reference"):
    """Corruption records: values[backbone][seed] = (clean error, {corruption: [e1..e5]})."""
    common = {"protocol_version": "1", "report": "corruption", "dataset_config": {"baseline": baseline}}
    common |= {"metric": "error", "mode": "min", "finished_at": "2026"}
    recs = []
    for b, seeds in values.items():
        for seed, (clean, per) in seeds.items():
            recs.append(
                kit.record("imagenet_c", dataset, b, seed, {"test": {"error": clean}}, stage="classifier", **common)
            )
            for c, errs in per.items():
                test = {"error": float(np.mean(errs)), **{f"error_{s + 1}": e for s, e in enumerate(errs)}}
                recs.append(
                    kit.record(
                        "imagenet_c",
                        dataset,
                        b,
                        seed,
                        {"test": test},
                        stage="corruption",
                        hparams={"corruption": c},
                        **common,
                    )
                )
    return recs


def test_reference_normalised_ce_and_the_table_by_hand():
    from transferbench.reporting.robustness import tables

    ref = {0: (10.0, {c: [20.0] * 5 for c in CORRUPTIONS}), 1: (12.0, {c: [30.0] * 5 for c in CORRUPTIONS})}
    new = {
        0: (10.0, {c: [15.0] * 5 for c in CORRUPTIONS}),
        1: (12.0, {c: [24.0, 26.0, 25.0, 25.0, 25.0] for c in CORRUPTIONS}),
    }
    (t,) = tables(_records({"base": ref, "new": new}), reference="base")
    # the reference's mean error per corruption over its seeds: (20 + 30) / 2 = 25
    # new, seed 0: CE = 100 * 15 / 25 = 60; seed 1: 100 * 25 / 25 = 100 -> mean 80; the reference: 80 and 120
    assert t.rows["new"]["gauss"].estimate.mean == pytest.approx(80.0)
    assert t.rows["base"]["mCE"].estimate.mean == pytest.approx(100.0)
    assert t.rows["new"]["mCE"].estimate.mean == pytest.approx(80.0)
    # paired per seed: (60 - 80, 100 - 120) = (-20, -20): no spread, significant, lower = better -> bold
    assert t.rows["new"]["mCE"].delta.mean == pytest.approx(-20.0) and t.rows["new"]["mCE"].better
    # relative: the reference's gap (25 - 11) = 14; new seed 0: 100 * (15 - 10) / 14, seed 1: 100 * (25 - 12) / 14
    assert t.rows["new"]["rel. mCE"].estimate.mean == pytest.approx(100 * (5 / 14 + 13 / 14) / 2)
    assert "normalised by base" in t.setting and t.mode == "min"
    from transferbench.reporting.formats import to_markdown

    md = to_markdown(t)
    assert "lower is better" in md and "**80.0" in md  # the lower CE is the bold one


def test_a_worse_backbone_is_not_bold_and_alexnet_datasets_use_alexnet():
    from transferbench.reporting.robustness import ALEXNET_ERRORS, tables

    worse = {s: (10.0, {c: [100 * ALEXNET_ERRORS[c]] * 5 for c in CORRUPTIONS}) for s in (0, 1)}
    better = {
        0: (9.0, {c: [50 * ALEXNET_ERRORS[c]] * 5 for c in CORRUPTIONS}),
        1: (9.5, {c: [52 * ALEXNET_ERRORS[c]] * 5 for c in CORRUPTIONS}),
    }
    (t,) = tables(_records({"a": better, "b": worse}, dataset="imagenet2012", baseline="alexnet"), reference="a")
    assert t.rows["b"]["mCE"].estimate.mean == pytest.approx(100.0)  # AlexNet's errors: CE 100
    assert t.rows["a"]["mCE"].estimate.mean == pytest.approx(51.0)
    assert t.rows["b"]["mCE"].worse and not t.rows["b"]["mCE"].better
    assert "AlexNet" in t.setting


# --- released data readers --------------------------------------------------------------------------------


def test_imagenet_c_folder_reader_labels_by_sorted_wnid(tmp_path):
    from transferbench.data.corruptions import ImageNetCFolder
    from transferbench.data.folder import DataMissingError

    wnids = ["n01443537", "n01440764", "n01484850"]  # unsorted on purpose: n01440764 is class 0
    for k, w in enumerate(wnids):
        d = tmp_path / "fog" / "3" / w
        d.mkdir(parents=True)
        for i in range(2):
            Image.fromarray(np.full((8, 8, 3), 40 * k + i, np.uint8)).save(d / f"ILSVRC2012_val_{k}{i}.JPEG")
    data = ImageNetCFolder(tmp_path, "fog", 3, num_classes=3)
    assert len(data) == 6 and data.num_classes == 3
    labels = {Path(p).parent.name: int(y) for p, y in zip(data.paths, data.labels)}
    assert labels == {"n01440764": 0, "n01443537": 1, "n01484850": 2}
    img, y = data[0]
    assert img.size == (8, 8) and y == 0
    with pytest.raises(DataMissingError, match="2 class folders, expected 3|3 class folders, expected 1000"):
        ImageNetCFolder(tmp_path, "fog", 3, num_classes=1000)
    with pytest.raises(DataMissingError, match=r"<root>/<corruption>/<severity>/<wnid>"):
        ImageNetCFolder(tmp_path, "snow", 1)


def test_cifar10_c_npy_reader_takes_its_severitys_block(tmp_path):
    from transferbench.data.corruptions import NpyCorrupted
    from transferbench.data.folder import DataMissingError

    n = 4
    images = np.stack([np.full((32, 32, 3), s * 10 + i, np.uint8) for s in range(5) for i in range(n)])
    np.save(tmp_path / "fog.npy", images)
    np.save(tmp_path / "labels.npy", np.tile(np.arange(n), 5))
    data = NpyCorrupted(tmp_path, "fog", 3)
    assert len(data) == n and int(data.array()[0, 0, 0, 0]) == 20 and list(data.labels) == [0, 1, 2, 3]
    with pytest.raises(DataMissingError, match="snow.npy not found"):
        NpyCorrupted(tmp_path, "snow", 1)


def test_tfds_imagenet2012_corrupted_through_data_source():
    tfds = pytest.importorskip("tensorflow_datasets")
    from transferbench.adapters.corruption import open_released

    ds = {
        "corrupted": "tfds",
        "tfds_corrupted": "imagenet2012_corrupted/{corruption}_{severity}:3.*.*",
        "tfds_corrupted_split": "validation",
        "classes": 1000,
    }
    with tfds.testing.mock_data(num_examples=6):
        data = open_released(ds, "zoom_blur", 4)
        assert data.name == "imagenet2012_corrupted/zoom_blur_4:3.*.*" and len(data) == 6
        img, y = data[0]
        assert 0 <= y < 1000 and data.num_classes == 1000 and img.mode == "RGB"


# --- the adapter -----------------------------------------------------------------------------------------


def _task(tmp_path, datasets=("mini_digits",), sets=(), limit=None):
    import dataclasses

    from transferbench.adapters import prepare_task
    from transferbench.spec import DatasetSpec

    task = prepare_task(
        "imagenet_c",
        suite="embedded",
        datasets=list(datasets),
        seeds=[0],
        sets=["steps=5", "corruptions=gaussian_noise,contrast", *sets],
    )
    if limit:  # a short test split (a dataset field, part of the cells' identity)
        task = dataclasses.replace(
            task, datasets=tuple(DatasetSpec(**{**d.model_dump(), "limit": limit}) for d in task.datasets)
        )
    return task


def test_end_to_end_cells_cache_and_report(suite_home, tmp_path, monkeypatch):
    from transferbench.adapters import resolve_backbone
    from transferbench.data import corruptions
    from transferbench.engine.runner import RunOptions, run_task
    from transferbench.records.store import load_records
    from transferbench.reporting.kinds import report_tables

    monkeypatch.setattr(corruptions, "pool", lambda n: pytest.fail("1 worker: no process pool"))
    task = _task(tmp_path, limit=40)
    out = tmp_path / "runs"
    backbones = [resolve_backbone(b) for b in ("mu4", "mu4_dpn")]
    summary = run_task(task, backbones, out, RunOptions(show_progress=False, workers=1))
    assert summary.ok == 2 * (1 + 2) and summary.failed == 0
    recs = load_records([out])
    clf = [r for r in recs if r["stage"] == "classifier"]
    cor = [r for r in recs if r["stage"] == "corruption"]
    assert len(clf) == 2 and len(cor) == 4 and all(r["report"] == "corruption" for r in recs)
    assert all(r["info"]["classifier_cache_hit"] for r in cor)  # trained once, by the classifier cell
    assert not any(r["info"]["classifier_cache_hit"] for r in clf)
    assert all(r["info"]["eval_examples_per_severity"] == 40 for r in cor)
    # the first backbone generated each corruption, the second read the cache
    hits = {(r["backbone"], r["hparams"]["corruption"]): r["info"]["image_cache_hits"] for r in cor}
    assert hits[("mu4", "contrast")] == [False] * 5 and hits[("mu4_dpn", "contrast")] == [True] * 5
    for r in cor:
        m = r["metrics"]["test"]
        assert m["error"] == pytest.approx(np.mean([m[f"error_{s}"] for s in range(1, 6)]))
        assert all(
            0 <= m[f"error_{s}"] <= 100
            and (m[f"error_{s}"] * 40 / 100) == pytest.approx(round(m[f"error_{s}"] * 40 / 100))
            for s in range(1, 6)
        )  # a count of 40 images
    (t,) = report_tables(recs, reference="mu4")
    assert t.columns == ["clean err", "gauss", "contrast"] and "normalised by mu4" in t.setting
    assert t.rows["mu4"]["gauss"].estimate.mean == pytest.approx(100.0)
    # a rerun skips every cell
    assert run_task(task, backbones, out, RunOptions(show_progress=False)).skipped == 6


def test_classifier_is_the_checkpoints_own_head_when_it_has_the_classes(suite_home, tmp_path):
    from transferbench.adapters import resolve_backbone
    from transferbench.adapters.corruption import classifier
    from transferbench.backbones import create_backbone
    from transferbench.backbones.checkpoint import save_checkpoint
    from transferbench.cell import make_cell
    from transferbench.engine.compute import CellContext

    model = create_backbone("mu4", img_size=16, num_classes=10)
    torch.nn.init.normal_(model.head.weight)
    path = save_checkpoint(model, tmp_path / "mu4_digits.safetensors")
    task = _task(tmp_path)
    cell = make_cell(task, task.datasets[0], resolve_backbone(f"mu4@{path}"), task.grid()[0], 0, "classifier")
    clf, info = classifier(cell, CellContext("cpu", show_progress=False))
    assert info["classifier"] == "checkpoint head"
    assert torch.equal(clf.head.weight, model.head.weight)


def test_missing_released_data_is_one_line_naming_the_layout(tmp_path):
    from transferbench.adapters import prepare_task
    from transferbench.engine.compute import CellContext
    from transferbench.errors import UserError

    spec = tmp_path / "folder_c.yaml"  # clean images embedded, corrupted ones expected as released
    spec.write_text("""task: folder_c
adapter: corruption
protocol_version: "1"
metric: error
mode: min
hparams: {resolution: 16, classifier: auto, optimizer: sgd, lr: 0.01, momentum: 0.9, weight_decay: 0.0, clip: 1.0,
          batch: 8, steps: 1, warmup_steps: 0, bf16: "off", corruptions: all}
datasets:
  - {name: digits_c, source: embedded, set: digits, train: train800, test: test, classes: 10, crop_pct: 1.0,
     corrupted: folder, path: Digits-C}
""")
    task = prepare_task(str(spec))
    with pytest.raises(UserError) as e:
        task.adapter.check_data(task, CellContext("cpu", data_dir=str(tmp_path)))
    msg = str(e.value)
    assert "\n" not in msg and "digits_c" in msg and str(tmp_path / "Digits-C" / "gaussian_noise" / "1") in msg
    assert "<root>/<corruption>/<severity>/<wnid>/*.JPEG" in msg and "corrupted: generate" in msg
    bad = prepare_task("imagenet_c", suite="embedded", sets=["corruptions=fogg"])
    with pytest.raises(UserError, match="unknown corruption 'fogg'; did you mean fog"):
        bad.adapter.check_data(bad, CellContext("cpu"))


def test_the_committed_embedded_results_rise_with_severity():
    """Over the committed embedded suite, each backbone's mean error (over datasets, corruptions and seeds)
    rises from clean through severity 1 to 5."""
    from transferbench.records.store import load_records

    recs = [
        r
        for r in load_records([Path(__file__).parents[1] / "results" / "runs"])
        if r["task"] == "imagenet_c" and r["status"] == "ok"
    ]
    assert recs, "results/runs/imagenet_c holds the embedded suite's records"
    for b in sorted({r["backbone"] for r in recs}):
        mine = [r for r in recs if r["backbone"] == b]
        clean = np.mean([r["metrics"]["test"]["error"] for r in mine if r["stage"] == "classifier"])
        sev = [
            np.mean([r["metrics"]["test"][f"error_{s}"] for r in mine if r["stage"] == "corruption"])
            for s in range(1, 6)
        ]
        assert len([r for r in mine if r["stage"] == "corruption"]) == 3 * 3 * 15, b
        assert clean < sev[0] and all(np.diff(sev) > 0), (b, clean, sev)


@pytest.mark.parametrize("setting", ["loss=sigmoid", "pixels=imagenet", "lr=0.01", "steps=20"])
def test_a_classifier_trained_under_other_settings_is_never_reused(setting):
    """The classifier cache is keyed by every setting the fine-tuning reads (App. E's recipe, the loss and the pixel
    normalisation among them): a cell that changes one gets another classifier, and one that changes only how the
    corrupted images are made (render) shares it."""
    from transferbench.adapters import prepare_task, resolve_backbone
    from transferbench.adapters.corruption.classifier import classifier_key
    from transferbench.adapters.corruption.dataset import TRAIN_KEYS
    from transferbench.cell import make_cell
    from transferbench.settings.finetune import FinetuneSettings

    backbone = resolve_backbone("mu4")

    def key(sets):
        task = prepare_task("imagenet_c", suite="embedded", datasets=["mini_digits"], sets=sets)
        return classifier_key(make_cell(task, task.datasets[0], backbone, task.grid()[0], 0, "classifier"))

    assert key([setting]) != key([]) == key(["render=48"])
    assert set(FinetuneSettings.model_fields) - set(TRAIN_KEYS) == {"backbone_preprocess"}
