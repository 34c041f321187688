"""Few-shot probe: big_vision's sampling and closed-form ridge against direct solves and hand cases,
leave-one-out l2 selection against refitting, the feature cache's misses, and the adapter end to end."""

import numpy as np
import pytest
import torch
from kit import cli

from transferbench.adapters.fewshot import (
    BIAS,
    fewshot_indices,
    ridge_accuracy,
    ridge_fit,
    ridge_probe,
    ridge_sweep_accuracy,
    select_l2,
)
from transferbench.backbones import create_backbone
from transferbench.engine import features
from transferbench.records.store import load_records


def direct_weights(x, y, num_classes, l2):
    """solve(XᵀX + l2·I, XᵀY) on the standardised design with the bias column."""
    mean, std = x.mean(0), x.std(0) + 1e-5
    X = np.hstack([(x - mean) / std, np.full((len(x), 1), BIAS)])
    Y = 2.0 * np.eye(num_classes)[y] - 1.0
    return np.linalg.solve(X.T @ X + l2 * np.eye(X.shape[1]), X.T @ Y), mean, std


def test_fewshot_indices_follow_one_generator_over_classes_in_order():
    labels = np.array([2, 0, 1, 0, 2, 1, 0, 2, 2])
    rng = np.random.default_rng(5)  # by hand: class 0, then 1, then 2 from one generator
    expected = [rng.permutation([1, 3, 6])[:2], rng.permutation([2, 5])[:2], rng.permutation([0, 4, 7, 8])[:2]]
    assert fewshot_indices(labels, 2, 5).tolist() == np.concatenate(expected).tolist()
    assert sorted(fewshot_indices(labels, 10, 0).tolist()) == list(range(9))  # short classes give all they have
    assert [labels[i] for i in fewshot_indices(labels, 1, 1)] == [0, 1, 2]


@pytest.mark.parametrize("n,d", [(60, 8), (12, 40)])  # N >= D (eigh of XᵀX) and N < D (eigh of XXᵀ)
def test_ridge_matches_a_direct_solve_in_both_branches(n, d):
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(n, d)) * rng.uniform(0.1, 5, d) + rng.normal(size=d), rng.integers(0, 3, n)
    r = ridge_fit(x, y, 3)
    assert r.primal == (n >= d + 1)
    for l2 in (1.0, 2.0**10):
        w, mean, std = direct_weights(x, y, 3, l2)
        assert np.allclose(r.weights(l2), w, rtol=1e-6, atol=1e-9)
        xt = rng.normal(size=(20, d))
        pred = np.argmax(np.hstack([(xt - mean) / std, np.full((20, 1), BIAS)]) @ w, axis=1)
        assert (r.predict(xt, l2) == pred).all()
        probe = ridge_probe(x, y, 3, l2)  # the one-l2 path (a linear solve, no eigh)
        assert np.allclose(probe.w, w, rtol=1e-6, atol=1e-9)
        assert (probe.predict(xt) == pred).all()
    # a sweep's test accuracies (one eigendecomposition, one product) are the direct solves' accuracies
    xt, yt = rng.normal(size=(200, d)) * 2, rng.integers(0, 3, 200)
    l2s = [1e-2, 1.0, 2.0**10, 1e6]
    direct = []
    for l2 in l2s:
        w, mean, std = direct_weights(x, y, 3, l2)
        direct.append(float((np.argmax(np.hstack([(xt - mean) / std, np.full((200, 1), BIAS)]) @ w, 1) == yt).mean()))
    assert ridge_sweep_accuracy(x, y, xt, yt, 3, l2s) == direct and len(set(direct)) > 1


def test_ridge_by_hand_on_a_tiny_case():
    # two 1-d points of two classes: standardised to -1 and +1, bias column 100.
    # X = [[-1, 100], [1, 100]], Y = [[1, -1], [-1, 1]]; XᵀX = diag(2, 20000), XᵀY = [[-2, 2], [0, 0]]
    # w = [[-2/(2+l2), 2/(2+l2)], [0, 0]]: a test point above the mean is class 1, below it class 0
    x, y = np.array([[3.0], [5.0]]), np.array([0, 1])
    r = ridge_fit(x, y, 2)
    assert np.allclose(r.weights(1.0), [[-2 / 3, 2 / 3], [0, 0]], atol=1e-4)
    assert ridge_accuracy(x, y, np.array([[2.0], [4.5], [9.0]]), np.array([0, 1, 1]), 2) == 1.0
    assert ridge_accuracy(x, y, np.array([[2.0], [4.5]]), np.array([1, 1]), 2) == 0.5


def test_leave_one_out_matches_refitting_without_each_example():
    rng = np.random.default_rng(1)
    n, d, k = 30, 5, 3
    y = np.repeat(np.arange(k), n // k)
    x = rng.normal(size=(n, d)) + 1.5 * np.eye(k, d)[y]
    r = ridge_fit(x, y, k)
    X = r.design(x)  # the standardisation is not refitted, as documented
    for l2 in (0.5, 30.0):
        hits = 0
        for i in range(n):
            keep = np.arange(n) != i
            w = np.linalg.solve(X[keep].T @ X[keep] + l2 * np.eye(d + 1), X[keep].T @ r.y[keep])
            hits += int(np.argmax(X[i] @ w) == y[i])
        assert r.loo_accuracy(l2) == pytest.approx(hits / n)
    dual = ridge_fit(x[:4], y[:4], k)  # N < D branch
    Xd = dual.design(x[:4])
    hits = sum(
        int(
            np.argmax(
                Xd[i]
                @ np.linalg.solve(
                    np.delete(Xd, i, 0).T @ np.delete(Xd, i, 0) + 7 * np.eye(d + 1),
                    np.delete(Xd, i, 0).T @ np.delete(dual.y, i, 0),
                )
            )
            == y[i]
        )
        for i in range(4)
    )
    assert dual.loo_accuracy(7.0) == pytest.approx(hits / 4)
    assert select_l2(r, [1024.0, 1e-3], 1) == (1024.0, "default (1 shot: leave-one-out has no class mate)")
    best, rule = select_l2(r, [1e6, 1.0], 10)
    assert rule == "leave-one-out" and best == (1e6 if r.loo_accuracy(1e6) >= r.loo_accuracy(1.0) else 1.0)


def test_cache_key_changes_with_everything_that_changes_features():
    base = dict(
        backbone="mu4",
        weights_sha256="a" * 64,
        transform={"resolution": 16, "resize_small": None},
        dataset={"name": "mini_digits", "version": "digits-v1"},
        split="train800",
    )
    key = features.cache_key(**base)
    assert features.cache_key(**base) == key
    for field, value in [
        ("weights_sha256", "b" * 64),
        ("backbone", "mu4_dpn"),
        ("split", "test"),
        ("transform", {"resolution": 32, "resize_small": None}),
        ("transform", {"resolution": 16, "resize_small": 18}),
        ("dataset", {"name": "mini_digits", "version": "digits-v2"}),
        ("pool", "gap"),
    ]:
        assert features.cache_key(**{**base, field: value}) != key, field


def test_adapter_end_to_end_with_cached_features(suite_home, tmp_path):
    # fp32 (bf16=off): the features are checked against an fp32 hand computation at fp32's tolerance, on every
    # CPU (under bf16 autocast they differ from it by up to 1e-3, and auto picks bf16 only where it is faster)
    line = "run fewshot --suite embedded --datasets mini_digits --backbone mu4 --seeds 0,1 --set shots=1,5 "
    line += "--set resolution=8 --set bf16=off --no-progress --out"
    torch.manual_seed(12345)
    assert cli(line, tmp_path) == 0
    recs = load_records([tmp_path / "fewshot"])
    assert len(recs) == 4 and all(r["status"] == "ok" for r in recs)
    assert sum(not all(r["info"]["cache_hit"].values()) for r in recs) == 1  # one extraction, then hits
    # recompute one cell by hand from the cached features
    from transferbench.adapters import prepare_task
    from transferbench.adapters.fewshot import FewshotAdapter  # noqa: F401

    task = prepare_task("fewshot", suite="embedded", sets=["resolution=8", "bf16=off"])
    ds = next(d for d in task.datasets if d.name == "mini_digits")
    ident = {"name": "mini_digits", "source": "embedded", "tfds": None, "set": "digits", "version": ds.version}
    assert all(r["info"]["bf16"] is False and r["info"]["bf16_choice"] == {"setting": "off"} for r in recs)
    tf = {"resolution": 8, "resize_square": None, "pixels": "inception", "bf16": False}
    load = lambda split: features.cached(
        features.cache_key(
            backbone="mu4",
            weights_sha256="random-init",  # noqa: E731
            transform=tf,
            dataset=ident,
            split=split,
            pool="gap",
        ),
        None,
    )  # the embedded suite's pooling
    (trx, tr_y, hit1), (tex, te_y, hit2) = load("train800"), load("test")
    assert hit1 and hit2 and trx.shape == (800, 128)
    rec = next(r for r in recs if r["seed"] == 1 and r["hparams"]["shots"] == 5)
    idx = fewshot_indices(tr_y, 5, 1)
    assert rec["info"]["train_examples"] == 50 == len(idx)
    assert rec["metrics"]["test"]["accuracy"] == pytest.approx(100 * ridge_accuracy(trx[idx], tr_y[idx], tex, te_y, 10))
    # random-init features are cached under 'random-init': they must be one fixed draw (torch seed 0), not
    # whatever the process's global RNG held when the cell ran (here: seed 12345, set before `main`)
    from transferbench.data.sources import open_split
    from transferbench.data.transforms import eval_transform

    torch.manual_seed(0)
    model = create_backbone("mu4", img_size=8)  # mu4 pools the cls token; the suite probes the patch-token mean
    data = open_split({"name": "mini_digits", "source": "embedded", "set": "digits"}, "test")
    with torch.inference_mode():
        x = torch.stack([eval_transform(8)(data.image(i)) for i in range(16)])
        tokens = model.eval().forward_features(x).float()
    assert model.pool == "tok" and not torch.allclose(tokens[:, 0], tokens[:, 1:].mean(1))
    np.testing.assert_allclose(tokens[:, 1:].mean(1).numpy(), tex[:16], rtol=0, atol=1e-5)
