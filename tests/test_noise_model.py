"""The statistical tier's null across arithmetic: the noise model measured on benign arithmetic (gate.noise,
benchmarks/noise_model.py), and the tests that judge a comparison against it (gate.comparisons, gate.broad):
each is the hand computation it claims, holds its level and its interval's coverage by simulation at the seed counts
the nightly runs, and nothing drops out of it silently."""

import math

import kit
import numpy as np
import pytest
from scipy import stats

from transferbench.errors import UserError
from transferbench.gate import noise
from transferbench.gate.broad import poisson_binomial_test
from transferbench.gate.comparisons import ALPHA, NOISE_TOLERANCE, family
from transferbench.gate.decide import decide, gate
from transferbench.gate.noise import Model, Noise, code_digests, measure, resolution


def rec(
    value,
    *,
    task="fewshot",
    dataset="d1",
    backbone="a",
    seed=0,
    shots=1,
    precision="fp32",
    split="test",
    metric="accuracy",
    examples=1000,
    modules=None,
    **extra,
):
    info = {f"{split}_examples": examples} if examples else {}
    r = kit.record(
        task,
        dataset,
        backbone,
        seed,
        {split: {metric: value}},
        hparams={"shots": shots, "l2": 1024.0},
        info=info,
        suite="nightly",
        finished_at="2026-11-28T00:00:00",
        **extra,
    )
    r["arithmetic"] = {"digest": precision, "machine": {"digest": "m"}, "cell": {"precision": [precision]}}
    if modules:
        r["fingerprint"] = {"digest": "f", "modules": modules, "libraries": {}}
    return r


def side(values, **kw):
    """Records of one backbone: values[(dataset, shots, seed)] -> accuracy."""
    return [rec(v, dataset=ds, shots=k, seed=s, **kw) for (ds, k, s), v in values.items()]


def D(base, cur, **kw):
    """The decision between two sides of other arithmetic (the exact tier has nothing to judge)."""
    return decide(base, cur, exact=False, **kw)


def G(base, cur, **kw):
    return gate(base, cur, exact=False, **kw)


def model_of(ms, df=500, task="fewshot", split="test", metric="accuracy", kind="kernels", **kw):
    return Model.of({"tasks": {task: {split: {metric: {kind: {"ms": ms, "df": df, **kw}}}}}})


# --- the model -------------------------------------------------------------------------------------------------


def test_the_model_keeps_the_largest_mean_square_per_kind_with_its_changes_mean_and_sign():
    cells = [(ds, k, s) for ds in ("d1", "d2") for k in (1, 5) for s in (0, 1, 2)]
    clean = side({c: 50.0 for c in cells})
    rng = np.random.default_rng(0)
    small = {c: 50.0 + 0.1 * rng.normal() for c in cells}
    large = {c: 50.0 + 0.5 * rng.normal() for c in cells}
    bf16 = {c: 50.0 - 0.3 + 0.1 * rng.normal() for c in cells}
    model = measure(
        clean,
        [
            ("small", "", "kernels", side(small)),
            ("large", "", "kernels", side(large)),
            ("bf16", "", "precision", side(bf16, precision="bf16")),
        ],
        suite="nightly",
        commit="abc",
    )
    kernels = model["tasks"]["fewshot"]["test"]["accuracy"]["kernels"]
    d = np.array([large[c] - 50.0 for c in cells])
    assert kernels["variant"] == "large" and kernels["df"] == 12
    assert kernels["ms"] == pytest.approx(np.mean(d**2)) and kernels["mean"] == pytest.approx(d.mean())
    precision = model["tasks"]["fewshot"]["test"]["accuracy"]["precision"]
    d = np.array([bf16[c] - 50.0 for c in cells])
    assert precision["ms"] == pytest.approx(np.mean(d**2)) and precision["worse"] == pytest.approx(np.mean(d < 0))
    assert [v["name"] for v in model["variants"]] == ["small", "large", "bf16"]


def test_a_model_measured_on_other_code_is_refused_in_one_line_naming_the_command():
    base = [rec(50.0, modules={"transferbench.adapters.fewshot": "1" * 16})]
    cur = [rec(51.0, modules={"transferbench.adapters.fewshot": "1" * 16})]
    m = Model.of({"tasks": model_of(0.01).tasks, "code": code_digests(base), "commit": "b8faea3"})
    assert len(D(base, cur, noise=m).gate.of("cell")) == 1  # the baseline's code is the model's: judged
    m.code["fewshot"] = "0" * 16
    with pytest.raises(UserError, match=r"python -m benchmarks.noise_model") as e:
        D(base, cur, noise=m)
    assert "\n" not in str(e.value) and "fewshot" in str(e.value)


def test_the_packaged_model_covers_the_nightly_and_names_its_code_variants_and_date():
    from benchmarks.gate_floor import NIGHTLY
    from transferbench.anchor import anchor_commit
    from transferbench.records.store import load_records

    anchor = [r for r in load_records([NIGHTLY]) if r["status"] == "ok"]
    m = noise.packaged()
    assert m.about["commit"] == anchor_commit(anchor)[0] and m.about["suite"] == "nightly" and m.about["date"]
    assert m.code == code_digests(anchor)  # measured on the anchor's own code
    cpu = {"two_threads", "aten_default", "onednn_off", "bf16_on"}
    assert cpu <= {v["name"] for v in m.about["variants"]}
    judged = {
        (r["task"], split, metric)
        for r in anchor
        for split, values in r["metrics"].items()
        for metric in values
        if noise.judged(r["task"], r["dataset"], metric)
    }
    missing = [j for j in judged if "kernels" not in m.tasks.get(j[0], {}).get(j[1], {}).get(j[2], {})]
    assert not missing  # scalar kernels measured every judged metric
    # every task that autocasts has its bf16-against-fp32 kind; every task its other processor
    assert all("precision" in m.tasks[t]["test"]["accuracy"] for t in ("fewshot", "lit", "imagenet_c"))
    assert all("cpu" in m.tasks[t]["test"]["accuracy"] for t in ("vtab", "hires", "pretrain"))
    assert {v["kind"] for v in m.about["variants"]} == {"cpu", "kernels", "threads", "onednn", "precision"}


def test_resolution_is_one_example_one_severity_example_or_one_float32_ulp():
    r = rec(70.0, examples=797)
    assert resolution(r, "test", "accuracy", 70.0) == pytest.approx(100 / 797)
    c = kit.record("imagenet_c", "d", "b", 0, {"test": {"error_3": 40.0}}, info={"eval_examples_per_severity": 300})
    assert resolution(c, "test", "error_3", 40.0) == pytest.approx(100 / 300)
    assert resolution(c, "test", "error", 40.0) == pytest.approx(100 / 1500)
    p = kit.record("pretrain", "upstream", "mu4", 0, {"train": {"target_entropy": 1.9}})
    assert resolution(p, "train", "target_entropy", 1.9) == float(np.spacing(np.float32(1.9)))


def test_a_signal_moved_by_one_float32_ulp_passes_and_by_one_percent_fails():
    def pretrain(v, seed):
        r = kit.record("pretrain", "upstream", "mu4", seed, {"train": {"target_entropy": v}}, suite="nightly")
        r["arithmetic"] = {"digest": "x", "machine": {"digest": "m"}, "cell": {"precision": ["fp32"]}}
        return r

    base = [pretrain(1.9, s) for s in range(5)]
    m = model_of(0.0, task="pretrain", split="train", metric="target_entropy")  # never moved in the model
    ulp = [pretrain(float(np.nextafter(np.float32(1.9), np.float32(2))), s) for s in range(5)]
    assert D(base, ulp, noise=m).code == 0
    assert D(base, [pretrain(1.9 * 1.01, s) for s in range(5)], noise=m).code == 1


# --- the tests against the model ---------------------------------------------------------------------------------


def test_a_cell_is_a_t_against_the_models_variance_and_one_seed_is_testable():
    base = side({("d1", 1, s): 50.0 for s in (0, 1, 2)})
    cur = side({("d1", 1, 0): 49.0, ("d1", 1, 1): 49.6, ("d1", 1, 2): 49.2})
    (c,) = G(base, cur, noise=model_of(0.04, df=300)).of("cell")
    v = NOISE_TOLERANCE**2 * max(0.04, (100 / 1000) ** 2)
    mean = (-1.0 - 0.4 - 0.8) / 3
    t = mean / math.sqrt(v / 3)
    assert c.change == pytest.approx(mean) and c.p == pytest.approx(2 * stats.t.sf(abs(t), 300))
    half = stats.t.ppf(0.975, 300) * math.sqrt(v / 3)
    assert (c.low, c.high) == pytest.approx((mean - half, mean + half))
    (one,) = G(base[:1], cur[:1], noise=model_of(0.04, df=300)).of("cell")
    assert one.n == 1 and one.p == pytest.approx(2 * stats.t.sf(1.0 / math.sqrt(v), 300))


@pytest.mark.parametrize("true_scale, at_least", [(1.0, 0.95), (NOISE_TOLERANCE, 0.94)])
def test_the_cell_interval_covers_95_percent_at_three_seeds_by_simulation(true_scale, at_least):
    """A runner as noisy as the model, and one twice as noisy (the tolerance): the interval of a 3-seed cell covers
    the true change (0) at least 95% of the time (exactly 95% at the tolerance), and the p-value and the interval
    are one test's: p < 0.05 exactly where the interval excludes 0."""
    rng = np.random.default_rng(1)
    ms = 0.09
    m = model_of(ms, df=400)
    base = side({("d1", 1, s): 50.0 for s in (0, 1, 2)}, examples=0)
    covered = agree = 0
    n = 2000
    for _ in range(n):
        cur = side({("d1", 1, s): 50.0 + true_scale * math.sqrt(ms) * rng.normal() for s in (0, 1, 2)}, examples=0)
        (c,) = G(base, cur, noise=m).of("cell")
        covered += c.low <= 0 <= c.high
        agree += (c.p < 0.05) == (not c.low <= 0 <= c.high)
    assert covered / n >= at_least and agree == n
    if true_scale == NOISE_TOLERANCE:
        assert abs(covered / n - 0.95) < 0.015


def test_the_spread_test_sees_seeds_that_disagree_by_hand():
    # seeds +2, -2, 0 in every set: no mean moves; the deviations over seeds against the model's variance do
    cells = {(f"d{i}", 1, s): 50.0 for i in range(4) for s in (0, 1, 2)}
    base = side(cells)
    cur = side({c: v + {0: 2.0, 1: -2.0, 2: 0.0}[c[2]] for c, v in cells.items()})
    m = model_of(0.01, df=300)
    g = G(base, cur, noise=m)
    (spread,) = g.of("spread")
    var = NOISE_TOLERANCE**2 * max(0.01, 0.1**2)
    q = 4 * (2.0**2 + 2.0**2 + 0.0) / var
    assert spread.n == 8 and spread.p == pytest.approx(stats.f.sf(q / 8, 8, 300))
    assert spread.change == pytest.approx(math.sqrt(4 * 8 / 8)) and spread.verdict == "spread"
    (pooled,) = g.of("pooled")
    assert pooled.change == pytest.approx(0.0) and pooled.verdict == "unchanged"


def test_the_gate_holds_its_level_against_a_runner_twice_as_noisy_as_the_model():
    """300 simulated nights of a 4-set, 2-shot, 3-seed suite of two backbones whose every run moves by the model's
    noise at twice its rms (normal, one draw per run shared by its comparisons: the correlation the run-level tests
    must survive): the night fails on at most alpha of them (binomial allowance)."""
    rng = np.random.default_rng(2)
    ms = 0.05
    m = model_of(ms, df=400)
    cells = {(f"d{i}", k, s): 60.0 + i for i in range(4) for k in (1, 5) for s in (0, 1, 2)}
    base = side(cells, examples=0) + side(cells, backbone="b", examples=0)
    alarms = 0
    for _ in range(300):
        z = {}
        cur = []
        for r in base:
            d = z.setdefault((r["backbone"], r["dataset"], r["seed"]), NOISE_TOLERANCE * math.sqrt(ms) * rng.normal())
            cur.append(
                rec(
                    r["metrics"]["test"]["accuracy"] + d,
                    dataset=r["dataset"],
                    backbone=r["backbone"],
                    seed=r["seed"],
                    shots=r["hparams"]["shots"],
                    examples=0,
                )
            )
        alarms += D(base, cur, noise=m, floor=0.0).code
    assert alarms <= stats.binom.ppf(0.99, 300, ALPHA)


def test_the_shift_test_is_a_poisson_binomial_and_one_that_cannot_fire_leaves_the_family():
    p, reach = poisson_binomial_test(8, [0.5] * 10)
    assert p == pytest.approx(stats.binomtest(8, 10, 0.5).pvalue) and reach == pytest.approx(2 * 0.5**10)
    # across precisions the model says bf16 gets worse 80% of the time: 8 of 10 worse is what it expects
    p, _ = poisson_binomial_test(8, [0.8] * 10)
    assert p > 0.5
    # a share measured as 1 on 9 changes is shrunk to 9.5 / 10: one change the other way is unlikely, not impossible
    assert Noise(ms=1.0, df=9, worse=1.0, moved=9).shrunk_worse == pytest.approx(0.95)
    assert poisson_binomial_test(8, [0.95] * 9)[0] > 0
    # six comparisons can reach p = 1/32 at best: against alpha/2 = 0.005 it can never fire, so it is left out and
    # the family's other test keeps its full level
    from types import SimpleNamespace as NS

    t = [NS(reach=1 / 32, p=1 / 32), NS(reach=0.0, p=0.004)]
    assert family(t, 0.005) == [t[1]]


def test_a_shift_across_precisions_is_tested_against_the_models_sign_bias():
    cells = {(f"d{i}", k, s): 60.0 for i in range(7) for k in (1, 5, 10) for s in (0, 1, 2)}
    base = side(cells)
    rng = np.random.default_rng(3)
    # bf16 against fp32: the model says 90% of changes go worse by 0.2 on average; tonight does just that
    m = Model.of(
        {
            "tasks": {
                "fewshot": {
                    "test": {
                        "accuracy": {
                            "kernels": {"ms": 0.01, "df": 400},
                            "precision": {"ms": 0.05, "df": 400, "mean": -0.2, "worse": 0.9},
                        }
                    }
                }
            }
        }
    )
    cur = side({c: v - 0.2 + 0.01 * rng.normal() for c, v in cells.items()}, precision="bf16")
    shift = G(base, cur, noise=m).of("shift")
    assert shift and all(x.verdict != "shift" for x in shift)
    # in one precision the same shift is no chance
    cur = side({c: v - 0.2 + 0.01 * rng.normal() for c, v in cells.items()})
    assert any(x.verdict == "shift" for x in G(base, cur, noise=m).of("shift"))


# --- nothing drops out silently --------------------------------------------------------------------------------


def test_a_null_metric_fails_as_non_finite_and_is_named():
    from transferbench.reporting.regress import report

    base = side({("d1", 1, s): 50.0 for s in (0, 1, 2)})
    cur = side({("d1", 1, s): 50.0 for s in (0, 1, 2)})
    cur[0]["metrics"]["test"]["accuracy"] = None
    v = D(base, cur, noise=model_of(0.01))
    assert v.code == 1 and "1 non-finite values" in v.reasons
    assert "d1 / a final seed 0: test accuracy" in report(v.gate, reasons=v.reasons)


def test_a_baseline_cell_that_failed_fails_the_night_listed():
    base = side({("d1", 1, s): 50.0 for s in (0, 1, 2)})
    base[1]["status"] = "failed"
    cur = side({("d1", 1, s): 50.0 for s in (0, 1, 2)})
    v = D(base, cur, noise=model_of(0.01))
    assert v.code == 1 and "1 cells failed in the baseline" in v.reasons
    assert [k.seed for k in v.gate.baseline_failed] == [1]


def test_an_untested_comparison_fails_unless_allowed_and_the_verdict_line_counts_it():
    from transferbench.reporting.regress import report

    base = side({(d, 1, s): 50.0 for d in ("d1", "d2") for s in (0, 1, 2)})
    base += side({("d1", 1, s): 90.0 for s in (0, 1, 2)}, metric="top5")  # a metric the model holds nothing for
    cur = [dict(r) for r in base]
    v = D(base, cur, noise=model_of(0.01))
    assert v.code == 1 and "1 untested (allow with --allow-untested)" in v.reasons
    text = report(v.gate, reasons=v.reasons)
    assert "1 untested" in text.splitlines()[2] and "## Untested" in text and "test top5" in text
    assert D(base, cur, noise=model_of(0.01), allow_untested=True).code == 0
    # a kind of difference the model never measured for a metric takes the widest it holds: tested, not untested
    bf16 = side({(d, 1, s): 50.0 for d in ("d1", "d2") for s in (0, 1, 2)}, precision="bf16")
    (c, *_) = G(base[:6], bf16, noise=model_of(0.01)).of("cell")
    assert c.p is not None and c.variance == pytest.approx(4 * max(0.01, 0.1**2))


def test_lits_retrieval_numbers_are_compared_once():
    metrics = {"accuracy": 9.7, "recall@5": 37.6, "t2i_r1": 9.7, "t2i_r5": 37.6, "i2t_r1": 9.5, "i2t_r5": 15.9}
    base = [kit.record("lit", "heldout_t2i", "b", s, {"test": dict(metrics)}, suite="nightly") for s in (0, 1, 2)]
    m = Model.of({"tasks": {"lit": {"test": {k: {"kernels": {"ms": 0.01, "df": 100}} for k in metrics}}}})
    names = sorted(c.metric for c in G(base, base, noise=m).of("cell"))
    assert names == ["accuracy", "recall@5"]


# --- scoped escape hatches ------------------------------------------------------------------------------------------


def test_allow_missing_names_absent_tasks_not_dropped_seeds_or_vanished_metrics():
    base = side({("d1", 1, s): 50.0 for s in (0, 1, 2)}) + side({("d1", 1, s): 50.0 for s in (0, 1, 2)}, backbone="b")
    m = model_of(0.01)
    dropped = base[:2] + base[3:]  # backbone a lost its seed 2
    assert D(base, dropped, noise=m, allow_missing=["fewshot"]).code == 1
    assert D(base, dropped, noise=m, allow_missing=["cells:fewshot:a"]).code == 0
    absent = base[3:]  # backbone a altogether
    assert D(base, absent, noise=m, allow_missing=["fewshot:a"]).code == 0
    for r in base:
        r["metrics"]["test"]["top5"] = 90.0
    renamed = [dict(r, metrics={"test": {"accuracy": 50.0, "top5_v2": 90.0}}) for r in base]
    assert D(base, renamed, noise=m, allow_missing=["fewshot"]).code == 1
    assert D(base, renamed, noise=m, allow_missing=["metric:fewshot:top5"]).code == 0


def test_allow_improvement_is_scoped_to_a_task_backbone_or_metric():
    cells = {(f"d{i}", 1, s): 50.0 for i in range(4) for s in (0, 1, 2)}
    base = side(cells) + side(cells, backbone="b")
    cur = side({c: v + 5 for c, v in cells.items()}) + side(cells, backbone="b")
    m = model_of(0.01)
    assert D(base, cur, noise=m).code == 1
    assert D(base, cur, noise=m, allow_improvement=["fewshot:b"]).code == 1
    assert D(base, cur, noise=m, allow_improvement=["fewshot:a"]).code == 0
    assert D(base, cur, noise=m, allow_improvement=["fewshot:a:accuracy"]).code == 0
    assert D(base, cur, noise=m, allow_improvement=["vtab"]).code == 1


def test_a_meant_change_of_a_diagnostic_has_a_path_across_machines():
    def diag(v, seed, module_hash):
        r = kit.record("diagnose", "d", "b", seed, {"test": {"token_norm": v}}, suite="nightly")
        r["arithmetic"] = {"digest": module_hash, "machine": {"digest": module_hash}, "cell": {"precision": ["fp32"]}}
        r["fingerprint"] = {"digest": module_hash, "modules": {"transferbench.backbones.measures": module_hash}}
        return r

    base = [diag(10.0 + 0.1 * s, s, "a" * 16) for s in range(3)]
    cur = [diag(11.0 + 0.1 * s, s, "b" * 16) for s in range(3)]  # another machine, the measure changed: +10%
    m = model_of(1e-6, task="diagnose", metric="token_norm")
    assert D(base, cur, noise=m).code == 1
    ok = D(base, cur, noise=m, accept_code=[f"backbones.measures@{'b' * 16}"])
    assert ok.code == 0 and any(c.verdict == "accepted" for c in ok.gate.comparisons)
    # a second change of the module has another fingerprint: the ledger's entry no longer covers it
    assert D(base, cur, noise=m, accept_code=[f"backbones.measures@{'c' * 16}"]).code == 1


def test_a_rolling_baseline_is_filtered_to_the_anchors_cells():
    """A suite that shrinks on purpose (the anchor re-made without a data set) passes against a rolling baseline
    that still holds the dropped cells: they are not expected tonight."""
    from transferbench.night import anchor_cells

    last = side({(d, 1, s): 50.0 for d in ("d1", "d2") for s in (0, 1)})
    anchor = side({("d1", 1, s): 50.0 for s in (0, 1)})
    kept = anchor_cells(last, anchor)
    assert sorted((r["dataset"], r["seed"]) for r in kept) == [("d1", 0), ("d1", 1)]
    tonight = side({("d1", 1, s): 50.0 for s in (0, 1)})
    assert D(last, tonight, noise=model_of(0.01)).code == 1  # unfiltered: d2 missing
    assert D(kept, tonight, noise=model_of(0.01)).code == 0
