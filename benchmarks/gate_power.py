"""How often the nightly gate catches a real bug, and whether it stays quiet when only the arithmetic changes.

    python -m benchmarks.gate_power                      # every variant (about 70 minutes on 2 cores)
    python -m benchmarks.gate_power --only clean,head_bias,aten_default
    python -m benchmarks.gate_power --list               # the catalogue
    python -m benchmarks.gate_power --tonight two_threads  # every variant under another arithmetic than the clean run

Each variant is a deliberate fault (a one-line edit of the code or of a task default, as a slip would make it) or a
benign change (the arithmetic only, or a pure refactor). The benchmark applies it to a temporary copy of the package
(put first on PYTHONPATH) and runs the nightly suite's subset below from a fresh home holding only the embedded data.
It then gates the records against a clean run of the same subset with `gate.decide.gate`, exactly as
`transferbench nightly` would. It prints, per variant, caught (a test fired, for the worse or the better, or a
protocol change, a missing or failed cell) or missed, whether the night fails, which tests fired,
how many cells changed at all, the largest change of an accuracy comparison and of a pooled accuracy mean, and the
time. The figures are in benchmarks/RESULTS.md and docs/regression.md.

The subset (about 3.5 minutes a variant): few-shot (all 7 sets x 4 shot counts), VTAB (mini_digits, both learning
rates) and the pretraining probe, each as its `nightly` suite has it: 3 shipped checkpoints and 3 seeds (the probe:
mu4, 5 seeds).

Across arithmetic (`--tonight NAME`): every variant runs under the environment and options of the benign arithmetic
variant NAME (two_threads, aten_default, aten_avx2) and is gated against the clean run, so that the exact tier cannot
judge and the statistical tier decides alone, as between two machines, against the package's noise model
(transferbench/gate/noise_model.json, measured by `python -m benchmarks.noise_model`).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tabulate import tabulate

from benchmarks.gate_variants import ACROSS, CATALOGUE, Variant

ROOT = Path(__file__).resolve().parent.parent
RUNS = (
    ("fewshot", ()),
    ("vtab", ("--datasets", "mini_digits")),
    ("pretrain", ()),
)


FAILING = ("regressed", "spread", "moved", "noise", "shift", "see pooled")


def across(work: Path, anchor: Path, jobs: int, reuse: bool) -> list:
    """Run each ACROSS fault on the anchor's commit here and judge it against the committed anchor (other CPU):
    rows of (task, fault, largest cell change, verdict, what fired). The noise model's clean run of the anchor's
    code here (work/clean) is judged the same way first: it must pass."""
    from benchmarks.noise_model import anchor_commit, checkout
    from transferbench.gate.decide import decide
    from transferbench.records.store import load_records

    src = checkout(work, anchor_commit(anchor))
    committed = load_records([anchor])
    rows = []
    clean = load_records([work / "clean" / "runs"])
    for task, what, path, old, new in [(t, "none (the anchor's code)", "", "", "") for t, *_ in ACROSS] + ACROSS:
        name = f"across-{task}"
        out = work / name
        if path and not (reuse and (out / "done").is_file()):
            shutil.rmtree(out, ignore_errors=True)
            pkg = out / "pkg"
            shutil.copytree(src / "transferbench", pkg / "transferbench", ignore=shutil.ignore_patterns("__pycache__"))
            if path:
                target = pkg / path
                text = target.read_text()
                if text.count(old) != 1:
                    raise SystemExit(f"{name}: {path} holds {text.count(old)} copies of {old!r}")
                target.write_text(text.replace(old, new))
            home = out / "home"
            shutil.copytree(work / "clean" / "home" / "embedded", home / "embedded")
            cmd = [sys.executable, "-m", "transferbench.cli", "run", task, "--suite", "nightly", "--seeds", "0"]
            cmd += ["--out", str(out / "runs"), "--jobs", str(jobs), "--no-progress"]
            env = {**os.environ, "TRANSFERBENCH_HOME": str(home), "PYTHONPATH": str(pkg)}
            # not in the worktree: `python -m` puts the working folder first on the path, ahead of the faulted copy
            done = subprocess.run(cmd, env=env, cwd=out, capture_output=True, text=True)
            if done.returncode not in (0, 1):
                raise SystemExit(f"{name}: exit {done.returncode}: {done.stderr[-2000:]}")
            (out / "done").write_text("ok\n")
        tonight = load_records([out / "runs"]) if path else [r for r in clean if r["task"] == task]
        base = [r for r in committed if r["task"] == task and (r.get("suite") or "") == "nightly"]
        v = decide(base, tonight, allow_missing=[f"cells:{task}"])
        g = v.gate
        cells = [abs(c.change) for c in g.of("cell") if c.p is not None]
        fired = sorted({f"{c.kind.value} {c.verdict.value}" for c in g.comparisons if c.verdict in FAILING})
        verdict = ("caught" if v.code else "missed") if path else ("quiet" if not v.code else "alarm")
        rows.append(
            [task, what, f"{max(cells, default=0):.3g}", verdict, ", ".join(fired) or "-", "; ".join(v.reasons)]
        )
        print(tabulate([rows[-1]], tablefmt="plain"), file=sys.stderr, flush=True)
    return rows


def _copy(tmp: Path, variant: Variant) -> Path:
    pkg = tmp / "pkg"
    shutil.copytree(ROOT / "transferbench", pkg / "transferbench", ignore=shutil.ignore_patterns("__pycache__"))
    if any(path.startswith("tasks/") for path, _, _ in variant.edits):
        shutil.copytree(ROOT / "tasks", pkg / "transferbench" / "tasks", ignore=shutil.ignore_patterns("__pycache__"))
    for path, old, new in variant.edits:
        target = pkg / ("transferbench/" + path if path.startswith("tasks/") else path)
        text = target.read_text()
        if text.count(old) != 1:
            raise SystemExit(f"{variant.name}: {path} holds {text.count(old)} copies of {old!r}; fix the catalogue")
        target.write_text(text.replace(old, new))
    return pkg


def run_variant(
    variant: Variant,
    work: Path,
    embedded: Path | None,
    jobs: int,
    reuse: bool = False,
    tonight: Variant | None = None,
    runs=RUNS,
) -> tuple[Path, float, str]:
    """Run `variant` (under `tonight`'s arithmetic, where given) into work/NAME (work/TONIGHT+NAME); returns its
    records folder, seconds and the last line of each run's log."""
    tmp = work / (f"{tonight.name}+{variant.name}" if tonight and tonight is not variant else variant.name)
    done_file = tmp / "done"
    if reuse and done_file.is_file():  # a finished run of this variant: gate its records again
        seconds, _, log = done_file.read_text().partition("\n")
        return tmp / "runs", float(seconds), log
    shutil.rmtree(tmp, ignore_errors=True)
    pkg = _copy(tmp, variant)
    home, out = tmp / "home", tmp / "runs"
    if variant.home_from:
        shutil.copytree(work / variant.home_from / "home", home, ignore=shutil.ignore_patterns(".locks"))
    elif embedded is not None:
        shutil.copytree(embedded, home / "embedded")
    arith = tonight if tonight is not None and tonight is not variant else Variant("", "", "", "")
    env = {**os.environ, **arith.env, **variant.env, "TRANSFERBENCH_HOME": str(home), "PYTHONPATH": str(pkg)}
    started, log = time.time(), []
    for task, extra in runs:
        cmd = [sys.executable, "-c", "import sys; from transferbench.cli import main; sys.exit(main())", "run", task]
        cmd += ["--suite", "nightly", "--out", str(out), "--jobs", str(jobs), "--no-progress", *extra]
        cmd += [*arith.args, *variant.args]
        done = subprocess.run(cmd, env=env, cwd=tmp, capture_output=True, text=True)
        log.append(done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "")
        if done.returncode not in (0, 1):
            if variant.kind == "fault" and done.returncode == 2:  # the run itself refused: a night that errors
                log.append(f"{task}: exit 2: {done.stderr.strip().splitlines()[-1]}")
                continue
            raise SystemExit(f"{variant.name}: {task} exited {done.returncode}:\n{done.stderr[-2000:]}")
    seconds = time.time() - started
    done_file.write_text(f"{seconds:.1f}\n" + "; ".join(log))
    return out, seconds, "; ".join(log)


def fired(g, failed=()) -> str:
    parts = [f"protocol {p.task}:{p.setting}" for p in g.unaccepted]
    parts += [f"{len(failed)} failed"] if failed else []
    parts += [f"{len(g.diverged)} diverged"] if g.diverged else []
    parts += [f"{len(g.missing)} missing"] if g.missing else []
    by = {}
    for c in g.regressed + g.improved:
        way = "" if c.kind in ("spread", "moved", "noise") else " worse" if c.verdict == "regressed" else " better"
        by.setdefault((f"{c.kind}{way}", c.task), set()).add(c.backbone.replace("@embedded", "@e"))
    parts += [f"{kind} {task} ({', '.join(sorted(b))})" for (kind, task), b in sorted(by.items())]
    return "; ".join(parts) or "-"


def _model():
    """The package's noise model, for this checkout's code: it was measured on the anchor's commit, whose code
    differs from the checkout's in modules that move no number (the gate would refuse it against a baseline of this
    code); the table's statistical tier is judged against it all the same, as a runner's night would be."""
    import dataclasses

    from transferbench.gate.noise import packaged

    return dataclasses.replace(packaged(), code={})


def judge(v: Variant, baseline: list, current: list, seconds: float, errored: bool, accept_code=()) -> list:
    """One row of the table: the gate's verdict on a variant's records against the clean run's."""
    from transferbench.gate.decide import gate

    g = gate(baseline, current, accept_code=accept_code, noise=_model())
    failed = [r for r in current if r["status"] == "failed"]
    t = g.exact
    fails = bool(g.regressed or g.unaccepted or g.missing or g.diverged or failed or errored or g.vanished)
    fails = fails or bool(t.failing or t.irreproducible)
    caught = fails or bool(g.improved) or bool(t.changed)
    cells = [abs(c.change) for c in g.of("cell") if c.metric == "accuracy"]
    cells += [abs(x.change) for x in t.changed + t.irreproducible if x.change is not None]
    pooled = [abs(c.change) for c in g.of("pooled") if c.metric == "accuracy"]
    named = ", ".join(m.removeprefix("transferbench.") for m in t.modules())
    exact = f"{t.judged}: {t.identical} identical" + (f", {len(t.changed)} changed by {named}" if t.changed else "")
    exact += f", {len(t.irreproducible)} irreproducible" if t.irreproducible else ""
    exact += " (accepted)" if t.changed and not t.failing else ""
    kind = v.kind if not accept_code else f"{v.kind}, --accept-code {','.join(accept_code)}"
    verdict = ("caught" if caught else "missed") if v.kind == "fault" else ("flagged" if fails else "quiet")
    return [
        v.name,
        kind,
        v.area,
        verdict,
        "fails" if fails else "passes",
        exact,
        str(t.statistical),
        ("a run exited 2; " if errored else "") + fired(g, failed),
        f"{max(cells, default=0):.2f}",
        f"{max(pooled, default=0):.2f}",
        f"{seconds:.0f}",
    ]


def splice(v: Variant, baseline: list, donor: list) -> tuple[list, str]:
    """The clean records with one replaced by `donor`'s record of the same cell where its precision differs (the
    first such cell in key order): a night where one cell's bf16 choice flipped."""
    import copy

    from transferbench.hashing import canon

    prec = lambda r: ((r.get("arithmetic") or {}).get("cell") or {}).get("precision")  # noqa: E731
    # the donor's cells carry its own setting (bf16=off) in their keys: match on what the cell is, setting aside
    # the settings the variant relabels
    ident = lambda r: canon(  # noqa: E731
        [r["task"], r["dataset"], r["backbone"], r.get("stage", ""), r["seed"]]
        + [{k: x for k, x in r["hparams"].items() if k not in v.relabel}]
    )
    theirs = {ident(r): r for r in donor}
    flipped = sorted(ident(r) for r in baseline if ident(r) in theirs and prec(r) != prec(theirs[ident(r)]))
    if not flipped:
        raise SystemExit(f"{v.name}: no cell of {v.splice} differs in precision from the clean run's")
    out = [copy.deepcopy(theirs[ident(r)]) if ident(r) == flipped[0] else r for r in baseline]
    return out, flipped[0]


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", help="comma-separated variant names (the clean run always runs first)")
    ap.add_argument("--list", action="store_true", help="print the catalogue and exit")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--work", type=Path, help="keep the copies, homes and records here (default: a temporary folder)")
    ap.add_argument(
        "--reuse", action="store_true", help="with --work: gate the variants already run there again, without rerunning"
    )
    ap.add_argument(
        "--tonight",
        help="run every variant under this benign arithmetic variant's environment and options (two_threads, "
        "aten_default, aten_avx2): the statistical tier judges alone, as between two machines",
    )
    ap.add_argument("--tasks", help="comma-separated tasks of the subset to run (default: fewshot,vtab,pretrain)")
    ap.add_argument(
        "--across",
        action="store_true",
        help="one real code fault per task (ACROSS) on the anchor's commit, run here and judged against the "
        "committed anchor by the statistical tier alone (--work: the noise model's work folder, whose clean home "
        "it reuses)",
    )
    return ap


def _variants(chosen: list, by_name: dict, baseline: list, tonight, work: Path, args, runs) -> list:
    """Each chosen variant run (or spliced from its donor's records) and judged against the clean baseline: its rows."""
    from transferbench.records.store import load_records

    embedded = work / "clean" / "home" / "embedded"
    rows = []
    for v in CATALOGUE[1:]:
        if v.name not in chosen:
            continue
        if v.home_from and not (work / v.home_from / "done").is_file():
            run_variant(by_name[v.home_from], work, embedded, args.jobs, args.reuse, runs=runs)
        if v.splice:
            donor_out, seconds, log = run_variant(by_name[v.splice], work, embedded, args.jobs, args.reuse, runs=runs)
            if tonight is not None:  # tonight's records, one of them from the donor's arithmetic
                night_out, _, _ = run_variant(tonight, work, embedded, args.jobs, args.reuse, runs=runs)
                current, cell = splice(v, load_records([night_out]), load_records([donor_out]))
            else:
                current, cell = splice(v, baseline, load_records([donor_out]))
            print(f"{v.name}: {cell} from {v.splice}", file=sys.stderr)
            seconds, log = 0.0, ""
        else:
            out, seconds, log = run_variant(v, work, embedded, args.jobs, args.reuse, tonight, runs)
            current = load_records([out])
        for r in current:
            r["hparams"].update({k: val for k, val in v.relabel.items() if k in r["hparams"]})
        rows.append(judge(v, baseline, current, seconds, "exit 2" in log))
        if v.accept_code:
            rows.append(judge(v, baseline, current, seconds, "exit 2" in log, v.accept_code))
        print(tabulate([rows[-1]], tablefmt="plain"), file=sys.stderr, flush=True)
    return rows


def main(argv=None) -> int:
    ap = _parser()
    args = ap.parse_args(argv)
    if args.list:
        print(tabulate([[v.name, v.kind, v.area, v.what] for v in CATALOGUE], ["variant", "kind", "area", "what"]))
        return 0
    if args.across:
        if not args.work:
            ap.error("--across needs --work W (the noise model's work folder)")
        sys.path.insert(0, str(ROOT))
        rows = across(args.work, ROOT / "results" / "nightly", args.jobs, args.reuse)
        head = ["task", "fault", "largest cell change", "verdict", "what fired", "why the night fails"]
        print(tabulate(rows, head, tablefmt="github", disable_numparse=True))
        return 0
    by_name = {v.name: v for v in CATALOGUE}
    chosen = [n for n in (args.only.split(",") if args.only else by_name) if n]
    unknown = sorted(set(chosen) - set(by_name))
    if unknown:
        print(f"gate_power: unknown variants {unknown}; --list shows the catalogue", file=sys.stderr)
        return 2
    tonight = by_name.get(args.tonight) if args.tonight else None
    if args.tonight and (tonight is None or not (tonight.env or tonight.args) or tonight.kind != "benign"):
        print(
            f"gate_power: --tonight {args.tonight}: name a benign arithmetic variant (two_threads, aten_default, "
            "aten_avx2)",
            file=sys.stderr,
        )
        return 2
    runs = [r for r in RUNS if not args.tasks or r[0] in args.tasks.split(",")]
    sys.path.insert(0, str(ROOT))
    from transferbench.records.store import load_records

    work = args.work or Path(tempfile.mkdtemp(prefix="gate-power-"))
    clean = CATALOGUE[0]
    base_out, clean_seconds, _ = run_variant(clean, work, None, args.jobs, args.reuse, runs=runs)
    print(f"clean baseline: {clean_seconds:.0f} s", file=sys.stderr, flush=True)
    baseline = load_records([base_out])
    rows = _variants(chosen, by_name, baseline, tonight, work, args, runs)
    head = ["variant", "kind", "area", "gate", "night", "exact tier", "statistical tier", "what fired"]
    head += ["max |cell Δ|", "max |pooled Δ|", "s"]
    if tonight is not None:
        print(f"Tonight's arithmetic: {tonight.name} ({tonight.what}); the clean run's is the committed one.\n")
    print(tabulate(rows, head, tablefmt="github", disable_numparse=True))
    faults = [r for r in rows if r[1] == "fault"]
    benign = [r for r in rows if r[1] == "benign"]
    print(
        f"\nfaults caught: {sum(r[3] == 'caught' for r in faults)} of {len(faults)} (failing the night: "
        f"{sum(r[4] == 'fails' for r in faults)}); benign changes flagged: "
        f"{sum(r[3] == 'flagged' for r in benign)} of {len(benign)}; the clean run took {clean_seconds:.0f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
