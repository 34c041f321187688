"""Published numbers as data (transferbench.reporting.published): each has its source and its conditions, and each
table reads as the paper's own text describes it: its flattened text gives each row's numbers in column order, and
the means, gains and counts its text states pin them."""

from __future__ import annotations

from kit import cli

from transferbench.backbones.registry import list_backbones
from transferbench.reporting.published import (
    DEIT,
    DPN,
    DTN,
    IMAGENET1K_AUGREG,
    IMAGENET21K_93K,
    IMAGENET21K_930K,
    JFT_220K,
    JFT_1100K,
    PRETRAINING,
    PUBLISHED,
    VTAB_COLUMNS,
    references,
)
from transferbench.spec import load_task

NATURAL, SPECIALIZED, STRUCTURED = VTAB_COLUMNS[:7], VTAB_COLUMNS[7:11], VTAB_COLUMNS[11:]


def test_every_number_has_its_source_and_conditions():
    assert PUBLISHED
    for p in PUBLISHED:
        assert p.paper and p.table and p.row and p.column, p
        assert p.source() == f"{p.paper}, {p.table}, row {p.row}, column {p.column}"
        assert 0 < p.value <= 100 and p.metric == load_task(p.task).metric  # the task's metric, in percent
        assert (p.pm is None) == (p.pm_kind == "none")
        assert (
            p.pretraining in PRETRAINING
            and p.resolution > 0
            and p.protocol in load_task(p.task).suites
            or (p.paper == DTN and p.protocol == DEIT)
        )
        assert p.backbone in list_backbones()  # a name of this registry
        for setting, value in p.axes:  # a report axis of its task, at a value the default protocol sweeps
            assert value in load_task(p.task).sweep[setting], p
    keys = {(p.task, p.dataset, p.axes, p.backbone, p.pretraining, p.protocol) for p in PUBLISHED}
    assert len(keys) == len(PUBLISHED)


def test_dpn_table3_columns_are_vtab_1ks_19_data_sets_in_the_papers_order():
    task = load_task("vtab")
    default = task.suites["default"].datasets or [d.name for d in task.datasets]
    groups = {d.name: d.group for d in task.datasets}
    assert sorted(name for name, _ in VTAB_COLUMNS) == sorted(default)
    # natural, then specialized, then structured, as VTAB-1k's tables print them
    assert [groups[n] for n, _ in VTAB_COLUMNS] == ["natural"] * 7 + ["specialized"] * 4 + ["structured"] * 8
    # the headers that survive the flattening: Retinopathy closes the first block; Clevr-Count opens the second,
    # sNORB-Azim and sNORB-Elev close it
    assert SPECIALIZED[-1][1] == "Retinopathy" and STRUCTURED[0][1] == "Clevr-Count"
    assert [c for _, c in STRUCTURED[-2:]] == ["sNORB-Azim", "sNORB-Elev"]
    table3 = [p for p in references("vtab") if p.table == "Table 3" and p.paper == DPN]
    assert len(table3) == 4 * 19 and {p.backbone for p in table3} == {"b32", "b32_dpn", "b16", "b16_dpn"}


def _gain(arch: str, columns) -> dict:
    value = {(p.backbone, p.dataset): p.value for p in references("vtab")}
    return {name: round(value[(f"{arch}_dpn", name)] - value[(arch, name)], 1) for name, _ in columns}


def test_dpn_table3_reads_as_the_papers_text_says():
    # §6.1: "On Natural, B/32 and B/16 with DPN significantly outperform the baseline on 7 out of 7 and 6 out of 7
    # datasets respectively. Sun397 is the only dataset where applying DPN performs worse."
    assert all(g > 0 for g in _gain("b32", NATURAL).values())
    b16 = _gain("b16", NATURAL)
    assert [n for n, g in b16.items() if g <= 0] == ["sun397"] and b16["sun397"] == -1.4
    # "On Structured, DPN improves both B/16 and B/32 on 4 out of 8 datasets and remains neutral on 2": the bold marks
    # are lost, so a gain of a point or more stands for an improvement and less than a point either way for neutral
    for arch in ("b32", "b16"):
        gains = _gain(arch, STRUCTURED).values()
        assert sum(g >= 1.0 for g in gains) == 4 and sum(abs(g) < 1.0 for g in gains) == 2, (arch, gains)
    # by hand, two numbers of each row: B/32's first and last, B/16 + DPN's Clevr-Count
    value = {(p.backbone, p.dataset): p.value for p in references("vtab")}
    assert value[("b32", "caltech101")] == 87.1 and value[("b32", "smallnorb_ele")] == 47.2
    assert value[("b16_dpn", "clevr_count")] == 73.7 and value[("b32_dpn", "retinopathy")] == 70.3


def test_list_references_prints_each_number_with_its_source(capsys):
    assert cli("list references --task vtab") == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 + 4 * 19  # header, rule, a row per number (Table 3 alone is of vtab)
    assert any(
        "| b16_dpn " in line and "| 51.4 " in line and "row + DPN (B/16), column CIFAR-100" in line for line in out
    )
    assert cli("list references --task imagenet_c") == 0
    assert "no published numbers carried over for imagenet_c yet" in capsys.readouterr().out
    assert cli("list references --task nope") == 2
    assert capsys.readouterr().err.startswith("transferbench: error: --task 'nope' is not a task")


def _values(table: str, paper: str = DPN, **where) -> dict:
    """(backbone, pretraining) -> value of one table's numbers, filtered by `where` (task=..., stage=...)."""
    return {
        (p.backbone, p.pretraining): p.value
        for p in PUBLISHED
        if p.table == table and p.paper == paper and all(getattr(p, k) == v for k, v in where.items())
    }


def _gains(values: dict, archs, pretraining) -> list[float]:
    return [round(values[(f"{a}_dpn", pretraining)] - values[(a, pretraining)], 1) for a in archs]


FIVE = ("s32", "ti16", "b32", "s16", "b16")  # DPN Table 1 left's five AugReg architectures, in its row order


def test_dpn_table1_left_reads_as_its_text_says():
    v = _values("Table 1 left", task="pretrain")
    gains = dict(zip(FIVE, _gains(v, FIVE, "random-init")))
    # §5.3: "DPN improved the accuracy of B/16, the best ViT model by 0.7 while S/32 obtains the maximum accuracy gain
    # of 1.9"
    assert gains["b16"] == 0.7 and max(v.values()) == v[("b16_dpn", "random-init")] == 81.1
    assert max(gains, key=gains.get) == "s32" and gains["s32"] == 1.9
    # "The average gain across all architecture is 1.4": the five rows give 1.3 (with S/16+, left out, 1.2); the
    # rows are carried as printed and the text's mean is not reproduced (named in the module's docs)
    assert round(sum(gains.values()) / 5, 2) == 1.30
    # the 384 px fine-tune: "Applying DPN improves high-res, finetuned B/16 and B/32 by 0.6 and 1.0"
    hires = _values("Table 1 left", task="hires")
    assert _gains(hires, ("b16", "b32"), IMAGENET1K_AUGREG) == [0.6, 1.0]
    assert {p.stage for p in references("hires")} == {"high"} and {p.resolution for p in references("hires")} == {384}
    # ± : "On ImageNet-1k, we report the 95% confidence interval across at least 3 independent runs"
    assert {p.pm_kind for p in PUBLISHED if p.table == "Table 1 left"} == {
        "95% interval over at least 3 independent runs"
    }


def test_dpn_table1_right_and_table2_left_read_as_their_text_says():
    # §5.3: "DPN improves all architectures trained on ImageNet-21k (Table 1 Right) and JFT (Table 2) on shorter
    # training regimes with average gains of 1.7 and 0.8 respectively"
    i21k = _values("Table 1 right")
    short = _gains(i21k, ("ti16", "s32", "b32", "s16", "b16"), IMAGENET21K_93K)
    assert all(g > 0 for g in short) and round(sum(short) / 5, 1) == 1.7
    jft = _values("Table 2 left")
    assert all(g > 0 for g in _gains(jft, ("b32", "b16", "l16"), JFT_220K))
    assert round(sum(_gains(jft, ("b32", "b16", "l16"), JFT_220K)) / 3, 1) == 0.8
    # "On longer training regimes, DPN improves the accuracy of the best-performing architectures on JFT and
    # ImageNet-21k by 0.5 and 0.4 respectively"
    assert _gains(jft, ("l16",), JFT_1100K) == [0.5] and _gains(i21k, ("b16",), IMAGENET21K_930K) == [0.4]
    assert max(v for (b, p), v in i21k.items() if p == IMAGENET21K_930K) == i21k[("b16_dpn", IMAGENET21K_930K)]
    # "... B/16 with JFT, DPN matches or leads to marginally worse results than the baseline"
    assert _gains(jft, ("b16",), JFT_1100K) == [-0.3]
    for p in references("fewshot"):  # ImageNet 25-shot, "95% confidence interval across 3 random seeds"
        assert p.axes == (("shots", 25),) and p.dataset == "imagenet2012" and p.pm is not None
        assert p.pm_kind == "95% interval over 3 few-shot seeds of one pretraining run"


def test_dpn_tables_4_and_5_read_as_their_text_says():
    lit = _values("Table 4")
    # §6.2: "on B/32, DPN improves over the baselines on both the setups while on L/16 DPN provides improvement when
    # the image encoder is trained with shorter training schedules"
    assert _gains(lit, ("b32",), JFT_220K) == [1.1] and _gains(lit, ("b32",), JFT_1100K) == [0.6]
    assert _gains(lit, ("l16",), JFT_220K) == [0.4] and _gains(lit, ("l16",), JFT_1100K) == [0.0]
    # Table 5: "Applying DPN improves IoU across all settings", at the five train fractions the task sweeps
    ade = {(p.backbone, p.axes): p.value for p in references("ade20k")}
    fractions = [f for f in load_task("ade20k").sweep["fraction"]]
    assert sorted(dict(a)["fraction"] for b, a in ade if b == "b16") == sorted(fractions)
    assert all(ade[("b16_dpn", a)] > ade[("b16", a)] for b, a in ade if b == "b16")
    assert ade[("b16", (("fraction", 1.0),))] == 45.6 and ade[("b16_dpn", (("fraction", 0.0625),))] == 28.0


def test_dtn_table1_reads_as_its_text_says_and_is_never_matched():
    v = {p.backbone: p.value for p in PUBLISHED if p.paper == DTN}
    # §4.1: "DTN outperforms LN by 0.5% top-1 accuracy on ViT-B"
    assert round(v["b16_dtn"] - v["b16"], 1) == 0.5 and v["s16"] == 79.9 and v["ti16"] == 72.2
    assert {p.protocol for p in PUBLISHED if p.paper == DTN} == {DEIT} and DEIT not in load_task("pretrain").suites
    from kit import record

    from transferbench.reporting.versus import compare

    recs = [
        record("pretrain", "imagenet2012", "s16_dtn", s, {"test": {"accuracy": 80.0}}, suite="default",
               pretraining="random-init")
        for s in range(3)
    ]  # fmt: skip
    assert compare("pretrain", recs) == ([], ["s16_dtn: no published number for s16_dtn on imagenet2012"])
