"""The adapter contract, the registry of installed adapters, and the steps every run shares: resolving a
task for its adapter, checking backbone references, and the select-then-final plan."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import ClassVar

from pydantic import BaseModel, ValidationError

from ..backbones.checkpoint import check_checkpoint_file
from ..backbones.weights import providers, split_backbone
from ..cell import make_cell
from ..data import pixels
from ..data.sources import with_generator_version
from ..errors import UserError, close_matches
from ..plugins import load_group
from ..settings import Settings
from ..spec import SpecError, Task, TaskSpec, installed_specs, load_task, resolve, task_aliases


class Adapter:
    name: ClassVar[str] = ""
    # validates each dataset entry's adapter-specific fields (tfds name, splits, classes, ...)
    dataset_schema: ClassVar[type[BaseModel] | None] = None
    # the protocol's settings with their paper defaults and sources (transferbench.settings): a spec starts
    # from them, and every point of a task's grid is checked against them before anything runs
    settings: ClassVar[type[Settings] | None] = None
    # distributions that do arithmetic in this adapter's cells beyond fingerprint.CORE and DATA (open_clip's
    # tokenizer, the corruption generator): their versions are part of each record's fingerprint
    libraries: ClassVar[tuple[str, ...]] = ()

    def validate(self, spec: TaskSpec, source: str = "<spec>") -> None:
        if self.dataset_schema is None:
            return
        for i, ds in enumerate(spec.datasets):
            try:
                self.dataset_schema.model_validate(ds.model_dump())
            except ValidationError as err:
                e = err.errors()[0]
                loc = ".".join(str(p) for p in e["loc"])
                raise SpecError(f"{source}: datasets.{i}.{loc}: {e['msg']} (dataset {ds.name!r})") from None

    def plan(self, task: Task, backbone, results) -> Iterable:
        raise NotImplementedError

    def settings_of(self, cell):
        """The cell's validated settings (Settings.of_cell)."""
        return self.settings.of_cell(cell)

    @classmethod
    def entry(cls, name: str, fields: dict) -> dict:
        """Dataset `name`'s entry (`fields`: a spec's or a cell's `dataset_config`) validated by `dataset_schema`,
        its defaults filled in (source tfds, label rule 'label', ...)."""
        return validated_entry(cls.dataset_schema, name, fields)

    def training_images(self, cell) -> int:
        """Images the cell passes forward and backward through the backbone (`run --dry-run`'s cost): steps x
        batch where the cell trains the backbone; adapters whose cells train no backbone say 0."""
        if self.settings is None or not {"steps", "batch"} <= set(self.settings.model_fields):
            return 0
        s = self.settings_of(cell)
        return int(s.steps or 0) * int(s.batch)

    def input_size(self, cell) -> int:
        """The side of the images the cell trains the backbone on (`run --dry-run`'s probe shape): its `resolution`
        (224 for an adapter without settings)."""
        return int(self.settings_of(cell).resolution) if self.settings is not None else 224

    def check_data(self, task: Task, ctx) -> None:
        """Check that `task`'s data is where the run reads it (`ctx.data_dir`), before anything is generated or
        computed: a missing dataset is one line naming it and how to get it (UserError). The default checks nothing:
        an adapter whose data is generated or embedded has nothing to check."""

    def extras(self, task: Task) -> set[str]:
        """The package extras (`pip install 'transferbench[EXTRA]'`) that running `task` needs beyond the base
        install; the nightly workflow installs those of its baseline's tasks."""
        return set()

    def run(self, cell, ctx) -> dict:
        raise NotImplementedError


def validated_entry(schema: type[BaseModel], name: str, fields: dict) -> dict:
    """Dataset `name`'s entry validated by `schema`, its defaults filled in (`Adapter.entry`)."""
    return schema.model_validate({**fields, "name": name}).model_dump()


def plan_select_then_final(task: Task, backbone, results) -> list:
    """The common two-stage protocol. Per dataset and per setting of the swept-but-not-selected keys
    (report axes): stage 'select' runs every `select` setting x seed (train -> val); once all are
    finished, stage 'final' runs the winner x seed (trainval -> test). Without `select` keys only the
    'final' cells exist."""

    select = task.select_keys()
    cells = []
    for ds in task.datasets:
        by_axes: dict[str, list[dict]] = {}
        for hp in task.grid():
            axes = {k: v for k, v in hp.items() if k not in select}
            by_axes.setdefault(repr(sorted(axes.items())), []).append(hp)
        for settings in by_axes.values():
            if not select:
                cells += [make_cell(task, ds, backbone, hp, seed, "final") for hp in settings for seed in task.seeds]
                continue
            stage1 = [make_cell(task, ds, backbone, hp, seed, "select") for hp in settings for seed in task.seeds]
            cells += stage1
            best = results.best(stage1)
            if best is not None:
                hp = next(h for h in settings if all(h[k] == v for k, v in best.items()))
                cells += [make_cell(task, ds, backbone, hp, seed, "final") for seed in task.seeds]
    return cells


def prepare_task(name_or_path: str, *, suite=None, datasets=None, seeds=None, sets=()) -> Task:
    """Load a task spec, let its adapter validate the datasets, resolve suite and overrides."""

    spec = load_task(name_or_path)
    adapter = get_adapter(spec.adapter)
    installed = installed_specs()
    name = task_aliases().get(name_or_path, name_or_path) if name_or_path not in installed else name_or_path
    adapter.validate(spec, str(installed.get(name, name_or_path)))
    task = resolve(spec, suite=suite, datasets=datasets, seeds=seeds, sets=sets)
    if adapter.settings is not None:
        for hp in task.grid():
            adapter.settings.of(hp, spec.task)
    for value in ([task.hparams["pixels"]] if "pixels" in task.hparams else []) + list(task.sweep.get("pixels", [])):
        try:
            pixels.check(value)
        except UserError as e:
            raise UserError(f"task {spec.task!r}: {e}") from None
    datasets = tuple(with_generator_version(d) for d in task.datasets)
    return dataclasses.replace(task, adapter=adapter, datasets=datasets)


def check_backbone(spec: str) -> None:
    """What costs nothing about `NAME[@CHECKPOINT]`: the name (grammar and family) and, for a file, that it
    exists and is a checkpoint (header only). A weights provider's word (`NAME@embedded`) is resolved later (it
    may pretrain)."""

    _, checkpoint = split_backbone(spec)
    if checkpoint and checkpoint not in providers():
        try:
            check_checkpoint_file(checkpoint)
        except UserError as e:
            raise UserError(f"backbone {spec!r}: {e}") from None


def list_adapters() -> list[str]:
    return sorted(load_group("transferbench.adapters"))


def get_adapter(name: str) -> Adapter:
    adapters = load_group("transferbench.adapters")
    if name not in adapters:
        known = ", ".join(sorted(adapters)) or "none installed"
        raise UserError(f"no adapter {name!r}{close_matches(name, adapters)}; installed: {known}")
    obj = adapters[name]
    return obj() if isinstance(obj, type) else obj


__all__ = ["Adapter", "check_backbone", "get_adapter", "list_adapters", "plan_select_then_final", "prepare_task"]
