"""LiT's towers: the locked backbone as image tower (optionally a trainable linear head), open_clip's text
tower and tokenizer (with a fast path for plain ASCII and trimmed padding), the contrastive losses and the
parameter groups of weight decay."""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F
from torch import nn

from ...settings.choices import LIT_DECAY as DECAY
from ...settings.choices import LIT_IMAGE_HEADS as IMAGE_HEADS
from ...settings.choices import LIT_LOSSES as LOSSES

LOGIT_SCALE_MAX = 100.0  # CLIP's clamp on exp(t)


def text_config(s) -> dict:
    """The open_clip text config (CLIPTextCfg fields) of a cell's settings (settings.lit.LitSettings)."""
    return {
        "context_length": s.context_length,
        "vocab_size": s.vocab_size,
        "width": s.text_width,
        "heads": s.text_heads,
        "layers": s.text_layers,
    }


class LitModel(nn.Module):
    """The trainable side of LiT: open_clip's text tower projected to the image embedding's width, an
    optional linear head on the locked image embeddings, the temperature (and SigLIP's bias)."""

    def __init__(
        self,
        embed_dim: int,
        text_cfg: dict,
        *,
        temperature_init: float,
        bias_init: float,
        image_head: str = "none",
        loss: str = "clip",
    ):
        super().__init__()
        from open_clip.model import CLIPTextCfg, _build_text_tower

        if image_head not in IMAGE_HEADS:
            raise ValueError(f"image_head must be one of {IMAGE_HEADS}, got {image_head!r}")
        if loss not in LOSSES:
            raise ValueError(f"loss must be one of {LOSSES}, got {loss!r}")
        self.text = _build_text_tower(embed_dim, CLIPTextCfg(**text_cfg))
        self.image_head = nn.Linear(embed_dim, embed_dim) if image_head == "linear" else nn.Identity()
        self.logit_scale = nn.Parameter(torch.tensor(math.log(temperature_init)))
        self.logit_bias = nn.Parameter(torch.tensor(float(bias_init))) if loss == "siglip" else None
        self.loss_name = loss

    def scale(self) -> torch.Tensor:
        return self.logit_scale.exp().clamp(max=LOGIT_SCALE_MAX)

    def encode_text(self, text: torch.Tensor, normalize: bool = False, trim: bool = False) -> torch.Tensor:
        """open_clip's signature (`build_zero_shot_classifier` calls it). `trim`: run only up to the longest
        prompt's end-of-text token (`trimmable`), which changes nothing under a causal mask."""
        if trim and trimmable(self.text):
            length = int(text.argmax(-1).max()) + 1  # argmax: the end-of-text token, the largest id
            with _context(self.text, length):
                x = self.text(text[:, :length])
        else:
            x = self.text(text)
        return F.normalize(x, dim=-1) if normalize else x

    def encode_image(self, features: torch.Tensor, normalize: bool = False) -> torch.Tensor:
        x = self.image_head(features)
        return F.normalize(x, dim=-1) if normalize else x

    def forward(self, text: torch.Tensor) -> torch.Tensor:
        return self.encode_text(text, normalize=True, trim=True)


class LockedImageTower(nn.Module):
    """The backbone as LiT's locked image tower, for training that runs it every step (the adapter caches
    its features instead): parameters without gradient, eval mode whatever `train()` says, pooled pre-logits
    computed under no_grad."""

    def __init__(self, backbone: nn.Module):
        super().__init__()
        self.backbone = backbone.requires_grad_(False).eval()

    def train(self, mode: bool = True):
        super().train(mode)
        self.backbone.eval()
        return self

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return self.backbone.forward_head(self.backbone.forward_features(images), pre_logits=True)


def trimmable(tower) -> bool:
    """Whether dropping the padding after the last end-of-text token leaves the output unchanged: a causal
    mask (no position sees a later one), no padding mask or class token, pooling at the end-of-text token."""
    return (
        getattr(tower, "attn_mask", None) is not None
        and not getattr(tower, "use_pad_mask", False)
        and getattr(tower, "cls_emb", None) is None
        and getattr(tower, "pool_type", "") in ("argmax", "eos")
    )


@contextlib.contextmanager
def _context(tower, length: int):
    """The tower's causal mask cut to `length` positions for one forward (open_clip slices its positional
    embedding to the input's length, but not the mask)."""
    full = tower.attn_mask
    tower.attn_mask = full[:length, :length]
    try:
        yield
    finally:
        tower.attn_mask = full


def tokenizer(context_length: int):
    """open_clip's bundled BPE tokenizer (CLIP's vocabulary; works offline) at the spec's context length,
    its text cleaning skipped where it cannot change anything (`_PlainCleaning`)."""
    from open_clip import SimpleTokenizer

    tok = SimpleTokenizer(context_length=context_length)
    tok.clean_fn = _PlainCleaning(tok.clean_fn)
    return tok


class _PlainCleaning:
    """open_clip's 'lower' cleaning is ftfy.fix_text, html.unescape twice, whitespace folding, lower case. On
    printable ASCII without '&' the first two change nothing (ftfy repairs mojibake, control and non-ASCII
    characters; unescaping needs an '&'), and they are half the tokenizer's time on prompts; such text
    gets only the folding and lower case. Anything else takes open_clip's own function (tested equal)."""

    def __init__(self, full):
        self.full = full

    def __call__(self, text: str) -> str:
        if text.isascii() and text.isprintable() and "&" not in text:
            return " ".join(text.split()).lower()
        return self.full(text)


def contrastive_loss(model: LitModel):
    """loss(text embeddings, image features): open_clip's ClipLoss or SigLipLoss on normalised embeddings,
    with the model's learnable temperature (and bias)."""
    from open_clip.loss import ClipLoss, SigLipLoss

    if model.loss_name == "siglip":
        siglip = SigLipLoss()
        return lambda text, image: siglip(
            model.encode_image(image, normalize=True), text, model.scale(), model.logit_bias
        )
    clip = ClipLoss()
    return lambda text, image: clip(model.encode_image(image, normalize=True), text, model.scale())


def kernel_names(model: nn.Module) -> list[str]:
    """big_vision's default decay mask `.*/kernel$` on the towers: `engine.augreg.kernel_names` (every nn.Linear
    weight, the attention's fused q/k/v `in_proj_weight`) and the text tower's output projection
    `text_projection` (big_vision's text `head/kernel`); not the token or position embeddings (flax
    `embedding`, `pos_embedding`), norms, biases or the temperature."""
    from ...engine.augreg import kernel_names as dense_kernels

    return dense_kernels(model) + [
        n for n, p in model.named_parameters() if n.endswith("text_projection") and p.ndim == 2
    ]


def parameter_groups(
    model: nn.Module, weight_decay: float, *, lr: float | None = None, decay: str = "big_vision"
) -> list[dict]:
    """AdamW parameter groups. 'big_vision' (optax.py): the decay is sched(t) * wd * param on the kernels
    (`kernel_names`), not multiplied by the learning rate, so torch's AdamW, which decays by lr_t *
    weight_decay, gets weight_decay = wd / lr (`engine.augreg.decoupled_wd`). 'open_clip': AdamW's own
    semantics (lr_t * wd) on every tensor of 2 or more dimensions but the temperature."""
    from ...engine.augreg import decay_groups, decoupled_wd

    if decay == "big_vision":
        if lr is None:
            raise ValueError("big_vision's weight decay needs the base learning rate")
        return decay_groups(model, kernel_names(model), decoupled_wd(weight_decay, lr))
    if decay == "open_clip":
        chosen = [n for n, p in model.named_parameters() if p.ndim >= 2 and "logit_" not in n]
        return decay_groups(model, chosen, weight_decay)
    raise ValueError(f"decay {decay!r}: choose one of {', '.join(DECAY)}")
