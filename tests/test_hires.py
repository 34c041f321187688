"""High-res fine-tune: the protocol's numbers, resolutions from the checkpoint, the two stages and the gain table."""

import numpy as np
import pytest
import torch

from transferbench.backbones import create_backbone
from transferbench.backbones.checkpoint import save_checkpoint


def test_the_spec_holds_the_protocols_numbers_and_every_vtab_dataset():
    from transferbench.spec import load_task

    spec = load_task("hires")
    hp = spec.hparams
    # DPN App. D, its printed big_vision config
    assert (hp["optimizer"], hp["lr"], hp["momentum"], hp["weight_decay"], hp["clip"]) == ("sgd", 0.03, 0.9, 0.0, 1.0)
    assert (hp["batch"], hp["steps"], hp["warmup_steps"]) == (512, 5000, 500)
    assert (hp["resolution"], hp["eval_resize_small"], hp["augment"]) == (384, 418, "inception_flip")
    names = [d.name for d in spec.datasets]
    vtab = [d.name for d in load_task("vtab").datasets]
    assert names[0] == "imagenet2012" and names[1:] == vtab
    assert load_task("highres").task == "hires"


def test_eval_resize_keeps_the_protocols_crop_fraction():
    from transferbench.adapters.hires import eval_resize_small

    hp = {"resolution": 384, "eval_resize_small": 418}
    assert eval_resize_small(hp, 384) == 418
    assert eval_resize_small(hp, 224) == 244  # 224 * 418 / 384 = 243.8


def test_base_resolution_is_the_checkpoints_own(tmp_path):
    from transferbench.adapters import resolve_backbone
    from transferbench.adapters.hires import base_resolution
    from transferbench.errors import UserError

    path = save_checkpoint(create_backbone("mu4_dtn", img_size=24), tmp_path / "m.safetensors")
    assert base_resolution({"base_resolution": "checkpoint"}, resolve_backbone(f"mu4_dtn@{path}")) == 24
    assert base_resolution({"base_resolution": 20}, resolve_backbone(f"mu4_dtn@{path}")) == 20
    with pytest.raises(UserError, match="base_resolution=N"):
        base_resolution({"base_resolution": "checkpoint"}, resolve_backbone("mu4"))


def _task(*sets, datasets=("mini_mnist",)):
    from transferbench.adapters import prepare_task

    return prepare_task(
        "hires",
        suite="embedded",
        datasets=list(datasets),
        seeds=[0, 1],
        sets=["steps=3", "warmup_steps=1", "batch=16", *sets],
    )


@pytest.mark.slow
def test_two_stages_at_both_resolutions_and_the_gain_table(suite_home, tmp_path):
    from transferbench.adapters import resolve_backbone
    from transferbench.engine.runner import RunOptions, run_task
    from transferbench.records.store import load_records
    from transferbench.reporting.kinds import report_tables

    torch.manual_seed(0)
    paths = {
        n: save_checkpoint(create_backbone(n, img_size=16), tmp_path / f"{n}.safetensors") for n in ("mu4", "mu4_dtn")
    }
    backbones = [resolve_backbone(f"{n}@{p}") for n, p in paths.items()]
    out = tmp_path / "runs"
    summary = run_task(_task(), backbones, out, RunOptions(show_progress=False))
    assert summary.ok == 2 * 2 * 2 and summary.failed == 0  # backbones x seeds x (base, high)
    recs = load_records([out])
    for r in recs:
        assert (r["hparams"]["base_resolution"], r["hparams"]["resolution"]) == (16, 32)  # both in the record
        info = r["info"]
        assert (
            info["trained_resolution"] == (16 if r["stage"] == "base" else 32) and info["checkpoint_resolution"] == 16
        )
        assert info["eval_resize_small"] == (18 if r["stage"] == "base" else 35)
    acc = {(r["backbone"].split("@")[0], r["stage"], r["seed"]): r["metrics"]["test"]["accuracy"] for r in recs}
    ref = f"mu4@{paths['mu4']}"
    (t,) = report_tables(recs, reference=ref)
    assert t.columns == ["mini_mnist base", "mini_mnist high", "mini_mnist gain"]
    assert "base 16 px → high 32 px" in t.setting
    gains = {b: [acc[(b, "high", s)] - acc[(b, "base", s)] for s in (0, 1)] for b in ("mu4", "mu4_dtn")}
    dtn = t.rows[f"mu4_dtn@{paths['mu4_dtn']}"]
    assert dtn["mini_mnist gain"].estimate.mean == pytest.approx(np.mean(gains["mu4_dtn"]))
    assert dtn["mini_mnist gain"].delta.mean == pytest.approx(np.mean(gains["mu4_dtn"]) - np.mean(gains["mu4"]))
    assert dtn["mini_mnist high"].estimate.mean == pytest.approx(np.mean([acc[("mu4_dtn", "high", s)] for s in (0, 1)]))
    assert run_task(_task(), backbones, out, RunOptions(show_progress=False)).skipped == 8


def test_a_checkpoint_head_with_the_classes_is_kept_unless_head_new(suite_home, tmp_path):
    from transferbench.adapters import resolve_backbone
    from transferbench.cell import make_cell
    from transferbench.engine.compute import CellContext

    model = create_backbone("mu4", img_size=16, num_classes=10)
    torch.nn.init.normal_(model.head.weight)
    ref = resolve_backbone(f"mu4@{save_checkpoint(model, tmp_path / 'h.safetensors')}")
    for head, kept in (("auto", "checkpoint"), ("new", "new")):
        task = _task(f"head={head}", "steps=1")
        hp = {**task.grid()[0], "base_resolution": 16}
        cell = make_cell(task, task.datasets[0], ref, hp, 0, "base")
        result = task.adapter.run(cell, CellContext("cpu", show_progress=False))
        assert result["info"]["head"] == kept


def test_a_base_resolution_not_below_the_high_one_is_refused(tmp_path):
    from transferbench.adapters import resolve_backbone
    from transferbench.errors import UserError

    path = save_checkpoint(create_backbone("mu4", img_size=32), tmp_path / "m.safetensors")
    task = _task()
    with pytest.raises(UserError, match="not below resolution 32"):
        task.adapter.plan(task, resolve_backbone(f"mu4@{path}"), None)


def test_missing_data_and_a_bad_borrowed_task_are_one_line(tmp_path):
    from transferbench.adapters import prepare_task
    from transferbench.engine.compute import CellContext
    from transferbench.errors import UserError
    from transferbench.spec import SpecError, load_spec_file

    task = prepare_task("hires", datasets=["imagenet2012"])
    with pytest.raises(UserError, match=r"high-res data missing for 1 of 1 datasets \(imagenet2012\)"):
        task.adapter.check_data(task, CellContext("cpu", data_dir=str(tmp_path)))
    spec = tmp_path / "s.yaml"
    spec.write_text(
        "task: s\nadapter: hires\nprotocol_version: '1'\nmetric: accuracy\ndatasets: []\ndatasets_from: [vtabb]\n"
    )
    with pytest.raises(SpecError, match="no installed task 'vtabb'.*vtab"):
        load_spec_file(spec)
