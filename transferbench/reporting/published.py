"""Published numbers as data, each with its source: the value a paper prints, where it prints it (paper, table, row,
column), the ± it reports and what that ± is, and the conditions it was measured under (task and protocol, backbone
in this registry's names, pretraining, resolution, the report-axis setting). `transferbench list references [--task
T]` prints them; `reporting.versus` places them beside a run's own numbers where the run matches.

The papers' text reaches us flattened from their PDFs, with most column headers lost: each row's numbers come in the
table's column order, and the text's own statements (its means, gains and counts) pin the order
(`tests/test_published.py`). Carried over:
- Dual PatchNorm, Table 1 left: ImageNet-1k validation accuracy after AugReg pretraining, 5 architectures (the
  `pretrain` task's default; its S/16+ and DeiT rows are other recipes and are left out); Table 1's 384 px
  fine-tune of B/32 and B/16 (the `hires` task's default); Table 1 right: ImageNet 25-shot accuracy after
  ImageNet-21k pretraining for 93k and 930k steps (`fewshot`).
- Table 2 left: ImageNet 25-shot accuracy after JFT-4B pretraining for 220k and 1.1M steps (`fewshot`). Table 2
  right (JFT checkpoints fine-tuned on ImageNet-1k) is left out: the paper gives no recipe for that fine-tune.
- Table 3: VTAB-1k, B/32 and B/16 with and without DPN, 19 data sets, no ±.
- Table 4: LiT zero-shot ImageNet accuracy, B/32 and L/16 image towers pretrained on JFT-4B (`lit`).
- Table 5: ADE20K mean IoU of B/16 at 5 train fractions, over 10 seeds (`ade20k`).
- Dynamic Token Normalization, Table 1: ImageNet-1k top-1 of ViT-T, ViT-S and ViT-B with LN and ViT-S and ViT-B with
  DTN, trained with DeiT's recipe: not this project's `pretrain` protocol, so they are listed and never matched. Its
  ViT-T* (4 heads), ViT-S* and ViT-B* rows are architectures this registry does not name (and the S* and B* LN
  top-1 is lost in the text); they are left out.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..cell import RANDOM_INIT

DPN = "Kumar, Dehghani, Houlsby: Dual PatchNorm, TMLR 2023"
DTN = "Shao et al.: Dynamic Token Normalization Improves Vision Transformers, ICLR 2022"
# the pretraining names the published numbers use; declare a checkpoint's with `--set pretraining=NAME`
# (docs/reproducing.md). The AugReg recipe of DPN §5 / App. C: ImageNet-1k, 93,000 steps of 4,096, 224 px, the
# `pretrain` task's default. §6.1 and §6.3 say only "ImageNet-pretrained" B/16 and B/32 (App. E and G name the
# checkpoints `model_inits`, `dpn_b16`): read as §5's ImageNet-1k models, the ones the paper describes training.
IMAGENET1K_AUGREG = "imagenet1k_augreg_93k"
IMAGENET21K_93K, IMAGENET21K_930K = "imagenet21k_augreg_93k", "imagenet21k_augreg_930k"  # DPN §5, Table 1 right
JFT_220K, JFT_1100K = "jft4b_220k", "jft4b_1.1m"  # DPN §5 (4,096 per step), Tables 2 and 4
PRETRAINING = {
    IMAGENET1K_AUGREG: "ImageNet-1k, AugReg (DPN §5, App. C), 93,000 steps of 4,096 at 224 px",
    IMAGENET21K_93K: "ImageNet-21k, AugReg (DPN §5), 93,000 steps of 4,096",
    IMAGENET21K_930K: "ImageNet-21k, AugReg (DPN §5), 930,000 steps of 4,096",
    JFT_220K: "JFT-4B (DPN §5), 220,000 steps of 4,096, no augmentation or mixup",
    JFT_1100K: "JFT-4B (DPN §5), 1,100,000 steps of 4,096, no augmentation or mixup",
    RANDOM_INIT: "none: the task trains from random initialisation (the pretraining itself)",
}
CI_RUNS = "95% interval over at least 3 independent runs"  # DPN §5, for ImageNet-1k
CI_SEEDS = "95% interval over 3 few-shot seeds of one pretraining run"  # DPN §5, for ImageNet-21k and JFT
UNSTATED = "± as printed; the paper does not say what it is"
DEIT = "DeiT's recipe (DTN's App.), not a suite here"  # a protocol no task runs: its numbers are listed, never matched


@dataclass(frozen=True)
class Published:
    """One number a paper prints, with where and under what it was measured."""

    value: float
    paper: str
    table: str  # "Table 3"
    row: str  # the paper's row label ("B/32", "+ DPN" of B/32)
    column: str  # the paper's column (the data set)
    task: str  # this project's task
    dataset: str  # the task's data set name
    backbone: str  # this registry's name (b32, b32_dpn, ...)
    metric: str  # the task's metric ("accuracy", in percent)
    pretraining: str  # what the backbone was pretrained on, and how long (PRETRAINING)
    resolution: int
    protocol: str = "default"  # the task's suite whose protocol it is; another word: a recipe this project lacks
    axes: tuple = ()  # the report-axis setting it was measured at, as (setting, value) pairs: (("shots", 25),)
    stage: str = ""  # the cells' stage it compares with, where a task has several (hires: "high")
    pm: float | None = None  # the reported ±, where there is one
    pm_kind: str = "none"  # what the ± is (CI_RUNS, CI_SEEDS, UNSTATED), or "none"
    note: str = ""

    def source(self) -> str:
        return f"{self.paper}, {self.table}, row {self.row}, column {self.column}"


def _pairs(text: str) -> list[tuple[float, float | None]]:
    """A flattened row of `mean ± ...` numbers, 'v pm v pm ...', as (value, ±) pairs."""
    v = [float(x) for x in text.split()]
    assert len(v) % 2 == 0, text
    return list(zip(v[::2], v[1::2]))


def _numbers(
    table: str, rows: dict, columns: list, *, paper: str = DPN, pm_kind: str = "none", **conditions
) -> list[Published]:
    """Published numbers of one table: `rows` maps (backbone, the paper's row label, its own conditions as (field,
    value) pairs) to the row's (value, ±) pairs in the paper's column order; `columns` are (where, the paper's
    column), where is this task's data set or (data set, (report axis, value))."""
    out = []
    for (backbone, row, extra), values in rows.items():
        assert len(values) == len(columns), (table, row, len(values))
        for (where, column), (value, pm) in zip(columns, values):
            dataset, axis = (where, None) if isinstance(where, str) else where
            out.append(
                Published(
                    value=value,
                    paper=paper,
                    table=table,
                    row=row,
                    column=column,
                    backbone=backbone,
                    dataset=dataset,
                    axes=(axis,) if axis else (),
                    pm=pm,
                    pm_kind=pm_kind if pm is not None else "none",
                    **{**conditions, **dict(extra)},
                )
            )
    return out


# VTAB-1k's 19 data sets in the order of DPN Table 3's columns, as (this task's name, the paper's column)
VTAB_COLUMNS = (
    ("caltech101", "Caltech101"),
    ("cifar100", "CIFAR-100"),
    ("dtd", "DTD"),
    ("flowers102", "Flowers102"),
    ("pets", "Pets"),
    ("sun397", "Sun397"),
    ("svhn", "SVHN"),
    ("camelyon", "Camelyon"),
    ("eurosat", "EuroSAT"),
    ("resisc45", "Resisc45"),
    ("retinopathy", "Retinopathy"),
    ("clevr_count", "Clevr-Count"),
    ("clevr_dist", "Clevr-Dist"),
    ("dmlab", "DMLab"),
    ("dsprites_loc", "dSpr-Loc"),
    ("dsprites_ori", "dSpr-Ori"),
    ("kitti_dist", "KITTI-Dist"),
    ("smallnorb_azi", "sNORB-Azim"),
    ("smallnorb_ele", "sNORB-Elev"),
)

# DPN Table 3, row by row as the paper prints them: the first block's 11 numbers (natural, specialized), then the
# second block's 8 (structured)
_TABLE3 = {
    ("b32", "B/32"): "87.1 53.7 56.0 83.9 87.2 32.0 76.8 77.9 94.8 78.2 71.2 | 58.3 52.6 39.2 71.3 59.8 73.6 20.7 47.2",
    ("b32_dpn", "+ DPN (B/32)"): "87.7 58.1 60.7 86.4 88.0 35.4 80.3 78.5 95.0 81.6 70.3 | "
    "62.5 55.5 40.7 60.8 61.6 73.4 20.9 34.4",
    ("b16", "B/16"): "86.1 35.5 60.1 90.8 90.9 33.9 76.7 81.3 95.9 81.2 74.7 | 65.2 59.8 39.7 72.1 61.9 81.3 18.9 50.4",
    ("b16_dpn", "+ DPN (B/16)"): "86.6 51.4 63.1 91.3 92.1 32.5 78.3 80.6 95.8 83.5 73.3 | "
    "73.7 48.3 41.0 72.4 63.0 80.6 21.6 36.2",
}


def _table3() -> list[Published]:
    rows = {
        (b, row, ()): [(float(v), None) for v in text.replace("|", " ").split()] for (b, row), text in _TABLE3.items()
    }
    return _numbers("Table 3", rows, list(VTAB_COLUMNS), task="vtab", metric="accuracy", pretraining=IMAGENET1K_AUGREG,
                    resolution=224, note="mean test accuracy over 3 seeds at the learning rate the mean validation "
                    "accuracy selects; no ±")  # fmt: skip


def _rows(lines: str, label: str = "", **extra) -> dict:
    """Rows 'ARCH v ± v ±' of a Base / DPN table (ARCH as the paper prints it: Ti/16, ...), each as two rows of
    ours, the plain backbone's and the DPN one's, with `extra` conditions (pretraining=...)."""
    out = {}
    for line in lines.strip().splitlines():
        arch, text = line.split(maxsplit=1)
        name = arch.lower().replace("/", "")
        base, dpn = _pairs(text)
        out[(name, f"{arch}{label} Base", tuple(extra.items()))] = [base]
        out[(f"{name}_dpn", f"{arch}{label} DPN", tuple(extra.items()))] = [dpn]
    return out


def _dpn_table1() -> list[Published]:
    """Table 1. Left: ImageNet-1k validation accuracy after 93,000 AugReg steps (5 architectures; the S/16+ row of
    extra tuning and the two DeiT rows are left out), and the 384 px fine-tune of B/32 and B/16. Right: ImageNet
    25-shot accuracy after ImageNet-21k pretraining, 93k steps (first five rows) and 930k steps (last five)."""
    imagenet = [("imagenet2012", "ImageNet-1k val")]
    left = _rows(
        "S/32 72.1 0.07 74.0 0.09\nTi/16 72.5 0.07 73.9 0.09\nB/32 74.8 0.06 76.2 0.07\nS/16 78.6 0.32 79.7 0.2\n"
        "B/16 80.4 0.06 81.1 0.09"
    )
    hires = _rows("B/32 79.0 0.00 80.0 0.03\nB/16 82.2 0.03 82.8 0.00", " (384 x 384 fine-tune)")
    short = _rows(
        "Ti/16 52.2 0.07 53.6 0.07\nS/32 54.1 0.03 56.7 0.03\nB/32 60.9 0.03 63.7 0.03\nS/16 64.3 0.15 65.0 0.06\n"
        "B/16 70.8 0.09 72.0 0.03",
        " (93k)",
        pretraining=IMAGENET21K_93K,
    )
    long = _rows(
        "Ti/16 61.0 0.03 61.2 0.03\nS/32 63.8 0.00 65.1 0.12\nB/32 72.8 0.03 73.1 0.07\nS/16 72.5 0.1 72.5 0.1\n"
        "B/16 78.0 0.06 78.4 0.03",
        " (930k)",
        pretraining=IMAGENET21K_930K,
    )
    shots = [(("imagenet2012", ("shots", 25)), "ImageNet 25-shot")]
    return [
        *_numbers("Table 1 left", left, imagenet, task="pretrain", metric="accuracy", pretraining=RANDOM_INIT,
                  resolution=224, pm_kind=CI_RUNS, note="ImageNet-1k validation accuracy after 93,000 AugReg steps"),
        *_numbers("Table 1 left", hires, imagenet, task="hires", metric="accuracy", pretraining=IMAGENET1K_AUGREG,
                  resolution=384, stage="high", pm_kind=CI_RUNS,
                  note="fine-tuned at 384 px for 5,000 steps of 512 (App. D)"),
        *_numbers("Table 1 right", {**short, **long}, shots, task="fewshot",
                  metric="accuracy", resolution=224, pm_kind=CI_SEEDS, note="ImageNet 25-shot linear probe"),
    ]  # fmt: skip


def _dpn_table2() -> list[Published]:
    """Table 2 left: ImageNet 25-shot accuracy after JFT-4B pretraining, 220k steps (first three rows; the caption
    says 200K, §5 and Table 2 right say 220K) and 1.1M steps (last three)."""
    short = _rows("B/32 63.8 0.03 65.2 0.03\nB/16 72.1 0.09 72.4 0.07\nL/16 77.3 0.00 77.9 0.06", " (220k)",
                  pretraining=JFT_220K)  # fmt: skip
    long = _rows("B/32 70.7 0.1 71.1 0.09\nB/16 76.9 0.03 76.6 0.03\nL/16 80.9 0.03 81.4 0.06", " (1.1M)",
                 pretraining=JFT_1100K)  # fmt: skip
    return _numbers("Table 2 left", {**short, **long}, [(("imagenet2012", ("shots", 25)), "ImageNet 25-shot")],
                    task="fewshot", metric="accuracy", resolution=224, pm_kind=CI_SEEDS,
                    note="ImageNet 25-shot linear probe")  # fmt: skip


def _dpn_table4() -> list[Published]:
    """Table 4: LiT zero-shot ImageNet accuracy (55,000 steps of 16,384, §6.2), image towers of JFT-4B."""
    rows = {
        **_rows("B/32 61.9 0.12 63.0 0.09", " 220K", pretraining=JFT_220K),
        **_rows("B/32 67.4 0.07 68.0 0.09", " 1.1M", pretraining=JFT_1100K),
        **_rows("L/16 75.0 0.11 75.4 0.00", " 220K", pretraining=JFT_220K),
        **_rows("L/16 78.7 0.05 78.7 0.1", " 1.1M", pretraining=JFT_1100K),
    }
    return _numbers("Table 4", rows, [("imagenet2012", "Zero-shot ImageNet")], task="lit", metric="accuracy",
                    resolution=224, pm_kind=UNSTATED, note="zero-shot top-1 of the locked image tower")  # fmt: skip


ADE20K_FRACTIONS = ((0.0625, "1/16"), (0.125, "1/8"), (0.25, "1/4"), (0.5, "1/2"), (1.0, "1"))


def _dpn_table5() -> list[Published]:
    """Table 5: ADE20K mean IoU (%) of ImageNet-pretrained B/16 at five train fractions, mean over ten seeds."""
    values = {
        "B/16": "27.3 0.09 32.6 0.09 36.9 0.13 40.8 0.1 45.6 0.08",
        "+DPN": "28.0 0.21 33.7 0.11 38.0 0.11 41.9 0.09 46.1 0.11",
    }
    rows = {("b16", "B/16", ()): _pairs(values["B/16"]), ("b16_dpn", "+DPN", ()): _pairs(values["+DPN"])}
    columns = [(("ade20k", ("fraction", f)), f"Fraction of Train Data {label}") for f, label in ADE20K_FRACTIONS]
    return _numbers("Table 5", rows, columns, task="ade20k", metric="miou", pretraining=IMAGENET1K_AUGREG,
                    resolution=512, pm_kind="± over 10 seeds as printed; the paper does not say what it is",
                    note="mean IoU over 10 seeds, 512 x 512 crops")  # fmt: skip


def _dtn_table1() -> list[Published]:
    """DTN Table 1: ImageNet-1k top-1 (%), DeiT's training recipe (DTN App.: Adam with momentum 0.9 and weight decay
    0.05, batch 1024, lr 5e-4 cosine), which is not a suite of the `pretrain` task: listed, never matched."""
    rows = {
        ("ti16", "ViT-T LN (H 3)", ()): [(72.2, None)],
        ("s16", "ViT-S LN (H 6)", ()): [(79.9, None)],
        ("s16_dtn", "ViT-S DTN (H 6)", ()): [(80.6, None)],
        ("b16", "ViT-B LN (H 12)", ()): [(81.8, None)],
        ("b16_dtn", "ViT-B DTN (H 12)", ()): [(82.3, None)],
    }
    return _numbers("Table 1", rows, [("imagenet2012", "Top-1 (%)")], paper=DTN, task="pretrain", metric="accuracy",
                    pretraining=RANDOM_INIT, resolution=224, protocol=DEIT,
                    note="DeiT's recipe, not this project's pretrain protocol: listed, never matched")  # fmt: skip


PUBLISHED: tuple[Published, ...] = (
    *_dpn_table1(),
    *_dpn_table2(),
    *_table3(),
    *_dpn_table4(),
    *_dpn_table5(),
    *_dtn_table1(),
)


def references(task: str | None = None) -> list[Published]:
    """The published numbers, of `task` alone where given."""
    return [p for p in PUBLISHED if task is None or p.task == task]


def axes_text(axes) -> str:
    return ", ".join(f"{k}={v}" for k, v in axes)


def reference_rows(task: str | None = None) -> tuple[list[str], list[list]]:
    """(headers, rows) of `transferbench list references`: each number with its conditions and source."""
    headers = ["task", "dataset", "setting", "backbone", "pretraining", "px", "protocol", "metric", "value", "±",
               "source"]  # fmt: skip
    rows = [
        [p.task, p.dataset, axes_text(p.axes) or "-", p.backbone, p.pretraining, p.resolution, p.protocol, p.metric,
         f"{p.value:.1f}", f"{p.pm} ({p.pm_kind})" if p.pm is not None else "-", p.source()]
        for p in references(task)
    ]  # fmt: skip
    return headers, rows
