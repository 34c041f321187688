"""Few-shot linear probes on frozen features: big_vision's `fewshot_lsr` evaluator (docs/fewshot.md).

Per (dataset, shots, seed): take `shots` training examples of every class (`fewshot_indices`), fit a
closed-form ridge regression on their standardised pre-logits (`ridge_accuracy`) and report test
accuracy. Features come from the content-addressed cache (engine.features), so every (shots, seed)
cell of a backbone and dataset reuses one extraction.

The solver: standardise with the few-shot train mean and std (+1e-5), append a constant feature 100.0
(a nearly unregularised bias), regress 2·onehot − 1 with ridge l2 (default 2**10, the paper's). One l2
(the default protocol) is one linear solve with XᵀX + l2·I (N >= D) or XXᵀ + l2·I (N < D):
`ridge_probe`. An l2 sweep goes through one eigendecomposition of the same matrix, after which every
further l2 costs one matrix product: `ridge_fit`.

Optional l2 selection (`l2_sweep`, off by default): each candidate is scored by leave-one-out accuracy
on the shots themselves, in closed form from the same eigendecomposition (prediction without example i
= (ŷ_i − h_ii·y_i) / (1 − h_ii), H the ridge hat matrix; the standardisation is not refitted). The best
score wins, ties going to the earlier candidate. With 1 shot a left-out example has no class mate, so
the default l2 is kept and the record says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..arithmetic import output
from ..data.sources import DatasetEntry, missing_data, open_split
from ..data.sources import missing as find_missing
from ..data.transforms import eval_transform
from ..engine.features import FrozenFeatures
from ..settings.fewshot import DEFAULT_L2, FewshotSettings
from .base import Adapter, plan_select_then_final

BIAS = 100.0


def fewshot_indices(labels, shots: int, seed: int) -> np.ndarray:
    """Indices of `shots` examples per class (fewer where a class has fewer): one
    `np.random.default_rng(seed)` permutes each class's indices in turn, classes in ascending order,
    and the first `shots` are taken — big_vision's sampling."""
    labels = np.asarray(labels)
    rng = np.random.default_rng(seed)
    num_classes = int(labels.max()) + 1 if len(labels) else 0
    per_class = [rng.permutation(np.flatnonzero(labels == c)) for c in range(num_classes)]
    return np.concatenate([idx[:shots] for idx in per_class]) if per_class else np.zeros(0, np.int64)


def _standardise(train_x) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The design (standardised features, bias column BIAS) in float64, with the mean and std used
    (np.std's arithmetic, one float64 buffer worked in place)."""
    x = np.asarray(train_x)
    design = np.empty((len(x), x.shape[1] + 1))
    feats = design[:, :-1]
    feats[...] = x
    mean = feats.mean(0, keepdims=True)
    feats -= mean
    std = np.sqrt(np.mean(feats * feats, 0, keepdims=True)) + 1e-5
    feats /= std
    design[:, -1] = BIAS
    return design, mean, std


def _targets(train_y, num_classes: int) -> np.ndarray:
    return 2.0 * np.eye(num_classes)[np.asarray(train_y)] - 1.0


@dataclass
class Probe:
    """A fitted linear probe: weights `w` (D + 1, K) on the standardised design of `mean` / `std`."""

    mean: np.ndarray
    std: np.ndarray
    w: np.ndarray

    def folded(self) -> tuple[np.ndarray, np.ndarray]:
        """(weights, offset) on the raw features: design(x) @ w == x @ weights + offset, the standardisation
        and the bias feature folded in, so no standardised copy of x is ever built."""
        return self.w[:-1] / self.std.T, BIAS * self.w[-1] - (self.mean / self.std) @ self.w[:-1]

    def scores(self, x) -> np.ndarray:
        """design(x) @ w through the folded weights. float32 features stay float32."""
        output("probe.weights", self.w)
        scores = _affine(x, *self.folded())
        output("probe.scores", scores)
        return scores

    def predict(self, x) -> np.ndarray:
        return np.argmax(self.scores(x), axis=1)


def ridge_probe(train_x, train_y, num_classes: int, l2: float = DEFAULT_L2) -> Probe:
    """The ridge probe for one l2: one linear solve with the regularised Gram matrix, primal XᵀX when
    N >= D, else dual XXᵀ (w = Xᵀ (XXᵀ + l2 I)⁻¹ Y)."""
    x, mean, std = _standardise(train_x)
    y = _targets(train_y, num_classes)
    n, d = x.shape
    gram = x.T @ x if n >= d else x @ x.T
    gram[np.diag_indices(len(gram))] += l2
    # numpy's own LAPACK throughout: handing over to scipy's (another OpenBLAS, with its own spinning
    # thread pool) made every call after it ~2x slower on 2 cores, and scipy's solve also estimates
    # the condition number
    w = np.linalg.solve(gram, x.T @ y) if n >= d else x.T @ np.linalg.solve(gram, y)
    return Probe(mean, std, w)


@dataclass
class Ridge:
    """One eigendecomposition of a standardised few-shot problem; solve for any l2 cheaply."""

    mean: np.ndarray
    std: np.ndarray
    eigs: np.ndarray
    lhs: np.ndarray
    rhs: np.ndarray
    x: np.ndarray  # the standardised design, bias column included
    q: np.ndarray  # eigenvectors of XᵀX (primal) or XXᵀ (dual)
    y: np.ndarray
    primal: bool  # True: N >= D, eigh of XᵀX
    _loo: tuple | None = field(default=None, repr=False)  # leave-one-out basis, built on first use

    def weights(self, l2: float) -> np.ndarray:
        return (self.lhs / (self.eigs + l2)) @ self.rhs

    def design(self, x) -> np.ndarray:
        x = (np.asarray(x, np.float64) - self.mean) / self.std
        return np.hstack([x, np.full((len(x), 1), BIAS)])

    def probe(self, l2: float = DEFAULT_L2) -> Probe:
        return Probe(self.mean, self.std, self.weights(l2))

    def predict(self, x, l2: float = DEFAULT_L2) -> np.ndarray:
        return self.probe(l2).predict(x)

    def loo_accuracy(self, l2: float) -> float:
        """Leave-one-out accuracy on the training shots: H = basis · diag(scale) · basisᵀ. The basis, its
        square and basisᵀY do not depend on l2 and are built once per fit."""
        if self._loo is None:
            basis = self.x @ self.q if self.primal else self.q
            self._loo = basis, basis**2, basis.T @ self.y
        basis, basis_sq, basis_y = self._loo
        scale = 1.0 / (self.eigs + l2) if self.primal else self.eigs / (self.eigs + l2)
        fitted = basis @ (scale[:, None] * basis_y)
        h = basis_sq @ scale
        loo = (fitted - h[:, None] * self.y) / (1.0 - h)[:, None]
        return float((loo.argmax(1) == self.y.argmax(1)).mean())


def ridge_fit(train_x, train_y, num_classes: int) -> Ridge:
    x, mean, std = _standardise(train_x)
    y = _targets(train_y, num_classes)
    n, d = x.shape
    if n >= d:
        eigs, q = np.linalg.eigh(x.T @ x)
        return Ridge(mean, std, eigs, q, q.T @ (x.T @ y), x, q, y, True)
    eigs, q = np.linalg.eigh(x @ x.T)
    return Ridge(mean, std, eigs, x.T @ q, q.T @ y, x, q, y, False)


def ridge_accuracy(train_x, train_y, test_x, test_y, num_classes: int, l2: float = DEFAULT_L2) -> float:
    """Test accuracy (a fraction in [0, 1]) of big_vision's closed-form ridge probe."""
    pred = ridge_probe(train_x, train_y, num_classes, l2).predict(test_x)
    return float((pred == np.asarray(test_y)).mean())


def ridge_sweep_accuracy(train_x, train_y, test_x, test_y, num_classes: int, l2s) -> list[float]:
    """Test accuracy for every l2 of a sweep from one eigendecomposition (big_vision's use of its cache):
    the weights of all l2 values are folded and stacked, so the test set goes through one matrix product."""
    ridge = ridge_fit(train_x, train_y, num_classes)
    folded = [ridge.probe(float(l2)).folded() for l2 in l2s]
    scores = _affine(
        test_x, np.concatenate([w for w, _ in folded], axis=1), np.concatenate([b for _, b in folded], axis=-1)
    ).reshape(len(test_x), len(folded), num_classes)
    return [float(a) for a in (scores.argmax(-1) == np.asarray(test_y)[:, None]).mean(0)]


def _affine(x, w: np.ndarray, offset: np.ndarray) -> np.ndarray:
    """x @ w + offset in float32 for float32 features (the cached pre-logits), else float64."""
    x = np.asarray(x)
    dtype = np.float32 if x.dtype == np.float32 else np.float64
    return x @ w.astype(dtype) + offset.astype(dtype)


def select_l2(ridge: Ridge, candidates, shots: int) -> tuple[float, str]:
    """The candidate with the best leave-one-out accuracy on the shots (ties: the earlier one)."""
    candidates = [float(c) for c in candidates]
    if shots < 2:
        return DEFAULT_L2, "default (1 shot: leave-one-out has no class mate)"
    scores = [ridge.loo_accuracy(c) for c in candidates]
    return candidates[int(np.argmax(scores))], "leave-one-out"


class FewshotDataset(DatasetEntry):  # train: the pool the shots are drawn from
    classes: int | None = None  # default: the dataset's own class count


class FewshotAdapter(Adapter):
    name = "fewshot"
    dataset_schema = FewshotDataset
    settings = FewshotSettings

    def training_images(self, cell) -> int:
        """Closed-form probes on frozen features: no backbone training."""
        return 0

    def plan(self, task, backbone, results):
        return plan_select_then_final(task, backbone, results)  # shots is a report axis: no select stage

    def check_data(self, task, ctx) -> None:
        entries = [self.entry(ds.name, ds.model_dump()) for ds in task.datasets]
        missing = find_missing(entries, lambda e: [e["train"], e["test"]], ctx.data_dir)
        if missing:
            raise missing_data("few-shot", missing, len(entries), ctx.data_dir)

    def run(self, cell, ctx):
        s = self.settings_of(cell)
        ds = self.entry(cell.dataset, cell.dataset_config)
        identity = {k: ds[k] for k in ("name", "source", "tfds", "set")} | {"version": cell.data_version}
        frozen = FrozenFeatures.of(cell, s, ctx)
        sizes = {("resize_square" if s.resize_mode == "square" else "resize_small"): s.resize}
        transform = eval_transform(s.resolution, **sizes, pixels=s.pixels)
        hits, data = {}, {role: open_split(ds, ds[role], ctx.data_dir) for role in ("train", "test")}
        (train_x, train_y, hits["train"], _), (test_x, test_y, hits["test"], _) = (
            frozen.split(
                data[role], identity, ds[role], transform, frozen.transform(**sizes), f"features {cell.dataset} {role}"
            )
            for role in ("train", "test")
        )
        n_cls = getattr(data["train"], "num_classes", 0)
        num_classes = ds["classes"] or n_cls or int(max(train_y.max(), test_y.max())) + 1
        idx = fewshot_indices(train_y, s.shots, cell.seed)
        l2, rule = s.l2, "fixed"
        if s.l2_sweep:
            ridge = ridge_fit(train_x[idx], train_y[idx], num_classes)
            l2, rule = select_l2(ridge, s.l2_sweep, s.shots)
            probe = ridge.probe(l2)
        else:
            probe = ridge_probe(train_x[idx], train_y[idx], num_classes, l2)
        acc = float((probe.predict(test_x) == test_y).mean())
        return {
            "test": {"accuracy": 100.0 * acc},
            "info": {
                "train_examples": int(len(idx)),
                "test_examples": int(len(test_y)),
                "feature_dim": int(train_x.shape[1]),
                "l2": l2,
                "l2_rule": rule,
                "solver": "primal" if len(idx) > train_x.shape[1] else "dual",
                "cache_hit": hits,
                "bf16": frozen.bf16,
                "bf16_choice": frozen.choice.info,
            },
        }
