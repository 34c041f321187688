"""Cells: one unit of work each, identified by a stable hash of what determines its result."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Callable

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


def split_backbone(spec: str) -> tuple[str, str]:
    """`NAME[@CHECKPOINT]` -> (name, checkpoint or ''), the name checked against the installed families
    (unknown names fail here with close matches)."""
    from ..backbones.registry import find_family

    name, _, checkpoint = spec.partition("@")
    find_family(name)
    return name, checkpoint


def resolve_backbone(spec: str, named: Callable[[str, str], Path | None] | None = None) -> BackboneRef:
    """Check the name and hash the checkpoint (no model is built). `named(name, word)` maps a checkpoint
    word that is not a file (`embedded`) to a path, or returns None; the engine knows no such words: the
    caller that does passes them in (transferbench.adapters.resolve_backbone: on-demand pretraining)."""
    name, checkpoint = split_backbone(spec)
    if not checkpoint:
        return BackboneRef(spec, name, None, RANDOM_INIT)
    path = named(name, checkpoint) if named else None
    if path is not None:
        return BackboneRef(spec, name, str(path), file_sha256(path))
    if not Path(checkpoint).is_file():
        raise UserError(f"backbone {spec!r}: checkpoint {checkpoint} does not exist "
                        f"(NAME@PATH takes a .safetensors, .pth or big_vision .npz file; NAME@embedded "
                        f"pretrains on the embedded suite)")
    return BackboneRef(spec, name, checkpoint, file_sha256(checkpoint))


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

    IDENTITY = ("task", "dataset", "backbone", "checkpoint_sha256", "hparams", "seed", "protocol_version",
                "stage", "data_version", "dataset_config")

    @property
    def key(self) -> str:
        from ..reporting.aggregate import digest
        return digest({k: getattr(self, k) for k in self.IDENTITY}, 20)

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
