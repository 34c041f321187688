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

from ..data.transforms import eval_transform
from ..engine.evaluate import Evaluation, hits
from ..settings.finetune import VtabSettings
from .base import plan_select_then_final
from .classify import ClassificationAdapter, VtabDataset, finetune, open_split


class VtabAdapter(ClassificationAdapter):
    name = "vtab"
    dataset_schema = VtabDataset
    settings = VtabSettings
    data_name, roles, unit = "VTAB", ("train", "val", "test"), "tasks"

    def plan(self, task, backbone, results):
        cells = plan_select_then_final(task, backbone, results)
        return [c for c in cells if c.stage != "final" or self.settings_of(c).final != "none"]

    def run(self, cell, ctx):

        s, ds = self.settings_of(cell), self.entry(cell.dataset, cell.dataset_config)
        final = cell.stage == "final"
        train = open_split(ds, "trainval" if final else "train", ctx.data_dir)
        roles = ["test"] if final else ["val"] + (["test"] if s.final == "none" else [])
        model, info = finetune(cell, s, train, ds["classes"], ds["augment"], ctx)
        metrics, sizes, samples = {}, {}, {}
        transform = eval_transform(s.resolution, pixels=s.pixels)
        for role in roles:
            data = open_split(ds, role, ctx.data_dir)
            right = hits(model, data, transform, Evaluation.of(ctx, info["bf16"]))
            metrics[role] = {"accuracy": 100.0 * float(right.mean())}
            samples[role] = right
            sizes[f"{role}_examples"] = len(data)
        return {**metrics, "samples": samples, "info": {**info, "eval_examples": sum(sizes.values()), **sizes}}
