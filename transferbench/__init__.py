"""transferbench: does this change to a ViT's stem or normaliser transfer? Answered with statistics."""
from .backbones import create_backbone, list_backbones

__version__ = "0.1.0"
__all__ = ["create_backbone", "list_backbones", "__version__"]
