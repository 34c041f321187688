"""The package imports in one direction (docs/architecture.md): every import, function-level ones included,
points to the same layer or a lower one, and no set of modules imports itself round, through a package's
__init__ or not. Importing `a.b.c` runs `a/__init__` and `a/b/__init__` first, so a module that imports a
submodule depends on its packages too."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "transferbench"

# lowest first; a module belongs to the first entry that is its name or a package above it
LAYERS = [
    (
        "ground floor",
        ("errors", "hashing", "names", "git", "fingerprint", "machine", "arithmetic", "paths", "plugins", "weights"),
    ),
    ("contracts", ("cell", "overrides", "spec", "records", "settings")),
    ("gate", ("gate",)),
    ("models and data", ("backbones", "data")),
    ("reporting", ("reporting",)),
    ("tracking", ("tracking",)),
    ("engine", ("engine",)),
    ("adapters", ("adapters",)),
    # "" = the package itself: a lazy facade that imports nothing at load
    ("front", ("workflows", "night", "anchor", "cli", "__main__", "")),
]


def modules() -> dict[str, Path]:
    out = {}
    for p in ROOT.rglob("*.py"):
        parts = ["transferbench", *p.relative_to(ROOT).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def layer(module: str) -> int:
    rest = module.split(".")[1:]
    for i, (_, names) in enumerate(LAYERS):
        if (rest[0] if rest else "") in names:
            return i
    raise AssertionError(f"{module} is in no layer: add its top-level name to LAYERS and to docs/architecture.md")


def imports(mods: dict[str, Path], unresolved: list | None = None) -> dict[str, set[str]]:
    """module -> the package modules it imports, anywhere in its body, with the packages they live in; an import
    of a package module that does not exist goes to `unresolved` (a relative import written for another place)."""
    edges = {}
    for name, path in mods.items():
        is_pkg = path.name == "__init__.py"
        here = name.split(".") if is_pkg else name.split(".")[:-1]
        found = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = []
            if isinstance(node, ast.ImportFrom):
                base = here[: len(here) - node.level + 1] if node.level else []
                mod = ".".join(base + ([node.module] if node.module else []))
                targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in mods else mod for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            own = {".".join(name.split(".")[:k]) for k in range(1, len(name.split(".")))}  # loading already
            for t in targets:
                parts = t.split(".")
                if parts[0] != "transferbench":
                    continue
                if t not in mods and unresolved is not None:
                    unresolved.append(f"{name}: {t}")
                # the module named, and the packages above it that are not already loading this one (the root
                # package is a facade that imports nothing at load)
                above = {".".join(parts[:k]) for k in range(2, len(parts))} - own
                found |= ({t} | above) & set(mods)
        edges[name] = found - {name}
    return edges


UNRESOLVED: list = []
EDGES = imports(modules(), UNRESOLVED)


def test_every_package_import_names_a_module():
    assert not UNRESOLVED, "imports of modules that do not exist: " + "; ".join(UNRESOLVED)


def test_every_module_has_a_layer():
    for m in EDGES:
        layer(m)


def test_no_upward_import():
    upward = sorted(
        f"{m} ({LAYERS[layer(m)][0]}) imports {t} ({LAYERS[layer(t)][0]})"
        for m, ts in EDGES.items()
        for t in ts
        if layer(t) > layer(m) and not m.startswith(t + ".")
    )
    assert not upward, "\n".join(upward)


def strongly_connected(edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm: the sets of modules that reach each other (cycles), each sorted."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    # a package's __init__ that imports its own submodules is how a package shows its API; a cycle is a
    # submodule that imports its package back by name (or any longer loop)
    cycles = strongly_connected(EDGES)
    assert not cycles, "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


@pytest.mark.parametrize(
    "edges, expected",
    [
        ({"a": {"b"}, "b": {"a"}}, [["a", "b"]]),
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
        ({"a": {"b"}, "b": set()}, []),
    ],
)
def test_the_cycle_finder_finds_cycles(edges, expected):
    assert strongly_connected(edges) == expected


def test_the_import_walker_sees_function_level_imports_and_packages(tmp_path, monkeypatch):
    pkg = tmp_path / "transferbench"
    (pkg / "engine").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "engine" / "__init__.py").write_text("")
    (pkg / "engine" / "runner.py").write_text("def f():\n    from ..adapters.vtab import X\n")
    (pkg / "adapters").mkdir()
    (pkg / "adapters" / "__init__.py").write_text("from .vtab import X\n")
    (pkg / "adapters" / "vtab.py").write_text("from ..engine.runner import f\n")
    mods = {
        ".".join(["transferbench", *p.relative_to(pkg).with_suffix("").parts]).removesuffix(".__init__"): p
        for p in pkg.rglob("*.py")
    }
    unresolved = []
    edges = imports(mods, unresolved)
    assert unresolved == []
    (pkg / "engine" / "train.py").write_text("def g():\n    from ..spec import Task\n")  # no transferbench/spec.py
    imports({**mods, "transferbench.engine.train": pkg / "engine" / "train.py"}, unresolved)
    assert unresolved == ["transferbench.engine.train: transferbench.spec"]
    assert edges["transferbench.engine.runner"] == {"transferbench.adapters", "transferbench.adapters.vtab"}
    assert edges["transferbench.adapters.vtab"] == {"transferbench.engine", "transferbench.engine.runner"}
    assert strongly_connected(edges) == [
        ["transferbench.adapters", "transferbench.adapters.vtab", "transferbench.engine.runner"]
    ]


@pytest.mark.parametrize(
    "argv, shown, plugin",
    [
        (["report", "RUNS"], "mini_digits", False),
        (["report", "RUNS"], "mini_digits", True),
        (["list", "tasks"], "toy", True),
        (["list", "suites"], "toy", True),
        (["list", "tasks", "--show", "all"], "init_head_bias", True),  # every built-in task's settings
        (["regress", "--baseline", "RUNS", "--current", "RUNS"], "OK", False),
    ],
)
def test_listing_and_reporting_load_no_torch(argv, shown, plugin):
    """Reporting sits below the engine and the models: `transferbench report` and `regress` read records without
    torch. `list tasks` and `list suites` read the specs' names, suites and data sets, and `list tasks --show` their
    settings (transferbench.settings, found through the `transferbench.settings` entry points, not the adapters).
    `report` loads every installed report kind and task package: with the tests' toy plugin on the path (its adapter
    imports torch, its specs and report kind do not) it still imports no torch."""
    import os
    import subprocess
    import sys

    argv = [str(ROOT.parent / "results" / "runs") if a == "RUNS" else a for a in argv]
    code = (
        "import sys, io, contextlib\nfrom transferbench.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()) as out:\n    assert main(sys.argv[1:]) == 0\n"
        f"assert {shown!r} in out.getvalue()\n"  # the records were read; the plugin's task was listed
        "print(sorted(m for m in ('torch', 'torchvision', 'timm') if m in sys.modules))"
    )
    env = os.environ if plugin else {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, check=True, env=env)
    assert out.stdout.strip() == "[]"


def test_reporting_renders_and_computes_no_statistics_of_its_own():
    """Every test, interval and p-value lives in records.stats: a reporting module that imports scipy (or a test
    from it) has grown a statistic of its own."""
    own = []
    for name, path in modules().items():
        if not name.startswith(("transferbench.reporting", "transferbench.cli")) and name != "transferbench.workflows":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
                own += [f"{name}: {n}" for n in names if n.split(".")[0] in ("scipy", "statsmodels")]
    assert own == []
    # the check sees what it looks for: records.stats itself imports scipy
    stats = ast.parse((ROOT / "records" / "stats.py").read_text())
    assert any(isinstance(n, ast.ImportFrom) and (n.module or "").startswith("scipy") for n in ast.walk(stats))
