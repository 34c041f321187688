"""The regression gate (transferbench/gate, rendered by reporting/regress.py) on records whose every value the test
chooses: cells match on what they are, a changed setting is a named protocol change that fails unless accepted, each
test is the hand computation it claims (scipy's paired t, the exact McNemar, Holm, the pooled Welch mean, the F-test
of spreads), a broad small shift is caught by the pooled test alone, a collapsed spread is flagged, and the false-
alarm rate of the whole gate under pure noise stays under alpha by simulation."""

import copy
import os

import kit
import numpy as np
import pytest
from conftest import shifted, toy_noise_model
from conftest import write_records as write
from kit import cli
from scipy import stats

from transferbench.cli import main
from transferbench.gate.comparisons import ALPHA
from transferbench.gate.decide import gate as _gate
from transferbench.hashing import canon
from transferbench.records.scatter import variance_ratio
from transferbench.records.stats import holm, mcnemar
from transferbench.records.store import RecordStore, load_records
from transferbench.reporting.regress import decision_report as _verdict
from transferbench.reporting.regress_text import words

ENV = kit.ENV
# the arithmetic noise model of these synthetic suites (the package's is of the nightly's own records): one
# comparison's change between two arithmetics has a root mean square of 0.25 points, measured on 400 changes
RMS = 0.25
MODEL = {
    task: {
        split: {"accuracy": {"kernels": {"ms": RMS**2, "df": 400}, "precision": {"ms": RMS**2, "df": 400}}}
        for split in ("test", "val")
    }
    for task in ("fewshot", "vtab")
}


def gate(baseline, current, **kw):
    kw.setdefault("noise", MODEL)
    return _gate(baseline, current, **kw)


def verdict(baseline, current, *args, **kw):
    kw.setdefault("noise", MODEL)
    return _verdict(baseline, current, *args, **kw)


def package_model():
    """The package's noise model for records of this checkout's code: it was measured on the anchor's commit, whose
    code differs in modules that move no number, so its code check is set aside here on purpose."""
    import dataclasses

    from transferbench.gate.noise import packaged

    return dataclasses.replace(packaged(), code={})


def other_weights(records):
    """`records` as computed from another checkpoint: a comparison of two checkpoints, judged against the seeds'
    own variance (the change is the question), not against arithmetic's."""
    out = copy.deepcopy(records)
    for r in out:
        r["checkpoint_sha256"] = "another-checkpoint"
    return out


def record(task, dataset, backbone, seed, value, *, shots=None, stage="final", split="test", pool="gap", **extra):
    hp = {"l2": 1024.0, "pool": pool, "resolution": 16, **({"shots": shots} if shots is not None else {})}
    metrics = {split: {"accuracy": float(value)}}
    extra = {"dataset_config": {"set": dataset}, "suite": "embedded", "finished_at": "2026-11-24T00:00:00", **extra}
    return kit.record(task, dataset, backbone, seed, metrics, stage=stage, hparams=hp, **extra)


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
    assert cli(f"regress --baseline {b} --current {c}") == 1
    out = capsys.readouterr().out
    assert out.splitlines()[2].startswith("**REGRESSION** (1 protocol changes)")
    assert "| fewshot | pool: gap → tok | 48      | a, b" in out and "FAILS" in out
    # accepted, the change passes where the numbers hold ...
    same = copy.deepcopy(base)
    for r in same:
        r["hparams"]["pool"] = "tok"
    s = write(same, tmp_path / "s")
    for accept in ("fewshot", "fewshot:pool", ":pool"):
        assert main(["regress", "--baseline", str(b), "--current", str(s), "--accept", accept]) == 0
        assert "accepted" in capsys.readouterr().out
    assert cli(f"regress --baseline {b} --current {s} --accept vtab:pool") == 1
    capsys.readouterr()
    # ... and accepting a setting accepts no regression: its cells are still compared, and the -10 fails
    assert cli(f"regress --baseline {b} --current {c} --accept fewshot:pool") == 1
    out = capsys.readouterr().out
    assert out.splitlines()[2].startswith("**REGRESSION** (") and "regressed" in out.splitlines()[2]
    assert "| fewshot | pool: gap → tok | 48      | a, b" in out and "accepted" in out
    g = gate(base, cur, accept=["fewshot:pool"])
    assert len(g.of("cell", "regressed")) == 16  # 2 backbones x 4 sets x 2 shot counts
    assert g.exact.why == {"an accepted protocol change": 48}


def test_the_escape_on_the_committed_nightly_records_fails_naming_the_setting(tmp_path, capsys):
    """The committed few-shot nightly records, their pooling changed from the default to `tok` and every accuracy
    10 points worse: once this passed as '0 compared, N missing, N new'."""
    from pathlib import Path

    base = [r for r in load_records([Path(__file__).parent.parent / "results" / "nightly"]) if r["task"] == "fewshot"]
    cur = shifted(base, lambda r: -10.0)
    for r in cur:
        r["hparams"]["pool"] = "tok"
    b, c = write(base, tmp_path / "b"), write(cur, tmp_path / "c")
    assert cli(f"regress --baseline {b} --current {c}") == 1
    out = capsys.readouterr().out
    assert "| fewshot | pool: model → tok | 252     |" in out and "| -10.00        | FAILS     |" in out
    assert "0 cells missing from current, 0 new" in out


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
    text, code = verdict(base, cur)  # a dropped seed fails by default, as in `nightly`
    assert code == 1 and "- fewshot / d1 / a final seed 2 (shots=5)" in text
    assert verdict(base, cur, fail_on_missing=False)[1] == 0


def test_a_final_stage_selected_differently_is_matched_not_a_protocol_change():
    base, cur = [], []
    for s in range(3):
        for side, lr in ((base, 0.01), (cur, 0.03)):
            r = record("vtab", "d1", "a", s, 60 + s, select=["lr"])
            r["hparams"]["lr"] = lr
            side.append(r)
    g = gate(base, cur)
    assert g.protocol == [] and len(g.of("cell")) == 1 and len(g.selection) == 3
    assert (g.selection[0].before, g.selection[0].after) == ({"lr": 0.01}, {"lr": 0.03})


def test_a_cell_that_diverged_tonight_fails_the_night():
    base = suite(noise())
    cur = copy.deepcopy(base)
    for r in cur[:3]:  # every seed of one comparison: no paired value is left, so no test could see it
        r.update(status="diverged", reason="Diverged: non-finite loss at step 3", metrics={})
    g = gate(base, cur)
    assert [r["key"] for r in g.diverged] == [r["key"] for r in cur[:3]] and not g.missing
    text, code = verdict(base, cur, fail_on_failed=True)
    assert code == 1 and "(3 cells failed or diverged)" in text
    assert text.count("| diverged | Diverged: non-finite loss at step 3 |") == 3


def test_settings_read_as_words():
    assert words({"shots": 25, "lr": 0.01, "pool": "tok", "scale": 2.0, "grid": [1, 2]}) == (
        "shots=25, lr=0.01, pool=tok, scale=2.0, grid=[1,2]"
    )


# --- the tests are the hand computations they claim -----------------------------------------------------------------


def test_against_other_weights_a_cell_test_is_the_paired_t_over_seeds_and_holm_corrects_the_family():
    base = suite(noise(), backbones=("a",), datasets=("d1",), shots=(1,))
    # another checkpoint: the change is the question, so its null is the seeds' own variance
    cur = other_weights(shifted(base, lambda r: {0: -1.0, 1: -2.5, 2: -1.5}[r["seed"]]))
    (c,) = gate(base, cur).of("cell")
    b = [r["metrics"]["test"]["accuracy"] for r in base]
    a = [r["metrics"]["test"]["accuracy"] for r in cur]
    t = stats.ttest_rel(a, b)
    assert c.change == pytest.approx(-5 / 3) and c.p == pytest.approx(t.pvalue) and c.n == 3
    assert (c.low, c.high) == pytest.approx(t.confidence_interval(0.95))
    # Holm by hand: sorted p's against alpha / (m - k)
    assert holm([0.001, 0.04, 0.03, None], 0.05) == [True, False, False, False]
    assert holm([0.001, 0.012, 0.02], 0.05) == [True, True, True]


def test_one_seed_of_other_weights_uses_mcnemar_on_the_examples(tmp_path):
    rng = np.random.default_rng(0)
    truth = rng.random(400) < 0.7
    worse = truth.copy()
    worse[np.flatnonzero(truth)[:30]] = False  # 30 examples lost, 0 gained
    store_b, store_c = RecordStore(tmp_path / "b"), RecordStore(tmp_path / "c")
    for store, correct in ((store_b, truth), (store_c, worse)):
        r = record("fewshot", "d1", "a", 0, 100 * correct.mean())
        if store is store_c:  # another checkpoint, one seed: McNemar's test on the examples
            r["checkpoint_sha256"] = "another-checkpoint"
        r["samples"] = store.write_samples(r, {"test": correct})
        store.write(r)
    g = gate(load_records([tmp_path / "b"]), load_records([tmp_path / "c"]))
    (c,) = g.of("cell")
    assert c.n == 1 and c.p == pytest.approx(stats.binomtest(0, 30, 0.5).pvalue) and c.verdict == "regressed"
    assert mcnemar(worse, truth).mean == pytest.approx(-100 * 30 / 400)
    assert mcnemar(truth, truth).p == 1.0


def test_a_broad_small_shift_is_caught_by_the_pooled_test_against_the_model():
    """Backbone a 0.6 points worse in all 28 comparisons: no single cell's t against the model (rms 0.25, allowed
    twice that) reaches Holm's level, the pooled mean over its 21 runs does, and so does the sign test."""
    base = suite(noise(scale=1.0), datasets=tuple(f"d{i}" for i in range(7)), shots=(1, 5, 10, 25))
    jitter = np.random.default_rng(1)
    cur = shifted(base, lambda r: (-0.6 + 0.05 * jitter.normal()) if r["backbone"] == "a" else 0.0)
    g = gate(base, cur)
    assert not g.of("cell", "regressed")
    pooled = {c.backbone: c for c in g.of("pooled")}
    assert pooled["a"].verdict == "regressed" and pooled["b"].verdict == "unchanged"
    # the pooled change is the mean of the per-(dataset, seed) mean changes; each run's mean is allowed the model's
    # variance (the square of the mean of its comparisons' sds: they share the run's arithmetic), on its 400 changes
    diffs = {}
    for rb, rc in zip(base, cur):
        if rb["backbone"] == "a":
            d = rc["metrics"]["test"]["accuracy"] - rb["metrics"]["test"]["accuracy"]
            diffs.setdefault((rb["dataset"], rb["seed"]), []).append(d)
    u = np.array([np.mean(v) for v in diffs.values()])
    assert pooled["a"].change == pytest.approx(u.mean())
    se = np.sqrt(len(u) * (2 * RMS) ** 2) / len(u)
    assert pooled["a"].p == pytest.approx(2 * stats.t.sf(abs(u.mean()) / se, 400))
    text, code = verdict(base, cur)
    assert code == 1 and "| fewshot | a          | accuracy | 21         |" in text
    assert "Changes point one way: " in text.splitlines()[4]
    (shift,) = g.of("shift")  # one per task and metric, over every backbone's runs that moved
    assert shift.n == 21 and shift.p == pytest.approx(stats.binomtest(21, 21, 0.5).pvalue)


def test_cells_that_move_both_ways_fail_though_the_mean_stays():
    """Against other weights (seed variance is the null), a change that lifts some datasets and lowers others by 2
    points (the mean change 0): no pooled mean sees it, the F-test of the groups' mean changes does."""
    base = suite(noise(), datasets=tuple(f"d{i}" for i in range(6)))
    jitter = np.random.default_rng(3)
    up = {"d0", "d2", "d4"}
    cur = other_weights(
        shifted(
            base, lambda r: ((2.0 if r["dataset"] in up else -2.0) + 0.3 * jitter.normal()) * (r["backbone"] == "a")
        )
    )
    g = gate(base, cur)
    pooled = {c.backbone: c for c in g.of("pooled")}
    moved = {c.backbone: c for c in g.of("moved")}
    assert pooled["a"].verdict == "unchanged" and moved["a"].verdict == "moved" and moved["b"].verdict == "unchanged"
    # the F by hand: each group is one (set, shot count) over its 3 seeds, so 12 groups (a shot count, a stage, a
    # corruption is a group of its own in every task); nested shot subsets share their seed's noise, which the
    # between-group differences of one set cancel: the test errs on the quiet side
    diffs = {}
    for rb, rc in zip(base, cur):
        if rb["backbone"] == "a":
            key = (rb["dataset"], rb["hparams"]["shots"])
            diffs.setdefault(key, []).append(rc["metrics"]["test"]["accuracy"] - rb["metrics"]["test"]["accuracy"])
    d = np.array([diffs[k] for k in sorted(diffs)])
    # the one-way ANOVA: do the groups' means differ from each other more than their seeds vary?
    m = d.mean(1)
    f = (3 * ((m - d.mean()) ** 2).sum() / 11) / (((d - m[:, None]) ** 2).sum() / 24)
    assert moved["a"].p == pytest.approx(stats.f.sf(f, 11, 24), rel=1e-6) and moved["a"].n == 11
    assert moved["a"].current == pytest.approx(np.sqrt(((m - d.mean()) ** 2).mean()))
    text, code = verdict(base, cur)
    assert code == 1 and "## Moved either way" in text and "1 moved either way" in text.splitlines()[4]


def test_an_unexplained_improvement_fails_unless_allowed():
    # numbers that move without a declared change are a change of the code or the data, whichever way they move
    base = suite(noise(), datasets=tuple(f"d{i}" for i in range(6)))
    cur = shifted(base, lambda r: 3.0 if r["backbone"] == "b" else 0.0)
    g = gate(base, cur)
    assert {c.verdict for c in g.of("cell") if c.backbone == "b"} == {"improved"}
    text, code = verdict(base, cur)
    assert code == 1 and "improved beyond chance (allow with --allow-improvement)" in text.splitlines()[2]
    text, code = verdict(base, cur, allow_improvement=True)
    assert code == 0 and "## Improvements" in text and "got better" in text.splitlines()[4]


def test_a_collapsed_seed_spread_is_flagged():
    base = suite(noise(), datasets=tuple(f"d{i}" for i in range(6)))
    cur = copy.deepcopy(base)
    by_cell = {}
    for r in cur:  # every seed of a cell gets seed 0's value: the mean moves little, the spread is gone
        if r["backbone"] == "a":
            first = by_cell.setdefault((r["dataset"], r["hparams"]["shots"]), r["metrics"]["test"]["accuracy"])
            r["metrics"]["test"]["accuracy"] = first
    cur = other_weights(cur)  # the seed-spread F-test is the null of other weights
    spread = {c.backbone: c for c in gate(base, cur).of("spread")}
    assert spread["a"].verdict == "spread" and spread["a"].change == pytest.approx(0.0, abs=1e-9)
    assert spread["b"].change == pytest.approx(1.0)
    assert verdict(base, cur)[1] == 1


def test_variance_ratio_is_the_f_test_of_pooled_variances():
    a, b = [[1.0, 2.0, 4.0], [0.0, 3.0]], [[1.0, 1.5, 2.0], [5.0, 5.2]]
    va = (np.var(a[0], ddof=1) * 2 + np.var(a[1], ddof=1)) / 3
    vb = (np.var(b[0], ddof=1) * 2 + np.var(b[1], ddof=1)) / 3
    ratio, p = variance_ratio(a, b)
    assert ratio == pytest.approx(np.sqrt(va / vb)) and p == pytest.approx(2 * stats.f.sf(va / vb, 3, 3))
    assert variance_ratio([[1.0, 1.0]], [[1.0, 2.0]]) == (0.0, 0.0)


# --- reproduction and error rates -------------------------------------------------------------------------------


def exact_suite(values, outputs=lambda r: "same", arithmetic=lambda r: "A", code=lambda r: {"m.a": "1", "m.b": "1"}):
    """`suite(values)` with the fields of the exact tier: each record's outputs digest, arithmetic digest and
    code fingerprint, from functions of the record."""
    records = suite(values)
    for r in records:
        r["outputs"] = outputs(r)
        r["arithmetic"] = {"digest": arithmetic(r), "machine": {"threads": {"intra_op": 1}}, "cell": {}}
        modules = code(r)
        r["fingerprint"] = {"digest": canon(modules), "modules": modules, "libraries": {}}
    return records


def test_equal_arithmetic_and_outputs_pass_exactly_and_the_first_line_counts_the_tiers():
    base = exact_suite(noise())
    text, code = verdict(base, copy.deepcopy(base))
    assert code == 0
    assert text.split("\n")[2] == (
        "**OK**: all 48 cells judged exactly (48 bit-identical, 0 changed by code, 0 irreproducible), 0 by the "
        "statistical tier (their arithmetic differs or is unrecorded)."
    )
    g = gate(base, copy.deepcopy(base))
    assert g.exact.identical == 48 and not g.of("cell")  # nothing left for the statistical tier


def test_outputs_changed_by_code_fail_naming_the_module_until_accepted():
    base = exact_suite(noise())
    # backbone a's module m.b changed and moved its outputs, not its accuracy (accuracy is quantised)
    changed = lambda r: {"m.a": "1", "m.b": "2" if r["backbone"] == "a" else "1"}  # noqa: E731
    outputs = lambda r: "other" if r["backbone"] == "a" else "same"  # noqa: E731
    cur = exact_suite(noise(), outputs=outputs, code=changed)
    text, code = verdict(base, cur)
    assert code == 1 and text.split("\n")[2].startswith("**REGRESSION** (24 changed by code): all 48 cells judged")
    table = text.split("## Changed by code")[1].split("\n- ")[0]
    assert "| m.b       | 24      | fewshot | 0                       | FAILS     |" in table, table
    assert "- fewshot / d1 / a final shots=1 seed 0 (Δ +0)" in text
    # accepted by name, by its package, never by another module
    for accept, passes in ((["m.b"], True), (["m"], True), (["m.a"], False), (["m.bb"], False)):
        text, code = verdict(base, cur, accept_code=accept)
        assert code == (0 if passes else 1), accept
    text, _ = verdict(base, cur, accept_code=["m.b"])
    assert "24 changed by accepted code" in text.split("\n")[2] and "| accepted  |" in text


def test_outputs_that_change_with_nothing_else_changed_are_irreproducible_and_fail():
    base = exact_suite(noise())
    cur = exact_suite(noise(), outputs=lambda r: "other" if r["seed"] == 2 and r["backbone"] == "b" else "same")
    text, code = verdict(base, cur)
    assert code == 1 and "(8 irreproducible)" in text.split("\n")[2]
    listed = text.split("## Irreproducible")[1]
    assert listed.count("\n- fewshot / ") == 8 and "- fewshot / d4 / b final shots=5 seed 2" in listed


def test_cells_of_other_arithmetic_go_to_the_statistical_tier_with_the_difference_named():
    base = exact_suite(noise())
    cur = exact_suite(noise(), arithmetic=lambda r: "B" if r["backbone"] == "a" else "A")
    for r in cur:
        if r["backbone"] == "a":
            r["arithmetic"]["machine"]["threads"]["intra_op"] = 2
            r["outputs"] = "other"
    g = gate(base, cur)
    assert (g.exact.identical, g.exact.statistical) == (24, 24)
    assert len(g.of("cell")) == 4 * 2  # backbone a's 4 datasets x 2 shot counts, each over its 3 seeds
    text, code = verdict(base, cur)
    assert code == 0 and "| threads.intra_op 1 -> 2 | 24      |" in text
    # no arithmetic recorded (records of older code): statistical as well
    for r in cur:
        r.pop("arithmetic")
    assert gate(base, cur).exact.statistical == 48
    # a fixed anchor: the statistical tier judges everything
    assert gate(base, copy.deepcopy(base), exact=False).exact.judged == 0


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
        alarms += bool(gate(base, cur, floor=0.0, noise={}).regressed)
    assert alarms <= stats.binom.ppf(0.999, nights, ALPHA), alarms


def test_a_training_curve_is_gated_and_moving_either_way_fails():
    """A pretraining record's `loss@STEP` points are compared besides its accuracy; the change is signed with lower
    better, and a significant move either way is a regression."""
    base, cur = [], []
    for s in range(5):
        for side, up in ((base, 0.0), (cur, 0.4 + 0.01 * s)):
            r = record("pretrain", "upstream", "mu4", s, 20.0 + s)
            r["metrics"]["train"] = {"loss@50": 1.0 + 0.1 * s + up, "loss@100": 0.5 + 0.1 * s}
            side.append(r)
    entry = {"kernels": {"ms": 1e-4, "df": 400}}
    model = {"pretrain": {"train": {"loss@50": entry, "loss@100": entry}, "test": {"accuracy": entry}}}
    g = gate(base, cur, noise=model)
    cells = {(c.split, c.metric): c for c in g.of("cell")}
    assert set(cells) == {("test", "accuracy"), ("train", "loss@50"), ("train", "loss@100")}
    assert cells[("train", "loss@50")].change == pytest.approx(-0.42) and cells[("train", "loss@50")].verdict == (
        "regressed"
    )
    pooled = {c.metric: c for c in g.of("pooled")}
    assert pooled["loss@50"].baseline == pytest.approx(1.2) and pooled["loss@50"].current == pytest.approx(1.62)
    assert pooled["loss@100"].verdict == "unchanged" and pooled["accuracy"].change == 0
    # a curve that drops is changed training code too: it fails like one that rises
    lower = copy.deepcopy(base)
    for r, s in zip(lower, range(5)):
        r["metrics"]["train"]["loss@50"] -= 0.4 + 0.01 * s
    cells = {(c.split, c.metric): c for c in gate(base, lower, noise=model).of("cell")}
    assert cells[("train", "loss@50")].change == pytest.approx(0.42) and cells[("train", "loss@50")].verdict == (
        "regressed"
    )


def test_every_paper_default_runs_in_a_nightly_cell_and_the_docs_list_them():
    from pathlib import Path

    from transferbench.reporting.coverage import EXEMPT, markdown, rows
    from transferbench.spec import BUILTIN_TASKS as BUILTIN

    table = rows()
    assert {r.task for r in table} == set(BUILTIN)
    uncovered = [(r.task, r.setting) for r in table if not r.covered and (r.task, r.setting) not in EXEMPT]
    assert uncovered == [], f"paper defaults no nightly cell runs: {uncovered}"
    assert set(EXEMPT) <= {(r.task, r.setting) for r in table}, "an exemption names a setting no task has"
    docs = (Path(__file__).parent.parent / "docs" / "nightly-coverage.md").read_text()
    assert markdown(table) in docs, "docs/nightly-coverage.md: paste `python -m transferbench.reporting.coverage`"


def test_coverage_groups_values_that_run_the_same_code():
    from transferbench.reporting.coverage import kind

    # a size or rate of any positive value runs the same code; 0 and null switch a step off
    assert kind(512) == kind(32) == kind(0.001) == "+" and kind(0) == kind(0.0) == "0" and kind(None) == "null"
    assert kind(True) != kind(False) and kind("sigmoid") != kind("softmax") and kind([]) != kind([1])


@pytest.mark.slow
def test_the_docs_bisect_recipe_names_the_commit_that_broke_the_numbers(tmp_path):
    """The recipe of docs/regression.md, run as written (its tasks swapped for the toy plugin's), on a repository of
    a plugin whose third of four commits makes every accuracy 5 points worse."""
    import re
    import shutil
    import subprocess
    from pathlib import Path

    root = Path(__file__).parent.parent
    doc = (root / "docs" / "regression.md").read_text().split("## Finding the commit")[1]
    block = doc.split("```bash")[1].split("```")[0]
    good_line = next(line for line in block.splitlines() if "git checkout GOOD" in line).split("&& ", 1)[1]
    run_line = next(line for line in block.splitlines() if line.startswith("git bisect run"))
    toy = "--backbone mu4 --suite quick"
    repo, work = tmp_path / "repo", tmp_path / "bisect"
    shutil.copytree(root / "tests" / "plugins", repo / "plugins", ignore=shutil.ignore_patterns("__pycache__"))
    env = {**os.environ, "PYTHONPATH": str(repo / "plugins"), "TRANSFERBENCH_HOME": str(tmp_path / "home")}

    def sh(cmd):
        out = subprocess.run(cmd, shell=True, cwd=repo, env=env, capture_output=True, text=True)
        assert out.returncode == 0, out.stdout + out.stderr
        return out.stdout

    sh("git init -q && git config user.email t@t && git config user.name t")
    module = repo / "plugins" / "toyplugin" / "__init__.py"
    shas = []
    for change in ("", "# a comment\n", "BROKEN", "# another comment\n"):
        text = module.read_text()
        if change == "BROKEN":
            text = text.replace("    return 60.0 + bonus", "    return 55.0 + bonus")
            assert "55.0 + bonus" in text
        else:
            text += change
        module.write_text(text)
        sh(f"git add -A && git commit -q -m 'step {len(shas)}' && git rev-parse HEAD")
        shas.append(sh("git rev-parse HEAD").strip())
    good, bad = shas[0], shas[-1]
    sh(
        f"git checkout -q {good} && "
        + good_line.replace("fewshot,vtab --suite nightly", "toy " + toy).replace("/tmp/bisect", str(work))
    )
    sh(f"git checkout -q {bad} && git bisect start {bad} {good}")
    recipe = run_line.replace("fewshot,vtab", "toy " + toy).replace("/tmp/bisect", str(work))
    # a plugin's task has no figures in the package's noise model: the recipe gives the toy's own (--noise-model)
    recipe = recipe.replace("--no-progress", f"--no-progress --noise-model {toy_noise_model(work)}")
    out = sh(recipe)
    assert re.search(rf"^{shas[2]} is the first bad commit", out, re.M), out


@pytest.mark.slow
def test_arithmetic_alone_raises_no_alarm(tmp_path, suite_home):
    """The nightly's few-shot cells of one backbone on one set, run twice on this machine: as committed, and with
    scalar ATen kernels, 2 threads per cell and fp32 where the bf16 probe picked bf16 (the setting written back to
    auto, as another machine's probe would record it). The arithmetic digests differ, so the statistical tier
    judges every cell, naming what differs, and the gate passes; where the probe picked bf16, values did move."""
    import subprocess
    import sys

    run = ["run", "fewshot", "--suite", "nightly", "--datasets", "mini_clevr_count", "--backbone", "mu4_dtn@embedded"]
    run += ["--no-progress"]
    outs = {}
    for name, env, extra in (
        ("a", {}, ["--cpus-per-cell", "1"]),  # in process, one thread per cell (as --jobs 2 gives each)
        ("b", {"ATEN_CPU_CAPABILITY": "default"}, ["--cpus-per-cell", "2", "--set", "bf16=off"]),
    ):
        home = tmp_path / f"home-{name}"
        kit.embedded_home(suite_home, home)
        cmd = [sys.executable, "-c", "import sys; from transferbench.cli import main; sys.exit(main())", *run]
        done = subprocess.run(
            [*cmd, *extra, "--out", str(tmp_path / name)],
            env={**os.environ, **env, "TRANSFERBENCH_HOME": str(home)},
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        outs[name] = load_records([tmp_path / name])
    for r in outs["b"]:
        r["hparams"]["bf16"] = "auto"
    text, code = verdict(outs["a"], outs["b"], noise=package_model())
    assert code == 0, text
    g = gate(outs["a"], outs["b"], noise=package_model())
    assert len(g.of("cell")) == 1 * 1 * 4 and not g.protocol and not g.missing
    assert (g.exact.judged, g.exact.statistical) == (0, 4 * 3)  # records: 4 shot counts x 3 seeds
    from transferbench.arithmetic import differences

    named = differences(outs["a"][0]["arithmetic"], outs["b"][0]["arithmetic"])
    capability = outs["a"][0]["arithmetic"]["machine"]["cpu_capability"]
    assert capability == "DEFAULT" or f"cpu_capability {capability} -> DEFAULT" in named, named
    assert "threads.intra_op 1 -> 2" in named and sum(g.exact.why.values()) == 12
    if any(r["info"].get("bf16") for r in outs["a"]):
        assert any(c.change != 0 for c in g.of("cell"))


@pytest.mark.slow
def test_the_pretraining_probe_catches_a_pretraining_fault(tmp_path, suite_home):
    """The nightly's pretraining probe, shortened to 6 steps and 3 seeds in fp32, in a clean copy of the package and
    in one whose new heads start with a bias 1 higher than asked, so that pretraining's -6.9 becomes -5.9
    (benchmarks/gate_power.py's `head_bias`): on one machine the exact tier fails it naming the module, and the moved
    training curve fails the statistical tier alone too (as on another machine)."""
    import subprocess
    import sys

    from benchmarks.gate_power import CATALOGUE, _copy

    clean, fault = CATALOGUE[0], next(v for v in CATALOGUE if v.name == "head_bias")
    outs = {}
    for v in (clean, fault):
        pkg, home = _copy(tmp_path / v.name, v), tmp_path / v.name / "home"
        kit.embedded_home(suite_home, home)
        cmd = [sys.executable, "-c", "import sys; from transferbench.cli import main; sys.exit(main())", "run"]
        cmd += ["pretrain", "--suite", "nightly", "--set", "steps=6", "--set", "warmup_steps=2", "--seeds", "0,1,2"]
        cmd += ["--set", "bf16=off", "--jobs", "1"]  # no precision probe: fp32 in both
        done = subprocess.run(
            [*cmd, "--no-progress", "--out", str(tmp_path / v.name / "runs")],
            env={**os.environ, "PYTHONPATH": str(pkg), "TRANSFERBENCH_HOME": str(home)},
            cwd=tmp_path / v.name,  # not the repository, whose package would come first
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        outs[v.name] = load_records([tmp_path / v.name / "runs"])
    assert len(outs["clean"]) == 3 and sorted(outs["clean"][0]["metrics"]["train"]) == [
        "decayed_norm",
        "loss_heldout",
        "target_entropy",
    ]
    text, code = verdict(outs["clean"], outs["head_bias"])
    assert code == 1 and "(3 changed by code)" in text.split("\n")[2], text
    assert "| transferbench.backbones.vit | 3 " in text
    g = gate(outs["clean"], outs["head_bias"], exact=False, noise=package_model())
    assert any(c.metric == "loss_heldout" for c in g.regressed), text


def test_every_catalogued_fault_still_applies_to_the_code():
    """benchmarks/gate_power.py measures the gate against edits of the package's source: each edit must find its
    text exactly once, or the fault silently stops being injected when the code around it is rewritten."""
    from benchmarks.gate_power import CATALOGUE, ROOT

    for v in CATALOGUE:
        for path, old, _ in v.edits:
            assert (ROOT / path).read_text().count(old) == 1, (v.name, path, old)
    kinds = {k: sorted(v.name for v in CATALOGUE if v.kind == k) for k in ("fault", "benign", "intended")}
    assert len(kinds["fault"]) == 15 and kinds["intended"] == ["fewshot_scores_f64"]
    assert kinds["benign"] == sorted(
        ["aten_default", "aten_avx2", "two_threads", "fp32_where_bf16", "bf16_flip_one", "restored_home"]
        + ["refactor_mlp", "refactor_inexact"]
    )
    assert {v.name for v in CATALOGUE if v.arithmetic} == {
        "aten_default",
        "aten_avx2",
        "two_threads",
        "fp32_where_bf16",
    }


# --- no escapes ---------------------------------------------------------------------------------------------------


def test_regress_fails_on_failed_cells_and_stops_on_an_empty_side(tmp_path, capsys):
    base = suite(noise())
    cur = copy.deepcopy(base)
    cur[0].update(status="failed", reason="RuntimeError: boom", metrics={})
    b, c = write(base, tmp_path / "b"), write(cur, tmp_path / "c")
    assert cli(f"regress --baseline {b} --current {c}") == 1
    assert "(1 cells failed or diverged)" in capsys.readouterr().out.splitlines()[2]
    (tmp_path / "empty").mkdir()
    for args in (
        ["--baseline", str(tmp_path / "empty"), "--current", str(c)],
        ["--baseline", str(b), "--current", str(tmp_path / "empty")],
        ["--baseline", str(tmp_path / "nowhere"), "--current", str(c)],
    ):
        assert main(["regress", *args]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and ("holds no records" in err[0] or "does not exist" in err[0]), err


def test_regress_says_a_file_given_for_a_folder_is_not_a_folder(tmp_path, capsys):
    """`regress --baseline README.md` said the file "does not exist" (or read it as a ledger): it is there, and
    not a folder. Likewise --current."""
    b = write(suite(noise()), tmp_path / "b")
    readme = tmp_path / "README.md"
    readme.write_text("# not records\n\n- a list\n")
    for flag, args in (
        ("--baseline", ["--baseline", str(readme), "--current", str(b)]),
        ("--current", ["--baseline", str(b), "--current", str(readme)]),
    ):
        assert main(["regress", *args]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"transferbench: error: {flag} {readme} is a file, not a records folder (give ") and (
            err.count("\n") == 1
        ), err


def test_a_task_or_backbone_absent_tonight_fails_unless_named(tmp_path, capsys):
    base = suite(noise())
    cur = [r for r in copy.deepcopy(base) if r["backbone"] == "a"]
    text, code = verdict(base, cur)
    assert code == 1 and "(1 tasks or backbones absent)" in text.splitlines()[2]
    assert "## Absent from current" in text and "- fewshot / b" in text
    for named in (["fewshot:b"], ["fewshot"], ["*"], True):
        assert verdict(base, cur, allow_missing=named)[1] == 0, named
    assert verdict(base, cur, allow_missing=["fewshot:a"])[1] == 1
    b, c = write(base, tmp_path / "b"), write(cur, tmp_path / "c")
    assert cli(f"regress --baseline {b} --current {c}") == 1
    assert cli(f"regress --baseline {b} --current {c} --allow-missing fewshot:b") == 0


def test_a_vanished_metric_or_split_counts_as_missing():
    base = suite(noise())
    for r in base:
        r["metrics"]["val"] = {"accuracy": 40.0}
    cur = copy.deepcopy(base)
    for r in cur:
        if r["dataset"] == "d1":
            del r["metrics"]["val"]
    g = gate(base, cur)
    assert len(g.vanished) == 12 and {(split, m) for _, split, m in g.vanished} == {("val", "accuracy")}
    text, code = verdict(base, cur)  # fails by default, as in `nightly`
    assert code == 1 and "(12 cells or metrics missing)" in text.splitlines()[2] and "## Vanished metrics" in text
    assert "- fewshot / d1 / a final seed 0: val accuracy" in text
    assert verdict(base, cur, fail_on_missing=False)[1] == 0  # --no-fail-on-missing lists them only


def test_a_move_fails_though_the_pooled_mean_got_better():
    """A fault that lifts three sets by 4 points and sinks three by 2: the pooled mean improves (+1), yet the sets
    that sank are a regression that must not pass."""
    base = suite(noise(), datasets=tuple(f"d{i}" for i in range(6)))
    jitter = np.random.default_rng(5)
    cur = shifted(
        base,
        lambda r: (
            ((4.0 if r["dataset"] in {"d0", "d1", "d2"} else -2.0) + 0.3 * jitter.normal()) * (r["backbone"] == "a")
        ),
    )
    g = gate(base, other_weights(cur))
    pooled = {c.backbone: c for c in g.of("pooled")}
    moved = {c.backbone: c for c in g.of("moved")}
    assert pooled["a"].verdict == "improved" and moved["a"].verdict == "moved"
    assert verdict(base, other_weights(cur))[1] == 1
    # across arithmetic (the same weights), the sets that sank regress against the model
    g = gate(base, cur)
    assert {c.dataset for c in g.of("cell", "regressed")} == {"d3", "d4", "d5"}


def test_records_kept_from_other_code_are_named_and_not_judged():
    base = exact_suite(noise())
    cur = copy.deepcopy(base)
    for r in cur:  # tonight's code computed every cell but d4's, kept from the baseline's code (--stale keep)
        if r["dataset"] != "d4":
            r["fingerprint"] = {"digest": "tonight", "modules": {"m.a": "1", "m.b": "2"}, "libraries": {}}
            r["finished_at"] = "2026-11-25T00:00:00"
    g = gate(base, cur)
    assert len(g.stale) == 12 and {k[1] for k in g.stale} == {"d4"}
    assert g.exact.identical == 36 and len(g.of("cell")) == 0  # the kept cells are judged by neither tier
    text, code = verdict(base, cur, fail_on_missing=True)
    assert code == 1 and "## Kept from other code" in text and "- fewshot / d4 / a final seed 0" in text
    assert "12 kept from other code" in text.splitlines()[4]


def test_a_zero_spread_is_floored_at_one_example():
    """Against other weights, three seeds that each lose the same one of 200 examples: no spread, but no evidence
    beyond one example; the comparison's sd is floored at 0.5 points (100 / 200), so its t is 0.5 / (0.5 / sqrt
    3)."""
    base = [record("vtab", "d1", "a", s, 60.0 + s, info={"test_examples": 200}) for s in range(3)]
    cur = other_weights(shifted(base, lambda r: -0.5))
    (c,) = gate(base, cur).of("cell")
    assert c.p == pytest.approx(2 * stats.t.sf(np.sqrt(3), 2)) and c.verdict == "unchanged"
    assert verdict(base, cur)[1] == 0
    # without the record's example count there is no quantum: p = 0, as before
    (c,) = gate([record("vtab", "d1", "a", s, 60.0 + s) for s in range(3)], cur).of("cell")
    assert c.p == 0.0


# --- the noise model ----------------------------------------------------------------------------------------------


def test_cells_that_scatter_beyond_arithmetic_fail_though_seeds_disagree_and_the_mean_stays():
    """Every run of backbone a moves by +-3 points at random (the seeds of a set disagree about the sign; the mean
    stays near 0): the pooled mean does not see it, the noise model does. Units are per (set, seed) means over the
    two shot counts, each allowed the variance (2 x 0.25)^2 (a runner up to twice as noisy as the model is the
    null); Q = sum u^2 / V on (24, 400) degrees of freedom."""
    base = suite(noise(), datasets=tuple(f"d{i}" for i in range(8)))
    sign = np.random.default_rng(11)
    runs = {}
    cur = shifted(
        base, lambda r: runs.setdefault((r["dataset"], r["seed"]), 3.0 * sign.choice([-1, 1])) * (r["backbone"] == "a")
    )
    g = gate(base, cur)
    by = {(c.kind, c.backbone): c for c in g.comparisons if c.kind in ("pooled", "noise")}
    assert by[("noise", "a")].verdict == "noise" and by[("noise", "b")].verdict == "unchanged"
    u = np.array([runs[k] for k in sorted(runs)])
    q = (u**2 / (2 * RMS) ** 2).sum()
    assert by[("noise", "a")].p == pytest.approx(stats.f.sf(q / 24, 24, 400))
    assert by[("noise", "a")].n == 24 and by[("noise", "a")].current == pytest.approx(np.sqrt((u**2).mean()))
    text, code = verdict(base, cur)
    assert code == 1 and "| fewshot | a          | accuracy | noise model |" in text
    # a task the model does not cover is untested: each comparison is listed, and fails unless allowed
    text, code = verdict(base, cur, noise={})
    assert code == 1 and "## Untested" in text and "32 untested (allow with --allow-untested)" in text


def test_a_shift_fails_against_the_models_variance_and_seeds_that_disagree_fail_the_spread():
    """One data set, three seeds, every run 2 points worse give or take a seed's 0.1: the pooled test is a t of the
    runs' mean change against the variance the model allows them. The same shift for the better is an improvement:
    it fails unless allowed. Seeds that disagree by 1.5 either way are beyond arithmetic: the spread test fails them,
    whatever the direction."""
    base = suite(noise(), backbones=("a",), datasets=("d1",))
    jitter = {0: 0.1, 1: -0.1, 2: 0.0}
    worse = shifted(base, lambda r: -2.0 + jitter[r["seed"]])
    g = gate(base, worse)
    (pooled,) = g.of("pooled")
    se = np.sqrt(3 * (2 * RMS) ** 2) / 3
    assert pooled.change == pytest.approx(-2.0) and pooled.p == pytest.approx(2 * stats.t.sf(2.0 / se, 400))
    assert pooled.verdict == "regressed" and verdict(base, worse)[1] == 1
    better = shifted(base, lambda r: 2.0 + jitter[r["seed"]])
    (p,) = gate(base, better).of("pooled")
    assert p.verdict == "improved" and verdict(base, better)[1] == 1
    assert verdict(base, better, allow_improvement=True)[1] == 0
    apart = shifted(base, lambda r: 2.0 + 15 * jitter[r["seed"]])
    (spread,) = gate(base, apart).of("spread")
    q = (1.5**2 + 1.5**2) / (2 * RMS) ** 2
    assert spread.p == pytest.approx(stats.f.sf(q / 2, 2, 400)) and spread.verdict == "spread"
    assert verdict(base, apart, allow_improvement=True)[1] == 1


def test_a_training_signal_fails_the_noise_test_at_ten_times_arithmetics_rms():
    """A probe's held-out loss has no unit of its own: beyond significance its noise test needs a root mean square
    change of SIGNAL_NOISE (10) times the model's (here 1e-4 on a loss of 4), far below the cell test's floor of 0.5%
    of the loss (0.02). Runs moved by about 20 times the model's rms fail the night; by about 5 times they pass."""
    from transferbench.gate.comparisons import LOSS_FLOOR, NOISE_TOLERANCE, SIGNAL_NOISE

    model = {"pretrain": {"train": {"loss_heldout": {"kernels": {"ms": 1e-8, "df": 400}}}}}

    def night(times):
        sides = []
        for move in (0.0, times * 1e-4):
            side = []
            for s in range(5):
                r = record("pretrain", "upstream", "mu4", s, 20.0)
                r["metrics"] = {"train": {"loss_heldout": 4.0 + 0.1 * s + move * (1 + 0.1 * s)}}
                side.append(r)
            sides.append(side)
        (n,) = gate(*sides, noise=model).of("noise")
        return n, verdict(*sides, noise=model)[1]

    loud, code = night(20)
    assert loud.verdict == "noise" and code == 1
    assert loud.floor == pytest.approx(SIGNAL_NOISE * 1e-4) and loud.baseline == pytest.approx(1e-4)
    assert loud.current < LOSS_FLOOR * 4.0  # a move the cell and pooled tests' floor would let through
    quiet, code = night(5)
    assert quiet.significant and quiet.verdict == "unchanged" and code == 0
    assert NOISE_TOLERANCE == 2.0


def test_a_runner_twice_as_noisy_as_the_model_alarms_at_most_alpha():
    """Nights whose arithmetic moves every comparison twice as far as the noise model's variants did (another CPU,
    other kernels than those measured): at most alpha of them fail, since every test's null allows NOISE_TOLERANCE
    (2) times the model's rms. Four times as noisy is beyond it: such a runner alarms on most nights, and must be
    measured into the model (docs/regression.md)."""
    rng = np.random.default_rng(17)
    base = suite(noise())
    model = {"fewshot": {"test": {"accuracy": {"kernels": {"ms": 0.3**2, "df": 10**6}}}}}
    rates = {}
    for times in (2.0, 4.0):
        nights, alarms = 300, 0
        for _ in range(nights):
            cur = shifted(base, lambda r, t=times: t * 0.3 * rng.normal())
            alarms += verdict(base, cur, floor=0.0, noise=model)[1]
        rates[times] = alarms / nights
    assert rates[2.0] <= stats.binom.ppf(0.999, 300, ALPHA) / 300, rates
    assert rates[4.0] > 0.5, rates
