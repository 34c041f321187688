"""Cells: one unit of work each, identified by a stable hash of what determines its result."""
from __future__ import annotations

import hashlib
import sys
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path

from ..errors import UserError

RANDOM_INIT = "random-init"  # checkpoint identity of a backbone without weights


@dataclass(frozen=True)
class BackboneRef:
    """`NAME` or `NAME@CHECKPOINT` as given on the command line, resolved to a name and weights hash."""
    spec: str
    name: str
    checkpoint: str | None
    sha256: str


def file_sha256(path) -> str:
    p = Path(path).resolve()
    st = p.stat()
    return _sha256_cached(str(p), st.st_size, st.st_mtime_ns)


@lru_cache(maxsize=64)
def _sha256_cached(path: str, size: int, mtime_ns: int) -> str:
    from ..data.folder import sha256_file  # size and mtime only key the cache
    return sha256_file(Path(path))


def resolve_backbone(spec: str) -> BackboneRef:
    """Check the name against the installed families and hash the checkpoint (no model is built)."""
    from ..backbones.registry import find_family

    name, _, checkpoint = spec.partition("@")
    find_family(name)  # unknown names fail here with close matches
    if not checkpoint:
        return BackboneRef(spec, name, None, RANDOM_INIT)
    if checkpoint in PRETRAINED:
        path = pretrained_checkpoint(name, checkpoint)
        return BackboneRef(spec, name, str(path), file_sha256(path))
    if not Path(checkpoint).is_file():
        raise UserError(f"backbone {spec!r}: checkpoint {checkpoint} does not exist "
                        f"(NAME@PATH takes a .safetensors, .pth or big_vision .npz file; NAME@embedded "
                        f"pretrains on the embedded suite)")
    return BackboneRef(spec, name, checkpoint, file_sha256(checkpoint))


PRETRAINED = {"embedded": "embedded"}  # NAME@<this> -> the pretrain task's suite that makes the weights
PRETRAIN_SETS: tuple = ()  # --set overrides for that suite (tests shorten it; users keep the spec's)
# checkpoints of the pretrain task that ship with the package, named {backbone}-{dataset}-{cell key}
SHIPPED = Path(__file__).resolve().parent.parent / "weights"


def pretrained_checkpoint(name: str, source: str, *, show_progress: bool = True) -> Path:
    """The checkpoint of task `pretrain` (suite `source`) for backbone `name`: the one shipped in
    transferbench/weights when its cell key matches (same profile, data and protocol version), else
    the record's, pretraining first when the record is missing (a record is reused, as for any cell)."""
    from ..adapters import get_adapter, prepare_task
    from ..data.embedded import home
    from ..reporting.records import RecordStore
    from .runner import Results, run_task

    task = prepare_task("pretrain", suite=PRETRAINED[source], sets=PRETRAIN_SETS)
    out = home() / "pretrain"
    ref = BackboneRef(name, name, None, RANDOM_INIT)
    store = RecordStore(out)
    (cell,) = [c for c in get_adapter("pretrain").plan(task, ref, Results(store)) if c.stage == "final"]
    shipped = SHIPPED / f"{name}-{cell.dataset}-{cell.key}.safetensors"
    if shipped.is_file():  # made by exactly this cell (same profile, data version and code protocol)
        return shipped
    if show_progress:
        print(f"{name}@{source}: no shipped checkpoint for this pretraining profile; pretraining it now "
              f"(the record under {out} is reused afterwards)", file=sys.stderr)
    run_task(task, [ref], out, show_progress=show_progress)
    rec = store.get(cell)
    if rec is None or rec["status"] != "ok":
        why = rec["reason"] if rec else "no record"
        raise UserError(f"pretraining {name} on the {source} suite did not finish ({why}); see {store.path(cell)}")
    path = Path(rec["info"]["checkpoint"])
    if not path.is_file() or file_sha256(path) != rec["info"]["checkpoint_sha256"]:
        raise UserError(f"checkpoint {path} of {name}@{source} is missing or changed; delete {store.path(cell)} "
                        f"and rerun to pretrain again")
    return path


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
    checkpoint: str | None = field(default=None, compare=False)

    IDENTITY = ("task", "dataset", "backbone", "checkpoint_sha256", "hparams", "seed", "protocol_version",
                "stage", "data_version", "dataset_config")

    @property
    def key(self) -> str:
        from ..reporting.aggregate import canon
        ident = {k: getattr(self, k) for k in self.IDENTITY}
        return hashlib.sha256(canon(ident).encode()).hexdigest()[:20]

    def to_dict(self) -> dict:
        d = asdict(self)
        d["select"] = list(self.select)
        return d

    def __hash__(self):
        return hash(self.key)

    def __eq__(self, other):
        return isinstance(other, Cell) and other.key == self.key


def make_cell(task, dataset, backbone: BackboneRef, hparams: dict, seed: int, stage: str = "") -> Cell:
    """A cell of resolved `task` (adapters/spec.Task) with the report fields filled in from its spec."""
    spec = task.spec
    return Cell(task=spec.task, dataset=dataset.name, backbone=backbone.spec, checkpoint_sha256=backbone.sha256, hparams=dict(hparams), seed=int(seed),
                protocol_version=spec.protocol_version, stage=stage, data_version=dataset.version,
                dataset_config=dataset.model_dump(exclude={"name", "group", "version"}),
                metric=spec.metric, mode=spec.mode, select=task.select_keys(), group=dataset.group,
                order=[d.name for d in spec.datasets].index(dataset.name), suite=task.suite,
                checkpoint=backbone.checkpoint)
