"""Task adapters: each plans cells from a resolved task and runs one cell into metrics.

An adapter is a class registered under the `transferbench.adapters` entry point (built-in ones too):

    class MyAdapter(Adapter):
        name = "mytask"
        def plan(self, task, backbone, results):     # -> cells; called again as records arrive
            ...
        def run(self, cell, ctx):                   # -> {"val": {...}, "test": {...}, "info": {...}}
            ...

`plan` is called repeatedly until it yields no unfinished cell, so a protocol with stages (sweep on
train -> val, then the chosen setting on trainval -> test) yields its second stage once
`results.best(first_stage_cells)` has an answer. The contract lives in `adapters.base`, the fine-tuning recipe
that several protocols share in `adapters.classify`.
"""

from ..backbones.weights import resolve_backbone
from .base import Adapter, check_backbone, get_adapter, list_adapters, plan_select_then_final, prepare_task

__all__ = [
    "Adapter",
    "check_backbone",
    "get_adapter",
    "list_adapters",
    "plan_select_then_final",
    "prepare_task",
    "resolve_backbone",
]
