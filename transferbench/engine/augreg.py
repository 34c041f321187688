"""The AugReg pretraining recipe's pieces that are not the training loop (DPN App. C; big_vision
`configs/vit_i1k.py`, `utils.mixup`, `optax.py`) and the reference codebases' weight-decay rules:

- `AUG`: per model size, the named augmentation strength App. C uses (the strengths themselves, `RANDAUG` and
  `MIXUP`, are settings' values: `settings.choices`);
- `mixup`: big_vision's mixup of a batch (one Dirichlet(p, p) draw per batch, sorted so that the first image
  dominates, each image mixed with its neighbour `roll(batch, 1)`, labels alike);
- `decoupled_wd`: big_vision's weight decay as torch AdamW's. big_vision's update is
  -sched(t) * (lr * adam + wd * param) on the `.*/kernel$` parameters: the decay follows the schedule but is
  not multiplied by the learning rate, so AdamW (which decays by lr_t * weight_decay) needs weight_decay = wd / lr;
- `scale_and_bias`, `scenic_adamw`: scenic's decay mask (`skip_scale_and_bias_regularization`), used by the
  segmentation protocol;
- `kernel_names` / `kernels`: which parameters are decayed: big_vision's default mask `.*/kernel$`, the weights
  of dense and conv layers and DTN's positional weights, which the DTN reference computes with a dense layer (not
  biases, norms, position embeddings, the cls token or DTN's mixing logits);
- `decay_groups`: the two AdamW parameter groups (decayed, not) that every rule above feeds.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from ..settings.choices import RANDAUG

# DPN App. C's table: the augmentation strength per model (big_vision's vit_i1k.py default differs for S/32:
# light2 there, medium1 in the paper; the paper wins)
AUG = {"ti16": "light1", "s32": "medium1", "s16": "medium2", "b32": "medium2", "b16": "medium2", "l16": "medium2"}
NO_REP = ("s32",)  # App. C: rep_size=True except for S/32
BIG = ("b", "l")  # dropout and stochastic depth 0.1 for B and L only


def size_key(parsed: dict, name: str) -> str:
    """'b16' for any backbone of ViT-B/16 (stem, DTN or `_rep` variants alike)."""
    from ..backbones.registry import SIZES

    size = next(
        (k for k, s in SIZES.items() if s.embed_dim == parsed["embed_dim"] and s.depth == parsed["depth"]), name
    )
    return f"{size}{parsed['patch_size']}"


def torchvision_magnitude(magnitude: int) -> int:
    """big_vision's randaug magnitude m (TF autoaugment: level m of _MAX_LEVEL 10 sets each op at m/10 of its
    range, and m may exceed 10) on torchvision's 31 bins (bin 30 = each op's full range): bin 3m, capped at 30."""
    return min(30, 3 * int(magnitude))


def randaugment(aug: str):
    """torchvision's RandAugment at the strength `aug` names (None for 'none'); light1 is randaug(2, 0), which
    still applies two operations (the magnitude-free ones change the image)."""
    from torchvision.transforms import v2

    setting = RANDAUG[aug]
    if setting is None:
        return None
    ops, magnitude = setting
    return v2.RandAugment(num_ops=ops, magnitude=torchvision_magnitude(magnitude), num_magnitude_bins=31)


def mixup(x: torch.Tensor, y: torch.Tensor, p: float, rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """big_vision's `utils.mixup` with n = 2 and one coefficient per batch: alpha ~ Dirichlet(p, p) sorted in
    decreasing order, x' = a0 x + a1 roll(x, 1) and the one-hot (or soft) targets y' alike. p = 0: unchanged."""
    if not p:
        return x, y
    a = np.sort(rng.dirichlet([p, p]))[::-1]
    a0, a1 = float(a[0]), float(a[1])
    return a0 * x + a1 * torch.roll(x, 1, dims=0), a0 * y + a1 * torch.roll(y, 1, dims=0)


def mixup_batches(batches, p: float, num_classes: int, seed: int):
    """(images, labels) batches -> (mixed images, mixed one-hot targets), one draw per batch from a generator
    seeded by the cell's seed."""
    rng = np.random.default_rng([seed, 0x6D78])
    for x, y in batches:
        target = torch.nn.functional.one_hot(torch.as_tensor(y), num_classes).float()
        yield mixup(x, target, p, rng)


class TargetEntropy:
    """The mean entropy, -sum_c t_c log t_c, of the training targets a loss sees (one-hot: 0; mixup's soft targets:
    more), over every example of every batch that `watch` passes on. A pretraining probe's signal: a mixup whose
    targets stay one-hot moves it from its value to 0. Summed on the batches' device, read once at the end."""

    def __init__(self):
        self.total, self.examples = None, 0

    def watch(self, batches):
        for x, y in batches:
            if y.is_floating_point():
                t = y.detach().double()
                h = -torch.special.xlogy(t, t).sum()  # 0 log 0 = 0
                self.total = h if self.total is None else self.total + h
            self.examples += len(y)
            yield x, y

    def value(self) -> float:
        return 0.0 if self.total is None or not self.examples else float(self.total) / self.examples


def decayed_norm(model: nn.Module) -> float:
    """The L2 norm of the parameters weight decay acts on (`kernels`), in float64: a pretraining probe's signal of
    the decay actually applied."""
    with torch.no_grad():
        return float(torch.sqrt(sum(k.detach().double().square().sum() for k in kernels(model))))


def kernel_names(model: nn.Module) -> list[str]:
    """big_vision's `.*/kernel$` on torch modules: the weight of every dense (nn.Linear) and conv layer,
    nn.MultiheadAttention's q/k/v projection (`in_proj_weight`, or the separate `q/k/v_proj_weight`), which
    flax's attention keeps as dense kernels, and DTN's positional weights `pos_weight` (H, 3): the DTN reference
    computes R . a^h with a dense layer from R's 3 features to the heads, and the paper's DeiT recipe decays every
    parameter of 2 or more dimensions (timm's `param_groups_weight_decay`); its mixing logits (H) stay undecayed
    in both."""
    from ..backbones.dtn import DynamicTokenNorm

    names = []
    for prefix, m in model.named_modules():
        dot = f"{prefix}." if prefix else ""
        if isinstance(m, (nn.Linear, nn.Conv2d)):
            names.append(f"{dot}weight")
        elif isinstance(m, DynamicTokenNorm):
            names.append(f"{dot}pos_weight")
        elif isinstance(m, nn.MultiheadAttention):
            names += [
                f"{dot}{k}"
                for k in ("in_proj_weight", "q_proj_weight", "k_proj_weight", "v_proj_weight")
                if getattr(m, k, None) is not None
            ]
    return names


def kernels(model: nn.Module) -> list[nn.Parameter]:
    """The parameters `kernel_names` names."""
    params = dict(model.named_parameters(remove_duplicate=False))
    return [params[n] for n in kernel_names(model)]


def decay_groups(model: nn.Module, decayed, weight_decay: float) -> list[dict]:
    """AdamW parameter groups: the trainable parameters named in `decayed` at `weight_decay`, the others at 0,
    each in `named_parameters` order."""
    decayed = set(decayed)
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    return [
        {"params": [p for n, p in named if n in decayed], "weight_decay": float(weight_decay)},
        {"params": [p for n, p in named if n not in decayed], "weight_decay": 0.0},
    ]


def scale_and_bias(model: nn.Module) -> list[str]:
    """scenic's `skip_scale_and_bias_regularization` (train_lib/optimizers.py): the weight-decay mask is
    `x.ndim != 1`, so every 1-D parameter goes undecayed: LayerNorm scales and biases (DPN's two stem norms
    included) and the biases of dense and conv layers. Position embeddings, the cls token and every kernel stay
    decayed (in a flax tree they are 3-D or more). The names of the 1-D parameters, in `named_parameters` order."""
    return [n for n, p in model.named_parameters() if p.requires_grad and p.ndim == 1]


def scenic_adamw(
    model: nn.Module,
    *,
    lr: float,
    weight_decay: float,
    betas: tuple[float, float],
    skip_scale_and_bias: bool = True,
    device: str = "cpu",
) -> torch.optim.AdamW:
    """optax.adamw as scenic configures it: decay lr_t * weight_decay * param (torch AdamW's semantics, which
    optax.adamw shares), not on `scale_and_bias(model)` with `skip_scale_and_bias`."""
    skip = set(scale_and_bias(model)) if skip_scale_and_bias else set()
    decayed = [n for n, _ in model.named_parameters() if n not in skip]
    from .train import optimizer_options

    return torch.optim.AdamW(
        decay_groups(model, decayed, weight_decay), lr=lr, betas=betas, **optimizer_options(device)
    )


def decoupled_wd(wd: float, lr: float) -> float:
    """big_vision's `wd` as torch AdamW's weight_decay: wd / lr (see the module's docstring)."""
    return float(wd) / float(lr) if wd else 0.0


def adamw(
    model: nn.Module,
    *,
    lr: float,
    wd: float,
    betas: tuple[float, float],
    device: str = "cpu",
    dtn_lr_mult: float = 1.0,
) -> torch.optim.AdamW:
    """AdamW decaying the kernels only, by sched(t) * wd per step as big_vision does (engine.train.fit sets each
    step's lr = lr * sched(t)). `dtn_lr_mult` != 1 moves DTN's own parameters (`dtn_parameter_names`) into groups
    of their own whose `lr_mult` fit applies."""
    from .train import optimizer_options

    groups = decay_groups(model, kernel_names(model), decoupled_wd(wd, lr))
    if dtn_lr_mult != 1.0:
        params = dict(model.named_parameters())
        dtn = {id(params[n]) for n in dtn_parameter_names(model)}
        split = []
        for g in groups:
            own = [p for p in g["params"] if id(p) in dtn]
            rest = [p for p in g["params"] if id(p) not in dtn]
            # AdamW's decay is lr_t * weight_decay: the multiplied lr keeps big_vision's sched(t) * wd
            split += [
                {**g, "params": rest},
                {
                    **g,
                    "params": own,
                    "lr_mult": float(dtn_lr_mult),
                    "weight_decay": g["weight_decay"] / float(dtn_lr_mult),
                },
            ]
        groups = [g for g in split if g["params"]]
    return torch.optim.AdamW(groups, lr=lr, betas=betas, **optimizer_options(device))


def dtn_parameter_names(model: nn.Module) -> list[str]:
    """The mixing logits and positional weights of every DynamicTokenNorm (backbones.dtn), in
    `named_parameters` order: the parameters DTN adds to a ViT besides its affine scale and bias."""
    from ..backbones.dtn import DynamicTokenNorm

    names = []
    for prefix, m in model.named_modules():
        if isinstance(m, DynamicTokenNorm):
            names += [f"{prefix}.{k}" for k in ("mix_mean", "mix_var", "pos_weight")]
    return names
