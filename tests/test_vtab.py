"""The VTAB adapter: the paper's protocol and `final: retrain` on the embedded sets (tiny profile), what records hold,
same seed -> same metrics, missing data as one line, and reading an export-vtab folder."""

import json
import math

import numpy as np
import pytest
import tensorflow_datasets as tfds
from kit import cli, tiny_args
from sklearn.datasets import load_digits

from transferbench.adapters import prepare_task
from transferbench.adapters.vtab import VtabAdapter, open_split
from transferbench.data import embedded
from transferbench.data.folder import FolderDataset
from transferbench.data.vtab import export_vtab
from transferbench.records.store import load_records

TINY = tiny_args("vtab", lr="0.003,0.3")  # the tests' tiny profile, two learning rates to select from


def test_default_reports_the_test_accuracy_of_the_val_selected_runs(suite_home, tmp_path):
    from transferbench.records.aggregate import aggregate
    from transferbench.records.store import read_samples

    assert (
        cli(f"run vtab --suite embedded --datasets mini_digits --backbone mu4 --log-samples {TINY} --out", tmp_path)
        == 0
    )
    recs = load_records([tmp_path / "vtab"])
    assert len(recs) == 4 and {r["stage"] for r in recs} == {"select"} and all(r["status"] == "ok" for r in recs)
    for r in recs:  # each train800 run measured on val200 and on test
        assert (r["info"]["val_examples"], r["info"]["test_examples"]) == (200, 797)
        for split, n in (("val", 200), ("test", 797)):  # --log-samples: what each accuracy averages, per example
            hits = read_samples(r, split)
            assert hits.shape == (n,) and 100 * hits.mean() == pytest.approx(r["metrics"][split]["accuracy"])
        assert r["hparams"]["loss"] == "softmax" and r["info"]["head"] == "new"  # the embedded profile's
    mean_val = {
        lr: np.mean([r["metrics"]["val"]["accuracy"] for r in recs if r["hparams"]["lr"] == lr]) for lr in (0.003, 0.3)
    }
    best = max(sorted(mean_val), key=lambda lr: mean_val[lr])
    (entry,) = aggregate(recs)
    assert entry.selected == {"lr": best}
    assert entry.per_seed == {r["seed"]: r["metrics"]["test"]["accuracy"] for r in recs if r["hparams"]["lr"] == best}


def test_final_retrain_selects_by_mean_val_then_trains_on_trainval(suite_home, tmp_path):
    line = f"run vtab --suite embedded --datasets mini_digits --backbone mu4 --set final=retrain {TINY} --out"
    assert cli(line, tmp_path) == 0
    recs = load_records([tmp_path / "vtab"])
    n_test = len(FolderDataset(embedded.ensure(["digits"]), "digits", "test"))
    assert n_test == len(load_digits().target) - 800 - 200  # scikit-learn's digits less VTAB-1k's train800 + val200
    select = [r for r in recs if r["stage"] == "select"]
    final = [r for r in recs if r["stage"] == "final"]
    assert len(select) == 4 and len(final) == 2 and all(r["status"] == "ok" for r in recs)
    assert all("test" not in r["metrics"] for r in select)
    mean_val = {
        lr: np.mean([r["metrics"]["val"]["accuracy"] for r in select if r["hparams"]["lr"] == lr])
        for lr in (0.003, 0.3)
    }
    best = max(sorted(mean_val), key=lambda lr: mean_val[lr])
    assert {r["hparams"]["lr"] for r in final} == {best} and sorted(r["seed"] for r in final) == [0, 1]
    for r in recs:  # the record holds what was used: overrides, the protocol's fixed numbers, the data
        hp = r["hparams"]
        assert (hp["steps"], hp["batch"], hp["resolution"], hp["momentum"], hp["clip"]) == (3, 8, 8, 0.9, 1.0)
        assert r["dataset_config"]["set"] == "digits" and r["data_version"] == "digits-v1"
        train_n, eval_n = (1000, n_test) if r["stage"] == "final" else (800, 200)
        assert (r["info"]["train_examples"], r["info"]["eval_examples"]) == (train_n, eval_n)
        acc = r["metrics"]["test" if r["stage"] == "final" else "val"]["accuracy"]
        assert acc * eval_n / 100 == pytest.approx(round(acc * eval_n / 100))  # a count of correct examples

    # same seed -> same metrics (CPU): recompute every cell and compare
    again = tmp_path / "again"
    assert cli(line, again) == 0
    key = lambda r: r["key"]  # noqa: E731
    first = {key(r): r["metrics"] for r in recs}
    assert {key(r): r["metrics"] for r in load_records([again / "vtab"])} == first


@pytest.mark.parametrize("loss, first", [("softmax", math.log(10)), ("sigmoid", 10 * math.log(2))])
def test_the_loss_setting_is_the_loss_the_cell_trains_with(suite_home, tmp_path, loss, first):
    """A new zero-initialised head gives logits of 0 at the first step, so the first step's loss is the hand value of
    the chosen loss over 10 classes: softmax_xent ln 10, big_vision's sigmoid_xent (summed over classes) 10 ln 2."""
    line = f"run vtab --suite embedded --datasets mini_digits --backbone mu4 {tiny_args('vtab', lr='0.003')}"
    line += f" --seeds 0 --set steps=1 --set warmup_steps=1 --set loss={loss} --out"
    assert cli(line, tmp_path) == 0
    (r,) = load_records([tmp_path / "vtab"])
    assert r["hparams"]["loss"] == loss and r["info"]["head"] == "new"
    assert r["info"]["final_loss"] == pytest.approx(first, rel=1e-5)


def test_rerun_skips_finished_cells(suite_home, tmp_path, capsys):
    line = f"run vtab --suite embedded --datasets mini_mnist --backbone mu4 {TINY} --out"
    assert cli(line, tmp_path) == 0
    capsys.readouterr()
    assert cli(line, tmp_path) == 0
    assert "0 ok, 0 diverged, 0 failed, 4 skipped" in capsys.readouterr().err


def test_missing_data_is_one_line_naming_the_directory(tmp_path, capsys):
    assert cli(f"run vtab --backbone b32_dpn --data-dir {tmp_path} --no-progress") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert str(tmp_path) in err and "TFDS_DATA_DIR" in err and "export-vtab" in err and "19 of 19" in err


def test_reads_an_export_vtab_folder(tmp_path):
    with tfds.testing.mock_data(num_examples=50_000):
        export_vtab(tmp_path, ["cifar100"], limit=6)
    ds = VtabAdapter.entry("cifar100", prepare_task("vtab").datasets[1].model_dump())
    train, val = open_split(ds, "train", tmp_path), open_split(ds, "val", tmp_path)
    trainval = open_split(ds, "trainval", tmp_path)
    assert len(trainval) == 12 and list(trainval.labels) == list(train.labels) + list(val.labels)
    assert trainval.array().shape == (12, 32, 32, 3)
    info = json.loads((tmp_path / "cifar100" / "info.json").read_text())
    assert info["splits"]["test"] == "test"
