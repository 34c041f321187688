"""Which cell of the nightly suite runs the code path of each paper default (docs/nightly-coverage.md).

A task's defaults are its spec's `hparams` (and the default sweep's values). A nightly cell covers a default when its
value of that setting is the same, or, for a number, of the same kind: a number is a size or a rate (steps, batch,
resolution, lr), and any positive value runs the code that the default's does, while 0 and null switch a step off
(no warm-up, no clipping, no resize). A default that no nightly cell can run is listed in EXEMPT with the reason;
tests/test_regress.py fails when a default is neither covered nor exempt, or an exempt one has become covered.

    python -m transferbench.reporting.coverage      # the table docs/nightly-coverage.md holds
"""

from __future__ import annotations

from dataclasses import dataclass

from ..hashing import canon

SUITE = "nightly"

EXEMPT = {
    ("imagenet_c", "render"): "the corruption functions need 32 px or more; null renders at the model's resolution "
    "(224 at paper scale), the same code with that size",
    ("lit", "pairs"): "null asks for --set pairs=PATH (a CSV or webdataset of the user's); the nightly reads the "
    "embedded pairs through the same webdataset reader, and tests/test_lit.py reads a CSV",
    ("pretrain", "dropout_b_l"): "App. C sets dropout and stochastic depth for B and L only; the nightly's mu4 trains "
    "without them, as every size below B does",
    ("pretrain", "aug"): "auto looks the model size up in App. C's table, which has no mu4; the nightly sets medium2 "
    "(B/16's value), which runs both RandAugment and mixup",
    ("pretrain", "rep_size"): "auto looks the model size up in App. C's table, which has no mu4; the nightly sets on, "
    "what auto gives every size but S/32",
}


@dataclass
class Row:
    task: str
    setting: str
    default: str
    nightly: str  # the nightly's values ('' where no cell covers it)
    covered: bool
    why: str = ""  # the exemption's reason


def kind(value) -> str:
    """What decides the code path of a value (module docstring)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return repr(value)
    if isinstance(value, (int, float)):
        return "0" if value == 0 else "+" if value > 0 else "-"
    return canon({"v": value})


def _text(value) -> str:
    return value if isinstance(value, str) and value.isprintable() else canon({"v": value})[5:-1]


def _order(value):
    from ..records.aggregate import value_order

    return value_order(value)


def task_rows(name: str) -> list[Row]:
    from ..spec import installed_specs, load_spec_file, resolve, settings_model

    spec = load_spec_file(installed_specs()[name])
    if SUITE not in spec.suites:
        return [Row(name, "(suite)", "", "", False, f"task {name!r} has no {SUITE!r} suite")]
    task = resolve(spec, suite=SUITE)
    cells = list(task.grid())
    model = settings_model(spec.adapter)
    fixed = model.derive(spec.hparams, swept=spec.sweep) if model is not None else spec.hparams  # rules as run
    defaults = {**fixed, **{k: v for k, v in spec.sweep.items()}}
    rows = []
    for key, default in defaults.items():
        values = default if key in spec.sweep else [default]
        seen = [_text(v) for v in sorted({canon({"v": c.get(key)}): c.get(key) for c in cells}.values(), key=_order)]
        covered = (name, key) not in EXEMPT and all(any(kind(c.get(key)) == kind(v) for c in cells) for v in values)
        rows.append(Row(name, key, _text(default), ", ".join(seen), covered, EXEMPT.get((name, key), "")))
    return rows


def rows(tasks=None) -> list[Row]:
    from ..spec import BUILTIN_TASKS, installed_specs

    names = tasks or sorted(n for n in installed_specs() if n in BUILTIN_TASKS)
    return [r for n in names for r in task_rows(n)]


def markdown(table: list[Row]) -> str:
    from tabulate import tabulate

    return tabulate(
        [
            [r.task, r.setting, r.default, r.nightly if r.covered else f"not run: {r.why or 'NO COVERING CELL'}"]
            for r in table
        ],
        ["task", "setting", "paper default", "nightly cells"],
        tablefmt="github",
        disable_numparse=True,
    )


if __name__ == "__main__":
    print(markdown(rows()))
