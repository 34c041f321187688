"""Run every benchmark side by side and rewrite benchmarks/RESULTS.md.

    python -m benchmarks [--skip-e2e] [--threads 2] [--seconds 2]

Each benchmark measures ratios in one process against a peer measured in the same run: after a
warm-up, the contenders run in rotating rounds on every thread torch is set to, and each one's median
per call is compared. The end-to-end rows run
`transferbench run vtab|seg|lit|imagenet_c|hires|diagnose --suite embedded`, each in a fresh $TRANSFERBENCH_HOME
under /usr/bin/time (about 9, 4, 3, 4, 3 and 1 minutes on 2 cores); the segmentation evaluation row takes about 8
minutes (2,000 label maps through mmsegmentation's IoUMetric among them), the diagnostics row about 8 (1,000 images
through ViT-B/16 twice), the LiT rows about 1, the corruption rows about 1, the cache and fingerprint rows under 1,
the coverage rows about 2, the bf16 and data-path rows about 1, the paper-scale step rows about 3 on a CPU (b32 at
batch 8 and the data paths alone; the GPU rows print "no GPU") or about 15 on one H100, the executor rows about 15
(the embedded VTAB suite with --jobs 1, --jobs 2 and Ray), the rest about 3. CI does not run this.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

from . import (
    backbone_overhead,
    cache_verify,
    corruption_speed,
    coverage,
    diagnostics_speed,
    dtn_layer,
    executors,
    fewshot_solver,
    fingerprint,
    gemm_peak,
    lit_speed,
    paper_step,
    precision_choice,
    seg_eval,
)

HERE = Path(__file__).parent


def machine() -> str:
    from transferbench.engine.compute import environment

    env = environment()
    return (
        f"{env.get('device', platform.processor())}; python {platform.python_version()}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads"
    )


def end_to_end(task: str = "vtab") -> str:
    with tempfile.TemporaryDirectory() as home:
        out = Path(home) / "runs"
        cmd = [
            "/usr/bin/time",
            "-v",
            sys.executable,
            "-m",
            "transferbench.cli",
            "run",
            task,
            "--suite",
            "embedded",
            "--out",
            str(out),
            "--no-progress",
        ]
        started = time.time()
        proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "TRANSFERBENCH_HOME": home})
        wall = time.time() - started
        rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr)
        again = time.time()
        subprocess.run(cmd[2:], capture_output=True, text=True, env={**os.environ, "TRANSFERBENCH_HOME": home})
        rerun = time.time() - again
    status = "ok" if proc.returncode == 0 else f"exit {proc.returncode}"
    return (
        f"| `transferbench run {task} --suite embedded` (fresh home: data generation included) | "
        f"{wall / 60:.1f} min | {int(rss.group(1)) / 1e6 if rss else float('nan'):.2f} GB | {rerun:.1f} s | {status} |"
    )


E2E_HEAD = "| command | wall | peak RSS | rerun (all cells skipped) | status |\n|---|---|---|---|---|\n"


def _backbone_rows(seconds: float) -> str:
    """The backbone throughput section: ours against timm, DPN and DTN's overhead, in fp32 and, where the CPU has bf16
    units, in bf16."""
    rows = [
        backbone_overhead.run(size, batch, False, backward, seconds)
        for size, batch in (("mu4", 32), ("s16", 8), ("b32", 8))
        for backward in (False, True)
    ]
    # a training-size batch, where DTN's cache-sized slices matter; timm and DPN are left out for time
    rows.append(backbone_overhead.run("s16", 32, False, True, seconds, models=("ours", "dtn")))
    if not gemm_peak.cpu_bf16_units():
        return backbone_overhead.markdown(rows) + (
            "\n\nbf16 rows are skipped: this CPU has no bf16 units (bf16 matmuls are emulated, ~9x slower than fp32)."
        )
    rows += [
        backbone_overhead.run(size, batch, True, backward, seconds)
        for size, batch in (("s16", 8), ("b32", 8))
        for backward in (False, True)
    ]
    return backbone_overhead.markdown(rows)


def _head(started: float) -> str:
    return (
        f"# Benchmark results\n\nWritten by `python -m benchmarks` on {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC "
        f"({(time.time() - started) / 60:.1f} min). Machine: {machine()}.\n"
        "Every figure is a ratio against a peer measured in the same run (medians over rotating rounds after a "
        "warm-up).\n\n"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--skip-e2e", action="store_true", help="skip the 16 minutes of end-to-end runs")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=2.0, help="minimum measuring time per timed call")
    ap.add_argument("--output", type=Path, default=HERE / "RESULTS.md")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    sections = []
    started = time.time()

    def section(title, body):
        print(f"## {title}\n\n{body}\n\n[{(time.time() - started) / 60:.1f} min]\n", flush=True)
        sections.append(f"## {title}\n\n{body}\n")

    # the DTN layer first: its temporaries are sensitive to what the allocator has been through, and the
    # backbone rows churn through gigabytes
    section("DTN layer vs the official algorithm", dtn_layer.markdown(dtn_layer.run(seconds=args.seconds)))
    section("Backbone throughput vs timm, DPN and DTN overhead", _backbone_rows(args.seconds))
    section(
        "bf16 auto vs off vs on on an embedded cell, and the batched data path",
        precision_choice.markdown(precision_choice.run()),
    )
    section(
        "Paper-scale fine-tuning step: ours vs timm, data path, MFU, a VTAB-1k cell, DTN in bf16",
        paper_step.markdown(paper_step.run(seconds=args.seconds)),
    )
    section("ViT-B/32 inference vs the GEMM peak", gemm_peak.markdown(gemm_peak.run(seconds=args.seconds)))
    section("Few-shot solver vs big_vision's algorithm", fewshot_solver.markdown(fewshot_solver.run(args.seconds)))
    section(
        "Segmentation: sliding-window evaluation and metric accumulation",
        seg_eval.markdown(seg_eval.window_overhead("ti16", 4, args.seconds), seg_eval.metric_speed(2000)),
    )
    section(
        "LiT: cached image features and zero-shot classifier construction",
        lit_speed.markdown(
            lit_speed.train_steps("b32", 224, 32, seconds=args.seconds), lit_speed.classifier_speed(1000, args.seconds)
        ),
    )
    section(
        "Robustness: the corruption generator's cache and process pool",
        corruption_speed.markdown(corruption_speed.run(600, 32, 16, 2, args.seconds)),
    )
    section("Caches: verifying an entry vs reading it", cache_verify.markdown(cache_verify.run(200, args.seconds)))
    section("Code fingerprints vs git rev-parse", fingerprint.markdown(fingerprint.run(args.seconds)))
    section("Coverage of suite-mean intervals: before and now", coverage.markdown(coverage.run()))
    section(
        "Diagnostics: all measures vs a plain forward pass at the b16 shape",
        diagnostics_speed.markdown(diagnostics_speed.run(images=1000, batch=50, rounds=1)),
    )
    if not args.skip_e2e:
        section("Executors: the embedded VTAB suite in parallel and on Ray", executors.markdown(executors.run()))
        section(
            "Embedded suites end to end",
            E2E_HEAD + "\n".join(end_to_end(t) for t in ("vtab", "seg", "lit", "imagenet_c", "hires", "diagnose")),
        )
    args.output.write_text(_head(started) + "\n".join(sections))
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
