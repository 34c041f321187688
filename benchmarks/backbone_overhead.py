"""Inference throughput of our ViT vs timm's, and the cost of the DPN stem and of DTN, in one process.

    python -m benchmarks.backbone_overhead [--size s16] [--batch 8] [--threads 2] [--bf16]

Prints ratios measured side by side (torch.utils.benchmark, median of blocked runs), never a lone time.
`python -m benchmarks` runs it with the other benchmarks into benchmarks/RESULTS.md.
"""

import argparse

import timm
import torch

from benchmarks import interleaved_medians
from transferbench import create_backbone
from transferbench.backbones import parse_name

TIMM = {
    "ti16": "vit_tiny_patch16_224",
    "s16": "vit_small_patch16_224",
    "s32": "vit_small_patch32_224",
    "b16": "vit_base_patch16_224",
    "b32": "vit_base_patch32_224",
}


MODELS = ("timm", "ours", "dpn", "dtn")


def run(
    size: str = "s16",
    batch: int = 8,
    bf16: bool = False,
    backward: bool = False,
    seconds: float = 2.0,
    models: tuple[str, ...] = MODELS,
) -> dict:
    """Median time per batch of timm's ViT, ours, ours with the DPN stem and with DTN (or the subset
    `models`, which must hold "ours"), in rotating rounds."""
    img = parse_name(size)["img_size"] if size != "mu4" else 32
    x = torch.randn(batch, 3, img, img)

    def timm_model():
        if size in TIMM:
            return timm.create_model(TIMM[size], pretrained=False, num_classes=0)
        return timm.models.vision_transformer.VisionTransformer(
            img_size=32, patch_size=4, embed_dim=128, depth=6, num_heads=4, num_classes=0
        )

    build = {
        "timm": timm_model,
        "ours": lambda: create_backbone(size, img_size=img),
        "dpn": lambda: create_backbone(f"{size}_dpn", img_size=img),
        "dtn": lambda: create_backbone(f"{size}_dtn", img_size=img),
    }
    models = {key: build[key]() for key in models}
    steps = {}
    for key, model in models.items():
        if backward:
            model.train()

            def step(model=model):
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                    out = model(x)
                out.float().square().mean().backward()
        else:
            model.eval()

            def step(model=model):
                with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                    model(x)

        steps[key] = step
    median = interleaved_medians(steps, seconds)
    ratio = lambda a, b: median[a] / median[b] if a in median else float("nan")  # noqa: E731
    return {
        "size": size,
        "batch": batch,
        "bf16": bf16,
        "backward": backward,
        "ms": {k: v * 1e3 for k, v in median.items()},
        "ours_vs_timm": ratio("timm", "ours"),
        "dpn_overhead": ratio("dpn", "ours") - 1,
        "dtn_overhead": ratio("dtn", "ours") - 1,
    }


def _cell(value: float, spec: str) -> str:
    return "-" if value != value else format(value, spec)  # NaN: that model was not timed in this row


def markdown(rows: list[dict]) -> str:
    out = [
        "| shape | pass | dtype | timm ms | ours ms | ours/timm throughput (target >= 1.0x) | DPN overhead (<= 2%) | "
        "DTN overhead (<= 10%) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        out.append(
            f"| {r['size']} x{r['batch']} | {'fwd+bwd' if r['backward'] else 'fwd'} | "
            f"{'bf16' if r['bf16'] else 'fp32'} | "
            f"{_cell(r['ms'].get('timm', float('nan')), '.1f')} | {r['ms']['ours']:.1f} | "
            f"{_cell(r['ours_vs_timm'], '.2f')}x | {_cell(r['dpn_overhead'], '+.1%')} | "
            f"{_cell(r['dtn_overhead'], '+.1%')} |".replace("| -x |", "| - |")
        )
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="s16", choices=sorted(TIMM) + ["mu4"])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--bf16", action="store_true", help="bf16 autocast (slow on CPUs without AVX512-BF16/AMX)")
    ap.add_argument("--backward", action="store_true", help="time forward + backward instead of inference")
    ap.add_argument("--seconds", type=float, default=4.0, help="minimum measuring time per model")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(markdown([run(args.size, args.batch, args.bf16, args.backward, args.seconds)]))


if __name__ == "__main__":
    main()
