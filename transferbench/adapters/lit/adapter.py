"""The LiT adapter: dataset entries, the image-text pairs and their cached features, the text-tower cache per
(pairs, training settings, seed), and one cell = train (or reuse) the tower, then zero-shot or retrieval."""

from __future__ import annotations

import json
import time
from typing import Literal

import numpy as np
import torch

from ...backbones import create_backbone
from ...data import embedded, pixels
from ...data.embedded import embedded_pairs
from ...data.folder import DataMissingError
from ...data.image_text import open_pairs
from ...data.image_text import pairs_identity as files_identity
from ...data.sources import DatasetEntry, missing_data, open_split, require_tfds_name
from ...data.transforms import eval_transform
from ...engine.features import cache_key, cached, extract, extract_pairs, precision
from ...engine.train import BF16_SETTINGS, fit, optimizer_options, tensor_batches
from ...errors import UserError
from ...fingerprint import TEXT, for_cache
from ...hashing import digest
from ...paths import cache, sealed, verified
from ...spec import SpecError
from ..base import Adapter, plan_select_then_final
from .towers import DECAY, IMAGE_HEADS, LOSSES, LitModel, contrastive_loss, parameter_groups, text_config, tokenizer
from .zeroshot import PROMPTS, class_names_for, retrieval_recall, templates_for, topk_accuracy, zero_shot_classifier

AUGMENT = ("none", "flip")


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
    return cache("lit")


def pairs_reader(hp: dict):
    """The task's image-text pairs: `embedded` (the embedded captions set) or a path (data.image_text)."""
    if not hp.get("pairs"):
        raise UserError(
            "LiT needs image-text pairs to train the text tower: --set pairs=PATH with webdataset shards "
            "('DIR/{00000..01242}.tar' or a folder of .tar of KEY.jpg + KEY.txt) or a .csv/.tsv with "
            f"columns {hp.get('csv_img_key', 'filepath')},{hp.get('csv_caption_key', 'title')} "
            "(open_clip's formats); or try `--suite embedded`, which needs no download"
        )
    if hp["pairs"] == "embedded":
        return embedded_pairs()
    return open_pairs(
        hp["pairs"],
        img_key=hp.get("csv_img_key", "filepath"),
        caption_key=hp.get("csv_caption_key", "title"),
        sep=hp.get("csv_separator", "\t"),
    )


def pairs_identity(hp: dict) -> dict:
    """The pairs' identity in the feature cache, without opening them (a cache hit reads no pair)."""
    return {"embedded": embedded.version("captions")} if hp["pairs"] == "embedded" else files_identity(hp["pairs"])


def open_zero_shot(ds: dict, data_dir=None):
    return open_split(ds, ds["test"], data_dir)


class LitAdapter(Adapter):
    name = "lit"
    libraries = TEXT
    dataset_schema = LitDataset
    hparam_choices = {
        "bf16": BF16_SETTINGS,
        "image_head": IMAGE_HEADS,
        "loss": LOSSES,
        "pool": ("model", "tok", "gap"),
        "decay": DECAY,
        "prompts": PROMPTS,
        "augment": AUGMENT,
    }

    def training_images(self, cell) -> int:
        """The image tower is locked: only the text tower trains, on cached features."""
        return 0

    def validate(self, spec, source="<spec>"):
        super().validate(spec, source)
        for i, d in enumerate(spec.datasets):
            ds = LitDataset.model_validate(d.model_dump())
            if ds.retrieval is None and (ds.source == "pairs" or not ds.test):
                raise SpecError(
                    f"{source}: datasets.{i}: a zero-shot dataset needs source tfds or embedded and a "
                    f"test split; the pairs' held-out tail takes `retrieval: i2t|t2i` (dataset {ds.name!r})"
                )
            if ds.source == "embedded" and ds.retrieval is None and ds.class_names == "tfds":
                raise SpecError(
                    f"{source}: datasets.{i}.class_names: an embedded set has no tfds label names; list "
                    f"them (dataset {ds.name!r})"
                )
            if ds.retrieval is None:
                require_tfds_name(source, i, ds.model_dump())
            if not isinstance(ds.templates, str):
                try:
                    templates_for(ds.templates)
                except ValueError as e:
                    raise SpecError(f"{source}: datasets.{i}.templates: {e} (dataset {ds.name!r})") from None

    def check_data(self, task, ctx) -> None:
        """Before any cell: the pairs open (CSV header, shards present) and every zero-shot split opens."""
        if ctx.micro_batch:
            raise UserError(
                "--micro-batch splits a batch, which changes a contrastive loss (every other pair in the "
                "batch is a negative); LiT trains on whole batches: lower --set batch=N instead"
            )
        for hp in task.grid():
            pairs_reader(hp)
        missing, zero_shot = [], 0
        for spec in task.datasets:
            ds = LitDataset.model_validate(spec.model_dump()).model_dump()
            if ds["retrieval"]:
                continue
            zero_shot += 1
            try:
                open_zero_shot(ds, ctx.data_dir)
            except DataMissingError:
                missing.append(ds["name"])
        if missing:
            raise missing_data("zero-shot", missing, zero_shot, ctx.data_dir)

    def plan(self, task, backbone, results):
        return plan_select_then_final(task, backbone, results)  # cells: (dataset, seed); nothing selected

    def run(self, cell, ctx):

        hp = cell.hparams
        ds = LitDataset.model_validate({**cell.dataset_config, "name": cell.dataset}).model_dump()
        name, pool = cell.backbone.partition("@")[0], hp.get("pool", "model")
        tower = None

        def image_tower():
            nonlocal tower
            if tower is None:
                torch.manual_seed(0)  # a random-init tower's features are cached under 'random-init': one fixed draw
                tower = create_backbone(
                    name,
                    img_size=hp["resolution"],
                    checkpoint=cell.checkpoint,
                    **({} if pool == "model" else {"pool": pool}),
                )
                tower.requires_grad_(False).eval()  # locked: features only, under inference_mode
            return tower

        # the locked image tower's forwards: bf16 where it measures faster (the text tower decides for itself)
        choice = precision(
            hp.get("bf16", "auto"), ctx.device, backbone=name, resolution=hp["resolution"], pool=pool, build=image_tower
        )
        use_bf16 = choice.bf16

        def features(identity, split, transform_id, compute):
            key = cache_key(
                backbone=name,
                weights_sha256=cell.checkpoint_sha256,
                transform=transform_id,
                dataset=identity,
                split=split,
                pool=pool,
            )
            return cached(key, compute) + (key,)

        # image embeddings of every pair, once per backbone (the text tower never runs the image tower); the
        # pairs are opened only to compute them
        pair_tf = {"resolution": hp["resolution"], "resize": "square", "pixels": pixels.of(hp), "bf16": use_bf16}
        px, captions, pairs_hit, pairs_key = features(
            pairs_identity(hp),
            "pairs",
            pair_tf,
            lambda: extract_pairs(
                image_tower(),
                pairs_reader(hp),
                eval_transform(hp["resolution"], pixels=pixels.of(hp)),
                device=ctx.device,
                bf16=use_bf16,
                workers=ctx.workers,
                progress=ctx.progress,
                desc=f"features {name} image-text pairs",
            ),
        )
        views = [px]
        if hp.get("augment", "none") == "flip":  # the mirrored view of every pair, cached beside the original
            flipped, _, flip_hit, _ = features(
                pairs_identity(hp),
                "pairs",
                {**pair_tf, "flip": True},
                lambda: extract_pairs(
                    image_tower(),
                    pairs_reader(hp),
                    eval_transform(hp["resolution"], pixels=pixels.of(hp), flip=True),
                    device=ctx.device,
                    bf16=use_bf16,
                    workers=ctx.workers,
                    progress=ctx.progress,
                    desc=f"features {name} image-text pairs, flipped",
                ),
            )
            views.append(flipped)
            pairs_hit = pairs_hit and flip_hit
        heldout = int(hp["heldout"])
        if not 0 < heldout < len(captions):
            raise UserError(
                f"heldout={heldout} leaves no training pairs or none held out of {len(captions)} pairs: "
                f"set --set heldout=N with 0 < N < {len(captions)}"
            )
        model, train_info = text_tower(
            [v[:-heldout] for v in views], captions[:-heldout], hp, cell.seed, pairs_key, ctx
        )
        model = model.to(ctx.device).eval()
        started = time.time()
        with torch.inference_mode():
            samples = {}  # per-example zero-shot hits (--log-samples); retrieval keeps none
            if ds["retrieval"]:
                tok = tokenizer(hp["context_length"])
                img = model.encode_image(torch.from_numpy(px[-heldout:]).to(ctx.device), normalize=True)
                txt = torch.cat(
                    [
                        model.encode_text(
                            tok(list(captions[-heldout:][i : i + 1024])).to(ctx.device), normalize=True, trim=True
                        )
                        for i in range(0, heldout, 1024)
                    ]
                )
                rec = retrieval_recall(img.float().cpu(), txt.float().cpu(), captions[-heldout:])
                way = ds["retrieval"]
                test = {
                    "accuracy": 100 * rec[f"{way}_r1"],
                    "recall@5": 100 * rec[f"{way}_r5"],
                    **{k: 100 * v for k, v in rec.items()},
                }
                extra = {"eval_examples": heldout}
            else:
                data = open_zero_shot(ds, ctx.data_dir)
                zs_tf = {
                    "resolution": hp["resolution"],
                    "resize_square": hp.get("zeroshot_resize"),
                    "pixels": pixels.of(hp),
                    "bf16": use_bf16,
                }
                identity = {k: ds[k] for k in ("name", "source", "tfds", "set")} | {"version": cell.data_version}
                x, y, zs_hit, _ = features(
                    identity,
                    ds["test"],
                    zs_tf,
                    lambda: extract(
                        image_tower(),
                        data,
                        eval_transform(hp["resolution"], resize_square=hp.get("zeroshot_resize"), pixels=pixels.of(hp)),
                        device=ctx.device,
                        bf16=use_bf16,
                        workers=ctx.workers,
                        progress=ctx.progress,
                        desc=f"features {name} {cell.dataset}",
                    ),
                )
                prompts = hp.get("prompts", "open_clip")
                names = class_names_for(ds["class_names"], data, prompts)
                if getattr(data, "num_classes", 0) and len(names) != data.num_classes:
                    raise UserError(
                        f"dataset {cell.dataset!r} has {data.num_classes} classes but {len(names)} class "
                        "names; give one name per label, in label order (class_names in the spec)"
                    )
                templates = templates_for(ds["templates"], prompts)
                weights = zero_shot_classifier(
                    model, tokenizer(hp["context_length"]), names, templates, device=ctx.device, progress=ctx.progress
                )
                img = model.encode_image(torch.from_numpy(x).to(ctx.device), normalize=True).float().cpu()
                logits = img @ weights
                acc = topk_accuracy(logits, y)
                test = {"accuracy": 100 * acc[1], **({"top5": 100 * acc[5]} if 5 in acc else {})}
                samples = {"test": (logits.argmax(1) == torch.as_tensor(np.asarray(y))).numpy()}
                extra = {
                    "eval_examples": int(len(y)),
                    "classes": len(names),
                    "templates": len(templates),
                    "feature_cache_hit_eval": zs_hit,
                }
        return {
            "test": test,
            "samples": samples,
            "info": {
                **train_info,
                **extra,
                "feature_cache_hit_pairs": pairs_hit,
                "bf16": use_bf16,
                "bf16_choice": choice.info,
                "pairs_train": int(len(captions) - heldout),
                "pairs_heldout": heldout,
                "image_head": hp["image_head"],
                "loss": hp["loss"],
                "text_config": text_config(hp),
                "pair_views": len(views),
                "eval_seconds": round(time.time() - started, 2),
            },
        }


def tower_key(pairs_key: str, hp: dict, seed: int) -> str:
    """The text tower's identity: the cached pair features it trains on (their key holds the image tower's code),
    every hyper-parameter that shapes training (not the zero-shot ones), the seed, and the fingerprint of the code
    and libraries that train it (the tower, its loss, the training loop, open_clip's tokenizer)."""
    shaping = {k: hp.get(k) for k in TRAIN_KEYS}
    return digest({"code": for_cache("lit").digest, "pairs": pairs_key, "hp": shaping, "seed": seed})


TRAIN_KEYS = (
    "heldout",
    "image_head",
    "loss",
    "temperature_init",
    "text_width",
    "text_layers",
    "text_heads",
    "context_length",
    "batch",
    "steps",
    "lr",
    "weight_decay",
    "decay",
    "augment",
    "warmup_steps",
    "clip",
    "bf16",
)


def view_batches(tokens: torch.Tensor, views: list[torch.Tensor], *, batch: int, steps: int, seed: int):
    """`tensor_batches` of (tokens, image features) where each example's features come from one of `views`
    (the original and, with `augment: flip`, the mirrored image), drawn uniformly per example and step from
    a generator seeded by `seed`: big_vision's `flip_lr` (p = 0.5) on cached features."""
    if len(views) == 1:
        yield from tensor_batches(tokens, views[0], batch=batch, steps=steps, seed=seed)
        return
    rng = torch.Generator().manual_seed(int(seed) + 7919)
    stacked = torch.stack(views, 1)  # (N, V, D)
    for t, f in tensor_batches(tokens, stacked, batch=batch, steps=steps, seed=seed):
        pick = torch.randint(len(views), (len(t),), generator=rng)
        yield t, f[torch.arange(len(t)), pick]


def text_tower(features: list, captions, hp: dict, seed: int, pairs_key: str, ctx):
    """The trained LitModel for these pairs, settings and seed: from the tower cache, or trained (text-tower
    init and data order from `seed`) and stored. `features`: one (N, D) array of image features per view of
    the same images (`view_batches`). Returns (model, info)."""
    views = [torch.from_numpy(np.asarray(v)) for v in features]
    from filelock import FileLock
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    key = tower_key(pairs_key, hp, seed)
    folder = home_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{key}.safetensors"  # the weights, with the training info in the file's metadata

    def build():
        torch.manual_seed(seed)
        return LitModel(
            views[0].shape[1],
            text_config(hp),
            image_head=hp["image_head"],
            loss=hp["loss"],
            temperature_init=float(hp["temperature_init"]),
        )

    with FileLock(str(folder / f"{key}.lock")):
        if verified(path, "LiT text tower cache entry"):
            model = build()
            model.load_state_dict(load_file(str(path)))
            with safe_open(str(path), "pt") as f:
                info = json.loads(f.metadata()["info"])
            return model, {**info, "tower_cache_hit": True}
        model = build().to(ctx.device)
        tokens = tokenizer(hp["context_length"])(list(captions))
        batches = view_batches(tokens, views, batch=int(hp["batch"]), steps=int(hp["steps"]), seed=seed)
        groups = parameter_groups(
            model, float(hp["weight_decay"]), lr=float(hp["lr"]), decay=hp.get("decay", "open_clip")
        )
        opt = torch.optim.AdamW(groups, lr=float(hp["lr"]), betas=(0.9, 0.999), **optimizer_options(ctx.device))
        started = time.time()
        out = fit(
            model,
            batches,
            opt,
            steps=int(hp["steps"]),
            base_lr=float(hp["lr"]),
            warmup=int(hp["warmup_steps"]),
            clip=hp.get("clip") or None,
            loss_fn=contrastive_loss(model),
            device=ctx.device,
            bf16=hp.get("bf16", "auto"),
            progress=ctx.progress,
            compile=ctx.compile,
            desc=f"text tower seed={seed}",
            splittable=False,
        )
        info = {
            "final_loss": out["final_loss"],
            "steps": int(hp["steps"]),
            "text_bf16": out["bf16"],
            "adamw_weight_decay": groups[0]["weight_decay"],
            "decayed_tensors": len(groups[0]["params"]),
            **({"text_bf16_choice": out["bf16_choice"]} if "bf16_choice" in out else {}),
            "train_seconds": round(time.time() - started, 2),
            "temperature": round(float(model.scale().detach()), 4),
            **({"logit_bias": round(float(model.logit_bias.detach()), 4)} if model.logit_bias is not None else {}),
        }
        model = model.cpu()
        with sealed(path) as tmp:
            save_file(
                {k: v.contiguous() for k, v in model.state_dict().items()},
                str(tmp),
                metadata={"info": json.dumps(info)},
            )
        return model, {**info, "tower_cache_hit": False}
