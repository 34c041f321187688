"""The gate's noise model: how far benign arithmetic moves every judged number of the nightly suite.

    python -m benchmarks.noise_model --work W                 # run every variant (about 70 minutes on 2 cores)
    python -m benchmarks.noise_model --work W --reuse         # measure from the runs already in W and write it
    python -m benchmarks.noise_model --list                   # the variants
    python -m benchmarks.noise_model --table                  # the package's model as a table
    python -m benchmarks.noise_model --work W --judge         # each variant's night against the clean run
    python -m benchmarks.noise_model --work W --reuse --measured results/nightly:ROLLING/anchors/<commit>-<digest>

The statistical tier (docs/regression.md) tests each comparison against this model, never against the night it
judges. The null of a comparison across machines is "the same code in other arithmetic", so the model is measured
on exactly that: the nightly suite of the anchor's own commit (read from the anchor's records, checked out in a git
worktree), run on this machine from a fresh home under several arithmetic variants, each paired cell by cell and
seed by seed with a clean run of the same code:

- `two_threads`: 2 torch threads per cell instead of 1 (another reduction order);
- `aten_default`: scalar ATen kernels (`ATEN_CPU_CAPABILITY=default`): other vector widths, other rounding;
- `onednn_off`: oneDNN disabled (`torch.backends.mkldnn.enabled = False`): convolutions and bf16 matmuls through
  ATen's own kernels;
- `bf16_on`: bf16 autocast forced on where a task autocasts (`--set bf16=on`; the records' setting written back
  before pairing), which gives the `precision` kind;
- the committed anchor itself against the clean run: another CPU (the anchor's), the same code.

Each variant measures one kind of difference (gate.noise.KINDS): `threads`, `kernels` (ATen's capability on one
processor), `onednn`, `precision` (a step in bf16 on one side and fp32 on the other, whichever variant showed it) and
`cpu` (another processor). For each (task, split, metric) and kind the model keeps the mean square of the
per-(cell, seed) change around 0 over the variant that moves it most, its degrees of freedom (the changes behind
it), the mean change (a sign bias, which bf16 against fp32 has) and the share of changes that went the worse way.
The gate takes, for each comparison, the largest of the kinds its two sides differ in. The model records the code
fingerprint of each task (the anchor's), the suite, the variants and the date: `gate.noise` refuses a model whose
code is not the baseline's, naming this command.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from tabulate import tabulate

ROOT = Path(__file__).resolve().parent.parent
TASKS = ("fewshot", "vtab", "hires", "ade20k", "diagnose", "imagenet_c", "lit", "pretrain")
SUITE = "nightly"
# the tasks whose cells train for minutes: a variant runs their first seed only (the clean run, all of them), so that
# the whole measurement takes about 70 minutes on 2 cores; the model's degrees of freedom count what was run
HEAVY = ("vtab", "hires", "ade20k", "imagenet_c", "lit")
VARIANT_SEEDS = ("--seeds", "0")
# oneDNN off in every process of a run (workers included): a sitecustomize first on the path
ONEDNN_OFF = "import torch\ntorch.backends.mkldnn.enabled = False\n"


@dataclass
class Variant:
    name: str
    what: str
    env: dict = field(default_factory=dict)
    args: tuple = ()
    jobs: int | None = None  # cells at once (default: --jobs)
    skip: tuple = ()  # tasks this variant does not change (their clean records stand in)
    relabel: dict = field(default_factory=dict)  # hparam -> the clean run's value, written back before pairing
    site: str = ""  # a sitecustomize module's text, first on the path
    kind: str = ""  # the kind of difference it measures (gate.noise.KINDS)


VARIANTS = [
    Variant("clean", "the anchor's code as it is, 1 thread per cell: every variant is paired with it"),
    Variant(
        "two_threads",
        "2 torch threads per cell instead of 1 (another reduction order)",
        args=("--cpus-per-cell", "2"),
        jobs=1,
        kind="threads",
    ),
    Variant(
        "aten_default",
        "scalar ATen CPU kernels (ATEN_CPU_CAPABILITY=default): other vector widths, other rounding",
        env={"ATEN_CPU_CAPABILITY": "default"},
        kind="kernels",
    ),
    Variant("onednn_off", "oneDNN disabled (torch.backends.mkldnn.enabled = False)", site=ONEDNN_OFF, kind="onednn"),
    Variant(
        "bf16_on",
        "bf16 autocast forced on (--set bf16=on) where a task autocasts: bf16 against the clean run's choice",
        args=("--set", "bf16=on"),
        # the tasks whose nightly cells ran in fp32 on every CPU measured (the committed anchor's included; the
        # pretraining probe's shipped profile pins fp32): their bf16 would be emulated on a CPU without bf16 units, at
        # several times the cost; a bf16-against-fp32 comparison of theirs takes the widest kind the model holds.
        # LiT's is measured by the committed anchor (bf16) against the clean run here (fp32), on all its seeds
        skip=("pretrain", "vtab", "hires", "ade20k", "lit"),
        relabel={"bf16": "auto"},
        kind="precision",
    ),
]


def anchor_commit(anchor: Path) -> str:
    from transferbench.anchor import anchor_commit as commit_of
    from transferbench.records.store import load_records

    sha, why = commit_of(load_records([anchor]))
    if sha is None:
        raise SystemExit(f"noise_model: the anchor {anchor} cannot give the code to measure: {why}")
    return sha


def checkout(work: Path, commit: str) -> Path:
    """A git worktree of `commit` under `work` (kept for --reuse), with the task specs where the package finds them."""
    tree = work / f"src-{commit[:12]}"
    if (tree / "transferbench").is_dir():
        return tree
    subprocess.run(["git", "worktree", "prune"], cwd=ROOT, capture_output=True)
    done = subprocess.run(
        ["git", "worktree", "add", "--detach", str(tree), commit], cwd=ROOT, capture_output=True, text=True
    )
    if done.returncode:
        raise SystemExit(f"noise_model: cannot check out {commit[:12]}: {done.stderr.strip()}")
    from transferbench.anchor import _own_tasks

    _own_tasks(tree)
    return tree


def run_variant(v: Variant, work: Path, src: Path, jobs: int, reuse: bool) -> tuple[Path, float]:
    """Run the nightly suite under `v` into work/NAME/runs from a fresh home (the clean run's decoded embedded data
    copied in); returns the records folder and the seconds it took."""
    base = work / v.name
    done = base / "done"
    if reuse and done.is_file():
        return base / "runs", float(done.read_text().split()[0])
    home, out = base / "home", base / "runs"
    if not reuse:
        shutil.rmtree(base, ignore_errors=True)
    embedded = work / "clean" / "home" / "embedded"
    if v.name != "clean" and embedded.is_dir() and not (home / "embedded").is_dir():
        shutil.copytree(embedded, home / "embedded")
    path = [str(src)]
    if v.site:
        site = base / "site"
        site.mkdir(parents=True, exist_ok=True)
        (site / "sitecustomize.py").write_text(v.site)
        path.insert(0, str(site))
    env = {**os.environ, **v.env, "TRANSFERBENCH_HOME": str(home), "PYTHONPATH": os.pathsep.join(path)}
    env.pop("TRANSFERBENCH_REBUILDING_ANCHOR", None)
    started = time.time()
    base.mkdir(parents=True, exist_ok=True)
    with open(base / "log", "a") as log:  # with --reuse an interrupted variant resumes: finished cells are kept
        for task in TASKS:
            if task in v.skip:
                continue
            cmd = [sys.executable, "-m", "transferbench.cli", "run", task, "--suite", SUITE, "--out", str(out)]
            cmd += ["--jobs", str(v.jobs or jobs), "--no-progress", *v.args]
            cmd += [*VARIANT_SEEDS] if v.name != "clean" and task in HEAVY else []
            log.write("$ " + " ".join(cmd) + "\n")
            log.flush()
            t = time.time()
            rc = subprocess.run(cmd, env=env, cwd=src, stdout=log, stderr=subprocess.STDOUT).returncode
            print(f"  {v.name}: {task} exit {rc} in {time.time() - t:.0f} s", file=sys.stderr, flush=True)
            if rc not in (0, 1):
                raise SystemExit(f"noise_model: {v.name}: {task} exited {rc}: see {base / 'log'}")
    seconds = time.time() - started
    done.write_text(f"{seconds:.1f}\n")
    return out, seconds


def load(out: Path, v: Variant) -> list:
    """A variant's records, its relabelled settings written back (the tasks it skipped are not in them: they are
    missing from its pairs, not measured as unmoved)."""
    from transferbench.records.store import load_records

    records = load_records([out])
    for r in records:
        r["hparams"].update({k: x for k, x in v.relabel.items() if k in r["hparams"]})
    return records


def table(model: dict) -> str:
    """The model as a markdown table: per task, split and metric, each kind's rms over its changes."""
    from transferbench.gate.noise import KINDS

    entries = [
        (task, split, metric, kinds)
        for task, splits in sorted(model["tasks"].items())
        for split, metrics in sorted(splits.items())
        for metric, kinds in sorted(metrics.items())
    ]
    rows = []
    for task, split, metric, kinds in entries:
        row = [task, split, metric]
        for kind in KINDS:
            e = kinds.get(kind)
            row.append(f"{e['ms'] ** 0.5:.3g} ({e['df']})" if e else "-")
            if kind == "precision" and e:
                row[-1] += f", mean {e['mean']:+.2g}"
        rows.append(row)
    return tabulate(rows, ["task", "split", "metric", *KINDS], tablefmt="github", disable_numparse=True)


def judge(work: Path, anchor: Path, model: dict) -> str:
    """Each variant's records, and the committed anchor's, judged against the clean run by the statistical tier
    alone: with the model as measured, and with the model measured without that variant (a runner whose arithmetic
    was never measured). A markdown table."""
    from transferbench.gate.decide import decide
    from transferbench.gate.noise import Model, measure
    from transferbench.records.store import load_records

    clean = load(work / "clean" / "runs", VARIANTS[0])
    committed = [r for r in load_records([anchor]) if (r.get("suite") or "") == SUITE]
    sides = {v.name: (v.kind, load(work / v.name / "runs", v)) for v in VARIANTS[1:] if (work / v.name).is_dir()}
    sides["machine"] = ("cpu", committed)
    rows = []
    for name, (_, records) in sides.items():
        base, cur = (committed, clean) if name == "machine" else (clean, records)
        others = [(n, "", k, r) for n, (k, r) in sides.items() if n != name]
        held = measure(clean, others, suite=SUITE, commit=model["commit"])
        for label, m in (("as measured", model), ("without it", held)):
            v = decide(base, cur, noise=Model.of({"tasks": m["tasks"]}), allow_missing=True, exact=False)
            fired = sorted({f"{c.task} {c.kind.value}" for c in v.gate.regressed + v.gate.improved})
            rows.append([name, label, v.code, len(v.gate.of("cell")), ", ".join(fired) or "-", "; ".join(v.reasons)])
    head = ["night", "model", "exit", "comparisons", "tests that fired", "why it fails"]
    return tabulate(rows, head, tablefmt="github", disable_numparse=True)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, help="the worktree, homes and records of every variant (kept for --reuse)")
    ap.add_argument(
        "--reuse",
        action="store_true",
        help="keep the variants already run in --work (an interrupted one resumes where it stopped)",
    )
    ap.add_argument("--only", help="comma-separated variants to run (the clean run always runs first)")
    ap.add_argument("--list", action="store_true", help="print the variants and exit")
    ap.add_argument("--jobs", type=int, default=2, help="cells at once (default 2)")
    ap.add_argument(
        "--anchor", type=Path, default=ROOT / "results" / "nightly", help="the anchor whose code is measured"
    )
    ap.add_argument("--commit", help="measure this commit's code instead of the anchor's")
    ap.add_argument(
        "--out",
        type=Path,
        default=ROOT / "transferbench" / "records" / "noise_model.json",
        help="where the model is written (default: the package's)",
    )
    ap.add_argument("--run-only", action="store_true", help="run the variants, write no model")
    ap.add_argument("--table", action="store_true", help="print the model at --out as a markdown table and exit")
    ap.add_argument(
        "--judge",
        action="store_true",
        help="with --work: judge each variant's run (and the committed anchor) against the clean run, with the model "
        "at --out and with it measured without that variant, and exit",
    )
    ap.add_argument(
        "--measured",
        action="append",
        default=[],
        metavar="ANCHOR:RERUN",
        help="also a measured pair of folders of the same code in two arithmetics (the committed anchor and its "
        "rerun on another runner, ROLLING/anchors/<commit>-<arithmetic>); repeatable",
    )
    return ap


def main(argv=None) -> int:
    ap = _parser()
    args = ap.parse_args(argv)
    if args.list:
        print(tabulate([[v.name, v.what] for v in VARIANTS], ["variant", "what"]))
        return 0
    if args.table:
        print(table(json.loads(args.out.read_text())))
        return 0
    if not args.work:
        ap.error("give --work W: the variants' runs are kept there")
    if args.judge:
        sys.path.insert(0, str(ROOT))
        print(judge(args.work, args.anchor, json.loads(args.out.read_text())))
        return 0
    sys.path.insert(0, str(ROOT))
    chosen = [v for v in VARIANTS if v.name == "clean" or not args.only or v.name in args.only.split(",")]
    commit = args.commit or anchor_commit(args.anchor)
    args.work.mkdir(parents=True, exist_ok=True)
    src = checkout(args.work, commit)
    seconds = {}
    for v in chosen:
        print(f"{v.name}: {v.what}", file=sys.stderr, flush=True)
        _, seconds[v.name] = run_variant(v, args.work, src, args.jobs, args.reuse)
    if args.run_only:
        return 0
    from transferbench.gate.noise import measure

    clean = load(args.work / "clean" / "runs", chosen[0])
    sides = [(v.name, v.what, v.kind, load(args.work / v.name / "runs", v)) for v in chosen[1:]]
    if args.anchor and args.anchor.is_dir():
        from transferbench.records.store import load_records

        anchor = [r for r in load_records([args.anchor]) if (r.get("suite") or "") == SUITE]
        what = f"the committed anchor {args.anchor.name} (its own CPU) against the clean run"
        sides.append(("machine", what, "cpu", anchor))
    for pair in args.measured:
        from transferbench.records.store import load_records

        a, b = pair.split(":", 1)
        pair = (load_records([a]), load_records([b]))
        sides.append((f"rerun:{Path(b).name}", f"{a} against its rerun {b}", "cpu", pair))
    model = measure(clean, sides, suite=SUITE, commit=commit)
    model["made_by"] = "python -m benchmarks.noise_model"
    model["date"] = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    model["seconds"] = {k: round(s, 1) for k, s in seconds.items()}
    args.out.write_text(json.dumps(model, indent=1, sort_keys=True) + "\n")
    print(f"wrote {args.out} from {', '.join(s[0] for s in sides)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
