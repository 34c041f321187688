"""Split arithmetic pinned to scenic's absolute VTAB slices (tasks/vtab.yaml): task_adaptation's percent splits,
resolved against the tfds split sizes, must give scenic's absolute indices."""

import numpy as np
import pytest

from transferbench.data.splits import resolve_split, split_size
from transferbench.errors import UserError

# tfds num_examples of the splits involved (tfds catalog)
SIZES = {
    "caltech101": {"train": 3060, "test": 6084},
    "cifar100": {"train": 50000, "test": 10000},
    "oxford_iiit_pet": {"train": 3680, "test": 3669},
    "svhn_cropped": {"train": 73257, "test": 26032},
    "eurosat": {"train": 27000},
    "resisc45": {"train": 31500},
    "clevr": {"train": 70000, "validation": 15000},
    "dsprites": {"train": 737280},
    "smallnorb": {"train": 24300, "test": 24300},
}

# (tfds, task_adaptation's split in percent, first 200 of it or the whole test = the absolute slice in tasks/vtab.yaml)
CASES = [
    ("caltech101", "train[90%:]", "val200", (2754, 2954)),
    ("cifar100", "train[90%:]", "val200", (45000, 45200)),
    ("oxford_iiit_pet", "train[80%:]", "val200", (2944, 3144)),
    ("svhn_cropped", "train[90%:]", "val200", (65931, 66131)),  # 65931.3 rounds down
    ("eurosat", "train[60%:80%]", "val200", (16200, 16400)),
    ("eurosat", "train[80%:]", "test", (21600, 27000)),
    ("resisc45", "train[60%:80%]", "val200", (18900, 19100)),
    ("resisc45", "train[80%:]", "test", (25200, 31500)),
    ("clevr", "train[90%:]", "val200", (63000, 63200)),
    ("dsprites", "train[80%:90%]", "val200", (589824, 590024)),
    ("dsprites", "train[90%:]", "test", (663552, 737280)),
    ("smallnorb", "test[50%:]", "test", (12150, 24300)),
]


@pytest.mark.parametrize("ds,spec,role,absolute", CASES)
def test_percent_splits_give_the_protocols_absolute_indices(ds, spec, role, absolute):
    ((split, idx),) = resolve_split(spec, SIZES[ds])
    if role == "val200":
        idx = idx[:200]
    assert (int(idx[0]), int(idx[-1]) + 1) == absolute and len(idx) == absolute[1] - absolute[0]


def test_train800_plus_val200_concatenates_in_order():
    parts = resolve_split("train[:800]+train[45000:45200]", SIZES["cifar100"])
    assert [s for s, _ in parts] == ["train", "train"]
    idx = np.concatenate([i for _, i in parts])
    assert len(idx) == 1000 and idx[799] == 799 and idx[800] == 45000 and idx[-1] == 45199
    parts = resolve_split("train[:800] + validation[:200]", {"train": 1880, "validation": 1880})
    assert [(s, len(i)) for s, i in parts] == [("train", 800), ("validation", 200)]


def test_whole_split_negative_and_empty_bounds():
    assert split_size("test", SIZES["cifar100"]) == 10000
    ((_, idx),) = resolve_split("train[-10:]", {"train": 100})
    assert idx.tolist() == list(range(90, 100))
    ((_, idx),) = resolve_split("train[:-95]", {"train": 100})
    assert idx.tolist() == list(range(5))
    assert split_size("train[50:40]", {"train": 100}) == 0


def test_an_unknown_out_of_range_or_garbled_split_is_a_user_error():
    with pytest.raises(UserError, match="split 'valid'.*splits: test, train"):
        resolve_split("valid[:200]", {"train": 10, "test": 5})
    with pytest.raises(UserError, match="outside a split of 10 examples"):
        resolve_split("train[:800]", {"train": 10})
    with pytest.raises(UserError, match="cannot parse split"):
        resolve_split("train[:8", {"train": 10})
