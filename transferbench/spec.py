"""Task specs: YAML files validated with pydantic, resolved against a suite and command-line overrides.

A spec names its adapter, protocol version, metric (and whether higher is better), the seeds, fixed
hyper-parameters (`hparams`), swept ones (`sweep`; those in `select` are chosen by mean validation
metric, the others become report axes such as few-shot `shots`), datasets, and suites (a dataset
subset and a hyper-parameter profile, e.g. `embedded`).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from functools import cache
from importlib.resources import files
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from .errors import UserError, close_matches
from .overrides import apply_set
from .plugins import load_group, load_one

BUILTIN_TASKS = ("ade20k", "diagnose", "fewshot", "hires", "imagenet_c", "lit", "pretrain", "vtab")  # tasks/*.yaml


class SpecError(UserError):
    """A task spec that does not validate; the message has the file, the field path and what is allowed."""


class DatasetSpec(BaseModel):
    model_config = ConfigDict(extra="allow")  # adapter-specific fields (tfds name, splits, classes, ...)
    name: str
    group: str | None = None
    version: str = ""  # data generator / export version; part of the cell key


class SuiteSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    description: str = ""
    datasets: list[str] | None = None
    seeds: list[int] | None = None
    hparams: dict[str, Any] = Field(default_factory=dict)
    sweep: dict[str, list[Any]] = Field(default_factory=dict)
    backbones: list[str] | None = None


class TaskSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    task: str
    adapter: str
    description: str = ""
    aliases: list[str] = Field(default_factory=list)  # other names `transferbench run` accepts (ade20k: seg)
    protocol_version: str
    metric: str
    mode: Literal["max", "min"] = "max"
    select: list[str] = Field(default_factory=list)
    seeds: list[int] = Field(default_factory=lambda: [0])
    # what one seed is across the datasets, which decides a suite mean's interval (records.stats.suite_mean):
    # dataset = each dataset's cell of a seed is a run of its own (VTAB, few-shot); task = one run per seed serves
    # every dataset (LiT's text tower, ImageNet-C's classifier)
    seed_scope: Literal["dataset", "task"] = "dataset"
    hparams: dict[str, Any] = Field(default_factory=dict)
    sweep: dict[str, list[Any]] = Field(default_factory=dict)
    groups: list[str] = Field(default_factory=list)
    datasets: list[DatasetSpec]
    # installed tasks whose dataset entries follow this spec's own (hires: every VTAB dataset); an entry of the
    # same name here wins
    datasets_from: list[str] = Field(default_factory=list)
    suites: dict[str, SuiteSpec] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _consistent(self):
        names = [d.name for d in self.datasets]
        if len(set(names)) != len(names):
            raise ValueError(f"dataset names repeat: {sorted(n for n in set(names) if names.count(n) > 1)}")
        for d in self.datasets:
            if self.groups and d.group not in self.groups:
                raise ValueError(f"dataset {d.name!r} has group {d.group!r}; allowed: {self.groups}")
        for suite_name, suite in self.suites.items():
            for ds in suite.datasets or []:
                if ds not in names:
                    raise ValueError(f"suite {suite_name!r} lists unknown dataset {ds!r}{close_matches(ds, names)}")
        sweep_keys = set(self.sweep) | {k for s in self.suites.values() for k in s.sweep}
        for key in self.select:
            if key not in sweep_keys:
                raise ValueError(f"select names {key!r}, which is not swept; swept: {sorted(sweep_keys)}")
        return self


def _format(err: ValidationError, source: str) -> str:
    e = err.errors()[0]
    loc = ".".join(str(p) for p in e["loc"]) or "(top level)"
    if e["type"] == "extra_forbidden":
        model = SuiteSpec if e["loc"][0] == "suites" else TaskSpec
        msg = f"unknown field; allowed: {', '.join(model.model_fields)}"
    else:
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] not in ("value_error", "missing"):
            msg += f" (got {e['input']!r})"
    more = f" (+{err.error_count() - 1} more)" if err.error_count() > 1 else ""
    return f"{source}: {loc}: {msg}{more}"


def settings_model(adapter: str):
    """The settings model (settings.Settings) that the installed adapter `adapter` declares; None for one that
    declares none (its specs state every hyper-parameter themselves) or is not installed. Found through the
    `transferbench.settings` entry point of the adapter's name, which imports the settings' module alone (no torch);
    an adapter that registers none is loaded for its `settings`."""
    model = load_one("transferbench.settings", adapter)
    if model is not None:
        return model
    installed = load_group("transferbench.adapters").get(adapter)
    return installed.settings if installed is not None else None


def parse_spec(data: dict, source: str = "<spec>", defaults: bool = True) -> TaskSpec:
    """A spec from its YAML mapping; its `hparams` start from its adapter's settings defaults (the paper's values),
    which the spec's own entries override. `defaults=False` leaves them out, for what needs only the spec's names,
    suites and data sets (`transferbench list`), which loads no settings model."""
    model = settings_model(data.get("adapter")) if defaults and isinstance(data.get("adapter"), str) else None
    if model is not None and isinstance(data.get("hparams", {}), dict):
        data = {**data, "hparams": {**model.keyed_defaults(), **(data.get("hparams") or {})}}
    try:
        return TaskSpec.model_validate(data)
    except ValidationError as err:
        raise SpecError(_format(err, source)) from None


def load_spec_file(path, defaults: bool = True) -> TaskSpec:
    """A spec file (`parse_spec`: `defaults` says whether its hparams start from its adapter's settings)."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise SpecError(f"{path}: not valid YAML: {str(e).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise SpecError(f"{path}: a task spec is a YAML mapping")
    return parse_spec(_with_shared(_with_borrowed_datasets(data, path), path), str(path), defaults)


SHARED = "_shared.yaml"  # beside the built-in specs: what several specs share (tasks/_shared.yaml)


@cache
def shared_entries() -> dict:
    """tasks/_shared.yaml: {'datasets': name -> fields, 'backbones': name -> list}."""
    data = yaml.safe_load((files("transferbench.tasks") / SHARED).read_text())
    return {"datasets": dict(data.get("datasets") or {}), "backbones": dict(data.get("backbones") or {})}


def _with_shared(data: dict, path: Path) -> dict:
    """A spec with what tasks/_shared.yaml declares once: a dataset entry of a shared name starts from its
    fields (the entry's own win), and a suite's `backbones: NAME` becomes that named list."""
    shared = shared_entries()
    datasets = [
        {**shared["datasets"].get(d.get("name"), {}), **d} if isinstance(d, dict) else d
        for d in data.get("datasets") or []
    ]
    suites = {}
    for name, suite in (data.get("suites") or {}).items():
        backbones = suite.get("backbones") if isinstance(suite, dict) else None
        if isinstance(backbones, str):
            if backbones not in shared["backbones"]:
                known = ", ".join(shared["backbones"])
                raise SpecError(
                    f"{path}: suites.{name}.backbones: no shared list {backbones!r}"
                    f"{close_matches(backbones, shared['backbones'])}; lists: {known} (or give a list of names)"
                )
            suite = {**suite, "backbones": list(shared["backbones"][backbones])}
        suites[name] = suite
    return {**data, "datasets": datasets, **({"suites": suites} if "suites" in data else {})}


def _with_borrowed_datasets(data: dict, path: Path) -> dict:
    """`datasets_from: [vtab]`: the named installed tasks' dataset entries appended to this spec's own."""
    borrowed = data.get("datasets_from") or []
    if not borrowed:
        return data
    if not isinstance(borrowed, list):
        raise SpecError(f"{path}: datasets_from: a list of installed task names, e.g. [vtab]")
    specs = installed_specs()
    own = list(data.get("datasets") or [])
    names = {d.get("name") for d in own if isinstance(d, dict)}
    for task in borrowed:
        if task not in specs:
            raise SpecError(f"{path}: datasets_from: no installed task {task!r}{close_matches(str(task), specs)}")
        other = yaml.safe_load(Path(specs[task]).read_text())
        for d in other.get("datasets") or []:
            if d.get("name") not in names:
                own.append(d)
                names.add(d.get("name"))
    return {**data, "datasets": own}


def installed_specs() -> dict[str, Path]:
    """task name -> YAML file, from every `transferbench.tasks` entry point (a package of *.yaml)."""
    found: dict[str, Path] = {}
    for module in load_group("transferbench.tasks").values():
        for entry in sorted(files(module).iterdir(), key=lambda e: e.name):
            if entry.name.endswith((".yaml", ".yml")) and not entry.name.startswith("_"):  # _shared.yaml
                found.setdefault(Path(entry.name).stem, Path(str(entry)))
    return found


@cache
def seed_scope(task: str) -> str:
    """An installed task's `seed_scope` ('dataset' for a task no installed spec names: each cell its own run)."""
    path = installed_specs().get(task)
    if path is None:
        return "dataset"
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError):
        return "dataset"
    return str(data.get("seed_scope", "dataset")) if isinstance(data, dict) else "dataset"


def seeds_shared(task: str) -> bool:
    """Whether one run per seed serves every dataset of `task` (`seed_scope: task`): its suite intervals are then
    over per-seed suite means (records.stats.suite_mean)."""
    return seed_scope(task) == "task"


def list_tasks() -> list[str]:
    return sorted(installed_specs())


def task_aliases() -> dict[str, str]:
    """alias -> task name, from every installed spec's `aliases` (read from the YAML's top level only)."""
    out = {}
    for name, path in installed_specs().items():
        try:
            data = yaml.safe_load(Path(path).read_text())
        except (OSError, yaml.YAMLError):
            continue  # a broken spec reports itself when it is loaded by name
        aliases = data.get("aliases") if isinstance(data, dict) else None
        for alias in aliases or []:
            out.setdefault(str(alias), name)
    return out


def load_task(name_or_path: str) -> TaskSpec:
    """An installed task by name, or a spec file by path."""
    if name_or_path.endswith((".yaml", ".yml")) or Path(name_or_path).is_file():
        if not Path(name_or_path).is_file():
            raise SpecError(f"task spec {name_or_path} does not exist")
        return load_spec_file(name_or_path)
    specs = installed_specs()
    if name_or_path not in specs:
        aliases = task_aliases()
        if name_or_path in aliases:
            return load_task(aliases[name_or_path])
        known = ", ".join(sorted(specs)) or "none installed"
        known += "".join(f" ({a} = {t})" for a, t in sorted(aliases.items()))
        raise UserError(
            f"unknown task {name_or_path!r}{close_matches(name_or_path, [*specs, *aliases])}; tasks: {known} "
            "(or give a path to a spec .yaml)"
        )
    spec = load_spec_file(specs[name_or_path])
    if spec.task != name_or_path:
        raise SpecError(f"{specs[name_or_path]}: task is {spec.task!r} but the file is named {name_or_path!r}")
    return spec


@dataclass(frozen=True)
class Task:
    """A spec resolved against a suite and overrides: what a run plans cells from."""

    spec: TaskSpec
    suite: str
    datasets: tuple[DatasetSpec, ...]
    seeds: tuple[int, ...]
    hparams: dict = field(default_factory=dict)
    sweep: dict = field(default_factory=dict)
    backbones: tuple[str, ...] | None = None
    adapter: Any = field(default=None, compare=False)  # the spec's adapter object (set by prepare_task)
    # hyper-parameter -> where its value comes from: 'suite NAME', '--set', 'derived from ...' or the default's source
    sources: dict = field(default_factory=dict, compare=False)

    @property
    def name(self) -> str:
        return self.spec.task

    def grid(self) -> list[dict]:
        """Every hyper-parameter setting: fixed values merged with one combination of the sweep."""
        keys = sorted(self.sweep)
        model = settings_model(self.spec.adapter)
        derive = model.derive if model is not None else dict
        return [
            derive({**self.hparams, **dict(zip(keys, combo))})
            for combo in itertools.product(*(self.sweep[k] for k in keys))
        ]

    def select_keys(self) -> tuple[str, ...]:
        return tuple(k for k in self.spec.select if k in self.sweep)


def resolve(spec: TaskSpec, *, suite: str | None = None, datasets=None, seeds=None, sets=()) -> Task:
    """Apply a suite (default: 'default' when the spec has one, else everything), a dataset filter,
    seeds and `key=value` overrides of hparams or sweeps."""
    if suite is None:
        suite = "default" if "default" in spec.suites else ""
    if suite and suite not in spec.suites:
        known = ", ".join(spec.suites) or "none"
        raise UserError(
            f"task {spec.task!r} has no suite {suite!r}{close_matches(suite, spec.suites)}; suites: {known}"
        )
    s = spec.suites.get(suite, SuiteSpec())
    by_name = {d.name: d for d in spec.datasets}
    chosen = [by_name[n] for n in s.datasets] if s.datasets else list(spec.datasets)
    if datasets:
        names = [d.name for d in chosen]
        for n in datasets:
            if n not in names:
                raise UserError(
                    f"task {spec.task!r} (suite {suite or 'all'}) has no dataset {n!r}"
                    f"{close_matches(n, names)}; datasets: {', '.join(names)}"
                )
        chosen = [d for d in chosen if d.name in datasets]
    hparams = {**spec.hparams, **s.hparams}
    sweep = {**spec.sweep, **s.sweep}
    model = settings_model(spec.adapter)
    sources = _sources(spec, suite, s, model)
    settable = [row[0] for row in model.rows()] if model is not None and sets else []
    for item in sets:
        apply_set(item, spec, hparams, sweep, model, settable)
        sources[item.partition("=")[0]] = SET_SOURCE
    if model is not None:  # a setting that follows a rule (LiT's warm-up follows steps) takes this run's values
        for name, (reads, _) in model.rules.items():
            if hparams.get(name) is None:
                sources[name] = derived_source(reads)
        hparams = model.derive(hparams, swept=sweep)
    seeds = seeds if seeds is not None else (s.seeds or spec.seeds)
    if any(isinstance(x, bool) or not isinstance(x, int) or x < 0 for x in seeds):
        raise UserError(f"seeds must be non-negative integers, got {', '.join(map(str, seeds))} (e.g. --seeds 0,1,2)")
    backbones = tuple(s.backbones) if s.backbones else None
    return Task(spec, suite, tuple(chosen), tuple(seeds), hparams, sweep, backbones, sources=sources)


# where a value that ran came from, where it is not the protocol's default (whose source is the settings model's
# `source_of`): written here into the resolved task's `sources`, which cells record and `report` reads back
SET_SOURCE = "--set"


def suite_source(suite: str) -> str:
    return f"suite {suite}"


def derived_source(reads) -> str:
    return f"derived from {', '.join(reads)}"


OVERRIDE_SOURCES = (suite_source(""), SET_SOURCE, derived_source(()))  # the prefixes of the three above


def _sources(spec: TaskSpec, suite: str, s, model) -> dict:
    """Where each hyper-parameter's value comes from before --set: the suite that sets it ('suite NAME'), else the
    protocol's default, whose source the settings model names (a paper's config, the reference code), else the task's
    spec file. What a tracker, a record and `report` show beside each value that ran."""
    source_of = model.source_of if model is not None else (lambda name: "")
    out = {k: source_of(k) or f"tasks/{spec.task}.yaml" for k in {**spec.hparams, **spec.sweep}}
    out.update({k: suite_source(suite) for k in {**s.hparams, **s.sweep}})
    return out
