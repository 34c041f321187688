"""LiT zero-shot (DPN §6.2; Zhai et al. 2022; docs/lit.md): the backbone, locked, is the
image tower; an open_clip text tower is trained contrastively against it on image-text pairs, then
classifies images zero-shot from class-name prompts.

Towers (`LitModel`): the image embedding is the locked backbone's pooled pre-logits, optionally through a
trainable linear head (`image_head: linear`; default `none`, the LiT paper's locked setting and big_vision's
lit config: `out_dim = (None, D)`). The text tower is open_clip's TextTransformer built from an open_clip
text config (width, layers, heads, context length from the spec) with its projection to the image
embedding's width; open_clip's bundled BPE tokenizer. Loss: open_clip's `ClipLoss` with a learnable
temperature t (logits = exp(t) · cos, t initialised to log(temperature_init) = log 10 as big_vision's LiT,
exp(t) clamped at 100 as CLIP), or open_clip's `SigLipLoss` (`loss: siglip`, bias initialised to -10).

Because the image tower is locked, the image embeddings of every pair are computed once and cached by
content (engine.features); training reads them from the cache and never runs the image tower. The text
tower of a (backbone, pairs, training settings, seed) is cached too, so every zero-shot dataset's cell of
that seed evaluates the same tower.

Zero-shot (`zero_shot_classifier`, the same weights as open_clip's `build_zero_shot_classifier`): class
names cleaned (lower case, '_' -> ' ', the first comma-separated name), each through every template, the
prompts' normalised text embeddings averaged per class and normalised again; prediction = argmax cosine
with the normalised image embedding. Retrieval on the held-out tail of the pairs: image -> text and
text -> image recall@1/5, a hit being any item whose caption text equals the query's.

Modules: towers (image and text towers, tokenizer, losses), pairs (the image-text pairs and their cached
features), training (the text tower and its cache),
zeroshot and retrieval (the two evaluators, as big_vision's proj/image_text splits them), adapter (the cell).
Every setting, with its default and source, is `settings.lit.LitSettings`.
"""

from ...settings.lit import LitSettings
from .adapter import LitAdapter, LitDataset, open_zero_shot
from .pairs import pairs_identity, pairs_reader
from .retrieval import retrieval_recall
from .towers import (
    IMAGE_HEADS,
    LOGIT_SCALE_MAX,
    LOSSES,
    LitModel,
    LockedImageTower,
    contrastive_loss,
    parameter_groups,
    text_config,
    tokenizer,
    trimmable,
)
from .training import TRAIN_KEYS, home_dir, text_tower, tower_key
from .zeroshot import (
    class_names_for,
    clean_class_name,
    templates_for,
    topk_accuracy,
    zero_shot_classifier,
)

__all__ = [
    "IMAGE_HEADS",
    "LOGIT_SCALE_MAX",
    "LOSSES",
    "LitAdapter",
    "LitDataset",
    "LitModel",
    "LitSettings",
    "LockedImageTower",
    "TRAIN_KEYS",
    "class_names_for",
    "clean_class_name",
    "contrastive_loss",
    "home_dir",
    "open_zero_shot",
    "pairs_identity",
    "pairs_reader",
    "parameter_groups",
    "retrieval_recall",
    "templates_for",
    "text_config",
    "text_tower",
    "tokenizer",
    "topk_accuracy",
    "tower_key",
    "trimmable",
    "zero_shot_classifier",
]
