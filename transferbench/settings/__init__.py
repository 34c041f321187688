"""Typed task settings, one model per protocol with every setting's paper default, source, allowed values and
meaning (base.Settings). They import no torch: `transferbench list tasks --show`, the spec loader and docs/settings.md
read them without loading the adapters that run them. Each adapter names its model (`Adapter.settings`), and the
`transferbench.settings` entry point registers it under the adapter's name for those torch-free lookups."""

from .base import (
    BF16,
    BF16_HELP,
    BF16_SOURCE,
    EXECUTION,
    PIXELS_HELP,
    Settings,
    markdown_table,
    setting,
    settings_markdown,
    settings_table,
)

__all__ = [
    "BF16",
    "BF16_HELP",
    "BF16_SOURCE",
    "EXECUTION",
    "PIXELS_HELP",
    "Settings",
    "markdown_table",
    "setting",
    "settings_markdown",
    "settings_table",
]
