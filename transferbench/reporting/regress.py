"""The regression gate's report: the markdown of a `gate.decide` decision (docs/regression.md)."""

from __future__ import annotations

from ..gate.comparisons import LOSS_FLOOR, POOLED_FLOOR, SIGNAL_NOISE, Kind
from ..gate.comparisons import Verdict as V
from ..gate.decide import Decision, Gate, GateOptions, decide
from .regress_text import (
    cell_list,
    failed_section,
    md_table,
    missing_sections,
    num,
    p_text,
    selection_text,
    setting,
    table_section,
)


def decision_report(
    baseline: list[dict],
    current: list[dict],
    options: GateOptions | None = None,
    *,
    title: str = "Regression report",
    **changes,
) -> tuple[str, int]:
    """(markdown report, exit code) of `gate.decide(baseline, current, options, **changes)`."""
    v = decide(baseline, current, options, **changes)
    return decision_text(v, title), v.code


def decision_text(decision: Decision, title: str = "Regression report") -> str:
    """The markdown report of a decision (gate.decide.Decision): its gate, the cells that failed and why it fails."""
    return report(decision.gate, failed=decision.failed, title=title, reasons=decision.reasons)


def report(g: Gate, *, failed=(), title: str = "Regression report", reasons=()) -> str:
    sections = (_exact_section, _protocol_section, _pooled_section, _moved_section, _spread_section, _cell_sections)
    lines = _summary(g, failed, title, reasons)
    for section in sections:
        lines += section(g)
    if g.selection:
        lines += [f"Selection changed in {len(g.selection)} final cells (e.g. {selection_text(g.selection[0])}).", ""]
    return "\n".join(lines + failed_section(failed) + missing_sections(g))


def headline(g: Gate, reasons=()) -> str:
    """A report's verdict line: OK or REGRESSION (with why), then how many cells each tier judged."""
    head = f"**{'REGRESSION' if reasons else 'OK'}**" + (f" ({', '.join(reasons)})" if reasons else "")
    return f"{head}: {_tiers(g)}"


def _summary(g: Gate, failed, title: str, reasons) -> list[str]:
    """The verdict line, the counts and how a test fires."""
    lines: list[str] = []
    cells = g.of(Kind.CELL)
    counts = {v: sum(c.verdict == v for c in cells) for v in (V.REGRESSED, V.IMPROVED, V.UNCHANGED, V.UNTESTED)}
    pooled_bad = g.of(Kind.POOLED, V.REGRESSED)
    spread = g.of(Kind.SPREAD, V.SPREAD)
    lines += [
        f"# {title}",
        "",
        headline(g, reasons),
        "",
        f"Statistical tier: {counts[V.REGRESSED]} regressed, {counts[V.IMPROVED]} improved, "
        f"{counts[V.UNCHANGED]} unchanged, "
        f"{counts[V.UNTESTED]} untested of {len(cells)} compared; pooled over each task and backbone "
        f"{len(pooled_bad)} regressed, {len(g.of(Kind.POOLED, V.IMPROVED))} improved of {len(g.of(Kind.POOLED))}, "
        f"{len(g.of(Kind.MOVED, V.MOVED))} moved either way, {len(g.of(Kind.NOISE, V.NOISE))} beyond arithmetic noise, "
        f"{len(g.of(Kind.SHIFT, V.SHIFT))} consistent shifts; "
        f"{len(spread)} seed spreads changed; "
        f"{len(g.unaccepted)} protocol changes"
        + (f" ({len(g.protocol) - len(g.unaccepted)} accepted)" if len(g.protocol) > len(g.unaccepted) else "")
        + f"; {len(g.missing)} cells missing from current, {len(g.new)} new"
        + (f", {len(g.absent)} tasks or backbones absent" if g.absent else "")
        + (f", {len(g.vanished)} metrics vanished" if g.vanished else "")
        + (f", {len(g.stale)} kept from other code" if g.stale else "")
        + (f", {len(g.nonfinite)} non-finite values" if g.nonfinite else "")
        + (f", {len(g.baseline_failed)} failed in the baseline" if g.baseline_failed else "")
        + (f"; {len(failed)} cells of current failed or diverged" if failed else "")
        + "."
        + _direction(g),
        "",
        "A test fires when it is significant after Holm at α/2 within its family (the cells', or the pooled, moved, "
        f"noise, spread and shift tests'; {g.tests} tests in all: the night's family-wise error is at most "
        f"α = {g.alpha}) "
        f"and its change passes the floor ({g.floor:g} per comparison, {g.floor * POOLED_FLOOR:g} pooled; "
        f"{LOSS_FLOOR * 100:g}% and {LOSS_FLOOR * POOLED_FLOOR * 100:g}% of a training signal, {SIGNAL_NOISE:g} times "
        f"arithmetic's rms in its noise and spread tests). Across arithmetic every test's null is the noise model "
        f"measured on benign arithmetic ({_model(g)}), never tonight's data; docs/regression.md.",
        "",
    ]
    return lines


def _protocol_section(g: Gate) -> list[str]:
    """Settings of matched cells that differ."""
    return table_section(
        "Protocol changes",
        [
            [
                p.task,
                f"{p.setting}: {p.before} → {p.after}",
                p.cells,
                ", ".join(sorted(p.backbones)),
                num(p.mean_change),
                "accepted" if p.accepted else "FAILS",
            ]
            for p in g.protocol
        ],
        ["task", "change", "cells", "backbones", "mean change", "verdict"],
        "A setting of matched cells differs. Accept a change on purpose with `--accept TASK:SETTING`: the cells "
        "of an accepted change are still compared by the statistical tier (a change for the worse fails).",
    )


def _pooled_section(g: Gate) -> list[str]:
    """The pooled test of each task and backbone."""
    return table_section(
        "Pooled over each task and backbone",
        [
            [
                x.task,
                x.backbone,
                x.metric,
                x.n,
                f"{x.baseline:.2f}",
                f"{x.current:.2f}",
                num(x.change),
                f"[{num(x.low)}, {num(x.high)}]" if x.low is not None else "",
                p_text(x.p),
                x.verdict,
            ]
            for x in g.of(Kind.POOLED)
        ],
        ["task", "backbone", "metric", "datasets", "baseline", "current", "change", "95% CI", "p", "verdict"],
    )


def _model(g: Gate) -> str:
    about = getattr(g.model, "about", None) or {}
    if not about.get("date"):
        return "a model given by the caller"
    return f"{g.model.path}, measured {about['date']} at {str(about.get('commit') or '?')[:12]}"


def _moved_section(g: Gate) -> list[str]:
    """The moved-either-way tests that fired or came close."""
    either = [
        x
        for x in g.of(Kind.MOVED) + g.of(Kind.NOISE)
        if x.verdict in (V.MOVED, V.NOISE, V.SEE_POOLED) or (x.p is not None and x.p < g.alpha)
    ]
    return table_section(
        "Moved either way",
        [
            [
                x.task,
                x.backbone,
                x.metric,
                "seed spread" if x.kind == Kind.MOVED else "noise model",
                x.n,
                f"{x.current:.3g}",
                f"{x.baseline:.3g}" if x.kind == Kind.NOISE else "",
                p_text(x.p),
                x.verdict,
            ]
            for x in either
        ],
        ["task", "backbone", "metric", "against", "units", "rms change", "noise rms", "p", "verdict"],
        "Runs of one task and backbone (a data set's seed) whose changes, whatever their direction, exceed how "
        "arithmetic moves them (`noise`: against the noise model measured on benign arithmetic) or, for an "
        "accepted protocol change or other weights, how their seeds vary (`moved`: an F-test of the per-set mean "
        "changes); docs/regression.md. Both fail the night.",
    )


def _spread_section(g: Gate) -> list[str]:
    """The seed-spread tests that fired or came close."""
    spreads = [x for x in g.of(Kind.SPREAD) if x.verdict == V.SPREAD or (x.p is not None and x.p < g.alpha)]
    return table_section(
        "Seed spread",
        [
            [
                x.task,
                x.backbone,
                x.metric,
                "seed spread ratio" if x.null == "seeds" else "rms deviation over seeds",
                f"{x.baseline:.3g}",
                f"{x.current:.3g}",
                num(x.change, ".3g"),
                x.n,
                p_text(x.p),
                x.verdict,
            ]
            for x in spreads
        ],
        ["task", "backbone", "metric", "what", "baseline (model rms)", "current", "size", "df", "p", "verdict"],
    )


def _cell_sections(g: Gate) -> list[str]:
    """The cells that regressed and those that improved."""
    lines: list[str] = []
    head_cells = [
        "task",
        "dataset",
        "backbone",
        "split",
        "metric",
        "baseline",
        "current",
        "change",
        "95% CI",
        "p",
        "n",
        "setting",
    ]
    for heading, cells in (
        ("Regressions", g.of(Kind.CELL, V.REGRESSED)),
        ("Improvements", g.of(Kind.CELL, V.IMPROVED)),
    ):
        rows = [
            [
                x.task,
                x.dataset,
                x.backbone,
                x.split,
                x.metric,
                f"{x.baseline:.2f}",
                f"{x.current:.2f}",
                num(x.change),
                f"[{num(x.low)}, {num(x.high)}]" if x.low is not None else "",
                p_text(x.p),
                x.n,
                setting(x),
            ]
            for x in cells
        ]
        lines += table_section(heading, rows, head_cells)
    return lines


def _tiers(g: Gate) -> str:
    """The report's first line: how many cells each tier judged, and what the exact tier found."""
    t = g.exact
    if not t.enabled:
        return f"exact tier off (a fixed anchor); {t.statistical} cells judged by the statistical tier."
    found = [f"{t.identical} bit-identical"]
    arithmetic = len(t.failing_arithmetic)
    plain = len(t.failing) - arithmetic
    found += [f"{plain} changed by code"] if plain or not (t.accepted or arithmetic) else []
    found += [f"{arithmetic} arithmetic changed by code"] if arithmetic else []
    found += [f"{len(t.accepted)} changed by accepted code"] if t.accepted else []
    found += [f"{len(t.irreproducible)} irreproducible"]
    everything = "all " if t.judged and not t.statistical else ""
    return (
        f"{everything}{t.judged} cells judged exactly ({', '.join(found)}), {t.statistical} by the statistical tier "
        "(their arithmetic differs or is unrecorded)."
    )


def _exact_section(g: Gate) -> list[str]:
    """The exact tier: the modules that changed numbers, the cells they changed, irreproducible cells, and why
    other cells went to the statistical tier."""
    t, lines = g.exact, []
    if t.changed:
        rows = []
        for cause, n in t.modules().items():
            cells = [x for x in t.changed if cause in x.causes]
            moved = [abs(x.change) for x in cells if x.change is not None]
            verdict = "accepted" if all(x.accepted for x in cells) else "FAILS"
            rows.append(
                [cause, n, ", ".join(sorted({x.task for x in cells})), num(max(moved, default=0), ".3g"), verdict]
            )
        lines += [
            "## Changed by code",
            "",
            "Cells computed in the same arithmetic from the same weights and data on both sides whose outputs differ, "
            "and the modules that changed between their fingerprints. A cell whose own arithmetic (precision, "
            "micro-batch, evaluation batch, workers, compile) changed with the code is listed with that change: the "
            "code chose it. Declare an intended change in the anchor's ledger (`ACCEPTED.yaml`), or accept it for "
            "one comparison with `--accept-code MODULE`.",
            "",
            md_table(rows, ["changed", "cells", "tasks", "max |Δ| of the metric", "verdict"]),
            "",
        ]
        lines += cell_list(
            t.changed,
            lambda x: (
                f" (Δ {num(x.change, '+.4g')})"
                + (f" arithmetic changed by code: {', '.join(x.arithmetic)}" if x.arithmetic else "")
                + (" accepted" if x.accepted else "")
            ),
        )
    if t.irreproducible:
        lines += [
            "## Irreproducible",
            "",
            "Same code, weights, data and arithmetic on both sides, yet other outputs: a source of nondeterminism "
            "in these cells (docs/regression.md#irreproducible).",
            "",
        ]
        lines += cell_list(t.irreproducible, lambda x: f" (Δ {num(x.change, '+.4g')})")
    if t.enabled and t.why:
        lines += [
            "## Judged statistically",
            "",
            "Cells whose arithmetic, weights or data differ between the two sides (the first difference each shows):",
            "",
            md_table(sorted(([k, v] for k, v in t.why.items()), key=lambda r: -r[1]), ["arithmetic", "cells"]),
            "",
        ]
    return lines


def _direction(g: Gate) -> str:
    one_way = g.direction()
    if one_way is None:
        return ""
    worse, n, p = one_way
    way, k = ("worse", worse) if worse * 2 > n else ("better", n - worse)
    return f" Changes point one way: {k} of the {n} comparisons that moved got {way} (sign test p = {p:.1g})."


def night_report(
    title: str, judgments: list, *, baseline_notes=(), rolling: bool = False, kept: str = "", failed=0
) -> str:
    """A night's report (transferbench.night): one verdict line over every judgment, then where its baselines came
    from, the acceptance ledger's entries that applied, and each judgment's report as a section."""
    reasons = [f"against {j.name}: {', '.join(j.decision.reasons)}" for j in judgments if j.decision.reasons]
    head = f"**REGRESSION** ({'; '.join(reasons)})" if failed else "**OK**"
    lines = [f"# {title}", "", f"{head}: {_tiers(judgments[0].decision.gate)}", ""]
    for j in judgments:
        lines.append(f"- Against {j.name} {j.folder}: {'fails' if j.code else 'passes'}; {_tiers(j.decision.gate)}")
    if rolling and len(judgments) == 1:
        lines.append("- No rolling baseline of this arithmetic yet: judged against the anchor alone.")
    lines += [f"- {note}" for note in baseline_notes]
    if kept:
        lines.append(f"- Tonight's records: {kept}.")
    ledger = [line for j in judgments for line in [f"Against {j.name}:", *j.ledger] if j.ledger]
    if ledger:
        lines += ["", "Acceptance ledger entries honoured (the anchor's ACCEPTED.yaml):", "", *ledger]
    for j in judgments:
        section = report(
            j.decision.gate, failed=j.decision.failed, title=f"Against {j.name} {j.folder}", reasons=j.decision.reasons
        )
        lines += ["", "\n".join(("#" + x) if x.startswith("#") else x for x in section.splitlines())]
    return "\n".join(lines) + "\n"
