"""Inference throughput of our ViT vs timm's, and the cost of the DPN stem and of DTN, in one process.

    python benchmarks/backbone_overhead.py [--size s16] [--batch 8] [--threads 2] [--bf16]

Prints ratios measured side by side (torch.utils.benchmark, median of blocked runs), never a lone time.
Issue 7 turns this into the full benchmark suite with targets.
"""
import argparse

import timm
import torch
from torch.utils import benchmark

from transferbench import create_backbone
from transferbench.backbones import parse_name

TIMM = {"ti16": "vit_tiny_patch16_224", "s16": "vit_small_patch16_224", "s32": "vit_small_patch32_224",
        "b16": "vit_base_patch16_224", "b32": "vit_base_patch32_224"}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="s16", choices=sorted(TIMM))
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--bf16", action="store_true", help="bf16 autocast (slow on CPUs without AVX512-BF16/AMX)")
    ap.add_argument("--seconds", type=float, default=4.0, help="minimum measuring time per model")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    img = parse_name(args.size)["img_size"]
    x = torch.randn(args.batch, 3, img, img)
    models = {"timm": timm.create_model(TIMM[args.size], pretrained=False, num_classes=0),
              "ours": create_backbone(args.size), "dpn": create_backbone(f"{args.size}_dpn"),
              "dtn": create_backbone(f"{args.size}_dtn")}
    median = {}
    for key, model in models.items():
        model.eval()

        def run(model=model):
            with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
                model(x)
        median[key] = benchmark.Timer("run()", globals={"run": run}).blocked_autorange(min_run_time=args.seconds).median
        print(f"{key:5s} {median[key] * 1e3:8.1f} ms per batch of {args.batch}")
    print(f"{args.size} {'bf16' if args.bf16 else 'fp32'}: ours/timm throughput {median['timm'] / median['ours']:.3f}x, "
          f"DPN overhead {median['dpn'] / median['ours'] - 1:+.1%}, DTN overhead {median['dtn'] / median['ours'] - 1:+.1%}")


if __name__ == "__main__":
    main()
