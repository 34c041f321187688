"""VTAB task table (tasks/vtab.yaml), label rules at their boundaries, reading through tfds mock data,
and export-vtab into the image-folder format."""

import numpy as np
import pytest
import tensorflow_datasets as tfds
from kit import cli

from transferbench.data import vtab
from transferbench.data.folder import FolderDataset
from transferbench.data.splits import resolve_split
from transferbench.data.tfds_source import TfdsDataset
from transferbench.errors import UserError

GROUPS = {
    "natural": ["caltech101", "cifar100", "dtd", "flowers102", "pets", "sun397", "svhn"],
    "specialized": ["camelyon", "eurosat", "resisc45", "retinopathy"],
    "structured": [
        "clevr_count",
        "clevr_dist",
        "dsprites_loc",
        "dsprites_ori",
        "smallnorb_azi",
        "smallnorb_ele",
        "kitti_dist",
        "dmlab",
    ],
}


def test_nineteen_tasks_in_protocol_groups():
    t = vtab.tasks()
    assert len(t) == 19
    assert {g: [n for n, d in t.items() if d.group == g] for g in GROUPS} == GROUPS
    assert [t[n].classes for n in GROUPS["specialized"]] == [2, 10, 45, 5]


def test_vtab_splits_are_task_adaptations_train800_val200_and_test():
    assert vtab.splits("cifar100") == {
        "train": "train[:800]",
        "val": "train[45000:45200]",
        "trainval": "train[:800]+train[45000:45200]",
        "test": "test",
    }
    assert vtab.splits("smallnorb_azi")["test"] == "test[50%:]"
    ((_, idx),) = resolve_split(vtab.splits("smallnorb_azi")["test"], {"test": 24300})
    assert idx[0] == 12150
    for name in vtab.tasks():  # every val slice is 200 examples and every train slice 800
        s = vtab.splits(name)
        assert s["train"] == "train[:800]" and s["trainval"] == f"{s['train']}+{s['val']}"
    with pytest.raises(UserError, match="unknown VTAB task 'cifar10'; did you mean cifar100"):
        vtab.splits("cifar10")


def clevr(depths):
    return {"objects": {"pixel_coords": np.array([[10.0, 20.0, d] for d in depths])}}


def kitti(types, depths):
    return {"objects": {"type": np.array(types), "location": np.array([[0.0, 1.0, d] for d in depths])}}


def test_label_rules_at_the_boundaries():
    assert vtab.label("clevr_count", clevr([9.0] * 3)) == 0 and vtab.label("clevr_count", clevr([9.0] * 10)) == 7
    assert [vtab.label("clevr_dist", clevr([12.0, d])) for d in (7.9, 8.0, 8.01, 8.5, 9.9, 10.0, 10.5)] == [
        0,
        0,
        1,
        1,
        4,
        4,
        5,
    ]
    # kitti: vehicles are types 0-2 (car, van, truck); the closest vehicle's depth, thresholds -100/8/20/999
    assert vtab.label("kitti_dist", kitti([0, 3], [5.0, 1.0])) == 0  # the pedestrian at 1 m does not count
    assert vtab.label("kitti_dist", kitti([1, 2], [8.0, 30.0])) == 0  # 8 is not above 8
    assert vtab.label("kitti_dist", kitti([1], [8.5])) == 1
    assert vtab.label("kitti_dist", kitti([2], [20.0])) == 1 and vtab.label("kitti_dist", kitti([2], [20.1])) == 2
    assert vtab.label("kitti_dist", kitti([3, 4], [5.0, 6.0])) == 3  # no vehicle: distance 1000
    assert vtab.label("kitti_dist", kitti([], [])) == 3
    assert [vtab.label("dsprites_loc", {"label_x_position": x}) for x in (0, 1, 2, 31)] == [0, 0, 1, 15]
    assert [vtab.label("dsprites_ori", {"label_orientation": o}) for o in (2, 3, 39)] == [0, 1, 15]
    ex = {"label_azimuth": 17, "label_elevation": 8, "label": 3}
    assert (
        vtab.label("smallnorb_azi", ex) == 17 and vtab.label("smallnorb_ele", ex) == 8 and vtab.label("dmlab", ex) == 3
    )


def test_every_task_reads_through_mock_data_without_tensorflow():
    # tfds 4.9 has oxford_iiit_pet only at 4.0.0, not the 3.*.* of task_adaptation; mock KITTI draws
    # object features of unequal lengths (real KITTI never does), so its rule is pinned above instead
    with tfds.testing.mock_data(num_examples=800_000):
        for name, t in vtab.tasks().items():
            if name in ("pets", "kitti_dist"):
                continue
            ds = TfdsDataset(t.tfds, vtab.splits(name)["trainval"], label_fn=vtab.LABEL_RULES[t.label])
            assert len(ds) == 1000
            for i in (0, 799, 800, 999):
                img, y = ds[i]
                assert img.mode == "RGB" and y == vtab.label(name, ds.example(i))
                if t.label in ("label", "dsprites_loc", "dsprites_ori", "smallnorb_azi", "smallnorb_ele"):
                    assert 0 <= y < t.classes  # mock CLEVR scenes hold any number of objects


def test_export_vtab_writes_the_folder_format(tmp_path, capsys):
    with tfds.testing.mock_data(num_examples=70_000):
        assert cli(f"data export-vtab --tasks cifar100,clevr_dist --out {tmp_path} --limit 5 --no-progress") == 0
    ds = FolderDataset(tmp_path, "cifar100", "train800")  # verifies the manifest
    assert len(ds) == 5 and ds.info["num_classes"] == 100 and ds.info["splits"]["val"] == "train[45000:45200]"
    assert np.asarray(ds.image(0)).shape == (32, 32, 3) and all(0 <= y < 100 for y in ds.labels)
    assert len(FolderDataset(tmp_path, "cifar100", "train800val200")) == 10
    assert len(FolderDataset(tmp_path, "cifar100", "test")) == 5
    dist = FolderDataset(tmp_path, "clevr_dist", "test")
    assert dist.info["label_rule"] == "clevr_dist" and all(0 <= y < 6 for y in dist.labels)
    assert cli(f"data export-vtab --tasks cifar10 --out {tmp_path}") == 2
    assert "did you mean cifar100" in capsys.readouterr().err


def test_vtab_runs_end_to_end_on_a_dataset_written_by_tfds_own_writer(tmp_path, monkeypatch):
    """tests/fixtures/tfds holds dtd 3.0.1 as tensorflow-datasets' own writer made it: ArrayRecord files with their
    dataset_info.json and features.json (tests/fixtures/make_tfds_fixture.py, which alone needs TensorFlow). `run vtab
    --data-dir` reads it through tfds.data_source end to end: the record sees VTAB-1k's dtd splits (train[:800],
    validation[:200]) and the fixture's 47 test images, and the reader returns the very images and labels the
    generator wrote (tfds shuffled them on writing: each is found by its file_name)."""
    import importlib.util
    from pathlib import Path

    from kit import tiny_args

    from transferbench.records.store import load_records

    fixtures = Path(__file__).resolve().parent / "fixtures"
    spec = importlib.util.spec_from_file_location("make_tfds_fixture", fixtures / "make_tfds_fixture.py")
    fx = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fx)
    data = fixtures / "tfds"
    monkeypatch.setenv("TRANSFERBENCH_HOME", str(tmp_path / "home"))
    line = f"run vtab --datasets dtd --backbone mu4 {tiny_args('vtab', lr='0.003')} --seeds 0 --data-dir {data} --out"
    assert cli(line, tmp_path / "runs") == 0
    (r,) = load_records([tmp_path / "runs" / "vtab"])
    assert r["status"] == "ok" and r["stage"] == "select" and r["dataset_config"]["tfds"] == "dtd:3.*.*"
    n = fx.SIZES
    assert (r["info"]["train_examples"], r["info"]["val_examples"], r["info"]["test_examples"]) == (
        800,
        200,
        n["test"],
    )
    correct = r["metrics"]["test"]["accuracy"] * n["test"] / 100
    assert correct == pytest.approx(round(correct))  # a count of the 47 test images
    ds = TfdsDataset("dtd", "validation[:200]", data_dir_=str(data))
    raw = tfds.data_source("dtd", split="validation[:200]", data_dir=str(data), download=False)
    for i in (0, 57, 199):
        split, index = raw[i]["file_name"].decode().removesuffix(".png").split("/")
        image, label = ds[i]
        assert np.array_equal(np.asarray(image), fx.image(split, int(index))) and label == fx.label(split, int(index))
