"""Published numbers as data, each with its source: the value a paper prints, where it prints it (paper, table, row,
column), the ± it reports and what that ± is, and the conditions it was measured under (task and protocol, backbone
in this registry's names, pretraining, resolution). `transferbench list references [--task T]` prints them.

Carried over so far: the Dual PatchNorm paper's Table 3 (VTAB-1k, B/32 and B/16 with and without DPN, 19 data sets).
The paper's text reaches us flattened from its PDF, with most column headers lost: each row's 19 numbers come in the
table's column order, the VTAB-1k order of natural (7), specialized (4), structured (8) data sets, which the
surviving headers ("Retinopathy" closing the first block, "Clevr-Count", "sNORB-Azim", "sNORB-Elev" in the second)
and the text's own counts confirm (`tests/test_published.py`). The paper prints no ± for Table 3: each number is the
mean test accuracy over 3 seeds at the learning rate the mean validation accuracy selects.
"""

from __future__ import annotations

from dataclasses import dataclass

DPN = "Kumar, Dehghani, Houlsby: Dual PatchNorm, TMLR 2023"
# pretraining of the checkpoints behind DPN Table 3: "ImageNet-pretrained B/16 and B/32" (§6.1), the AugReg recipe
# of §5 (ImageNet-1k, 93,000 steps of 4096, 224 px; Appendix C)
IMAGENET1K_AUGREG = "imagenet1k_augreg_93k"


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
    pretraining: str  # what the backbone was pretrained on, and how long
    resolution: int
    protocol: str = "default"  # the task's suite whose protocol it is
    pm: float | None = None  # the reported ±, where there is one
    pm_kind: str = "none"  # "95% interval over seeds", "95% interval over runs", or "none"
    note: str = ""

    def source(self) -> str:
        return f"{self.paper}, {self.table}, row {self.row}, column {self.column}"


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


def _table3() -> tuple[Published, ...]:
    out = []
    for (backbone, row), text in _TABLE3.items():
        values = [float(v) for v in text.replace("|", " ").split()]
        assert len(values) == len(VTAB_COLUMNS), (row, len(values))
        out += [
            Published(
                value=v,
                paper=DPN,
                table="Table 3",
                row=row,
                column=column,
                task="vtab",
                dataset=dataset,
                backbone=backbone,
                metric="accuracy",
                pretraining=IMAGENET1K_AUGREG,
                resolution=224,
                note="mean test accuracy over 3 seeds at the selected learning rate; the paper prints no ±",
            )
            for (dataset, column), v in zip(VTAB_COLUMNS, values)
        ]
    return tuple(out)


PUBLISHED: tuple[Published, ...] = _table3()


def references(task: str | None = None) -> list[Published]:
    """The published numbers, of `task` alone where given."""
    return [p for p in PUBLISHED if task is None or p.task == task]


def reference_rows(task: str | None = None) -> tuple[list[str], list[list]]:
    """(headers, rows) of `transferbench list references`: each number with its conditions and source."""
    headers = ["task", "dataset", "backbone", "pretraining", "px", "metric", "value", "±", "source"]
    rows = [
        [p.task, p.dataset, p.backbone, p.pretraining, p.resolution, p.metric, f"{p.value:.1f}",
         f"{p.pm} ({p.pm_kind})" if p.pm is not None else "-", p.source()]
        for p in references(task)
    ]  # fmt: skip
    return headers, rows
