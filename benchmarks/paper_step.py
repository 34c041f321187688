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
import contextlib
import functools
import itertools
import time
import types

import timm
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from benchmarks import interleaved_medians
from benchmarks.paper_step_data import Synthetic, data_share, embedded, sync
from benchmarks.paper_step_report import STUDY_CELLS, markdown, versions
from transferbench import create_backbone

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


def step_vs_timm(
    size: str,
    batch: int,
    device: str,
    seconds: float,
    res: int = 224,
    steps: int = 5,
    variants: bool = True,
    compiled_only: bool = False,
) -> dict:
    """Seconds per optimizer step of our fit() (eager; compiled, the default path on CUDA; eager with SDPA's cuDNN
    backend) and of a plain timm + torch SGD loop, bf16 on CUDA. Each variant's first call compiles (outside the
    timing: interleaved_medians warms every function up first)."""
    from transferbench.engine.losses import cross_entropy
    from transferbench.engine.train import fit, optimizer_options

    bf16 = device.startswith("cuda")
    torch.manual_seed(0)
    ours, ref = (m.to(device).train() for m in _models(size, 100, res))
    x = torch.randn(batch, 3, res, res, device=device)
    y = torch.randint(0, 100, (batch,), device=device)
    opt_ours = torch.optim.SGD(ours.parameters(), lr=1e-3, momentum=0.9, **optimizer_options(device))
    opt_ref = torch.optim.SGD(ref.parameters(), lr=1e-3, momentum=0.9)

    def run_ours(compile=False, sdpa=None):
        def go():
            kw = dict(base_lr=1e-3, warmup=1, clip=1.0, loss_fn=cross_entropy, device=device, bf16=bf16)
            with _sdpa(sdpa):
                fit(ours, itertools.repeat((x, y)), opt_ours, steps=steps, compile="on" if compile else "off", **kw)
            sync(device)

        return go

    def run_ref():
        for _ in range(steps):
            opt_ref.zero_grad(set_to_none=True)
            with torch.autocast(device.split(":")[0], dtype=torch.bfloat16, enabled=bf16):
                out = ref(x)
            F.cross_entropy(out.float(), y).backward()
            torch.nn.utils.clip_grad_norm_(ref.parameters(), 1.0)
            opt_ref.step()
        sync(device)

    fns = {"compiled": run_ours(compile=True)} if compiled_only else {"ours": run_ours(), "timm": run_ref}
    if variants and bf16 and not compiled_only:
        fns.update(compiled=run_ours(compile=True), cudnn=run_ours(sdpa="cudnn"))
    t = interleaved_medians(fns, seconds, block=1.0)
    flops = _step_flops(ours, res, device, bf16) * batch
    return {"size": size, "batch": batch, "flops": flops, **{k: v / steps for k, v in t.items()}}


def _sdpa(backend):
    """A context with SDPA restricted to one backend (cudnn), or none."""
    if backend is None:
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.CUDNN_ATTENTION])


def _step_flops(model, res: int, device: str, bf16: bool) -> float:
    """FLOPs of one example's forward and backward (counted on a batch of 2, halved)."""
    x = torch.randn(2, 3, res, res, device=device)
    with FlopCounterMode(display=False) as counter:
        with torch.autocast(device.split(":")[0], dtype=torch.bfloat16, enabled=bf16):
            out = model(x)
        out.float().sum().backward()
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops() / 2


def paper_cell(device: str, *, size="b32", steps=2500, batch=512, n=1000, workers=0, res=None) -> dict:
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
    model, info = finetune(cell, VtabSettings.of(hp), Synthetic(n, source, 100), 100, "crop_flip", ctx)
    trained = time.time() - started
    evaluation = Evaluation(device, info["bf16"])
    acc = accuracy(model, Synthetic(n, source, 100, seed=1), eval_transform(hp["resolution"]), evaluation)
    wall = time.time() - started
    compile_s = float(info.get("compile_s", 0.0))  # the first step's time, which compiles (once per run)
    step_s = (trained - compile_s) / max(1, steps - 1)
    cell_s = (wall - trained) + 2500 * step_s  # one cell of the protocol's 2,500 steps, compilation apart
    return {
        "size": size,
        "steps": steps,
        "batch": batch,
        "train_s": trained,
        "wall_s": wall,
        "compile_s": compile_s,
        "step_s": step_s,
        "cell_s": cell_s,
        "accuracy": acc,
        "images_per_s": batch / step_s,
        "study_hours": (STUDY_CELLS * cell_s + compile_s) / 3600,
        "info": info,
    }


def dtn_overhead(size: str, batch: int, device: str, seconds: float, res: int = 224) -> dict:
    """Forward and backward of `size` and `size`_dtn, eager and compiled (the default path on CUDA: the same
    torch.compile call as engine.train.fit's). On CUDA, DTN twice: the fused Triton kernels (the default,
    `dtn.KERNELS = "auto"`) and the torch formulation (`"off"`)."""
    from transferbench.backbones import dtn
    from transferbench.engine import train

    bf16 = device.startswith("cuda")
    torch.manual_seed(0)
    x = torch.randn(batch, 3, res, res, device=device)
    models = {k: create_backbone(k, img_size=res).to(device).train() for k in (size, f"{size}_dtn")}

    def step(model, kernels="auto"):
        def go():
            dtn.KERNELS = kernels
            try:
                with torch.autocast(device.split(":")[0], dtype=torch.bfloat16, enabled=bf16):
                    out = model(x)
                out.float().square().mean().backward()
                sync(device)
            finally:
                dtn.KERNELS = "auto"

        return go

    fns = {k: step(m) for k, m in models.items()}
    if bf16:
        fns.update({f"{k} compiled": step(train._Compiled(m)) for k, m in models.items()})
        torch_dtn = create_backbone(f"{size}_dtn", img_size=res).to(device).train()
        fns.update({"torch": step(torch_dtn, "off"), "torch compiled": step(train._Compiled(torch_dtn), "off")})
    t = interleaved_medians(fns, seconds, block=1.0)
    for m in models.values():
        m.zero_grad(set_to_none=True)
    out = {"size": size, "batch": batch, "plain": t[size], "dtn": t[f"{size}_dtn"]}
    if bf16:
        out.update(plain_compiled=t[f"{size} compiled"], dtn_compiled=t[f"{size}_dtn compiled"])
        out.update(torch_eager=t["torch"], torch_compiled=t["torch compiled"])
    return out


@contextlib.contextmanager
def compile_mode(mode: str | None):
    """torch.compile called with `mode` inside (fit's own call passes none): "max-autotune-no-cudagraphs" (GEMM
    and kernel autotuning), "reduce-overhead" (CUDA graphs), "max-autotune" (both). None: the default."""
    if mode is None:
        yield
        return
    original = torch.compile
    torch.compile = functools.partial(original, mode=mode)
    try:
        yield
    finally:
        torch.compile = original


# the MFU levers (issue: batch size, max-autotune, CUDA graphs), each a compiled fit() step of bf16 at 224 px
LEVERS = (
    ("b16", 128, None),
    ("b16", 256, None),
    ("b16", 128, "reduce-overhead"),
    ("b16", 128, "max-autotune-no-cudagraphs"),
    ("b16", 128, "max-autotune"),
    ("b32", 512, "reduce-overhead"),
    ("b32", 512, "max-autotune-no-cudagraphs"),
)


def lever(size: str, batch: int, mode: str | None, device: str, seconds: float, res: int = 224) -> dict:
    """One compiled fit() step under a compile mode, with its FLOPs (for MFU) and its compilation's seconds."""
    import torch._dynamo

    torch._dynamo.reset()  # each mode compiles afresh
    started = time.time()
    with compile_mode(mode):
        r = step_vs_timm(size, batch, device, seconds, res=res, variants=False, compiled_only=True)
    return {**r, "mode": mode or "default", "row_s": round(time.time() - started, 1)}


class Budget:
    """The script's time limit: a row is run only while `seconds` are left since the start (rows are ordered by
    what the issue asks first); a row not run says so, with the time it would have needed."""

    def __init__(self, seconds: float):
        self.deadline = time.time() + seconds

    def left(self) -> float:
        return self.deadline - time.time()


def run(
    device: str | None = None,
    seconds: float = 2.0,
    small: bool = False,
    embedded_dir: str | None = None,
    budget: float = 450.0,
    levers: bool = True,
) -> dict:
    """Every row; {"device": ..., "gpu": False} alone where there is no GPU and `small` is not asked.
    `embedded_dir`: also the README's main command (the offline suite) timed there. `budget`: seconds for all rows
    (rows past it are listed as skipped); `levers`: the MFU and data-path levers, last."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    gpu = device.startswith("cuda")
    out = {"device": torch.cuda.get_device_name(device) if gpu else "cpu", "gpu": gpu, "small": small}
    out["versions"] = versions(device)
    if not gpu and not small:  # the rows a CPU can measure in minutes: the step at a small batch, the data alone
        out["step"] = [step_vs_timm("b32", 8, device, seconds, steps=1)]
        out["data"] = data_share(device, seconds, workers=2, fed_steps=False)
        return out
    clock = Budget(budget)
    row = functools.partial(_row, clock=clock)  # each printed as it finishes; a failure or a row past the budget named
    if small:  # toy shapes: the code runs, the figures mean nothing
        out["dtn"] = [row("dtn", dtn_overhead, "mu4", 8, device, seconds, res=32, need=5)]
        out["step"] = [row("step", step_vs_timm, "mu4", 8, device, seconds, res=32, steps=2, need=5)]
        out["data"] = row("data", data_share, device, seconds, size="mu4", batch=16, n=40, res=32, workers=0, need=5)
        out["cell"] = row("cell", paper_cell, device, size="mu4", steps=4, batch=8, n=40, workers=0, res=32, need=5)
        if levers:
            out["levers"] = [row("lever", lever, "mu4", 8, None, device, seconds, res=32, need=5)]
            out["data_levers"] = [
                row("data lever", data_share, device, seconds, size="mu4", batch=16, n=40, res=32, workers=w,
                    paths=("resident",), need=5)
                for w in (0, 1)
            ]  # fmt: skip
    else:
        out["dtn"] = [row("dtn", dtn_overhead, size, 128, device, seconds, need=40) for size in ("s16", "b16")]
        out["step"] = [row("step", step_vs_timm, size, batch, device, seconds, need=60) for size, batch in STEP_ROWS]
        out["data"] = row("data", data_share, device, seconds, need=40)
        out["cell"] = row("cell", paper_cell, device, steps=1000, need=90)
    if embedded_dir:
        out["embedded"] = row("embedded", embedded, embedded_dir, timeout=min(240.0, max(clock.left(), 1)), need=45)
    if levers and not small:
        out["levers"] = [row("lever", lever, *v, device, seconds, need=30) for v in LEVERS]
        out["data_levers"] = [
            row("data lever", data_share, device, seconds, workers=w, paths=("resident",), need=20) for w in (1, 2)
        ]
    out["peak"] = peak(device)
    out["budget_s"], out["used_s"] = budget, round(budget - clock.left(), 1)
    return out


# the step rows on a GPU: VTAB's b32 cell batch, and b16 at the DTN rows' batch (one compilation serves both)
STEP_ROWS = (("b32", 512), ("b16", 128))


def _row(name: str, fn, *args, clock: Budget | None = None, need: float = 0.0, **kw) -> dict:
    """fn's figures, printed on stderr as they come (a run cut short keeps the rows it measured); a failure is
    the row's {"error": ...}, and the run goes on; a row that needs `need` seconds more than `clock` has left is
    {"skipped": ...}."""
    import traceback

    if clock is not None and clock.left() < need:
        return _shown(name, {"skipped": f"over the time budget ({clock.left():.0f} s left, needs about {need:.0f} s)"})
    started = time.time()
    try:
        value = fn(*args, **kw)
    except Exception as e:  # noqa: BLE001 - one row's failure must not cost the device run the others
        traceback.print_exc()
        value = {"error": f"{type(e).__name__}: {e}"}
    value["row_s"] = round(time.time() - started, 1)
    return _shown(name, value)


def _shown(row: str, value: dict) -> dict:
    """Each row's raw figures on stderr as it finishes: a run cut short still leaves the rows it measured."""
    import json
    import sys

    print(f"{row}: {json.dumps(value, default=str)}", file=sys.stderr, flush=True)
    return value


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default=None, help="cuda (the default where there is one) or cpu (with --small)")
    ap.add_argument("--seconds", type=float, default=2.0, help="timing per variant (default 2)")
    ap.add_argument("--small", action="store_true", help="toy shapes: check the code on any device (a dry run)")
    ap.add_argument(
        "--embedded", metavar="DIR", help="also time the README's main command (the offline suite) with records in DIR"
    )
    ap.add_argument("--budget", type=float, default=450.0, help="seconds for all rows; later rows are skipped past it")
    ap.add_argument("--no-levers", dest="levers", action="store_false", help="skip the MFU and data-path levers")
    ap.add_argument("--json", metavar="FILE", help="also write every raw figure to FILE")
    args = ap.parse_args()
    if args.budget <= 0 or args.seconds <= 0:
        ap.error("--budget and --seconds must be positive")
    result = run(args.device, args.seconds, args.small, args.embedded, args.budget, args.levers)
    if args.json:
        import json
        from pathlib import Path

        Path(args.json).write_text(json.dumps(result, indent=1, default=str))
    print(markdown(result))


if __name__ == "__main__":
    main()
