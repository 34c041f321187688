"""Segmentation evaluation costs (transferbench.adapters.seg), each against a peer in the same process:

    python -m benchmarks.seg_eval [--backbone ti16] [--images 4] [--maps 2000] [--seconds 2] [--device cpu]

- sliding-window inference (`predict`: the test resize, windows of 512 every 341 px, logits averaged
  where they overlap, bilinear resize to the annotation's size, argmax) against the sum of its window
  forwards alone (the same crops through the same LinearSegmenter in the same batches, 150 classes).
  What is left is stitching and resizing; target <= 1.15x. Images are ADE20K-shaped (375 x 500, 512 x 683,
  ...), so each is resized to a short side of 512 and covered by 2 windows;
- metric accumulation over `--maps` random 512 x 512 label maps (150 classes, ~10% ignored, predictions
  agreeing with the label on half the pixels): `SegMetric.update` + `compute` against mmsegmentation's
  `IoUMetric.process` + `compute_metrics` on the same tensors; target: at least as fast (ratio <= 1.0). The
  row is skipped with a note without the `mmseg` extra. The maps are made in chunks of 100, outside the
  timed calls; the two contenders alternate which goes first per chunk.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from benchmarks import interleaved_medians

ADE_SHAPES = ((375, 500), (512, 683), (480, 640), (683, 512))


def window_overhead(
    backbone: str = "ti16", images: int = 4, seconds: float = 2.0, device: str = "cpu", bf16: bool = False
) -> dict:
    from transferbench.adapters.seg import LinearSegmenter, predict, window_starts
    from transferbench.backbones import create_backbone
    from transferbench.data.segmentation import eval_image

    torch.manual_seed(0)
    model = LinearSegmenter(create_backbone(backbone, img_size=512), 150).to(device).eval()
    rng = np.random.default_rng(0)
    imgs = [
        torch.from_numpy(rng.integers(0, 256, (3, *ADE_SHAPES[i % len(ADE_SHAPES)]), dtype=np.uint8))
        for i in range(images)
    ]
    crops = []
    for img in imgs:  # the very windows predict() will cut, batched the same way
        x = eval_image(img, 512)
        ys, xs = window_starts(x.shape[1], 512, 341), window_starts(x.shape[2], 512, 341)
        crops.append(torch.stack([x[:, y : y + 512, x0 : x0 + 512] for y in ys for x0 in xs]).to(device))
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)

    @torch.inference_mode()
    def forwards():
        for c in crops:
            with torch.autocast(device.split(":")[0], dtype=torch.bfloat16, enabled=bf16):
                model(c).float()
        sync()

    def sliding():
        for img in imgs:
            predict(model, img, 150, short=512, window=512, stride=341, bf16=bf16)
        sync()

    t = interleaved_medians({"forwards": forwards, "sliding": sliding}, seconds)
    return {
        "backbone": backbone,
        "device": device,
        "images": images,
        "windows": sum(len(c) for c in crops),
        "forwards_s": t["forwards"],
        "sliding_s": t["sliding"],
        "ratio": t["sliding"] / t["forwards"],
    }


def metric_speed(maps: int = 2000, chunk: int = 100, seed: int = 0) -> dict:
    from transferbench.adapters.seg import SegMetric

    try:
        from mmseg.evaluation.metrics import IoUMetric
    except ImportError:
        return {"maps": maps, "skipped": "mmsegmentation is not installed (pip install 'transferbench[mmseg]')"}
    rng = np.random.default_rng(seed)
    ours, theirs = SegMetric(150), IoUMetric(iou_metrics=["mIoU"])
    theirs.dataset_meta = {"classes": [str(i) for i in range(150)]}
    t_ours = t_theirs = 0.0
    for start in range(0, maps, chunk):
        n = min(chunk, maps - start)
        label = torch.from_numpy(rng.integers(0, 150, (n, 512, 512), dtype=np.uint8))
        label[torch.from_numpy(rng.random((n, 512, 512)) < 0.1)] = 255
        pred = torch.where(
            torch.from_numpy(rng.random((n, 512, 512)) < 0.5),
            label.long() % 150,
            torch.from_numpy(rng.integers(0, 150, (n, 512, 512))),
        )
        samples = [{"pred_sem_seg": {"data": pred[i][None]}, "gt_sem_seg": {"data": label[i][None]}} for i in range(n)]

        def run_ours():
            for i in range(n):
                ours.update(pred[i], label[i])

        def run_theirs():
            theirs.process({}, samples)

        order = (run_ours, run_theirs) if (start // chunk) % 2 == 0 else (run_theirs, run_ours)
        for fn in order:
            t0 = time.perf_counter()
            fn()
            dt = time.perf_counter() - t0
            if fn is run_ours:
                t_ours += dt
            else:
                t_theirs += dt
    t0 = time.perf_counter()
    mine = ours.compute()
    t_ours += time.perf_counter() - t0
    t0 = time.perf_counter()
    ref = theirs.compute_metrics(theirs.results)
    t_theirs += time.perf_counter() - t0
    return {
        "maps": maps,
        "ours_s": t_ours,
        "mmseg_s": t_theirs,
        "ratio": t_ours / t_theirs,
        "miou_ours": 100 * mine["miou"],
        "miou_mmseg": float(ref["mIoU"]),
    }


def markdown(w: dict, m: dict) -> str:
    rows = [
        "| measure | ours | peer | ratio (target) |",
        "|---|---|---|---|",
        f"| sliding-window eval, {w['images']} ADE-shaped images ({w['windows']} windows of 512, stride 341), "
        f"{w['backbone']} + linear decoder (150 classes), {w['device']} | {w['sliding_s']:.3f} s | "
        f"{w['forwards_s']:.3f} s (the window forwards alone) | {w['ratio']:.2f}x (<= 1.15x) |",
    ]
    if "skipped" in m:
        rows.append(f"| metric accumulation, {m['maps']} maps of 512 x 512 | — | — | skipped: {m['skipped']} |")
    else:
        rows.append(
            f"| metric accumulation, {m['maps']} random 512 x 512 maps, 150 classes (mIoU {m['miou_ours']:.2f} "
            f"vs mmseg's {m['miou_mmseg']:.2f}) | {m['ours_s']:.2f} s | {m['mmseg_s']:.2f} s (mmseg IoUMetric) | "
            f"{m['ratio']:.2f}x (<= 1.0x) |"
        )
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backbone", default="ti16")
    ap.add_argument("--images", type=int, default=4)
    ap.add_argument("--maps", type=int, default=2000)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    w = window_overhead(args.backbone, args.images, args.seconds, args.device, args.bf16)
    print(markdown(w, metric_speed(args.maps)))


if __name__ == "__main__":
    main()
