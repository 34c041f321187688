"""The gate's decision (transferbench.gate, whose docstring writes its rules): `decide` matches two records folders
(`gate.match`), judges the exact tier, runs the tests (`gate.comparisons`, `gate.broad`) against the noise model
(`gate.noise`) and returns a `Decision`: the `Gate` with every comparison, and why the night fails (empty: it
passes)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..arithmetic import short
from ..errors import UserError
from ..records.scatter import sign_test
from .broad import model_comparisons, moved_comparisons, shift_comparisons, suite_comparisons
from .comparisons import (
    ALPHA,
    FAILING,
    FLOOR,
    Comparison,
    Kind,
    Verdict,
    cell_comparisons,
    judge,
)
from .keys import TaskBackbone
from .match import Exact, ProtocolChange, axes, index, match, other_code


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
    nonfinite: list = field(default_factory=list)  # match.NonFinite: a value NaN, null or infinite on either side
    baseline_failed: list = field(default_factory=list)  # match.CellKey: the baseline's latest record failed
    accepted_modules: set = field(default_factory=set)  # modules of an accepted change judged statistically
    model: object = None  # gate.noise.Model: the statistical tier's null across arithmetic

    @property
    def untested(self) -> list[Comparison]:
        """Cell comparisons no test could judge: no noise model entry for their task, split, metric and kind, or
        one seed against seed variance with no logged examples."""
        return [c for c in self.comparisons if c.kind == Kind.CELL and c.p is None]

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
        (`records.scatter.sign_test` at alpha over the comparisons that changed, at least 10); else None."""
        cells = [c for c in self.of(Kind.CELL) if c.change != 0]
        if len(cells) < 10:
            return None
        worse = sum(c.change < 0 for c in cells)
        p = sign_test(worse, len(cells))
        return (worse, len(cells), p) if p < self.alpha else None


def gate(baseline: list[dict], current: list[dict], options: GateOptions | None = None, **changes) -> Gate:
    """Under `options` (GateOptions, with `changes` to its fields): match, judge the cells of equal arithmetic exactly
    (`exact`; False: every cell goes to the statistical tier, as against a fixed anchor), test and judge the rest
    (transferbench.gate's docstring). `shared(task)`: whether one run per
    seed serves every dataset of a task (spec.seeds_shared), which decides the pooled test's units. `noise`: the
    arithmetic noise model, a gate.noise.Model or its `tasks` mapping (default: the package's, refused in one line
    where it was measured on other code than `code_of`'s records: the anchor's, which `nightly` gives, against its
    rolling baseline too; by default the baseline's)."""
    o = replace(options or GateOptions(), **changes)
    floor, alpha, shared, noise, code_of = o.floor, o.alpha, o.shared, o.noise, o.code_of
    if shared is None:
        from ..spec import seeds_shared as shared
    from .noise import Model, packaged

    ax = axes(baseline, current)
    b, c = index(baseline, ax), index(current, ax)
    stale = other_code(c)
    found = match(b, c, ax, o.exact, o.accept_code, o.accept, stale)
    model = packaged() if noise is None else noise if isinstance(noise, Model) else Model.of({"tasks": noise})
    cells, paired, nonfinite = cell_comparisons(
        found.pairs,
        found.axes_of,
        floor,
        model=model,
        seed_null=found.declared,
        code_accepted=found.code_accepted,
    )
    modelled = {x.task for x in cells if x.null == "arithmetic"}
    if modelled:  # the model is the null of these tasks' comparisons: it must be of the anchor's (the baseline's) code
        model.check(code_of if code_of is not None else [r for r, _ in b.values()], modelled)
    comparisons = cells + _broad(cells, paired, found.pairs, floor, shared, model)
    judge(comparisons, alpha)
    groups = lambda side: {TaskBackbone(k.task, k.backbone) for k in side}  # noqa: E731
    both = sorted(set(b) & set(c))
    return Gate(
        comparisons=comparisons,
        protocol=sorted(found.changes.values(), key=lambda p: (p.task, p.setting)),
        missing=sorted(k for k in b if k not in c),
        new=sorted(k for k in c if k not in b),
        exact=found.exact,
        selection=found.selection,
        alpha=alpha,
        floor=floor,
        diverged=[c[k][0] for k in both if b[k][0]["status"] == "ok" and c[k][0]["status"] == "diverged"],
        vanished=found.vanished,
        stale=sorted(k for k in stale if k in b),
        absent=sorted(groups(b) - groups(c)),
        nonfinite=nonfinite,
        baseline_failed=found.baseline_failed,
        accepted_modules=found.accepted_modules,
        model=model,
    )


def _broad(cells: list, paired: dict, pairs: dict, floor: float, shared, model) -> list:
    """The broad tests beside the cells' own (gate.broad): the shift of each (task, backbone), the model's pooled
    test, and over seed variance the suite's and the moved cells'. A broad test over seed variance whose every cell
    is a meant code change is accepted with them."""
    by_seeds = {_group(x) for x in cells if x.null == "seeds"}
    seeds_only = {g: v for g, v in paired.items() if g in by_seeds}
    broad = shift_comparisons(cells, floor, shared)
    broad += model_comparisons(cells, floor, shared, model)
    broad += suite_comparisons(pairs, seeds_only, floor, shared)
    broad += moved_comparisons(pairs, seeds_only, floor)
    meant = {(x.task, x.backbone) for x in cells if x.accepted}
    meant -= {(x.task, x.backbone) for x in cells if x.null == "seeds" and not x.accepted}
    for x in broad:
        if x.null == "seeds" and (x.task, x.backbone) in meant:
            x.accepted = True
    return broad


def _group(x: Comparison):
    from .keys import GroupKey

    return GroupKey(x.task, x.dataset, x.backbone, x.stage, _axes_text(x.axes), x.split, x.metric)


def _axes_text(ax: dict) -> str:
    from ..hashing import canon

    return canon(ax)


def _flip(d) -> str:
    """A cell's own arithmetic that code changed (arithmetic.Difference), in a reason's words: the precision as
    'bf16 → fp32', any other setting by its name under `cell.` ('micro_batch [0] → [64]')."""

    def words(v) -> str:
        if d.path == "cell.precision" and isinstance(v, list):
            return ",".join(map(str, v))
        return short(v).replace('"', "")

    change = f"{words(d.before)} → {words(d.after)}"
    return change if d.path == "cell.precision" else f"{d.path.removeprefix('cell.')} {change}"


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


def improvement_allowed(allow, x: Comparison) -> bool:
    """Whether `allow` (True; or names TASK, TASK:BACKBONE, TASK:BACKBONE:METRIC, `*` for any part) passes this
    improvement. A broad test over every backbone (a shift, `(all)`) is passed by a name without a backbone."""
    if allow is True:
        return True
    for name in allow or ():
        parts = (name.split(":") + ["*", "*"])[:3]
        want = (x.task, x.backbone, x.metric)
        if all(
            p in ("*", "", w) or (i == 1 and w == "(all)" and p == "*") for i, (p, w) in enumerate(zip(parts, want))
        ):
            return True
    return False


@dataclass(frozen=True)
class GateOptions:
    """Everything the gate takes besides its two sides, frozen: the front builds it once from a command's flags
    (`transferbench regress`, `nightly`, `reanchor`) and hands it down whole.
    - floor, alpha: the magnitude floor and the family-wise error of the statistical tier;
    - accept (TASK:SETTING), accept_code (MODULE or MODULE@FINGERPRINT): changes taken on purpose, the flags' first,
      then the acceptance ledger's (`accepting`);
    - allow_improvement (True, or TASK[:BACKBONE[:METRIC]] names), allow_untested, allow_missing (True, or TASK,
      TASK:BACKBONE, cells:TASK[:BACKBONE], metric:TASK:METRIC, `*`): what passes that would fail;
    - fail_on_missing, fail_on_failed: whether missing baseline cells and failed or diverged current cells fail;
    - exact: judge cells of equal arithmetic to the bit (False: every cell goes to the statistical tier);
    - noise: the noise model (gate.noise.Model; None: the packaged one); shared: seeds shared across datasets;
      code_of: the records whose code the noise model must be of (the anchor's, whatever the baseline)."""

    floor: float = FLOOR
    alpha: float = ALPHA
    accept: tuple = ()
    accept_code: tuple = ()
    allow_improvement: object = ()
    allow_untested: bool = False
    allow_missing: object = ()
    fail_on_missing: bool = True
    fail_on_failed: bool = True
    exact: bool = True
    noise: object = None
    shared: object = None
    code_of: object = None

    def accepting(self, accept=(), accept_code=()) -> GateOptions:
        """These options with the acceptance ledger's entries after the flags'."""
        return replace(self, accept=(*self.accept, *accept), accept_code=(*self.accept_code, *accept_code))


def noise_model_at(path):
    """The noise model of `--noise-model PATH` (None: the packaged one)."""
    return _model_at(path) if path else None


def _model_at(path):
    from .noise import load

    return load(path)


def decide(baseline: list[dict], current: list[dict], options: GateOptions | None = None, **changes) -> Decision:
    """The night's decision: it fails (exit code 1) when a cell of equal arithmetic changed by code not accepted
    (`accept_code`) or irreproducibly, a test fires for the worse, the seed spread changed, a protocol change is
    not accepted, a cell of `current` failed or diverged (unless `fail_on_failed` is False), a task or backbone of
    the baseline is absent from `current`, or (with `fail_on_missing`) baseline cells, or a split or metric of
    them, are missing from `current` or were kept from other code; else 0. `allow_missing`: True, or names (TASK,
    TASK:BACKBONE, `*`) whose absence passes. `options` (GateOptions; default: the defaults), with `changes` to its
    fields."""
    o = replace(options or GateOptions(), **changes)
    if not baseline:
        raise UserError("the baseline holds no records: give the records folder of a `transferbench run`")
    if not current:
        raise UserError("the current side holds no records: give the records folder of a `transferbench run`")
    g = gate(baseline, current, o)
    failed = [r for r in current if r["status"] == "failed"] + g.diverged
    reasons = _reasons(g, o, failed)
    return Decision(gate=g, failed=failed, reasons=reasons)


def _allowed_missing(allow_missing, *names: str) -> bool:
    """Whether `allow_missing` (True, or names) passes any of `names`."""
    return allow_missing is True or bool(set(names) & set(allow_missing or ()))


def _reasons(g: Gate, o: GateOptions, failed: list) -> list[str]:
    """Why the night fails, in words (empty: it passes)."""
    allow = o.allow_missing
    reasons = []
    absent = [x for x in g.absent if not _allowed_missing(allow, "*", x.task, f"{x.task}:{x.backbone}")]
    if absent:
        reasons.append(f"{len(absent)} tasks or backbones absent")
    if g.exact.failing_arithmetic:
        flips = sorted({_flip(a) for x in g.exact.failing_arithmetic for a in x.arithmetic})
        reasons.append(f"{len(g.exact.failing_arithmetic)} arithmetic changed by code ({'; '.join(flips)})")
    plain = len(g.exact.failing) - len(g.exact.failing_arithmetic)
    counted = [
        (plain, "changed by code"),
        (len(g.exact.irreproducible), "irreproducible"),
        (len(g.regressed), "regressed"),
        (len(g.nonfinite), "non-finite values"),
        (len(g.baseline_failed), "cells failed in the baseline"),
        (0 if o.allow_untested else len(g.untested), "untested (allow with --allow-untested)"),
        (
            sum(not improvement_allowed(o.allow_improvement, x) for x in g.improved),
            "improved beyond chance (allow with --allow-improvement)",
        ),
        (len(g.unaccepted), "protocol changes"),
        (len(failed) if o.fail_on_failed else 0, "cells failed or diverged"),
    ]
    reasons += [f"{n} {what}" for n, what in counted if n]
    if o.fail_on_missing:
        absent_groups = set(g.absent)  # counted once, as absent
        gone = [
            k
            for k in g.missing + g.stale
            if not _allowed_missing(allow, "cells:*", f"cells:{k.task}", f"cells:{k.task}:{k.backbone}")
            and TaskBackbone(k.task, k.backbone) not in absent_groups
        ]
        gone += [
            v
            for v in g.vanished
            if not _allowed_missing(allow, f"metric:{v.cell.task}:{v.metric}", f"metric:*:{v.metric}")
        ]
        if gone:
            reasons.append(f"{len(gone)} cells or metrics missing")
    if not g.compared and not reasons:
        reasons.append("nothing compared")  # no cell both sides hold and could judge is never an OK
    return reasons
