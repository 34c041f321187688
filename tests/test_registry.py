import pytest
import torch

import transferbench
from transferbench.backbones import SIZES, UnknownBackboneError, create_backbone, list_backbones, parse_name


def n_params(name, **kw):
    with torch.device("meta"):  # shapes only, no memory
        return sum(p.numel() for p in create_backbone(name, **kw).parameters())


def test_sizes_are_the_vit_papers():
    # ViT paper Table 1 (Ti from DeiT): width, depth, heads, MLP; mu is the project's CPU size.
    table = {k: (v.embed_dim, v.depth, v.num_heads, v.mlp_dim) for k, v in SIZES.items()}
    assert table == {
        "mu": (128, 6, 4, 512),
        "ti": (192, 12, 3, 768),
        "s": (384, 12, 6, 1536),
        "b": (768, 12, 12, 3072),
        "l": (1024, 24, 16, 4096),
    }


@pytest.mark.parametrize("name,paper_millions", [("ti16", 5.7), ("s16", 22.1), ("b16", 86.5)])
def test_parameter_counts_match_dtn_paper_table_1(name, paper_millions):
    n = n_params(name, num_classes=1000)
    assert abs(n / 1e6 - paper_millions) / paper_millions < 0.01


@pytest.mark.parametrize("size", ["ti16", "s16", "b16"])
def test_dtn_adds_2C_plus_5H_per_replaced_norm(size):
    cfg = parse_name(size)
    extra = n_params(f"{size}_dtn", num_classes=1000) - n_params(size, num_classes=1000)
    # each replaced LN (2C) becomes DTN (2C + 2H mix logits + 3H position weights): +5H,
    # two norms per block, in depth - 2 = 10 blocks
    assert cfg["depth"] - 2 == 10
    assert extra == 10 * 2 * 5 * cfg["num_heads"]


def test_backbone_names_parse_into_size_patch_stem_and_dtn_layers():
    assert parse_name("b32")["patch_size"] == 32 and parse_name("b32")["stem"] == ""
    c = parse_name("mu4_dpn_dtn")
    assert (c["embed_dim"], c["patch_size"], c["stem"], c["dtn_layers"], c["img_size"]) == (128, 4, "dpn", 4, 32)
    assert parse_name("l14_postpos")["patch_size"] == 14 and parse_name("l14_postpos")["stem"] == "postpos"
    assert parse_name("s16_dtn")["dtn_layers"] == 10 and parse_name("s16_dtn")["stem"] == ""
    assert parse_name("ti7")["patch_size"] == 7  # any integer patch


def test_every_size_is_listed_with_its_stems_and_dtn():
    names = list_backbones()
    for base in ["ti16", "s16", "s32", "b16", "b32", "l16", "mu4", "mu8"]:
        assert {base, f"{base}_dpn", f"{base}_dtn"} <= set(names)
    for stem in ["pre", "post", "postpos", "rms", "nolearn", "onlylearn"]:
        assert f"b32_{stem}" in names
    assert transferbench.list_backbones() == names
    for name in names:
        parse_name(name)  # every listed name is valid under the grammar


@pytest.mark.parametrize(
    "bad,suggestion", [("b32_dpm", "b32_dpn"), ("vit_b32", "b32"), ("s16_dtm", "s16_dtn"), ("b32_dtn_dtn", "b32_dtn")]
)
def test_unknown_name_is_one_line_with_close_matches(bad, suggestion):
    with pytest.raises(UnknownBackboneError) as e:
        create_backbone(bad)
    msg = str(e.value)
    assert "\n" not in msg and repr(bad) in msg and suggestion in msg


def test_patch_that_does_not_divide_the_image_names_a_fix():
    with pytest.raises(ValueError, match=r"pass img_size=230"):
        create_backbone("b23")


def test_a_registered_backbone_plugin_is_created_by_name():
    from transferbench.backbones.registry import _EXTRA, register_backbone

    @register_backbone("tiny_plugin_test")
    def make(*, img_size=None, num_classes=0, **kw):
        return create_backbone("mu8", img_size=img_size, num_classes=num_classes, **kw)

    try:
        assert "tiny_plugin_test" in list_backbones()
        assert create_backbone("tiny_plugin_test", num_classes=3).head.out_features == 3
        with pytest.raises(ValueError, match="registered twice"):
            register_backbone("tiny_plugin_test")(make)
    finally:
        _EXTRA.pop("tiny_plugin_test")
