"""How often the statistical tier catches a fault across arithmetic, task by task, and how often it alarms when
nothing but the arithmetic changed: simulated nights on the committed nightly records.

    python -m benchmarks.gate_floor                               # 20 nights a size, 100 benign nights
    python -m benchmarks.gate_floor --nights 5 --benign 10        # a quick look
    python -m benchmarks.gate_floor --benign-pair A:B             # also gate a real pair of benign runs

A night is the committed nightly records (results/nightly) against a copy that ran "on another machine": every
record's arithmetic digest differs, so nothing is judged exactly and the statistical tier decides alone, against the
package's noise model (`--arithmetic`: on another processor, or with ATen's scalar kernels on this one, the widest
kind the model holds). The copy carries benign noise at `--noise` times the model's root mean square (default 2, the
gate's NOISE_TOLERANCE: the noisiest runner it promises to stay quiet for), the rms floored at the metric's
resolution as the gate floors it: one normal draw per run (a data set's seed; a seed where one run serves every data
set) shared by every comparison of that run, the worst case for the run-level tests, scaled by each comparison's
model rms, and rounded to the metric's resolution (one example).

Faults, in every task at once (each task's verdict is read from its own tests), at sizes 0.5, 1, 2 and 4: points
for a percentage, percent of the value for a relative metric (a training signal, a norm, a distance), floors for a
metric with a floor in its own units (a cosine). Each (cell, seed)'s fault is the size times a random factor
N(1, 0.2^2), as a real fault's varies between seeds:
- `backbone`: every cell of one backbone (drawn each night);
- `group`: one (data set, stage, axes) of one backbone: a corruption, a stage, a shot count, a fraction;
- `all`: every cell of every backbone.
A task's fault is caught when a test of that task fails the night. The faults edit numbers, not code: they measure
the statistics; benchmarks/gate_power.py and docs/regression.md run real code faults.
"""

from __future__ import annotations

import argparse
import copy
import math
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from transferbench.gate import comparisons
from transferbench.gate.decide import decide
from transferbench.gate.metrics import EITHER, LOWER, declared
from transferbench.gate.noise import judged, packaged, resolution, run_of
from transferbench.records.store import load_records

NIGHTLY = Path(__file__).parent.parent / "results" / "nightly"
SIZES = (0.5, 1.0, 2.0, 4.0)
KINDS = ("backbone", "group", "all")
FAILING = (*comparisons.FAILING, comparisons.Verdict.SEE_POOLED)  # every verdict that fails, told where it is
SEED_SPREAD = 0.2


def other_machine(records: list, kind: str = "cpu") -> list:
    """A copy of `records` as computed in other arithmetic: on another processor (`cpu`), or on the same one with
    ATen's scalar kernels (`kernels`)."""
    out = copy.deepcopy(records)
    for r in out:
        arith = r.setdefault("arithmetic", {})
        arith["digest"] = "elsewhere"
        machine = arith.setdefault("machine", {})
        machine["digest"] = "elsewhere"
        if kind == "cpu":
            machine["cpu"] = "another cpu"
        else:
            machine["cpu_capability"] = "DEFAULT"
    return out


def add_noise(records: list, rng, scale: float, model=None, kind: str = "cpu") -> list:
    """Benign noise at `scale` times the model's rms of `kind`, rounded to each metric's resolution: a draw per run
    (a data set's seed; a seed where one run serves every set) at the model's rms of a run's mean, shared by the run's
    comparisons, and an independent draw per comparison for the rest of its own rms (where the model has no run
    figure, the whole rms is shared: the worst case for the run-level tests)."""
    model = model or packaged()
    draws: dict = {}
    for r in records:
        z = draws.setdefault((r["task"], *run_of(r["task"], r["backbone"], r["dataset"], r["seed"])), rng.normal())
        for split, values in r["metrics"].items():
            for metric, v in values.items():
                if v is None or not judged(r["task"], r["dataset"], metric):
                    continue
                e = model.entry(r["task"], split, metric, kind)
                if e is None:
                    continue
                step = resolution(r, split, metric, v)
                ms = max(e.ms, step**2)  # the gate's null: at least one example
                run = model.run_entry(r["task"], metric, kind)
                shared = min(run.ms, ms) if run is not None and split != "val" else ms
                d = scale * (math.sqrt(shared) * z + math.sqrt(ms - shared) * rng.normal())
                values[metric] = v + (round(d / step) * step if step > 1e-6 * max(1.0, abs(v)) else d)
    return records


def size_of(task: str, metric: str, r: dict, v: float, size: float) -> float:
    d = declared(task, metric, r)
    return size if d.floor is None else size / 100 * abs(v) if d.relative else size * d.floor


def fault(records: list, task: str, kind: str, size: float, rng) -> str:
    """Make `task`'s cells worse by `size` (see the module docstring); returns what was faulted."""
    mine = [r for r in records if r["task"] == task]
    backbone = sorted({r["backbone"] for r in mine})[rng.integers(len({r["backbone"] for r in mine}))]
    groups = sorted(
        {
            (r["dataset"], r.get("stage", ""), str(sorted(r["hparams"].items())))
            for r in mine
            if r["backbone"] == backbone
        }
    )
    group = groups[rng.integers(len(groups))]
    for r in mine:
        if kind != "all" and r["backbone"] != backbone:
            continue
        if kind == "group" and (r["dataset"], r.get("stage", ""), str(sorted(r["hparams"].items()))) != group:
            continue
        factor = rng.normal(1.0, SEED_SPREAD)
        for values in r["metrics"].values():
            for metric, v in values.items():
                if v is None:
                    continue
                step = size_of(task, metric, r, v, size) * factor
                d = declared(task, metric, r)
                values[metric] = v + (step if d.direction in (EITHER, LOWER) else -step)
    return backbone if kind != "all" else "all"


def caught(decision, task: str) -> bool:
    return bool(decision.code) and any(c.task == task and c.verdict in FAILING for c in decision.gate.comparisons)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=Path, default=NIGHTLY, help="the nightly records (default: the committed anchor)")
    ap.add_argument("--nights", type=int, default=20, help="faulted nights per size and kind (default 20)")
    ap.add_argument("--benign", type=int, default=100, help="benign nights (default 100)")
    ap.add_argument("--noise", type=float, default=2.0, help="benign noise in the model's rms (default 2)")
    ap.add_argument("--sizes", default=",".join(f"{s:g}" for s in SIZES))
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--arithmetic",
        choices=("cpu", "kernels"),
        default="cpu",
        help="the night's other arithmetic: another processor (cpu, default), or ATen's scalar kernels (kernels), "
        "the widest kind the model holds",
    )
    ap.add_argument("--benign-pair", action="append", default=[], metavar="BASELINE:CURRENT")
    args = ap.parse_args(argv)
    started = time.time()
    rng = np.random.default_rng(args.seed)
    records = [r for r in load_records([args.records]) if r["status"] == "ok"]
    tasks = sorted({r["task"] for r in records})
    alarms, fired = 0, defaultdict(int)
    for _ in range(args.benign):
        v = decide(records, add_noise(other_machine(records, args.arithmetic), rng, args.noise, kind=args.arithmetic))
        if v.code:
            alarms += 1
            for c in v.gate.comparisons:
                if c.verdict in FAILING:
                    fired[(c.task, c.kind.value)] += 1
    print(
        f"Benign nights at {args.noise:g}x the model's rms: {alarms} of {args.benign} alarmed"
        + (f" ({dict(fired)})" if fired else "")
    )
    sizes = [float(s) for s in args.sizes.split(",")]
    hits = defaultdict(int)
    for kind in args.kinds.split(","):
        for size in sizes:
            for _ in range(args.nights):
                current = add_noise(other_machine(records, args.arithmetic), rng, args.noise, kind=args.arithmetic)
                for task in tasks:
                    fault(current, task, kind, size, rng)
                v = decide(records, current)
                for task in tasks:
                    hits[(kind, size, task)] += caught(v, task)
    for kind in args.kinds.split(","):
        print(f"\n{kind}: share of {args.nights} nights caught, per task and size")
        print("| task | " + " | ".join(f"{s:g}" for s in sizes) + " |")
        print("|---|" + "---|" * len(sizes))
        for task in tasks:
            print(f"| {task} | " + " | ".join(f"{hits[(kind, s, task)] / args.nights:.2f}" for s in sizes) + " |")
    for pair in args.benign_pair:
        base, cur = pair.split(":")
        v = decide(load_records([Path(base)]), load_records([Path(cur)]))
        print(f"\nbenign pair {base} -> {cur}: exit {v.code} {v.reasons or ''}; {len(v.gate.of('cell'))} comparisons")
    print(f"\n({time.time() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
