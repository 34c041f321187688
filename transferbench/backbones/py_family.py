"""`py:<module>:<factory>[@<weights file>]`: your own module as a backbone, without a plugin package.

`<module>` is imported (installed packages first, then the current directory, as `python -m` would find it) and
`<factory>` called to build an `nn.Module` with timm's API (backbones.api; docs/backbones.md#the-backbone-api).
The factory is called without arguments, except for the task options it names in its signature (or takes as
`**kwargs`): ADE20K's `drop_path_rate`; for a pooling other than the model's own (`pool: gap|tok`, as the
embedded few-shot and LiT tasks ask), timm's `global_pool='avg'|'token'` with `fc_norm=False` (the final norm
kept before the average, as transferbench's ViT pools; nothing where it pools so already:
backbones.api.pool_arguments). An option it does not name that would change the model is refused in one line.
Then

1. the weights file's state dict is loaded (safetensors or torch; through the module's `checkpoint_filter_fn`
   where it has one; a classifier of another shape is left as the factory made it);
2. a task at another resolution calls the model's `set_input_size(img_size=(s, s))`: its own position-embedding
   resampling (a model without one is refused for that resolution in one line);
3. a task that wants a head of other size calls `reset_classifier(n)`.

The weights' identity is the file's sha256. A model that states `pretrained_cfg` (mean, std, input_size,
crop_pct, interpolation) has those recorded as timm tags' are; otherwise `pixels=auto` is the default.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from pathlib import Path

import torch

from ..errors import UserError
from .api import DOCS, check_api, input_size, pool_arguments, resize_input

PREFIX = "py:"
# a factory argument a task asks for -> the task setting that asks for nothing
TASK_OPTION = {"global_pool": "--set pool=model", "drop_path_rate": "--set drop_path=0"}


def split(name: str) -> tuple[str, str]:
    """'py:mypkg.models:make_model' -> ('mypkg.models', 'make_model'); one UserError for another form."""
    module, sep, factory = name[len(PREFIX) :].partition(":")
    if not (module and sep and factory.isidentifier()):
        raise UserError(
            f"backbone {name!r}: write py:MODULE:FACTORY[@WEIGHTS], e.g. py:mypkg.models:make_model@weights.safetensors"
        )
    return module, factory


def factory_of(name: str):
    """The factory function `name` points to, imported (the current directory searched after sys.path)."""
    module, attr = split(name)
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    try:
        mod = importlib.import_module(module)
    except Exception as e:  # noqa: BLE001 - whatever the user's module raises on import is reported in one line
        raise UserError(
            f"backbone {name!r}: cannot import {module} ({type(e).__name__}: {e}); run from the folder that holds it "
            "or add that folder to PYTHONPATH"
        ) from None
    fn = getattr(mod, attr, None)
    if not callable(fn):
        raise UserError(f"backbone {name!r}: module {module} ({mod.__file__}) has no function {attr}")
    return fn


def build(name: str, overrides: dict, optional: tuple = ()) -> torch.nn.Module:
    """Call the factory with the options it names; refuse one it does not name unless it changes nothing
    (0, None) or is `optional` (a refinement the factory may not know)."""
    fn = factory_of(name)
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        params = {}
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    given, refused = {}, []
    for key, value in overrides.items():
        if takes_any or key in params:
            given[key] = value
        elif value and key not in optional:  # 0 / None ask for nothing the model would not do anyway
            refused.append(f"{key}={value!r}")
    if refused:
        fixes = sorted({TASK_OPTION.get(r.partition("=")[0], "the task option") for r in refused})
        raise UserError(
            f"backbone {name!r}: the task asks for {', '.join(refused)} and {split(name)[1]}() takes no such "
            f"argument: add it to the factory's signature (or **kwargs) or set {' and '.join(fixes)} (see {DOCS})"
        )
    try:
        model = fn(**given)
    except Exception as e:  # noqa: BLE001 - the user's factory failing is one line, not a traceback
        raise UserError(f"backbone {name!r}: {split(name)[1]}() raised {type(e).__name__}: {e}") from None
    check_api(model, name, grid=False)
    return model


def _num_classes(model) -> int | None:
    n = getattr(model, "num_classes", None)
    return int(n) if isinstance(n, int) else None


def preprocessing(model) -> dict:
    """What a model's own `pretrained_cfg` states of its input (the keys timm tags' references carry)."""
    from .timm_family import preprocessing_of

    cfg = getattr(model, "pretrained_cfg", None)
    return preprocessing_of(cfg if isinstance(cfg, dict) else {})


class PyFamily:
    """Every `py:` name (registered as entry point `py`)."""

    def names(self) -> list[str]:
        return []  # any importable factory: py:MODULE:FACTORY

    def accepts(self, name: str) -> bool:
        return name.startswith(PREFIX)

    def code_roots(self, name: str) -> list[str]:
        """The module the factory lives in (its fingerprint adds what it imports from its own folder or package)."""
        return [factory_of(name).__module__]

    def resolve(self, spec: str, name: str, checkpoint: str):
        """The reference of `py:MODULE:FACTORY[@FILE]`: the factory imported and its model built on the meta
        device (the API checked, no weights in memory), the file's sha256, what the model states of its input."""
        from ..cell import RANDOM_INIT, BackboneRef
        from ..hashing import file_sha256

        with torch.device("meta"):
            model = build(name, {})
        pre = {"posemb": "set_input_size", **preprocessing(model)}
        if input_size(model):  # what it is built for (a timm model's pretrained_cfg keeps its tag's size)
            pre["input_size"] = input_size(model)
        if not checkpoint:
            return BackboneRef(spec, name, None, RANDOM_INIT, pre.get("pixels", ""), tuple(sorted(pre.items())))
        path = Path(checkpoint).expanduser()
        if not path.is_file():
            raise UserError(f"backbone {spec!r}: weights file {checkpoint} does not exist")
        return BackboneRef(spec, name, str(path), file_sha256(path), pre.get("pixels", ""), tuple(sorted(pre.items())))

    def create(self, name, *, img_size=None, num_classes=0, checkpoint=None, **overrides):
        from .timm_family import load_weights

        posemb = overrides.pop("posemb", None)
        if posemb not in (None, "set_input_size"):
            raise UserError(
                f"backbone {name!r}: py: models resample position embeddings with their own set_input_size "
                "(posemb=set_input_size)"
            )
        if "pool" in overrides:  # ours: tok | gap -> timm's global_pool (+ where the final norm goes)
            with torch.device("meta"):
                overrides.update(pool_arguments(build(name, {}), overrides.pop("pool")))
        model = build(name, overrides, optional=("fc_norm", "use_fc_norm"))
        if checkpoint is not None:
            load_weights(model, checkpoint, name)
        if img_size is not None:
            model.posemb_resample = resize_input(model, int(img_size), name) or getattr(model, "posemb_resample", None)
        if _num_classes(model) != int(num_classes):
            model.reset_classifier(int(num_classes))
        model.name = name
        return model


PY = PyFamily()
