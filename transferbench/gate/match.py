"""The regression gate's first job (gate.decide): match two sides' records on what each cell is, list the settings
that differ (protocol changes), judge the cells of equal arithmetic to the bit (the exact tier), and hand every
other matched (cell, split, metric) to the statistical tier (gate.comparisons) as per-seed pairs.

Cells match on their identity (`CellKey`): task, dataset, backbone, stage, seed and the report axes (the
hyper-parameters that vary between a dataset's cells on either side: shots, lr in the select stage, ...). A final
stage's selected values (its `select` keys) are an outcome, not an identity.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from ..arithmetic import cache_differences, cell_differences, machine_differences
from ..fingerprint import changed_modules
from ..hashing import canon
from ..paths.entries import ARITHMETIC_CACHES
from ..records.record import latest, value
from .keys import CellKey, GroupKey, Selection, TaskBackbone, Vanished, direction, main_split, value_text

ACCEPTED_PROTOCOL = "an accepted protocol change"  # why a cell of equal arithmetic went to the statistical tier
# ... and why one whose cell arithmetic differs only because one side read from a cache what the other computed
CACHE_STATE = "a cache entry computed on one side and read on the other"


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

    key: CellKey
    axes: dict
    causes: tuple  # the modules whose code changed between the two fingerprints; () if none
    change: float | None  # current - baseline of the main metric (> 0 better), None where unavailable
    accepted: bool = False
    arithmetic: tuple = ()  # the cell's own arithmetic that the code changed ('cell.precision [bf16] -> [fp32]')

    @property
    def task(self) -> str:
        return self.key.task


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

    def count(self, why: str) -> None:
        """One more matched cell sent to the statistical tier, because of `why`."""
        self.statistical += 1
        if self.enabled:
            self.why[why] = self.why.get(why, 0) + 1


@dataclass
class Matched:
    """What `match` finds between two sides (baseline `b`, current `c`: CellKey -> (record, axes))."""

    changes: dict = field(default_factory=dict)  # (task, setting, before, after) -> ProtocolChange
    selection: list = field(default_factory=list)  # Selection
    pairs: dict = field(default_factory=lambda: defaultdict(dict))  # GroupKey -> seed -> (baseline, current)
    axes_of: dict = field(default_factory=dict)  # GroupKey -> the cell's axes
    vanished: list = field(default_factory=list)  # Vanished
    declared: set = field(default_factory=set)  # CellKey of an accepted protocol change: the null is seed variance
    code_accepted: set = field(default_factory=set)  # CellKey judged statistically whose code changed as accepted
    accepted_modules: set = field(default_factory=set)  # the modules whose accepted change those cells carry
    baseline_failed: list = field(default_factory=list)  # CellKey whose baseline record failed or diverged
    exact: Exact = field(default_factory=Exact)  # the exact tier: the cells of equal arithmetic, judged to the bit


def axes(*sides: list[dict]) -> dict:
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


def _identity(r: dict, axes: dict) -> tuple[CellKey, dict]:
    stage = r.get("stage", "")
    chosen = set(r.get("select", [])) if stage == "final" else set()
    ax = {k: r["hparams"][k] for k in sorted(axes[(r["task"], stage)] - chosen) if k in r["hparams"]}
    return CellKey(r["task"], r["dataset"], r["backbone"], stage, int(r["seed"]), canon(ax)), ax


def _settings(r: dict, axes: dict) -> dict:
    """Everything of a cell that is neither its identity nor its outcome, as {name: canonical text}."""
    stage = r.get("stage", "")
    skip = axes[(r["task"], stage)] | (set(r.get("select", [])) if stage == "final" else set())
    out = {k: value_text(v) for k, v in r["hparams"].items() if k not in skip}
    out.update({f"dataset.{k}": value_text(v) for k, v in (r.get("dataset_config") or {}).items()})
    out["protocol_version"] = str(r.get("protocol_version"))
    return out


def index(records: list[dict], axes: dict) -> dict:
    """CellKey -> (the latest record of that cell, its axes)."""
    out = {}
    for r in latest(records):
        key, ax = _identity(r, axes)
        out[key] = (r, ax)
    return out


def metrics_of(rb: dict, rc: dict, split: str) -> list[str]:
    """What a split is judged on: every metric either record holds in it (gate.metrics declares each one's
    direction and floor)."""
    have = set((rb.get("metrics") or {}).get(split, {})) | set((rc.get("metrics") or {}).get(split, {}))
    return sorted(have)


def accepts_code(accept_code, cause: str, modules: dict | None = None) -> bool:
    """Whether `accept_code` names this cause of a changed cell: a module name (with or without the leading
    `transferbench.`; a package names every module under it), as `--accept-code` takes them for one run, or
    MODULE@HASH, as the acceptance ledger writes them, which accepts the module only at that code fingerprint in
    tonight's record (`modules`: its fingerprint's modules)."""
    name = cause.split(" ")[0]
    for a in accept_code or ():
        a, _, at = a.partition("@")
        for full in {a, f"transferbench.{a}"}:
            if at:
                if name == full and (modules or {}).get(name) == at:
                    return True
            elif name == full or name.startswith(full + "."):
                return True
    return False


def accepts(accept, task: str, setting: str, after: str | None = None) -> bool:
    """Whether `accept` names this change: TASK, TASK:SETTING or :SETTING (any new value, as `--accept` takes them
    for one run), or TASK:SETTING=VALUE (the acceptance ledger's: that new value only)."""
    for a in accept or ():
        a, eq, value = a.partition("=")
        if a in (task, f"{task}:{setting}", f":{setting}", f"*:{setting}") and (not eq or value == after):
            return True
    return False


def other_code(c: dict) -> set:
    """The cell keys of one side whose record was computed by other code than the latest record of its task and
    backbone (`--stale keep` keeps such records): tonight's code did not compute them."""
    code = {key: (r.get("fingerprint") or {}).get("digest") for key, (r, _) in c.items()}
    newest = {}  # (task, backbone) -> the code of its latest record
    for r in latest([r for key, (r, _) in c.items() if code[key]]):
        newest[TaskBackbone(r["task"], r["backbone"])] = r["fingerprint"]["digest"]
    return {key for key, fp in code.items() if fp and fp != newest[TaskBackbone(key.task, key.backbone)]}


def match(b: dict, c: dict, axes, exact: bool = True, accept_code=(), accept=(), stale=frozenset()) -> Matched:
    """The records both sides hold, matched: protocol changes (a setting that differs), changed selections of a
    final stage, the cells of equal arithmetic judged exactly (`Matched.exact`; `exact` False: every cell goes to the
    statistical tier, as against a fixed anchor), and for the statistical tier the pairs of every other (task,
    dataset, backbone, stage, axes, split, metric) per seed. The cells of an accepted protocol change go to the
    statistical tier: accepting a setting accepts no regression. Current records of other code (`stale`) are not
    matched; a judged split or metric that current lacks is listed as vanished."""
    out = Matched(exact=Exact(enabled=exact))
    tier = out.exact
    for key in sorted(set(b) & set(c) - set(stale)):
        (rb, ax), (rc, _) = b[key], c[key]
        differs = _protocol(out.changes, key, rb, rc, axes, accept)
        if differs is None:  # a change not accepted: shown, not tested
            continue
        if rb["status"] != "ok" and rc["status"] == "ok":  # nothing to compare tonight's numbers with: named, fails
            out.baseline_failed.append(key)
        if rb["status"] == "ok" and rc["status"] == "ok":
            out.vanished += _vanished(key, rb, rc)
        if key.stage == "final":
            chosen = {k: rb["hparams"].get(k) for k in rb.get("select", [])}
            now = {k: rc["hparams"].get(k) for k in rb.get("select", [])}
            if chosen != now:
                out.selection.append(Selection(key.task, key.dataset, key.backbone, ax, key.seed, chosen, now))
        if differs:  # accepted: judged statistically whatever the arithmetic, against seed variance
            tier.count(ACCEPTED_PROTOCOL)
            out.declared.add(key)
        elif _judged_exactly(rb, rc, key, ax, tier, accept_code):
            continue
        elif meant := _code_accepted(rb, rc, accept_code):  # a meant change across arithmetic: against seed variance
            out.declared.add(key)
            out.code_accepted.add(key)
            out.accepted_modules |= set(meant)
        for split in sorted(set(rb.get("metrics") or {}) | set(rc.get("metrics") or {})):
            for metric in metrics_of(rb, rc, split):
                group = GroupKey(key.task, key.dataset, key.backbone, key.stage, key.axes, split, metric)
                out.pairs[group][key.seed] = (rb, rc)
                out.axes_of[group] = ax
    return out


def _vanished(key: CellKey, rb: dict, rc: dict) -> list[Vanished]:
    """Each split and metric the baseline's record holds and current's lacks."""
    have = rc.get("metrics") or {}
    return [
        Vanished(key, split, metric)
        for split in rb.get("metrics") or {}
        for metric in metrics_of(rb, rb, split)
        if metric not in have.get(split, {})
    ]


def _protocol(changes: dict, key: CellKey, rb: dict, rc: dict, axes, accept) -> list | None:
    """Count a matched cell's settings that differ into `changes`; the settings that differ, or None where one of
    them is not accepted."""
    sb, sc = _settings(rb, axes), _settings(rc, axes)
    differs = sorted(k for k in set(sb) | set(sc) if sb.get(k) != sc.get(k))
    accepted = True
    for k in differs:
        before, after = sb.get(k, "(none)"), sc.get(k, "(none)")
        pc = changes.setdefault((key.task, k, before, after), ProtocolChange(key.task, k, before, after))
        pc.accepted = accepts(accept, key.task, k, after)
        accepted = accepted and pc.accepted
        pc.cells += 1
        pc.backbones.add(key.backbone)
        vb, vc = value(rb, main_split(rb)), value(rc, main_split(rb))
        if vb is not None and vc is not None:
            pc.change.append(direction(rb, rb["metric"]) * (vc - vb))
    return differs if accepted else None


def _judged_exactly(rb: dict, rc: dict, key: CellKey, ax: dict, tier: Exact, accept_code) -> bool:
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
        tier.count(apart[0] + (f" (and {len(apart) - 1} more)" if len(apart) > 1 else "") if apart else "")
        return False
    if _outputs(rb) == _outputs(rc):
        tier.identical += 1
        return True
    causes = [m if how == "changed" else f"{m} ({how})" for m, how in changed]
    split = main_split(rb)
    vb, vc = value(rb, split), value(rc, split)
    change = None if vb is None or vc is None else direction(rb, rb["metric"]) * (vc - vb)
    cell = ExactCell(key=key, axes=ax, causes=tuple(causes), change=change, arithmetic=tuple(own))
    if causes:
        modules = (rc.get("fingerprint") or {}).get("modules") or {}
        cell.accepted = all(accepts_code(accept_code, m, modules) for m in causes)
        tier.changed.append(cell)
    else:
        tier.irreproducible.append(cell)
    return True


def _code_accepted(rb: dict, rc: dict, accept_code) -> list[str]:
    """The modules that changed between the two records' code where every one of them is accepted by `accept_code`
    (at tonight's fingerprint, where it names one): a change meant to move numbers, which the arithmetic noise model
    cannot judge; else []."""
    fb, fc = rb.get("fingerprint"), rc.get("fingerprint")
    if not fb or not fc or fb.get("digest") == fc.get("digest") or not accept_code:
        return []
    changed = [m for m, _ in changed_modules(fb, fc)]
    modules = fc.get("modules") or {}
    return changed if changed and all(accepts_code(accept_code, m, modules) for m in changed) else []


def _cache_state(rb: dict, rc: dict) -> list[str]:
    """The number caches of which one record computed an entry that the other read: such a cell skipped the steps
    that computed it (a classifier or a text tower read, not trained), so its own arithmetic lists fewer steps."""
    out = []
    for kind in ARITHMETIC_CACHES:
        a, b = (rb.get("caches") or {}).get(kind) or {}, (rc.get("caches") or {}).get(kind) or {}
        if bool(a.get("computed")) != bool(b.get("computed")):
            out.append(kind)
    return out


def _outputs(r: dict) -> str:
    """What the exact tier compares: the outputs digest and the metrics."""
    return canon({"outputs": r.get("outputs"), "metrics": r.get("metrics")})
