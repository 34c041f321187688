"""LiT zero-shot (DPN §6.2; Zhai et al. 2022; PROTOCOLS.md "LiT zero-shot"): the backbone, locked, is the
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
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import time
from typing import Literal, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..data.sources import DatasetEntry
from ..engine.train import BF16_SETTINGS
from . import Adapter, plan_select_then_final

LIT_VERSION = "1"  # bump when text-tower training changes (part of the tower cache key)
IMAGE_HEADS = ("none", "linear")
LOSSES = ("clip", "siglip")
LOGIT_SCALE_MAX = 100.0  # CLIP's clamp on exp(t)


# --- prompts ---------------------------------------------------------------------------------------

def clean_class_name(name: str) -> str:
    """PROTOCOLS.md's cleanup: lower case, '_' -> ' ', keep the first comma-separated name."""
    return name.split(",")[0].replace("_", " ").strip().lower()


def templates_for(spec) -> list:
    """Prompt makers (class name -> prompt). `imagenet`: '{}' followed by open_clip's 80 CLIP ImageNet
    templates; a list: format strings with one '{}'."""
    if spec == "imagenet":
        from open_clip import OPENAI_IMAGENET_TEMPLATES
        return ["{}".format, *OPENAI_IMAGENET_TEMPLATES]
    if isinstance(spec, str) or any(not isinstance(t, str) or t.count("{}") != 1 for t in spec):
        raise ValueError(f"templates: 'imagenet' or a list of strings with one '{{}}' each, got {spec!r}")
    return [t.format for t in spec]


def class_names_for(spec, data=None) -> list[str]:
    """`imagenet`: open_clip's ImageNet class names (CLIP's curated ones); `tfds` / `info`: the dataset's own
    label names; a list: as given. Every name cleaned (`clean_class_name`)."""
    if spec == "imagenet":
        from open_clip import IMAGENET_CLASSNAMES
        names = list(IMAGENET_CLASSNAMES)
    elif isinstance(spec, str):
        names = list(getattr(data, "class_names", None) or (getattr(data, "info", {}) or {}).get("class_names") or [])
        if not names:
            raise ValueError(f"class_names: {spec!r}, but the dataset has no label names; list them in the spec")
    else:
        names = list(spec)
    return [clean_class_name(n) for n in names]


# --- towers ----------------------------------------------------------------------------------------

def text_config(hp: dict) -> dict:
    """The open_clip text config (CLIPTextCfg fields) of a cell's hyper-parameters."""
    return {"context_length": int(hp["context_length"]), "vocab_size": int(hp.get("vocab_size", 49408)),
            "width": int(hp["text_width"]), "heads": int(hp["text_heads"]), "layers": int(hp["text_layers"])}


class LitModel(nn.Module):
    """The trainable side of LiT: open_clip's text tower projected to the image embedding's width, an
    optional linear head on the locked image embeddings, the temperature (and SigLIP's bias)."""

    def __init__(self, embed_dim: int, text_cfg: dict, *, image_head: str = "none", loss: str = "clip",
                 temperature_init: float = 10.0, bias_init: float = -10.0):
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
    return (getattr(tower, "attn_mask", None) is not None and not getattr(tower, "use_pad_mask", False)
            and getattr(tower, "cls_emb", None) is None and getattr(tower, "pool_type", "") in ("argmax", "eos"))


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
        return lambda text, image: siglip(model.encode_image(image, normalize=True), text, model.scale(),
                                          model.logit_bias)
    clip = ClipLoss()
    return lambda text, image: clip(model.encode_image(image, normalize=True), text, model.scale())


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """open_clip's rule: no weight decay on gains, biases, norms and the temperature (tensors under 2-D)."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (no_decay if p.ndim < 2 or "logit_" in name else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


# --- zero-shot and retrieval -----------------------------------------------------------------------

@torch.inference_mode()
def zero_shot_classifier(model, tok, classnames: Sequence[str], templates: Sequence, *, batch: int = 256,
                         device: str = "cpu", progress=None) -> torch.Tensor:
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
    for start in (progress(starts, desc="zero-shot prompts") if progress else starts):
        idx = order[start:start + batch]
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


def retrieval_recall(image: torch.Tensor, text: torch.Tensor, captions: Sequence[str], ks=(1, 5)) -> dict:
    """Recall@k both ways on normalised embeddings of paired rows. A retrieved item is right when its
    caption text equals the query's (COCO's several-captions rule, for captions that repeat)."""
    _, group = np.unique(np.asarray(captions), return_inverse=True)
    group = torch.as_tensor(group)
    sim = image @ text.T
    out = {}
    for k in ks:
        k_ = min(k, len(group))
        i2t = group[sim.topk(k_, dim=1).indices] == group[:, None]
        t2i = group[sim.T.topk(k_, dim=1).indices] == group[:, None]
        out[f"i2t_r{k}"] = float(i2t.any(1).float().mean())
        out[f"t2i_r{k}"] = float(t2i.any(1).float().mean())
    return out


# --- the adapter -----------------------------------------------------------------------------------

class LitDataset(DatasetEntry):
    """A zero-shot dataset (tfds or embedded: its `test` split, class names and templates) or, with
    `retrieval`, the held-out tail of the task's image-text pairs, scored one way (i2t or t2i). Nothing is
    trained on a zero-shot dataset: it has no `train` split."""
    source: Literal["tfds", "embedded", "pairs"] = "tfds"  # type: ignore[assignment]
    train: None = None  # type: ignore[assignment]
    test: str | None = None  # type: ignore[assignment]
    class_names: Literal["imagenet", "tfds", "info"] | list[str] = "tfds"
    templates: Literal["imagenet"] | list[str] = "imagenet"
    retrieval: Literal["i2t", "t2i"] | None = None


def home_dir():
    from ..data.embedded import home
    return home() / "lit"


def pairs_reader(hp: dict):
    """The task's image-text pairs: `embedded` (the embedded captions set) or a path (data.image_text)."""
    from ..data.image_text import embedded_pairs, open_pairs
    from ..errors import UserError
    if not hp.get("pairs"):
        raise UserError("LiT needs image-text pairs to train the text tower: --set pairs=PATH with webdataset shards "
                        "('DIR/{00000..01242}.tar' or a folder of .tar of KEY.jpg + KEY.txt) or a .csv/.tsv with "
                        f"columns {hp.get('csv_img_key', 'filepath')},{hp.get('csv_caption_key', 'title')} "
                        "(open_clip's formats); or try `--suite embedded`, which needs no download")
    if hp["pairs"] == "embedded":
        return embedded_pairs()
    return open_pairs(hp["pairs"], img_key=hp.get("csv_img_key", "filepath"),
                      caption_key=hp.get("csv_caption_key", "title"), sep=hp.get("csv_separator", "\t"))


def pairs_identity(hp: dict) -> dict:
    """The pairs' identity in the feature cache, without opening them (a cache hit reads no pair)."""
    from ..data import embedded
    from ..data.image_text import pairs_identity as files_identity
    return {"embedded": embedded.version("captions")} if hp["pairs"] == "embedded" else files_identity(hp["pairs"])


def open_zero_shot(ds: dict, data_dir=None):
    from ..data.sources import open_split
    return open_split(ds, ds["test"], data_dir)


class LitAdapter(Adapter):
    name = "lit"
    dataset_schema = LitDataset
    hparam_choices = {"bf16": BF16_SETTINGS, "image_head": IMAGE_HEADS, "loss": LOSSES,
                      "pool": ("model", "tok", "gap")}

    def validate(self, spec, source="<spec>"):
        super().validate(spec, source)
        from .spec import SpecError
        for i, d in enumerate(spec.datasets):
            ds = LitDataset.model_validate(d.model_dump())
            if ds.retrieval is None and (ds.source == "pairs" or not ds.test):
                raise SpecError(f"{source}: datasets.{i}: a zero-shot dataset needs source tfds or embedded and a "
                                f"test split; the pairs' held-out tail takes `retrieval: i2t|t2i` (dataset {ds.name!r})")
            if ds.source == "embedded" and ds.retrieval is None and ds.class_names == "tfds":
                raise SpecError(f"{source}: datasets.{i}.class_names: an embedded set has no tfds label names; list "
                                f"them (dataset {ds.name!r})")
            if ds.source == "tfds" and ds.retrieval is None and not ds.tfds:
                raise SpecError(f"{source}: datasets.{i}.tfds: a tfds dataset needs its tfds name (dataset {ds.name!r})")
            if not isinstance(ds.templates, str):
                try:
                    templates_for(ds.templates)
                except ValueError as e:
                    raise SpecError(f"{source}: datasets.{i}.templates: {e} (dataset {ds.name!r})") from None

    def check_data(self, task, ctx) -> None:
        """Before any cell: the pairs open (CSV header, shards present) and every zero-shot split opens."""
        from ..data.folder import DataMissingError
        from ..data.tfds_source import data_dir
        from ..errors import UserError
        if ctx.micro_batch:
            raise UserError("--micro-batch splits a batch, which changes a contrastive loss (every other pair in the "
                            "batch is a negative); LiT trains on whole batches: lower --set batch=N instead")
        for hp in task.grid():
            pairs_reader(hp)
        missing = []
        for spec in task.datasets:
            ds = LitDataset.model_validate(spec.model_dump()).model_dump()
            if ds["retrieval"]:
                continue
            try:
                open_zero_shot(ds, ctx.data_dir)
            except DataMissingError:
                missing.append(ds["name"])
        if missing:
            raise UserError(f"zero-shot data missing for {', '.join(missing)}: searched {data_dir(ctx.data_dir)} "
                            "(from --data-dir, else $TFDS_DATA_DIR, else ~/tensorflow_datasets); prepare them with "
                            "tfds (pip install 'transferbench[tfds]'; tfds.builder(NAME).download_and_prepare()), "
                            "or try `--suite embedded`, which needs no download")

    def plan(self, task, backbone, results):
        return plan_select_then_final(task, backbone, results)  # cells: (dataset, seed); nothing selected

    def run(self, cell, ctx):
        from ..backbones import create_backbone
        from ..data.transforms import eval_transform
        from ..engine.features import cache_key, cached, extract, extract_pairs, precision

        hp = cell.hparams
        ds = LitDataset.model_validate({**cell.dataset_config, "name": cell.dataset}).model_dump()
        name, pool = cell.backbone.partition("@")[0], hp.get("pool", "model")
        tower = None

        def image_tower():
            nonlocal tower
            if tower is None:
                torch.manual_seed(0)  # a random-init tower's features are cached under 'random-init': one fixed draw
                tower = create_backbone(name, img_size=hp["resolution"], checkpoint=cell.checkpoint,
                                        **({} if pool == "model" else {"pool": pool}))
                tower.requires_grad_(False).eval()  # locked: features only, under inference_mode
            return tower

        # the locked image tower's forwards: bf16 where it measures faster (the text tower decides for itself)
        choice = precision(hp.get("bf16", "auto"), ctx.device, backbone=name, resolution=hp["resolution"], pool=pool,
                           build=image_tower)
        use_bf16 = choice.bf16
        def features(identity, split, transform_id, compute):
            key = cache_key(backbone=name, weights_sha256=cell.checkpoint_sha256, transform=transform_id,
                            dataset=identity, split=split, pool=pool)
            return cached(key, compute) + (key,)

        # image embeddings of every pair, once per backbone (the text tower never runs the image tower); the
        # pairs are opened only to compute them
        pair_tf = {"resolution": hp["resolution"], "resize": "square", "pixels": "[-1,1]", "bf16": use_bf16}
        px, captions, pairs_hit, pairs_key = features(
            pairs_identity(hp), "pairs", pair_tf,
            lambda: extract_pairs(image_tower(), pairs_reader(hp), eval_transform(hp["resolution"]), device=ctx.device,
                                  bf16=use_bf16, workers=ctx.workers, progress=ctx.progress,
                                  desc=f"features {name} image-text pairs"))
        heldout = int(hp["heldout"])
        if not 0 < heldout < len(captions):
            from ..errors import UserError
            raise UserError(f"heldout={heldout} leaves no training pairs or none held out of {len(captions)} pairs: "
                            f"set --set heldout=N with 0 < N < {len(captions)}")
        model, train_info = text_tower(px[:-heldout], captions[:-heldout], hp, cell.seed, pairs_key, ctx)
        model = model.to(ctx.device).eval()
        started = time.time()
        with torch.inference_mode():
            if ds["retrieval"]:
                tok = tokenizer(hp["context_length"])
                img = model.encode_image(torch.from_numpy(px[-heldout:]).to(ctx.device), normalize=True)
                txt = torch.cat([model.encode_text(tok(list(captions[-heldout:][i:i + 1024])).to(ctx.device),
                                                   normalize=True, trim=True) for i in range(0, heldout, 1024)])
                rec = retrieval_recall(img.float().cpu(), txt.float().cpu(), captions[-heldout:])
                way = ds["retrieval"]
                test = {"accuracy": 100 * rec[f"{way}_r1"], "recall@5": 100 * rec[f"{way}_r5"],
                        **{k: 100 * v for k, v in rec.items()}}
                extra = {"eval_examples": heldout}
            else:
                data = open_zero_shot(ds, ctx.data_dir)
                zs_tf = {"resolution": hp["resolution"], "resize_square": hp.get("zeroshot_resize"),
                         "pixels": "[-1,1]", "bf16": use_bf16}
                identity = {k: ds[k] for k in ("name", "source", "tfds", "set")} | {"version": cell.data_version}
                x, y, zs_hit, _ = features(identity, ds["test"], zs_tf, lambda: extract(
                    image_tower(), data, eval_transform(hp["resolution"], resize_square=hp.get("zeroshot_resize")),
                    device=ctx.device, bf16=use_bf16, workers=ctx.workers, progress=ctx.progress,
                    desc=f"features {name} {cell.dataset}"))
                names = class_names_for(ds["class_names"], data)
                if getattr(data, "num_classes", 0) and len(names) != data.num_classes:
                    from ..errors import UserError
                    raise UserError(f"dataset {cell.dataset!r} has {data.num_classes} classes but {len(names)} class "
                                    "names; give one name per label, in label order (class_names in the spec)")
                templates = templates_for(ds["templates"])
                weights = zero_shot_classifier(model, tokenizer(hp["context_length"]), names, templates,
                                               device=ctx.device, progress=ctx.progress)
                img = model.encode_image(torch.from_numpy(x).to(ctx.device), normalize=True).float().cpu()
                acc = topk_accuracy(img @ weights, y)
                test = {"accuracy": 100 * acc[1], **({"top5": 100 * acc[5]} if 5 in acc else {})}
                extra = {"eval_examples": int(len(y)), "classes": len(names), "templates": len(templates),
                         "feature_cache_hit_eval": zs_hit}
        return {"test": test,
                "info": {**train_info, **extra, "feature_cache_hit_pairs": pairs_hit,
                         "bf16": use_bf16, "bf16_choice": choice.info,
                         "pairs_train": int(len(captions) - heldout), "pairs_heldout": heldout,
                         "image_head": hp["image_head"], "loss": hp["loss"], "text_config": text_config(hp),
                         "eval_seconds": round(time.time() - started, 2)}}


def tower_key(pairs_key: str, hp: dict, seed: int) -> str:
    """The text tower's identity: the cached pair features it trains on, every hyper-parameter that shapes
    training (not the zero-shot ones) and the seed."""
    from ..reporting.aggregate import digest
    shaping = {k: hp.get(k) for k in TRAIN_KEYS}
    return digest({"v": LIT_VERSION, "pairs": pairs_key, "hp": shaping, "seed": seed})


TRAIN_KEYS = ("heldout", "image_head", "loss", "temperature_init", "text_width", "text_layers", "text_heads",
              "context_length", "batch", "steps", "lr", "weight_decay", "warmup_steps", "clip", "bf16")


def text_tower(features: np.ndarray, captions, hp: dict, seed: int, pairs_key: str, ctx):
    """The trained LitModel for these pairs, settings and seed: from the tower cache, or trained (text-tower
    init and data order from `seed`) and stored. Returns (model, info)."""
    from filelock import FileLock
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    from ..engine.train import fit, tensor_batches

    key = tower_key(pairs_key, hp, seed)
    folder = home_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{key}.safetensors"  # the weights, with the training info in the file's metadata

    def build():
        torch.manual_seed(seed)
        return LitModel(features.shape[1], text_config(hp), image_head=hp["image_head"], loss=hp["loss"],
                        temperature_init=float(hp["temperature_init"]))

    with FileLock(str(folder / f"{key}.lock")):
        if path.is_file():
            model = build()
            model.load_state_dict(load_file(str(path)))
            with safe_open(str(path), "pt") as f:
                info = json.loads(f.metadata()["info"])
            return model, {**info, "tower_cache_hit": True}
        model = build().to(ctx.device)
        tokens = tokenizer(hp["context_length"])(list(captions))
        batches = tensor_batches(tokens, torch.from_numpy(features), batch=int(hp["batch"]), steps=int(hp["steps"]),
                                 seed=seed)
        opt = torch.optim.AdamW(parameter_groups(model, float(hp["weight_decay"])), lr=float(hp["lr"]),
                                betas=(0.9, 0.999))
        started = time.time()
        out = fit(model, batches, opt, steps=int(hp["steps"]), base_lr=float(hp["lr"]), warmup=int(hp["warmup_steps"]),
                  clip=hp.get("clip") or None, loss_fn=contrastive_loss(model), device=ctx.device, bf16=hp.get("bf16", "auto"),
                  progress=ctx.progress, desc=f"text tower seed={seed}", splittable=False)
        info = {"final_loss": out["final_loss"], "steps": int(hp["steps"]), "text_bf16": out["bf16"],
                **({"text_bf16_choice": out["bf16_choice"]} if "bf16_choice" in out else {}),
                "train_seconds": round(time.time() - started, 2),
                "temperature": round(float(model.scale().detach()), 4),
                **({"logit_bias": round(float(model.logit_bias.detach()), 4)} if model.logit_bias is not None else {})}
        model = model.cpu()
        tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")  # written aside, then renamed (checkpoint.py's way)
        try:
            save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp),
                      metadata={"info": json.dumps(info)})
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        return model, {**info, "tower_cache_hit": False}
