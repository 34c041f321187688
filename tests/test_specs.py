import hashlib
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

from transferbench.adapters import get_adapter, prepare_task
from transferbench.backbones.weights import resolve_backbone
from transferbench.cell import RANDOM_INIT, Cell
from transferbench.errors import UserError
from transferbench.spec import SpecError, list_tasks, load_spec_file, parse_spec, resolve

TOY = Path(__file__).parent / "plugins" / "toytasks" / "toy.yaml"


def toy_dict():
    return yaml.safe_load(TOY.read_text())


def test_plugin_tasks_are_found_through_entry_points():
    assert {"toy", "toyshots"} <= set(list_tasks())
    assert type(get_adapter("toy")).__name__ == "ToyAdapter"


def test_resolve_default_suite_and_grid():
    t = prepare_task("toy")
    assert t.suite == "default" and [d.name for d in t.datasets] == ["alpha", "beta", "gamma"]
    assert t.seeds == (0, 1, 2) and t.select_keys() == ("lr",)
    assert [hp["lr"] for hp in t.grid()] == [0.001, 0.01, 0.1, 3.0]
    assert all(hp["steps"] == 3 for hp in t.grid())


def test_a_suite_and_overrides_choose_datasets_seeds_and_sweeps():
    t = prepare_task("toy", suite="quick")
    assert [d.name for d in t.datasets] == ["alpha"] and t.seeds == (0, 1) and t.sweep == {"lr": [0.01]}
    t = prepare_task("toy", datasets=["gamma"], seeds=[5], sets=["lr=0.02,0.2", "steps=7"])
    assert [d.name for d in t.datasets] == ["gamma"] and t.seeds == (5,)
    assert t.sweep["lr"] == [0.02, 0.2] and t.hparams["steps"] == 7
    assert prepare_task("toy", sets=["lr=0.5"]).sweep["lr"] == [0.5]


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(suite="quik"), "no suite 'quik'; did you mean quick?"),
        (dict(datasets=["alfa"]), "no dataset 'alfa'; did you mean alpha?"),
        (dict(sets=["stpes=3"]), "no hyper-parameter 'stpes'; did you mean steps?"),
        (dict(sets=["steps"]), "--set expects key=value"),
    ],
)
def test_bad_choices_are_one_line_with_close_matches(kwargs, message):
    with pytest.raises(UserError) as e:
        prepare_task("toy", **kwargs)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_an_unknown_task_is_a_user_error_with_a_close_match():
    with pytest.raises(UserError, match=r"unknown task 'toi'; did you mean toy"):
        prepare_task("toi")


@pytest.mark.parametrize(
    "edit,message",
    [
        (lambda d: d.update(mode="maximum"), "toy.yaml: mode: Input should be 'max' or 'min' (got 'maximum')"),
        (lambda d: d.update(metrc="x"), "toy.yaml: metrc: unknown field; allowed: task, adapter, description"),
        (lambda d: d.pop("metric"), "toy.yaml: metric: Field required"),
        (lambda d: d["datasets"][1].update(group="naturel"), "group 'naturel'; allowed: ['natural', 'structured']"),
        (lambda d: d.update(select=["wd"]), "select names 'wd', which is not swept; swept: ['lr']"),
        (lambda d: d["suites"]["quick"].update(datasets=["alpah"]), "unknown dataset 'alpah'; did you mean alpha?"),
        (lambda d: d["suites"]["quick"].update(sweeps={}), "suites.quick.sweeps: unknown field; allowed: description"),
        (lambda d: d["seeds"].append("x"), "toy.yaml: seeds.3: Input should be a valid integer"),
    ],
)
def test_bad_spec_names_file_field_and_allowed_values(tmp_path, edit, message):
    d = toy_dict()
    edit(d)
    p = tmp_path / "toy.yaml"
    p.write_text(yaml.safe_dump(d))
    with pytest.raises(SpecError) as e:
        load_spec_file(p)
    assert message in str(e.value), str(e.value)
    assert "\n" not in str(e.value)


def test_adapter_validates_its_dataset_fields(tmp_path):
    d = toy_dict()
    del d["datasets"][2]["offset"]
    p = tmp_path / "toy.yaml"
    p.write_text(yaml.safe_dump(d))
    with pytest.raises(SpecError, match=r"toy.yaml: datasets.2.offset: Field required \(dataset 'gamma'\)"):
        prepare_task(str(p))


def test_cell_key_hashes_identity_only():
    t = prepare_task("toy")
    bb = resolve_backbone("mu4_dpn")
    assert bb.sha256 == RANDOM_INIT and bb.checkpoint is None
    from transferbench.cell import make_cell

    c = make_cell(t, t.datasets[0], bb, t.grid()[1], seed=2, stage="select")
    ident = {
        "task": "toy",
        "dataset": "alpha",
        "backbone": "mu4_dpn",
        "checkpoint_sha256": RANDOM_INIT,
        "hparams": {"delay": 0.0, "lr": 0.01, "steps": 3},
        "seed": 2,
        "protocol_version": "1",
        "stage": "select",
        "data_version": "",
        "dataset_config": {"offset": 5.0},
    }
    expected = hashlib.sha256(json.dumps(ident, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:20]
    assert c.key == expected
    # report fields are not identity; every identity field is
    from dataclasses import replace

    assert replace(c, group="other", order=9, suite="quick").key == c.key
    for field, value in [
        ("seed", 3),
        ("stage", "final"),
        ("hparams", {"lr": 0.1}),
        ("checkpoint_sha256", "ab"),
        ("protocol_version", "2"),
        ("data_version", "v2"),
        ("dataset_config", {"offset": 1.0}),
    ]:
        assert replace(c, **{field: value}).key != c.key, field


def test_backbone_with_checkpoint_is_hashed(tmp_path):
    from transferbench.backbones import create_backbone, save_checkpoint

    p = save_checkpoint(create_backbone("mu8"), tmp_path / "m.safetensors")
    ref = resolve_backbone(f"mu8@{p}")
    assert ref.name == "mu8" and ref.sha256 == hashlib.sha256(p.read_bytes()).hexdigest()
    with pytest.raises(UserError, match="checkpoint .*nope.safetensors does not exist"):
        resolve_backbone(f"mu8@{tmp_path}/nope.safetensors")


def test_wheel_ships_task_specs_and_entry_points(tmp_path):
    repo = Path(__file__).parents[1]
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(repo),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("transferbench-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "transferbench/tasks/__init__.py" in names
    assert {f"transferbench/tasks/{p.name}" for p in (repo / "tasks").glob("*.yaml")} <= names
    sources = {str(p.relative_to(repo)) for p in (repo / "transferbench").rglob("*.py")}
    assert sources <= names, sources - names  # every module of the package is packaged
    ep = next(n for n in names if n.endswith("entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(ep).decode()
    assert "[transferbench.tasks]" in text and "builtin = transferbench.tasks" in text
    assert "vit = transferbench.backbones.registry:VIT" in text


def test_a_parsed_spec_dumped_to_yaml_parses_back_to_the_same_spec():
    data = toy_dict()
    spec = parse_spec(data, "toy")
    assert (spec.metric, spec.mode, spec.groups) == (data["metric"], data.get("mode", "max"), data["groups"])
    text = yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False)
    again = parse_spec(yaml.safe_load(text), "toy (dumped)")
    assert again == spec and again.model_dump() == spec.model_dump()
    assert resolve(again, suite="quick").grid() == resolve(spec, suite="quick").grid()


@pytest.mark.parametrize("folder, suite", [("runs", "embedded"), ("nightly", "nightly")])
def test_every_committed_record_key_recomputes_and_a_rerun_plans_nothing(folder, suite):
    """The committed records (results/runs: the embedded suites; results/nightly: the gate's baseline) pin the cell
    key: each record's identity fields hash to its key, and planning every task's suite for the backbones it holds
    finds every cell finished (a rerun into the folder computes nothing). Task settings that a spec leaves out
    come from its adapter's settings model, so this also pins those models' defaults."""
    from transferbench.adapters import prepare_task
    from transferbench.engine.runner import Results
    from transferbench.records import RecordStore, load_records

    root = Path(__file__).resolve().parent.parent / "results" / folder
    records = load_records([root])
    assert len(records) > 400
    for r in records:
        assert Cell(**{k: r[k] for k in Cell.IDENTITY}).key == r["key"], (r["task"], r["dataset"])
    store = RecordStore(root)
    for task_name in sorted({r["task"] for r in records}):
        task = prepare_task(task_name, suite=suite)
        for backbone in sorted({r["backbone"] for r in records if r["task"] == task_name}):
            ref = resolve_backbone(backbone)
            seen, todo = set(), True
            while todo:  # plan again as a run would, until no new cell appears
                cells = [c for c in task.adapter.plan(task, ref, Results(store)) if c.key not in seen]
                todo = bool(cells)
                seen |= {c.key for c in cells}
                assert all(store.finished(c) for c in cells), (task_name, backbone)
            assert seen <= {r["key"] for r in records}


@pytest.mark.parametrize("task", ["vtab", "ade20k", "lit", "imagenet_c", "hires", "diagnose"])
def test_a_tfds_entry_without_its_tfds_name_is_one_spec_error(task):
    """One check (data.sources.require_tfds_name) for every adapter whose entries may come from tfds."""
    from transferbench.spec import load_task

    spec = load_task(task)
    i, ds = next(
        (i, d)
        for i, d in enumerate(spec.datasets)
        if d.model_dump().get("tfds") and d.model_dump().get("retrieval") is None
    )
    broken = spec.model_copy(update={"datasets": [*spec.datasets[:i], ds.model_copy(update={"tfds": None})]})
    with pytest.raises(
        SpecError,
        match=rf"<x>: datasets\.{i}\.tfds: a tfds dataset needs its tfds name "
        rf"\(dataset '{ds.name}'\)",
    ):
        get_adapter(spec.adapter).validate(broken, "<x>")


def test_what_specs_share_is_declared_once_and_merged_into_each(tmp_path):
    """tasks/_shared.yaml: a dataset entry of a shared name starts from its fields (its own win), a suite's
    `backbones: NAME` is that list, an unknown name is one error, and the file is no task of its own."""
    from transferbench.spec import installed_specs, load_spec_file, shared_entries

    assert "_shared" not in installed_specs()
    shared = shared_entries()
    assert shared["backbones"]["shipped"] == ["mu4@embedded", "mu4_dpn@embedded", "mu4_dtn@embedded"]
    spec = {
        "task": "mine", "adapter": "fewshot", "protocol_version": "1", "metric": "accuracy",
        "datasets": [{"name": "mini_digits", "train": "train800", "test": "test"},
                     {"name": "mini_mnist", "set": "digits", "train": "train800", "test": "test"}],
        "suites": {"quick": {"backbones": "shipped+random"}},
    }  # fmt: skip
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(spec))
    loaded = load_spec_file(path)
    digits, mnist = (d.model_dump() for d in loaded.datasets)
    assert (digits["source"], digits["set"]) == ("embedded", "digits")
    assert (mnist["source"], mnist["set"]) == ("embedded", "digits")  # the entry's own field wins
    assert loaded.suites["quick"].backbones == [*shared["backbones"]["shipped"], "mu4", "mu4_dpn", "mu4_dtn"]
    path.write_text(yaml.safe_dump({**spec, "suites": {"quick": {"backbones": "shiped"}}}))
    with pytest.raises(SpecError, match=r"suites\.quick\.backbones: no shared list 'shiped'.*did you mean shipped"):
        load_spec_file(path)
