"""VTAB-1k fine-tuning (DPN §6.1 + App. E, its printed big_vision config; scenic's VTAB splits), the 19 tasks of
tasks/vtab.yaml and the embedded mini-suite.

Protocol (`final: none`, the default, as the paper reports): for each learning rate in the sweep and each seed,
fine-tune on train800 and measure val200 and test accuracy; the report picks the learning rate with the best mean
val200 accuracy over the seeds and shows the test accuracy of those same runs (DPN §6.1: "the corresponding mean
test score"). `final: retrain` is VPT's and task_adaptation's variant: at the chosen learning rate, fine-tune again
on train800 + val200 (stage 'final') and report that test accuracy; the select runs then measure val200 only.

Fine-tuning (adapters.classify.finetune): sigmoid cross-entropy (big_vision's `sigmoid_xent`; `loss: softmax` is
the option), a new zero-initialised head on the checkpoint's representation layer, SGD with momentum, no weight
decay, gradient clipping, linear warm-up then cosine to 0, per-task augmentation, images resized to the
resolution (position embeddings resampled to its grid as big_vision's `resample_posemb` does). Every number is a
hyper-parameter of the spec, overridable with `--set`, and the record holds what was used.

Data: tfds datasets through `tfds.data_source` (`--data-dir`, $TFDS_DATA_DIR, ~/tensorflow_datasets),
or a folder written by `transferbench data export-vtab` when `--data-dir` points at one, or the
embedded sets.
"""

from __future__ import annotations

from ..data import pixels
from ..data.transforms import eval_transform
from ..engine.train import BF16_SETTINGS, LOSSES, hits
from .base import plan_select_then_final
from .classify import ClassificationAdapter, VtabDataset, config, finetune, open_split

FINALS = ("none", "retrain")  # report the selected train800 runs' test accuracy | retrain on train800 + val200


def reports_select_runs(hp: dict) -> bool:
    """Whether the select runs are the reported ones (the paper's protocol; specs without `final` retrain)."""
    return hp.get("final", "retrain") == "none"


class VtabAdapter(ClassificationAdapter):
    name = "vtab"
    dataset_schema = VtabDataset
    hparam_choices = {"optimizer": ("sgd",), "bf16": BF16_SETTINGS, "loss": tuple(LOSSES), "final": FINALS}
    data_name, roles, unit = "VTAB", ("train", "val", "test"), "tasks"

    def plan(self, task, backbone, results):
        cells = plan_select_then_final(task, backbone, results)
        return [c for c in cells if c.stage != "final" or not reports_select_runs(c.hparams)]

    def run(self, cell, ctx):

        hp, ds = cell.hparams, config(cell.dataset, cell.dataset_config)
        final = cell.stage == "final"
        train = open_split(ds, "trainval" if final else "train", ctx.data_dir)
        roles = ["test"] if final else ["val"] + (["test"] if reports_select_runs(hp) else [])
        model, info = finetune(cell, train, ds["classes"], ds["augment"], ctx)
        metrics, sizes, samples = {}, {}, {}
        transform = eval_transform(hp["resolution"], pixels=pixels.of(hp))
        for role in roles:
            data = open_split(ds, role, ctx.data_dir)
            right = hits(model, data, transform, ctx.device, info["bf16"], workers=ctx.workers)
            metrics[role] = {"accuracy": 100.0 * float(right.mean())}
            samples[role] = right
            sizes[f"{role}_examples"] = len(data)
        return {**metrics, "samples": samples, "info": {**info, "eval_examples": sum(sizes.values()), **sizes}}
