"""LiT's retrieval evaluator (big_vision's proj/image_text retrieval): image <-> text recall@k on the held-out
tail of the task's pairs."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from ...arithmetic import output
from .towers import tokenizer


def retrieval_recall(image: torch.Tensor, text: torch.Tensor, captions: Sequence[str], ks=(1, 5)) -> dict:
    """Recall@k both ways on normalised embeddings of paired rows. A retrieved item is right when its
    caption text equals the query's (COCO's several-captions rule, for captions that repeat)."""
    _, group = np.unique(np.asarray(captions), return_inverse=True)
    group = torch.as_tensor(group)
    sim = image @ text.T
    output("retrieval.similarity", sim)
    out = {}
    for k in ks:
        k_ = min(k, len(group))
        i2t = group[sim.topk(k_, dim=1).indices] == group[:, None]
        t2i = group[sim.T.topk(k_, dim=1).indices] == group[:, None]
        out[f"i2t_r{k}"] = float(i2t.any(1).float().mean())
        out[f"t2i_r{k}"] = float(t2i.any(1).float().mean())
    return out


def evaluate_retrieval(model, features, captions, way: str, context_length: int, device: str) -> tuple[dict, dict]:
    """(test metrics, info) of `model` retrieving one way (`i2t` | `t2i`) among the held-out pairs' cached image
    `features` and their `captions`; the metric is recall@1, recall@5 and both ways' recalls are kept."""
    tok = tokenizer(context_length)
    img = model.encode_image(torch.from_numpy(features).to(device), normalize=True)
    txt = torch.cat(
        [
            model.encode_text(tok(list(captions[i : i + 1024])).to(device), normalize=True, trim=True)
            for i in range(0, len(captions), 1024)
        ]
    )
    rec = retrieval_recall(img.float().cpu(), txt.float().cpu(), captions)
    test = {
        "accuracy": 100 * rec[f"{way}_r1"],
        "recall@5": 100 * rec[f"{way}_r5"],
        **{k: 100 * v for k, v in rec.items()},
    }
    return test, {"eval_examples": len(captions)}
