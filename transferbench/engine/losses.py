"""The classification losses a protocol names: softmax cross-entropy and big_vision's sigmoid_xent (`LOSSES`, the
`loss` setting's choices)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _targets(y: torch.Tensor, classes: int) -> torch.Tensor:
    """Class indices -> one-hot; soft targets (mixup) as they are."""
    return y.float() if y.is_floating_point() else F.one_hot(y, classes).float()


def cross_entropy(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Softmax cross-entropy (big_vision's `softmax_xent`), mean over examples; `y` indices or soft targets."""
    if y.is_floating_point():
        return -(y * F.log_softmax(logits, dim=-1)).sum(-1).mean()
    return F.cross_entropy(logits, y)


def sigmoid_cross_entropy(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """big_vision's `sigmoid_xent`: per example the binary cross-entropy of every class against its one-hot (or
    soft) target, summed over classes; mean over examples."""
    target = _targets(y, logits.shape[-1]).to(logits.dtype)
    return F.binary_cross_entropy_with_logits(logits, target, reduction="sum") / len(y)


LOSSES = {"sigmoid": sigmoid_cross_entropy, "softmax": cross_entropy}  # the `loss` hyper-parameter's choices
