"""What the diagnostics cost over a plain forward pass, at the b16 shape (ViT-B/16, 224 px, 197 tokens):

    python -m benchmarks.diagnostics_speed [--images 1000] [--batch 50] [--rounds 2] [--threads 2] [--bf16]

Both contenders go through the same `images` images (random pixels; the cost does not depend on them) in batches
of `batch`, in inference mode: the plain pass is `forward_features` (the fused attention kernel); the diagnostics
pass is backbones.measures.Probe (forward_intermediates with attention_maps: explicit softmax probabilities, and per
layer the patch cosine similarity, token norms, attention row std and per-head attention distance). They alternate
for `rounds` rounds over all the images; the medians are compared. Printed: images per second of each and the
ratio (the issue's bound: at most 1.5x).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def run(images: int = 1000, batch: int = 50, rounds: int = 2, size: str = "b16", bf16: bool = False) -> dict:
    from transferbench.backbones import create_backbone
    from transferbench.backbones.measures import Probe

    model = create_backbone(size).eval()
    res = model.img_size[0]
    batches = [torch.randn(min(batch, images - i), 3, res, res) for i in range(0, images, batch)]

    def plain():
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            for x in batches:
                model.forward_features(x)

    def diagnose():
        probe = Probe(model)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            for x in batches:
                probe(x)
        return probe.summary()

    with torch.inference_mode():  # warm-up: one batch each
        model.forward_features(batches[0])
    Probe(model)(batches[0])
    times = {"plain": [], "diagnostics": []}
    for r in range(rounds):
        order = [("plain", plain), ("diagnostics", diagnose)]
        for name, fn in order if r % 2 == 0 else order[::-1]:
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {
        "size": size,
        "images": images,
        "batch": batch,
        "rounds": rounds,
        "bf16": bf16,
        "seconds": med,
        "ratio": med["diagnostics"] / med["plain"],
    }


def markdown(r: dict) -> str:
    ips = {k: r["images"] / v for k, v in r["seconds"].items()}
    return (
        "| shape | images | plain forward | diagnostics (all measures) | diagnostics / plain (bound 1.5x) |\n"
        "|---|---|---|---|---|\n"
        f"| {r['size']} at 224 px{' bf16' if r['bf16'] else ''}, batch {r['batch']} | {r['images']:,} | "
        f"{ips['plain']:.1f} img/s ({r['seconds']['plain']:.1f} s) | {ips['diagnostics']:.1f} img/s "
        f"({r['seconds']['diagnostics']:.1f} s) | **{r['ratio']:.2f}x** |\n\n"
        f"Median of {r['rounds']} alternating passes over the same images, in one process."
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=1000)
    ap.add_argument("--batch", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--size", default="b16", help="backbone name at its default resolution (b16: the issue's shape)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--bf16", action="store_true", help="bf16 autocast (only where the CPU has bf16 units)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    r = run(args.images, args.batch, args.rounds, args.size, args.bf16)
    print(markdown(r))


if __name__ == "__main__":
    main()
