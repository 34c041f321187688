"""`--set KEY=VALUE` on a task's resolved settings (spec.resolve): each value parsed as the type of the spec's own
value for that key, into the fixed settings or the sweep."""

from __future__ import annotations

import math

import yaml

from .errors import UserError, close_matches

_NULL = ("null", "none", "~")


def _kind(value) -> str:
    if isinstance(value, bool):
        return "bool"
    return {int: "int", float: "float", str: "str", list: "list", dict: "dict"}.get(type(value), "any")


def parse_override(key: str, text: str, like, *, nullable: bool = False):
    """One `--set` value as the type of the spec's value `like` (int, float, bool, text, list): a number
    written 1e-3 is a float, `256` for a float is 256.0 (the same cell key as the spec's 256.0), `on` for
    a text setting stays 'on'. Anything else is one UserError naming the key, what it got and what it
    takes; `null` is accepted where the spec itself has null for that key."""

    def bad(expected: str):
        return UserError(f"--set {key}={text}: expected {expected} (the spec has {key}: {like!r})")

    if nullable and text.strip().lower() in _NULL:
        return None
    kind = _kind(like)
    if kind == "bool":
        value = yaml.safe_load(text) if text.strip() else None
        if not isinstance(value, bool):
            raise bad("true or false")
        return value
    if kind in ("int", "float"):
        try:
            number = float(text)
        except ValueError:
            raise bad("an integer" if kind == "int" else "a number") from None
        if not math.isfinite(number) or (kind == "int" and not number.is_integer()):
            raise bad("an integer" if kind == "int" else "a finite number")
        return int(number) if kind == "int" else number
    if kind == "str":
        if not text:
            raise bad("a value")
        return text
    if kind == "list":
        element = like[0] if like else None
        return [parse_override(key, t.strip(), element) for t in text.split(",") if t.strip()]
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        raise bad("a YAML value") from None
    if kind == "dict" and not isinstance(value, dict):
        raise bad("a mapping")
    return value


def apply_set(item: str, spec, hparams: dict, sweep: dict, model, settable: list) -> None:
    """One `--set KEY=VALUE` of a task `spec` into the suite's `hparams` (a fixed setting; one whose default is not
    part of the key, `settable` by the settings `model`, becomes one) or `sweep` (a comma-separated list), parsed as
    the type of the spec's value (`parse_override`); anything else is one UserError naming the fix."""
    key, sep, text = item.partition("=")
    if not sep or not key:
        raise UserError(f"--set expects key=value, got {item!r}")
    # the type to parse into: this suite's value, else the spec's or another suite's (one may be null)
    fixed = [hparams, spec.hparams, *(x.hparams for x in spec.suites.values())]
    swept = [sweep, spec.sweep, *(x.sweep for x in spec.suites.values())]
    seen = [d[key] for d in fixed if key in d] + [v for d in swept for v in d.get(key, [])]
    unkeyed = key in settable and key not in hparams and key not in sweep
    if unkeyed:  # a setting whose default is not part of the key: --set makes it one
        seen.append(model.default_of(key))
    like = next((v for v in seen if v is not None), None)
    nullable = any(v is None for v in seen)
    if key in sweep:
        sweep[key] = [parse_override(key, t.strip(), like) for t in text.split(",") if t.strip()]
        if not sweep[key]:
            raise UserError(f"--set {key}={text}: a sweep needs at least one value, e.g. --set {key}={like}")
    elif key in hparams or unkeyed:
        hparams[key] = parse_override(key, text, like, nullable=nullable)
    else:
        known = sorted(set(hparams) | set(sweep) | set(settable))
        raise UserError(
            f"--set {key}: task {spec.task!r} has no hyper-parameter {key!r}"
            f"{close_matches(key, known)}; known: {', '.join(known)}"
        )
