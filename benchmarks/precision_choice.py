"""bf16 `auto` vs `off` vs `on`, and the batched data path vs the per-example one, on embedded VTAB cells:

    python -m benchmarks.precision_choice [--dataset mini_digits] [--backbones mu4@embedded,mu4_dtn@embedded]

For each backbone, one cell of the embedded VTAB suite (lr 0.01, seed 0, the select stage: 50 steps of 32
images at 16 px, then val200) is computed in process with `bf16=off`, `on` and `auto`, in rotating rounds,
and the median seconds per cell are compared with `off`; `auto`'s row says what its probe chose (the probe's
cache is warm after the first round, as it is for every cell after a machine's first). The data rows time the
cell's 50 training batches alone through the per-example torchvision pipeline and through the batched path
(same tensors), so the data path's share of a cell shows before and after. The CPU's bf16 flags are named.
About 1 minute on 2 cores.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from tabulate import tabulate

from transferbench.engine.precision import cpu_bf16_units


def _cell(backbone: str, dataset: str, bf16: str):
    from transferbench.adapters import prepare_task, resolve_backbone
    from transferbench.cell import make_cell

    task = prepare_task("vtab", suite="embedded", datasets=[dataset], sets=[f"bf16={bf16}", "lr=0.01"])
    ds = task.datasets[0]
    return task.adapter, make_cell(task, ds, resolve_backbone(backbone), task.grid()[0], 0, "select")


def cpu_flags() -> str:
    try:
        flags = set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return "unknown"
    listed = [f for f in ("avx512_bf16", "amx_bf16", "amx_tile", "avx512f", "avx2") if f in flags]
    return ", ".join(listed) or "none of avx2/avx512/amx"


def data_path(dataset: str, rounds: int = 3) -> dict:
    """Median seconds to draw one cell's 50 training batches, per-example vs batched."""
    from transferbench.adapters import prepare_task
    from transferbench.adapters.vtab import VtabAdapter, open_split
    from transferbench.data.transforms import train_transform
    from transferbench.engine.batches import train_batches

    task = prepare_task("vtab", suite="embedded", datasets=[dataset])
    ds, hp = task.datasets[0], task.hparams
    data = open_split(VtabAdapter.entry(ds.name, ds.model_dump()), "train")
    data.array()
    tf = train_transform(hp["resolution"], ds.augment)

    def draw(per_example: bool):
        t = time.perf_counter()
        for _ in train_batches(data, tf, batch=hp["batch"], steps=hp["steps"], seed=0, per_example=per_example):
            pass
        return time.perf_counter() - t

    slow, fast = [], []
    for _ in range(rounds):
        slow.append(draw(True))
        fast.append(draw(False))
    return {"per_example": statistics.median(slow), "batched": statistics.median(fast)}


def run(dataset: str = "mini_digits", backbones=("mu4@embedded", "mu4_dtn@embedded"), rounds: int = 3) -> dict:
    from transferbench.engine.compute import CellContext

    ctx = CellContext(device="cpu", show_progress=False)
    rows = []
    for backbone in backbones:
        cells = {v: _cell(backbone, dataset, v) for v in ("off", "on", "auto")}
        times = {v: [] for v in cells}
        chose = {}
        for r in range(rounds + 1):  # round 0 warms up (and fills auto's probe cache)
            order = list(cells)[r % 3 :] + list(cells)[: r % 3]
            for v in order:
                adapter, cell = cells[v]
                t = time.perf_counter()
                out = adapter.run(cell, ctx)
                if r:
                    times[v].append(time.perf_counter() - t)
                chose[v] = out["info"]
        rows.append(
            {
                "backbone": backbone,
                **{v: statistics.median(t) for v, t in times.items()},
                "auto_info": chose["auto"].get("bf16_choice", {}),
                "auto_bf16": chose["auto"]["bf16"],
            }
        )
    return {
        "rows": rows,
        "data": data_path(dataset, rounds),
        "flags": cpu_flags(),
        "bf16_units": cpu_bf16_units(),
        "dataset": dataset,
    }


def markdown(res: dict) -> str:
    table = []
    for r in res["rows"]:
        info = r["auto_info"]
        why = (
            f"probe: fp32 {info['fp32_ms']:.1f} ms, bf16 {info['bf16_ms']:.1f} ms a step"
            if "fp32_ms" in info
            else info.get("decided_by", "")
        )
        table.append(
            [
                f"`{r['backbone']}`",
                f"{r['off']:.2f} s",
                f"{r['on']:.2f} s ({r['on'] / r['off']:.2f}x)",
                f"{r['auto']:.2f} s ({r['auto'] / r['off']:.2f}x)",
                f"{'bf16' if r['auto_bf16'] else 'fp32'} ({why})",
            ]
        )
    d = res["data"]
    cell = res["rows"][0]["auto"]
    return (
        f"CPU flags: {res['flags']} (bf16 units: {'yes' if res['bf16_units'] else 'no'}). One embedded VTAB cell "
        f"(`{res['dataset']}`, lr 0.01, seed 0, select stage), median seconds per cell; the ratio is against `off`.\n\n"
        + tabulate(table, ["backbone", "bf16=off", "bf16=on", "bf16=auto", "auto chose"], tablefmt="github")
        + f"\n\nData path of that cell (50 batches of 32): per-example torchvision pipeline {d['per_example']:.3f} s, "
        f"batched {d['batched']:.3f} s (**{d['per_example'] / d['batched']:.1f}x**); "
        f"{100 * d['per_example'] / (cell - d['batched'] + d['per_example']):.0f}% of a cell before, "
        f"{100 * d['batched'] / cell:.0f}% after."
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default="mini_digits")
    ap.add_argument("--backbones", default="mu4@embedded,mu4_dtn@embedded")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--home", help="TRANSFERBENCH_HOME (default: a fresh temporary one, data generated first)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    import os

    with tempfile.TemporaryDirectory() as tmp:
        os.environ.setdefault("TRANSFERBENCH_HOME", args.home or tmp)
        print(markdown(run(args.dataset, tuple(args.backbones.split(",")), args.rounds)))


if __name__ == "__main__":
    main()
