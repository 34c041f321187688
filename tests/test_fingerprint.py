"""A number is never reused across a change of the code or libraries that compute it: every cache entry's key and
every record hold the fingerprint of what computed them (transferbench.fingerprint), and a prose, layout or
reporting change moves none."""

import ast
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import kit
import pytest

from transferbench import fingerprint as F
from transferbench.cell import RANDOM_INIT, BackboneRef
from transferbench.paths.home import CACHES

REPO = Path(__file__).resolve().parent.parent


def _module(folder: Path, name: str, text: str) -> Path:
    p = folder / f"{name}.py"
    p.write_text(text)
    return p


@pytest.fixture
def lone_module(tmp_path, monkeypatch):
    """A lone module `fpmod` (as a `py:` backbone's) beside its helper `fphelp`, importable."""
    monkeypatch.syspath_prepend(str(tmp_path))
    _module(tmp_path, "fphelp", "SCALE = 2.0\n")
    _module(
        tmp_path,
        "fpmod",
        '"""A model."""\nimport numpy as np\nfrom fphelp import SCALE\n\n\ndef f(x):\n    return x * SCALE\n',
    )
    for m in ("fpmod", "fphelp"):
        sys.modules.pop(m, None)
    return tmp_path


def test_every_cache_kind_has_a_fingerprint():
    assert set(F.CACHE_CODE) == set(CACHES), "a cache folder without an entry in fingerprint.CACHE_CODE"
    for kind, path in F.CACHE_CODE.items():
        assert path.libraries and path.what, kind
        for root in path.roots:  # each root is a module file (a typo would hash nothing)
            assert F._locate(root, None) is not None, (kind, root)
        assert f"{F.NAME}.fingerprint" in F.for_cache(kind).modules or kind == "embedded"


def test_prose_and_layout_move_no_fingerprint_and_code_does(lone_module):
    base = F.of(["fpmod"]).digest
    assert set(F.of(["fpmod"]).modules) == {"fpmod", "fphelp"}  # the module beside it in its folder counts
    src = (lone_module / "fpmod.py").read_text()
    same = [
        src.replace('"""A model."""', '"""A model, described at length."""'),  # a docstring
        src.replace("def f(x):", "def f(x):  # scale it"),  # a comment
        src.replace("return x * SCALE", "return (\n        x * SCALE\n    )"),  # layout
        src + "\n\n",
    ]
    for text in same:
        (lone_module / "fpmod.py").write_text(text)
        assert F.of(["fpmod"]).digest == base, text
    (lone_module / "fpmod.py").write_text(src.replace("x * SCALE", "x * SCALE + 1"))
    assert F.of(["fpmod"]).digest != base
    (lone_module / "fpmod.py").write_text(src)
    assert F.of(["fpmod"]).digest == base
    (lone_module / "fphelp.py").write_text("SCALE = 3.0\n")  # what it imports from its own folder
    assert F.differences(F.Fingerprint({"fpmod": "x"}).record(), F.of(["fpmod"]).record()) == [
        "fphelp added",
        "fpmod changed",
        "python absent -> " + ".".join(map(str, sys.version_info[:2])),
    ]


def test_library_versions_are_part_of_it(monkeypatch):
    before = F.for_cache("features", "transferbench.backbones.registry")
    real = F.library_versions
    monkeypatch.setattr(F, "library_versions", lambda names: {**real(names), "torch": "0.0.1"})
    after = F.for_cache("features", "transferbench.backbones.registry")
    assert after.modules == before.modules and after.digest != before.digest
    torch_version = before.libraries["torch"]
    assert f"torch {torch_version} -> 0.0.1" in F.differences(before.record(), after.record())


def test_a_copy_of_the_package_elsewhere_has_the_same_fingerprints(tmp_path):
    """No absolute path and no file time enters a fingerprint: a copy (a clone, a wheel) agrees."""
    shutil.copytree(REPO / "transferbench", tmp_path / "transferbench", ignore=shutil.ignore_patterns("weights"))
    code = "import json; from transferbench import fingerprint as F; " + (
        "print(json.dumps({k: F.for_cache(k, 'transferbench.backbones.registry').digest for k in F.CACHE_CODE}))"
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True, check=True
    )
    here = {k: F.for_cache(k, "transferbench.backbones.registry").digest for k in F.CACHE_CODE}
    assert json.loads(out.stdout) == here


def _compute_modules() -> set[str]:
    from transferbench.engine.compute import cell_code
    from transferbench.plugins import load_group

    mods = set()
    for kind in F.CACHE_CODE:
        mods |= set(F.for_cache(kind, "transferbench.backbones.registry").modules)
    for adapter in load_group("transferbench.adapters").values():
        mods |= set(cell_code(adapter(), "mu4").modules)
    return {m for m in mods if m.startswith("transferbench.")}


def test_reporting_the_command_line_and_tracking_are_on_no_computation_path():
    mods = _compute_modules()
    assert {"transferbench.adapters.fewshot", "transferbench.backbones.vit", "transferbench.engine.train"} <= mods
    outside = ("transferbench.reporting", "transferbench.cli", "transferbench.tracking")
    assert not [m for m in mods if m.startswith(outside)]
    # nor does it import from reporting: report-kind names live in transferbench.cell
    taken = []
    for m in sorted(mods):
        tree = ast.parse(F._locate(m, None).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and "reporting" in (node.module or "").split("."):
                taken += [f"{m}: {a.name}" for a in node.names]
    assert not taken, taken


def _cell(task_name: str, backbone: str = "mu4"):
    from transferbench.adapters import prepare_task
    from transferbench.engine.runner import Results
    from transferbench.records.store import RecordStore

    task = prepare_task(task_name, suite="embedded")
    ref = BackboneRef(backbone, backbone, None, RANDOM_INIT)
    return task.adapter.plan(task, ref, Results(RecordStore("/nonexistent")))[0]


def test_every_cache_key_changes_with_the_code_that_computes_it(monkeypatch, suite_home):
    """For each cache folder, its key (or entry name) before and after the fingerprint of its code changes."""
    from transferbench.adapters import corruption, lit, pretrain
    from transferbench.data import corruptions
    from transferbench.data.embedded import common
    from transferbench.data.transforms import eval_transform
    from transferbench.engine import estimate, features, precision, resident

    keys = {
        "embedded": lambda: common.generator_code("digits"),
        "features": lambda: features.cache_key(
            backbone="mu4", weights_sha256="a" * 64, transform={}, dataset={"name": "d"}, split="train"
        ),
        "bf16-probe": lambda: precision.probe_key("cpu: x", {"batch": 4}),
        "checkpoints": lambda: pretrain.checkpoint_path(_cell("pretrain")).name,
        "pretrain": lambda: cell_digest(_cell("pretrain")),
        "corruptions": lambda: corruptions.entry_name(corruptions.cache_key(data="x")),
        "classifiers": lambda: corruption.classifier_key(_cell("imagenet_c")),
        "lit": lambda: lit.tower_key("pairs", lit.LitSettings(), 0),
        "cost-probe": lambda: estimate._key("cpu", "mu4", 16),
        "decoded": lambda: resident.decoded_key({"name": "d"}, eval_transform(16)),
    }
    assert set(keys) == set(CACHES), "a new cache folder needs a line here"
    before = {k: f() for k, f in keys.items()}
    real = F.library_versions
    monkeypatch.setattr(F, "library_versions", lambda names: {**real(names), "numpy": "0.0.1"})
    after = {k: f() for k, f in keys.items()}
    assert [k for k in keys if before[k] == after[k]] == []


def cell_digest(cell) -> str:
    """What a pretraining record (the `pretrain` cache) holds of its code: its cell's fingerprint."""
    from transferbench.adapters.pretrain import PretrainAdapter
    from transferbench.engine.compute import cell_code

    return cell_code(PretrainAdapter(), cell.backbone).digest


def test_a_py_backbone_fingerprint_holds_its_module(lone_module):
    from transferbench.backbones.registry import backbone_code

    _module(lone_module, "fpnet", "import timm\nfrom fphelp import SCALE\n\n\ndef make(**kw):\n    return None\n")
    sys.modules.pop("fpnet", None)
    roots = backbone_code("py:fpnet:make@w.safetensors")
    assert roots == ("transferbench.backbones.py_family", "fpnet")
    mods = F.of(roots).modules
    assert {"fpnet", "fphelp", "transferbench.backbones.py_family", "transferbench.backbones.timm_family"} <= set(mods)
    assert "timm" not in mods  # an installed library counts by its version, not its files
    assert backbone_code("timm:vit_tiny_patch16_224") == ("transferbench.backbones.timm_family",)
    assert backbone_code("mu4_dpn@embedded") == ("transferbench.backbones.registry",)


def test_code_summary_names_fingerprints_and_what_mixes():
    from transferbench.reporting.provenance import code_line, code_summary

    a = {"digest": "a" * 16, "modules": {"m.vit": "1", "m.task": "9"}, "libraries": {"torch": "2.1"}}
    b = {"digest": "b" * 16, "modules": {"m.vit": "2", "m.task": "9"}, "libraries": {"torch": "2.2"}}
    timm = {"digest": "c" * 16, "modules": {"m.timm": "5", "m.task": "9"}, "libraries": {"torch": "2.1"}}
    one = code_summary([{"fingerprint": a}] * 3)
    assert one == {"fingerprints": {"a" * 16: 3}, "unrecorded": 0, "mixed": []}
    assert code_line(one) == f"Code: fingerprint `{'a' * 16}` (3 cells)."
    # another backbone family: another fingerprint, no module in two versions: not mixed
    assert code_summary([{"fingerprint": a}, {"fingerprint": timm}])["mixed"] == []
    mixed = code_summary([{"fingerprint": a}, {"fingerprint": b}, {}])
    assert mixed["mixed"] == ["m.vit in 2 versions", "torch 2.1 and 2.2", "1 cells without a fingerprint"]
    assert code_line(mixed).startswith("**Mixed code**: these cells were computed by different code (m.vit in 2")
    assert "not recorded (2 cells" in code_line(code_summary([{}, {}]))


# --- the researcher's experiment, end to end, in a copy of the package ---------------------------------------------


def _cli(copy: Path, home: Path, *args) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(copy), os.environ.get("PYTHONPATH", "")])}
    env["TRANSFERBENCH_HOME"] = str(home)
    return subprocess.run(
        [sys.executable, "-c", "import sys; from transferbench.cli import main; sys.exit(main())", *args],
        env=env,
        cwd=copy,
        capture_output=True,
        text=True,
        timeout=600,
    )


def _accuracies(out: Path) -> dict:
    recs = [json.loads(p.read_text()) for p in sorted((out / "fewshot").rglob("*.json")) if p.name != "results.json"]
    return {(r["dataset"], r["seed"]): r["metrics"]["test"]["accuracy"] for r in recs}


@pytest.mark.slow
def test_an_edited_backbone_gives_new_numbers_from_the_same_home_and_a_reporting_edit_recomputes_nothing(
    tmp_path, suite_home
):
    copy = tmp_path / "copy"
    shutil.copytree(REPO / "transferbench", copy / "transferbench")
    homes = [tmp_path / "home", tmp_path / "fresh"]
    for h in homes:
        kit.embedded_home(suite_home, h)
    run = ["run", "fewshot", "--suite", "embedded", "--backbone", "mu4_dpn@embedded", "--datasets", "mini_dsprites_loc"]
    run += ["--seeds", "0,1", "--set", "shots=25", "--set", "bf16=off", "--no-progress", "--out"]

    a = _cli(copy, homes[0], *run, str(tmp_path / "a"))
    assert a.returncode == 0, a.stderr
    assert "features 2 computed, 2 read" in a.stderr  # train and test split by the first seed, read by the second
    first = _accuracies(tmp_path / "a")

    # a reporting change: not one feature computed again, the same numbers and fingerprint
    tables = copy / "transferbench" / "reporting" / "tables.py"
    tables.write_text(tables.read_text() + "\n\ndef unused_helper():\n    return 1\n")
    b = _cli(copy, homes[0], *run, str(tmp_path / "b"))
    assert b.returncode == 0, b.stderr
    assert "features 0 computed, 4 read" in b.stderr
    assert _accuracies(tmp_path / "b") == first
    digests = {json.loads(p.read_text())["fingerprint"]["digest"] for p in (tmp_path / "a").rglob("fewshot/*/*.json")}
    assert digests == {json.loads(p.read_text())["fingerprint"]["digest"] for p in (tmp_path / "b").rglob("*/*/*.json")}

    # a deliberate bug in the forward: position embeddings no longer added
    vit = copy / "transferbench" / "backbones" / "vit.py"
    text = vit.read_text()
    assert "x = self.patch_embed(x) + self.pos_embed[:, self.num_prefix_tokens :]" in text
    vit.write_text(text.replace(" + self.pos_embed[:, self.num_prefix_tokens :]", ""))
    c = _cli(copy, homes[0], *run, str(tmp_path / "c"))
    assert c.returncode == 0, c.stderr
    assert "features 2 computed, 2 read" in c.stderr
    broken = _accuracies(tmp_path / "c")
    assert all(abs(broken[k] - first[k]) > 1.0 for k in first), (first, broken)  # dSprites location needs them
    d = _cli(copy, homes[1], *run, str(tmp_path / "d"))  # the same code from an empty cache
    assert d.returncode == 0 and _accuracies(tmp_path / "d") == broken

    # into the folder of the old code: stop, name what differs, compute nothing
    stop = _cli(copy, homes[0], *run, str(tmp_path / "a"))
    assert stop.returncode == 2
    line = stop.stderr.strip().splitlines()[-1]
    assert re.search(
        r"fewshot: 2 of 2 finished cells in \S+ were computed by other code \(transferbench\.backbones"
        r"\.vit changed\): rerun with --stale recompute .* or with --stale keep",
        line,
    ), line
    assert _accuracies(tmp_path / "a") == first
    # keep one old cell, recompute the other: the report says the table mixes code, and names the module
    sorted((tmp_path / "a" / "fewshot" / "mini_dsprites_loc").glob("*.json"))[0].unlink()
    keep = _cli(copy, homes[0], *run, str(tmp_path / "a"), "--stale", "keep")
    assert keep.returncode == 0, keep.stderr
    assert "1 ok, 0 diverged, 0 failed, 1 skipped (already finished), 1 of other code kept" in keep.stderr
    assert (
        "**Mixed code**: these cells were computed by different code (transferbench.backbones.vit in 2 versions)"
        in (keep.stdout)
    )
    results = json.loads((tmp_path / "a" / "fewshot" / "results.json").read_text())
    assert results["results"]["header"]["code"]["fewshot"]["mixed"] == ["transferbench.backbones.vit in 2 versions"]
    from transferbench.cli import main

    assert main(["leaderboard", str(tmp_path / "a"), "-o", str(tmp_path / "LB.md")]) == 0
    board = (tmp_path / "LB.md").read_text()
    assert "**Mixed code**: these cells were computed by different code (transferbench.backbones.vit in 2" in board
    again = _cli(copy, homes[0], *run, str(tmp_path / "a"), "--stale", "recompute")
    assert again.returncode == 0, again.stderr
    assert "1 ok, 0 diverged, 0 failed, 1 skipped (already finished), 1 of other code computed again" in again.stderr
    assert _accuracies(tmp_path / "a") == broken


# --- finished cells of other code in the runner -------------------------------------------------------------------


def _toy(out, stale="stop"):
    from transferbench.adapters import prepare_task
    from transferbench.backbones.weights import resolve_backbone
    from transferbench.engine.runner import RunOptions, run_task

    task = prepare_task("toy", sets=["lr=0.01,0.1"], seeds=[0, 1])
    return run_task(task, [resolve_backbone("mu4")], out, RunOptions(show_progress=False, stale=stale))


def _age(out, lr_wins: float):
    """Make the selection records another code's (and let `lr_wins` win validation there); drop the final ones."""
    for p in sorted(out.rglob("*.json")):
        r = json.loads(p.read_text())
        if r["stage"] == "final":
            p.unlink()
            continue
        fp = r["fingerprint"]
        r["fingerprint"] = {**fp, "digest": "0" * 16, "libraries": {**fp["libraries"], "torch": "1.0"}}
        if r["hparams"]["lr"] == lr_wins:
            r["metrics"]["val"]["accuracy"] = 100.0
        p.write_text(json.dumps(r))


def test_a_selection_of_other_code_chooses_nothing_until_it_is_computed_again(tmp_path):
    from transferbench.errors import UserError
    from transferbench.records.store import load_records

    first = _toy(tmp_path / "a")
    records = load_records([tmp_path / "a"])
    assert first.ok == len(records) == 3 * (2 * 2 + 2) and first.caches == {}
    assert {r["fingerprint"]["digest"] for r in records} == {records[0]["fingerprint"]["digest"]}
    assert "transferbench.engine.runner" not in records[0]["fingerprint"]["modules"]  # the runner computes nothing
    assert {"toyplugin", "transferbench.backbones.vit"} <= set(records[0]["fingerprint"]["modules"])

    _age(tmp_path / "a", lr_wins=0.1)
    with pytest.raises(UserError, match=r"toy: 12 of 12 finished cells in \S+ were computed by other code \(torch "):
        _toy(tmp_path / "a")
    again = _toy(tmp_path / "a", stale="recompute")  # the true selection: lr 0.01, as before
    assert (again.ok, again.stale, again.skipped) == (18, 12, 0)
    assert {r["hparams"]["lr"] for r in load_records([tmp_path / "a"]) if r["stage"] == "final"} == {0.01}

    _age(tmp_path / "a", lr_wins=0.1)
    kept = _toy(tmp_path / "a", stale="keep")  # the old selection stands, and the final stage follows it
    assert (kept.ok, kept.stale, kept.skipped) == (6, 12, 12)
    assert {r["hparams"]["lr"] for r in load_records([tmp_path / "a"]) if r["stage"] == "final"} == {0.1}
