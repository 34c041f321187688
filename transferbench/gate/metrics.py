"""What each recorded metric means to the regression gate: its direction (higher is better, lower is better, or
either: a move either way is a change) and its floor, the smallest change of one comparison that counts (in the
metric's own units, or relative to the baseline's value). docs/regression.md lists them.

Every metric a record holds is compared (gate.decide): a task's main metric and the others beside it (LiT's R@5
and both retrieval directions, ImageNet-C's clean accuracy and per-severity errors, ADE20K's aAcc and mAcc, every
diagnostic measure, a pretraining probe's training signals). A metric no table names falls back to the record's
`mode` where it is the record's main metric (max: higher, min: lower), and is `either` with a relative floor
otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

HIGHER, LOWER, EITHER = "higher", "lower", "either"
POINTS = None  # a floor in points: the gate's --floor (0.5 by default), one scale for every percentage metric


@dataclass(frozen=True)
class Declared:
    direction: str  # higher | lower | either
    floor: float | None = POINTS  # None: the gate's floor in points; else in the metric's units, or relative
    relative: bool = False  # floor as a fraction of the baseline's value
    lower_first: bool = False  # `either`, reported signed as if lower were better (a training loss)

    @property
    def sign(self) -> float:
        """+1 where higher is better (and for `either`, reported as measured), -1 where lower is (and for a training
        signal, whose drop reads as a gain although either move fails)."""
        return -1.0 if self.direction == LOWER or self.lower_first else 1.0

    def floor_at(self, baseline: float, points: float) -> float:
        """The floor of one comparison whose baseline value is `baseline`, with the gate's floor in points `points`."""
        if self.floor is None:
            return points
        return self.floor * abs(baseline) if self.relative else self.floor


# the percentage metrics, once: those of a split's examples (one example moves them by 100 / examples), LiT's
# retrieval recalls (one query: 100 / queries), ImageNet-C's per-severity errors and the segmentation scores
PER_EXAMPLE = ("accuracy", "error", "top5")
PER_QUERY = ("recall@5", "i2t_r1", "i2t_r5", "t2i_r1", "t2i_r5")
_PERCENT_HIGHER = ("accuracy", "top5", *PER_QUERY, "miou", "aacc", "macc")
_PERCENT_LOWER = ("error", *(f"error_{severity}" for severity in range(1, 6)))
SIGNAL_FLOOR = 0.005  # a training signal (a loss, a norm, an entropy): 0.5% of the baseline's value

# metric -> declaration, for every task; TASKS overrides it per task
METRICS: dict[str, Declared] = {
    **{m: Declared(HIGHER) for m in _PERCENT_HIGHER},
    **{m: Declared(LOWER) for m in _PERCENT_LOWER},
}
SIGNALS = ("loss", "decayed_norm", "target_entropy")  # a pretraining run's training signals, and `loss@STEP` points
SIGNAL = Declared(EITHER, SIGNAL_FLOOR, relative=True, lower_first=True)
# diagnostics measure a model, they do not score it: a move either way is a change of the model or of its training
_DIAGNOSE = {
    "patch_cosine": Declared(EITHER, 0.02),  # a cosine in [-1, 1]: 0.02, not 0.5 points
    "attn_std": Declared(EITHER, 0.02, relative=True),
    "attn_distance": Declared(EITHER, 0.01, relative=True),
    "attn_distance_patches": Declared(EITHER, 0.01, relative=True),
    "embed_grad_norm": Declared(EITHER, 0.01, relative=True),
    "grad_norm": Declared(EITHER, 0.01, relative=True),
    "token_norm": Declared(EITHER, 0.01, relative=True),
}
TASKS: dict[str, dict[str, Declared]] = {"diagnose": _DIAGNOSE}
UNKNOWN = Declared(EITHER, 0.01, relative=True)  # a metric no table names, beside a record's main metric


def declared(task: str, metric: str, record: dict | None = None) -> Declared:
    """The declaration of `metric` in `task`'s records (`record`: one of them, whose `mode` decides for its own
    main metric where no table names it)."""
    found = TASKS.get(task, {}).get(metric) or METRICS.get(metric)
    if found is not None:
        return found
    if metric.startswith(SIGNALS):
        return SIGNAL
    if task == "diagnose":
        return UNKNOWN
    if record is not None and metric == record.get("metric"):
        return Declared(LOWER if record.get("mode") == "min" else HIGHER)
    return UNKNOWN
