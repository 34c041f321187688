"""transferbench: does this change to a ViT's stem or normaliser transfer? Answered with statistics."""

__version__ = "0.2.0"  # the one place the version is written (pyproject reads it); CHANGELOG.md says when it changes
__all__ = ["create_backbone", "list_backbones", "__version__"]


def __getattr__(name):  # lazy: `transferbench --help` should not wait for torch
    if name in ("create_backbone", "list_backbones"):
        from . import backbones

        return getattr(backbones, name)
    raise AttributeError(f"module 'transferbench' has no attribute {name!r}")
