"""LiT's zero-shot evaluator (big_vision's discriminative_classifier): prompt templates and class names, the
prompt-ensemble zero-shot classifier (open_clip's weights), top-k accuracy, and one cell's evaluation."""

from __future__ import annotations

import re
import string
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from ...arithmetic import output
from ...settings.choices import LIT_PROMPTS as PROMPTS


def canonicalize(text: str, keep: str | None = None) -> str:
    """big_vision's `prompt_engineering._canonicalize`: '_' -> ' ', punctuation removed (except each exact
    occurrence of `keep`), lower case, runs of whitespace folded to one space, stripped."""
    text = text.replace("_", " ")
    drop = str.maketrans("", "", string.punctuation)
    text = keep.join(part.translate(drop) for part in text.split(keep)) if keep else text.translate(drop)
    return re.sub(r"\s+", " ", text.lower()).strip()


def clean_class_name(name: str, prompts: str = "big_vision") -> str:
    """A class name as the zero-shot classifier sees it. big_vision (`get_class_names(canonicalize=True)` then
    the evaluator's `first_class_name_only`): canonicalised keeping commas, then the first comma-separated
    alias. open_clip: lower case, '_' -> ' ', the first comma-separated name, punctuation kept."""
    if prompts == "big_vision":
        return canonicalize(name, keep=",").split(",")[0].strip()
    return name.split(",")[0].replace("_", " ").strip().lower()


def templates_for(spec, prompts: str = "big_vision") -> list:
    """Prompt makers (class name -> prompt). `imagenet`: CLIP's 80 ImageNet templates and '{}' (big_vision's
    `clip_paper` list, the same 80 as open_clip's OPENAI_IMAGENET_TEMPLATES); a list: format strings with one
    '{}'. With prompts 'big_vision' every template is canonicalised keeping '{}' (`get_prompt_templates`), so
    'a bad photo of a {}.' becomes 'a bad photo of a {}'; with 'open_clip' they are used as written."""
    if prompts not in PROMPTS:
        raise ValueError(f"prompts {prompts!r}: choose one of {', '.join(PROMPTS)}")
    if spec == "imagenet":
        from open_clip import OPENAI_IMAGENET_TEMPLATES

        spec = [t("{}") for t in OPENAI_IMAGENET_TEMPLATES] + ["{}"]
    if isinstance(spec, str) or any(not isinstance(t, str) or t.count("{}") != 1 for t in spec):
        raise ValueError(f"templates: 'imagenet' or a list of strings with one '{{}}' each, got {spec!r}")
    if prompts == "big_vision":
        spec = [canonicalize(t, keep="{}") for t in spec]
    return [t.format for t in spec]


def class_names_for(spec, data=None, prompts: str = "big_vision") -> list[str]:
    """`imagenet`: open_clip's ImageNet class names (CLIP's curated ones, which big_vision's `clip` source also
    uses); `tfds` / `info`: the dataset's own label names; a list: as given. Every name cleaned
    (`clean_class_name`)."""
    if spec == "imagenet":
        from open_clip import IMAGENET_CLASSNAMES

        names = list(IMAGENET_CLASSNAMES)
    elif isinstance(spec, str):
        names = list(getattr(data, "class_names", None) or (getattr(data, "info", {}) or {}).get("class_names") or [])
        if not names:
            raise ValueError(f"class_names: {spec!r}, but the dataset has no label names; list them in the spec")
    else:
        names = list(spec)
    return [clean_class_name(n, prompts) for n in names]


@torch.inference_mode()
def zero_shot_classifier(
    model, tok, classnames: Sequence[str], templates: Sequence, *, batch: int = 256, device: str = "cpu", progress=None
) -> torch.Tensor:
    """(D, K) class embeddings, as open_clip's `build_zero_shot_classifier` makes them (each prompt's text
    embedding normalised, averaged over templates, normalised), computed faster: every prompt tokenised in
    one call, prompts sorted by length and batched so that each batch runs only to its longest prompt
    (`LitModel.encode_text(trim=True)`), and results put back in place."""
    prompts = [t(c) for c in classnames for t in templates]
    tokens = tok(prompts)
    lengths = tokens.argmax(-1)  # position of the end-of-text token
    order = torch.argsort(lengths, stable=True)
    out = None
    starts = range(0, len(order), batch)
    for start in progress(starts, desc="zero-shot prompts") if progress else starts:
        idx = order[start : start + batch]
        emb = model.encode_text(tokens[idx].to(device), normalize=True, trim=True).float().cpu()
        if out is None:
            out = torch.empty(len(prompts), emb.shape[1])
        out[idx] = emb
    weights = out.reshape(len(classnames), len(templates), -1).mean(1)
    return F.normalize(weights, dim=-1).T


def topk_accuracy(logits: torch.Tensor, labels, ks=(1, 5)) -> dict:
    labels = torch.as_tensor(np.asarray(labels))
    top = logits.topk(min(max(ks), logits.shape[1]), dim=1).indices
    return {k: float((top[:, :k] == labels[:, None]).any(1).float().mean()) for k in ks if k <= logits.shape[1]}


def evaluate_zero_shot(model, frozen, data, ds: dict, identity: dict, s, device: str, progress=None):
    """(test metrics, per-example hits, info) of the trained `model` on zero-shot dataset `ds` (opened as
    `data`): its images through the locked tower (`frozen`, cached), classified by the prompt ensemble."""
    from ...data.transforms import eval_transform
    from ...errors import UserError
    from .towers import tokenizer

    x, y, hit, _ = frozen.split(
        data,
        identity,
        ds["test"],
        eval_transform(s.resolution, resize_square=s.zeroshot_resize, pixels=s.pixels),
        frozen.transform(resize_square=s.zeroshot_resize),
        f"features {frozen.name} {ds['name']}",
    )
    names = class_names_for(ds["class_names"], data, s.prompts)
    if getattr(data, "num_classes", 0) and len(names) != data.num_classes:
        raise UserError(
            f"dataset {ds['name']!r} has {data.num_classes} classes but {len(names)} class "
            "names; give one name per label, in label order (class_names in the spec)"
        )
    templates = templates_for(ds["templates"], s.prompts)
    weights = zero_shot_classifier(
        model, tokenizer(s.context_length), names, templates, device=device, progress=progress
    )
    logits = model.encode_image(torch.from_numpy(x).to(device), normalize=True).float().cpu() @ weights
    output("zeroshot.logits", logits)
    acc = topk_accuracy(logits, y)
    test = {"accuracy": 100 * acc[1], **({"top5": 100 * acc[5]} if 5 in acc else {})}
    hits = (logits.argmax(1) == torch.as_tensor(np.asarray(y))).numpy()
    info = {
        "eval_examples": int(len(y)),
        "classes": len(names),
        "templates": len(templates),
        "feature_cache_hit_eval": hit,
    }
    return test, {"test": hits}, info
