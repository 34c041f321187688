"""benchmarks/paper_step.py's own arithmetic, which the GPU figures rest on: where the README's main command spends
its time (from its records), and the time budget that keeps the device run under 8 minutes."""

import json
import os

from benchmarks import paper_step, paper_step_data, paper_step_report


def _record(folder, name, end, seconds, train):
    path = folder / f"{name}.json"
    path.write_text(json.dumps({"seconds": seconds, "info": {"train_seconds": train}}))
    os.utime(path, (end, end))


def test_breakdown_of_the_main_command_by_hand(tmp_path):
    # a run started at t=100 that took 30 s (ended at 130); four cells, two at a time:
    #   cells [105, 115], [105, 113], [115, 125], [113, 127]: span 105..127 = 22 s, 10 + 8 + 10 + 14 = 42
    #   cell-seconds, 42 / 22 = 1.909 at once; training 6 + 5 + 7 + 10 = 28, set-up 14
    (tmp_path / "set").mkdir()
    _record(tmp_path / "set", "a", 115, 10, 6)
    _record(tmp_path / "set", "b", 113, 8, 5)
    _record(tmp_path / "set", "c", 125, 10, 7)
    _record(tmp_path / "set", "d", 127, 14, 10)
    (tmp_path / "results.json").write_text(json.dumps({"results": {}}))  # a summary file is not a cell
    b = paper_step_data.breakdown(str(tmp_path), started=100.0, wall=30.0, import_s=2.5)
    assert b["cells"] == 4
    assert b["import_s"] == 2.5
    assert abs(b["before_first_cell_s"] - 5.0) < 1e-6
    assert abs(b["cells_span_s"] - 22.0) < 1e-6
    assert abs(b["after_last_cell_s"] - 3.0) < 1e-6
    assert abs(b["cells_at_once"] - 42 / 22) < 1e-9
    assert abs(b["train_s"] - 28 / (42 / 22)) < 1e-9 and abs(b["setup_s"] - 14 / (42 / 22)) < 1e-9
    assert abs(b["setup_per_cell_s"] - 3.5) < 1e-9 and abs(b["train_per_cell_s"] - 7.0) < 1e-9


def test_a_row_past_the_budget_is_named_not_run():
    clock = paper_step.Budget(10.0)
    ran = []
    skipped = paper_step._row("cell", lambda: ran.append(1) or {}, clock=clock, need=60)
    assert ran == [] and skipped["skipped"].startswith("over the time budget")
    assert paper_step_report._failed("Paper-scale cell", skipped).startswith(
        "Paper-scale cell skipped: over the time budget"
    )
    done = paper_step._row("cell", lambda: {"x": 1}, clock=clock, need=1)
    assert done["x"] == 1 and "skipped" not in done


def test_a_failing_row_is_its_error_and_the_run_goes_on():
    def broken():
        raise ValueError("no such kernel")

    row = paper_step._row("dtn", broken, clock=paper_step.Budget(100), need=1)
    assert row["error"] == "ValueError: no such kernel"
    assert paper_step_report._dtn_lines([row])[-1] == "| DTN row failed: ValueError: no such kernel |"
