"""How far each lever of the embedded pretraining profile moves the sanity question: a checkpoint pretrained
with the lever against random init of the same architecture, on the embedded few-shot suite.

    python -m benchmarks.pretrain_levers [--backbone mu4] [--only wd0,wd0_2400] [--work DIR]
    python -m benchmarks.pretrain_levers --list

Each variant is `transferbench pretrain --backbone B --set ...` in one home (the upstream data is generated
once), one thread, then `transferbench run fewshot --suite embedded --backbone B@<its checkpoint>,B` into a
records folder of its own. It prints, per variant, the pretraining time and upstream accuracy, the paired
gain over the 7 sets at 25 and 10 shots (`records.stats.paired_suite_difference`, the leaderboard's sanity
column) and the sets whose paired 95% interval lies below 0. A variant already in --work is not recomputed
(records are kept there). One pretraining seed per variant: differences of about a point between variants
are within what another pretraining seed would give.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from tabulate import tabulate

from transferbench.adapters import prepare_task
from transferbench.paths.portable import expand
from transferbench.records.stats import paired_difference, paired_suite_difference
from transferbench.records.store import load_records

WD0 = ("wd=1e-6",)  # big_vision's decay semantics, 1e-4 -> 1e-6: AdamW weight_decay 1e-3 on the kernels
LONG = ("steps=2400", "warmup_steps=120")
VARIANTS = {  # name -> --set overrides of the embedded pretraining profile
    "profile": (),
    "wd0": WD0,
    "wd0_2400": WD0 + LONG,
    "wd0_4800": WD0 + ("steps=4800", "warmup_steps=240"),
    "wd0_sigmoid": WD0 + ("loss=sigmoid",),
    "wd0_2400_sigmoid": WD0 + LONG + ("loss=sigmoid",),
    "wd0_2400_light2": WD0 + LONG + ("aug=light2",),  # randaug(2, 0) and mixup 0.2
    # DTN's mixing logits and positional weights at 10x and 30x the learning rate (mu4_dtn)
    "wd0_2400_dtnlr10": WD0 + LONG + ("dtn_lr_mult=10",),
    "wd0_2400_dtnlr30": WD0 + LONG + ("dtn_lr_mult=30",),
}
VARIED = sorted({s.split("=", 1)[0] for sets in VARIANTS.values() for s in sets})  # what tells variants apart


def cli(args: list[str], home: Path, log: Path) -> None:
    env = {**os.environ, "TRANSFERBENCH_HOME": str(home), "OMP_NUM_THREADS": "1"}
    with open(log, "a") as f:
        done = subprocess.run([sys.executable, "-m", "transferbench.cli", *args], env=env, stdout=f, stderr=f)
    if done.returncode:
        sys.exit(f"pretrain_levers: `transferbench {' '.join(args)}` failed (exit {done.returncode}); see {log}")


def gains(records: list[dict], backbone: str) -> dict:
    """shots -> (suite-mean Estimate, [sets significantly below random init])."""
    values = defaultdict(lambda: defaultdict(dict))  # (shots, which) -> dataset -> seed -> accuracy
    for r in records:
        if r["task"] == "fewshot" and r["status"] == "ok" and r["stage"] == "final":
            which = "random" if r["backbone"] == backbone else "trained"
            values[(r["hparams"]["shots"], which)][r["dataset"]][r["seed"]] = r["metrics"]["test"]["accuracy"]
    out = {}
    for shots in (25, 10):
        cur, ref = values[(shots, "trained")], values[(shots, "random")]
        worse = [ds for ds in cur if (d := paired_difference(cur[ds], ref[ds])) and d.high is not None and d.high < 0]
        out[shots] = paired_suite_difference(cur, ref), worse
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backbone", default="mu4")
    ap.add_argument("--only", help="comma-separated variants (default: all)")
    ap.add_argument("--work", help="folder kept between runs (default: a temporary one)")
    ap.add_argument("--list", action="store_true", help="print the variants and exit")
    args = ap.parse_args()
    if args.list:
        print(tabulate([[k, " ".join(v) or "(tasks/pretrain.yaml's profile)"] for k, v in VARIANTS.items()]))
        return
    names = args.only.split(",") if args.only else list(VARIANTS)
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        sys.exit(f"pretrain_levers: unknown variant(s) {', '.join(unknown)}; see --list")
    work = Path(args.work or tempfile.mkdtemp(prefix="pretrain-levers-"))
    home, rows = work / "home", []
    for name in names:
        out, log = work / "runs" / name, work / f"{name}.log"
        sets = [a for s in VARIANTS[name] for a in ("--set", s)]
        t = time.time()
        cli(["pretrain", "--backbone", args.backbone, *sets, "--no-progress"], home, log)
        hp = prepare_task("pretrain", suite="embedded", sets=list(VARIANTS[name])).hparams
        (rec,) = [
            r
            for r in load_records([home / "pretrain"])
            if r["backbone"] == args.backbone and all(r["hparams"].get(k) == hp.get(k) for k in VARIED)
        ]
        ckpt = expand(rec["info"]["checkpoint"])
        cli(["run", "fewshot", "--suite", "embedded", "--backbone", f"{args.backbone}@{ckpt},{args.backbone}",
             "--out", str(out), "--no-progress"], home, log)  # fmt: skip
        g = gains(load_records([out]), args.backbone)
        rows.append(
            [name, f"{rec['seconds']:.0f}", f"{rec['metrics']['test']['accuracy']:.1f}"]
            + [f"{g[s][0].mean:+.1f} ± {g[s][0].ci:.1f}" for s in (25, 10)]
            + [", ".join(g[25][1]) or "none"]
        )
        print(f"{name}: done in {time.time() - t:.0f} s", flush=True)
    head = ["variant", "pretrain s", "upstream acc", "25-shot gain", "10-shot gain", "sets below random init (25)"]
    print(tabulate(rows, head, tablefmt="github"))


if __name__ == "__main__":
    main()
