"""Your numbers beside the published ones (transferbench.reporting.versus): synthetic records at the default
protocol show the published row, yours − published and the mark, each computed here by hand; runs that match no
published number (the embedded suite, an unstated or other pretraining, a changed setting) show none and say why
in one line. Declaring a checkpoint's pretraining (`--set pretraining=NAME`) is recorded in the cell."""

from __future__ import annotations

import math

import pytest
from kit import cli, record

from transferbench.reporting.published import IMAGENET1K_AUGREG, IMAGENET21K_93K, JFT_220K, VTAB_COLUMNS, references
from transferbench.reporting.versus import MARK, compare, versus_markdown

T_975_2 = 4.302652729911275  # Student's t, 97.5% quantile, 2 degrees of freedom (3 seeds)


def vtab(backbone, dataset, values, *, pretraining=IMAGENET1K_AUGREG, suite="default", order=0, sets=None):
    """Records of one VTAB result: a seed per value, one learning rate, at `suite`; `pretraining` declared (so
    also a keyed hyper-parameter, as `--set pretraining=` makes it) unless empty; a NAME@FILE backbone's cells name
    a checkpoint."""
    hparams = {"lr": 0.01, **(sets or {}), **({"pretraining": pretraining} if pretraining else {})}
    sources = {k: "--set" for k in (sets or {})} | ({"pretraining": "--set"} if pretraining else {})
    return [
        record("vtab", dataset, backbone, seed, {"test": {"accuracy": float(v)}, "val": {"accuracy": 50.0}},
               hparams=hparams, select=("lr",), suite=suite, pretraining=pretraining, order=order, group="natural",
               sources=sources, checkpoint_sha256="c" * 64 if "@" in backbone else "random-init")
        for seed, v in enumerate(values)
    ]  # fmt: skip


def test_a_default_run_shows_the_published_row_the_difference_and_the_mark_by_hand():
    recs = vtab("b32@a.npz", "caltech101", (86, 87, 88)) + vtab("b32@a.npz", "cifar100", (49, 50, 51), order=1)
    found, reasons = compare("vtab", recs)
    assert reasons == [] and [v.published.column for v in found] == ["Caltech101", "CIFAR-100"]
    half = T_975_2 * 1.0 / math.sqrt(3)  # sd 1 over 3 seeds: 2.484
    caltech, cifar = found
    # DPN Table 3, B/32: Caltech101 87.1 (inside 87.0 ± 2.484), CIFAR-100 53.7 (outside 50.0 ± 2.484; no ± printed)
    assert caltech.published.value == 87.1 and caltech.difference == pytest.approx(-0.1)
    assert caltech.outside is False and 87.0 - half < 87.1 < 87.0 + half
    assert cifar.published.value == 53.7 and cifar.difference == pytest.approx(-3.7)
    assert cifar.outside is True and 50.0 + half < 53.7
    text = "\n".join(versus_markdown("vtab", recs))
    assert "| `b32@a.npz` | imagenet1k_augreg_93k |  | 87.0 ± 2.5 | 50.0 ± 2.5 |" in text
    assert "| published |  | Dual PatchNorm, TMLR 2023, Table 3, row B/32 | 87.1 | 53.7 |" in text
    assert f"| yours − published |  |  | -0.1 | -3.7 {MARK} |" in text


def test_the_papers_own_pm_widens_the_interval():
    """Few-shot ImageNet 25-shot of B/16 after ImageNet-21k (93k steps): 70.8 ± 0.09 (DPN Table 1 right). Yours
    69.51 ± 1.2422 (sd 0.5, 3 seeds) reaches 70.752: below 70.8, within it widened by 0.09 (70.842)."""

    def fewshot(values):
        return [
            record("fewshot", "imagenet2012", "b16@x.npz", seed, {"test": {"accuracy": v}},
                   hparams={"shots": 25, "pretraining": IMAGENET21K_93K}, suite="default",
                   pretraining=IMAGENET21K_93K, sources={"pretraining": "--set"})
            for seed, v in enumerate(values)
        ]  # fmt: skip

    (v,) = compare("fewshot", fewshot((69.01, 69.51, 70.01)))[0]
    high = 69.51 + T_975_2 * 0.5 / math.sqrt(3)
    assert v.published.value == 70.8 and v.published.pm == 0.09 and high < 70.8 < high + 0.09
    assert v.outside is False and v.difference == pytest.approx(69.51 - 70.8)
    (far,) = compare("fewshot", fewshot((68.0, 68.5, 69.0)))[0]  # 68.5 + 1.242 + 0.09 = 69.83 < 70.8
    assert far.outside is True
    # another shot count has no published number: the reason says where it is published
    other = [dict(r, hparams={**r["hparams"], "shots": 10}) for r in fewshot((68.0, 68.5, 69.0))]
    assert compare("fewshot", other) == ([], ["b16@x.npz: published at shots=25 only"])


def test_one_seed_shows_the_difference_and_says_it_has_no_interval():
    (v,) = compare("vtab", vtab("b32@a.npz", "caltech101", (87.6,)))[0]
    assert v.outside is None and v.difference == pytest.approx(0.5)
    assert "+0.5 (one seed: no interval)" in "\n".join(
        versus_markdown("vtab", vtab("b32@a.npz", "caltech101", (87.6,)))
    )


@pytest.mark.parametrize(
    "recs, reason",
    [
        (vtab("mu4@embedded", "mini_digits", (1, 2, 3), suite="embedded", pretraining="pretrain:upstream:4800"),
         "mu4@embedded: suite 'embedded' is not the protocol of the published numbers (default)"),
        (vtab("b32@a.npz", "caltech101", (1, 2, 3), pretraining=""),
         "b32@a.npz: its pretraining is not stated; the published numbers are for imagenet1k_augreg_93k: declare a "
         "checkpoint's with --set pretraining=NAME"),
        (vtab("b32@a.npz", "caltech101", (1, 2, 3), pretraining="jft4b_220k"),
         "b32@a.npz: pretraining jft4b_220k has no published number (published: imagenet1k_augreg_93k)"),
        (vtab("b32@a.npz", "caltech101", (1, 2, 3), sets={"resolution": 384}),
         "b32@a.npz: settings changed from the default protocol: resolution=384"),
        (vtab("b32_dtn@a.npz", "caltech101", (1, 2, 3)),
         "b32_dtn@a.npz: no published number for b32_dtn on caltech101"),
        (vtab("b32", "caltech101", (1, 2, 3), pretraining="random-init"),
         "b32: pretraining random-init has no published number (published: imagenet1k_augreg_93k)"),
    ],
)  # fmt: skip
def test_a_run_that_matches_none_shows_none_and_says_why_in_one_line(recs, reason):
    assert compare("vtab", recs) == ([], [reason])
    text = versus_markdown("vtab", recs)
    assert text[2] == f"None beside these runs: {reason}." and not any(line.startswith("|") for line in text)


def test_the_default_suites_leaderboard_shows_table_3_beside_synthetic_records(tmp_path):
    """Synthetic VTAB-1k records at the default protocol for the four backbones of DPN Table 3, each result the
    published number + 0.5 over seeds of spread 1: every column shows the published row and +0.5, none marked."""
    recs = []
    for arch in ("b32", "b32_dpn", "b16", "b16_dpn"):
        value = {p.dataset: p.value for p in references("vtab") if p.backbone == arch and p.table == "Table 3"}
        for order, (dataset, _) in enumerate(VTAB_COLUMNS):
            recs += vtab(f"{arch}@{arch}.npz", dataset, [value[dataset] + 0.5 + d for d in (-1, 0, 1)], order=order)
    out = tmp_path / "runs" / "vtab"
    out.mkdir(parents=True)
    import json

    for i, r in enumerate(recs):
        (out / f"{i}.json").write_text(json.dumps(r))
    assert cli("leaderboard", tmp_path / "runs", "-o", tmp_path / "LB.md") == 0
    text = (tmp_path / "LB.md").read_text()
    block = text[text.index("#### Against the published numbers") :].split("\n\n####")[0]
    rows = [line for line in block.splitlines() if line.startswith("| published")]
    assert len(rows) == 4 and all(line.count("|") == 4 + 19 for line in rows)
    assert "| published |  | Dual PatchNorm, TMLR 2023, Table 3, row + DPN (B/16) | 86.6 | 51.4 |" in block
    differences = [line for line in block.splitlines() if line.startswith("| yours − published")]
    assert len(differences) == 4 and all(line.count("+0.5") == 19 and MARK not in line for line in differences)


def test_report_shows_them_and_an_embedded_run_shows_none(tmp_path, capsys):
    import json

    folder = tmp_path / "vtab"
    folder.mkdir()
    recs = vtab("b32@a.npz", "caltech101", (86, 87, 88)) + vtab(
        "mu4@embedded", "mini_digits", (1, 2, 3), suite="embedded", pretraining="pretrain:upstream:4800"
    )
    for i, r in enumerate(recs):
        (folder / f"{i}.json").write_text(json.dumps(r))
    assert cli("report", folder) == 0
    out = capsys.readouterr().out
    assert "### Against the published numbers (vtab)" in out and "| yours − published |  |  | -0.1 |" in out
    assert "Not compared: mu4@embedded: suite 'embedded' is not the protocol of the published numbers" in out


def test_declaring_pretraining_is_recorded_in_the_cell(tmp_path):
    from transferbench.adapters import prepare_task
    from transferbench.backbones.checkpoint import save_checkpoint
    from transferbench.backbones.registry import create_backbone
    from transferbench.backbones.weights import resolve_backbone
    from transferbench.cell import make_cell
    from transferbench.errors import UserError

    task = prepare_task("vtab", suite="embedded", sets=["pretraining=imagenet1k_augreg_93k"])
    hp = task.grid()[0]
    # a checkpoint that states nothing: the declaration is recorded, keyed (a hyper-parameter) and sourced
    plain = tmp_path / "plain.safetensors"
    save_checkpoint(create_backbone("mu4", img_size=16), plain)
    cell = make_cell(task, task.datasets[0], resolve_backbone(f"mu4@{plain}"), hp, 0)
    assert cell.pretraining == "imagenet1k_augreg_93k" == cell.to_dict()["pretraining"]
    assert cell.hparams["pretraining"] == "imagenet1k_augreg_93k" and cell.sources["pretraining"] == "--set"
    undeclared = prepare_task("vtab", suite="embedded")
    other = make_cell(undeclared, undeclared.datasets[0], resolve_backbone(f"mu4@{plain}"), undeclared.grid()[0], 0)
    assert other.pretraining == "" and "pretraining" not in other.hparams and other.key != cell.key
    # random init has none, whatever is declared; its key is the undeclared one's
    rnd = make_cell(task, task.datasets[0], resolve_backbone("mu4"), hp, 0)
    bare = make_cell(undeclared, undeclared.datasets[0], resolve_backbone("mu4"), undeclared.grid()[0], 0)
    assert rnd.pretraining == "random-init" and "pretraining" not in rnd.hparams and rnd.key == bare.key
    # a checkpoint of the pretrain task states its own in its header; one written before the header held it claims
    # no protocol, only its data set and steps
    own, old = tmp_path / "own.safetensors", tmp_path / "old.safetensors"
    model = create_backbone("mu4", img_size=16)
    save_checkpoint(model, own, task="pretrain", dataset="imagenet2012", steps=93000, pretraining=IMAGENET1K_AUGREG)
    save_checkpoint(model, old, task="pretrain", dataset="imagenet2012", steps=93000)
    assert resolve_backbone(f"mu4@{own}").pretraining == IMAGENET1K_AUGREG
    assert resolve_backbone(f"mu4@{old}").pretraining == "pretrain:imagenet2012:93000"
    assert resolve_backbone("mu4@embedded").pretraining == "pretrain:upstream:4800"
    with pytest.raises(UserError, match=r"states its pretraining, 'pretrain:upstream:4800', and --set pretrain"):
        make_cell(task, task.datasets[0], resolve_backbone("mu4@embedded"), hp, 0)
    with pytest.raises(UserError, match="pretraining"):
        prepare_task("vtab", suite="embedded", sets=["pretraining=a b"])


def test_high_res_compares_its_high_stage_and_older_records_of_random_init_state_it():
    """DPN Table 1's 384 px fine-tune is the `high` stage's accuracy (B/32 + DPN: 80.0 ± 0.03): the `base` stage's
    records are not compared. A record older than the `pretraining` field that names no checkpoint is random init."""
    recs = []
    for stage, values in (("base", (70.0, 70.5, 71.0)), ("high", (79.5, 80.0, 80.5))):
        recs += [
            record("hires", "imagenet2012", "b32_dpn@a.npz", s, {"test": {"accuracy": v}}, stage=stage,
                   hparams={"resolution": 384, "base_resolution": 224, "pretraining": IMAGENET1K_AUGREG},
                   suite="default", pretraining=IMAGENET1K_AUGREG, report="hires")
            for s, v in enumerate(values)
        ]  # fmt: skip
    (v,) = compare("hires", recs)[0]
    assert v.published.value == 80.0 and v.published.pm == 0.03 and v.entry.estimate.mean == pytest.approx(80.0)
    assert v.outside is False and v.difference == pytest.approx(0.0)
    old = record("pretrain", "imagenet2012", "b16", 0, {"test": {"accuracy": 80.4}}, suite="default")
    del old["pretraining"]
    (mine,) = compare("pretrain", [old])[0]  # Table 1 left, B/16: 80.4 ± 0.06, one seed
    assert mine.entry.pretraining == "random-init" and mine.published.value == 80.4 and mine.outside is None


def test_the_pretrain_task_names_its_default_suite_by_the_published_numbers_name_and_nothing_else():
    from transferbench.adapters import prepare_task
    from transferbench.backbones.weights import resolve_backbone
    from transferbench.cell import make_cell, pretraining_name

    def cell(suite="default", sets=()):
        task = prepare_task("pretrain", suite=suite, sets=list(sets))
        return make_cell(task, task.datasets[0], resolve_backbone("b16"), task.grid()[0], 0)

    assert pretraining_name(cell(), 93000) == IMAGENET1K_AUGREG
    tuned = cell(sets=["lr=0.003"])  # a setting changed: the data set and steps, and the cell's key
    assert pretraining_name(tuned, 93000) == f"pretrain:imagenet2012:93000:{tuned.key[:12]}"
    assert pretraining_name(cell("embedded"), 4800) == "pretrain:upstream:4800"


def test_lits_pairs_say_where_the_data_is_not_a_change_of_protocol():
    """DPN Table 4, B/32 + DPN after JFT 220k: 63.0 ± 0.09. The default suite asks for `--set pairs=`."""
    recs = [
        record("lit", "imagenet2012", "b32_dpn@j.npz", s, {"test": {"accuracy": v}}, group="zeroshot",
               hparams={"pairs": "/data/{0..9}.tar", "pretraining": JFT_220K}, suite="default",
               pretraining=JFT_220K, sources={"pairs": "--set", "pretraining": "--set"}, checkpoint_sha256="c" * 64)
        for s, v in enumerate((62.0, 62.5, 63.0))
    ]  # fmt: skip
    (v,) = compare("lit", recs)[0]
    assert v.published.value == 63.0 and v.published.table == "Table 4" and v.outside is False


def test_no_variation_over_seeds_is_no_interval_and_other_results_say_why_they_are_not_compared():
    """Three equal seeds give an interval of width 0, no evidence of precision: no mark either way. A compared
    backbone's result of another setting says why it is not beside a number (a paper's absent number goes unsaid)."""
    recs = vtab("b32@a.npz", "caltech101", (87.2, 87.2, 87.2)) + vtab(
        "b32@a.npz", "cifar100", (50, 51, 52), order=1, sets={"steps": 100}
    )
    found, reasons = compare("vtab", recs)
    (v,) = found
    assert v.outside is None and v.difference == pytest.approx(0.1)
    assert reasons == ["b32@a.npz: settings changed from the default protocol: steps=100"]
    assert "+0.1 (no variation: no interval)" in "\n".join(versus_markdown("vtab", recs))
