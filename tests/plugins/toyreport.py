"""The toy plugin's report kind, 'toybest', in a module of its own: `transferbench report` loads every installed
report kind, and this one imports only the reporting layer, so reading records stays free of torch (a plugin's
adapter module imports the backbones)."""

from transferbench.records.stats import Estimate
from transferbench.reporting.formats import to_markdown
from transferbench.reporting.kinds import Report
from transferbench.reporting.tables import Cellv, TaskTable


def best_seed_tables(records: list, reference=None) -> list:
    """One table: per backbone and dataset, the best test accuracy over seeds (not a mean: a report unlike the
    built-in ones)."""
    datasets = sorted({r["dataset"] for r in records})
    t = TaskTable(
        task="toybest",
        protocol_versions=["1"],
        metric="accuracy",
        mode="max",
        columns=datasets,
        group_columns=[],
        footnote="best seed",
    )
    for b in sorted({r["backbone"] for r in records}):
        t.rows[b] = {
            d: Cellv(
                Estimate(
                    max(r["metrics"]["test"]["accuracy"] for r in records if r["backbone"] == b and r["dataset"] == d),
                    None,
                    1,
                )
            )
            for d in datasets
        }
        t.seeds[b] = "1"
    return [t]


def best_seed_section(records, tables, task, out) -> list:
    return ["The best seed of each backbone:", "", *(to_markdown(t, title=False) for t in tables)]


TOY_REPORT = Report(best_seed_tables, section=best_seed_section, uses_reference=False)
