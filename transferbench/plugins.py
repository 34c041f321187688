"""Entry-point plugins. Built-in adapters, backbones and task specs register the same way (pyproject)."""

from __future__ import annotations

from functools import cache
from importlib.metadata import entry_points

from .errors import UserError


@cache
def load_group(group: str) -> dict[str, object]:
    """name -> loaded object for every installed entry point of `group` (first one wins on clashes)."""
    found = {}
    for ep in entry_points(group=group):
        if ep.name not in found:
            found[ep.name] = _load(ep, group)
    if group != "transferbench.adapters" and not found:
        raise UserError(f"no {group} entry points: transferbench is not installed; run `pip install -e .`")
    return found


@cache
def load_one(group: str, name: str) -> object | None:
    """The object of entry point `name` in `group` (the first one installed), None where there is none: loads that
    entry point alone, so that looking one up imports only its own module."""
    for ep in entry_points(group=group, name=name):
        return _load(ep, group)
    return None


def _load(ep, group: str):
    try:
        return ep.load()
    except Exception as e:  # noqa: BLE001 - a broken plugin must say which one it is
        raise UserError(f"plugin {ep.name!r} ({group} = {ep.value}) failed to load: {type(e).__name__}: {e}") from e
