"""The statistical tier across machines: the moderated variance, its calibration by simulation, declared metrics and
the corners that used to pass a broken night. The faults are applied to a copy of the committed nightly records
(results/nightly) whose current side carries another machine's arithmetic, so that no cell can be judged exactly."""

import copy
import math

import numpy as np
import pytest

from benchmarks.gate_floor import FAILING, NIGHTLY, other_machine, worsen
from transferbench.records.gate import decide
from transferbench.records.stats import holm, moderated_difference, variance_prior
from transferbench.records.store import load_records

TASKS = ("vtab", "fewshot", "hires", "lit", "ade20k", "pretrain", "imagenet_c", "diagnose")


@pytest.fixture(scope="module")
def committed():
    records = [r for r in load_records([NIGHTLY]) if r["status"] == "ok"]
    assert {r["task"] for r in records} == set(TASKS)
    return records


def worsen_every_task(records, size=2.0):
    """Every metric of every task worse by `size` points (2% of the value where its floor is relative, twice its
    floor where it is in its own units), each seed's change varying by +-20% (benchmarks.gate_floor.worsen)."""
    for task in TASKS:
        worsen(records, task, size)
    return records


def failing_tasks(verdict) -> set:
    return {c.task for c in verdict.gate.comparisons if c.verdict in FAILING}


# --- the statistics ----------------------------------------------------------------------------------------------


def test_holm_refuses_nan():
    # a NaN p-value sorted among the others used to count as a rejection and shift every later threshold
    assert holm([0.001, None, 0.5], 0.05) == [True, False, False]
    with pytest.raises(ValueError, match="NaN"):
        holm([0.001, math.nan, 0.5], 0.05)


def test_variance_prior_recovers_a_known_scaled_inverse_chi_square():
    # true variances s0^2 d0 / chi2(d0) with d0 = 6, s0^2 = 2; each observed on 2 degrees of freedom (3 seeds)
    rng = np.random.default_rng(0)
    true = 6 * 2.0 / rng.chisquare(6, 20000)
    observed = true * rng.chisquare(2, 20000) / 2
    s0, d0 = variance_prior(observed, [2] * 20000)
    assert s0 == pytest.approx(2.0, rel=0.06) and d0 == pytest.approx(6.0, rel=0.2)
    # one common variance: the prior's degrees of freedom are (near) infinite, the prior the variance
    s0, d0 = variance_prior(3.0 * rng.chisquare(2, 20000) / 2, [2] * 20000)
    assert s0 == pytest.approx(3.0, rel=0.05) and d0 > 100
    assert variance_prior([1.0, 0.0, 2.0], [2, 2, 2]) == (pytest.approx(math.nan, nan_ok=True), 0.0)


@pytest.mark.parametrize("d0", [4.0, math.inf])
def test_the_moderated_t_holds_its_level_and_its_interval_covers(d0):
    """Null nights of 200 comparisons over 3 seeds whose true variances differ (scaled inverse chi-square, d0) or
    not: p < 0.05 in 5% of comparisons, the 95% interval covering the true mean (0) in 95%, the two from one t."""
    rng = np.random.default_rng(1)
    rejected, covered, total = 0, 0, 0
    for _ in range(60):
        var = 1.5 * (d0 / rng.chisquare(d0, 200) if math.isfinite(d0) else np.ones(200))
        diffs = rng.normal(0.0, np.sqrt(var)[:, None], (200, 3))
        prior = variance_prior(diffs.var(axis=1, ddof=1), [2] * 200)
        for row in diffs:
            e = moderated_difference(row, prior)
            rejected += e.p < 0.05
            covered += e.low <= 0 <= e.high
            assert (e.p < 0.05) == (not e.low <= 0 <= e.high)  # mark, interval and p-value of one test
            total += 1
    assert 0.040 < rejected / total < 0.060
    assert 0.940 < covered / total < 0.960


def test_one_seed_is_tested_on_the_prior_and_no_prior_is_the_plain_t():
    e = moderated_difference([1.0], (0.25, math.inf))  # sd 0.5 from the prior, z = 2
    assert e.p == pytest.approx(0.0455, abs=1e-3)
    plain = moderated_difference([1.0, 2.0, 3.0], (math.nan, 0.0))
    assert plain.df == 2 and plain.se == pytest.approx(1 / math.sqrt(3))


# --- faults on the committed nightly, judged across arithmetic --------------------------------------------------


def test_nothing_changed_but_the_machine_passes(committed):
    v = decide(committed, other_machine(committed))
    assert v.code == 0, v.reasons
    assert v.gate.exact.judged == 0 and v.gate.tests > 0


def test_a_uniform_two_point_worsening_fails_in_every_task_across_arithmetic(committed):
    v = decide(committed, worsen_every_task(other_machine(committed)))
    assert v.code == 1
    assert failing_tasks(v) == set(TASKS)


@pytest.mark.parametrize(
    "what, task, metric, change",
    [
        ("a diagnostic that falls is changed, not better", "diagnose", "embed_grad_norm", lambda v: v * 0.6),
        ("a cosine has its own floor, not 0.5 points", "diagnose", "patch_cosine", lambda v: v + 0.2),
        ("a secondary LiT metric", "lit", "t2i_r5", lambda v: v - 3.0),
        ("an ImageNet-C severity", "imagenet_c", "error_5", lambda v: v + 3.0),
        ("ADE20K's pixel accuracy", "ade20k", "aacc", lambda v: v - 3.0),
    ],
)
def test_every_declared_metric_is_compared(committed, what, task, metric, change):
    cur = other_machine(committed)
    for r in cur:
        if r["task"] == task and metric in r["metrics"].get("test", {}):
            r["metrics"]["test"][metric] = change(r["metrics"]["test"][metric])
    v = decide(committed, cur)
    assert v.code == 1, what
    assert any(c.task == task and c.metric == metric and c.verdict == "regressed" for c in v.gate.comparisons), what


def test_a_non_finite_value_fails_and_is_named(committed):
    cur = other_machine(committed)
    lit = [r for r in cur if r["task"] == "lit"][:6]
    for r in lit:
        r["metrics"]["test"]["i2t_r5"] = math.nan
    v = decide(committed, cur)
    assert v.code == 1 and "6 non-finite values" in v.reasons


def test_a_renamed_main_metric_and_an_empty_comparison_fail(committed):
    cur = other_machine(committed)
    for r in cur:
        if r["task"] in ("fewshot", "vtab"):
            r["metrics"] = {s: {f"{k}_v2": x for k, x in m.items()} for s, m in r["metrics"].items()}
            r["metric"] = "accuracy_v2"
    v = decide(committed, cur)
    assert v.code == 1 and any("cells or metrics missing" in x for x in v.reasons)
    fewshot = [r for r in committed if r["task"] == "fewshot"]
    moved = [dict(r, task="fewshot_v2") for r in other_machine(fewshot)]
    v = decide(fewshot, moved, allow_missing=True)
    assert v.reasons == ["nothing compared"]


def test_a_consistent_small_shift_fails(committed):
    # every few-shot comparison 0.24 points worse: under every cell's floor, yet all of them worse is no chance
    cur = other_machine(committed)
    for r in cur:
        if r["task"] == "fewshot":
            r["metrics"]["test"]["accuracy"] -= 0.24
    v = decide(committed, cur)
    assert v.code == 1
    assert any(c.kind == "shift" and c.task == "fewshot" and c.verdict == "shift" for c in v.gate.comparisons)


def test_seeds_that_move_both_ways_fail_beyond_arithmetic(committed):
    # one backbone's few-shot seeds +2, -2, 0 in every cell: no mean moves, the runs do, far beyond arithmetic
    cur = other_machine(committed)
    backbone = sorted({r["backbone"] for r in committed if r["task"] == "fewshot"})[0]
    for r in cur:
        if r["task"] == "fewshot" and r["backbone"] == backbone:
            r["metrics"]["test"]["accuracy"] += {0: 2.0, 1: -2.0}.get(int(r["seed"]) % 3, 0.0)
    v = decide(committed, cur)
    assert v.code == 1
    assert any(c.task == "fewshot" and c.verdict == "noise" for c in v.gate.comparisons)


def test_groups_exist_in_shared_seed_tasks_so_a_swap_of_corruptions_fails(committed):
    # fog and zoom_blur's results swapped: ImageNet-C's mean error stays where it was (one run per seed serves every
    # corruption, so the runs were once the only units and no moved test existed); its corruptions are groups now
    cur = other_machine(committed)
    by = {}
    for r in cur:
        if r["task"] == "imagenet_c" and r["hparams"].get("corruption") in ("fog", "zoom_blur"):
            by[(r["backbone"], r["seed"], r["hparams"]["corruption"])] = r
    assert len(by) == 18
    for (backbone, seed, corruption), r in by.items():
        if corruption == "fog":
            other = by[(backbone, seed, "zoom_blur")]
            r["metrics"], other["metrics"] = copy.deepcopy(other["metrics"]), copy.deepcopy(r["metrics"])
    v = decide(committed, cur)
    assert v.code == 1
    moved = [c for c in v.gate.comparisons if c.task == "imagenet_c" and c.kind == "moved"]
    assert moved and any(c.verdict in ("moved", "see pooled") for c in moved)


def test_a_fault_in_one_stage_alone_fails(committed):
    # hires' high-resolution stage 6 points worse on every seed, its base stage untouched: the pooled mean halves it
    # (-3.0, once "unchanged"), and a cell whose seeds all lost the same is floored at one test example; the moved
    # test over the two stages sees it in every backbone
    cur = other_machine(committed)
    for r in cur:
        if r["task"] == "hires" and r["stage"] == "high":
            r["metrics"]["test"]["accuracy"] -= 6.0
    v = decide(committed, cur)
    assert v.code == 1
    moved = [c for c in v.gate.comparisons if c.task == "hires" and c.kind == "moved"]
    assert len(moved) == 3 and all(c.verdict == "moved" and c.low == pytest.approx(-6.0) for c in moved)
