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
        return _checkpoint_ref(spec, name, path)
    if not Path(checkpoint).is_file():
        raise UserError(
            f"backbone {spec!r}: checkpoint {checkpoint} does not exist (NAME@PATH takes a .safetensors, "
            ".pth or big_vision .npz file; NAME@WORD takes the word of an installed weights provider: "
            f"{', '.join(sorted(words)) or 'none installed'})"
        )
    return _checkpoint_ref(spec, name, checkpoint)


def _checkpoint_ref(spec: str, name: str, path) -> BackboneRef:
    """The reference to checkpoint file `path`: its sha256, and the pixel normalisation and pretraining it states
    ('' where it states none, or is not a file this package reads)."""
    from .checkpoint import CheckpointError, checkpoint_pixels, checkpoint_pretraining

    try:
        pixels, pretraining = checkpoint_pixels(path) or "", checkpoint_pretraining(path)
    except CheckpointError:
        pixels, pretraining = "", ""
    return BackboneRef(spec, name, str(path), file_sha256(path), pixels, pretraining=pretraining)
