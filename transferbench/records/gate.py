"""The regression gate's decision between two records folders (last night's and tonight's): docs/regression.md.
`reporting.regress` renders it.

1. Matching. Cells match on what they are: task, dataset, backbone, stage, seed and the report axes (the
   hyper-parameters that vary between a dataset's cells on either side: shots, lr in the select stage, ...). A
   final stage's selected values (its `select` keys) are an outcome, not an identity.
2. Protocol changes. Every other setting of a matched cell (hyper-parameters, the dataset's configuration, the
   protocol version) must agree. A difference is listed by setting (`pool: gap → tok`) and fails the gate unless
   it is accepted by name (`--accept TASK:SETTING`); a changed cell's numbers are shown but not tested.
3. Tests, on every metric a record holds, each with the direction and floor records.metrics declares:
   - per comparison (task, dataset, backbone, stage, axes, split, metric): a moderated t over the seeds both sides
     have (records.stats.moderated_difference), its variance borrowing from every comparison of the task, split and
     metric; with one seed and no prior, McNemar's exact test where both sides logged their per-example results
     (--log-samples), else untestable;
   - per (task, backbone, metric): `shift`, the sign test of whether its comparisons all moved one way;
   - per (task, backbone): the pooled test of the mean change over all its datasets, seeds and settings
     (records.stats.suite_mean on the per-(dataset, seed) mean changes, the leaderboard's suite test), which sees
     a broad shift that no single cell shows;
   - per (task, backbone, metric): `moved_test`, the F-test that every comparison's true change is 0, which sees
     cells that move both ways while the mean stays (it fails the night where the pooled mean did not fire);
   - per (task, backbone): the F-test of the seed-to-seed spread (collapsed or exploded).
   The cell tests are one family and the pooled, moved, noise, spread and shift tests another, each Holm-corrected at
   alpha / 2, so that a night's family-wise error is at most alpha. A test fires when it is significant after Holm
   *and* its change passes a magnitude floor (the metric's: `floor` points for a percentage, 0.5% of the baseline
   for a training loss, ...; half of it for a pooled mean, a fifth for a shift, a factor 2 for a spread). Worse is a
   regression, better an improvement; both fail unless improvements are allowed. A metric declared `either` (a
   training signal, a diagnostic) that moves either way is a regression. A non-finite value fails.
4. The exact tier comes first. A matched cell whose two records carry the same arithmetic digest
   (transferbench.arithmetic: kernels, threads, BLAS, library versions, precision, ...) is judged to the bit, not
   by statistics: equal outputs pass; different outputs where the code fingerprints differ fail, naming the
   modules that changed (`--accept-code MODULE` accepts an intended change); different outputs from the same code,
   weights and data are *irreproducible* and fail. Only the cells whose arithmetic differs (or is unrecorded) reach
   the tests of 3.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from functools import cache

import numpy as np

from ..arithmetic import cache_differences, cell_differences, machine_differences
from ..errors import UserError
from ..fingerprint import changed_modules
from ..hashing import canon
from ..paths import ARITHMETIC_CACHES
from .metrics import EITHER, SIGNAL_FLOOR, SIGNALS, declared
from .stats import (
    holm,
    mcnemar,
    moderated_difference,
    moved_test,
    noise_test,
    pooled_variance,
    sign_test,
    suite_mean,
    variance_prior,
    variance_ratio,
)

ALPHA = 0.01  # family-wise error of one night's tests (Holm)
FLOOR = 0.5  # the smallest change of one comparison that counts, in metric units (accuracy, mIoU, recall: points)
POOLED_FLOOR = 0.5  # ... of a pooled mean, as a fraction of FLOOR
LOSS_FLOOR = SIGNAL_FLOOR  # ... of a training signal (a loss, a norm, an entropy), as a fraction of the baseline's
SPREAD_FLOOR = 2.0  # the smallest ratio (either way) of seed-to-seed standard deviations that counts
SHIFT_FLOOR = 0.2  # a consistent shift (every comparison one way): its mean change counts from this share of the floor
SHIFT_MIN = 6  # ... over at least this many comparisons of a task, backbone and metric
SIGNAL_NOISE = 10.0  # a training signal's noise test: the smallest rms change that counts, in arithmetic's rms
# the noise test's allowance for a runner whose arithmetic is noisier than the model's variants (another CPU, other
# kernels): a night up to NOISE_TOLERANCE times the model's rms is its null, so such a runner alarms at most alpha
NOISE_TOLERANCE = 2.0
ACCEPTED_PROTOCOL = "an accepted protocol change"  # why a cell of equal arithmetic went to the statistical tier
# ... and why one whose cell arithmetic differs only because one side read from a cache what the other computed
CACHE_STATE = "a cache entry computed on one side and read on the other"
NOISE_MODEL = "noise_model.json"  # beside this module: arithmetic noise per task and metric (docs/regression.md)
PERCENT = ("accuracy", "error", "top5")  # metrics in points of one example each: 100 / examples


def is_signal(metric: str) -> bool:
    """A pretraining probe's training signal (records.metrics.SIGNALS: split "train", a move either way fails)."""
    return metric.startswith(SIGNALS)


@cache
def noise_model() -> dict:
    """{task: {metric: {kind: {"ms": mean square of a unit's change, "units": how many units estimated it}}}}: the
    arithmetic noise model that `python -m benchmarks.gate_power --noise-model` measures on benign runs (kind:
    `kernels` where both sides ran a unit in the same precision, `precision` where a step's precision differs)."""
    import json
    from importlib.resources import files

    return json.loads((files("transferbench.records") / NOISE_MODEL).read_text())["tasks"]


def words(axes: dict) -> str:
    """Axes in words: `shots=25, lr=0.01`."""
    return ", ".join(f"{k}={_value(v)}" for k, v in axes.items())


def _value(v) -> str:
    if isinstance(v, str):
        return v
    if isinstance(v, float) and v.is_integer() and abs(v) < 1e15:
        return str(v)
    return canon({"v": v})[5:-1] if not isinstance(v, (int, float)) else repr(v)


@dataclass
class Comparison:
    kind: str  # cell | pooled | moved | noise | spread | shift
    task: str
    backbone: str
    dataset: str  # '' for pooled and spread tests
    stage: str
    axes: dict
    split: str
    metric: str
    baseline: float  # mean (cell, pooled) or seed standard deviation (spread)
    current: float
    change: float  # current - baseline, signed so that > 0 is better (spread: the sd ratio)
    n: int  # seeds (cell), datasets (pooled), degrees of freedom (spread)
    p: float | None
    floor: float
    low: float | None = None  # the 95% interval of the change, where the test has one
    high: float | None = None
    significant: bool = False
    verdict: str = "unchanged"  # regressed | improved | unchanged | untested | spread | moved | noise | shift
    precision_changed: bool = False  # a cell: some seed's records ran a step in another precision

    @property
    def setting(self) -> str:
        return " ".join(x for x in (self.stage, words(self.axes)) if x)

    @property
    def big(self) -> bool:
        if self.kind in ("moved", "noise"):
            return self.change >= self.floor
        if self.kind == "spread":
            return self.change >= self.floor or self.change <= 1 / self.floor
        return abs(self.change) >= self.floor


@dataclass
class ProtocolChange:
    task: str
    setting: str
    before: str
    after: str
    cells: int = 0
    backbones: set = field(default_factory=set)
    change: list = field(default_factory=list)  # per changed cell: current - baseline (> 0 better)
    accepted: bool = False

    @property
    def mean_change(self) -> float | None:
        return float(np.mean(self.change)) if self.change else None


@dataclass
class ExactCell:
    """One matched cell of the exact tier whose outputs differ."""

    task: str
    dataset: str
    backbone: str
    stage: str
    seed: int
    axes: dict
    causes: tuple  # the modules whose code changed between the two fingerprints; () if none
    change: float | None  # current - baseline of the main metric (> 0 better), None where unavailable
    accepted: bool = False
    arithmetic: tuple = ()  # the cell's own arithmetic that the code changed ('cell.precision [bf16] -> [fp32]')

    @property
    def cell(self) -> str:
        axes = f" {words(self.axes)}" if self.axes else ""
        return f"{self.task} / {self.dataset} / {self.backbone} {self.stage}{axes} seed {self.seed}".replace("  ", " ")


@dataclass
class Exact:
    """The exact tier: matched cells whose records carry one arithmetic digest."""

    identical: int = 0
    changed: list = field(default_factory=list)  # ExactCell: outputs differ and code, weights or data changed
    irreproducible: list = field(default_factory=list)  # ExactCell: outputs differ, nothing else did
    statistical: int = 0  # matched cells left to the statistical tier (their arithmetic differs or is unrecorded)
    why: dict = field(default_factory=dict)  # what differs in the arithmetic -> cells it sent to the statistical tier
    enabled: bool = True

    @property
    def judged(self) -> int:
        return self.identical + len(self.changed) + len(self.irreproducible)

    @property
    def failing(self) -> list:
        return [x for x in self.changed if not x.accepted]

    @property
    def failing_arithmetic(self) -> list:
        """Failing cells whose own arithmetic (precision, micro-batch, evaluation batch, workers, compile) the code
        changed: a change of arithmetic made by code is a change of code."""
        return [x for x in self.failing if x.arithmetic]

    @property
    def by_declaration(self) -> int:
        """Cells sent to the statistical tier by an accepted protocol change (declared) or by a cache's state (a
        trained model read on one side, trained on the other): not a change of machine."""
        return sum(n for why, n in self.why.items() if why == ACCEPTED_PROTOCOL or why.startswith(CACHE_STATE))

    @property
    def accepted(self) -> list:
        return [x for x in self.changed if x.accepted]

    def modules(self) -> dict:
        """cause (a module) -> the changed cells it is named in."""
        out: dict = defaultdict(int)
        for x in self.changed:
            for m in x.causes:
                out[m] += 1
        return dict(sorted(out.items()))


@dataclass
class Gate:
    comparisons: list[Comparison]
    protocol: list[ProtocolChange]
    missing: list  # baseline cells (task, dataset, backbone, stage, seed, axes) without a current counterpart
    new: list
    exact: Exact  # the cells of equal arithmetic, judged to the bit
    selection: list  # (task, dataset, backbone, axes, seed, before, after): a final stage selected differently
    alpha: float
    floor: float = FLOOR
    diverged: list = field(default_factory=list)  # current records that diverged where the baseline's cell was ok
    vanished: list = field(default_factory=list)  # (cell key, split, metric) the baseline judges and current lacks
    stale: list = field(default_factory=list)  # cell keys of current whose record another code computed (kept)
    absent: list = field(default_factory=list)  # (task, backbone) of the baseline of which current holds nothing
    untested_noise: dict = field(default_factory=dict)  # (task, metric) -> units no noise model covers
    nonfinite: list = field(default_factory=list)  # (group, seed) whose value is NaN or infinite on either side

    @property
    def tests(self) -> int:
        return sum(x.p is not None for x in self.comparisons)

    def of(self, kind: str, verdict: str | None = None) -> list[Comparison]:
        return [c for c in self.comparisons if c.kind == kind and (verdict is None or c.verdict == verdict)]

    @property
    def regressed(self) -> list[Comparison]:
        return [c for c in self.comparisons if c.verdict in ("regressed", "spread", "moved", "noise", "shift")]

    @property
    def compared(self) -> int:
        """Cells judged exactly plus tests run: 0 means the two sides had nothing in common to judge."""
        return self.exact.judged + self.tests

    @property
    def improved(self) -> list[Comparison]:
        return [c for c in self.comparisons if c.verdict == "improved"]

    @property
    def unaccepted(self) -> list[ProtocolChange]:
        return [p for p in self.protocol if not p.accepted]

    def direction(self) -> tuple[int, int, float] | None:
        """(cells that got worse, cells that moved, p) when the cell changes point one way more than chance allows
        (`records.stats.sign_test` at alpha over the comparisons that changed, at least 10); else None."""
        cells = [c for c in self.of("cell") if c.change != 0]
        if len(cells) < 10:
            return None
        worse = sum(c.change < 0 for c in cells)
        p = sign_test(worse, len(cells))
        return (worse, len(cells), p) if p < self.alpha else None


def _latest(records: list[dict]) -> list[dict]:
    return sorted(records, key=lambda r: r.get("finished_at", ""))


def _axes(*sides: list[dict]) -> dict:
    """(task, stage) -> the hyper-parameters that vary between the cells of one (dataset, backbone) on a side."""
    values = defaultdict(lambda: defaultdict(set))
    for side, records in enumerate(sides):
        for r in records:
            group = values[(r["task"], r["dataset"], r["backbone"], r.get("stage", ""), side)]
            for k, v in r["hparams"].items():
                group[k].add(canon({"v": v}))
    out = defaultdict(set)
    for (task, _, _, stage, _), keys in values.items():
        out[(task, stage)] |= {k for k, vs in keys.items() if len(vs) > 1}
    return out


def _identity(r: dict, axes: dict) -> tuple:
    stage = r.get("stage", "")
    chosen = set(r.get("select", [])) if stage == "final" else set()
    ax = {k: r["hparams"][k] for k in sorted(axes[(r["task"], stage)] - chosen) if k in r["hparams"]}
    return (r["task"], r["dataset"], r["backbone"], stage, int(r["seed"]), canon(ax)), ax


def _settings(r: dict, axes: dict) -> dict:
    """Everything of a cell that is neither its identity nor its outcome, as {name: canonical text}."""
    stage = r.get("stage", "")
    skip = axes[(r["task"], stage)] | (set(r.get("select", [])) if stage == "final" else set())
    out = {k: _value(v) for k, v in r["hparams"].items() if k not in skip}
    out.update({f"dataset.{k}": _value(v) for k, v in (r.get("dataset_config") or {}).items()})
    out["protocol_version"] = str(r.get("protocol_version"))
    return out


def _index(records: list[dict], axes: dict) -> dict:
    out = {}
    for r in _latest(records):
        key, ax = _identity(r, axes)
        out[key] = (r, ax)
    return out


def _value_of(r: dict, split: str, metric: str | None = None) -> float | None:
    if r["status"] != "ok":
        return None
    v = (r.get("metrics") or {}).get(split, {}).get(metric or r["metric"])
    return None if v is None else float(v)


def _metrics(rb: dict, rc: dict, split: str) -> list[str]:
    """What a split is judged on: every metric either record holds in it (records.metrics declares each one's
    direction and floor)."""
    have = set((rb.get("metrics") or {}).get(split, {})) | set((rc.get("metrics") or {}).get(split, {}))
    return sorted(have)


def floor_of(task: str, metric: str, baseline: float, floor: float, record: dict | None = None) -> float:
    """The magnitude floor of one comparison: `floor` in points for a percentage, else the metric's declared floor
    (records.metrics: a cosine's in its own units, a training signal's or a norm's relative to the baseline)."""
    return declared(task, metric, record).floor_at(baseline, floor)


def either(task: str, metric: str) -> bool:
    """Whether a move of `metric` either way is a change (a diagnostic, a training signal): no better, no worse."""
    return declared(task, metric).direction == EITHER


def quantum(r: dict, split: str, metric: str) -> float:
    """One example of `split` in the metric's units (accuracy or error in points: 100 / examples), where the record
    says how many examples it scored; else 0."""
    if metric not in PERCENT:
        return 0.0
    info = r.get("info") or {}
    n = info.get(f"{split}_examples") or (info.get("eval_examples") if split == "test" else None)
    return 100.0 / n if isinstance(n, (int, float)) and n > 0 else 0.0


def _direction(r: dict, metric: str) -> float:
    """+1 where higher is better (or either way counts), -1 where lower is (records.metrics)."""
    return declared(r["task"], metric, r).sign


def accepts_code(accept_code, cause: str) -> bool:
    """Whether `accept_code` (module names, with or without the leading `transferbench.`, a package naming every
    module under it) names this cause of a changed cell."""
    name = cause.split(" ")[0]
    for a in accept_code or ():
        for full in {a, f"transferbench.{a}"}:
            if name == full or name.startswith(full + "."):
                return True
    return False


def accepts(accept, task: str, setting: str) -> bool:
    """Whether `accept` (TASK, TASK:SETTING or :SETTING entries) names this change."""
    return any(a in (task, f"{task}:{setting}", f":{setting}", f"*:{setting}") for a in accept or ())


def gate(
    baseline: list[dict],
    current: list[dict],
    *,
    floor: float = FLOOR,
    alpha: float = ALPHA,
    accept=(),
    accept_code=(),
    exact: bool = True,
    shared=None,
    noise: dict | None = None,
) -> Gate:
    """Match, judge the cells of equal arithmetic exactly (`exact`; False: every cell goes to the statistical tier,
    as against a fixed anchor), test and judge the rest (module docstring). `shared(task)`: whether one run per
    seed serves every dataset of a task (spec.seeds_shared), which decides the pooled test's units. `noise`: the
    arithmetic noise model (default: `noise_model()`; {} tests no change against one)."""
    if shared is None:
        from ..spec import seeds_shared as shared
    axes = _axes(baseline, current)
    b, c = _index(baseline, axes), _index(current, axes)
    stale = _other_code(c)
    tier = Exact(enabled=exact)
    vanished: list = []
    changes, selection, pairs, axes_of = _match(b, c, axes, tier, accept_code, accept, stale, vanished)
    nonfinite: list = []
    comparisons, paired = _cell_comparisons(pairs, axes_of, floor, nonfinite)
    comparisons += _shift_comparisons(comparisons, floor)
    comparisons += _suite_comparisons(pairs, paired, floor, shared)
    untested: dict = {}
    comparisons += _moved_comparisons(pairs, paired, floor, shared, noise_model() if noise is None else noise, untested)
    _judge(comparisons, alpha)
    groups = lambda side: {(k[0], k[2]) for k in side}  # noqa: E731
    return Gate(
        comparisons,
        sorted(changes.values(), key=lambda p: (p.task, p.setting)),
        sorted(k for k in b if k not in c),
        sorted(k for k in c if k not in b),
        tier,
        selection,
        alpha,
        floor,
        [c[k][0] for k in sorted(set(b) & set(c)) if b[k][0]["status"] == "ok" and c[k][0]["status"] == "diverged"],
        vanished,
        sorted(k for k in stale if k in b),
        sorted(groups(b) - groups(c)),
        untested,
        nonfinite,
    )


def _other_code(c: dict) -> set:
    """The cell keys of one side whose record was computed by other code than the latest record of its task and
    backbone (`--stale keep` keeps such records): tonight's code did not compute them."""
    latest: dict = {}
    for key, (r, _) in c.items():
        fp = (r.get("fingerprint") or {}).get("digest")
        if fp and r.get("finished_at", "") >= latest.get((key[0], key[2]), ("", None))[0]:
            latest[(key[0], key[2])] = (r.get("finished_at", ""), fp)
    out = set()
    for key, (r, _) in c.items():
        fp = (r.get("fingerprint") or {}).get("digest")
        if fp and fp != latest[(key[0], key[2])][1]:
            out.add(key)
    return out


def _match(
    b: dict, c: dict, axes, tier: Exact, accept_code=(), accept=(), stale=frozenset(), vanished=None
) -> tuple[dict, list, dict, dict]:
    """The records both sides hold, matched: protocol changes (a setting that differs), changed selections of a
    final stage, the cells of equal arithmetic judged exactly (into `tier`), and for the statistical tier the pairs
    of every other (task, dataset, backbone, stage, axes, split, metric) per seed. The cells of an accepted protocol
    change go to the statistical tier: accepting a setting accepts no regression. Current records of other code
    (`stale`) are not matched; a judged split or metric that current lacks is appended to `vanished`."""
    changes: dict[tuple, ProtocolChange] = {}
    selection = []
    pairs = defaultdict(dict)  # (task, dataset, backbone, stage, axes, split, metric) -> seed -> (base, cur) records
    axes_of = {}
    for key in sorted(set(b) & set(c) - set(stale)):
        (rb, ax), (rc, _) = b[key], c[key]
        sb, sc = _settings(rb, axes), _settings(rc, axes)
        differs = sorted(k for k in set(sb) | set(sc) if sb.get(k) != sc.get(k))
        task, dataset, backbone, stage, seed, axkey = key
        accepted = True
        for k in differs:
            before, after = sb.get(k, "(none)"), sc.get(k, "(none)")
            pc = changes.setdefault((task, k, before, after), ProtocolChange(task, k, before, after))
            pc.accepted = accepts(accept, task, k)
            accepted = accepted and pc.accepted
            pc.cells += 1
            pc.backbones.add(backbone)
            vb, vc = _value_of(rb, _main_split(rb)), _value_of(rc, _main_split(rb))
            if vb is not None and vc is not None:
                pc.change.append(_direction(rb, rb["metric"]) * (vc - vb))
        if not accepted:
            continue
        if rb["status"] == "ok" and rc["status"] == "ok" and vanished is not None:
            for split in rb.get("metrics") or {}:
                for metric in _metrics(rb, rb, split):
                    if metric not in (rc.get("metrics") or {}).get(split, {}):
                        vanished.append((key, split, metric))
        if stage == "final":
            chosen = {k: rb["hparams"].get(k) for k in rb.get("select", [])}
            now = {k: rc["hparams"].get(k) for k in rb.get("select", [])}
            if chosen != now:
                selection.append((task, dataset, backbone, words(ax), seed, words(chosen), words(now)))
        if differs:  # accepted: judged statistically whatever the arithmetic
            tier.statistical += 1
            if tier.enabled:
                tier.why[ACCEPTED_PROTOCOL] = tier.why.get(ACCEPTED_PROTOCOL, 0) + 1
        elif _judged_exactly(rb, rc, key, ax, tier, accept_code):
            continue
        for split in sorted(set(rb.get("metrics") or {}) | set(rc.get("metrics") or {})):
            for metric in _metrics(rb, rc, split):
                group = (task, dataset, backbone, stage, axkey, split, metric)
                pairs[group][seed] = (rb, rc)
                axes_of[group] = ax
    return changes, selection, pairs, axes_of


def _cell_comparisons(pairs: dict, axes_of: dict, floor: float, nonfinite: list | None = None) -> tuple[list, dict]:
    """One test per matched group over its seeds: a moderated t (records.stats.moderated_difference), whose variance
    borrows from every comparison of the same task, split and metric, all backbones (`variance_prior`: a night's
    few-cell tasks, ADE20K's or high-res', have too few comparisons per backbone to estimate it); with one seed and
    no prior, McNemar's test on the examples where both sides logged them. Returns the comparisons and, per group,
    seed -> (baseline value, current value) where both sides have a finite one; a value that is not finite is
    appended to `nonfinite` as (group, seed) and fails the night."""
    comparisons, paired, rows = [], {}, []
    for group, seeds in sorted(pairs.items()):
        task, dataset, backbone, stage, _, split, metric = group
        vals = {s: (_value_of(rb, split, metric), _value_of(rc, split, metric)) for s, (rb, rc) in seeds.items()}
        vals = {s: v for s, v in vals.items() if None not in v}
        bad = [s for s, v in vals.items() if not all(math.isfinite(x) for x in v)]
        if nonfinite is not None:
            nonfinite += [(group, s) for s in bad]
        vals = paired[group] = {s: v for s, v in vals.items() if s not in bad}
        if not vals:
            continue
        first = next(iter(seeds.values()))[0]
        sign = _direction(first, metric)
        diffs = [sign * (v[1] - v[0]) for v in vals.values()]
        rows.append((group, seeds, vals, first, diffs))
    spreads = defaultdict(lambda: ([], []))  # (task, split, metric) -> (variances, degrees of freedom)
    for group, _, _, _, diffs in rows:
        if len(diffs) > 1:
            at = (group[0], group[5], group[6])
            spreads[at][0].append(float(np.var(diffs, ddof=1)))
            spreads[at][1].append(len(diffs) - 1)
    priors = {at: variance_prior(*v) for at, v in spreads.items()}
    for group, seeds, vals, first, diffs in rows:
        task, dataset, backbone, stage, _, split, metric = group
        prior = priors.get((task, split, metric), (math.nan, 0.0))
        level = float(np.mean([v[0] for v in vals.values()]))
        d = moderated_difference(diffs, prior, min_sd=quantum(first, split, metric))
        low, high, p = d.low, d.high, d.p
        if d.p is None:
            p = _examples_p(*seeds[next(iter(vals))], split)
        comparisons.append(
            Comparison(
                "cell",
                task,
                backbone,
                dataset,
                stage,
                axes_of[group],
                split,
                metric,
                level,
                float(np.mean([v[1] for v in vals.values()])),
                d.mean,
                d.n,
                p,
                floor_of(task, metric, level, floor, first),
                low,
                high,
                precision_changed=any(_precision(rb) != _precision(rc) for rb, rc in seeds.values()),
            )
        )
    return comparisons, paired


def _shift_comparisons(cells: list, floor: float) -> list:
    """Per (task, backbone, metric): did its comparisons all move one way? The exact sign test over the
    comparisons that changed, with no regard to their size (a change of 0.24 points in each of 84 cells passes
    every t-test, yet 84 of 84 worse is no chance), at a floor of SHIFT_FLOOR of the usual one on their mean
    change. Comparisons whose precision differs between the sides are left out: bf16 against fp32 moves numbers
    one way on its own."""
    groups = defaultdict(list)
    for x in cells:
        if x.split != "val" and x.change != 0 and not x.precision_changed:
            groups[(x.task, x.backbone, x.metric)].append(x)
    out = []
    for (task, backbone, metric), xs in sorted(groups.items()):
        if len(xs) < SHIFT_MIN:
            continue
        worse = sum(x.change < 0 for x in xs)
        p = sign_test(worse, len(xs))
        mean = float(np.mean([x.change for x in xs]))
        level = float(np.mean([x.baseline for x in xs]))
        shift_floor = SHIFT_FLOOR * floor_of(task, metric, level, floor)
        out.append(_broad("shift", task, backbone, metric, level, level + mean, mean, len(xs), p, shift_floor))
    return out


def _broad(kind, task, backbone, metric, baseline, current, change, n, p, floor, low=None, high=None) -> Comparison:
    """A comparison over a whole (task, backbone, metric): pooled, spread or moved."""
    return Comparison(kind, task, backbone, "", "", {}, "", metric, baseline, current, change, n, p, floor, low, high)


def _suite_comparisons(pairs: dict, paired: dict, floor: float, shared) -> list:
    """Per (task, backbone, metric), over the reported results: the pooled test of the suite mean and the test of
    the seed spread. Units are per (dataset, seed) means over the dataset's comparisons (per seed suite means
    where one run per seed serves every dataset)."""
    units = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    signs, quanta = {}, defaultdict(float)
    for group, vals in paired.items():
        task, dataset, backbone, stage, _, split, metric = group
        if split == "val" or not vals:  # the reported results only: a select stage's val sweep is left to the cells
            continue
        first = next(iter(pairs[group].values()))[0]
        sign = signs[(task, backbone, metric)] = _direction(first, metric)
        quanta[(task, backbone, metric)] = max(quanta[(task, backbone, metric)], quantum(first, split, metric))
        for s, (vb, vc) in vals.items():
            units[(task, backbone, metric)][dataset][s].append((sign * vb, sign * vc))
    out = []
    for (task, backbone, metric), per_dataset in sorted(units.items()):
        base, cur = (
            {
                ds: {s: float(np.mean([v[i] for v in vs])) for s, vs in seeds.items()}
                for ds, seeds in per_dataset.items()
            }
            for i in (0, 1)
        )
        est = suite_mean(
            {ds: {s: cur[ds][s] - base[ds][s] for s in base[ds]} for ds in base},
            shared=shared(task),
            min_sd=quanta[(task, backbone, metric)],
        )
        sign = signs[(task, backbone, metric)]
        level_b = sign * float(np.mean([np.mean(list(v.values())) for v in base.values()]))
        level_c = sign * float(np.mean([np.mean(list(v.values())) for v in cur.values()]))
        pooled_floor = POOLED_FLOOR * floor_of(task, metric, level_b, floor)
        out.append(
            _broad(
                "pooled",
                task,
                backbone,
                metric,
                level_b,
                level_c,
                est.mean,
                len(base),
                est.p,
                pooled_floor,
                est.low,
                est.high,
            )
        )
        if shared(task):  # one run per seed: the spread is that of the per-seed suite means
            seeds = sorted(set.intersection(*(set(v) for v in base.values())))
            gb = [[np.mean([base[ds][s] for ds in base]) for s in seeds]]
            gc = [[np.mean([cur[ds][s] for ds in cur]) for s in seeds]]
        else:
            gb, gc = [list(v.values()) for v in base.values()], [list(v.values()) for v in cur.values()]
        ratio, p = variance_ratio(gc, gb)
        if not math.isnan(ratio):
            dof = sum(len(g) - 1 for g in gc)
            out.append(
                _broad("spread", task, backbone, metric, _pooled_sd(gb), _pooled_sd(gc), ratio, dof, p, SPREAD_FLOOR)
            )
    return out


def _precision(r: dict):
    return ((r.get("arithmetic") or {}).get("cell") or {}).get("precision")


@dataclass
class _Runs:
    """The statistical tier's runs per (task, backbone, metric) `at`."""

    units: dict  # at -> {unit: mean change}; a unit is (data set, seed), or (seed,) where one run serves every set
    kind: dict  # (at, unit) -> "precision" where a step's precision differs between the sides
    inputs: set  # (at, unit) computed from other weights or data
    levels: dict  # at -> the baseline's values
    quantum: dict  # at -> the largest quantum (one example) of its comparisons
    sign: dict  # at -> +1 where higher is better, -1 where lower is
    # at -> {(data set, stage, axes, split): {seed: change}}: the moved test's groups, which exist for every task (a
    # corruption, a stage, a shot count or a fraction is a group of its own, also where one run serves every set)
    sets: dict = field(default_factory=lambda: defaultdict(lambda: defaultdict(dict)))


def _units(pairs: dict, paired: dict, shared) -> _Runs:
    diffs = defaultdict(lambda: defaultdict(list))  # (task, backbone, metric) -> unit -> paired differences
    runs = _Runs({}, {}, set(), defaultdict(list), defaultdict(float), {})
    for group, vals in paired.items():
        task, dataset, backbone, stage, axkey, split, metric = group
        for s, (vb, vc) in vals.items():
            unit = (s,) if shared(task) else (dataset, s)
            at = (task, backbone, metric)
            diffs[at][unit].append(vc - vb)
            runs.sets[at][(dataset, stage, axkey, split)][s] = vc - vb
            runs.levels[at].append(vb)
            rb, rc = pairs[group][s]
            runs.quantum[at] = max(runs.quantum[at], quantum(rb, split, metric))
            runs.sign[at] = _direction(rb, metric)
            if _precision(rb) != _precision(rc):
                runs.kind[(at, unit)] = "precision"
            if any(rb.get(w) != rc.get(w) for w in ("checkpoint_sha256", "data_version")):
                runs.inputs.add((at, unit))
    runs.units = {at: {unit: float(np.mean(d)) for unit, d in per.items()} for at, per in diffs.items()}
    return runs


def noise_units(baseline: list[dict], current: list[dict], shared=None) -> dict:
    """{(task, metric, kind): [each run's mean change]} between two sides that differ only in arithmetic (the
    statistical tier's units, every cell judged statistically): what `benchmarks.gate_power --noise-model` builds
    the noise model from."""
    if shared is None:
        from ..spec import seeds_shared as shared
    axes = _axes(baseline, current)
    b, c = _index(baseline, axes), _index(current, axes)
    _, _, pairs, axes_of = _match(b, c, axes, Exact(enabled=False))
    _, paired = _cell_comparisons(pairs, axes_of, 0.0)
    runs = _units(pairs, paired, shared)
    out = defaultdict(list)
    for at, u in runs.units.items():
        for unit, v in u.items():
            out[(at[0], at[2], runs.kind.get((at, unit), "kernels"))].append(v)
    return dict(out)


def _moved_comparisons(pairs: dict, paired: dict, floor: float, shared, noise: dict, untested: dict) -> list:
    """Per (task, backbone, metric), on units that are runs (a data set's seed; a seed where one run serves every
    data set): each unit's mean change over its comparisons (shot counts, splits, swept settings of that run), then
    - `moved`: did its groups, each (data set, stage, axes, split) over its seeds (a corruption, a stage, a shot
      count, a fraction: groups in every task, also where one run serves every set), move differently from each
      other, more than their seeds vary (`records.stats.moved_test`)?
    - `noise`: did the runs scatter more than arithmetic scatters them (`records.stats.noise_test` against the
      noise model of the task and metric, per kind of unit: `precision` where a step's precision differs between
      the sides, else `kernels`)? Units computed from other weights or data, or of a kind the model lacks, are left
      out of it and counted in `untested` ((task, metric) -> units).
    A shift of every run alike is the pooled test's. Each comparison's `low` (signed, > 0 better) is the worst
    group's mean change (moved) or the worst run's change (noise): where none got worse by the floor, the move is an
    improvement; else it fails, whatever other groups or runs gained."""
    runs = _units(pairs, paired, shared)
    out = []
    for at, u in sorted(runs.units.items()):
        task, backbone, metric = at
        level = floor_of(task, metric, float(np.mean(runs.levels[at])), floor)
        worst = min(runs.sign[at] * v for v in u.values())  # the noise test's: the worst run
        groups = [list(seeds.values()) for _, seeds in sorted(runs.sets[at].items())]
        rms, p, df1, _ = moved_test(groups, min_sd=runs.quantum[at])
        if df1:  # the moved test's worst is the worst group's mean change (a corruption, a stage)
            low = min(runs.sign[at] * float(np.mean(g)) for g in groups)
            out.append(_broad("moved", task, backbone, metric, 0.0, rms, rms, df1, p, level, low=low))
        model = (noise.get(task) or {}).get(metric) or {}
        tested, variances, dfs = [], [], []
        for unit, v in sorted(u.items()):
            m = model.get(runs.kind.get((at, unit), "kernels"))
            if m is None or (at, unit) in runs.inputs:
                untested[(task, metric)] = untested.get((task, metric), 0) + 1
                continue
            tested.append(v)
            variances.append(m["ms"] * NOISE_TOLERANCE**2)
            dfs.append(m["units"])
        if len(tested) > 1:
            rms, p = noise_test(tested, variances, min(dfs))
            base = float(np.sqrt(np.mean(variances))) / NOISE_TOLERANCE  # the model's own rms
            # a training signal has no unit of its own: its noise test fires at SIGNAL_NOISE times arithmetic's rms
            at_least = SIGNAL_NOISE * base if is_signal(metric) else level
            out.append(_broad("noise", task, backbone, metric, base, rms, rms, len(tested), p, at_least, low=worst))
    return out


def _judge(comparisons: list, alpha: float) -> None:
    """Each comparison's verdict. Two families, each Holm-corrected at alpha / 2 (Bonferroni between them: the
    night's family-wise error stays at most alpha): the few broad tests (pooled, moved, noise, spread, shift) are not
    diluted by the hundreds of cell tests. A metric declared `either` (a diagnostic, a training signal) that moves
    either way has regressed. A set that got worse fails even where another set gained (no "uneven" escape)."""
    rejected = {}
    for family in (("cell",), ("pooled", "moved", "noise", "spread", "shift")):
        members = [x for x in comparisons if x.kind in family]
        rejected.update(zip(map(id, members), holm([x.p for x in members], alpha / 2)))
    for x in comparisons:
        sig = rejected[id(x)]
        x.significant = sig
        if x.p is None:
            x.verdict = "untested"
        elif sig and x.big:
            worse = x.change < 0 or either(x.task, x.metric)
            if x.kind in ("spread", "moved", "noise"):
                x.verdict = x.kind
            elif x.kind == "shift":
                x.verdict = "shift" if worse else "improved"
            else:
                x.verdict = "regressed" if worse else "improved"
    pooled = {(y.task, y.backbone, y.metric): y.verdict for y in comparisons if y.kind == "pooled"}
    for x in comparisons:
        if x.verdict in ("moved", "noise", "shift") and pooled.get((x.task, x.backbone, x.metric)) == "regressed":
            x.verdict = "see pooled"  # told once, by the pooled mean
        elif x.verdict in ("moved", "noise") and not either(x.task, x.metric) and x.low is not None:
            if x.low > -x.floor:  # no run got worse by the floor: runs that gained, unevenly or beyond arithmetic
                x.verdict = "improved"


def _judged_exactly(rb: dict, rc: dict, key: tuple, ax: dict, tier: Exact, accept_code) -> bool:
    """Judge one matched cell in the exact tier where both records are finished, read the same weights and data
    and ran on one machine (kernels, threads, libraries: `arithmetic.machine_differences`) with the same caches;
    False (the statistical tier's) otherwise, counting why. New weights are what a comparison of two checkpoints
    is for: those cells are judged statistically.

    A cell's own arithmetic (the precision each step ran in, micro-batch, evaluation batch, workers, compile) is
    chosen by the code and the command. Where it differs and the code differs too, the code changed it: the cell
    fails as changed by code, naming the change (`cell.precision [bf16] -> [fp32]`), unless every changed module
    is accepted. Where the code is the same, the command or a probe chose it: statistical tier, counted."""
    if rb["status"] != "ok" or rc["status"] != "ok":
        return False
    ab, ac = rb.get("arithmetic") or {}, rc.get("arithmetic") or {}
    inputs = [f"{what} differs" for what in ("checkpoint_sha256", "data_version") if rb.get(what) != rc.get(what)]
    if ab.get("digest") and ab.get("digest") == ac.get("digest"):  # one arithmetic, machine and cell alike
        apart, own = inputs, []
    else:
        apart = inputs or machine_differences(ab, ac) or cache_differences(ab, ac)
        own = cell_differences(ab, ac)
        warm = _cache_state(rb, rc)
        if own and warm and not apart:  # a trained model read from a cache: its training steps did not run
            apart = [f"{CACHE_STATE} ({', '.join(warm)})"]
    fb = rb.get("fingerprint")
    changed = changed_modules(fb, rc.get("fingerprint") or {}) if fb else [("code unrecorded", "changed")]
    if not apart and own and not changed:
        apart = [f"{own[0]} (same code: chosen by the command or a probe)"]
    if not tier.enabled or apart:
        if tier.enabled:
            reason = apart[0] + (f" (and {len(apart) - 1} more)" if len(apart) > 1 else "")
            tier.why[reason] = tier.why.get(reason, 0) + 1
        tier.statistical += 1
        return False
    if _outputs(rb) == _outputs(rc):
        tier.identical += 1
        return True
    task, dataset, backbone, stage, seed, _ = key
    causes = [m if how == "changed" else f"{m} ({how})" for m, how in changed]
    split = _main_split(rb)
    vb, vc = _value_of(rb, split), _value_of(rc, split)
    change = None if vb is None or vc is None else _direction(rb, rb["metric"]) * (vc - vb)
    cell = ExactCell(task, dataset, backbone, stage, seed, ax, tuple(causes), change, arithmetic=tuple(own))
    if causes:
        cell.accepted = all(accepts_code(accept_code, m) for m in causes)
        tier.changed.append(cell)
    else:
        tier.irreproducible.append(cell)
    return True


def _cache_state(rb: dict, rc: dict) -> list[str]:
    """The number caches of which one record computed an entry that the other read: such a cell skipped the steps
    that computed it (a classifier or a text tower read, not trained), so its own arithmetic lists fewer steps."""
    out = []
    for kind in ARITHMETIC_CACHES:
        a, b = (rb.get("caches") or {}).get(kind) or {}, (rc.get("caches") or {}).get(kind) or {}
        if bool(a.get("computed")) != bool(b.get("computed")):
            out.append(kind)
    return out


def _flip(difference: str) -> str:
    """'cell.precision [bf16] -> [fp32]' as 'bf16 → fp32'; other settings keep their name."""
    name, _, change = difference.partition(" ")
    change = change.replace(" -> ", " → ").replace('"', "")
    return change.replace("[", "").replace("]", "") if name == "cell.precision" else f"{name[5:]} {change}"


def _outputs(r: dict) -> str:
    """What the exact tier compares: the outputs digest and the metrics."""
    return canon({"outputs": r.get("outputs"), "metrics": r.get("metrics")})


def _pooled_sd(groups) -> float:
    return float(math.sqrt(pooled_variance(groups)[0]))


def _main_split(r: dict) -> str:
    metrics = r.get("metrics") or {}
    return "test" if "test" in metrics else next(iter(metrics), "test")


def _examples_p(rb: dict, rc: dict, split: str) -> float | None:
    """McNemar's p of one seed's cell, where both records logged their per-example results."""
    from .store import read_samples

    a, b = read_samples(rc, split), read_samples(rb, split)
    if a is None or b is None or np.shape(a) != np.shape(b) or np.asarray(a).dtype != bool:
        return None
    return mcnemar(a, b).p


@dataclass
class Verdict:
    """A night's decision: the gate, the current records that failed or diverged, and why it fails (empty: it
    passes)."""

    gate: Gate
    failed: list
    reasons: list

    @property
    def code(self) -> int:
        return int(bool(self.reasons))


def decide(
    baseline: list[dict],
    current: list[dict],
    floor: float = FLOOR,
    *,
    fail_on_missing: bool = True,
    fail_on_failed: bool = True,
    allow_missing=(),
    allow_improvement: bool = False,
    **options,
) -> Verdict:
    """The night's verdict: it fails (exit code 1) when a cell of equal arithmetic changed by code not accepted
    (`accept_code`) or irreproducibly, a test fires for the worse, the seed spread changed, a protocol change is
    not accepted, a cell of `current` failed or diverged (unless `fail_on_failed` is False), a task or backbone of
    the baseline is absent from `current`, or (with `fail_on_missing`) baseline cells, or a split or metric of
    them, are missing from `current` or were kept from other code; else 0. `allow_missing`: True, or names (TASK,
    TASK:BACKBONE, `*`) whose absence passes. `options`: `gate`'s (alpha, accept, accept_code, exact, noise)."""
    if not baseline:
        raise UserError("the baseline holds no records: give the records folder of a `transferbench run`")
    if not current:
        raise UserError("the current side holds no records: give the records folder of a `transferbench run`")
    g = gate(baseline, current, floor=floor, **options)
    failed = [r for r in current if r["status"] == "failed"] + g.diverged

    def allowed(task: str, backbone: str) -> bool:
        return allow_missing is True or bool({"*", task, f"{task}:{backbone}"} & set(allow_missing or ()))

    reasons = []
    absent = [(t, b) for t, b in g.absent if not allowed(t, b)]
    if absent:
        reasons.append(f"{len(absent)} tasks or backbones absent")
    if g.exact.failing_arithmetic:
        flips = sorted({_flip(a) for x in g.exact.failing_arithmetic for a in x.arithmetic})
        reasons.append(f"{len(g.exact.failing_arithmetic)} arithmetic changed by code ({'; '.join(flips)})")
    plain = len(g.exact.failing) - len(g.exact.failing_arithmetic)
    if plain:
        reasons.append(f"{plain} changed by code")
    if g.exact.irreproducible:
        reasons.append(f"{len(g.exact.irreproducible)} irreproducible")
    if g.regressed:
        reasons.append(f"{len(g.regressed)} regressed")
    if g.nonfinite:
        reasons.append(f"{len(g.nonfinite)} non-finite values")
    if g.improved and not allow_improvement:
        reasons.append(f"{len(g.improved)} improved beyond chance (allow with --allow-improvement)")
    if g.unaccepted:
        reasons.append(f"{len(g.unaccepted)} protocol changes")
    if fail_on_failed and failed:
        reasons.append(f"{len(failed)} cells failed or diverged")
    if fail_on_missing:
        absent_groups = set(g.absent)  # counted once, as absent
        gone = [k for k in g.missing + g.stale if not allowed(k[0], k[2]) and (k[0], k[2]) not in absent_groups]
        gone += [v for v in g.vanished if not allowed(v[0][0], v[0][2])]
        if gone:
            reasons.append(f"{len(gone)} cells or metrics missing")
    if not g.compared and not reasons:
        reasons.append("nothing compared")  # no cell both sides hold and could judge is never an OK
    return Verdict(g, failed, reasons)
