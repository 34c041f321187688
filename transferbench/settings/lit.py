"""LiT's settings (DPN §6.2 for the scale; big_vision configs/proj/image_text/lit_coco.py, the public LiT config,
for the rest unless noted)."""

from __future__ import annotations

from typing import Literal

from .base import BF16, BF16_HELP, BF16_SOURCE, PIXELS_HELP, Settings, setting
from .choices import LIT_DECAY, LIT_IMAGE_HEADS, LIT_LOSSES, LIT_PROMPTS

LIT = "big_vision lit_coco.py"
OPEN_CLIP = "open_clip --csv-img-key / --csv-caption-key / --csv-separator"


class LitSettings(Settings):
    """The locked image tower, the text tower trained against it, and the zero-shot and retrieval evaluations."""

    pixels: str = setting("auto", "big_vision value_range(-1, 1)", PIXELS_HELP)
    pairs: str | None = setting(
        None,
        "DPN §6.2",
        "image-text training pairs: webdataset shards ('DIR/{00000..01242}.tar' or a folder of "
        ".tar), a CSV/TSV, or embedded",
    )
    csv_img_key: str = setting("filepath", OPEN_CLIP, "a CSV's image column")
    csv_caption_key: str = setting("title", OPEN_CLIP, "a CSV's caption column")
    csv_separator: str = setting("\t", OPEN_CLIP, "a CSV's separator")
    heldout: int = setting(
        5000,
        "not in lit_coco, which scores retrieval on COCO's own val split: pairs held out of a single pairs source",
        "the last N pairs are not trained on: retrieval is scored on them",
        ge=1,
    )
    image_head: Literal[LIT_IMAGE_HEADS] = setting(  # type: ignore[valid-type]
        "none", f"LiT's locked setting; {LIT}: out_dim = (None, D)", "none: the pre-logits as they are | linear"
    )
    pool: Literal["model", "tok", "gap"] = setting(
        "model", "big_vision: the model's pre_logits", "model: as the backbone pools | tok | gap: for every backbone"
    )
    resolution: int = setting(224, f"{LIT}: resize(224)", "pair and zero-shot image resolution", ge=1)
    augment: Literal["none", "flip"] = setting(
        "flip",
        f"{LIT}: pp_train resize|flip_lr (RandAugment needs the tower every step)",
        "flip: a mirrored view cached beside each pair, one of the two drawn per step | none",
    )
    zeroshot_resize: int | None = setting(
        256, "big_vision discriminative_classifier: _square875", "zero-shot: resize to N x N, central crop (null: none)"
    )
    text_width: int = setting(768, "DPN §6.2: LiT's B text tower", "text tower width", ge=1)
    text_layers: int = setting(12, "DPN §6.2: LiT's B text tower", "text tower depth", ge=1)
    text_heads: int = setting(12, "DPN §6.2: LiT's B text tower", "text tower heads", ge=1)
    context_length: int = setting(16, f"{LIT}: token_len", "tokens per caption", ge=2)
    vocab_size: int = setting(49408, "open_clip's BPE tokenizer", "text tower vocabulary", ge=1, keyed=False)
    loss: Literal[LIT_LOSSES] = setting(  # type: ignore[valid-type]
        "clip",
        "LiT: softmax contrastive",
        "clip: open_clip ClipLoss | siglip: SigLipLoss (bias initialised to siglip_bias)",
    )
    temperature_init: float = setting(10.0, f"{LIT}: temperature_init", "logits = exp(t) cos, t = log(this)", gt=0)
    batch: int = setting(16384, "DPN §6.2", "pairs per step", ge=1)
    steps: int = setting(55000, "DPN §6.2", "training steps", ge=1)
    lr: float = setting(1.0e-3, f"{LIT}: lr", "Adam learning rate (peak)", gt=0)
    weight_decay: float = setting(0.01, f"{LIT}: wd", "weight decay (see decay)", ge=0)
    decay: Literal[LIT_DECAY] = setting(  # type: ignore[valid-type]
        "big_vision",
        "big_vision optax.py",
        "big_vision: sched(t) x wd on the dense kernels, not x lr | open_clip: "
        "AdamW's lr_t x wd on every tensor of >= 2 dims",
    )
    warmup_steps: int | None = setting(
        None,
        f"{LIT}: warmup_steps = max(int(0.03 * total_steps), 100)",
        "linear warm-up steps, then cosine (null: the rule, 1,650 at 55,000 steps)",
        ge=0,
    )
    prompts: Literal[LIT_PROMPTS] = setting(  # type: ignore[valid-type]
        "big_vision", "big_vision prompt_engineering.py", "big_vision: names and templates canonicalised | open_clip"
    )
    clip: float = setting(1.0, f"{LIT}: grad_clip_norm", "gradient clipping by global norm (0: none)", ge=0)
    beta1: float = setting(
        0.9, f"{LIT}: scale_by_adam (optax's default b1)", "Adam's first-moment decay", keyed=False, gt=0, lt=1
    )
    beta2: float = setting(
        0.999, f"{LIT}: scale_by_adam (optax's default b2)", "Adam's second-moment decay", keyed=False, gt=0, lt=1
    )
    siglip_bias: float = setting(
        -10.0,
        "SigLIP (Zhai et al. 2023): the bias starts at -10; open_clip's init_logit_bias",
        "loss: siglip: the learnable bias's initial value",
        keyed=False,
    )
    bf16: BF16 = setting("auto", BF16_SOURCE, BF16_HELP)

    rules = {"warmup_steps": (("steps",), lambda v: max(int(0.03 * v["steps"]), 100))}
