"""Which weights a backbone reference names: `NAME` (random initialisation), `NAME@FILE` (a checkpoint file),
or `NAME@WORD` where an installed weights provider knows WORD. Providers register under the entry-point group
`transferbench.weights` as `WORD = "module:function"`, `function(name) -> Path` of a checkpoint (the pretrain
adapter provides `embedded`: it pretrains on demand, or uses the checkpoint that ships with the package)."""

from __future__ import annotations

from pathlib import Path

from ..cell import RANDOM_INIT, BackboneRef
from ..errors import UserError
from ..hashing import file_sha256
from ..names import parse
from ..plugins import load_group

GROUP = "transferbench.weights"


def providers() -> dict:
    """WORD -> function(name) -> checkpoint path, for every installed provider."""
    return load_group(GROUP)


def split_backbone(spec: str) -> tuple[str, str]:
    """`NAME[@CHECKPOINT]` -> (name, checkpoint or ''), the name checked against the installed families
    (unknown names fail here with close matches)."""
    from .registry import find_family

    name, checkpoint = _parts(spec)
    find_family(name)
    return name, checkpoint


def _parts(spec: str) -> tuple[str, str]:
    """`NAME[@CHECKPOINT]` -> (name, checkpoint or ''); `NAME@` (an empty variable in a script) is refused,
    never taken for random init."""
    name, checkpoint, at = parse(spec)
    if at and not checkpoint:
        raise UserError(
            f"backbone {spec!r}: nothing after '@'; give NAME@PATH or NAME@WORD, or NAME alone for random init"
        )
    return name, checkpoint


def resolve_backbone(spec: str) -> BackboneRef:
    """Check the name and hash the checkpoint (no model is built); a provider's word is resolved by its
    provider, which may pretrain."""
    from .registry import find_family

    name, checkpoint = _parts(spec)
    family = find_family(name)  # unknown names fail here with close matches, as in split_backbone
    if hasattr(family, "resolve"):  # a family that knows its own weights (timm: its tags' Hugging Face cache)
        return family.resolve(spec, name, checkpoint)
    if not checkpoint:
        return BackboneRef(spec, name, None, RANDOM_INIT, pretraining=RANDOM_INIT)
    words = providers()
    if checkpoint in words:
        path = Path(words[checkpoint](name))
        return BackboneRef(spec, name, str(path), file_sha256(path), _pixels(path), pretraining=_pretraining(path))
    if not Path(checkpoint).is_file():
        raise UserError(
            f"backbone {spec!r}: checkpoint {checkpoint} does not exist (NAME@PATH takes a .safetensors, "
            ".pth or big_vision .npz file; NAME@WORD takes the word of an installed weights provider: "
            f"{', '.join(sorted(words)) or 'none installed'})"
        )
    return BackboneRef(
        spec, name, checkpoint, file_sha256(checkpoint), _pixels(checkpoint), pretraining=_pretraining(checkpoint)
    )


def _pixels(path) -> str:
    """The normalisation a checkpoint file states ('' where it states none, or is not one this package reads)."""
    from .checkpoint import CheckpointError, checkpoint_pixels

    try:
        return checkpoint_pixels(path) or ""
    except CheckpointError:
        return ""


def _pretraining(path) -> str:
    """What a checkpoint file states it was pretrained on ('' where it states nothing this package reads)."""
    from .checkpoint import CheckpointError, checkpoint_pretraining

    try:
        return checkpoint_pretraining(path)
    except CheckpointError:
        return ""
