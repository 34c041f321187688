"""The arithmetic noise model: the statistical tier's null (docs/regression.md#the-noise-model).

Across machines the two sides of a comparison ran the same code in other arithmetic, and their numbers differ by
what that arithmetic makes of them. The model measures it once, on benign arithmetic (`python -m
benchmarks.noise_model`: the nightly suite of the anchor's code under several CPU arithmetic variants, each paired
cell by cell and seed by seed with a clean run), so that no test takes its null from the night it judges.

For each (task, split, metric) and kind of difference it holds the variance of one (cell, seed)'s paired change:
the mean square around 0 over the variant that moves it most (`ms`), the number of changes behind it (`df`), their
mean (`mean`: a sign bias, which bf16 against fp32 has) and the share of the changes that moved that went the worse
way (`worse`). Kinds: `kernels` where every step ran in one precision on both sides (kernels, threads, libraries),
`precision` where a step's precision differs (bf16 against fp32).

A metric that never moved has `ms` 0; the tests floor it at the metric's resolution (`resolution`): one example for
an accuracy, one float32 ulp of the baseline's value for a continuous number. The model records the code it was
measured on (a digest of each task's modules); `Model.check` refuses it for a baseline computed by other code.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import dataclass, field
from functools import cache
from importlib.resources import files
from pathlib import Path

import numpy as np

from ..errors import UserError
from ..hashing import digest
from .metrics import PER_EXAMPLE, PER_QUERY

MODEL_FILE = "noise_model.json"
# kinds of difference between two records' arithmetic, each measured by its own variant (benchmarks/noise_model.py)
CPU = "cpu"  # another processor (vendor, model, ISA flags, BLAS kernels): the committed anchor's CPU against this one
KERNELS = "kernels"  # ATen's CPU capability alone (ATEN_CPU_CAPABILITY on one processor): scalar kernels
THREADS = "threads"  # the torch threads per cell
ONEDNN = "onednn"  # oneDNN on or off
PRECISION = "precision"  # a step in bf16 on one side and fp32 on the other
KINDS = (CPU, KERNELS, THREADS, ONEDNN, PRECISION)
MEASURE = "python -m benchmarks.noise_model --work W"  # the command that (re-)measures it
SEVERITY = "error_"  # ImageNet-C's error at one severity: one example of that severity's examples


@dataclass(frozen=True)
class Noise:
    """One (task, split, metric, kind)'s arithmetic noise: the mean square of a (cell, seed)'s change around 0,
    on `df` changes, their mean and the share of moved ones that got worse."""

    ms: float
    df: int
    mean: float = 0.0
    worse: float = 0.5
    variant: str = ""
    moved: int = 0  # how many of the changes moved at all (those `worse` is a share of)

    @property
    def shrunk_worse(self) -> float:
        """`worse`, one pseudo-change added each way: a share of 0 or 1 measured on a few changes says little, and
        a test that expects it exactly would call one change the other way impossible."""
        return (self.worse * self.moved + 0.5) / (self.moved + 1)


@dataclass
class Model:
    tasks: dict = field(default_factory=dict)  # task -> split -> metric -> kind -> Noise
    runs: dict = field(default_factory=dict)  # task -> metric -> kind -> Noise of a run's mean change (reported splits)
    code: dict = field(default_factory=dict)  # task -> digest of the modules the model's runs were computed by
    about: dict = field(default_factory=dict)  # made_by, date, commit, suite, variants, machine
    path: str = ""

    def entry(self, task: str, split: str, metric: str, kind) -> Noise | None:
        """The noise of one kind of difference, or of several (a set: the largest of theirs). UNKNOWN (what differs
        is unrecorded, or no kind names it), nothing (the machines agree) or a kind never measured for this metric
        (the committed anchor's CPU ran few-shot in bf16, so its `cpu` kind is unmeasured there) takes the largest
        kind the model holds for the metric: the conservative null. None where it holds none (untested)."""
        return _largest(self.tasks.get(task, {}).get(split, {}).get(metric, {}), kind)

    def run_entry(self, task: str, metric: str, kind) -> Noise | None:
        """The noise of a run's mean change over its comparisons of the reported splits (a data set's seed; a seed
        where one run serves every set), as `entry` takes kinds; None where the model holds none."""
        return _largest(self.runs.get(task, {}).get(metric, {}), kind)

    def check(self, baseline: list[dict], tasks: set) -> None:
        """Refuse the model, in one line naming the command that re-measures it, where the baseline's records of a
        task in `tasks` were computed by other code than the model's runs (records without a fingerprint: not
        checked)."""
        theirs = code_digests(baseline)
        stale = sorted(t for t in tasks if t in self.code and t in theirs and theirs[t] != self.code[t])
        if stale:
            raise UserError(
                f"the noise model {self.path or MODEL_FILE} was measured on other code than the baseline's "
                f"({', '.join(stale)}; measured at {str(self.about.get('commit') or '?')[:12]}): re-measure it on the "
                f"baseline's code with `{MEASURE} --anchor BASELINE`"
            )

    @classmethod
    def of(cls, doc: dict, path: str = "") -> Model:
        def kinds(d: dict) -> dict:
            return {k: e if isinstance(e, Noise) else Noise(**e) for k, e in d.items()}

        tasks = {
            task: {split: {m: kinds(k) for m, k in metrics.items()} for split, metrics in splits.items()}
            for task, splits in (doc.get("tasks") or {}).items()
        }
        runs = {task: {m: kinds(k) for m, k in metrics.items()} for task, metrics in (doc.get("runs") or {}).items()}
        about = {k: doc.get(k) for k in ("made_by", "date", "commit", "suite", "variants", "machine")}
        return cls(tasks, runs, dict(doc.get("code") or {}), about, path)


def load(path: Path | None = None) -> Model:
    """The model at `path` (default: the package's); a missing or unreadable one is one line naming the command."""
    where = Path(path) if path else None
    try:
        text = where.read_text() if where else (files("transferbench.gate") / MODEL_FILE).read_text()
        doc = json.loads(text)
        if not isinstance(doc.get("tasks"), dict):
            raise ValueError("no tasks")
        return Model.of(doc, str(where or MODEL_FILE))
    except (OSError, ValueError, TypeError, AttributeError) as e:
        raise UserError(
            f"the noise model {where or MODEL_FILE} is unreadable ({e}); re-measure it: {MEASURE}"
        ) from None


def _largest(kinds: dict, kind) -> Noise | None:
    wanted = {kind} if isinstance(kind, str) else set(kind)
    if not wanted or UNKNOWN in wanted or not wanted <= set(kinds):
        wanted = set(kinds)
    return max((kinds[k] for k in wanted), key=lambda e: e.ms, default=None)


@cache
def packaged() -> Model:
    return load()


def code_digests(records: list[dict]) -> dict:
    """task -> a digest of every module (name and tree hash) its records' fingerprints name; tasks whose records
    hold no fingerprint are left out."""
    modules = defaultdict(dict)
    for r in records:
        fp = (r.get("fingerprint") or {}).get("modules")
        if fp:
            modules[r["task"]].update(fp)
    return {task: digest(dict(sorted(m.items())), 16) for task, m in modules.items()}


def resolution(r: dict, split: str, metric: str, base: float) -> float:
    """The smallest step `metric` can take in `r`: one example of the split for an accuracy or an error (ImageNet-C:
    one example of a severity for its per-severity errors and clean accuracy, of the five severities for its mean
    error), one query for a retrieval recall, else one float32 ulp of the baseline's value."""
    info = r.get("info") or {}
    n = None
    per_severity = info.get("eval_examples_per_severity")
    if metric.startswith(SEVERITY) or (per_severity and metric == "accuracy"):
        n = per_severity  # one severity's examples; the clean accuracy is scored on as many
    elif per_severity and metric == "error":
        n = 5 * per_severity  # the mean error over the five severities
    elif metric in PER_EXAMPLE or metric in PER_QUERY:
        n = info.get(f"{split}_examples") or (info.get("eval_examples") if split == "test" else None)
    if isinstance(n, (int, float)) and n > 0:
        return 100.0 / n
    return float(np.spacing(np.float32(abs(base)))) if math.isfinite(base) else 0.0


def judged(task: str, dataset: str, metric: str) -> bool:
    """Whether a metric is judged in this data set: LiT's retrieval sets (heldout_t2i, heldout_i2t) each hold
    both directions' recalls, and their `accuracy` and `recall@5` are the set's own direction's R@1 and R@5, so
    the directional names are duplicates and are compared once, as the set's accuracy and recall@5."""
    if task == "lit" and dataset.startswith("heldout_"):
        return metric not in PER_QUERY[1:]
    return True


UNKNOWN = "unknown"  # what differs is unrecorded or was never measured: the model's largest kind is taken


def kind_of(rb: dict, rc: dict) -> str:
    """bf16 against fp32 (`precision`), the same precision (`same`), or UNKNOWN where a side recorded none."""
    from .keys import precision

    a, b = precision(rb), precision(rc)
    if a is None or b is None:
        return UNKNOWN
    return PRECISION if a != b else "same"


def kinds_of(rb: dict, rc: dict) -> frozenset:
    """The kinds of difference between two records' arithmetic (KINDS), from what their machines and cells record:
    another processor (`cpu`: its vendor, model, ISA flags or BLAS kernels; a changed ATen capability goes with it),
    ATen's capability alone on one processor (`kernels`), threads (`threads`), oneDNN (`onednn`), a step's precision
    (`precision`). UNKNOWN where anything else differs (a library, the GPU, a field no kind names) or nothing is
    recorded; an empty set where the machines agree (the cell's own arithmetic, a cache's state)."""
    from ..arithmetic import NO_ARITHMETIC, machine_differences

    kind = kind_of(rb, rc)
    if kind == UNKNOWN:
        return frozenset({UNKNOWN})
    out = {PRECISION} if kind == PRECISION else set()
    apart = machine_differences(rb.get("arithmetic"), rc.get("arithmetic"))
    fields = {d.path for d in apart}
    if fields == {NO_ARITHMETIC.path}:  # one side records no arithmetic
        return frozenset({UNKNOWN})
    cpu = {f for f in fields if f.startswith(("cpu.", "pools")) or f in ("cpu", "torch_config")}
    if cpu:
        out.add(CPU)
        fields -= cpu | {"cpu_capability"}
    for f in list(fields):
        if f == "cpu_capability" or f == "variables.ATEN_CPU_CAPABILITY":
            out.add(KERNELS)
        elif f.startswith("threads") or f.endswith("_NUM_THREADS"):
            out.add(THREADS)
        elif f == "flags.mkldnn":
            out.add(ONEDNN)
        else:
            out.add(UNKNOWN)
    return frozenset(out)


def run_of(task: str, backbone: str, dataset: str, seed: int) -> tuple:
    """A run: a data set's seed of one backbone; a seed where one run serves every data set (LiT, ImageNet-C)."""
    from ..spec import seeds_shared

    return (backbone, seed) if seeds_shared(task) else (backbone, dataset, seed)


def changes(baseline: list[dict], current: list[dict], kind: str = CPU, runs: dict | None = None) -> dict:
    """{(task, split, metric, kind): [each (cell, seed)'s signed change, > 0 better]} between two sides that ran
    the same code on the same weights and data in other arithmetic (every matched cell, none judged exactly): `kind`
    where both ran a step in one precision (the variant's kind of difference), `precision` where not. `runs`, where
    given, gathers {(task, metric, kind): {run: [changes of its reported splits]}}."""
    from ..records.record import value
    from .keys import direction
    from .match import axes, index, match

    ax = axes(baseline, current)
    found = match(index(baseline, ax), index(current, ax), ax, exact=False)
    out = defaultdict(list)
    for group, seeds in found.pairs.items():
        if not judged(group.task, group.dataset, group.metric):
            continue
        for rb, rc in seeds.values():
            if any(rb.get(w) != rc.get(w) for w in ("checkpoint_sha256", "data_version")):
                continue
            vb, vc = value(rb, group.split, group.metric), value(rc, group.split, group.metric)
            if vb is None or vc is None or not (math.isfinite(vb) and math.isfinite(vc)):
                continue
            how = kind_of(rb, rc)
            if how != UNKNOWN:
                key = (group.task, group.split, group.metric, PRECISION if how == PRECISION else kind)
                d = direction(rb, group.metric) * (vc - vb)
                out[key].append(d)
                if runs is not None and group.split != "val":
                    run = run_of(group.task, group.backbone, group.dataset, int(rb["seed"]))
                    runs.setdefault((group.task, group.metric, key[3]), {}).setdefault(run, []).append(d)
    return dict(out)


def summary(d: list[float]) -> dict:
    x = np.asarray(d, dtype=np.float64)
    moved = x[x != 0]
    return {
        "ms": float(np.mean(x**2)),
        "df": int(x.size),
        "mean": float(x.mean()),
        "worse": float(np.mean(moved < 0)) if moved.size else 0.5,
        "moved": int(moved.size),
    }


def measure(clean: list[dict], sides: list, *, suite: str, commit: str) -> dict:
    """The model from `sides`: (name, what, kind of difference, records paired with `clean` or a (baseline,
    current) pair of their own). Per (task, split, metric, kind), the variant with the largest mean square wins."""
    tasks: dict = {}
    run_model: dict = {}
    variants = []
    for name, what, kind, records in sides:
        base, cur = records if isinstance(records, tuple) else (clean, records)
        runs: dict = {}
        found = changes(base, cur, kind, runs)
        for (task, metric, k), per in runs.items():
            s = {**summary([float(np.mean(d)) for d in per.values()]), "variant": name}
            slot = run_model.setdefault(task, {}).setdefault(metric, {})
            if k not in slot or s["ms"] > slot[k]["ms"]:
                slot[k] = s
        variants.append({"name": name, "what": what, "kind": kind, "changes": sum(len(v) for v in found.values())})
        for (task, split, metric, kind), d in found.items():
            s = {**summary(d), "variant": name}
            slot = tasks.setdefault(task, {}).setdefault(split, {}).setdefault(metric, {})
            if kind not in slot or s["ms"] > slot[kind]["ms"]:
                slot[kind] = s
    code = code_digests(clean)
    return {"suite": suite, "commit": commit, "code": code, "variants": variants, "tasks": tasks, "runs": run_model}
