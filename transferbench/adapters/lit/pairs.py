"""LiT's image-text pairs: where they come from, their identity in the feature cache, and the locked image
tower's features of every pair (with the mirrored view of `augment: flip`), computed once and cached."""

from __future__ import annotations

from ...data import embedded
from ...data.embedded import embedded_pairs
from ...data.image_text import open_pairs
from ...data.image_text import pairs_identity as files_identity
from ...data.transforms import eval_transform
from ...errors import UserError
from ...settings.lit import LitSettings


def pairs_reader(s: LitSettings):
    """The task's image-text pairs: `embedded` (the embedded captions set) or a path (data.image_text)."""
    if not s.pairs:
        raise UserError(
            "LiT needs image-text pairs to train the text tower: --set pairs=PATH with webdataset shards "
            "('DIR/{00000..01242}.tar' or a folder of .tar of KEY.jpg + KEY.txt) or a .csv/.tsv with "
            f"columns {s.csv_img_key},{s.csv_caption_key} "
            "(open_clip's formats); or try `--suite embedded`, which needs no download"
        )
    if s.pairs == "embedded":
        return embedded_pairs()
    return open_pairs(s.pairs, img_key=s.csv_img_key, caption_key=s.csv_caption_key, sep=s.csv_separator)


def pairs_identity(s: LitSettings) -> dict:
    """The pairs' identity in the feature cache, without opening them (a cache hit reads no pair)."""
    return {"embedded": embedded.version("captions")} if s.pairs == "embedded" else files_identity(s.pairs)


def pair_views(frozen, s: LitSettings) -> tuple[list, object, bool, str]:
    """(views, captions, hit, key): the image features of every pair, one array per view (the image and, with
    `augment: flip`, its mirror), from the locked tower through the feature cache; `key` (the unflipped view's)
    names the pairs' features in the text tower's identity."""
    views, hits, key, captions = [], [], "", None
    for flip in (False, True) if s.augment == "flip" else (False,):
        mirrored = {"flip": True} if flip else {}  # in the pipeline and in its cache description alike
        x, captions, hit, k = frozen.pairs(
            lambda: pairs_reader(s),
            pairs_identity(s),
            eval_transform(s.resolution, pixels=s.pixels, **mirrored),
            frozen.transform(resize="square", **mirrored),
            f"features {frozen.name} image-text pairs" + (", flipped" if flip else ""),
        )
        views.append(x)
        hits.append(hit)
        key = key or k
    return views, captions, all(hits), key
