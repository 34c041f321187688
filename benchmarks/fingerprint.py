"""What the code fingerprint costs (transferbench.fingerprint: each module on a computation's path parsed once per
process, its syntax tree hashed without docstrings; later uses hash the files' bytes), against lm-eval-harness's way
of naming the code in its cache key, `git rev-parse HEAD` in a subprocess (which misses uncommitted edits and does
not exist in a wheel install).

    python -m benchmarks.fingerprint [--seconds 2]

Rows, each in a fresh Python process after `import transferbench.adapters.fewshot` (its import is not counted):
- the first fingerprint of an embedded few-shot cell (the adapter's and the backbone family's closures, about 40
  modules): the start-up cost a run pays once per process (the driver, each worker);
- every fingerprint a run takes at start-up: a cell's, and one for each of the ten cache folders;
- a later fingerprint of the same cell in the same process (files read and hashed, trees not parsed again);
- the peer: `git rev-parse HEAD` in a subprocess.
Targets: the first fingerprint <= 1 s; a later one no slower than the peer (<= 1.0x).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from benchmarks import interleaved_medians

REPO = Path(__file__).resolve().parent.parent
_PROBE = """
import json, time
from transferbench.adapters.fewshot import FewshotAdapter
from transferbench.engine.compute import cell_code
from transferbench import fingerprint as F
t = time.perf_counter(); fp = cell_code(FewshotAdapter(), "mu4_dpn@embedded"); first = time.perf_counter() - t
t = time.perf_counter()
for kind in F.CACHE_CODE:
    F.for_cache(kind, "transferbench.backbones.registry")
caches = time.perf_counter() - t
print(json.dumps({"first": first, "all": first + caches, "modules": len(fp.modules)}))
"""


def run(seconds: float = 2.0, processes: int = 5) -> list[dict]:
    from transferbench.adapters.fewshot import FewshotAdapter
    from transferbench.engine.compute import cell_code

    fresh = [
        json.loads(subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True).stdout)
        for _ in range(processes)
    ]
    fresh.sort(key=lambda r: r["first"])
    median = fresh[len(fresh) // 2]
    adapter = FewshotAdapter()
    cell_code(adapter, "mu4_dpn@embedded")

    def git():
        subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, check=False)

    t = interleaved_medians({"again": lambda: cell_code(adapter, "mu4_dpn@embedded"), "git": git}, seconds)
    return [
        {
            "row": f"first fingerprint of a few-shot cell, new process ({median['modules']} modules)",
            "ms": 1e3 * median["first"],
        },
        {"row": "a cell's and all ten cache folders' fingerprints, new process", "ms": 1e3 * median["all"]},
        {"row": "the same cell's fingerprint again, same process", "ms": 1e3 * t["again"], "peer_ms": 1e3 * t["git"]},
    ]


def markdown(rows: list[dict]) -> str:
    out = ["| fingerprint | time | against `git rev-parse HEAD` (lm-eval's code key) | target |", "|---|---|---|---|"]
    first, _, again = rows
    out.append(f"| {first['row']} | {first['ms']:.0f} ms | - | <= 1 s {'ok' if first['ms'] <= 1000 else 'MISSED'} |")
    out.append(f"| {rows[1]['row']} | {rows[1]['ms']:.0f} ms | - | - |")
    ratio = again["ms"] / again["peer_ms"]
    out.append(
        f"| {again['row']} | {again['ms']:.1f} ms | {again['peer_ms']:.1f} ms: {ratio:.2f}x | "
        f"<= 1.0x {'ok' if ratio <= 1.0 else 'MISSED'} |"
    )
    return "\n".join(out)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=2.0)
    a = ap.parse_args()
    print(markdown(run(a.seconds)))
