"""Corruption robustness: ImageNet-C's 15 corruptions x 5 severities and mCE as Hendrycks & Dietterich define it
(hendrycks/robustness, docs/robustness.md).

Cells, per dataset and model seed:
    stage 'classifier':  the classifier under test and its clean top-1 error. With a checkpoint whose head has
                         the dataset's classes (an ImageNet-1k fine-tuned file) that head is used as it is;
                         otherwise a head is fine-tuned on the clean training split with the VTAB recipe of the
                         spec (adapters.classify.finetune, the same loop) and stored under
                         $TRANSFERBENCH_HOME/classifiers by the cell's training identity; later cells load it.
    stage 'corruption':  one per corruption, once the classifier cell is finished: top-1 error at severities
                         1-5 (metrics error_1 ... error_5; `error` is their mean).

Corrupted data (`corrupted` in the dataset entry):
    folder    the released ImageNet-C files, <data-dir>/<path>/<corruption>/<severity>/<wnid>/*.JPEG
    tfds      tfds `imagenet2012_corrupted/<corruption>_<severity>` (split validation) through tfds.data_source
    npy       CIFAR-10-C style arrays, <data-dir>/<path>/<corruption>.npy + labels.npy
    generate  the clean test split corrupted here (data.corruptions: imagecorruptions-imaug), for any dataset:
              each image brought to `render` px as ImageNet-C's were made (short side render / crop_pct, centre
              crop), corrupted there, resized to the model's resolution; seeded per image and cached by content.
The clean error of a released set comes from the clean split with the same geometry (resize to
resolution / crop_pct, centre crop); of a generated set, from the rendered clean images themselves, so that
clean and corrupted differ by the corruption alone.

Modules: dataset (the corrupted data's entry), images (clean and corrupted images and their top-1 error),
classifier (the classifier under test and its cache), adapter (the cells). The settings of the classifier under
test are `settings.finetune.CorruptionSettings`; the formulas, CE, mCE and relative mCE, are
`data.imagenet_c.mce` and `relative_mce`.
"""

from ...data.imagenet_c import ALEXNET_CLEAN_ERROR, ALEXNET_ERRORS, CORRUPTIONS, mce, relative_mce
from ...settings.finetune import CorruptionSettings
from .adapter import CorruptionAdapter
from .classifier import classifier, classifier_key, home_dir
from .dataset import TRAIN_KEYS, CorruptionDataset, corruption_list, entry
from .images import generated, open_clean, open_released, rendered, top1_error

__all__ = [
    "ALEXNET_CLEAN_ERROR",
    "ALEXNET_ERRORS",
    "CORRUPTIONS",
    "TRAIN_KEYS",
    "CorruptionAdapter",
    "CorruptionDataset",
    "CorruptionSettings",
    "classifier",
    "classifier_key",
    "corruption_list",
    "entry",
    "generated",
    "home_dir",
    "mce",
    "open_clean",
    "open_released",
    "relative_mce",
    "rendered",
    "top1_error",
]
