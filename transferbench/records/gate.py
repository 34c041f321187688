"""The regression gate's decision between two records folders (last night's and tonight's): docs/regression.md.
Its jobs live beside it: records.match (1, 2, 4), records.comparisons and records.broad (3); `reporting.regress`
renders the decision.

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

from dataclasses import dataclass, field

from ..errors import UserError
from .broad import moved_comparisons, suite_comparisons
from .comparisons import (
    ALPHA,
    FAILING,
    FLOOR,
    Comparison,
    Kind,
    Verdict,
    cell_comparisons,
    judge,
    noise_model,
    shift_comparisons,
)
from .match import Exact, ProtocolChange, TaskBackbone, axes, index, match, other_code
from .stats import sign_test


@dataclass(kw_only=True)
class Gate:
    comparisons: list[Comparison]
    protocol: list[ProtocolChange]
    missing: list  # match.CellKey: baseline cells without a current counterpart
    new: list  # match.CellKey: current cells without a baseline counterpart
    exact: Exact  # the cells of equal arithmetic, judged to the bit
    selection: list  # match.Selection: a final stage selected differently
    alpha: float
    floor: float = FLOOR
    diverged: list = field(default_factory=list)  # current records that diverged where the baseline's cell was ok
    vanished: list = field(default_factory=list)  # match.Vanished: judged in the baseline, lacking in current
    stale: list = field(default_factory=list)  # match.CellKey of current whose record another code computed (kept)
    absent: list = field(default_factory=list)  # match.TaskBackbone of the baseline of which current holds nothing
    untested_noise: dict = field(default_factory=dict)  # (task, metric) -> units no noise model covers
    nonfinite: list = field(default_factory=list)  # match.NonFinite: a value NaN or infinite on either side

    @property
    def tests(self) -> int:
        return sum(x.p is not None for x in self.comparisons)

    def of(self, kind: Kind, verdict: Verdict | None = None) -> list[Comparison]:
        return [c for c in self.comparisons if c.kind == kind and (verdict is None or c.verdict == verdict)]

    @property
    def regressed(self) -> list[Comparison]:
        return [c for c in self.comparisons if c.verdict in FAILING]

    @property
    def compared(self) -> int:
        """Cells judged exactly plus tests run: 0 means the two sides had nothing in common to judge."""
        return self.exact.judged + self.tests

    @property
    def improved(self) -> list[Comparison]:
        return [c for c in self.comparisons if c.verdict == Verdict.IMPROVED]

    @property
    def unaccepted(self) -> list[ProtocolChange]:
        return [p for p in self.protocol if not p.accepted]

    def direction(self) -> tuple[int, int, float] | None:
        """(cells that got worse, cells that moved, p) when the cell changes point one way more than chance allows
        (`records.stats.sign_test` at alpha over the comparisons that changed, at least 10); else None."""
        cells = [c for c in self.of(Kind.CELL) if c.change != 0]
        if len(cells) < 10:
            return None
        worse = sum(c.change < 0 for c in cells)
        p = sign_test(worse, len(cells))
        return (worse, len(cells), p) if p < self.alpha else None


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
    ax = axes(baseline, current)
    b, c = index(baseline, ax), index(current, ax)
    stale = other_code(c)
    tier = Exact(enabled=exact)
    found = match(b, c, ax, tier, accept_code, accept, stale)
    nonfinite: list = []
    comparisons, paired = cell_comparisons(found.pairs, found.axes_of, floor, nonfinite)
    comparisons += shift_comparisons(comparisons, floor)
    comparisons += suite_comparisons(found.pairs, paired, floor, shared)
    untested: dict = {}
    model = noise_model() if noise is None else noise
    comparisons += moved_comparisons(found.pairs, paired, floor, shared, model, untested)
    judge(comparisons, alpha)
    groups = lambda side: {TaskBackbone(k.task, k.backbone) for k in side}  # noqa: E731
    both = sorted(set(b) & set(c))
    return Gate(
        comparisons=comparisons,
        protocol=sorted(found.changes.values(), key=lambda p: (p.task, p.setting)),
        missing=sorted(k for k in b if k not in c),
        new=sorted(k for k in c if k not in b),
        exact=tier,
        selection=found.selection,
        alpha=alpha,
        floor=floor,
        diverged=[c[k][0] for k in both if b[k][0]["status"] == "ok" and c[k][0]["status"] == "diverged"],
        vanished=found.vanished,
        stale=sorted(k for k in stale if k in b),
        absent=sorted(groups(b) - groups(c)),
        untested_noise=untested,
        nonfinite=nonfinite,
    )


def _flip(difference: str) -> str:
    """'cell.precision [bf16] -> [fp32]' as 'bf16 → fp32'; other settings keep their name."""
    name, _, change = difference.partition(" ")
    change = change.replace(" -> ", " → ").replace('"', "")
    return change.replace("[", "").replace("]", "") if name == "cell.precision" else f"{name[5:]} {change}"


@dataclass
class Decision:
    """A night's decision: the gate, the current records that failed or diverged, and why it fails (empty: it
    passes)."""

    gate: Gate
    failed: list
    reasons: list

    @property
    def code(self) -> int:
        return int(bool(self.reasons))


def decide_options(flags: dict, accept=(), accept_code=()) -> dict:
    """`decide`'s options from a command's gate flags (floor, alpha, accept, accept_code, allow_improvement: those of
    --floor, --alpha, --accept, --accept-code, --allow-improvement) and the acceptance ledger's entries that apply,
    the flags' first."""
    return dict(
        floor=flags.get("floor", FLOOR),
        alpha=flags.get("alpha", ALPHA),
        accept=[*flags.get("accept", ()), *accept],
        accept_code=[*flags.get("accept_code", ()), *accept_code],
        fail_on_missing=True,
        allow_improvement=flags.get("allow_improvement", False),
    )


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
) -> Decision:
    """The night's decision: it fails (exit code 1) when a cell of equal arithmetic changed by code not accepted
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
    absent = [x for x in g.absent if not allowed(x.task, x.backbone)]
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
        gone = [
            k
            for k in g.missing + g.stale
            if not allowed(k.task, k.backbone) and TaskBackbone(k.task, k.backbone) not in absent_groups
        ]
        gone += [v for v in g.vanished if not allowed(v.cell.task, v.cell.backbone)]
        if gone:
            reasons.append(f"{len(gone)} cells or metrics missing")
    if not g.compared and not reasons:
        reasons.append("nothing compared")  # no cell both sides hold and could judge is never an OK
    return Decision(gate=g, failed=failed, reasons=reasons)
