"""What made a report: the code that computed its records (`code_summary`, the line under each table) and the
header of its json and results files (`report_header`)."""

from __future__ import annotations

from collections import defaultdict

from .tables import TaskTable


def code_summary(records: list[dict]) -> dict:
    """What code computed `records`: each fingerprint's digest with its number of cells, how many records hold
    none (computed before records held one), and what differs between them (`mixed`): a module hashed two ways, a
    library at two versions, or records with and without a fingerprint. Records of backbones of different families
    have different fingerprints without differing in any module they share: they do not mix."""
    counts: dict[str, int] = defaultdict(int)
    modules, libraries = defaultdict(set), defaultdict(set)
    missing = 0
    for r in records:
        fp = r.get("fingerprint") or {}
        if not fp.get("digest"):
            missing += 1
            continue
        counts[fp["digest"]] += 1
        for m, h in (fp.get("modules") or {}).items():
            modules[m].add(h)
        for lib, v in (fp.get("libraries") or {}).items():
            libraries[lib].add(v or "absent")
    mixed = [f"{m} in {len(h)} versions" for m, h in sorted(modules.items()) if len(h) > 1]
    mixed += [f"{lib} {' and '.join(sorted(v))}" for lib, v in sorted(libraries.items()) if len(v) > 1]
    if missing and counts:
        mixed.append(f"{missing} cells without a fingerprint")
    return {"fingerprints": dict(sorted(counts.items())), "unrecorded": missing, "mixed": mixed}


def code_line(code: dict) -> str:
    """The markdown line that names a table's code: its fingerprint(s), and loudly whether they mix."""
    if not code:
        return ""
    prints = ", ".join(f"`{d}` ({n} cells)" for d, n in code["fingerprints"].items())
    if code["mixed"]:
        return (
            f"**Mixed code**: these cells were computed by different code ({'; '.join(code['mixed'])}); "
            f"fingerprints {prints or 'none'}. Rerun with `--stale recompute` to compute every cell with one code."
        )
    if not code["fingerprints"]:
        return f"Code: not recorded ({code['unrecorded']} cells computed before records held a fingerprint)."
    return f"Code: fingerprint {prints}."


def annotate_code(tables: list[TaskTable], records: list[dict]) -> list[TaskTable]:
    """Each table's `code`: the summary of the records of its task and protocol version(s)."""
    for t in tables:
        mine = [
            r
            for r in records
            if r["task"] == t.task
            and str(r.get("protocol_version")) in t.protocol_versions
            and all((r.get("hparams") or {}).get(k) == v for k, v in t.axes.items())
        ]
        t.code = code_summary(mine or [r for r in records if r["task"] == t.task])
    return tables


def report_header(records: list[dict], tables: list[TaskTable]) -> dict:
    """What made a report: its tasks and protocols, each compared row's reference, when, and the records' git
    shas and package versions."""
    from datetime import datetime, timezone

    from .. import __version__

    env = [r.get("environment") or {} for r in records]
    versions = defaultdict(set)
    for e in env:
        for k in ("transferbench", "torch", "timm", "numpy", "python"):
            if e.get(k):
                versions[k].add(e[k])
    return {
        "tasks": sorted({t.task for t in tables}),
        "protocol_versions": {t.task: t.protocol_versions for t in tables},
        "references": {t.task: dict(t.refs) for t in tables if t.refs},
        "generated": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "reported_with": __version__,
        "git_sha": sorted({e.get("git_sha") or "unknown" for e in env}),
        "code": {t.task: code_summary([r for r in records if r["task"] == t.task]) for t in tables},
        "versions": {k: sorted(v) for k, v in sorted(versions.items())},
        "records": len(records),
    }
