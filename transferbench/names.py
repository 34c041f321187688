"""The grammar of a backbone reference, in one place: `NAME[@WEIGHTS]`. NAME builds the model (`b32_dpn`,
`timm:vit_base_patch16_224.augreg_in21k`, `py:module:factory`); WEIGHTS, after the first `@`, names its weights (a
file, or a weights provider's word such as `embedded`); without it the model is randomly initialised. Text only:
every layer reads it, reports included."""

from __future__ import annotations

from typing import NamedTuple


class BackboneName(NamedTuple):
    name: str  # what builds the model
    weights: str  # what follows the first '@' ('' for random init)
    at: bool  # whether the reference has an '@' (`NAME@` with nothing after it is an error its readers name)


def parse(spec: str) -> BackboneName:
    """`NAME[@WEIGHTS]` -> (name, weights, whether an '@' was written)."""
    name, at, weights = spec.partition("@")
    return BackboneName(name, weights, bool(at))


def model_name(spec: str) -> str:
    """The part of `NAME[@WEIGHTS]` that builds the model: `mu4_dpn` of `mu4_dpn@embedded`."""
    return parse(spec).name
