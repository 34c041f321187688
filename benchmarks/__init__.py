"""Speed benchmarks against peers; `python -m benchmarks` runs them all and rewrites RESULTS.md."""

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from torch.utils import benchmark


def median_seconds(stmt: str, globals: dict, seconds: float) -> float:
    """Median seconds per run of `stmt` (blocked runs after torch's own warm-up), on the threads torch is set
    to use. torch.utils.benchmark.Timer defaults to one thread, whatever torch.set_num_threads says; every
    benchmark here times through this function so that the figures are for the machine's cores."""
    timer = benchmark.Timer(stmt, globals=globals, num_threads=torch.get_num_threads())
    return timer.blocked_autorange(min_run_time=seconds).median


def interleaved_medians(
    fns: dict[str, Callable[[], object]], seconds: float, block: float = 0.25, min_rounds: int = 3
) -> dict[str, float]:
    """Median seconds per call of each function, timed in rotating rounds (at least `min_rounds`, and at
    least `seconds` per function): each round runs every function for about `block` seconds, the next
    round starts with the next function. Slow drift of the machine (other tenants, clocks, caches) then
    hits every function alike, which timing one function after another does not: on a shared 2-core
    machine back-to-back medians of the same model moved by up to 10%."""
    calls = {}
    for name, fn in fns.items():  # warm-up, timed: the number of calls that fills a block
        t0 = time.perf_counter()
        fn()
        calls[name] = max(1, round(block / max(time.perf_counter() - t0, 1e-9)))
    names, samples = list(fns), {name: [] for name in fns}
    start, rnd = time.perf_counter(), 0
    while rnd < min_rounds or time.perf_counter() - start < seconds * len(fns):
        for name in names[rnd % len(names) :] + names[: rnd % len(names)]:
            t0 = time.perf_counter()
            for _ in range(calls[name]):
                fns[name]()
            samples[name].append((time.perf_counter() - t0) / calls[name])
        rnd += 1
    return {name: statistics.median(v) for name, v in samples.items()}


def batch_script(doc: str, run: Callable[[int], object], markdown: Callable[[object], str], batch: int) -> None:
    """`main()` of a benchmark whose only knobs are the batch size and the thread count."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=batch)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(markdown(run(args.batch)))
