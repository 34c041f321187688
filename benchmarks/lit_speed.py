"""LiT costs (transferbench.adapters.lit), each against a peer in the same process:

    python -m benchmarks.lit_speed [--image b32] [--res 224] [--batch 32] [--classes 1000] [--seconds 2] [--device cpu]

- text-tower training steps with the locked image tower's features read from the cache (what the adapter
  does) against the same steps recomputing the locked image tower on the batch's images every step
  (`LockedImageTower`); the same text tower, optimizer, loss and batch. Printed: steps per second of
  each and the ratio;
- zero-shot classifier construction, `classes` ImageNet class names x open_clip's 80 CLIP templates,
  through `zero_shot_classifier` (with `tokenizer`: open_clip's, its text cleaning skipped on plain ASCII)
  against open_clip's own `build_zero_shot_classifier` (classes in batches of 10, its default) with open_clip's
  SimpleTokenizer, on the same text tower (the embedded suite's: 2 layers x 64 wide, context
  16); target: ratio >= 1.0x with weights equal to 1e-5.
"""

from __future__ import annotations

import argparse

import torch

from benchmarks import interleaved_medians

EMBEDDED_TEXT = {"context_length": 16, "vocab_size": 49408, "width": 64, "heads": 2, "layers": 2}


def train_steps(
    image: str = "b32",
    res: int = 224,
    batch: int = 32,
    text: dict | None = None,
    seconds: float = 2.0,
    device: str = "cpu",
) -> dict:
    from transferbench.adapters.lit import LitModel, LockedImageTower, contrastive_loss, parameter_groups, tokenizer
    from transferbench.adapters.lit.training import tower_options
    from transferbench.backbones import create_backbone
    from transferbench.engine.train import fit
    from transferbench.settings.lit import LitSettings

    text = text or {"context_length": 16, "vocab_size": 49408, "width": 256, "heads": 4, "layers": 4}
    torch.manual_seed(0)
    tower = LockedImageTower(create_backbone(image, img_size=res)).to(device)
    images = torch.randn(batch, 3, res, res)
    feats = tower(images.to(device)).cpu()
    tokens = tokenizer(text["context_length"])([f"a photo of object number {i} on a table" for i in range(batch)])
    runs = {}
    for name, source in (("cached", feats), ("recompute", images)):
        model = LitModel(feats.shape[1], text, **tower_options(LitSettings())).to(device)
        opt = torch.optim.AdamW(parameter_groups(model, 0.01), lr=1e-4)
        loss = contrastive_loss(model)
        embed = (lambda x: x) if name == "cached" else tower
        sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)

        def step(model=model, opt=opt, loss=loss, embed=embed, source=source):
            fit(
                model,
                iter([(tokens, source)]),
                opt,
                steps=1,
                base_lr=1e-4,
                warmup=0,
                clip=1.0,
                device=device,
                bf16=False,
                loss_fn=lambda t, x: loss(t, embed(x)),
                splittable=False,
            )
            sync()

        runs[name] = step
    t = interleaved_medians(runs, seconds)
    return {
        "image": image,
        "res": res,
        "batch": batch,
        "text": text,
        "device": device,
        "cached_s": t["cached"],
        "recompute_s": t["recompute"],
        "ratio": t["recompute"] / t["cached"],
    }


def classifier_speed(classes: int = 1000, seconds: float = 2.0, device: str = "cpu") -> dict:
    import open_clip

    from transferbench.adapters.lit import LitModel, clean_class_name, tokenizer, zero_shot_classifier
    from transferbench.adapters.lit.training import tower_options
    from transferbench.settings.lit import LitSettings

    torch.manual_seed(0)
    model = LitModel(128, EMBEDDED_TEXT, **tower_options(LitSettings())).to(device).eval()
    tok = tokenizer(EMBEDDED_TEXT["context_length"])
    names = [clean_class_name(n) for n in open_clip.IMAGENET_CLASSNAMES[:classes]]
    templates = list(open_clip.OPENAI_IMAGENET_TEMPLATES)
    out = {}

    def ours():
        out["ours"] = zero_shot_classifier(model, tok, names, templates, device=device)

    stock = open_clip.SimpleTokenizer(context_length=EMBEDDED_TEXT["context_length"])  # the same tokens, tested

    def theirs():
        out["open_clip"] = open_clip.build_zero_shot_classifier(model, stock, names, templates, device=device)

    t = interleaved_medians({"ours": ours, "open_clip": theirs}, seconds, min_rounds=2)
    diff = float((out["ours"].cpu() - out["open_clip"].cpu()).abs().max())
    return {
        "classes": classes,
        "templates": len(templates),
        "device": device,
        "ours_s": t["ours"],
        "open_clip_s": t["open_clip"],
        "ratio": t["open_clip"] / t["ours"],
        "max_abs_diff": diff,
    }


def markdown(s: dict, c: dict) -> str:
    text = s["text"]
    return "\n".join(
        [
            "| measure | ours | peer | ratio (target) |",
            "|---|---|---|---|",
            f"| text-tower training step, batch {s['batch']}, locked {s['image']} at {s['res']} px, text tower "
            f"{text['layers']} x {text['width']} (context {text['context_length']}), {s['device']} | "
            f"{1 / s['cached_s']:.2f} steps/s (cached image features) | {1 / s['recompute_s']:.2f} steps/s "
            f"(image tower "
            f"every step) | {s['ratio']:.1f}x faster |",
            f"| zero-shot classifier, {c['classes']} classes x {c['templates']} templates, embedded text tower "
            f"(2 x 64), {c['device']}; max |Δ weight| {c['max_abs_diff']:.1e} | {c['ours_s']:.2f} s | "
            f"{c['open_clip_s']:.2f} s (open_clip build_zero_shot_classifier) | {c['ratio']:.2f}x (>= 1.0x, Δ "
            f"<= 1e-5) |",
        ]
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--image", default="b32")
    ap.add_argument("--res", type=int, default=224)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--classes", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(
        markdown(
            train_steps(args.image, args.res, args.batch, seconds=args.seconds, device=args.device),
            classifier_speed(args.classes, args.seconds, args.device),
        )
    )


if __name__ == "__main__":
    main()
