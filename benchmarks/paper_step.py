"""The paper-scale fine-tuning step on a GPU: our loop against a plain timm loop, the data path's share of a
step, model FLOP utilisation, one paper-scale VTAB-1k cell end to end with the projected cost of the full
study, and the DTN block's overhead in bf16.

    python -m benchmarks.paper_step [--device cuda] [--seconds 2] [--small]

Rows and targets (the issue's, on a GPU, bf16 autocast, 224 px):
- step: `engine.train.fit` (fused SGD, no host synchronisation in the loop) against a plain loop over timm's
  `VisionTransformer` of the same shape with torch's SGD (its default foreach update), same batch, clip 1.0,
  data already on the device: ours >= 1.0x the reference's speed, at b32 and b16.
- data: a paper-scale VTAB cell's batches (1,000 images, batch 512, random crops from 256 px and flips):
  the resident path (engine.resident) and the per-example worker pipeline, each feeding the b32 step; the
  share is (time of a fed step - time of a step on a ready batch) / time of a fed step: target <= 5%.
- mfu: the step's FLOPs (torch.utils.flop_counter: forward and backward matmuls and attention, 2 per
  multiply-add) per second over the device's dense bf16 peak from its datasheet (`PEAKS`): target >= 40%.
- cell: `adapters.classify.finetune` with the VTAB protocol's hyper-parameters (b32, 2,500 steps of 512, SGD
  momentum 0.9, clip 1.0, warm-up 200) on 1,000 synthetic 256 px images and the test accuracy on 1,000 more;
  the full VTAB-1k study of one backbone is 171 such cells (19 tasks x 3 learning rates x 3 seeds).
- dtn: forward and backward of s16_dtn and b16_dtn against s16 and b16 (batch 128): target <= 1.10x.

Without a GPU the step row runs at b32, batch 8, fp32 on the CPU and the data row times each path's batches
alone at the paper's shape; the MFU, data share, cell and DTN rows print "no GPU" (the CPU's DTN figures are
`python -m benchmarks.backbone_overhead`'s, its study cost `transferbench run vtab --dry-run --probe`'s).
`--device cpu --small` runs every row at toy shapes to check the code itself; its figures mean nothing.
"""

from __future__ import annotations

import argparse
import itertools
import time
import types

import numpy as np
import timm
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from benchmarks import interleaved_medians
from transferbench import create_backbone

STUDY_CELLS = 19 * 3 * 3  # VTAB-1k: 19 tasks x 3 learning rates x 3 seeds, each 2,500 steps of 512
# dense bf16 tensor-core peaks (FLOP/s) from NVIDIA's datasheets, by the name torch reports
PEAKS = {
    "H100 80GB HBM3": (989.4e12, "H100 SXM5 datasheet, dense BF16 (1,979 TFLOPS with sparsity)"),
    "H100 PCIe": (756.5e12, "H100 PCIe datasheet, dense BF16"),
    "H100 NVL": (835.5e12, "H100 NVL datasheet, dense BF16 per GPU"),
    "H200": (989.4e12, "H200 SXM datasheet, dense BF16"),
    "A100-SXM4": (312e12, "A100 datasheet, dense BF16"),
    "A100-PCIE": (312e12, "A100 datasheet, dense BF16"),
}
TIMM_SHAPES = {"b32": "vit_base_patch32_224", "b16": "vit_base_patch16_224", "mu4": None}
NO_GPU = "no GPU"


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def peak(device: str) -> tuple[float, str] | None:
    if not device.startswith("cuda"):
        return None
    name = torch.cuda.get_device_name(device)
    for key, value in PEAKS.items():
        if key in name:
            return value
    return None


def _models(size: str, classes: int, res: int):
    ours = create_backbone(size, img_size=res, num_classes=classes)
    if TIMM_SHAPES.get(size):
        ref = timm.create_model(TIMM_SHAPES[size], pretrained=False, num_classes=classes, img_size=res)
    else:  # the toy shape of --small
        ref = timm.models.vision_transformer.VisionTransformer(
            img_size=res, patch_size=4, embed_dim=128, depth=6, num_heads=4, num_classes=classes
        )
    return ours, ref


def step_vs_timm(size: str, batch: int, device: str, seconds: float, res: int = 224, steps: int = 5) -> dict:
    """Seconds per optimizer step of our fit() and of a plain timm + torch SGD loop, bf16 on CUDA."""
    from transferbench.engine.losses import cross_entropy
    from transferbench.engine.train import fit, optimizer_options

    bf16 = device.startswith("cuda")
    torch.manual_seed(0)
    ours, ref = (m.to(device).train() for m in _models(size, 100, res))
    x = torch.randn(batch, 3, res, res, device=device)
    y = torch.randint(0, 100, (batch,), device=device)
    opt_ours = torch.optim.SGD(ours.parameters(), lr=1e-3, momentum=0.9, **optimizer_options(device))
    opt_ref = torch.optim.SGD(ref.parameters(), lr=1e-3, momentum=0.9)

    def run_ours():
        fit(
            ours,
            itertools.repeat((x, y)),
            opt_ours,
            steps=steps,
            base_lr=1e-3,
            warmup=1,
            clip=1.0,
            loss_fn=cross_entropy,
            device=device,
            bf16=bf16,
        )
        _sync(device)

    def run_ref():
        for _ in range(steps):
            opt_ref.zero_grad(set_to_none=True)
            with torch.autocast(device.split(":")[0], dtype=torch.bfloat16, enabled=bf16):
                out = ref(x)
            F.cross_entropy(out.float(), y).backward()
            torch.nn.utils.clip_grad_norm_(ref.parameters(), 1.0)
            opt_ref.step()
        _sync(device)

    t = interleaved_medians({"ours": run_ours, "timm": run_ref}, seconds, block=1.0)
    flops = _step_flops(ours, res, device, bf16) * batch
    return {"size": size, "batch": batch, "ours": t["ours"] / steps, "timm": t["timm"] / steps, "flops": flops}


def _step_flops(model, res: int, device: str, bf16: bool) -> float:
    """FLOPs of one example's forward and backward (counted on a batch of 2, halved)."""
    x = torch.randn(2, 3, res, res, device=device)
    with FlopCounterMode(display=False) as counter:
        with torch.autocast(device.split(":")[0], dtype=torch.bfloat16, enabled=bf16):
            out = model(x)
        out.float().sum().backward()
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops() / 2


class _Synthetic(torch.utils.data.Dataset):
    """n random uint8 images of `size` px: `array()` (the resident path's in-memory set) or, with `per_example`,
    only PIL images one at a time (the worker pipeline's view of a decoded source)."""

    def __init__(self, n: int, size: int, classes: int, per_example: bool = False, seed: int = 0):
        rng = np.random.default_rng(seed)
        self._array = rng.integers(0, 256, (n, size, size, 3), dtype=np.uint8)
        self.labels = rng.integers(0, classes, n)
        self.num_classes = classes
        if not per_example:
            self.array = lambda: self._array

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i):
        from PIL import Image

        return Image.fromarray(self._array[i]), int(self.labels[i])


def data_share(
    device: str, seconds: float, *, size="b32", batch=512, n=1000, res=224, workers=8, fed_steps: bool = True
) -> dict:
    """Seconds per batch of each data path alone, and (`fed_steps`) per step of the b32 step on a ready batch and
    fed by each path. Each path is timed on its own, its stream made just before and closed after: the worker
    pipeline's processes would otherwise prefetch while the others are timed."""
    from transferbench.data.transforms import train_transform
    from transferbench.engine.batches import train_batches
    from transferbench.engine.losses import cross_entropy
    from transferbench.engine.train import optimizer_options

    bf16 = device.startswith("cuda")
    tf = train_transform(res, "crop_flip")
    model = create_backbone(size, img_size=res, num_classes=10).to(device).train()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9, **optimizer_options(device))

    def stream(path: str):
        if path == "resident":
            return train_batches(_Synthetic(n, res * 8 // 7, 10), tf, batch=batch, steps=10**6, seed=0, device=device)
        data = _Synthetic(n, res * 8 // 7, 10, per_example=True)
        return train_batches(
            data, tf, batch=batch, steps=10**6, seed=0, workers=workers, device=device, per_example=True
        )

    def step(x, y):
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.split(":")[0], dtype=torch.bfloat16, enabled=bf16):
            out = model(x)
        cross_entropy(out.float(), y).backward()
        opt.step()
        _sync(device)

    def timed(fn) -> float:
        for _ in range(2):  # warm-up: workers started, kernels chosen
            fn()
        times, start = [], time.perf_counter()
        while len(times) < 3 or time.perf_counter() - start < seconds:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return float(np.median(times))

    out = {"size": size, "batch": batch, "workers": workers, "n": n, "res": res}
    for path in ("resident", "workers"):
        batches = stream(path)
        assert batches.info()["data_path"] == path
        # a run of batches longer than the worker pipeline's prefetch buffer (4 a worker), per batch: a single
        # `next()` would time the buffer, not the pipeline
        run = 1 if path == "resident" else 8 * workers + 1
        out[f"data_{path}"] = timed(lambda: [next(batches) for _ in range(run)] and _sync(device)) / run
        if fed_steps:
            if path == "resident":
                ready = next(batches)
                out["step_ready"] = timed(lambda: step(*ready))
            out[f"step_{path}"] = timed(lambda: step(*next(batches)))
        batches = None  # the worker pipeline's processes end here, before the next path is timed
    return out


def paper_cell(device: str, *, size="b32", steps=2500, batch=512, n=1000, workers=8, res=None) -> dict:
    """One VTAB-1k cell at the protocol's hyper-parameters on synthetic images, timed end to end."""
    from transferbench.adapters import prepare_task
    from transferbench.adapters.classify import finetune
    from transferbench.data.transforms import eval_transform
    from transferbench.engine.compute import CellContext
    from transferbench.engine.evaluate import Evaluation, accuracy
    from transferbench.settings.finetune import VtabSettings

    task = prepare_task("vtab")
    hp = {**task.grid()[0], "steps": steps, "batch": batch, "pixels": "inception"}  # random init: no weights to ask
    hp["resolution"] = res or hp["resolution"]
    hp["warmup_steps"] = min(hp["warmup_steps"], max(1, steps // 10))
    cell = types.SimpleNamespace(
        hparams=hp, seed=0, backbone=size, backbone_name=size, checkpoint=None, dataset="synthetic"
    )
    ctx = CellContext(device=device, workers=workers)
    started = time.time()
    source = hp["resolution"] * 8 // 7
    model, info = finetune(cell, VtabSettings.of(hp), _Synthetic(n, source, 100), 100, "crop_flip", ctx)
    trained = time.time() - started
    evaluation = Evaluation(device, info["bf16"])
    acc = accuracy(model, _Synthetic(n, source, 100, seed=1), eval_transform(hp["resolution"]), evaluation)
    wall = time.time() - started
    return {
        "size": size,
        "steps": steps,
        "batch": batch,
        "train_s": trained,
        "wall_s": wall,
        "accuracy": acc,
        "images_per_s": steps * batch / trained,
        "study_hours": wall * STUDY_CELLS / 3600,
        "info": info,
    }


def dtn_overhead(size: str, batch: int, device: str, seconds: float, res: int = 224) -> dict:
    bf16 = device.startswith("cuda")
    torch.manual_seed(0)
    x = torch.randn(batch, 3, res, res, device=device)
    models = {k: create_backbone(k, img_size=res).to(device).train() for k in (size, f"{size}_dtn")}

    def step(model):
        def go():
            with torch.autocast(device.split(":")[0], dtype=torch.bfloat16, enabled=bf16):
                out = model(x)
            out.float().square().mean().backward()
            model.zero_grad(set_to_none=True)
            _sync(device)

        return go

    t = interleaved_medians({k: step(m) for k, m in models.items()}, seconds, block=1.0)
    return {"size": size, "batch": batch, "plain": t[size], "dtn": t[f"{size}_dtn"]}


def run(device: str | None = None, seconds: float = 2.0, small: bool = False) -> dict:
    """Every row; {"device": ..., "gpu": False} alone where there is no GPU and `small` is not asked."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    gpu = device.startswith("cuda")
    out = {"device": torch.cuda.get_device_name(device) if gpu else "cpu", "gpu": gpu, "small": small}
    if not gpu and not small:  # the rows a CPU can measure in minutes: the step at a small batch, the data alone
        out["step"] = [step_vs_timm("b32", 8, device, seconds, steps=1)]
        out["data"] = data_share(device, seconds, workers=2, fed_steps=False)
        return out
    if small:  # toy shapes: the code runs, the figures mean nothing
        out["step"] = [step_vs_timm("mu4", 8, device, seconds, res=32, steps=2)]
        out["data"] = data_share(device, seconds, size="mu4", batch=16, n=40, res=32, workers=2)
        out["cell"] = paper_cell(device, size="mu4", steps=4, batch=8, n=40, workers=0, res=32)
        out["dtn"] = [dtn_overhead("mu4", 8, device, seconds, res=32)]
    else:  # the cell last: the longest row, and the others are printed as they finish
        out["step"] = [_shown("step", step_vs_timm(size, 256, device, seconds)) for size in ("b32", "b16")]
        out["dtn"] = [_shown("dtn", dtn_overhead(size, 128, device, seconds)) for size in ("s16", "b16")]
        out["data"] = _shown("data", data_share(device, seconds))
        out["cell"] = _shown("cell", paper_cell(device))
    out["peak"] = peak(device)
    return out


def _shown(row: str, value: dict) -> dict:
    """Each row's raw figures on stderr as it finishes: a run cut short still leaves the rows it measured."""
    import json
    import sys

    print(f"{row}: {json.dumps(value, default=str)}", file=sys.stderr, flush=True)
    return value


def markdown(r: dict) -> str:
    lines = [f"Device: {r['device']}" + (" (--small: toy shapes, the figures mean nothing)" if r["small"] else "")]
    pk = r.get("peak")
    lines += [
        "",
        "| model | batch | ours ms/step | timm ms/step | ours vs timm (>= 1.0x) | MFU (>= 40%) |",
        "|---|---|---|---|---|---|",
    ]
    for s in r["step"]:
        mfu = f"{100 * s['flops'] / s['ours'] / pk[0]:.0f}%" if pk else ("peak unknown" if r["gpu"] else NO_GPU)
        lines.append(
            f"| {s['size']} | {s['batch']} | {1e3 * s['ours']:.1f} | {1e3 * s['timm']:.1f} | "
            f"{s['timm'] / s['ours']:.2f}x | {mfu} |"
        )
    if pk:
        lines.append(f"\nMFU: the step's FLOPs per second over {pk[0] / 1e12:.1f} TFLOP/s ({pk[1]}).")
    d = r["data"]
    lines += [
        "",
        f"Data path, batches of {d['batch']} at {d['res']} px from {d['n']:,} images of {d['res'] * 8 // 7} px "
        "(random crop and flip; "
        f"{d['workers']} workers for the pipeline):",
    ]
    if "step_ready" in d:
        share = lambda k: (d[f"step_{k}"] - d["step_ready"]) / d[f"step_{k}"]  # noqa: E731
        lines += [
            f"- the {d['size']} step on a ready batch: {1e3 * d['step_ready']:.1f} ms",
            f"- fed by the resident path: {1e3 * d['step_resident']:.1f} ms, share {100 * share('resident'):.1f}% "
            "(<= 5%)",
            f"- fed by the worker pipeline: {1e3 * d['step_workers']:.1f} ms, share {100 * share('workers'):.1f}%",
        ]
    else:
        lines.append(f"- the share of a step: {NO_GPU}")
    lines.append(
        f"- batches alone: resident {1e3 * d['data_resident']:.1f} ms, worker pipeline {1e3 * d['data_workers']:.1f} "
        f"ms ({d['data_workers'] / d['data_resident']:.1f}x)"
    )
    if "cell" not in r:
        lines += [
            "",
            f"Paper-scale VTAB-1k cell and DTN block overhead in bf16: {NO_GPU} (on a machine with one: "
            "`python -m benchmarks.paper_step`, about 15 minutes on one H100).",
        ]
        return "\n".join(lines)
    c = r["cell"]
    lines += [
        "",
        f"Paper-scale VTAB-1k cell ({c['size']}, {c['steps']} steps of {c['batch']}, synthetic images, data path "
        f"{c['info'].get('data_path')}, bf16 {c['info'].get('bf16')}): {c['wall_s'] / 60:.1f} min end to end "
        f"({c['images_per_s']:.0f} training images/s); the full study ({STUDY_CELLS} cells) projects to "
        f"**{c['study_hours']:.1f} GPU-hours**.",
        "",
        "| DTN block | batch | plain ms | DTN ms | overhead (<= 1.10x) |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {t['size']} | {t['batch']} | {1e3 * t['plain']:.1f} | {1e3 * t['dtn']:.1f} | {t['dtn'] / t['plain']:.2f}x |"
        for t in r["dtn"]
    ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default=None, help="cuda (the default where there is one) or cpu (with --small)")
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--small", action="store_true", help="toy shapes: check the code on any device")
    args = ap.parse_args()
    print(markdown(run(args.device, args.seconds, args.small)))


if __name__ == "__main__":
    main()
