import os
import sys

# The tests start some 70 Python processes (commands, pool workers); without bytecode each one compiles the package
# again, about 3.5 s of a core. Bytecode goes where Python puts it by default (__pycache__, ignored by git), also
# where the environment sets PYTHONDONTWRITEBYTECODE.
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

# pytest-xdist: the cores shared among the workers, none oversubscribed. The share is set before numpy and torch
# load (their thread pools, torch's intra-op threads among them, read it then) and is inherited by every process a
# test starts (a command, its pool workers): OpenMP threads that outnumber the cores spin against each other, and two
# 2-thread runs side by side on 2 cores took 6.5 minutes where one thread each took 52 s.
if os.environ.get("PYTEST_XDIST_WORKER"):
    _share = max(1, (os.cpu_count() or 1) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    os.environ["OMP_NUM_THREADS"] = os.environ["OPENBLAS_NUM_THREADS"] = str(_share)

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402


def pytest_collection_modifyitems(config, items):
    """The tests marked slow first, so that pytest-xdist's workers start them early and the run does not end on
    one of them (their relative order, and everyone else's, as collected)."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    np.random.seed(0)


def randomize_(model: torch.nn.Module, scale: float = 0.05, seed: int = 0) -> torch.nn.Module:
    """Perturb every parameter (LN scales, biases, zero-init heads) so that each one shows in the output."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)
    return model.eval()


# The toy adapter and its task specs are installed as a plugin: a .dist-info on the path is all
# importlib.metadata needs, exactly as for a pip-installed package.
from pathlib import Path  # noqa: E402

PLUGINS = str(Path(__file__).parent / "plugins")
if PLUGINS not in sys.path:
    sys.path.insert(0, PLUGINS)
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (PLUGINS, os.environ.get("PYTHONPATH")) if p)


@pytest.fixture(scope="session")
def suite_home(tmp_path_factory):
    """$TRANSFERBENCH_HOME with the whole embedded suite generated once (about 55 s on one core): once for the whole
    test run where pytest-xdist's workers share it, so that each worker's own cache folders stay its own. The workers
    generate it together, from opposite ends of the list (`embedded.ensure` locks each generator: a worker skips the
    sets another made, and waits for one that another is making)."""
    import kit

    from transferbench.data import embedded

    home = tmp_path_factory.mktemp("tbhome")
    base = tmp_path_factory.getbasetemp()
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    shared = (base.parent if worker else base) / "embedded-suite"  # this run's
    order = embedded.NAMES[:: -1 if worker and int(worker.removeprefix("gw")) % 2 else 1]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRANSFERBENCH_HOME", str(shared))
        embedded.ensure(order)
    kit.embedded_home(shared, home)  # read-only use: links
    mp = pytest.MonkeyPatch()
    mp.setenv("TRANSFERBENCH_HOME", str(home))
    embedded.ensure()  # checks what was copied (the manifests), generates nothing
    yield home
    mp.undo()


def write_records(records, root):
    """`records` written into a records folder at `root` (returned)."""
    from transferbench.records.store import RecordStore

    store = RecordStore(root)
    for r in records:
        store.write(r)
    return root


def shifted(records, shift):
    """A copy of `records` with `shift(record)` points added to every split's accuracy."""
    import copy

    out = copy.deepcopy(records)
    for r in out:
        d = shift(r)
        for m in r["metrics"].values():
            m["accuracy"] += d
    return out


# the toy task's arithmetic noise model (the package's covers the built-in tasks alone): one (cell, seed)'s change
# between two arithmetics has a root mean square of 0.001 points, measured on 100 changes
TOY_NOISE = {"tasks": {"toy": {s: {"accuracy": {"kernels": {"ms": 1e-6, "df": 100}}} for s in ("val", "test")}}}


def toy_noise_model(folder):
    """TOY_NOISE written as a noise model file in `folder` (for `--noise-model`); returns its path."""
    import json
    from pathlib import Path

    path = Path(folder) / "toy_noise.json"
    path.write_text(json.dumps(TOY_NOISE))
    return path
