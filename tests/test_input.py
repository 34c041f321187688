"""Bad input: typed --set values, seeds, --out, unreadable checkpoints, and the order of the checks (the
ones that cost nothing before the data check, the data check before any pretraining or cell)."""

import ast
from pathlib import Path

import numpy as np
import pytest
import torch
from kit import cli

from transferbench.adapters import check_backbone, prepare_task
from transferbench.backbones import CheckpointError, check_checkpoint_file, create_backbone, save_checkpoint
from transferbench.cell import RANDOM_INIT, BackboneRef, make_cell
from transferbench.cli import main
from transferbench.errors import UserError
from transferbench.overrides import parse_override
from transferbench.records.store import load_records

# --- --set values typed by the spec ------------------------------------------------------------------


@pytest.mark.parametrize(
    "key,text,like,expected",
    [
        ("lr", "1e-3", 0.01, 0.001),  # YAML 1.1 would read '1e-3' as text
        ("l2", "1024", 1024.0, 1024.0),  # an int for a float: the same value, the same cell key
        ("steps", "100", 2500, 100),
        ("steps", "2e3", 2500, 2000),
        ("bf16", "on", "auto", "on"),  # a text setting stays text (YAML would make it True)
        ("flag", "false", True, False),
        ("l2_sweep", "64,256", [], [64, 256]),
    ],
)
def test_set_values_take_the_type_of_the_spec(key, text, like, expected):
    value = parse_override(key, text, like)
    assert value == expected and type(value) is type(expected)


@pytest.mark.parametrize(
    "key,text,like,message",
    [
        ("steps", "abc", 2500, "--set steps=abc: expected an integer (the spec has steps: 2500)"),
        ("steps", "1.5", 2500, "expected an integer"),
        ("lr", "fast", 0.01, "expected a number"),
        ("momentum", "nan", 0.9, "expected a finite number"),
        ("flag", "maybe", True, "expected true or false"),
        ("resize", "null", 256, "expected an integer"),  # null only where the spec itself has null
    ],
)
def test_bad_set_values_are_one_line(key, text, like, message):
    with pytest.raises(UserError) as e:
        parse_override(key, text, like)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_set_against_the_spec_and_the_adapters_choices():
    t = prepare_task("vtab", suite="embedded", sets=["lr=1e-2,3e-2", "steps=50"])
    assert t.sweep["lr"] == [0.01, 0.03] and t.hparams["steps"] == 50
    # an override equal to the spec's value makes the same cells as no override at all
    plain, same = prepare_task("fewshot", suite="embedded"), prepare_task("fewshot", suite="embedded", sets=["l2=1024"])
    bb = BackboneRef("mu4", "mu4", None, RANDOM_INIT)
    key = lambda task: make_cell(task, task.datasets[0], bb, task.grid()[0], 0, "final").key  # noqa: E731
    assert key(plain) == key(same)
    assert prepare_task("fewshot", sets=["resize=null"]).hparams["resize"] is None  # the embedded suite has null
    for sets, message in (
        (["bf16=maybe"], "bf16 = 'maybe' is not one of auto, on, off"),
        (["optimizer=adam"], "optimizer = 'adam' is not one of sgd"),
        (["lr=0.01,x"], "--set lr=x: expected a number"),
    ):
        with pytest.raises(UserError, match=message):
            prepare_task("vtab", sets=sets)
    with pytest.raises(UserError, match="loss = 'hinge' is not one of sigmoid, softmax"):
        prepare_task("pretrain", sets=["loss=hinge"])
    with pytest.raises(UserError, match="seeds must be non-negative integers, got -1"):
        prepare_task("toy", seeds=[-1])


# --- checkpoints are checked by their header ---------------------------------------------------------


def test_unreadable_checkpoints_are_named_with_what_they_are_not(tmp_path):
    good = save_checkpoint(create_backbone("mu4"), tmp_path / "mu4.safetensors")
    assert check_checkpoint_file(good) == good
    torch.save(create_backbone("mu4").state_dict(), tmp_path / "mu4.pth")
    np.savez(tmp_path / "mu4.npz", x=np.zeros(3))
    assert check_checkpoint_file(tmp_path / "mu4.pth") and check_checkpoint_file(tmp_path / "mu4.npz")
    for suffix, what in (
        (".safetensors", "is not a valid safetensors file"),
        (".npz", "is not a valid .npz file"),
        (".pth", "is not a PyTorch checkpoint"),
        (".ckpt", "is not a PyTorch checkpoint"),
    ):
        bad = tmp_path / f"bad{suffix}"
        bad.write_bytes(b"<html>404 Not Found</html>" * 4)
        with pytest.raises(CheckpointError) as e:
            check_checkpoint_file(bad)
        assert f"checkpoint {bad} {what}" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(UserError, match=r"backbone 'mu4@.*bad.npz': checkpoint .* is not a valid .npz file"):
        check_backbone(f"mu4@{tmp_path / 'bad.npz'}")


# --- the CLI: cheap checks first, then data, then pretraining and cells --------------------------------


@pytest.fixture
def no_data(tmp_path, monkeypatch):
    """A machine with no prepared tfds data and an empty transferbench home."""
    monkeypatch.setenv("TFDS_DATA_DIR", str(tmp_path / "tfds"))
    monkeypatch.setenv("TRANSFERBENCH_HOME", str(tmp_path / "home"))
    (tmp_path / "bad.safetensors").write_bytes(b"not safetensors at all")
    return tmp_path


@pytest.mark.parametrize(
    "args,message",
    [
        (["vtabb", "--backbone", "b32"], "unknown task 'vtabb'; did you mean vtab?"),
        (["vtab", "--backbone", "b33_dpnx"], "unknown backbone 'b33_dpnx'; did you mean b32_dpn"),
        (["vtab", "--backbone", "b32", "--set", "stps=3"], "has no hyper-parameter 'stps'; did you mean steps"),
        (["vtab", "--backbone", "b32", "--set", "steps=abc"], "--set steps=abc: expected an integer"),
        (["vtab", "--backbone", "b32", "--set", "bf16=fast"], "bf16 = 'fast' is not one of auto, on, off"),
        (["vtab", "--backbone", "b32", "--datasets", "cifar10"], "has no dataset 'cifar10'; did you mean cifar100?"),
        (["vtab", "--backbone", "b32", "--seeds", "-1"], "seeds must be non-negative integers"),
        (["vtab", "--backbone", "b32@{tmp}/nope.safetensors"], "nope.safetensors does not exist"),
        (["vtab", "--backbone", "b32@{tmp}/bad.safetensors"], "bad.safetensors is not a valid safetensors file"),
        (["vtab", "--backbone", "b32@"], "backbone 'b32@': nothing after '@'"),  # an empty $CKPT in a script
        (["vtab", "--backbone", "b32", "--reference", "b16"], "--reference 'b16' is not among --backbone b32"),
        (["vtab", "--backbone", "b32", "--out", "/proc/transferbench"], "--out /proc/transferbench: cannot write"),
        (["vtab", "--backbone", "mu8@embedded"], "VTAB data missing for 19 of 19 tasks"),  # data before pretraining
    ],
)
def test_every_cheap_mistake_is_reported_before_the_missing_data(no_data, args, message, capsys):
    out = no_data / "runs"
    argv = ["run", *[a.format(tmp=no_data) for a in args]] + ([] if "--out" in args else ["--out", str(out)])
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("transferbench: error: ") and message in err and err.count("\n") == 1
    assert not out.exists()  # no records folder, no record
    assert not (no_data / "home" / "pretrain").exists()  # nothing pretrained


def test_a_bad_set_leaves_a_records_folder_untouched(tmp_path, capsys):
    """The issue's case: `--set steps=abc` used to record every cell as failed, after which `report`
    crashed on the folder. Now it stops before any cell, and the folder still reports."""
    argv = ["run", "toy", "--suite", "quick", "--backbone", "mu4", "--out", str(tmp_path), "--no-progress"]
    assert main(argv) == 0
    before = sorted(p.name for p in tmp_path.rglob("*.json"))
    assert main(argv + ["--set", "steps=abc"]) == 2 and main(argv + ["--seeds", "-1"]) == 2
    assert sorted(p.name for p in tmp_path.rglob("*.json")) == before
    assert all(r["status"] == "ok" for r in load_records([tmp_path]))
    capsys.readouterr()
    assert cli(f"report {tmp_path}") == 0 and "| mu4" in capsys.readouterr().out


# --- the engine does not know the adapters ----------------------------------------------------------


def test_the_engine_never_imports_an_adapter():
    engine = Path(__import__("transferbench.engine").engine.__file__).parent
    for path in engine.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                module = "." * node.level + (node.module or "")
                names = [a.name for a in node.names]
                assert "adapters" not in module.split(".") and not (module == ".." and "adapters" in names), (
                    f"{path.name}:{node.lineno} imports {module} {names}"
                )
            elif isinstance(node, ast.Import):
                assert not any("adapters" in a.name for a in node.names), f"{path.name}:{node.lineno}"
