"""The leaderboard's overview, its wins / ties / losses, the sanity table, the formats a paper needs and
per-example samples: hand-made records with hand-computed differences."""

import csv
import io
import json
import math

import kit
import numpy as np
import pytest
import scipy.stats
from kit import cli

from transferbench.cli import main
from transferbench.records.aggregate import aggregate
from transferbench.records.stats import mde_se, paired_bootstrap
from transferbench.records.store import RecordStore, load_records
from transferbench.reporting.formats import render
from transferbench.reporting.leaderboard import overview
from transferbench.reporting.overview import tally, task_order
from transferbench.reporting.tables import build_tables, sanity_table

# seed -> accuracy per (backbone, dataset); lr 0.01 wins validation everywhere (its val is higher)
VALUES = {
    ("mu4@embedded", "a"): [60.0, 61.0, 62.0],
    ("mu4@embedded", "b"): [50.0, 50.0, 50.0],
    ("mu4_dpn@embedded", "a"): [63.0, 64.0, 65.0],
    ("mu4_dpn@embedded", "b"): [45.0, 46.0, 44.0],  # +3, -5
    ("mu4", "a"): [40.0, 45.0, 41.0],
    ("mu4", "b"): [50.0, 52.0, 48.0],
    ("mu4_dpn", "a"): [41.0, 44.0, 44.0],
    ("mu4_dpn", "b"): [52.0, 47.0, 49.0],
}


def record(task, dataset, backbone, seed, value, lr, val, order=0, group=None, **extra):
    metrics = {"val": {"accuracy": val}, "test": {"accuracy": value}}
    env = {"git_sha": "abc", "torch": "2.14.1", "transferbench": "0.1.0"}
    return kit.record(
        task, dataset, backbone, seed, metrics, hparams={"lr": lr, **extra}, select=["lr"], order=order, group=group,
        protocol_version="1", environment=env, finished_at="2026-11-24T00:00:00",
    )  # fmt: skip


def records(task="vtab"):
    out = []
    for (b, ds), vals in VALUES.items():
        for seed, v in enumerate(vals):
            out.append(record(task, ds, b, seed, v, 0.01, 90.0, order=0 if ds == "a" else 1, group="natural"))
            out.append(record(task, ds, b, seed, v - 30, 0.03, 10.0, order=0 if ds == "a" else 1, group="natural"))
    return out


def test_stem_and_sanity_tables_pair_by_weights_source():
    (t,) = build_tables(aggregate(records()))
    assert t.refs == {"mu4_dpn@embedded": "mu4@embedded", "mu4_dpn": "mu4"}
    d = t.rows["mu4_dpn@embedded"]["a"].delta
    assert d.mean == pytest.approx(3.0) and t.rows["mu4_dpn@embedded"]["a"].better
    assert t.rows["mu4_dpn@embedded"]["b"].delta.mean == pytest.approx(-5.0) and t.rows["mu4_dpn@embedded"]["b"].worse
    # random mu4_dpn vs random mu4 on a: differences 1, -1, 3: mean 1, not significant, MDE from s = 2
    v = t.rows["mu4_dpn"]["a"]
    assert v.delta.mean == pytest.approx(1.0) and not (v.better or v.worse) and v.delta.sd == pytest.approx(2.0)
    md = render([t])
    assert "*45.0 ± 2.5*" in md  # significantly worse: italic, not bold
    assert f"n.s. (MDE ±{v.delta.mde:.1f})" in md
    s = sanity_table(t)
    assert s.refs == {"mu4@embedded": "mu4", "mu4_dpn@embedded": "mu4_dpn"} and s.question == "sanity"
    # mu4_dpn@embedded - mu4_dpn on a: 22, 20, 21
    assert s.rows["mu4_dpn@embedded"]["a"].delta.mean == pytest.approx(21.0)


def test_overview_cells_and_wins_ties_losses_by_hand():
    recs = records("vtab") + [dict(r, task="fewshot", key="f" + r["key"]) for r in records("fewshot")]
    lines = "\n".join(overview(recs))
    row = next(x for x in lines.splitlines() if x.startswith("| mu4_dpn@embedded vs mu4@embedded"))
    # the mean over a and b: 54.5 vs 55.5. Welch over the two datasets (each of variance 1 over 3 seeds): se =
    # sqrt(1/3 + 1/3) / 2, df = 4, t = 2.776: ± 1.1. The differences: a 3, 3, 3 (no spread), b -5, -4, -6 (variance
    # 1): se = sqrt(1/3) / 2 on df 2 (only b varies), t = 4.303: ± 1.2, not significant; MDE on n - 1 = 2 df
    mde = mde_se(math.sqrt(1 / 3) / 2, 2)
    assert f"54.5 ± 1.1 (Δ -1.0, n.s. (MDE ±{mde:.1f}))" in row and f"{mde:.1f}" == "1.6"
    # random mu4_dpn vs mu4: per seed (1 + 2)/2, (-1 - 5)/2, (3 + 1)/2 = 1.5, -3, 2: not significant
    row = next(x for x in lines.splitlines() if x.startswith("| mu4_dpn vs mu4 "))
    assert "(Δ +0.2, n.s. (MDE ±" in row
    counts = tally(build_tables(aggregate(recs)))
    c = counts["mu4_dpn@embedded"]
    assert (len(c.wins), len(c.ties), len(c.losses)) == (2, 0, 2)  # a won, b lost, in each of two tasks
    assert any(x.startswith("vtab b -5.0 ±") for x in c.losses)
    assert "- losses of mu4_dpn@embedded: vtab b -5.0 ±" in "\n".join(overview(recs))
    assert (len(counts["mu4_dpn"].wins), len(counts["mu4_dpn"].losses)) == (0, 0)


def test_holm_turns_a_weak_win_into_a_tie():
    recs = records()
    # c: a narrow win (differences 0.65, 1.0, 1.35: p = 0.039); d: a tie (differences 1, -1, 0.5)
    for ds, order, diffs in (("c", 2, [0.65, 1.0, 1.35]), ("d", 3, [1.0, -1.0, 0.5])):
        for seed, x in enumerate(diffs):
            recs += [
                record("vtab", ds, "mu4_dpn@embedded", seed, 70.0 + x, 0.01, 90.0, order=order),
                record("vtab", ds, "mu4@embedded", seed, 70.0, 0.01, 90.0, order=order),
            ]
    p = {
        ds: scipy.stats.ttest_1samp(d, 0).pvalue
        for ds, d in (("b", [-5, -4, -6.0]), ("c", [0.65, 1.0, 1.35]), ("d", [1, -1, 0.5]))
    }
    # Holm over m = 4: a (differences 3, 3, 3: p 0) <= .05/4, b (p .013) <= .05/3, c (p .039) > .05/2: c and d stand
    assert p["b"] < 0.05 / 3 and 0.05 / 2 < p["c"] < 0.05 and p["d"] > 0.05
    tables = build_tables(aggregate(recs))
    plain, corrected = tally(tables)["mu4_dpn@embedded"], tally(tables, correct=True)["mu4_dpn@embedded"]
    assert plain.wins == ["vtab a", "vtab c"] and plain.ties == ["vtab d"]
    assert corrected.wins == ["vtab a"] and corrected.ties == ["vtab c", "vtab d"] and len(corrected.losses) == 1
    assert "Holm–Bonferroni" in "\n".join(overview(recs, correct=True))


def test_formats_a_paper_needs(tmp_path, capsys):
    root = tmp_path / "runs"
    store = RecordStore(root)
    for r in records():
        store.write(r)
    assert main(["report", str(root), "--format", "long", "-o", str(tmp_path / "seeds.csv")]) == 0
    rows = list(csv.DictReader(io.StringIO((tmp_path / "seeds.csv").read_text())))
    # a row per (backbone, dataset, seed) of the final cells, with the learning rate validation chose
    assert len(rows) == 4 * 2 * 3 and {r["selected_lr"] for r in rows} == {"0.01"}
    first = next(r for r in rows if r["backbone"] == "mu4_dpn@embedded" and r["column"] == "b" and r["seed"] == "2")
    assert float(first["value"]) == 44.0
    assert cli(f"report {root} --format json") == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["header"]["tasks"] == ["vtab"] and doc["header"]["git_sha"] == ["abc"]
    assert doc["header"]["references"]["vtab"]["mu4_dpn"] == "mu4" and doc["rows"]
    assert cli(f"report {root} --format latex") == 0
    tex = capsys.readouterr().out
    assert "\\toprule" in tex and "\\bottomrule" in tex and "$\\pm$" in tex
    assert "\\textbf{64.0 $\\pm$ 2.5}" in tex and "\\textit{45.0 $\\pm$ 2.5}" in tex and "mu4\\_dpn" in tex
    assert cli(f"report {root} --overview") == 0
    assert "| backbone" in capsys.readouterr().out
    assert cli(f"report {root} --overview --format csv") == 2


def test_samples_beside_the_record_decide_single_seed_comparisons(tmp_path):
    rng = np.random.default_rng(0)
    a = rng.random(400) < 0.7
    b = a.copy()
    b[:40] = ~b[:40]  # b differs from a on 40 examples
    store = RecordStore(tmp_path)
    for name, hits in (("mu4_dpn@embedded", a), ("mu4@embedded", b)):
        r = record("vtab", "a", name, 0, 100 * hits.mean(), 0.01, 90.0)
        r["samples"] = store.write_samples(r, {"test": hits})
        store.write(r)
    assert sorted(p.name.split(".", 1)[1] for p in (tmp_path / "vtab" / "a").iterdir()) == [
        "json",
        "json",
        "samples.npz",
        "samples.npz",
    ]
    (t,) = build_tables(aggregate(load_records([tmp_path])))
    d = t.rows["mu4_dpn@embedded"]["a"].delta
    assert d.method == "examples" and d.mean == pytest.approx(100 * (a.mean() - b.mean()))
    assert d.p == paired_bootstrap(a, b).p and (d.p < 0.05) == d.excludes_zero
    # a damaged samples file is not trusted: the comparison falls back to the seeds (one seed: no interval)
    victim = next((tmp_path / "vtab" / "a").glob("*.samples.npz"))
    victim.write_bytes(victim.read_bytes()[:-10])
    (t,) = build_tables(aggregate(load_records([tmp_path])))
    assert t.rows["mu4_dpn@embedded"]["a"].delta.method == "seeds"


def test_tasks_in_the_papers_order():
    assert task_order(["diagnose", "hires", "ade20k", "vtab", "zzz", "fewshot", "lit", "imagenet_c"]) == [
        "vtab",
        "fewshot",
        "lit",
        "ade20k",
        "imagenet_c",
        "hires",
        "zzz",
        "diagnose",
    ]


def test_sanity_targets_read_the_sanity_tables_gains_and_name_every_worse_set():
    """The targets table over hand-made records: `records()` as vtab, with a target on its overall mean and one on
    dataset a. mu4@embedded - mu4: a 20, 16, 21 (mean 19), b 0, -2, 2 (mean 0), suite mean 9.5; mu4_dpn@embedded -
    mu4_dpn: a 22, 20, 21 (21), b -7, -1, -5 (-13/3, every difference below 0: significantly worse, t on 2 df)."""
    from transferbench.reporting.leaderboard import task_tables
    from transferbench.reporting.targets import Target, sanity_targets, targets_markdown

    targets = (Target("mean", "vtab", "", "mean", 9.0), Target("a", "vtab", "", "a", 20.0))
    checks, worse = sanity_targets(task_tables(records()), targets)
    by = {(c.measure, c.backbone): c for c in checks}
    assert by[("mean", "mu4@embedded")].gain == pytest.approx(9.5) and by[("mean", "mu4@embedded")].ok
    assert by[("mean", "mu4_dpn@embedded")].gain == pytest.approx((21 - 13 / 3) / 2)  # 8.33 < 9
    assert not by[("mean", "mu4_dpn@embedded")].ok
    assert by[("a", "mu4@embedded")].gain == pytest.approx(19.0) and not by[("a", "mu4@embedded")].ok
    assert by[("a", "mu4_dpn@embedded")].gain == pytest.approx(21.0) and by[("a", "mu4_dpn@embedded")].ok
    assert by[("a", "mu4_dpn@embedded")].reference == "mu4_dpn"
    # b of mu4_dpn@embedded: -7, -1, -5: sd 3.06, half-width 4.303 * 3.06 / sqrt 3 = 7.6 > 4.33, so not significant;
    # no set is worse, and a missing task fails its target rather than passing it
    assert worse == []
    checks, _ = sanity_targets(task_tables(records()), (Target("LiT", "lit", "", "zeroshot", 10.0),))
    assert [c.gain for c in checks] == [None, None] and not any(c.ok for c in checks)
    md = targets_markdown(sanity_targets(task_tables(records()), targets)[0])
    assert "| mean | ≥ +9 | +9.5 ± " in md and "no records ✗" not in md
    # a set significantly worse: b of mu4@embedded lowered by 10 on every seed
    lowered = [
        dict(r, metrics={k: {"accuracy": m["accuracy"] - 10} for k, m in r["metrics"].items()})
        if r["backbone"] == "mu4@embedded" and r["dataset"] == "b"
        else r
        for r in records()
    ]
    _, worse = sanity_targets(task_tables(lowered), targets)
    assert [(w.backbone, w.column, round(w.gain, 3)) for w in worse] == [("mu4@embedded", "b", -10.0)]
