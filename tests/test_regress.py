"""The regression gate (reporting/regress.py) on records whose every value the test chooses: cells match on what
they are, a changed setting is a named protocol change that fails unless accepted, each test is the hand computation
it claims (scipy's paired t, the exact McNemar, Holm, the pooled Welch mean, the F-test of spreads), a broad small
shift is caught by the pooled test alone, a collapsed spread is flagged, and the false-alarm rate of the whole gate
under pure noise stays under alpha by simulation."""

import copy

import numpy as np
import pytest
from scipy import stats

from transferbench.cli import main
from transferbench.records.stats import holm, mcnemar, variance_ratio
from transferbench.records.store import RecordStore, load_records
from transferbench.reporting.regress import ALPHA, gate, verdict, words

ENV = {"device": "cpu: AMD EPYC x2", "torch": "2.14.1", "numpy": "2.4.6", "timm": "1.0.31", "python": "3.11.7"}


def record(task, dataset, backbone, seed, value, *, shots=None, stage="final", split="test", pool="gap", **extra):
    hp = {"l2": 1024.0, "pool": pool, "resolution": 16}
    if shots is not None:
        hp["shots"] = shots
    r = {
        "task": task,
        "dataset": dataset,
        "backbone": backbone,
        "seed": seed,
        "stage": stage,
        "hparams": hp,
        "select": [],
        "status": "ok",
        "metrics": {split: {"accuracy": float(value)}},
        "metric": "accuracy",
        "mode": "max",
        "protocol_version": "2",
        "dataset_config": {"set": dataset},
        "environment": dict(ENV),
        "finished_at": "2026-11-24T00:00:00",
        "suite": "embedded",
    }
    r.update(extra)
    r["key"] = f"{task}-{dataset}-{backbone}-{seed}-{shots}-{stage}"
    return r


def suite(values, backbones=("a", "b"), datasets=("d1", "d2", "d3", "d4"), shots=(1, 5), seeds=(0, 1, 2)):
    """Records of a few-shot-like suite: values(backbone, dataset, shots, seed) -> accuracy."""
    return [
        record("fewshot", ds, bb, s, values(bb, ds, k, s), shots=k)
        for bb in backbones
        for ds in datasets
        for k in shots
        for s in seeds
    ]


def noise(scale=2.0, seed=0):
    rng = np.random.default_rng(seed)
    table = {}

    def f(bb, ds, k, s):
        return table.setdefault((bb, ds, k, s), 50.0 + scale * rng.normal())

    return f


def shifted(records, shift):
    out = copy.deepcopy(records)
    for r in out:
        d = shift(r)
        for m in r["metrics"].values():
            m["accuracy"] += d
    return out


def write(records, root):
    store = RecordStore(root)
    for r in records:
        store.write(r)
    return root


# --- matching and protocol changes -------------------------------------------------------------------------------


def test_a_changed_setting_fails_with_its_name_and_passes_only_when_accepted(tmp_path, capsys):
    base = suite(noise())
    cur = shifted(base, lambda r: -10.0)
    for r in cur:
        r["hparams"]["pool"] = "tok"
    g = gate(base, cur)
    assert [(p.task, p.setting, p.before, p.after, p.cells, p.accepted) for p in g.protocol] == [
        ("fewshot", "pool", "gap", "tok", 48, False)
    ]
    assert g.protocol[0].change == pytest.approx([-10.0] * 48)
    assert g.comparisons == [] and g.missing == [] and g.new == []  # matched, but not comparable
    b, c = write(base, tmp_path / "b"), write(cur, tmp_path / "c")
    assert main(["regress", "--baseline", str(b), "--current", str(c)]) == 1
    out = capsys.readouterr().out
    assert out.splitlines()[2].startswith("**REGRESSION** (1 protocol changes)")
    assert "| fewshot | pool: gap → tok | 48      | a, b" in out and "FAILS" in out
    for accept in ("fewshot", "fewshot:pool", ":pool"):
        assert main(["regress", "--baseline", str(b), "--current", str(c), "--accept", accept]) == 0
        assert "accepted" in capsys.readouterr().out
    assert main(["regress", "--baseline", str(b), "--current", str(c), "--accept", "vtab:pool"]) == 1


def test_a_protocol_version_or_dataset_setting_is_a_protocol_change():
    base = suite(noise())
    cur = copy.deepcopy(base)
    for r in cur:
        r["protocol_version"] = "3"
        r["dataset_config"]["test"] = "test[:50%]"
    changes = {(p.setting, p.before, p.after) for p in gate(base, cur).protocol}
    assert changes == {("protocol_version", "2", "3"), ("dataset.test", "(none)", "test[:50%]")}


def test_cells_match_on_identity_and_axes_and_a_missing_setting_is_named():
    base = suite(noise())
    cur = [r for r in copy.deepcopy(base) if not (r["hparams"]["shots"] == 5 and r["seed"] == 2)]
    g = gate(base, cur)
    # shots is an axis (it varies between a dataset's cells), so the 5-shot seed-2 cells are missing, not changed
    assert g.protocol == [] and len(g.missing) == 8 and g.new == []
    assert {(k[4], k[5]) for k in g.missing} == {(2, '{"shots":5}')}
    assert {c.n for c in g.of("cell") if c.axes == {"shots": 5}} == {2}
    text, code = verdict(base, cur, fail_on_missing=True)
    assert code == 1 and "- fewshot / d1 / a final seed 2 (shots=5)" in text
    assert verdict(base, cur)[1] == 0


def test_a_final_stage_selected_differently_is_matched_not_a_protocol_change():
    base, cur = [], []
    for s in range(3):
        for side, lr in ((base, 0.01), (cur, 0.03)):
            r = record("vtab", "d1", "a", s, 60 + s, select=["lr"])
            r["hparams"]["lr"] = lr
            side.append(r)
    g = gate(base, cur)
    assert g.protocol == [] and len(g.of("cell")) == 1 and len(g.selection) == 3
    assert g.selection[0][-2:] == ("lr=0.01", "lr=0.03")


def test_settings_read_as_words():
    assert words({"shots": 25, "lr": 0.01, "pool": "tok", "scale": 2.0, "grid": [1, 2]}) == (
        "shots=25, lr=0.01, pool=tok, scale=2.0, grid=[1,2]"
    )


# --- the tests are the hand computations they claim -----------------------------------------------------------------


def test_a_cell_test_is_the_paired_t_over_seeds_and_holm_corrects_the_family():
    base = suite(noise(), backbones=("a",), datasets=("d1",), shots=(1,))
    cur = shifted(base, lambda r: {0: -1.0, 1: -2.5, 2: -1.5}[r["seed"]])
    (c,) = gate(base, cur).of("cell")
    b = [r["metrics"]["test"]["accuracy"] for r in base]
    a = [r["metrics"]["test"]["accuracy"] for r in cur]
    t = stats.ttest_rel(a, b)
    assert c.change == pytest.approx(-5 / 3) and c.p == pytest.approx(t.pvalue) and c.n == 3
    assert (c.low, c.high) == pytest.approx(t.confidence_interval(0.95))
    # Holm by hand: sorted p's against alpha / (m - k)
    assert holm([0.001, 0.04, 0.03, None], 0.05) == [True, False, False, False]
    assert holm([0.001, 0.012, 0.02], 0.05) == [True, True, True]


def test_one_seed_uses_mcnemar_on_the_examples(tmp_path):
    rng = np.random.default_rng(0)
    truth = rng.random(400) < 0.7
    worse = truth.copy()
    worse[np.flatnonzero(truth)[:30]] = False  # 30 examples lost, 0 gained
    store_b, store_c = RecordStore(tmp_path / "b"), RecordStore(tmp_path / "c")
    for store, correct in ((store_b, truth), (store_c, worse)):
        r = record("fewshot", "d1", "a", 0, 100 * correct.mean())
        r["samples"] = store.write_samples(r, {"test": correct})
        store.write(r)
    g = gate(load_records([tmp_path / "b"]), load_records([tmp_path / "c"]))
    (c,) = g.of("cell")
    assert c.n == 1 and c.p == pytest.approx(stats.binomtest(0, 30, 0.5).pvalue) and c.verdict == "regressed"
    assert mcnemar(worse, truth).mean == pytest.approx(-100 * 30 / 400)
    assert mcnemar(truth, truth).p == 1.0


def test_a_broad_small_shift_is_caught_by_the_pooled_test_alone():
    base = suite(noise(scale=1.0), datasets=tuple(f"d{i}" for i in range(7)), shots=(1, 5, 10, 25))
    jitter = np.random.default_rng(1)
    cur = shifted(base, lambda r: (-0.6 + 0.05 * jitter.normal()) if r["backbone"] == "a" else 0.0)
    g = gate(base, cur)
    assert not g.of("cell", "regressed")  # no cell alone is significant after Holm
    pooled = {c.backbone: c for c in g.of("pooled")}
    assert pooled["a"].verdict == "regressed" and pooled["b"].verdict == "unchanged"
    # the pooled change is the mean of the per-(dataset, seed) mean changes; its p the Welch t of the suite_mean
    diffs = {}
    for rb, rc in zip(base, cur):
        if rb["backbone"] == "a":
            d = rc["metrics"]["test"]["accuracy"] - rb["metrics"]["test"]["accuracy"]
            diffs.setdefault(rb["dataset"], {}).setdefault(rb["seed"], []).append(d)
    per = {ds: {s: np.mean(v) for s, v in seeds.items()} for ds, seeds in diffs.items()}
    assert pooled["a"].change == pytest.approx(np.mean([np.mean(list(v.values())) for v in per.values()]))
    var = np.array([np.var(list(v.values()), ddof=1) / 3 for v in per.values()])
    se, df = np.sqrt(var.sum()) / 7, var.sum() ** 2 / (var**2 / 2).sum()
    assert pooled["a"].p == pytest.approx(2 * stats.t.sf(abs(pooled["a"].change) / se, df))
    text, code = verdict(base, cur)
    assert code == 1 and "| fewshot | a          | accuracy | 7          |" in text
    assert "Changes point one way: " in text.splitlines()[2]


def test_improvements_are_reported_and_never_fail():
    base = suite(noise(), datasets=tuple(f"d{i}" for i in range(6)))
    cur = shifted(base, lambda r: 3.0 if r["backbone"] == "b" else 0.0)
    g = gate(base, cur)
    assert {c.verdict for c in g.of("cell") if c.backbone == "b"} == {"improved"}
    text, code = verdict(base, cur)
    assert code == 0 and "## Improvements" in text and "got better" in text.splitlines()[2]


def test_a_collapsed_seed_spread_is_flagged():
    base = suite(noise(), datasets=tuple(f"d{i}" for i in range(6)))
    cur = copy.deepcopy(base)
    by_cell = {}
    for r in cur:  # every seed of a cell gets seed 0's value: the mean moves little, the spread is gone
        if r["backbone"] == "a":
            first = by_cell.setdefault((r["dataset"], r["hparams"]["shots"]), r["metrics"]["test"]["accuracy"])
            r["metrics"]["test"]["accuracy"] = first
    spread = {c.backbone: c for c in gate(base, cur).of("spread")}
    assert spread["a"].verdict == "spread" and spread["a"].change == 0.0 and spread["b"].change == 1.0
    assert verdict(base, cur)[1] == 1


def test_variance_ratio_is_the_f_test_of_pooled_variances():
    a, b = [[1.0, 2.0, 4.0], [0.0, 3.0]], [[1.0, 1.5, 2.0], [5.0, 5.2]]
    va = (np.var(a[0], ddof=1) * 2 + np.var(a[1], ddof=1)) / 3
    vb = (np.var(b[0], ddof=1) * 2 + np.var(b[1], ddof=1)) / 3
    ratio, p = variance_ratio(a, b)
    assert ratio == pytest.approx(np.sqrt(va / vb)) and p == pytest.approx(2 * stats.f.sf(va / vb, 3, 3))
    assert variance_ratio([[1.0, 1.0]], [[1.0, 2.0]]) == (0.0, 0.0)


# --- reproduction and error rates -------------------------------------------------------------------------------


def test_same_machine_and_libraries_count_every_changed_cell():
    base = suite(noise())
    cur = shifted(base, lambda r: 0.01 if r["backbone"] == "a" and r["seed"] == 1 else 0.0)
    g = gate(base, cur)
    assert g.exact == {"a": (8, 24), "b": (0, 24)}
    assert not g.regressed and "## Exact reproduction" in verdict(base, cur)[0]
    for r in cur:
        r["environment"]["torch"] = "2.13.0"
    assert gate(base, cur).exact is None


def test_the_gate_raises_false_alarms_at_most_alpha_under_pure_noise():
    """Nights of two backbones x 4 datasets x 2 settings x 3 seeds whose current side is the baseline plus
    arithmetic-like noise (independent, centred) of varying size, with no floor so that only the tests decide:
    the share of nights that fail stays within a binomial bound of alpha."""
    rng = np.random.default_rng(7)
    base = suite(noise())
    nights, alarms = 300, 0
    for _ in range(nights):
        scale = rng.choice([0.05, 0.3, 1.0])
        cur = shifted(base, lambda r, s=scale: s * rng.normal())
        alarms += bool(gate(base, cur, floor=0.0).regressed)
    assert alarms <= stats.binom.ppf(0.999, nights, ALPHA), alarms
