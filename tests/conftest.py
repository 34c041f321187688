import numpy as np
import pytest
import torch


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
import os  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

PLUGINS = str(Path(__file__).parent / "plugins")
if PLUGINS not in sys.path:
    sys.path.insert(0, PLUGINS)
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (PLUGINS, os.environ.get("PYTHONPATH")) if p)


@pytest.fixture(scope="session")
def suite_home(tmp_path_factory):
    """$TRANSFERBENCH_HOME with the whole embedded suite generated once (about 25 s)."""
    from transferbench.data import embedded

    home = tmp_path_factory.mktemp("tbhome")
    mp = pytest.MonkeyPatch()
    mp.setenv("TRANSFERBENCH_HOME", str(home))
    embedded.ensure()
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
