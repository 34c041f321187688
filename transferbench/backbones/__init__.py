"""Backbone registry: baseline ViT, Dual PatchNorm stems and their ablations, Dynamic Token Normalization."""

from .checkpoint import check_checkpoint_file, load_checkpoint, read_checkpoint, save_checkpoint
from .convert import Checkpoint, CheckpointError, convert_big_vision, convert_timm
from .dtn import DynamicTokenNorm
from .registry import (
    GRAMMAR,
    SIZES,
    UnknownBackboneError,
    create_backbone,
    list_backbones,
    parse_name,
    register_backbone,
)
from .stems import STEMS, PatchEmbed
from .vit import VisionTransformer

__all__ = [
    "Checkpoint",
    "CheckpointError",
    "check_checkpoint_file",
    "DynamicTokenNorm",
    "GRAMMAR",
    "PatchEmbed",
    "SIZES",
    "STEMS",
    "UnknownBackboneError",
    "VisionTransformer",
    "convert_big_vision",
    "convert_timm",
    "create_backbone",
    "list_backbones",
    "load_checkpoint",
    "parse_name",
    "read_checkpoint",
    "register_backbone",
    "save_checkpoint",
]
