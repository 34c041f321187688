"""Typed task settings (transferbench.settings): every protocol fact has one home, a model field with the paper's
default and its source; a task spec only overrides them."""

import ast
import re
from pathlib import Path

import pytest
import yaml
from kit import cli

from transferbench.adapters import get_adapter, prepare_task
from transferbench.errors import UserError
from transferbench.settings import settings_markdown, settings_table
from transferbench.spec import BUILTIN_TASKS, load_task, settings_model

REPO = Path(__file__).resolve().parent.parent
ADAPTERS = sorted({load_task(t).adapter for t in BUILTIN_TASKS})
PAGES = {
    "vtab": "vtab.md",
    "fewshot": "fewshot.md",
    "ade20k": "segmentation.md",
    "lit": "lit.md",
    "imagenet_c": "robustness.md",
    "hires": "hires.md",
    "diagnose": "diagnostics.md",
    "pretrain": "pretraining.md",
}


def _own_spec(tmp_path, adapter: str, datasets: list) -> str:
    path = tmp_path / f"my_{adapter}.yaml"
    spec = {"task": f"my_{adapter}", "adapter": adapter, "protocol_version": "1", "metric": "accuracy"}
    path.write_text(yaml.safe_dump({**spec, "datasets": datasets}))
    return str(path)


@pytest.mark.parametrize(
    "adapter, dataset, expected",
    [
        # DPN App. E (big_vision sigmoid_xent; the selected train800 runs reported)
        ("vtab", {"name": "c", "tfds": "cifar100", "train": "train[:800]", "val": "train[800:1000]", "test": "test",
                  "classes": 100}, {"loss": "sigmoid", "final": "none", "steps": 2500, "batch": 512, "clip": 1.0}),
        # big_vision common_fewshot.py: square resize(256), central_crop(224), l2 2**10
        ("fewshot", {"name": "c", "tfds": "cifar100", "train": "train", "test": "test"},
         {"resize_mode": "square", "resize": 256, "resolution": 224, "l2": 1024.0, "pool": "model"}),
        # DPN App. C: init_head_bias -6.9, wd 1e-4, 93,000 steps of 4,096
        ("pretrain", {"name": "i", "source": "tfds", "tfds": "imagenet2012", "train": "train", "test": "validation"},
         {"init_head_bias": -6.9, "wd": 0.0001, "steps": 93000, "batch": 4096, "loss": "sigmoid"}),
        # big_vision lit_coco / prompt_engineering: canonicalised prompts, wd in big_vision's semantics
        ("lit", {"name": "z", "tfds": "cifar10", "test": "test"},
         {"prompts": "big_vision", "decay": "big_vision", "temperature_init": 10.0, "steps": 55000}),
        # DPN App. G: pre-norm tokens, poly 0.9, 128 epochs of the pool
        ("seg", {"name": "a", "classes": 150, "train": "training", "test": "validation"},
         {"decoder_tokens": "prenorm", "schedule": "poly", "epoch": "pool", "epochs": 128, "pixels": "imagenet"}),
    ],
)  # fmt: skip
def test_a_spec_that_leaves_a_setting_out_runs_the_papers_value(tmp_path, adapter, dataset, expected):
    task = prepare_task(_own_spec(tmp_path, adapter, [dataset]))
    assert {k: task.hparams[k] for k in expected} == expected


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_every_setting_has_a_default_a_source_and_a_description(adapter):
    model = get_adapter(adapter).settings
    assert model is not None and model is settings_model(adapter)
    for name, default, allowed, source, description in model.rows():
        assert source and description and allowed, (adapter, name)
        choices = model.choices(name)
        assert choices is None or default in choices, (adapter, name, default, choices)
        model.of({name: default})  # the default validates


@pytest.mark.parametrize("task", BUILTIN_TASKS)
def test_a_task_file_only_overrides_its_adapters_settings(task):
    """No top-level `hparams` in a shipped spec: the settings model holds the defaults; suites override them."""
    data = yaml.safe_load((REPO / "tasks" / f"{task}.yaml").read_text())
    assert "hparams" not in data
    model = settings_model(data["adapter"])
    for suite in data["suites"].values():
        for key in [*suite.get("hparams", {}), *suite.get("sweep", {})]:
            assert key in model.model_fields, (task, key)


def test_a_value_the_protocol_does_not_take_is_one_line():
    with pytest.raises(UserError, match=r"task 'vtab': loss = 'hinge' is not one of sigmoid, softmax \(set it with"):
        prepare_task("vtab", suite="embedded", sets=["loss=hinge"])
    with pytest.raises(UserError, match=r"has no hyper-parameter 'los'.*did you mean.*loss"):
        prepare_task("vtab", suite="embedded", sets=["los=softmax"])


def test_a_setting_outside_the_key_enters_it_only_when_set():
    """ADE20K's Adam beta2 (optax's default, a setting added after the records) is not part of its cells' keys
    until --set gives it."""
    plain = prepare_task("ade20k", suite="embedded")
    assert "beta2" not in plain.hparams
    assert prepare_task("ade20k", suite="embedded", sets=["beta2=0.98"]).hparams["beta2"] == 0.98


@pytest.mark.parametrize("task", ["imagenet_c", "diagnose"])
def test_the_robustness_classifier_and_the_diagnostics_fine_tune_with_app_e_sigmoid_xent(task):
    """Both fine-tune with App. E's recipe, whose big_vision config says loss sigmoid_xent (PROTOCOLS: fine-tuning):
    that is their default and part of every cell's key, and the nightly runs it. The embedded robustness suite
    states softmax, as VTAB's embedded profile does (in 50 steps sigmoid_xent leaves random init at chance)."""
    assert prepare_task(task).hparams["loss"] == "sigmoid"
    assert prepare_task(task, suite="nightly").hparams["loss"] == "sigmoid"
    if task == "imagenet_c":
        vtab = prepare_task("vtab", suite="embedded").hparams["loss"]
        assert prepare_task(task, suite="embedded").hparams["loss"] == vtab == "softmax"


@pytest.mark.parametrize("task", ["imagenet_c", "diagnose"])
def test_an_execution_setting_is_recorded_but_never_keyed(task):
    """eval_batch says how many images a forward takes, not what a cell computes: a cell planned with another value
    keeps its key, carries the value as its `execution` (which the record and its arithmetic digest hold), and
    runs with it."""
    from transferbench import arithmetic
    from transferbench.backbones.weights import resolve_backbone
    from transferbench.cell import make_cell

    backbone = resolve_backbone("mu4")
    cells = []
    for sets in ([], ["eval_batch=7"]):
        t = prepare_task(task, suite="embedded", sets=sets)
        cells.append(make_cell(t, t.datasets[0], backbone, t.grid()[0], 0))
    plain, seven = cells
    assert plain.key == seven.key and "eval_batch" not in plain.hparams and "eval_batch" not in seven.hparams
    default = type(plain.settings).model_fields["eval_batch"].default
    assert plain.execution == {"eval_batch": default} and seven.execution == {"eval_batch": 7}
    assert seven.settings.eval_batch == 7 and type(seven.settings).of_cell(seven).eval_batch == 7
    assert seven.to_dict()["execution"] == {"eval_batch": 7}
    arithmetic.begin()
    a, _ = arithmetic.finish({}, device="cpu", workers=0, compile=False, micro_batch=0, execution=seven.execution)
    arithmetic.begin()
    b, _ = arithmetic.finish({}, device="cpu", workers=0, compile=False, micro_batch=0, execution=plain.execution)
    assert a["cell"]["execution"] == {"eval_batch": 7} and a["digest"] != b["digest"]


def test_list_show_prints_default_suite_value_and_source(capsys):

    assert cli("list tasks --show vtab --suite embedded") == 0
    out = capsys.readouterr().out
    loss = next(line for line in out.splitlines() if line.startswith("loss "))
    assert re.search(r"loss\s+sigmoid\s+softmax\s+sigmoid \| softmax\s+DPN App\. E", loss), loss
    headers, rows = settings_table("fewshot", ["embedded"])
    assert headers[:3] == ["setting", "default", "suite embedded"]
    assert ["resize", "256", "null"] == next(r for r in rows if r[0] == "resize")[:3]


def test_the_settings_page_is_generated_from_the_models():
    page = (REPO / "docs" / "settings.md").read_text()
    assert page == settings_markdown(list(BUILTIN_TASKS)), (
        "docs/settings.md: regenerate with `transferbench list tasks --show all --format markdown > docs/settings.md`"
    )


@pytest.mark.parametrize("task, page", sorted(PAGES.items()))
def test_every_option_a_task_page_names_is_a_setting_it_takes(task, page):
    """The hand-written tables name options as `key=value`: each key is a setting of the task and each value one it
    takes, so the page cannot name an option the code does not have."""
    model = settings_model(load_task(task).adapter)
    text = (REPO / "docs" / page).read_text()
    found = re.findall(r"`(?:--set )?([a-z_0-9]+)=([^`\s]+)`", text)
    assert found, page
    for key, value in found:
        if key not in model.model_fields:
            continue  # another command's option (`shots=5,25` is a sweep, `KEY=VALUE` a placeholder)
        choices = model.choices(key)
        for v in value.split("|") if choices else ():
            if v not in {str(c) for c in choices} | {"true", "false"}:
                pytest.fail(f"docs/{page}: `{key}={value}`: {v!r} is not one of {choices}")


def _fallback_gets(path: Path, root: Path = REPO) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
            target = ast.unparse(node.func.value)
            if target in ("hp", "hparams", "cell.hparams", "task.hparams") and len(node.args) > 1:
                out.append(f"{path.relative_to(root)}:{node.lineno}: {ast.unparse(node)}")
    return out


def test_no_setting_has_a_second_default_in_code(tmp_path):
    """A protocol default lives in its settings model only: no `hp.get(key, fallback)` anywhere in the package."""
    files = list((REPO / "transferbench").rglob("*.py"))
    assert not [hit for p in files for hit in _fallback_gets(p)]
    sample = tmp_path / "sample.py"  # the scan sees a fallback where there is one
    sample.write_text("def f(hp, cell):\n    return hp.get('loss', 'softmax'), cell.hparams.get('bf16', 'auto')\n")
    assert len(_fallback_gets(sample, root=tmp_path)) == 2


def test_no_function_is_over_80_lines():
    long = []
    for p in (REPO / "transferbench").rglob("*.py"):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 80:
                long.append(f"{p.relative_to(REPO)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1})")
    assert not long, long


def test_lit_warmup_follows_the_steps_by_lit_cocos_rule():
    """big_vision lit_coco.py: warmup_steps = max(int(0.03 * total_steps), 100). The paper's 55,000 steps give 1,650
    (the number the cell key holds, as before the rule was stored as one), the lit_coco suite's 5,000 give 150, and
    --set steps moves the warm-up with it unless the warm-up itself is given."""
    from transferbench.adapters import prepare_task

    def warmup(suite=None, *sets):
        task = prepare_task("lit", suite=suite, sets=list(sets))
        grid = task.grid()
        assert {hp["warmup_steps"] for hp in grid} == {task.hparams["warmup_steps"]}
        return task.hparams["warmup_steps"]

    assert warmup() == 1650
    assert warmup("lit_coco") == 150
    assert warmup(None, "steps=10000") == 300
    assert warmup(None, "steps=1000") == 100  # the floor of 100
    assert warmup(None, "steps=1000", "warmup_steps=7") == 7
    assert warmup("embedded") == 30  # the embedded profile's own 10%, given explicitly


def test_adam_betas_and_siglip_bias_are_settings_with_the_reference_values():
    """optax.scale_by_adam's defaults (b1 0.9, b2 0.999), which lit_coco and App. C's big_vision configs use, and
    SigLIP's bias init of -10 reach the optimizer and the model from the settings."""
    from transferbench.adapters.lit import LitModel
    from transferbench.adapters.lit.training import tower_options
    from transferbench.settings.lit import LitSettings
    from transferbench.settings.pretrain import PretrainSettings
    from transferbench.settings.seg import SegSettings

    for model in (LitSettings, PretrainSettings, SegSettings):
        assert model.default_of("beta1") == 0.9 and "beta1" not in model.keyed_defaults()
    assert LitSettings.default_of("beta2") == SegSettings.default_of("beta2") == 0.999
    s = LitSettings.of({"siglip_bias": -3.0, "loss": "siglip"})
    tower = LitModel(
        8,
        {"context_length": 4, "vocab_size": 50, "width": 16, "heads": 2, "layers": 1},
        loss="siglip",
        **tower_options(s),
    )
    assert tower.logit_bias.item() == -3.0 and LitSettings.default_of("siglip_bias") == -10.0


def test_every_source_says_where_its_value_comes_from():
    """A source names a paper, a config or a reference codebase, or says that no paper fixes the value: never just a
    module of ours, 'an option', 'transferbench' or 'no effect on results'."""
    from transferbench.spec import load_task, settings_model

    bare = re.compile(r"^(transferbench|an option.*|no effect on results|[a-z_]+(\.[a-z_]+)+)$")
    seen = []
    for task in BUILTIN_TASKS:
        for name, _, _, source, _ in settings_model(load_task(task).adapter).rows():
            seen.append(source)
            assert source and not bare.match(source), f"{task}.{name}: source {source!r}"
    assert len(seen) > 100 and bare.match("engine.precision") and bare.match("an option")  # the check sees them


def test_a_cell_carries_its_settings_validated_once(monkeypatch):
    """make_cell validates a cell's hparams into the adapter's settings model once per distinct hparams: a cell
    planned again carries the same frozen object, and the adapter reads the one the cell carries."""
    from transferbench.adapters import prepare_task
    from transferbench.backbones.weights import resolve_backbone
    from transferbench.cell import make_cell
    from transferbench.hashing import canon
    from transferbench.settings import base as settings_module
    from transferbench.settings.finetune import VtabSettings

    monkeypatch.setattr(settings_module, "_VALIDATED", {})
    calls = []
    real = VtabSettings.model_validate.__func__
    monkeypatch.setattr(
        VtabSettings, "model_validate", classmethod(lambda cls, d, **k: calls.append(canon(d)) or real(cls, d, **k))
    )
    task = prepare_task("vtab", suite="embedded", datasets=["mini_digits"])
    grid = task.grid()
    assert len(calls) == len(grid) > 1  # prepare_task checks each point of the grid
    backbone = resolve_backbone("mu4")
    plan = lambda: [make_cell(task, task.datasets[0], backbone, hp, s, "select") for hp in grid for s in task.seeds]  # noqa: E731
    first, again = plan(), plan()
    assert len(calls) == 2 * len(grid)  # the cells' hparams hold the resolved pixels: one more validation per point
    assert len(calls) == len(set(calls))  # never the same hparams twice
    assert all(a.settings is b.settings and a.settings.lr == a.hparams["lr"] for a, b in zip(first, again))
    assert task.adapter.settings_of(first[0]) is first[0].settings


def test_each_adapter_registers_the_settings_it_runs_with():
    """`settings_model` finds a protocol's settings through the `transferbench.settings` entry point, without
    importing its adapter: that entry must be the very model the adapter validates its cells with, for every built-in
    adapter (a plugin's adapter that registers none is loaded instead)."""
    from transferbench.plugins import load_group, load_one

    adapters = load_group("transferbench.adapters")
    assert set(load_group("transferbench.settings")) == set(ADAPTERS)
    for name, adapter in adapters.items():
        registered = load_one("transferbench.settings", name)
        assert registered in (None, adapter.settings), name
        assert settings_model(name) is adapter.settings, name
    assert load_one("transferbench.settings", "toy") is None and settings_model("toy") is None


def test_the_settings_choices_name_what_the_code_implements():
    """transferbench.settings.choices holds the values as names, for torch-free settings: the losses registry has
    exactly the loss names, App. C's per-size strengths are named strengths, and the strengths' table is
    big_vision's."""
    from transferbench.engine import augreg, losses
    from transferbench.settings import choices

    assert tuple(losses.LOSSES) == choices.LOSSES == ("sigmoid", "softmax")
    assert set(augreg.AUG.values()) <= set(choices.RANDAUG) and set(choices.MIXUP) == set(choices.RANDAUG)
    assert choices.RANDAUG["medium2"] == (2, 15) and choices.MIXUP["medium2"] == 0.5  # big_vision vit_i1k.py
