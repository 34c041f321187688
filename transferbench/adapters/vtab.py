"""VTAB-1k fine-tuning (DPN §6.1 + App. E; scenic's VTAB config), the 19 tasks of tasks/vtab.yaml and
the embedded mini-suite, with one protocol:

    stage 'select': for each learning rate in the sweep and each seed, fine-tune on train800 and
                    measure val200 accuracy;
    stage 'final':  at the learning rate with the best mean val accuracy, fine-tune on
                    train800 + val200 and measure test accuracy, per seed.

Fine-tuning: a new zero-initialised head, SGD with momentum, no weight decay, gradient clipping,
linear warm-up then cosine to 0, per-task augmentation, images resized to the resolution (position
embeddings are resized to its grid). Every number is a hyper-parameter of the spec, overridable with
`--set`, and the record holds what was used.

Data: tfds datasets through `tfds.data_source` (`--data-dir`, $TFDS_DATA_DIR, ~/tensorflow_datasets),
or a folder written by `transferbench data export-vtab` when `--data-dir` points at one, or the
embedded sets.
"""
from __future__ import annotations

from ..data.transforms import eval_transform
from ..engine.train import BF16_SETTINGS, accuracy
from .base import plan_select_then_final
from .classify import ClassificationAdapter, VtabDataset, config, finetune, open_split


class VtabAdapter(ClassificationAdapter):
    name = "vtab"
    dataset_schema = VtabDataset
    hparam_choices = {"optimizer": ("sgd",), "bf16": BF16_SETTINGS}
    data_name, roles, unit = "VTAB", ("train", "val", "test"), "tasks"

    def plan(self, task, backbone, results):
        return plan_select_then_final(task, backbone, results)

    def run(self, cell, ctx):

        hp, ds = cell.hparams, config(cell.dataset, cell.dataset_config)
        final = cell.stage == "final"
        train = open_split(ds, "trainval" if final else "train", ctx.data_dir)
        evaluate_on = open_split(ds, "test" if final else "val", ctx.data_dir)
        model, info = finetune(cell, train, ds["classes"], ds["augment"], ctx)
        acc = accuracy(model, evaluate_on, eval_transform(hp["resolution"]), ctx.device, info["bf16"],
                       workers=ctx.workers)
        return {("test" if final else "val"): {"accuracy": acc},
                "info": {**info, "eval_examples": len(evaluate_on)}}


