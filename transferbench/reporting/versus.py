"""A run's numbers beside the published ones (reporting.published): did I reproduce the paper?

A run's result matches a published number when it is the same task and data set at the same report-axis setting
(25 shots, a train fraction), the task's default protocol with no setting changed (a suite's other than the
default, or `--set`), the same architecture and stem (the backbone's name before `@`), and the pretraining the
published number names: stated by the weights (a checkpoint of the `pretrain` task) or declared with `--set
pretraining=NAME` (recorded in each cell; docs/reproducing.md). There the report shows yours, the published number
and yours − published, and marks † where the published number lies outside your 95% interval (t over seeds, as in
every table) widened on each side by the paper's own ± (none where the paper prints none). Each run that matches
no published number is named with the first condition it misses, in one line.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import NamedTuple

from ..hashing import canon
from ..names import model_name
from ..records.aggregate import Entry, aggregate
from ..records.record import Record
from ..spec import SET_SOURCE, load_task, suite_source
from .formats import estimate_text
from .published import Published, axes_text, references

# settings that say where a task's data is, not how it is computed: the default suite asks for them (LiT's pairs)
WHERE_DATA_IS = ("pairs", "csv_img_key", "csv_caption_key", "csv_separator")
MARK = "†"  # the published number lies outside your 95% interval widened by the paper's ±
HEADING = "#### Against the published numbers"


class Miss(NamedTuple):
    """Why a result is beside no published number: the first condition it misses, in words, and whether that is the
    paper's (it prints no number for this result) rather than the run's."""

    why: str
    absent: bool = False


@dataclass(frozen=True)
class Versus:
    """One of your results beside the published number it matches."""

    entry: Entry
    published: Published

    @property
    def difference(self) -> float | None:
        """Yours − published (None without a result)."""
        e = self.entry.estimate
        return None if e is None else e.mean - self.published.value

    @property
    def outside(self) -> bool | None:
        """Whether the published number lies outside your 95% interval widened by the paper's ±; None where your
        result has no interval (one seed) or one of width 0 (no variation over seeds: no evidence of precision)."""
        e = self.entry.estimate
        if e is None or e.degenerate or e.low is None or e.high is None:
            return None
        pm = self.published.pm or 0.0
        return not (e.low - pm <= self.published.value <= e.high + pm)


def changed(entry: Entry, protocol: str) -> list[str]:
    """The settings `entry`'s cells took from outside `protocol` (a suite other than it, or --set); the declared
    pretraining is no change of protocol."""
    other = suite_source("")
    return [
        f"{k}={v}"
        for k, v, source in entry.changed
        if k != "pretraining"
        and k not in WHERE_DATA_IS
        and (source == SET_SOURCE or (source.startswith(other) and source != suite_source(protocol)))
    ]


def match(entry: Entry, pubs: list[Published]) -> Published | Miss:
    """The published number `entry` matches among `pubs` (its task's, at a protocol the task runs and its stage), or
    the first condition it misses."""
    if not pubs:
        return Miss(f"no published numbers are carried over for {entry.task} (`transferbench list references`)")
    protocols = sorted({p.protocol for p in pubs})
    if entry.suite not in protocols:
        suite = f"suite {entry.suite!r}" if entry.suite else "records that name no suite"
        return Miss(f"{suite} is not the protocol of the published numbers ({', '.join(protocols)})")
    arch = model_name(entry.backbone)
    same = [p for p in pubs if p.protocol == entry.suite and p.dataset == entry.dataset and p.backbone == arch]
    if not same:
        return Miss(f"no published number for {arch} on {entry.dataset}", absent=True)
    here = [p for p in same if all(entry.settings.get(k) == v for k, v in p.axes)]
    if not here:
        return Miss(f"published at {'; '.join(sorted({axes_text(p.axes) for p in same}))} only", absent=True)
    moved = changed(entry, entry.suite)
    if moved:
        return Miss(f"settings changed from the {entry.suite} protocol: {', '.join(moved)}")
    named = sorted({p.pretraining for p in here})
    found = [p for p in here if p.pretraining == entry.pretraining]
    if found:
        return found[0]
    if not entry.pretraining:
        return Miss(
            f"its pretraining is not stated; the published numbers are for {', '.join(named)}: declare a "
            "checkpoint's with --set pretraining=NAME"
        )
    return Miss(f"pretraining {entry.pretraining} has no published number (published: {', '.join(named)})")


def compare(task: str, records: list[Record], entries: list[Entry] | None = None) -> tuple[list[Versus], list[str]]:
    """Your results of `task` beside the published numbers they match, and one reason per set of backbones that
    match none ('BACKBONES: why'). `entries`: the records' aggregated entries, where the caller has them (a task
    whose published numbers name a stage, high-res's 'high', is aggregated here from that stage's records)."""
    stages = {p.stage for p in references(task)} - {""}
    if stages or entries is None:
        recs = [r for r in records if r["task"] == task and (not stages or r.get("stage") in stages)]
        entries = aggregate(recs)
    stage = next(iter(stages), "")
    suites = load_task(task).suites
    pubs = [p for p in references(task) if p.stage == stage and p.protocol in suites]  # at a protocol run here
    found, why = [], defaultdict(list)
    for e in entries:
        got = match(e, pubs)
        if isinstance(got, Miss):
            why[e.backbone].append(got)
        else:
            found.append(Versus(e, got))
    compared = {v.entry.backbone for v in found}
    by_reason = defaultdict(list)
    for backbone, misses in why.items():
        if backbone not in compared:
            by_reason[misses[0].why].append(backbone)
        else:  # its other results: why they are not beside a number, unless the paper prints none for them
            for reason in dict.fromkeys(m.why for m in misses if not m.absent):
                by_reason[reason].append(backbone)
    return found, [f"{', '.join(sorted(b))}: {reason}" for reason, b in by_reason.items()]


def _difference(v: Versus) -> str:
    d = v.difference
    if d is None:
        return "-"
    e = v.entry.estimate
    mark = {True: f" {MARK}", False: ""}.get(v.outside, f" ({e.degenerate}: no interval)")
    return f"{d:+.1f}{mark}"


def _published(p: Published) -> str:
    return f"{p.value:.1f} ± {p.pm:g}" if p.pm is not None else f"{p.value:.1f}"


def versus_markdown(
    task: str, records: list[Record], entries: list[Entry] | None = None, heading: str = HEADING
) -> list[str]:
    """The markdown of `compare` under `heading`: per report-axis setting, a column per data set, and for each
    matching backbone three rows (yours, published, yours − published); then the backbones that match none, in one
    line."""
    lines = [heading, ""]
    if not references(task):
        return lines + [
            f"None: no published numbers are carried over for {task} (`transferbench list references`).",
            "",
        ]
    found, reasons = compare(task, records, entries)
    if not found:
        return lines + [f"None beside these runs: {'; '.join(reasons) or 'no results'}.", ""]
    lines += [
        f"Yours (mean ± 95% interval over seeds) beside the number the paper prints for the same architecture, stem "
        f"and pretraining at the task's default protocol. {MARK}: the published number lies outside your 95% "
        "interval widened by the paper's own ±. Sources: `transferbench list references`.",
        "",
    ]
    by_axes = defaultdict(list)
    for v in found:
        by_axes[canon(dict(v.published.axes))].append(v)
    for group in by_axes.values():
        lines += _block(group)
    if reasons:
        lines += [f"Not compared: {'; '.join(reasons)}.", ""]
    return lines


def _block(found: list[Versus]) -> list[str]:
    """One report-axis setting's comparison as a markdown table."""
    setting = axes_text(found[0].published.axes)
    columns = sorted({(v.entry.order, v.entry.dataset) for v in found})
    names = [d for _, d in columns]
    header = "| backbone | pretraining | source | " + " | ".join(names) + " |"
    lines = ([f"At {setting}:", ""] if setting else []) + [header, "|" + "---|" * (3 + len(names))]
    by_backbone = defaultdict(dict)
    for v in found:
        by_backbone[v.entry.backbone][v.entry.dataset] = v
    for backbone in sorted(by_backbone):
        cells = by_backbone[backbone]
        first = next(iter(cells.values())).published
        source = f"{first.paper.partition(': ')[2]}, {first.table}, row {first.row}"
        for label, show in (
            (f"`{backbone}`", lambda v: estimate_text(v.entry.estimate)),
            ("published", lambda v: _published(v.published)),
            ("yours − published", _difference),
        ):
            row = [label, first.pretraining if label.startswith("`") else "", source if label == "published" else ""]
            row += [show(cells[d]) if d in cells else "" for d in names]
            lines.append("| " + " | ".join(row) + " |")
    return lines + [""]
