"""Segmentation: metrics against hand computations and mmsegmentation, the linear decoder, the loss's ignore
index, image/mask alignment under the random transforms, nested fractions, sliding windows, readers."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from transferbench.adapters.seg import (
    LinearSegmenter,
    SegMetric,
    miou,
    segmentation_loss,
    slide_logits,
    subset,
    window_starts,
)
from transferbench.data.segmentation import eval_size, train_transform
from transferbench.errors import UserError
from transferbench.settings.seg import SegSettings

# --- metrics ------------------------------------------------------------------------------------------------

LABEL = np.array([[0, 0, 1], [1, 2, 255]])
PRED = np.array([[0, 1, 1], [1, 0, 2]])


# mmseg's ADE20K crop, as SegSettings holds it: resize ratio 0.5 to 2.0, cat_max_ratio 0.75
MMSEG_CROP = {
    "ratio": (SegSettings.default_of("ratio_min"), SegSettings.default_of("ratio_max")),
    "cat_max_ratio": SegSettings.default_of("cat_max_ratio"),
}


def test_miou_equals_the_hand_computed_intersections_over_unions():
    # labelled pixels (label, pred): (0,0) (0,1) (1,1) (1,1) (2,0); the pixel labelled 255 is ignored
    # I = [1, 2, 0]; pred area = [2, 3, 0]; label area = [2, 2, 1]; U = [3, 3, 1]
    r = miou(PRED, LABEL, num_classes=3)
    assert r["iou"] == pytest.approx([1 / 3, 2 / 3, 0.0])
    assert r["miou"] == pytest.approx(1 / 3)
    assert r["aacc"] == pytest.approx(3 / 5)
    assert r["macc"] == pytest.approx((1 / 2 + 1 + 0) / 3)
    # a fourth class nobody labels or predicts has no union: left out of mIoU and mAcc, not counted as 0
    r4 = miou(PRED, LABEL, num_classes=4)
    assert math.isnan(r4["iou"][3]) and r4["miou"] == pytest.approx(1 / 3) and r4["macc"] == pytest.approx(0.5)


def test_miou_sums_areas_over_the_split_before_dividing():
    # image 1: class 0 perfect on 1 pixel; image 2: class 0 labelled on 3 pixels, predicted 1 on all of them
    l1, p1 = np.array([[0, 1]]), np.array([[0, 1]])
    l2, p2 = np.array([[0, 0, 0, 1]]), np.array([[1, 1, 1, 1]])
    r = miou([p1, p2], [l1, l2], num_classes=2)
    # summed: I = [1, 2]; pred = [1, 5]; label = [4, 2]; U = [4, 5]
    assert r["iou"] == pytest.approx([1 / 4, 2 / 5]) and r["miou"] == pytest.approx((1 / 4 + 2 / 5) / 2)
    per_image = np.mean([miou(p1, l1, 2)["miou"], miou(p2, l2, 2)["miou"]])
    assert abs(per_image - r["miou"]) > 0.1  # averaging per image would be a different number


def test_miou_refuses_labels_and_predictions_out_of_range():
    with pytest.raises(ValueError, match="outside \\[0, 3\\)"):
        miou(np.zeros((2, 2), int), np.array([[0, 7], [1, 255]]), num_classes=3)
    with pytest.raises(ValueError, match="predictions must lie"):
        miou(np.array([[0, 3]]), np.array([[0, 1]]), num_classes=3)
    with pytest.raises(ValueError, match="shape"):
        miou(np.zeros((2, 3), int), np.zeros((3, 2), int), num_classes=3)


def test_ignore_index_inside_the_class_range():
    # ignore_index 0: label 0 pixels are dropped, the others count as themselves
    r = miou(np.array([[1, 2, 2]]), np.array([[0, 2, 1]]), num_classes=3, ignore_index=0)
    assert r["aacc"] == pytest.approx(1 / 2) and r["iou"][2] == pytest.approx(1 / 2) and r["iou"][1] == 0.0


def test_metric_agrees_with_mmsegmentation_ioumetric():
    """mmsegmentation's IoUMetric gives our mIoU, aAcc and mAcc (the `mmseg` extra, which the dev extra installs:
    missing, this fails rather than skips, so that the claim in docs/segmentation.md is checked on every run)."""
    try:
        import mmseg.evaluation.metrics as mmseg
    except ImportError as e:
        pytest.fail(f"mmsegmentation is missing ({e}): pip install -e '.[dev]'")
    rng = np.random.default_rng(0)
    metric, iou = SegMetric(150), mmseg.IoUMetric(iou_metrics=["mIoU"])
    areas, samples = [], []
    for _ in range(6):
        label = rng.integers(0, 150, (37, 53))
        label[rng.random(label.shape) < 0.2] = 255
        pred = np.where(
            rng.random(label.shape) < 0.5, np.where(label == 255, 0, label), rng.integers(0, 150, label.shape)
        )
        pred[:5] = rng.integers(0, 10, (5, 53))  # some classes predicted where they are not labelled
        metric.update(pred, label)
        p, lab = torch.from_numpy(pred), torch.from_numpy(label)
        areas.append(iou.intersect_and_union(p, lab, 150, 255))
        samples.append({"pred_sem_seg": {"data": p[None]}, "gt_sem_seg": {"data": lab[None]}})
    totals = [sum(a[i] for a in areas) for i in range(4)]
    ref = iou.total_area_to_metrics(*totals, ["mIoU"])
    ours = metric.compute()
    assert ours["aacc"] == pytest.approx(float(ref["aAcc"]), abs=1e-6)
    assert ours["miou"] == pytest.approx(float(np.nanmean(ref["IoU"])), abs=1e-6)
    assert ours["macc"] == pytest.approx(float(np.nanmean(ref["Acc"])), abs=1e-6)
    # and the metric's own process/compute_metrics path (it rounds to 2 decimals of a percent)
    iou.dataset_meta = {"classes": [str(i) for i in range(150)]}
    iou.process({}, samples)
    summary = iou.compute_metrics(iou.results)
    assert summary["mIoU"] == pytest.approx(100 * ours["miou"], abs=0.006)
    assert summary["aAcc"] == pytest.approx(100 * ours["aacc"], abs=0.006)


# --- model and loss -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["mu4", "mu4_dpn", "mu4_dtn"])
@pytest.mark.parametrize("where", ["prenorm", "norm"])
def test_linear_decoder_maps_patch_tokens_to_upsampled_logits(name, where):
    from conftest import randomize_
    from einops import rearrange

    from transferbench.backbones import create_backbone

    bb = create_backbone(name, img_size=(32, 48))
    model = randomize_(LinearSegmenter(bb, 7, tokens=where))
    x = torch.randn(2, 3, 32, 48)
    out = model(x)
    assert out.shape == (2, 7, 32, 48)
    tokens = bb.forward_features(x)[:, 1:]  # after the final norm, cls token dropped
    if where == "prenorm":  # the last block's output: the final norm undone from its own statistics
        *_, last = bb._run_blocks(bb._embed(x))
        tokens = last[:, 1:]
    grid = rearrange(tokens @ model.head.weight.T + model.head.bias, "b (h w) k -> b k h w", h=8, w=12)
    assert torch.allclose(out, F.interpolate(grid, size=(32, 48), mode="bilinear", align_corners=False), atol=1e-5)


def test_decoder_on_a_checkpoint_at_another_resolution_gets_the_crops_grid(suite_home):
    from transferbench.adapters.pretrain import pretrained_checkpoint
    from transferbench.backbones import create_backbone

    bb = create_backbone(
        "mu4_dtn", img_size=32, checkpoint=pretrained_checkpoint("mu4_dtn", "embedded")
    )  # made at 16 px
    assert bb.grid_size == (8, 8) and bb.pos_embed.shape[1] == 1 + 64
    assert all(n.grid == (8, 8) for n in bb.dtn_norms)
    out = LinearSegmenter(bb, 4)(torch.randn(1, 3, 32, 32))
    assert out.shape == (1, 4, 32, 32) and torch.isfinite(out).all()


def test_loss_ignores_label_255():
    logits = torch.randn(2, 3, 4, 5, requires_grad=True)
    target = torch.randint(0, 3, (2, 4, 5))
    target[0, :2] = 255
    loss = segmentation_loss(logits, target)
    valid = target != 255
    logp = logits.log_softmax(1).permute(0, 2, 3, 1)[valid]
    assert loss.item() == pytest.approx(-logp.gather(1, target[valid][:, None]).mean().item(), rel=1e-6)
    loss.backward()
    assert logits.grad[0, :, :2].abs().sum() == 0 and logits.grad[1].abs().sum() > 0
    none = segmentation_loss(logits, torch.full((2, 4, 5), 255))
    assert none.item() == 0.0  # a crop with no labelled pixel adds nothing (not NaN)


# --- transforms ---------------------------------------------------------------------------------------------

PALETTE = np.array([[230, 20, 20], [20, 230, 20], [20, 20, 230], [230, 230, 20]], np.uint8)


def _block_scene(seed=0, h=40, w=56):
    """An image whose mask can be read back from its pixels: 8 x 8 blocks of 4 distinct colours."""
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 4, (h // 8, w // 8))
    mask = np.kron(blocks, np.ones((8, 8), int)).astype(np.uint8)
    return Image.fromarray(PALETTE[mask]), mask


def test_mask_stays_aligned_with_its_image_under_the_random_transforms():
    image, mask = _block_scene()
    tf = train_transform(32, photometric=False, **MMSEG_CROP)
    palette = torch.from_numpy(PALETTE.astype(np.float32) / 127.5 - 1)
    agree, padded = [], 0
    for seed in range(40):
        torch.manual_seed(seed)
        x, m = tf(image, mask)
        assert x.shape == (3, 32, 32) and m.shape == (32, 32) and m.dtype == torch.int64
        pad = m == 255
        padded += int(pad.sum())
        assert torch.all(x[:, pad] == -1)  # padding: black image, ignored mask
        dist = ((x.permute(1, 2, 0)[..., None, :] - palette) ** 2).sum(-1)  # (32, 32, 4)
        nearest, gap = dist.argmin(-1), dist.min(-1).values
        pure = (~pad) & (gap < 1e-3)  # pixels away from block borders (bilinear blends them)
        agree.append(float((nearest[pure] == m[pure]).float().mean()))
    assert padded > 0  # ratios below 1 were drawn and padded
    assert min(agree) == 1.0


def test_photometric_distortion_changes_the_image_not_the_mask():
    image, mask = _block_scene(1)
    plain = train_transform(32, photometric=False, **MMSEG_CROP)
    distorted = train_transform(32, photometric=True, **MMSEG_CROP)
    changed = 0
    for seed in range(10):
        torch.manual_seed(seed)
        x0, m0 = plain(image, mask)
        torch.manual_seed(seed)
        x1, m1 = distorted(image, mask)
        assert torch.equal(m0, m1)
        changed += not torch.allclose(x0, x1)
    assert changed > 0


def test_eval_size_is_mmcvs_rescale():
    assert eval_size(375, 500, 512) == (512, 683)  # factor min(2048/500, 512/375) = 1.3653
    assert eval_size(100, 1000, 512) == (205, 2048)  # long side capped at 4 x 512
    assert eval_size(48, 72, 32) == (32, 48)


# --- fractions ----------------------------------------------------------------------------------------------


def test_fractions_are_nested_and_fixed_by_the_seed():
    fractions = [1 / 16, 1 / 8, 1 / 4, 1 / 2, 1.0]
    for seed in (0, 3):
        subsets = [subset(20210, f, seed) for f in fractions]
        assert [len(s) for s in subsets] == [1263, 2526, 5053, 10105, 20210]  # round half up of f * 20210
        for small, big in zip(subsets, subsets[1:]):
            assert set(small) <= set(big)
        assert np.array_equal(subsets[0], subset(20210, 1 / 16, seed))
    assert not np.array_equal(subset(20210, 1 / 16, 0), subset(20210, 1 / 16, 1))
    assert len(subset(10, 0.01, 0)) == 1
    with pytest.raises(ValueError):
        subset(10, 0.0, 0)


# --- sliding windows ----------------------------------------------------------------------------------------


def test_window_grid_is_mmsegs():
    assert window_starts(512, 512, 341) == [0]
    assert window_starts(683, 512, 341) == [0, 171]  # ceil(171 / 341) + 1 windows, the last one ends at the border
    assert window_starts(1000, 512, 341) == [0, 341, 488]
    assert window_starts(300, 512, 341) == [0]


class PerPixel(torch.nn.Module):
    """A model whose output at a pixel depends on that pixel only: any window tiling must equal one pass."""

    def __init__(self, k=5):
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(3, k, 1)

    def forward(self, x):
        return self.conv(x)


@pytest.mark.parametrize("shape", [(40, 70), (32, 32), (20, 50), (75, 33)])
def test_window_averaging_equals_a_full_image_forward(shape):
    model = PerPixel()
    image = torch.randn(3, *shape)
    out = slide_logits(model, image, 5, window=32, stride=21, batch=3)
    assert out.shape == (5, *shape)
    assert torch.allclose(out, model(image[None])[0], atol=1e-5)


def test_window_logits_are_averaged_not_summed():
    class Ones(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.p = torch.nn.Parameter(torch.zeros(1))

        def forward(self, x):
            return torch.ones(x.shape[0], 2, *x.shape[-2:]) + self.p

    out = slide_logits(Ones(), torch.zeros(3, 50, 90), 2, window=32, stride=21)
    assert torch.allclose(out, torch.ones_like(out))


def test_vit_sliding_window_equals_its_forward_when_the_image_is_one_window():
    from conftest import randomize_

    from transferbench.backbones import create_backbone

    model = randomize_(LinearSegmenter(create_backbone("mu4", img_size=32), 3))
    image = torch.randn(3, 32, 32)
    assert torch.allclose(slide_logits(model, image, 3, window=32, stride=21), model(image[None])[0], atol=1e-5)


# --- readers ------------------------------------------------------------------------------------------------


def _write_ade(root, split, n=3):
    rng = np.random.default_rng(0)
    (root / "images" / split).mkdir(parents=True)
    (root / "annotations" / split).mkdir(parents=True)
    for i in range(n):
        Image.fromarray(rng.integers(0, 255, (20, 30, 3), dtype=np.uint8)).save(
            root / "images" / split / f"ADE_{i}.jpg"
        )
        ann = rng.integers(0, 151, (20, 30)).astype(np.uint8)
        ann[0, :3] = [0, 1, 150]
        Image.fromarray(ann).save(root / "annotations" / split / f"ADE_{i}.png")


def test_ade_folder_layout_reduces_the_zero_label(tmp_path):
    from transferbench.adapters.seg import SegDatasetEntry, open_split
    from transferbench.data.folder import DataMissingError

    _write_ade(tmp_path / "ADEChallengeData2016", "training")
    _write_ade(tmp_path / "ADEChallengeData2016", "validation", n=2)
    ds = SegDatasetEntry(name="ade20k", source="ade", train="training", test="validation", classes=150).model_dump()
    train = open_split(ds, "training", tmp_path)  # --data-dir may name the parent or the folder itself
    assert len(train) == 3 and len(open_split(ds, "validation", tmp_path / "ADEChallengeData2016")) == 2
    image, mask = train[0]
    raw = np.asarray(Image.open(tmp_path / "ADEChallengeData2016/annotations/training/ADE_0.png"))
    assert image.size == (30, 20) and mask.dtype == np.uint8
    assert list(mask[0, :3]) == [255, 0, 149]
    assert np.array_equal(mask[raw > 0], raw[raw > 0] - 1) and np.all(mask[raw == 0] == 255)
    (tmp_path / "ADEChallengeData2016/annotations/validation/ADE_1.png").unlink()
    with pytest.raises(DataMissingError, match="ADE_1.png"):
        open_split(ds, "validation", tmp_path)


def test_tfds_scene_parse150_reads_the_red_channel(tmp_path):
    import tensorflow_datasets as tfds

    from transferbench.data.segmentation import TfdsSegmentation

    with tfds.testing.mock_data(num_examples=4):
        ds = TfdsSegmentation("scene_parse150", "train", num_classes=100)
        image, mask = ds[1]
        raw = np.asarray(ds.base.example(1)["annotation"])
    # (mock data draws the image's and the annotation's shapes independently; real ones share theirs)
    assert image.mode == "RGB" and raw.ndim == 3 and mask.shape == raw.shape[:2]
    r = raw[..., 0].astype(np.uint8)
    assert np.array_equal(mask, (r - np.uint8(1)).astype(np.uint8))


def test_embedded_scenes_masks_follow_the_generator(suite_home):
    from transferbench.data import embedded
    from transferbench.data.folder import CorruptDataError
    from transferbench.data.segmentation import SegFolderDataset

    root = embedded.ensure(["scenes"])
    train = SegFolderDataset(root, "scenes", "training")
    val = SegFolderDataset(root, "scenes", "validation")
    assert (len(train), len(val), train.num_classes) == (512, 128, 13)
    # tfds slicing over the lists, as classification sets take it: a held-out part of training to select on
    held = SegFolderDataset(root, "scenes", "training[384:]+validation[:10]")
    assert held.paths == train.paths[384:] + val.paths[:10] and held.mask_paths[0] == train.mask_paths[384]
    with pytest.raises(UserError, match="outside a split of 512"):
        SegFolderDataset(root, "scenes", "training[:600]")
    raw = np.stack([train.raw_mask(i) for i in range(64)])
    assert set(np.unique(raw)) == set(range(14))  # the boundary and all 13 classes
    # boundaries separate regions: two neighbouring labelled pixels (8-neighbourhood) never differ
    for a, b in (
        (raw[:, :, :-1], raw[:, :, 1:]),
        (raw[:, :-1], raw[:, 1:]),
        (raw[:, :-1, :-1], raw[:, 1:, 1:]),
        (raw[:, :-1, 1:], raw[:, 1:, :-1]),
    ):
        both = (a > 0) & (b > 0)
        assert np.array_equal(a[both], b[both])
    assert 0.03 < (raw == 0).mean() < 0.25
    image, mask = train[0]
    assert image.shape == (3, 48, 72) and mask.shape == (48, 72) and mask.max() == 255 and mask[mask < 255].max() <= 12
    bad = root / "scenes" / train.mask_paths[5]
    data = bytearray(bad.read_bytes())
    data[-20] ^= 1
    copy = root.parent / "scenes-copy"
    import shutil

    shutil.copytree(root / "scenes", copy / "scenes")
    (copy / "scenes" / train.mask_paths[5]).write_bytes(bytes(data))
    with pytest.raises(CorruptDataError, match="sha256"):
        SegFolderDataset(copy, "scenes", "training")


def test_scene_stuff_comes_from_the_rows_the_upstream_set_leaves_out():
    """Stuff class k is cut from the second column quarter of upstream photograph k, below the top 65% of its
    rows that the upstream set's class for that quarter uses: with photographs that are 200 there and 0 everywhere
    else, every stuff pixel stays at least 200 x 0.8 x 0.8 - 20 = 108 after the colour jitter, and would be at
    most 20 had it come from anywhere else. Signs (classes 9..12) bear glyph classes 0..3 of the upstream set."""
    from transferbench.data import embedded
    from transferbench.data.embedded import scenes

    assert scenes.SCENE_CLASSES[1:9] == (
        "china", "flower", "grace_hopper", "minduka_present_blue_pack", "colorwheel", "retina", "stereo_motorcycle",
        "logo",
    )  # fmt: skip
    assert scenes.STUFF_ROWS == (0.65, 1.0) and embedded.photo_class_region(4 * 3 + 1) == (3, (0.25, 0.5), (0, 0.65))
    fake = np.zeros((200, 320, 3), np.uint8)
    fake[130:, 80:160] = 200
    photos = [np.full((100, 100, 3), 50, np.uint8)]
    glyphs = embedded.upstream.glyph_strokes(embedded.common.N_GLYPHS, 0)[: scenes.N_THINGS]
    rng = np.random.default_rng(0)
    seen = set()
    for _ in range(40):
        image, mask = scenes.render_segmentation_scene(rng, photos, [fake] * scenes.N_STUFF, glyphs)
        stuff = (mask >= 2) & (mask <= 9)
        assert image[stuff].min() >= 108
        seen |= set(np.unique(mask).tolist())
    assert seen == set(range(14))


# --- the task -----------------------------------------------------------------------------------------------


def test_seg_alias_and_report_axis(suite_home, tmp_path):
    from transferbench.adapters import prepare_task, resolve_backbone
    from transferbench.engine.runner import RunOptions, run_task
    from transferbench.records.aggregate import aggregate
    from transferbench.records.store import load_records
    from transferbench.reporting.tables import build_tables

    task = prepare_task("seg", suite="embedded", seeds=[0], sets=["fraction=0.0625,1.0", "steps=2"])
    assert task.name == "ade20k" and task.spec.metric == "miou"
    s = run_task(task, [resolve_backbone("mu4")], tmp_path, RunOptions(show_progress=False))
    assert (s.ok, s.failed) == (2, 0), s.failures
    recs = {r["hparams"]["fraction"]: r for r in load_records([tmp_path])}
    assert recs[0.0625]["info"]["train_examples"] == 32 and recs[1.0]["info"]["train_examples"] == 512
    assert recs[1.0]["info"]["steps"] == 2 and recs[1.0]["hparams"]["lr"] == 1e-3
    test = recs[1.0]["metrics"]["test"]
    ious = [v for v in recs[1.0]["info"]["iou_per_class"] if v is not None]
    assert test["miou"] == pytest.approx(np.mean(ious), abs=1e-3)
    tables = build_tables(aggregate(load_records([tmp_path])))
    assert [t.setting for t in tables] == ["fraction=1.0", "fraction=0.0625"]  # headline (all images) first


def test_missing_ade_stops_before_any_cell_with_one_line(tmp_path, monkeypatch):
    from transferbench.adapters import prepare_task
    from transferbench.engine.compute import CellContext
    from transferbench.errors import UserError

    monkeypatch.chdir(tmp_path)
    task = prepare_task("ade20k")
    with pytest.raises(UserError) as e:
        task.adapter.check_data(task, CellContext("cpu", data_dir=str(tmp_path / "nowhere")))
    msg = str(e.value)
    assert "\n" not in msg and str(tmp_path / "nowhere") in msg and "ADEChallengeData2016" in msg
    assert "scene_parse150" in msg and "--suite embedded" in msg


def test_crop_redraws_where_one_class_dominates_as_mmseg():
    # class 2 fills the left 24 of 64 columns: a 32-wide crop at column c has class 1 on (8 + c) / 32 of it,
    # >= 75% exactly when c >= 16 (17 of the 33 positions); with cat_max_ratio 0.75 those are redrawn
    mask = np.ones((32, 64), np.uint8)
    mask[:, :24] = 2
    image = torch.zeros(3, 32, 64, dtype=torch.uint8)

    def dominated(ratio):
        tf = train_transform(32, ratio=(1.0, 1.0), photometric=False, cat_max_ratio=ratio)  # short side stays 32
        out = []
        for seed in range(200):
            torch.manual_seed(seed)
            _, m = tf(image, mask)
            counts = torch.bincount(m[m != 255])
            out.append(float(counts.max() / counts.sum()) >= 0.75)
        return np.mean(out)

    assert 0.35 < dominated(1.0) < 0.65  # 17/33 of uniform crops
    assert dominated(0.75) < 0.02  # only when all 10 redraws fail: (17/33)^11


@pytest.mark.parametrize("image_hw,out_hw", [((40, 70), (50, 90)), ((32, 53), (32, 53)), ((20, 45), (27, 61))])
def test_separable_window_logits_equal_stitching_then_resizing(image_hw, out_hw):
    """predict's path for a LinearSegmenter (patch-grid logits through one matrix per axis and window) against
    the literal procedure: upsampled window logits averaged where they overlap, then resized."""
    from conftest import randomize_

    from transferbench.adapters.seg import grid_window_logits, interp_matrix
    from transferbench.backbones import create_backbone

    model = randomize_(LinearSegmenter(create_backbone("mu4", img_size=32), 6), scale=0.5)
    images = torch.randn(2, 3, *image_hw)
    fast = grid_window_logits(model, images, 6, window=32, stride=21, out_size=out_hw, batch=3).clone()
    for i in range(2):
        ref = slide_logits(model, images[i], 6, window=32, stride=21)[None]
        ref = F.interpolate(ref, size=out_hw, mode="bilinear", align_corners=False)[0].permute(1, 2, 0)
        assert torch.allclose(fast[i], ref, atol=1e-4, rtol=1e-4)
    # the 1-d maps are torch's bilinear weights: rows sum to 1, and 2 -> 4 gives 0.75 / 0.25 mixes
    m = interp_matrix(2, 4)
    assert torch.allclose(m, torch.tensor([[1.0, 0.0], [0.75, 0.25], [0.25, 0.75], [0.0, 1.0]]))


def test_dry_run_counts_app_g_training_images_for_ade20k():
    """App. G: 128 epochs of 20210 // 16 = 1263 steps of 16 whatever the fraction (`epoch: pool`): 2,586,624 images
    a cell, known before the data is read; a set of unknown size without `steps` has no estimate (0)."""
    from transferbench.adapters import prepare_task
    from transferbench.backbones.weights import resolve_backbone
    from transferbench.cell import make_cell

    task = prepare_task("ade20k")
    ds = next(d for d in task.datasets if d.name == "ade20k")
    counts = {
        hp["fraction"]: task.adapter.training_images(make_cell(task, ds, resolve_backbone("b16"), hp, 0))
        for hp in task.grid()
    }
    assert counts == {f: 128 * 1263 * 16 for f in (0.0625, 0.125, 0.25, 0.5, 1.0)}
    fractions = prepare_task("ade20k", sets=["epoch=fraction"])
    quarter = next(hp for hp in fractions.grid() if hp["fraction"] == 0.25)
    cell = make_cell(fractions, ds, resolve_backbone("b16"), quarter, 0)
    # 0.25 x 20210 = 5052.5, which `subset` rounds half up: 5053 images, ceil(128 x 5053 / 16) = 40424 steps
    assert fractions.adapter.training_images(cell) == 40424 * 16
    scenes = prepare_task("ade20k", suite="embedded")
    cell = make_cell(scenes, scenes.datasets[0], resolve_backbone("mu4"), scenes.grid()[0], 0)
    assert scenes.adapter.training_images(cell) == 0  # 8 epochs of a set whose size the dry run does not read
