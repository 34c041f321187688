import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from transferbench import cell as cells
from transferbench.adapters import prepare_task, pretrain, resolve_backbone
from transferbench.backbones import create_backbone
from transferbench.engine.losses import cross_entropy, sigmoid_cross_entropy
from transferbench.engine.train import cosine_lr
from transferbench.hashing import file_sha256
from transferbench.paths.entries import write_digest
from transferbench.paths.portable import expand
from transferbench.records.store import load_records

SHORT = ("steps=3", "batch=8", "warmup_steps=1")


def test_warmup_then_cosine_by_hand():
    lr = lambda s: cosine_lr(s, base=1e-3, warmup=10, total=110)  # noqa: E731
    assert lr(0) == pytest.approx(1e-4) and lr(9) == pytest.approx(1e-3)
    assert lr(10) == pytest.approx(1e-3) and lr(60) == pytest.approx(5e-4) and lr(110) == pytest.approx(0.0)


def test_sigmoid_cross_entropy_by_hand():
    logits = torch.zeros(2, 4)
    # every class at p = 1/2: each of the 4 binary terms costs ln 2, summed over classes
    assert float(sigmoid_cross_entropy(logits, torch.tensor([0, 3]))) == pytest.approx(4 * math.log(2))
    assert float(cross_entropy(logits, torch.tensor([0, 3]))) == pytest.approx(math.log(4))


def test_name_at_embedded_pretrains_once_and_is_reused(suite_home, monkeypatch):
    monkeypatch.setattr(pretrain, "PRETRAIN_SETS", SHORT)
    ref = resolve_backbone("mu8@embedded")
    mu8 = lambda: [r for r in load_records([suite_home / "pretrain"]) if r["backbone"] == "mu8"]  # noqa: E731
    recs = mu8()  # (other tests may pretrain other backbones in the shared home)
    assert len(recs) == 1 and recs[0]["status"] == "ok" and recs[0]["backbone"] == "mu8"
    assert (
        ref.checkpoint == str(expand(recs[0]["info"]["checkpoint"]))
        and ref.sha256 == recs[0]["info"]["checkpoint_sha256"]
    )
    assert 0 <= recs[0]["metrics"]["test"]["accuracy"] <= 100
    # the training signals the regression gate compares; the curve's fixed points stay in the info: 3 steps keep
    # steps 1, 2 and 3, and the last is the loss the training loop ends on
    train, info = recs[0]["metrics"]["train"], recs[0]["info"]
    assert sorted(train) == ["decayed_norm", "loss_heldout", "target_entropy"]
    assert sorted(info["loss_at"]) == ["1", "2", "3"] and info["loss_at"]["3"] == info["final_loss"]
    # the embedded profile has no mixup: its targets are one-hot, of entropy 0
    assert train["target_entropy"] == 0.0 and train["decayed_norm"] > 0 and train["loss_heldout"] > 0
    assert pretrain.loss_points(100) == (25, 50, 75, 100) and pretrain.loss_points(3) == (1, 2, 3)
    assert recs[0]["data_version"] == "upstream-v6"  # the generator's version joins the cell key
    again = resolve_backbone("mu8@embedded")  # the record exists: no second pretraining
    assert again == ref and [r["run_id"] for r in mu8()] == [recs[0]["run_id"]]
    m = create_backbone("mu8", checkpoint=ref.checkpoint, num_classes=10)
    assert m.head.weight.abs().sum() == 0  # the 96-class upstream head is not carried over
    with open(ref.checkpoint, "r+b") as f:  # a changed checkpoint is caught, not silently used:
        f.seek(-3, 2)
        f.write(b"xyz")
    again = resolve_backbone("mu8@embedded")  # set aside with its record, and pretrained again
    (rec,) = mu8()
    assert rec["run_id"] != recs[0]["run_id"] and again.sha256 == rec["info"]["checkpoint_sha256"]
    assert file_sha256(again.checkpoint) == again.sha256
    aside = list((Path(ref.checkpoint).parent / ".quarantine").glob(Path(ref.checkpoint).name + ".*"))
    assert len(aside) == 1 and file_sha256(aside[0]) != ref.sha256


def test_default_suite_reads_tfds_imagenet_through_data_source(tmp_path, monkeypatch):
    import tensorflow_datasets as tfds

    from transferbench.adapters import prepare_task
    from transferbench.engine.runner import RunOptions, run_task

    monkeypatch.setenv("TRANSFERBENCH_HOME", str(tmp_path))
    # App. C's recipe on a size its table lacks: medium2 (RandAugment(2, 15) + mixup 0.5) and rep_size by hand
    task = prepare_task(
        "pretrain",
        sets=[
            "steps=2",
            "batch=4",
            "warmup_steps=1",
            "resolution=32",
            "aug=medium2",
            "rep_size=on",
            "eval_resize_small=36",
        ],
    )
    assert [d.name for d in task.datasets] == ["imagenet2012"] and task.hparams["loss"] == "sigmoid"
    with tfds.testing.mock_data(num_examples=200):
        s = run_task(task, [resolve_backbone("mu8")], tmp_path / "runs", RunOptions(show_progress=False))
    assert (s.ok, s.failed) == (1, 0), s.failures
    (rec,) = load_records([tmp_path / "runs"])
    info = rec["info"]
    assert (info["aug"], info["randaug"], info["mixup"], info["rep_size"]) == ("medium2", [2, 15], 0.5, 128)
    assert info["adamw_weight_decay"] == pytest.approx(0.1)  # wd 1e-4 / lr 1e-3
    for split in ("test", "minival"):  # validation and train[99%:] (mock data: 200 images each)
        acc = rec["metrics"][split]["accuracy"]
        assert acc * 2 == pytest.approx(round(acc * 2))  # a count of correct images out of 200
    m = create_backbone("mu8", checkpoint=expand(info["checkpoint"]), num_classes=1000)
    assert m.config["rep_size"] == 128 and m.head.weight.abs().sum() > 0
    assert float(m.head.bias.detach().mean()) < -6.0  # init_head_bias -6.9, two small steps later


def test_shipped_checkpoint_is_used_only_when_its_cell_key_matches(suite_home, tmp_path, monkeypatch):
    from transferbench.adapters import get_adapter
    from transferbench.backbones import save_checkpoint
    from transferbench.engine.runner import Results
    from transferbench.records.store import RecordStore

    monkeypatch.setattr(pretrain, "PRETRAIN_SETS", ("steps=5", "batch=8", "warmup_steps=1"))
    monkeypatch.setattr(pretrain, "SHIPPED", tmp_path)
    task = prepare_task("pretrain", suite="embedded", sets=pretrain.PRETRAIN_SETS)
    bare = cells.BackboneRef("mu8_dpn", "mu8_dpn", None, cells.RANDOM_INIT)
    (cell,) = [
        c for c in get_adapter("pretrain").plan(task, bare, Results(RecordStore(tmp_path / "r"))) if c.stage == "final"
    ]
    shipped = save_checkpoint(create_backbone("mu8_dpn"), tmp_path / f"mu8_dpn-upstream-{cell.key}.safetensors")
    write_digest(shipped)  # a shipped checkpoint's size and sha256 ship beside it
    done = suite_home / "pretrain"  # where NAME@embedded pretrains (none yet in a fresh worker's home)
    pretrained = lambda: [r for r in load_records([done]) if r["backbone"] == "mu8_dpn"] if done.is_dir() else []  # noqa: E731
    ref = resolve_backbone("mu8_dpn@embedded")
    assert ref.checkpoint == str(shipped) and pretrained() == []  # used as is: nothing pretrained
    monkeypatch.setattr(pretrain, "PRETRAIN_SETS", ("steps=4", "batch=8", "warmup_steps=1"))  # another profile
    other = resolve_backbone("mu8_dpn@embedded")  # pretrains: the shipped file belongs to another cell
    assert other.checkpoint != str(shipped) and other.sha256 != ref.sha256 and len(pretrained()) == 1


def test_pretrain_command_trains_and_names_its_checkpoint(suite_home, capsys):
    """`transferbench pretrain` (the documented way to make the shipped checkpoints) trains the cell the command
    names and writes its checkpoint under the cell's name, {backbone}-{dataset}-{cell key}-{code}.safetensors in
    $TRANSFERBENCH_HOME/checkpoints, as the record in the folder the command names says."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    from transferbench.cli import main

    sets = [a for s in SHORT for a in ("--set", s)]
    assert main(["pretrain", "--backbone", "mu8", *sets, "--set", "lr=0.002", "--no-progress"]) == 0
    out = capsys.readouterr()
    assert "pretrain: 1 ok, 0 diverged, 0 failed" in out.out + out.err
    assert f"1 backbones -> {suite_home / 'pretrain'}" in out.err  # where the command says its records go
    (rec,) = [
        r
        for r in load_records([suite_home / "pretrain"])
        if r["backbone"] == "mu8" and r["hparams"]["lr"] == 0.002 and r["hparams"]["steps"] == 3
    ]
    assert rec["status"] == "ok" and rec["dataset"] == "upstream" and rec["seed"] == 0
    # the checkpoint is named by the cell that made it, and is the file the record vouches for
    name = rec["info"]["checkpoint"]
    assert re.fullmatch(
        rf"\$TRANSFERBENCH_HOME/checkpoints/mu8-upstream-{rec['key']}-[0-9a-f]{{16}}\.safetensors", name
    )
    path = Path(expand(name))
    assert path.parent == suite_home / "checkpoints" and file_sha256(path) == rec["info"]["checkpoint_sha256"]
    with safe_open(str(path), framework="pt") as f:
        header = f.metadata()
    assert {k: header[k] for k in ("name", "task", "dataset", "cell_key", "steps", "num_classes")} == {
        "name": "mu8",
        "task": "pretrain",
        "dataset": "upstream",
        "cell_key": rec["key"],
        "steps": "3",
        "num_classes": "144",  # the upstream set's classes (docs/data.md)
    }
    # it trained. The new head starts at zero weights and one bias for every class, so the first step's loss is
    # that of the uniform prediction, ln 144, and no gradient reaches the backbone through the zero head at that
    # step; the next two (lr 0.002 and 0.001 by the warm-up and cosine schedule: cosine_lr) move every tensor of
    # the backbone away from the seed's init, by about the lr per step under AdamW: between 0.0005 and 2 x their
    # sum, 0.006
    assert rec["info"]["loss_at"]["1"] == pytest.approx(math.log(144), abs=1e-4)
    assert [cosine_lr(s, base=0.002, warmup=1, total=3) for s in range(3)] == pytest.approx([0.002, 0.002, 0.001])
    weights = load_file(path)
    assert float(weights["head.weight"].abs().max()) > 0 and float(weights["head.bias"].std()) > 0  # trained head
    torch.manual_seed(rec["seed"])  # the cell's init: the adapter seeds torch with the cell's seed, then builds it
    init = create_backbone("mu8", img_size=16, rep_size=rec["info"]["rep_size"]).state_dict()
    moved = {k: float((weights[k] - v).abs().max()) for k, v in init.items() if not k.startswith("head")}
    assert len(moved) > 50 and all(0.0005 < m < 0.006 for m in moved.values()), moved


def test_the_probe_signals_by_hand():
    """The pretraining probe's signals: the targets' entropy (mixup's soft targets against one-hot ones), the norm
    of the weights weight decay acts on (kernels, not biases or LayerNorm), and the loss on a held-out set."""
    from transferbench.engine import augreg
    from transferbench.engine.evaluate import Evaluation, heldout_loss

    soft = torch.tensor([[0.7, 0.3, 0.0], [0.0, 0.3, 0.7]])
    watch = augreg.TargetEntropy()
    batches = [(torch.zeros(2, 1), soft), (torch.zeros(2, 1), torch.tensor([0, 2]))]
    assert [y for _, y in watch.watch(iter(batches))][0] is soft  # passed on as they are
    h = -(0.7 * math.log(0.7) + 0.3 * math.log(0.3))
    assert watch.value() == pytest.approx(2 * h / 4)  # two soft examples of entropy h, two one-hot of 0
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.LayerNorm(2), torch.nn.Linear(2, 3))
    with torch.no_grad():
        model[0].weight.fill_(1.0)  # 4 entries of 1
        model[2].weight.fill_(2.0)  # 6 entries of 2
        model[0].bias.fill_(5.0)  # biases and the LayerNorm are not decayed
    assert augreg.decayed_norm(model) == pytest.approx(math.sqrt(4 * 1 + 6 * 4))

    class Points(torch.utils.data.Dataset):
        def __len__(self):
            return 3

        def __getitem__(self, i):
            return torch.full((2,), float(i)), i % 3

    lin = torch.nn.Linear(2, 3)
    with torch.no_grad():
        lin.weight.zero_()
        lin.bias.copy_(torch.tensor([0.0, 1.0, 2.0]))  # the same logits for every example
    expected = float(np.mean([-float(torch.log_softmax(lin.bias.detach(), 0)[c]) for c in range(3)]))
    how = Evaluation("cpu", False, batch=2)
    assert heldout_loss(lin, Points(), lambda x: x, how, cross_entropy) == pytest.approx(expected)
