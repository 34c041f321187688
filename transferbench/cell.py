"""Cells: one unit of work each, identified by a stable hash of what determines its result, and the backbone
reference a cell names (its weights resolved by backbones.weights)."""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass, field

from .errors import UserError
from .hashing import digest
from .names import model_name
from .spec import SET_SOURCE

RANDOM_INIT = "random-init"  # checkpoint identity of a backbone without weights, and its pretraining
# the pretraining a checkpoint of the `pretrain` task states (`pretraining_name`): its default suite on a data set
# named here is the pretraining the published numbers name (reporting.published: DPN §5's AugReg on ImageNet-1k)
OWN_PRETRAINING = {"imagenet2012": "imagenet1k_augreg_93k"}
DEFAULT_PIXELS = "inception"  # pixels in [-1, 1] (big_vision): for weights that state no normalisation (data.pixels)


# the report kinds the built-in adapters' cells name (Cell.report), each registered under the same name in the
# entry-point group `transferbench.reports` (pyproject.toml; tests/test_packaging.py pins that they agree)
CORRUPTION_REPORT = "corruption"  # reporting.robustness
HIRES_REPORT = "hires"  # reporting.hires
DIAGNOSTICS_REPORT = "diagnostics"  # reporting.diagnostics


@dataclass(frozen=True)
class BackboneRef:
    """`NAME` or `NAME@CHECKPOINT` as given on the command line, resolved to a name and weights hash."""

    spec: str
    name: str
    checkpoint: str | None
    sha256: str
    pixels: str = ""  # the pixel normalisation the weights state ('' = none stated; data.pixels)
    # what else the weights state of their input ((key, value) pairs: input_size, crop_pct, interpolation, pixels;
    # timm tags' pretrained_cfg), recorded in each cell's hyper-parameters as `backbone_preprocess`
    preprocess: tuple = ()
    # what the weights were pretrained on, where they state it (a checkpoint of the `pretrain` task: OWN_PRETRAINING);
    # '' where they do not; RANDOM_INIT for none
    pretraining: str = ""


@dataclass(frozen=True)
class Cell:
    # identity: the key hashes exactly these
    task: str
    dataset: str
    backbone: str
    checkpoint_sha256: str
    hparams: dict
    seed: int
    protocol_version: str
    stage: str = ""  # e.g. 'select' (train -> val) or 'final' (trainval -> test)
    data_version: str = ""
    dataset_config: dict = field(default_factory=dict)  # the spec's adapter fields (splits, source, ...)
    # how to report it (not identity)
    metric: str = "accuracy"
    mode: str = "max"
    select: tuple = ()
    group: str | None = None
    order: int = 0
    suite: str = ""
    report: str = ""  # a report of its own for the task's records ('corruption': reporting.robustness); '' = tables
    checkpoint: str | None = field(default=None, compare=False)
    # the execution settings it runs with (settings.EXECUTION: how many images a forward takes): recorded, not keyed
    execution: dict = field(default_factory=dict, compare=False)
    # the hyper-parameters validated into the adapter's settings model (make_cell): what `run` reads, never re-parsed
    settings: object = field(default=None, compare=False, repr=False)
    # where each setting's value comes from (spec.Task.sources, the weights for what they state): recorded, not keyed
    sources: dict = field(default_factory=dict, compare=False)
    # what the weights were pretrained on: declared (`--set pretraining=NAME`, then also a keyed hyper-parameter) or
    # stated by the weights (BackboneRef.pretraining); RANDOM_INIT without weights; '' unknown. Recorded, not keyed
    pretraining: str = field(default="", compare=False)

    IDENTITY = (
        "task",
        "dataset",
        "backbone",
        "checkpoint_sha256",
        "hparams",
        "seed",
        "protocol_version",
        "stage",
        "data_version",
        "dataset_config",
    )

    @property
    def backbone_name(self) -> str:
        """The backbone's name without its weights (`mu4_dpn` of `mu4_dpn@embedded`): what builds the model."""
        return model_name(self.backbone)

    @property
    def key(self) -> str:
        return digest({k: getattr(self, k) for k in self.IDENTITY}, 20)

    def to_dict(self) -> dict:
        d = asdict(dataclasses.replace(self, settings=None))
        del d["settings"]
        d["select"] = list(self.select)
        return d

    def __hash__(self):
        return hash(self.key)

    def __eq__(self, other):
        return isinstance(other, Cell) and other.key == self.key


def make_cell(
    task,
    dataset,
    backbone: BackboneRef,
    hparams: dict,
    seed: int,
    stage: str = "",
    *,
    metric: str | None = None,
    mode: str | None = None,
    report: str = "",
) -> Cell:
    """A cell of resolved `task` (spec.Task) with the report fields filled in from its spec; a stage with its own
    metric (and direction) and a task with a report of its own (reporting.kinds.Report) say so here. A `pixels`
    hyper-parameter of 'auto' becomes the backbone's stated normalisation (DEFAULT_PIXELS where none); `posemb`
    becomes the backbone's own resampling where it states one (timm: and py: models resample their own). The
    execution settings (settings.EXECUTION) leave the hyper-parameters for the cell's `execution`."""
    spec = task.spec
    hparams = dict(hparams)
    model = task.adapter.settings if task.adapter is not None else None
    source_of = model.source_of if model is not None else (lambda name: "")
    sources = {k: task.sources.get(k) or source_of(k) for k in hparams}
    if hparams.get("pixels") == "auto":  # the weights' own normalisation, resolved into the key
        hparams["pixels"] = backbone.pixels or DEFAULT_PIXELS
        sources["pixels"] = "auto: the weights' own" if backbone.pixels else "auto: the weights state none"
    if backbone.preprocess:  # only backbones that state it: every other cell's key stays as it was
        hparams["backbone_preprocess"] = dict(backbone.preprocess)
        sources["backbone_preprocess"] = "the weights"
        if "posemb" in hparams and "posemb" in hparams["backbone_preprocess"]:
            hparams["posemb"] = hparams["backbone_preprocess"]["posemb"]  # a model that resamples them itself
            sources["posemb"] = "the weights"
    execution = {k: hparams.pop(k) for k in (model.execution_names() if model else ()) if k in hparams}
    pretraining = _pretraining(backbone, hparams, sources)
    return Cell(
        task=spec.task,
        dataset=dataset.name,
        backbone=backbone.spec,
        checkpoint_sha256=backbone.sha256,
        hparams=dict(hparams),
        seed=int(seed),
        protocol_version=spec.protocol_version,
        stage=stage,
        data_version=dataset.version,
        dataset_config=dataset.model_dump(exclude={"name", "group", "version"}),
        metric=metric or spec.metric,
        mode=mode or spec.mode,
        select=task.select_keys(),
        group=dataset.group,
        order=[d.name for d in spec.datasets].index(dataset.name),
        suite=task.suite,
        report=report,
        checkpoint=backbone.checkpoint,
        execution=execution,
        settings=model.of({**hparams, **execution}, spec.task) if model is not None else None,
        sources=sources,
        pretraining=pretraining,
    )


def pretraining_name(cell: Cell, steps: int) -> str:
    """What a checkpoint that pretraining `cell` makes was pretrained on, as its header states it: the published
    numbers' name where the cell ran the `pretrain` task's default suite with no setting changed by `--set` on a
    data set of OWN_PRETRAINING; else `pretrain:DATASET:STEPS`, with the cell's key where a setting was changed."""
    changed = any(s == SET_SOURCE for k, s in cell.sources.items() if k != "pretraining")
    if cell.suite == "default" and not changed and cell.dataset in OWN_PRETRAINING:
        return OWN_PRETRAINING[cell.dataset]
    return f"pretrain:{cell.dataset}:{steps}" + (f":{cell.key[:12]}" if changed else "")


def _pretraining(backbone: BackboneRef, hparams: dict, sources: dict) -> str:
    """What `backbone`'s weights were pretrained on: RANDOM_INIT without weights (a declaration leaves the
    hyper-parameters: it is about weights), else the declared `pretraining` (kept in the hyper-parameters, so
    in the key), which may not contradict what the weights state, else their statement ('' where none)."""
    declared = hparams.get("pretraining")
    if backbone.sha256 == RANDOM_INIT:
        hparams.pop("pretraining", None)
        sources.pop("pretraining", None)
        return RANDOM_INIT
    if declared and backbone.pretraining and declared != backbone.pretraining:
        raise UserError(
            f"backbone {backbone.spec!r}: the checkpoint states its pretraining, {backbone.pretraining!r}, and "
            f"--set pretraining={declared} contradicts it; drop the --set (the checkpoint's own statement is recorded)"
        )
    return declared or backbone.pretraining
