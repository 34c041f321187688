"""One way to open a split of a task's dataset entry, for every adapter: an embedded set (the split is
a folder split name such as train800) or a tfds dataset (the split is a tfds split string)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from pydantic import BaseModel, ConfigDict

from ..errors import UserError
from ..spec import SpecError
from . import embedded
from .folder import FolderDataset


class DatasetEntry(BaseModel):
    """The fields every transfer adapter's dataset entry has; adapters add their own (val, classes, ...)."""

    model_config = ConfigDict(extra="forbid")
    name: str
    group: str | None = None
    version: str = ""
    source: Literal["tfds", "embedded"] = "tfds"
    tfds: str | None = None  # tfds name:version (source tfds)
    set: str | None = None  # the embedded set (source embedded), when it differs from `name`
    train: str  # tfds split string (tfds) or folder split name (embedded)
    test: str


def require_tfds_name(where: str, i: int, entry: dict) -> None:
    """A tfds dataset entry (`source: tfds`) names its tfds builder, or the spec stops with one line."""
    if entry.get("source") == "tfds" and not entry.get("tfds"):
        raise SpecError(f"{where}: datasets.{i}.tfds: a tfds dataset needs its tfds name (dataset {entry['name']!r})")


def missing_data(
    what: str, names: list[str], total: int, data_dir=None, *, unit: str = "datasets", export: bool = False
) -> UserError:
    """The one-line error for tfds datasets that are not prepared: which, where they were looked for, how to
    prepare them (with `export`, an export-vtab folder is looked for too), and the embedded suite."""
    from .tfds_source import data_dir as searched

    also = (
        " or run `transferbench data export-vtab --out DIR` where they are prepared and pass --data-dir DIR"
        if export
        else ""
    )
    return UserError(
        f"{what} data missing for {len(names)} of {total} {unit} ({', '.join(names)}): searched {searched(data_dir)} "
        "(from --data-dir, else $TFDS_DATA_DIR, else ~/tensorflow_datasets) for prepared tfds data"
        f"{' and for an export-vtab folder' if export else ''}; prepare them with tfds (pip install "
        "'transferbench[tfds]'; tfds.builder(NAME).download_and_prepare(); imagenet2012 needs the manual download: "
        f"the tars in its manual dir){also}; or try `--suite embedded`, which needs no download"
    )


def with_generator_version(ds):
    """A spec's dataset entry with its embedded generator's version (part of every cell key), from the embedded
    suite's one table of versions; other entries as they are."""
    if getattr(ds, "source", None) != "embedded" or ds.version:
        return ds
    name = getattr(ds, "set", None) or ds.name  # `set:` names the embedded set when the dataset's name differs
    if name not in embedded.VERSIONS:
        raise UserError(
            f"dataset {ds.name!r} has source 'embedded' but the embedded suite has no set {name!r}; "
            f"sets: {', '.join(embedded.VERSIONS)}"
        )
    return ds.model_copy(update={"version": embedded.version(name)})


def open_split(entry: dict, split: str, data_dir=None, label_fn: Callable | None = None, label_rule: str | None = None):
    """`entry`: the dataset's spec fields (name, source, tfds, set). Missing data raises
    DataMissingError (a UserError) naming where it looked."""
    if entry.get("source") == "embedded":
        name = entry.get("set") or entry["name"]
        return embedded.open_set(name, lambda root: FolderDataset(root, name, split))
    from .tfds_source import TfdsDataset

    return TfdsDataset(entry["tfds"], split, label_fn=label_fn, data_dir_=data_dir, label_rule=label_rule)


def missing(entries: list[dict], splits: Callable[[dict], list[str]], data_dir=None, opener=None) -> list[str]:
    """Names of the entries whose splits (`splits(entry)`) do not open."""
    from .folder import DataMissingError

    opener = opener or (lambda e, s: open_split(e, s, data_dir))
    out = []
    for e in entries:
        try:
            for s in splits(e):
                opener(e, s)
        except DataMissingError:
            out.append(e["name"])
    return out
