"""The smallest uniform fault the statistical tier catches in each task across arithmetic, and its quiet on benign
pairs of machines.

    python -m benchmarks.gate_floor                                  # the committed nightly records
    python -m benchmarks.gate_floor --benign A:B [--benign C:D ...]  # also gate real pairs of benign runs
    python -m benchmarks.gate_floor --current B                      # fault B, another machine's run, against A

For each task of the committed nightly records (results/nightly), a copy of the records whose current side ran on
another machine (another arithmetic digest: nothing can be judged exactly) gets every metric of that task alone made
worse by `size` points: `size` percent of the value where its floor is relative (a training signal, a norm), `size`
times its floor where the floor is in its own units (a cosine). Each seed's change varies by +-20% of it (seed 0 -20%,
seed 1 as is, seed 2 +20%), as a real fault's would. The night is gated like `transferbench regress` (records.gate.
decide) at every size of a grid; the table gives the smallest size at which the night fails with a test of that task
firing, and which tests fired. A benign pair (--benign BASELINE:CURRENT, two records folders of the same code made
on two machines, e.g. the committed anchor and a runner's rebuild of it) is gated as it is: it must pass. With
`--current`, the faults go on that folder's records (the same code run on another machine) instead of a copy of the
baseline, so that the night carries real arithmetic noise besides the fault.

The faults here edit numbers, not code: they measure the statistics (units, variances, floors), not how a code
fault shows in the numbers (benchmarks/gate_power.py runs real code faults).
"""

from __future__ import annotations

import argparse
import copy
import time
from pathlib import Path

from transferbench.records import comparisons
from transferbench.records.gate import decide
from transferbench.records.metrics import EITHER, LOWER, declared
from transferbench.records.store import load_records

NIGHTLY = Path(__file__).parent.parent / "results" / "nightly"
SIZES = (0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0)
FAILING = (*comparisons.FAILING, comparisons.Verdict.SEE_POOLED)  # every verdict that fails, told where it is


def other_machine(records: list) -> list:
    out = copy.deepcopy(records)
    for r in out:
        arith = r.setdefault("arithmetic", {})
        arith["digest"] = "elsewhere"
        arith.setdefault("machine", {}).update(digest="elsewhere", cpu="another cpu")
    return out


def worsen(records: list, task: str, size: float, spread: float = 0.2) -> list:
    """`task`'s metrics worse by `size` (points, percent of the value, or floors: see the module docstring)."""
    for r in records:
        if r["task"] != task:
            continue
        factor = 1 + spread * ((int(r["seed"]) % 3) - 1)
        for values in r["metrics"].values():
            for metric, v in values.items():
                d = declared(task, metric, r)
                step = size if d.floor is None else size / 100 * abs(v) if d.relative else size * d.floor
                if d.direction == EITHER:
                    values[metric] = v + step * factor
                else:
                    values[metric] = v + (step if d.direction == LOWER else -step) * factor
    return records


def smallest(records: list, task: str, current: list | None = None) -> dict:
    for size in SIZES:
        v = decide(records, worsen(copy.deepcopy(current) if current else other_machine(records), task, size))
        kinds = sorted({c.kind for c in v.gate.comparisons if c.task == task and c.verdict in FAILING})
        if v.code and kinds:
            return {"task": task, "size": size, "fired": kinds}
    return {"task": task, "size": None, "fired": []}


def unit(task: str, records: list) -> str:
    metrics = {m for r in records if r["task"] == task for v in r["metrics"].values() for m in v}
    kinds = set()
    for m in metrics:
        d = declared(task, m)
        kinds.add("points" if d.floor is None else "% of the value" if d.relative else "floors")
    return " / ".join(sorted(kinds))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=Path, default=NIGHTLY, help="the nightly records to fault (default: committed)")
    ap.add_argument("--benign", action="append", default=[], metavar="BASELINE:CURRENT")
    ap.add_argument("--current", type=Path, help="fault this folder's records (the same code on another machine)")
    args = ap.parse_args(argv)
    started = time.time()
    records = [r for r in load_records([args.records]) if r["status"] == "ok"]
    tasks = sorted({r["task"] for r in records})
    current = [r for r in load_records([args.current]) if r["status"] == "ok"] if args.current else None
    rows = [smallest(records, t, current) for t in tasks]
    print("| task | smallest uniform fault caught (+-20% between seeds) | unit | tests that fired |")
    print("|---|---|---|---|")
    for row in rows:
        size = "not caught up to 5" if row["size"] is None else f"{row['size']:g}"
        print(f"| {row['task']} | {size} | {unit(row['task'], records)} | {', '.join(row['fired'])} |")
    nothing = decide(records, other_machine(records))
    print(f"\nThe same records on another machine, nothing changed: exit {nothing.code} {nothing.reasons or ''}")
    for pair in args.benign:
        base, cur = pair.split(":")
        v = decide(load_records([Path(base)]), load_records([Path(cur)]))
        g = v.gate
        print(
            f"- benign {base} -> {cur}: exit {v.code} {v.reasons or ''}; {g.exact.judged} cells exact, "
            f"{len(g.of('cell'))} comparisons, {len(g.regressed)} fired for the worse, {len(g.improved)} for the better"
        )
    print(f"\n({time.time() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
