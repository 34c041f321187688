import numpy as np
import pytest
import torch
from PIL import Image

from transferbench.data import embedded
from transferbench.data.folder import CorruptDataError, DataMissingError, FolderDataset, write_folder_dataset
from transferbench.data.labels import (
    CLEVR_DIST_THRESHOLDS,
    binned,
    clevr_count_label,
    clevr_dist_label,
    threshold_class,
)
from transferbench.data.transforms import eval_transform, train_transform


def tiny(root):
    img = lambda v: np.full((4, 4), v, np.uint8)  # noqa: E731
    return write_folder_dataset(
        root,
        "tiny",
        {"train800": [(img(0), 0), (img(255), 1)], "val200": [(img(9), 1)], "test": [(img(99), 0)]},
        {"num_classes": 2},
    )


def test_folder_round_trip_and_lists(tmp_path):
    tiny(tmp_path)
    ds = FolderDataset(tmp_path, "tiny", "train800val200")
    assert len(ds) == 3 and ds.labels.tolist() == [0, 1, 1] and ds.num_classes == 2
    img, label = ds[1]
    assert img.mode == "RGB" and np.asarray(img)[0, 0].tolist() == [255, 255, 255] and label == 1
    lines = (tmp_path / "tiny" / "train800.txt").read_text().splitlines()
    assert lines == ["images/train800/00000.png 0", "images/train800/00001.png 1"]
    # tfds slicing over the lists: the second training image, then the test image
    sliced = FolderDataset(tmp_path, "tiny", "train800[1:]+test")
    assert sliced.paths == ["images/train800/00001.png", "images/test/00000.png"] and sliced.labels.tolist() == [1, 0]


def test_png_round_trip_is_lossless(tmp_path):
    rng = np.random.default_rng(0)
    rgb, gray = rng.integers(0, 256, (17, 23, 3), dtype=np.uint8), rng.integers(0, 256, (9, 9), dtype=np.uint8)
    write_folder_dataset(tmp_path, "noise", {"train800": [(rgb, 3)], "val200": [(gray, 1)], "test": []}, {})
    assert np.array_equal(np.asarray(FolderDataset(tmp_path, "noise", "train800").image(0)), rgb)
    assert np.array_equal(np.asarray(FolderDataset(tmp_path, "noise", "val200").image(0))[..., 1], gray)


def test_a_changed_byte_fails_with_the_file_named(tmp_path):
    tiny(tmp_path)
    png = tmp_path / "tiny" / "images" / "test" / "00000.png"
    data = bytearray(png.read_bytes())
    data[-5] ^= 0xFF
    png.write_bytes(bytes(data))
    FolderDataset(tmp_path, "tiny", "train800")  # other splits still verify
    with pytest.raises(CorruptDataError, match=r"images/test/00000.png does not match its sha256"):
        FolderDataset(tmp_path, "tiny", "test")
    (tmp_path / "tiny" / "val200.txt").write_text("images/test/00000.png 1\n")  # an edited split list
    with pytest.raises(CorruptDataError, match=r"val200.txt does not match its sha256"):
        FolderDataset(tmp_path, "tiny", "val200")


def test_missing_dataset_is_one_line_with_where_and_how(tmp_path):
    with pytest.raises(DataMissingError) as e:
        FolderDataset(tmp_path, "cifar100", "test", prepare_hint="transferbench data export-vtab --out X")
    msg = str(e.value)
    assert "\n" not in msg and str(tmp_path / "cifar100") in msg and "export-vtab" in msg


def test_label_rules_at_the_boundaries():
    # dSprites: 32 x positions and 40 orientations into 16 bins, floor(value / (n / 16))
    assert [binned(v, 32) for v in (0, 1, 2, 3, 30, 31)] == [0, 0, 1, 1, 15, 15]
    assert [binned(v, 40) for v in (0, 2, 3, 5, 37, 39)] == [0, 0, 1, 2, 14, 15]
    # CLEVR distance: the largest i with threshold[i] < d
    assert [clevr_dist_label([d, 50.0]) for d in (7.2, 8.0, 8.0001, 9.5, 9.75, 10.0, 10.01, 99.0)] == [
        0,
        0,
        1,
        3,
        4,
        4,
        5,
        5,
    ]
    assert (
        threshold_class(20.0, (-100.0, 8.0, 20.0, 999.0)) == 1
        and threshold_class(20.5, (-100.0, 8.0, 20.0, 999.0)) == 2
    )
    assert clevr_count_label(3) == 0 and clevr_count_label(10) == 7


def test_clevr_scenes_follow_their_labels():
    rng = np.random.default_rng(0)
    labels = []
    for _ in range(600):
        objs, n, z_min = embedded.sample_scene(rng)
        assert 3 <= n <= 10 and len(objs) == n and min(o[1] for o in objs) == z_min
        labels.append(clevr_dist_label([o[1] for o in objs]))
    counts = np.bincount(labels, minlength=6)
    assert len(CLEVR_DIST_THRESHOLDS) - 1 == 6 and counts.min() > 60  # class-balanced by construction


def test_sprites_render_where_the_latents_say():
    a = embedded.render_sprite(0, 1.0, 0.0, 0, 16)
    b = embedded.render_sprite(0, 1.0, 0.0, 31, 16)
    xa, xb = np.nonzero(a)[1].mean(), np.nonzero(b)[1].mean()
    assert xa < 20 < 44 < xb  # x position 0 is on the left, 31 on the right
    assert np.array_equal(embedded.render_sprite(1, 1.0, np.pi, 10, 10), embedded.render_sprite(1, 1.0, 0.0, 10, 10))


def test_generation_is_deterministic(tmp_path, monkeypatch):
    manifests = []
    for home, seed in ((tmp_path / "a", 0), (tmp_path / "b", 0), (tmp_path / "c", 1)):
        monkeypatch.setenv("TRANSFERBENCH_HOME", str(home))
        root = embedded.ensure(["digits", "dsprites_loc"], seed=seed)
        manifests.append([(root / n / "MANIFEST.sha256").read_bytes() for n in ("digits", "dsprites_loc")])
    assert manifests[0] == manifests[1]  # every file's sha256 equal: byte-identical
    assert manifests[0][0] != manifests[2][0] and manifests[0][1] != manifests[2][1]


def test_two_callers_ensuring_the_suite_split_the_generators_and_run_each_once(tmp_path, monkeypatch):
    """`embedded.ensure` locks per generator, not the whole suite: two callers from opposite ends of the list
    (the test workers' start-up) each make some sets, no generator runs twice, and a set that one is making the
    other waits for and then finds made (both dsprites sets come from one run, as both CLEVR sets do)."""
    import json
    import threading
    import time

    from transferbench.data.embedded import common

    monkeypatch.setenv("TRANSFERBENCH_HOME", str(tmp_path))
    makes = {}  # generator name -> the sets one run of it writes
    for name, gen in embedded._GENERATORS.items():
        makes.setdefault(gen.__name__, []).append(name)
    assert makes["gen_dsprites"] == ["dsprites_loc", "dsprites_ori"] and makes["gen_clevr"] == [
        "clevr_count",
        "clevr_dist",
    ]
    runs = []

    def fake(gen_name):
        def run(root, seed):
            runs.append((gen_name, threading.current_thread().name))
            time.sleep(0.05)
            for n in makes[gen_name]:
                (root / n).mkdir(parents=True, exist_ok=True)
                info = {"generator_version": common.VERSIONS[n], "seed": seed, "code": common.generator_code(n)}
                (root / n / "info.json").write_text(json.dumps(info))

        run.__name__ = gen_name  # the lock is the generator's
        return run

    monkeypatch.setattr(embedded, "_GENERATORS", {n: fake(g.__name__) for n, g in embedded._GENERATORS.items()})
    threads = [
        threading.Thread(target=embedded.ensure, args=(order,), name=who)
        for order, who in ((embedded.NAMES, "forward"), (embedded.NAMES[::-1], "backward"))
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(g for g, _ in runs) == sorted(makes)  # each generator once
    assert {who for _, who in runs} == {"forward", "backward"}  # both made some
    assert all(json.loads((tmp_path / "embedded" / n / "info.json").read_text())["seed"] == 0 for n in embedded.NAMES)


def test_every_embedded_set_reads_through_the_folder_reader(suite_home):
    root = embedded.embedded_root()
    tf = eval_transform(32)
    for name in embedded.DOWNSTREAM:
        sizes = {
            s: len(FolderDataset(root, name, s, verify=False)) for s in ("train800", "val200", "train800val200", "test")
        }
        assert sizes == {
            "train800": 800,
            "val200": 200,
            "train800val200": 1000,
            "test": 797 if name == "digits" else 1000,
        }
        ds = FolderDataset(root, name, "test", tf)
        assert ds.info["version"] == embedded.version(name)
        assert 0 <= ds.labels.min() and ds.labels.max() < ds.num_classes
        assert len(set(ds.labels.tolist())) == ds.num_classes  # every class occurs
        x, _ = ds[0]
        assert x.shape == (3, 32, 32) and x.dtype == torch.float32 and -1 <= x.min() and x.max() <= 1
    up = FolderDataset(root, "upstream", "train", verify=False)
    assert len(up) == embedded.common.N_UPSTREAM and up.num_classes == embedded.N_UPSTREAM_CLASSES == 32 + 32 + 64 + 16
    images, labels = up.array().astype(np.float64), up.labels
    assert set(labels.tolist()) == set(range(embedded.N_UPSTREAM_CLASSES))
    # glyphs: light strokes on a dark ground (the corners are ground: at most 60 + stroke bleed)
    glyph = images[labels < embedded.common.N_GLYPHS]
    assert np.median(glyph[:, 0, 0].max(-1)) <= 60
    # textures: each image's mean colour lies between its class's two palette colours (+- the 20 of
    # colour jitter and a little noise), so colour identifies a texture class as the generator says
    palettes = embedded.texture_classes(embedded.common.N_TEXTURES, seed=0)
    for k in (0, 1, 2, 3, 17):
        mean_colour = images[labels == embedded.common.N_GLYPHS + k].mean((1, 2))
        lo, hi = palettes[k]["colours"].min(0) - 22, palettes[k]["colours"].max(0) + 22
        assert len(mean_colour) > 60 and ((mean_colour >= lo) & (mean_colour <= hi)).all()
    # photographs: classes 4k..4k+3 come from photograph k's four column quarters, so the grey photographs give
    # grey patches only
    first_photo = embedded.common.N_GLYPHS + embedded.common.N_TEXTURES
    for k, source in enumerate(embedded.common.UPSTREAM_PHOTOS):
        for q in range(embedded.common.N_QUARTERS):
            j = embedded.common.N_QUARTERS * k + q
            assert embedded.photo_class_region(j) == (k, (q / 4, (q + 1) / 4), (0.0, 0.65))
            patches = images[labels == first_photo + j]
            grey = np.abs(patches - patches[..., :1]).max() == 0
            assert grey == (
                source[1] in ("clock", "gravel", "moon", "page", "text", "cell", "topobathy.npz", "microaneurysms")
            ), source
    # positions: over a class's images the ink's centroid lies in the class's cell of the 4 x 4 grid
    first_position = first_photo + embedded.N_PHOTO_CLASSES
    for k in (0, 5, 10, 15):
        ims = images[labels == first_position + k].mean(-1)
        ink = np.clip(ims - np.median(ims, axis=(1, 2), keepdims=True), 0, None)
        v, u = np.mgrid[:32, :32] + 0.5
        centroid = np.array([(ink * u).sum() / ink.sum(), (ink * v).sum() / ink.sum()]) / 32
        assert np.floor(centroid * embedded.POSITION_GRID).tolist() == [k % 4, k // 4]


def test_photo_patches_stay_in_their_strip():
    ramp = np.tile(np.arange(400, dtype=np.float64)[None, :, None] * 255 / 399, (300, 1, 3)).astype(np.uint8)
    rng = np.random.default_rng(0)
    for _ in range(20):  # a patch of the right strip holds only the right strip's columns (values)
        patch = embedded.photo_patch(ramp, rng, x_range=(0.75, 1.0))
        assert patch.shape == (32, 32, 3) and patch.min() >= int(0.75 * 400 * 255 / 399) - 1
    for _ in range(20):  # and a patch of the top 65% of the rows holds none of the rows below (a vertical ramp)
        patch = embedded.photo_patch(ramp.transpose(1, 0, 2), rng, y_range=(0.0, 0.65))
        assert patch.max() <= int(0.65 * 400 * 255 / 399) + 1
    assert embedded.position_centre(0) == (0.125, 0.125) and embedded.position_centre(6) == (0.625, 0.375)


@pytest.mark.parametrize("pixels", ["inception", "imagenet"])
def test_batched_pixel_scaling_is_torchvisions_to_the_bit(pixels):
    """data.pixels.normalise_uint8 (the batched and device-held paths) computes what torchvision's ToDtype(scale=True)
    + Normalize compute per example, bit for bit: x * (1/255), not x / 255, which rounds 43% of the values of a
    random image otherwise."""
    from torchvision.transforms import v2

    from transferbench.data.pixels import normalise_uint8, stats

    x = torch.randint(0, 256, (8, 3, 16, 16), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    mean, std = stats(pixels)
    reference = v2.Compose([v2.ToDtype(torch.float32, scale=True), v2.Normalize(mean, std)])(x)
    assert torch.equal(normalise_uint8(x, pixels), reference)
    assert not torch.equal(x.float().div(255.0), x.float().mul(1.0 / 255.0))  # the two roundings do differ


def test_transforms_map_pixels_to_signed_unit_range():
    white, black = Image.new("RGB", (40, 30), "white"), Image.new("RGB", (40, 30), "black")
    assert torch.equal(eval_transform(16)(white), torch.ones(3, 16, 16))
    assert torch.equal(eval_transform(16)(black), -torch.ones(3, 16, 16))
    # resize-small 256 then centre crop 224 (few-shot): a 512x256 image keeps its middle
    x = np.zeros((256, 512, 3), np.uint8)
    x[:, 256:] = 255
    out = eval_transform(224, resize_small=256)(Image.fromarray(x))
    assert out.shape == (3, 224, 224) and out[0, 0, 0] == -1 and out[0, 0, -1] == 1
    ramp = Image.fromarray(np.tile(np.arange(64, dtype=np.uint8) * 4, (64, 1)))
    flips = {bool(train_transform(32, "flip")(ramp)[0, 0, 0] > 0) for _ in range(40)}
    assert flips == {True, False}  # both the image and its mirror appear
    assert train_transform(32, "crop")(ramp).shape == (3, 32, 32)
    with pytest.raises(ValueError, match="unknown augmentation"):
        train_transform(32, "mixup")


def test_tfds_reader_on_mock_data_without_tensorflow(tmp_path):
    import importlib.util

    import tensorflow_datasets as tfds

    from transferbench.data.tfds_source import TfdsDataset

    assert importlib.util.find_spec("tensorflow") is None
    with tfds.testing.mock_data(num_examples=50000):
        ds = TfdsDataset("cifar100", "train[:800]+train[45000:45200]", eval_transform(32))
        assert len(ds) == 1000 and ds.index[800] == ("train", 45000)
        labels = [ds[i][1] for i in range(0, 1000, 97)]
        assert all(0 <= y < 100 for y in labels) and ds[0][0].shape == (3, 32, 32)
    with tfds.testing.mock_data(num_examples=40):
        ds = TfdsDataset("dsprites", "train[:10]", label_fn=lambda ex: binned(int(ex["label_x_position"]), 32))
        img, y = ds[3]
        assert img.mode == "RGB" and y == binned(int(ds.example(3)["label_x_position"]), 32)
    with pytest.raises(DataMissingError) as e:
        TfdsDataset("cifar100", "test", data_dir_=str(tmp_path / "tfds"))
    assert str(tmp_path / "tfds") in str(e.value) and "download_and_prepare" in str(e.value)
    assert not (tmp_path / "tfds").exists()  # nothing downloaded or created at run time
