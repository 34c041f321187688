"""Typed task settings: each adapter declares its protocol's settings as one pydantic model whose fields carry the
paper's default, its source, the allowed values and a one-line description (lm-eval's `TaskConfig`). A task spec's
`hparams` and its suites only override them: the spec loader (spec.parse_spec) starts every spec from its
adapter's defaults, so a spec that leaves a setting out runs the paper's value, and `transferbench list tasks
--show TASK` prints them with their sources.

A field declared with `keyed=False` enters a cell's hyper-parameters (and so its key) only where a spec, a suite
or `--set` gives it: a setting that did not exist when records were made keeps their keys.

A setting whose source is `EXECUTION` (how many images a forward pass takes, say) is no part of a cell's identity:
`cell.make_cell` keeps it out of the hyper-parameters the key hashes and records it as the cell's `execution`, which
the cell's arithmetic digest holds (a batch size can move the last bits of a sum; transferbench.arithmetic).

A setting whose paper value is a rule of other settings (LiT's warm-up: max(int(3% of steps), 100)) is stored as the
rule (`Settings.rules`): its default is null, and a task's grid resolves it from the cell's own values, so
`--set steps=1000` moves the warm-up with it and the cell key holds the number it ran.
"""

from __future__ import annotations

import re
import types
import typing
from collections.abc import Callable
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ..errors import UserError, close_matches
from ..hashing import canon
from .choices import BF16_SETTINGS

BF16 = typing.Literal[BF16_SETTINGS]  # type: ignore[valid-type]
PIXELS_HELP = (
    "pixel normalisation: auto (the weights' own; [-1, 1] where they state none) | inception | imagenet | "
    "mean=R,G,B/std=R,G,B"
)
BF16_HELP = (
    "bf16 autocast: auto (where a probe of this step measures it faster; on CUDA where the card computes bf16, compute "
    "capability 8.0 or newer) | on | off"
)
# the sources of settings that are no paper's fact
BF16_SOURCE = "no paper fixes it: bf16 autocast where it measures faster on the device (engine.precision)"
EXECUTION = "an execution setting outside the protocol: the numbers do not depend on it"
DECLARED = "declared: no paper's fact, what the user states of the checkpoint (docs/reproducing.md)"
EVAL_BATCH = 256  # images per evaluation batch, the engine's default and the protocols' (an EXECUTION setting)


def setting(default, source: str, help: str, *, keyed: bool = True, **constraints) -> Any:
    """A settings field: the paper's `default`, where it comes from, and what it means."""
    return Field(default, description=help, json_schema_extra={"source": source, "keyed": keyed}, **constraints)


class Settings(BaseModel):
    """The base of every adapter's settings: read as attributes (`s.lr`); a cell's `hparams` validate into it."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    # settings whose null value follows a rule: name -> (the settings it reads, the rule over a dict of values)
    rules: ClassVar[dict[str, tuple[tuple[str, ...], Callable[[dict], Any]]]] = {}

    # what the backbone's weights state of their input (timm tags); recorded, never set by a spec
    backbone_preprocess: dict | None = Field(None, json_schema_extra={"source": "", "keyed": False, "hidden": True})
    # what a checkpoint was pretrained on, where the user declares it (cell.make_cell records it as the cell's
    # `pretraining`): the published numbers beside a run's own need it (reporting.versus)
    pretraining: str | None = setting(
        None,
        DECLARED,
        "what the checkpoints were pretrained on, for the published numbers beside yours (`transferbench list "
        "references` names them: imagenet1k_augreg_93k, imagenet21k_augreg_93k, jft4b_220k, ...); random-init "
        "backbones record random-init",
        keyed=False,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:\-]*$",
    )

    @classmethod
    def keyed_defaults(cls) -> dict:
        """The defaults a spec starts from (the fields that are part of every cell's key), as declared."""
        return {n: f.default for n, f in cls.model_fields.items() if _extra(f).get("keyed", True)}

    @classmethod
    def execution_names(cls) -> tuple[str, ...]:
        """The settings that say how a cell is executed, not what it computes: never part of its key."""
        return tuple(n for n, f in cls.model_fields.items() if _extra(f).get("source") == EXECUTION)

    @classmethod
    def choices(cls, name: str) -> tuple | None:
        """The allowed values of a field whose type is a Literal (None where any value of its type is)."""
        return _literal_values(cls.model_fields[name].annotation)

    @classmethod
    def default_of(cls, name: str):
        return cls.model_fields[name].default if name in cls.model_fields else None

    @classmethod
    def source_of(cls, name: str) -> str:
        """Where a setting's default comes from (a paper's config, the reference code), or "" where none is given."""
        return _extra(cls.model_fields[name]).get("source", "") if name in cls.model_fields else ""

    @classmethod
    def rows(cls) -> list[tuple[str, Any, str, str, str]]:
        """(setting, default, allowed, source, description) for every setting a spec may give."""
        out = []
        for name, f in cls.model_fields.items():
            if _extra(f).get("hidden"):
                continue
            values = cls.choices(name)
            shown = [v for v in values or () if not isinstance(v, bool)] or list(values or ())
            allowed = " | ".join(_show(v) for v in shown) if values else _type_name(f.annotation)
            out.append((name, f.default, allowed, cls.source_of(name), f.description or ""))
        return out

    @classmethod
    def of(cls, hparams: dict, task: str = "") -> Settings:
        """`hparams` (a cell's, or one point of a task's grid) as settings, validated once per distinct hparams (the
        settings are frozen: a cell planned again gets the same object); a value the protocol does not take is one
        UserError naming the setting, what it got, what it takes and how to change it."""
        key = (cls, canon(hparams))
        if key not in _VALIDATED:
            try:
                _VALIDATED[key] = cls.model_validate(hparams)
            except ValidationError as err:
                raise UserError(_message(cls, err, hparams, task)) from None
            if len(_VALIDATED) > 4096:  # a bound, not an eviction policy: the oldest go first
                del _VALIDATED[next(iter(_VALIDATED))]
        return _VALIDATED[key]

    @classmethod
    def of_cell(cls, cell) -> Settings:
        """A cell's validated settings: those it carries (cell.make_cell), else its hparams validated."""
        return cell.settings if isinstance(cell.settings, cls) else cls.of({**cell.hparams, **cell.execution})

    def __getitem__(self, key: str):
        return getattr(self, key)

    @classmethod
    def derive(cls, hparams: dict, swept=()) -> dict:
        """`hparams` with every rule-following setting that is null (or absent) resolved from the others; a rule
        that reads a `swept` setting is left for each point of the grid."""
        out = dict(hparams)
        for name, (reads, rule) in cls.rules.items():
            if out.get(name) is None and not set(reads) & set(swept):
                out[name] = rule({k: out.get(k, cls.default_of(k)) for k in reads})
        return out

    @model_validator(mode="before")
    @classmethod
    def _follow_rules(cls, data):
        return cls.derive(data) if isinstance(data, dict) and cls.rules else data


_VALIDATED: dict = {}  # (settings model, canonical hparams) -> its validated settings (`Settings.of`)


def _extra(f) -> dict:
    return f.json_schema_extra if isinstance(f.json_schema_extra, dict) else {}


def _literal_values(annotation) -> tuple | None:
    """The values of a Literal, also inside Optional/Union (`Literal['a'] | None`)."""
    if typing.get_origin(annotation) is typing.Literal:
        return typing.get_args(annotation)
    values = []
    for arg in typing.get_args(annotation):
        inner = _literal_values(arg)
        if inner:
            values += inner
        elif arg is type(None):
            values.append(None)
        else:
            return None  # a union with a free type (`int | Literal['checkpoint']`): any value of that type
    return tuple(values) if any(v is not None for v in values) else None


def _type_name(annotation) -> str:
    union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
    text = str(annotation) if union else getattr(annotation, "__name__", None) or str(annotation)
    text = re.sub(r"Literal\[([^\]]*)\]", lambda m: m.group(1).replace("'", "").replace(", ", " or "), text)
    text = text.replace("typing.", "")
    if text.startswith("Union[") and text.endswith("]"):
        text = text[6:-1].replace(", ", " or ")
    return text.replace(" | None", " or null").replace(" | ", " or ").replace("NoneType", "null")


def _show(value) -> str:
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def _message(cls, err: ValidationError, hparams: dict, task: str) -> str:
    e = err.errors()[0]
    key = str(e["loc"][0]) if e["loc"] else "?"
    where = f"task {task!r}: " if task else ""
    if e["type"] == "extra_forbidden":
        known = [n for n, _, _, _, _ in cls.rows()]
        return f"{where}no setting {key!r}{close_matches(key, known)}; settings: {', '.join(known)}"
    value = hparams.get(key)
    values = cls.choices(key) if key in cls.model_fields else None
    if values:
        shown = ", ".join(_show(c) for c in values if not isinstance(c, bool))
        return f"{where}{key} = {value!r} is not one of {shown} (set it with --set {key}=VALUE)"
    return f"{where}{key} = {value!r}: {e['msg'].removeprefix('Value error, ')} (set it with --set {key}=VALUE)"


def settings_table(task: str, suites: list[str] | None = None) -> tuple[list[str], list[list[str]]]:
    """(headers, rows) of an installed task's settings: each setting with its paper default, its value in each of
    `suites` (default: all the task's suites; empty where the suite keeps the default; a swept setting shows its
    values), the values it takes and the source of its default: a suite's value comes from the suite, as its column
    says (`transferbench list tasks --show TASK`, docs/settings.md)."""
    from ..spec import load_task, settings_model

    spec = load_task(task)
    model = settings_model(spec.adapter)
    if model is None:
        raise UserError(f"task {task!r}: adapter {spec.adapter!r} declares no settings; its spec states them all")
    suites = list(spec.suites) if suites is None else suites
    for name in suites:
        if name not in spec.suites:
            raise UserError(f"task {task!r} has no suite {name!r}; suites: {', '.join(spec.suites)}")
    rows = []
    for name, default, allowed, source, help_ in model.rows():
        shown = _value(spec.sweep.get(name, default))
        cells = []
        for suite in suites:
            s = spec.suites[suite]
            value = s.sweep.get(name, s.hparams.get(name, spec.sweep.get(name, spec.hparams.get(name, default))))
            cells.append("" if _value(value) == shown else _value(value))
        rows.append([name, shown, *cells, allowed, source, help_])
    headers = ["setting", "default", *(f"suite {s}" for s in suites), "allowed", "source of the default"]
    return [*headers, "description"], rows


def _value(value) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    return repr(value) if isinstance(value, str) and not value.strip() else _show(value)


def settings_markdown(tasks: list[str], suites: list[str] | None = None) -> str:
    """docs/settings.md: one table per task (`settings_table`; `suites`: those columns only), `|` escaped."""
    out = [
        "# Task settings",
        "",
        "Generated from each adapter's settings model by `transferbench list tasks --show all --format markdown`",
        "(a test fails when this page and the models differ). *default* is the paper's value, with its source; a",
        "suite's column is empty where the suite keeps the default. `--set KEY=VALUE` overrides any of them, and",
        "every record holds the values it ran with.",
    ]
    for task in tasks:
        headers, rows = settings_table(task, suites)
        out += ["", f"## {task}", "", markdown_table(rows, headers)]
    return "\n".join(out) + "\n"


def markdown_table(rows, headers) -> str:
    """A GitHub markdown table of `rows`: each value as its text, a `|` in it escaped, no number reformatted."""
    from tabulate import tabulate

    cells = [[str(c).replace("|", "\\|") for c in row] for row in rows]
    return tabulate(cells, headers, tablefmt="github", disable_numparse=True)
