"""The grammar of a backbone reference, `NAME[@WEIGHTS]`, lives in transferbench.names alone: the weights follow the
first '@' (a path may hold more), a trailing '@' is kept visible to its readers, and no other module of the package
splits a reference by hand."""

import ast
from pathlib import Path

from transferbench.names import BackboneName, model_name, parse

ROOT = Path(__file__).resolve().parent.parent / "transferbench"


def test_a_reference_splits_at_its_first_at_sign():
    assert parse("mu4_dpn@embedded") == BackboneName("mu4_dpn", "embedded", True)
    assert parse("timm:vit_base_patch16_224.augreg_in21k@/w/run@3/b16.npz") == BackboneName(
        "timm:vit_base_patch16_224.augreg_in21k", "/w/run@3/b16.npz", True
    )
    assert parse("b32") == BackboneName("b32", "", False) and parse("b32@") == BackboneName("b32", "", True)
    assert model_name("py:my.models:make@ckpt.pt") == "py:my.models:make"


def test_no_other_module_splits_a_backbone_reference_by_hand():
    """`x.partition("@")` / `x.split("@")` appear only in names.py, and in the acceptance ledger's MODULE@HASH,
    another grammar (gate.match)."""
    hits = []
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT).as_posix()
        if rel in ("names.py", "gate/match.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("partition", "split", "rpartition", "rsplit")
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and node.args[0].value == "@"
            ):
                hits.append(f"{rel}:{node.lineno}")
    assert hits == []
