"""The acceptance ledger: the changes that move the nightly's numbers on purpose, declared in the repository beside
the anchor they are judged against (`results/nightly/ACCEPTED.yaml`; docs/regression.md#the-acceptance-ledger).

Each entry names what changed, as it is after the change, and why:
- `code`: modules at their new code fingerprint (the sha256 of the module's syntax tree, as records hold it). A cell
  whose outputs changed passes when every module that changed in its fingerprint is accepted *at the hash tonight's
  record holds*: a second change of the same module has another hash and fails, against the anchor and against any
  rolling baseline, on every runner kind. No commit is named, so squash and rebase merges change nothing.
- `protocol`: settings at their new value (`TASK:SETTING: VALUE`). A protocol change passes where its new value is
  the accepted one.
`transferbench accept --code MODULE --why "..."` writes an entry with the modules' current fingerprints;
`transferbench reanchor` empties the ledger. An entry that matches nothing tonight is listed in the report.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

from ..errors import UserError

LEDGER = "ACCEPTED.yaml"
EMPTY = """\
# The acceptance ledger of this anchor (docs/regression.md#the-acceptance-ledger): changes that move the nightly's
# numbers on purpose, made since these records, each as it is after the change. Write an entry with
#   transferbench accept --code backbones.dtn --why "..."          (the module at its current code fingerprint)
#   transferbench accept --protocol fewshot:pool=tok --why "..."   (a setting at its new value)
# `transferbench nightly` and `regress` honour an entry against any baseline; a second change of the same module
# has another fingerprint and fails. `transferbench reanchor` empties it.
#
# accepted:
#   - code: {transferbench.backbones.dtn: 929030bf62b3d707}   # module: its code fingerprint after the change
#     protocol: {"fewshot:pool": tok}                          # TASK:SETTING: its value after the change
#     why: DTN's backward as one Gram product per head; only DTN backbones' cells move
accepted: []
"""
_HASH = "0123456789abcdef"


@dataclass(frozen=True)
class Entry:
    code: tuple = ()  # (module, tree hash)
    protocol: tuple = ()  # (TASK:SETTING, value)
    why: str = ""

    @property
    def names(self) -> list[str]:
        return [f"{m}@{h}" for m, h in self.code] + [f"{s}={v}" for s, v in self.protocol]


@dataclass
class AcceptanceLedger:
    path: Path | None
    entries: list = field(default_factory=list)

    def accepts(self) -> tuple[list, list, list[str]]:
        """(protocol changes for `--accept`, as TASK:SETTING=VALUE; modules for `--accept-code`, as MODULE@HASH;
        report lines)."""
        protocol = [f"{s}={v}" for e in self.entries for s, v in e.protocol]
        code = [f"{m}@{h}" for e in self.entries for m, h in e.code]
        return protocol, code, [f"- {', '.join(e.names)} ({e.why})" for e in self.entries]

    def unused(self, gate) -> list[str]:
        """The entries that matched nothing in `gate` (gate.decide.Gate): no accepted cell changed by one of its
        modules at its hash, no protocol change to its value."""
        used_code = {c.split(" ")[0] for x in gate.exact.changed if x.accepted for c in x.causes}
        used_code |= set(gate.accepted_modules)  # accepted where the statistical tier judged the cells
        used_protocol = {(f"{p.task}:{p.setting}", p.after) for p in gate.protocol if p.accepted}
        out = []
        for e in self.entries:
            if not any(m in used_code for m, _ in e.code) and not any(p in used_protocol for p in e.protocol):
                out.append(f"- {', '.join(e.names)} ({e.why})")
        return out


def load(path: Path) -> AcceptanceLedger:
    """The ledger at `path` (a file, or a records folder holding ACCEPTED.yaml); an empty one where there is none.
    A ledger that does not parse, or an entry without a change or a reason, is one line and exit 2."""
    path = Path(path)
    if path.is_dir():
        path = path / LEDGER
    if not path.is_file():
        return AcceptanceLedger(None)
    try:
        doc = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise UserError(f"{path}: not a readable YAML ledger ({str(e).splitlines()[0]}); fix it or empty it") from None
    items = doc.get("accepted") if isinstance(doc, dict) else None
    if items is None:
        items = [] if isinstance(doc, dict) and "accepted" in doc else None
    if not isinstance(items, list):
        raise UserError(f"{path}: give `accepted:` a list of entries (code and/or protocol, why)")
    entries = []
    for i, item in enumerate(items, 1):
        where = f"{path}: entry {i}"
        if isinstance(item, dict) and "commit" in item:
            raise UserError(
                f"{where}: an entry names what changed, not a commit (squash merges lose commits); write it with "
                "`transferbench accept --code MODULE --why ...`"
            )
        if not isinstance(item, dict) or set(item) - {"code", "protocol", "why"}:
            raise UserError(f"{where}: give code and/or protocol, and why (nothing else)")
        code = tuple(_code(item.get("code"), where))
        protocol = tuple(_protocol(item.get("protocol"), where))
        if not code and not protocol:
            raise UserError(
                f"{where}: name what changes: code ({{MODULE: HASH}}) or protocol ({{TASK:SETTING: VALUE}})"
            )
        why = str(item.get("why") or "").strip()
        if not why:
            raise UserError(f"{where}: say why the change is meant (why: ...)")
        entries.append(Entry(code, protocol, why))
    return AcceptanceLedger(path, entries)


def _code(value, where: str) -> list:
    if value is None:
        return []
    if not isinstance(value, dict):
        raise UserError(
            f"{where}: code must map each module to its code fingerprint (write it with `transferbench accept --code "
            "MODULE --why ...`)"
        )
    out = []
    for module, h in value.items():
        h = str(h).strip().lower()
        if not isinstance(module, str) or len(h) != 16 or set(h) - set(_HASH):
            raise UserError(f"{where}: code {module}: {h!r} is not a code fingerprint (16 hex digits)")
        name = module.strip()
        out.append((_full(name), h))
    return out


def _full(module: str) -> str:
    """A module as records name it: with `transferbench.` where it is one of this package's."""
    from importlib.util import find_spec

    if module.startswith("transferbench."):
        return module
    try:
        return f"transferbench.{module}" if find_spec(f"transferbench.{module}") is not None else module
    except (ImportError, ValueError):
        return module


def _protocol(value, where: str) -> list:
    if value is None:
        return []
    if not isinstance(value, dict):
        raise UserError(f'{where}: protocol must map TASK:SETTING to its new value, e.g. {{"fewshot:pool": tok}}')
    out = []
    for name, v in value.items():
        if not isinstance(name, str) or name.count(":") != 1 or not all(name.split(":")):
            raise UserError(f"{where}: protocol {name!r}: name a setting as TASK:SETTING")
        from .keys import value_text

        out.append((name.strip(), value_text(v)))
    return out


def fingerprints(modules: list[str]) -> dict:
    """{full module name: its code fingerprint now}, a package naming every module under it; a name that is no
    module is one line, exit 2."""
    import pkgutil
    from importlib.util import find_spec

    from ..fingerprint import closure

    out = {}
    for name in modules:
        full = _full(name.strip())
        try:
            spec = find_spec(full)
        except (ImportError, ValueError):
            spec = None
        if spec is None:
            raise UserError(f"--code {name}: no such module (give one as records name it, e.g. backbones.dtn)")
        names = [full]
        if spec.submodule_search_locations:  # a package: every module in it, nested packages' too
            names += [m.name for m in pkgutil.walk_packages(spec.submodule_search_locations, prefix=f"{full}.")]
        for n in names:
            h = closure((n,)).get(n)
            if h:
                out[n] = h
    return out


def add(path: Path, code: list[str], protocol: list[str], why: str) -> str:
    """Append an entry to the ledger at `path` (a file or a records folder): `code` modules at their current
    fingerprints, `protocol` as TASK:SETTING=VALUE. Returns the entry as written."""
    path = Path(path)
    if path.is_dir():
        path = path / LEDGER
    if not why.strip():
        raise UserError("--why: say why the change is meant")
    if not code and not protocol:
        raise UserError("name what changed: --code MODULE and/or --protocol TASK:SETTING=VALUE")
    settings = {}
    for p in protocol:
        name, eq, v = p.partition("=")
        if not eq or name.count(":") != 1 or not all(name.split(":")):
            raise UserError(f"--protocol {p}: give TASK:SETTING=VALUE, e.g. fewshot:pool=tok")
        settings[name] = yaml.safe_load(v) if v else v
    load(path)  # a damaged ledger is refused before it is written to
    entry = {**({"code": fingerprints(code)} if code else {}), **({"protocol": settings} if settings else {})}
    entry["why"] = why.strip()
    text = path.read_text() if path.is_file() else EMPTY
    doc = yaml.safe_load(text) or {}
    items = list(doc.get("accepted") or [])
    items.append(entry)
    header = "".join(line + "\n" for line in text.splitlines() if line.startswith("#"))
    path.write_text(header + yaml.safe_dump({"accepted": items}, sort_keys=False))
    load(path)
    return yaml.safe_dump([entry], sort_keys=False)


def empty(path: Path) -> None:
    """Write an empty ledger (its header says how to fill it) at `path` (a file or a records folder)."""
    path = Path(path)
    (path / LEDGER if path.is_dir() else path).write_text(EMPTY)
