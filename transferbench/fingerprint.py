"""Fingerprints of the code and libraries that compute a number: every cache key and every record carries one, so
that a number is never reused across a change of what computes it.

A fingerprint names, for one computation,

- **modules**: each Python module on its path with the sha256 of its syntax tree. The path is the static import
  closure of the computation's root modules: every module they import, at the top or inside a function, and so on
  down (within transferbench; within a plugin's own package; for a lone module such as a `py:` backbone's, the
  modules beside it in its folder). The tree is hashed without docstrings, comments, blank lines or layout, so
  editing prose never changes a fingerprint, and no file time or absolute path enters it: a clean clone, a wheel
  and an editable install of the same code agree.
- **libraries**: the installed versions of the distributions that do the arithmetic on that path (and Python's
  minor version, whose parser reads the trees).

Granularity: a module, not a function (a function-level graph misses calls made through attributes and
registries) and not the package (a package digest would recompute every cache after a reporting edit). The
closure stops at `transferbench.reporting`, `transferbench.cli` and `transferbench.tracking`: they read records (or
the training loop's losses) and render or log them, and compute nothing a record or a cache entry holds
(tests/test_fingerprint.py checks that the compute path takes only report-kind names from reporting).
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import sys
import sysconfig
from dataclasses import dataclass, field
from functools import cache, cached_property, lru_cache
from pathlib import Path

from .hashing import digest

PACKAGE = Path(__file__).resolve().parent
NAME = PACKAGE.name
# layers that turn records into tables, files and tracker entries: never on a computation's path
NOT_COMPUTING = (f"{NAME}.reporting", f"{NAME}.cli", f"{NAME}.tracking")

# the distributions whose versions a computation's fingerprint holds (Python's own minor version always)
# what a run does with a finished cell whose record another code computed (its fingerprint differs from the code's at
# hand): stop before computing anything and say so (the default), compute it again, or keep it (reports then name
# both fingerprints)
STALE = ("stop", "recompute", "keep")
CORE = ("torch", "torchvision", "numpy", "pillow", "timm", "einops", "safetensors")
DATA = ("scikit-learn", "scikit-image", "mlxtend", "matplotlib", "scipy", "tensorflow-datasets", "webdataset")
TEXT = ("open_clip_torch",)
CORRUPT = ("imagecorruptions-imaug", "opencv-python", "opencv-python-headless")


@dataclass(frozen=True)
class CodePath:
    """What computes one kind of cache entry: root modules (their import closure is hashed) and libraries."""

    roots: tuple
    libraries: tuple
    what: str = ""


# Every cache folder of paths.home.CACHES and what computes its entries; the backbone's own code (backbone_code) is
# added where an entry depends on a backbone. tests/test_fingerprint.py fails when a cache kind is missing here.
CACHE_CODE = {
    "embedded": CodePath((), CORE + DATA, "each set's generator module (data.embedded.common.GENERATOR_MODULE)"),
    "features": CodePath(
        (f"{NAME}.engine.features", f"{NAME}.data.sources", f"{NAME}.data.transforms"),
        CORE + DATA,
        "the feature extractor, every data reader, the transforms, the backbone family",
    ),
    "bf16-probe": CodePath(
        (f"{NAME}.engine.precision", f"{NAME}.engine.train"), CORE, "the probe, the training step it times"
    ),
    "checkpoints": CodePath(
        (f"{NAME}.adapters.pretrain",), CORE + DATA, "embedded pretraining (a Ray worker's copies: named by sha256)"
    ),
    "pretrain": CodePath((f"{NAME}.adapters.pretrain",), CORE + DATA, "embedded pretraining (its records)"),
    "corruptions": CodePath(
        (f"{NAME}.data.corruptions", f"{NAME}.data.sources", f"{NAME}.data.transforms"),
        CORE + DATA + CORRUPT,
        "the corruption generator and renderer, the clean data's readers",
    ),
    "classifiers": CodePath(
        (f"{NAME}.adapters.corruption",), CORE + DATA, "the fine-tuning recipe, its data, the backbone family"
    ),
    "lit": CodePath(
        (f"{NAME}.adapters.lit.adapter",), CORE + DATA + TEXT, "the text tower, its training loop, the pair features"
    ),
    "cost-probe": CodePath((f"{NAME}.engine.estimate",), CORE, "the timed training step, the backbone family"),
    "decoded": CodePath(
        (f"{NAME}.engine.resident", f"{NAME}.data.sources", f"{NAME}.data.transforms"),
        CORE + DATA,
        "the decoding and resizing of a training split, its reader",
    ),
}


@dataclass(frozen=True)
class Fingerprint:
    modules: dict = field(default_factory=dict)  # module name -> 16 hex digits of its syntax tree's sha256
    libraries: dict = field(default_factory=dict)  # distribution -> version (None: not installed)

    @cached_property
    def digest(self) -> str:
        return digest({"modules": self.modules, "libraries": self.libraries}, 16)

    def record(self) -> dict:
        """What a record keeps: the digest and what it is made of (for `differences`)."""
        return {"digest": self.digest, "modules": dict(self.modules), "libraries": dict(self.libraries)}


def changed_modules(old: dict, new: dict) -> list[tuple[str, str]]:
    """(module, 'changed' | 'added' | 'gone') for each module whose tree differs between two fingerprints in their
    record form."""
    a, b = old.get("modules", {}), new.get("modules", {})
    how = lambda m: "added" if m not in a else "gone" if m not in b else "changed"  # noqa: E731
    return [(m, how(m)) for m in sorted(set(a) | set(b)) if a.get(m) != b.get(m)]


def differences(old: dict | None, new: dict) -> list[str]:
    """What differs between two fingerprints in their record form: 'transferbench.backbones.vit changed',
    'mymodels added', 'torch 2.14.0 -> 2.14.1'; ['no fingerprint (computed before records held one)'] for `old`
    None."""
    if not old or "modules" not in old:
        return ["no fingerprint (computed before records held one)"]
    out = [f"{m} {how}" for m, how in changed_modules(old, new)]
    la, lb = old.get("libraries", {}), new.get("libraries", {})
    for lib in sorted(set(la) | set(lb)):
        if la.get(lib) != lb.get(lib):
            out.append(f"{lib} {la.get(lib) or 'absent'} -> {lb.get(lib) or 'absent'}")
    return out


def of(roots, libraries=()) -> Fingerprint:
    """The fingerprint of the computation whose code starts at the modules `roots` (dotted names: transferbench's,
    a plugin's, a `py:` backbone's) and whose arithmetic runs in `libraries` (distribution names)."""
    return Fingerprint(closure(tuple(roots)), library_versions(tuple(sorted(set(libraries)))))


def for_cache(kind: str, *roots: str) -> Fingerprint:
    """The fingerprint of a cache entry of `kind` (a folder of paths.home.CACHES), with more `roots` (a backbone's
    code)."""
    path = CACHE_CODE[kind]
    return of((*path.roots, *roots), path.libraries)


def stamp(key: str, fp: Fingerprint) -> str:
    """A cache entry's name: its content key together with the fingerprint of what computes it."""
    return digest({"key": key, "code": fp.digest})


# --- the import closure -----------------------------------------------------------------------------------------


def closure(roots: tuple) -> dict:
    """{module: tree hash} of `roots` and every module they import, as far as the closure goes (module docstring)."""
    out: dict[str, str] = {}
    todo = [(r, _home_of(r)) for r in roots]
    while todo:
        name, home = todo.pop()
        if name in out or _stops(name):
            continue
        path = _locate(name, home)
        if path is None:
            continue  # a name that is no module (an attribute imported from a package): its package is hashed
        tree_hash, imports = _parse(path.read_bytes(), path.name == "__init__.py", name)
        out[name] = tree_hash
        for m in _modules(imports, home):
            top = m.split(".")[0]
            if top == NAME:
                todo.append((m, None))
            elif home is not None and (top == home[1] or (home[2] and _locate(m, home) is not None)):
                todo.append((m, home))  # its own package, or a module beside a lone one
    return dict(sorted(out.items()))


def _modules(imports: tuple, home) -> list[str]:
    """The modules that `imports` ((module, names) pairs) load: `from P import a, b` loads the submodules a and b
    where they are modules, and P's own code only where some name is not a submodule (or for `import P`)."""
    out = []
    for module, names in imports:
        subs = [f"{module}.{n}" for n in names if _locate(f"{module}.{n}", home) is not None]
        out += subs
        if len(subs) < len(names) or not names:
            out.append(module)
    return out


def _stops(name: str) -> bool:
    return any(name == s or name.startswith(s + ".") for s in NOT_COMPUTING)


@cache
def _site_dirs() -> tuple:
    paths = sysconfig.get_paths()
    return tuple(Path(paths[k]).resolve() for k in ("purelib", "platlib") if k in paths)


def _home_of(name: str):
    """(folder, top-level name, whether the folder's other modules count) for a module outside transferbench: its
    own package, or for a lone module the folder beside it (not when that folder is site-packages). None for
    transferbench's."""
    top = name.split(".")[0]
    if top == NAME:
        return None
    spec = sys.modules[top].__spec__ if top in sys.modules else importlib.util.find_spec(top)
    if spec is None or spec.origin is None:
        return None
    origin = Path(spec.origin).resolve()
    if spec.submodule_search_locations:  # a package: its own modules
        return (origin.parent.parent, top, False)
    folder = origin.parent
    return (folder, top, folder not in _site_dirs())


def _locate(name: str, home) -> Path | None:
    """The file of module `name`: transferbench's (home None; its layout is fixed for the life of the process, so
    the answer is remembered) or one under an outside root's `home` folder (looked up each time)."""
    return _locate_own(name) if home is None else _find(name, home[0])


@cache
def _locate_own(name: str) -> Path | None:
    return _find(name, PACKAGE.parent)


def _find(name: str, base: Path) -> Path | None:
    parts = name.split(".")
    for candidate in (base.joinpath(*parts).with_suffix(".py"), base.joinpath(*parts, "__init__.py")):
        if candidate.is_file():
            return candidate
    return None


@lru_cache(maxsize=4096)
def _parse(source: bytes, is_package: bool, name: str) -> tuple[str, tuple]:
    """(16 hex digits of the sha256 of the syntax tree without docstrings, what it imports as (absolute module,
    names) pairs)."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                if isinstance(body[0].value.value, str):
                    node.body = body[1:] or [ast.Pass()]
    package = name.split(".") if is_package else name.split(".")[:-1]
    imports = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imports += [(a.name, ()) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            imports.append((module, tuple(a.name for a in node.names if a.name != "*")))
    tree_hash = hashlib.sha256(ast.dump(tree).encode()).hexdigest()[:16]
    return tree_hash, tuple(dict.fromkeys(i for i in imports if i[0]))


# --- libraries ----------------------------------------------------------------------------------------------------


@lru_cache(maxsize=64)
def library_versions(names: tuple) -> dict:
    """{distribution: installed version or None}, with Python's minor version; read once per process (an upgrade
    under a running process is not seen, as the process keeps the old code loaded anyway)."""
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": ".".join(map(str, sys.version_info[:2]))}
    for n in names:
        try:
            out[n] = version(n)
        except PackageNotFoundError:
            out[n] = None
    return out
