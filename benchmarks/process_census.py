"""Where the test command's time goes: every Python process it starts, and the tests that start them.

    python -m benchmarks.process_census [--out FILE] [pytest arguments ...]

Runs `python3 -m pytest -q --durations=0` (the README's test command with every test's time) with a hook that every
Python process of this interpreter runs at start while the census is on (a `.pth` file in site-packages, removed at
the end; it does nothing where TB_CENSUS, the census's folder, is unset): each one writes, as it exits, its
lifetime, whether it imported torch and the test that started it (PYTEST_CURRENT_TEST). pytest runs without its
cache folder, so that the census leaves nothing behind. A process killed with SIGKILL (the soak and kill tests)
writes nothing, nor do the processes Ray starts for itself; so the census counts at least the processes it names.
Prints a markdown summary: the command's wall and CPU time, the processes that imported torch by test, the share
of the tests' time spent in the tests that start a process, and pytest's own summary of any test that failed. About
10 minutes on 2 cores. CI does not run this.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import site
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

HOOK = """
import atexit, os, sys, time
_log, _t0 = os.path.join(os.environ["TB_CENSUS"], "census.tsv"), time.time()
def _written():
    fields = (round(time.time() - _t0, 2), int("torch" in sys.modules),
              os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0])
    try:
        with open(_log, "a") as f:
            f.write("\\t".join(map(str, fields)) + "\\n")
    except Exception:  # a census never breaks the process it counts
        pass
atexit.register(_written)
"""

ROOT = Path(__file__).resolve().parent.parent


def census(pytest_args: list[str]) -> dict:
    pth = Path(site.getsitepackages()[0]) / "_transferbench_census.pth"
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "hook.py").write_text(HOOK)
        log = Path(tmp) / "census.tsv"  # the hook's
        pth.write_text(  # one line, run by `site` at every start; its own globals, so that atexit finds them
            'import os; exec(compile(open(os.path.join(os.environ["TB_CENSUS"], "hook.py")).read(), "census", '
            '"exec"), {}) if "TB_CENSUS" in os.environ else 0\n'
        )
        env = dict(os.environ, TB_CENSUS=tmp)
        cmd = [sys.executable, "-m", "pytest", "-q", "--durations=0", "-p", "no:cacheprovider", *pytest_args]
        started = time.monotonic()
        try:
            done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        finally:
            pth.unlink(missing_ok=True)
        wall = time.monotonic() - started
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        rows = [line.split("\t") for line in log.read_text().splitlines()] if log.exists() else []
    phases = [(float(m[1]), m[2]) for m in re.finditer(r"^([0-9.]+)s call\s+(\S+)", done.stdout, re.M)]
    summary = next((line for line in done.stdout.splitlines()[::-1] if " in " in line and "passed" in line), "")
    failed = [line for line in done.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))]
    return {
        "rows": rows,
        "phases": phases,
        "wall": wall,
        "cpu": (usage.ru_utime, usage.ru_stime),
        "summary": summary,
        "failed": failed,
    }


def report(c: dict) -> str:
    user, system = c["cpu"]
    lines = [
        f"`python3 -m pytest -q --durations=0`: {c['summary'].strip('= ')}; {c['wall']:.0f} s from start to exit, "
        f"CPU {user:.0f} s user + {system:.0f} s system ({(user + system) / c['wall']:.0%} of one core).",
        "",
    ]
    by_test: dict = defaultdict(lambda: [0, 0.0])
    tests = set()
    for seconds, torch, test in c["rows"]:
        if not test:
            continue  # pytest's own workers
        tests.add(test)
        if torch == "1":
            by_test[test][0] += 1
            by_test[test][1] += float(seconds)
    total = sum(s for s, _ in c["phases"])
    spent = sum(s for s, name in c["phases"] if name in tests)
    n = sum(k for k, _ in by_test.values())
    lines += [
        f"Processes that imported torch: **{n}**, {sum(s for _, s in by_test.values()):.0f} s of their lifetimes "
        f"(started by {len(by_test)} tests). The {len(tests)} tests that start a Python process take "
        f"**{spent:.0f} s** of the {total:.0f} s that every test's call takes, summed over the workers (setups and "
        "teardowns aside: the embedded suite's generation, shared, is the setup of whichever test needs it first).",
        "",
        "| test | processes with torch | their lifetimes, s |",
        "|---|---|---|",
    ]
    for test, (k, s) in sorted(by_test.items(), key=lambda x: -x[1][1]):
        lines.append(f"| `{test}` | {k} | {s:.0f} |")
    if c["failed"]:
        lines += ["", "Failed:", "", *(f"- {line}" for line in c["failed"])]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="also write the summary here")
    args, rest = ap.parse_known_args(argv)
    text = report(census(rest))
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
