"""The catalogue of benchmarks.gate_power: each variant a deliberate fault (a one-line edit of the code or of a task
default, as a slip would make it) or a benign change (the arithmetic only, or a pure refactor), and one real code
fault per task for the judgment across arithmetic (`ACROSS`)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Variant:
    name: str
    area: str
    kind: str  # fault | benign | clean
    what: str
    edits: list = field(default_factory=list)  # (path relative to the repository, old, new): old occurs once
    env: dict = field(default_factory=dict)
    args: tuple = ()
    relabel: dict = field(default_factory=dict)  # hparam -> value written back into the records before gating
    accept_code: tuple = ()  # an intended change: gated once as it is (it must fail) and once accepting these
    home_from: str = ""  # a variant whose home (every cache it computed, in its arithmetic) this one starts from
    splice: str = ""  # a variant of which one record, of a cell whose precision differs, replaces the clean one's
    arithmetic: bool = False  # benign and another arithmetic only


CATALOGUE = [
    Variant("clean", "-", "clean", "the committed code: the baseline every variant is gated against"),
    # --- faults ---
    Variant(
        "attn_prenorm",
        "model forward",
        "fault",
        "the attention branch reads the block's input without its LayerNorm",
        [
            (
                "transferbench/backbones/vit.py",
                "x = x + self.drop_path1(self.attn(self.norm1(x)))",
                "x = x + self.drop_path1(self.attn(x))",
            )
        ],
    ),
    Variant(
        "dpn_no_pre_ln",
        "stem",
        "fault",
        "DPN's first LayerNorm (on the patch pixels) skipped",
        [
            (
                "transferbench/backbones/stems.py",
                "x = self.proj(self.norm_pre(self.patchify(x)))",
                "x = self.proj(self.patchify(x))",
            )
        ],
    ),
    Variant(
        "dtn_lambda_swap",
        "DTN",
        "fault",
        "DTN's variance mixed with the mean's lambda (a copy-paste slip)",
        [
            (
                "transferbench/backbones/dtn.py",
                "rstd = torch.addcmul(ln_var, var_in, (1 - lam_sig).view(heads)).rsqrt_()",
                "rstd = torch.addcmul(ln_var, var_in, (1 - lam_mu).view(heads)).rsqrt_()",
            )
        ],
    ),
    Variant(
        "posemb_offset",
        "position embeddings",
        "fault",
        "patch tokens take the position embeddings one slot early (the cls token's goes to the first patch)",
        [
            (
                "transferbench/backbones/vit.py",
                "x = self.patch_embed(x) + self.pos_embed[:, self.num_prefix_tokens :]",
                "x = self.patch_embed(x) + self.pos_embed[:, : self.pos_embed.shape[1] - self.num_prefix_tokens]",
            )
        ],
    ),
    Variant(
        "pixels_255",
        "pixel normalisation",
        "fault",
        "uint8 pixels divided by 256 instead of 255",
        [
            (
                "transferbench/data/pixels.py",
                "return x.float().mul_(1.0 / 255.0).sub_(mean).div_(std)",
                "return x.float().mul_(1.0 / 256.0).sub_(mean).div_(std)",
            )
        ],
    ),
    Variant(
        "resize_nearest",
        "transforms",
        "fault",
        "the evaluation resize (resize 18 then crop) uses nearest-neighbour sampling",
        [
            (
                "transferbench/data/transforms.py",
                "size = [v2.Resize((resize_square, resize_square)), v2.CenterCrop(resolution)]",
                "size = [v2.Resize((resize_square, resize_square), interpolation=v2.InterpolationMode.NEAREST), "
                "v2.CenterCrop(resolution)]",
            )
        ],
    ),
    Variant(
        "labels_modulo",
        "labels",
        "fault",
        "a folder's labels taken modulo the largest label instead of the class count (an off-by-one: the last class "
        "reads as class 0)",
        [
            (
                "transferbench/data/folder.py",
                "self.labels = np.array([int(r[1]) for r in rows], dtype=np.int64)",
                "self.labels = np.array([int(r[1]) for r in rows], dtype=np.int64)\n        "
                "self.labels = self.labels % max(1, int(self.labels.max()))",
            )
        ],
    ),
    Variant(
        "fewshot_bias",
        "few-shot solver",
        "fault",
        "the ridge probe's constant bias feature 1 instead of 100 (the bias is regularised like a weight)",
        [("transferbench/adapters/fewshot.py", "BIAS = 100.0", "BIAS = 1.0")],
    ),
    Variant(
        "cosine_no_warmup_offset",
        "training schedule",
        "fault",
        "the cosine decay counts from step 0 instead of the end of the warm-up",
        [
            (
                "transferbench/engine/train.py",
                "return 0.5 * base * (1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))",
                "return 0.5 * base * (1 + math.cos(math.pi * step / max(1, total)))",
            )
        ],
    ),
    Variant(
        "head_bias",
        "heads",
        "fault",
        "every new head's bias starts at +1 more than asked (zero-init heads at 1)",
        [
            (
                "transferbench/backbones/vit.py",
                "nn.init.constant_(self.head.bias, float(bias))",
                "nn.init.constant_(self.head.bias, float(bias) + 1.0)",
            )
        ],
    ),
    Variant(
        "ckpt_stem_layout",
        "checkpoint conversion",
        "fault",
        "timm's flat stem-weight reshape applied to every 2-D stem weight, not only timm-flat files (a dropped "
        "condition): the patch pixels reach the embedding in a scrambled order",
        [
            (
                "transferbench/backbones/checkpoint.py",
                'if ckpt.metadata.get("patch_embed_layout") == "timm_flat" and w is not None and w.ndim == 2:',
                "if w is not None and w.ndim == 2:",
            )
        ],
    ),
    Variant(
        "fewshot_seed",
        "seed handling",
        "fault",
        "every seed draws the same few-shot subset (the seed is not passed on)",
        [("transferbench/adapters/fewshot.py", "rng = np.random.default_rng(seed)", "rng = np.random.default_rng(0)")],
    ),
    Variant(
        "fewshot_l2_default",
        "a task default",
        "fault",
        "few-shot's l2 default edited from 2^10 to 2^9 in its settings (no protocol bump)",
        [("transferbench/settings/fewshot.py", "DEFAULT_L2 = 2.0**10", "DEFAULT_L2 = 2.0**9")],
    ),
    Variant(
        "pretrain_wd",
        "pretraining",
        "fault",
        "AdamW's decoupled weight decay computed as wd x lr instead of wd / lr",
        [
            (
                "transferbench/engine/augreg.py",
                "return float(wd) / float(lr) if wd else 0.0",
                "return float(wd) * float(lr) if wd else 0.0",
            )
        ],
    ),
    Variant(
        "mixup_off",
        "pretraining",
        "fault",
        "mixup's targets left one-hot (the images are still mixed)",
        [
            (
                "transferbench/engine/augreg.py",
                "        yield mixup(x, target, p, rng)",
                "        xm, _ = mixup(x, target, p, rng)\n        yield xm, target",
            )
        ],
    ),
    # --- benign ---
    Variant(
        "aten_default",
        "arithmetic",
        "benign",
        "scalar ATen CPU kernels (ATEN_CPU_CAPABILITY=default): other vector widths, other rounding",
        env={"ATEN_CPU_CAPABILITY": "default"},
        arithmetic=True,
    ),
    Variant(
        "aten_avx2",
        "arithmetic",
        "benign",
        "AVX2 ATen CPU kernels (ATEN_CPU_CAPABILITY=avx2) on an AVX-512 machine: where they change bits",
        env={"ATEN_CPU_CAPABILITY": "avx2"},
        arithmetic=True,
    ),
    Variant(
        "two_threads",
        "arithmetic",
        "benign",
        "2 torch threads per cell instead of 1 (another reduction order)",
        args=("--cpus-per-cell", "2"),
        arithmetic=True,
    ),
    Variant(
        "fp32_where_bf16",
        "arithmetic",
        "benign",
        "fp32 where this machine's bf16 probe picks bf16, as on a CPU without bf16 units (--set bf16=off, "
        "the records' setting written back to auto before gating)",
        args=("--set", "bf16=off"),
        relabel={"bf16": "auto"},
        arithmetic=True,
    ),
    Variant(
        "bf16_flip_one",
        "arithmetic",
        "benign",
        "one cell where the probe picked bf16 computed in fp32 instead (its record from fp32_where_bf16), every "
        "other cell as the clean run's",
        splice="fp32_where_bf16",
        relabel={"bf16": "auto"},
    ),
    Variant(
        "restored_home",
        "arithmetic",
        "benign",
        "a home restored from another machine: every cache (features, probe choices) as aten_default's run "
        "computed it, then the committed code",
        home_from="aten_default",
    ),
    Variant(
        "fewshot_scores_f64",
        "few-shot solver",
        "intended",
        "an intended change that moves bits: the ridge probe scores float32 features in float64 (passes only with "
        "--accept-code adapters.fewshot)",
        [
            (
                "transferbench/adapters/fewshot.py",
                "dtype = np.float32 if x.dtype == np.float32 else np.float64",
                "dtype = np.float64",
            )
        ],
        accept_code=("adapters.fewshot",),
    ),
    Variant(
        "refactor_mlp",
        "refactor",
        "benign",
        "the MLP's forward rewritten in steps (the same operations): every cache is computed again",
        [
            (
                "transferbench/backbones/vit.py",
                "        return self.drop(self.fc2(self.drop(self.act(self.fc1(x)))))",
                "        hidden = self.drop(self.act(self.fc1(x)))\n        return self.drop(self.fc2(hidden))",
            )
        ],
    ),
    Variant(
        "refactor_inexact",
        "refactor",
        "benign",
        "attention's scale moved onto the queries before the product (the same function, other rounding): a "
        "refactor that is not bit-exact",
        [
            (
                "transferbench/backbones/vit.py",
                "x = F.scaled_dot_product_attention(q, k, v, dropout_p=self.attn_drop if self.training else 0.0)",
                "x = F.scaled_dot_product_attention(\n                q * self.scale, k, v, "
                "dropout_p=self.attn_drop if self.training else 0.0, scale=1.0\n            )",
            )
        ],
    ),
]


# One real code fault per task, judged across arithmetic (`--across`): each a one-line edit of the anchor's own code,
# run on this machine (the first seed of each cell: a night's cells pair by seed) and judged against the committed
# anchor, computed on another CPU, by the statistical tier alone
ACROSS = [
    (
        "fewshot",
        "the ridge probe's bias feature 1 instead of 100",
        "transferbench/adapters/fewshot.py",
        "BIAS = 100.0",
        "BIAS = 1.0",
    ),
    (
        "vtab",
        "every new head's bias starts 1 higher than asked",
        "transferbench/backbones/vit.py",
        "nn.init.constant_(self.head.bias, float(bias))",
        "nn.init.constant_(self.head.bias, float(bias) + 1.0)",
    ),
    (
        "hires",
        "the big_vision position-embedding resample with align_corners=False",
        "transferbench/backbones/checkpoint.py",
        'grid = torch.nn.functional.interpolate(grid, size=tuple(new_grid), mode="bilinear", align_corners=True)',
        'grid = torch.nn.functional.interpolate(grid, size=tuple(new_grid), mode="bilinear", align_corners=False)',
    ),
    (
        "ade20k",
        "the pixel loss averaged over every pixel, ignored ones included",
        "transferbench/adapters/seg/adapter.py",
        "    return F.cross_entropy(logits, target, ignore_index=IGNORE_INDEX)",
        '    return F.cross_entropy(logits, target, ignore_index=IGNORE_INDEX, reduction="sum") / target.numel()',
    ),
    (
        "diagnose",
        "attention distances in patches, not pixels",
        "transferbench/backbones/measures.py",
        "    pos = torch.stack([ys.flatten(), xs.flatten()], dim=-1).double() * patch",
        "    pos = torch.stack([ys.flatten(), xs.flatten()], dim=-1).double()",
    ),
    (
        "imagenet_c",
        "every corruption one severity higher (capped at 5)",
        "transferbench/data/corruptions.py",
        "    return np.asarray(apply(image, severity=severity, corruption_name=corruption, **extra), dtype=np.uint8)",
        "    return np.asarray(apply(image, severity=min(5, severity + 1), corruption_name=corruption, **extra), "
        "dtype=np.uint8)",
    ),
    (
        "lit",
        "zero-shot image embeddings left unnormalised",
        "transferbench/adapters/lit/zeroshot.py",
        "logits = model.encode_image(torch.from_numpy(x).to(device), normalize=True)",
        "logits = model.encode_image(torch.from_numpy(x).to(device), normalize=False)",
    ),
    (
        "pretrain",
        "mixup left one-hot (the mixed images keep their own targets)",
        "transferbench/engine/augreg.py",
        "        yield mixup(x, target, p, rng)",
        "        xm, _ = mixup(x, target, p, rng)\n        yield xm, target",
    ),
]
