"""The command line's conventions: --version, -v/-q, run --config (the file under the command line, the resolved
options in each record), several tasks in one run, one meaning for -o with the old spellings noted, results.json
beside the records, the environment variables in --help, and a leaderboard that writes no committed file unless
-o names it."""

import json
import logging
from collections import Counter

import pytest
from kit import cli

import transferbench
from transferbench.cli import main
from transferbench.records.store import load_records

TOY = ["run", "toy", "--suite", "quick", "--backbone", "mu4", "--no-progress"]


def test_version_and_environment_in_help(capsys):
    with pytest.raises(SystemExit):
        cli("--version")
    assert capsys.readouterr().out.strip() == f"transferbench {transferbench.__version__}"
    for argv in (["--help"], ["run", "--help"], ["nightly", "--help"]):
        with pytest.raises(SystemExit):
            main(argv)
        out = capsys.readouterr().out
        assert "environment:" in out and "TRANSFERBENCH_HOME" in out and "TFDS_DATA_DIR" in out


def test_config_file_under_the_command_line_and_stored_in_each_record(tmp_path, capsys):
    config = tmp_path / "run.yaml"
    config.write_text("task: toy\nsuite: quick\nbackbone: [mu4, mu4_dpn]\nseeds: [0]\nset: {lr: [0.01, 0.1]}\n")
    out = tmp_path / "runs"
    assert cli(f"run --config {config} --out {out} --seeds 1 --no-progress") == 0
    records = load_records([out])
    assert {r["seed"] for r in records} == {1}  # the command line wins
    assert {r["backbone"] for r in records} == {"mu4", "mu4_dpn"}  # the file's
    assert {r["hparams"]["lr"] for r in records if r["stage"] == "select"} == {0.01, 0.1}
    assert records[0]["config"]["seeds"] == [1] and records[0]["config"]["sets"] == ["lr=0.01,0.1"]
    config.write_text("task: toy\nbackbones: [mu4]\n")
    capsys.readouterr()
    assert cli(f"run --config {config}") == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "unknown option 'backbones'" in err and "did you mean backbone" in err


def test_several_tasks_and_their_results_files(tmp_path):
    out = tmp_path / "runs"
    assert cli(f"run toy,toyshots --backbone mu4 --seeds 0 --out {out} --no-progress") == 0
    assert {r["task"] for r in load_records([out])} == {"toy", "toyshots"}
    for task in ("toy", "toyshots"):
        results = json.loads((out / task / "results.json").read_text())
        assert results["task"] == task and results["run"]["failed"] == 0
        assert results["config"]["task"] == ["toy", "toyshots"] and results["environment"]["torch"]
        rows = results["results"]["rows"]
        assert rows and {r["backbone"] for r in rows} == {"mu4"}


def test_old_short_options_work_with_a_note(tmp_path, capsys):
    out = tmp_path / "old"
    argv = ["run", "toy", "--suite", "quick", "-b", "mu4", "-o", str(out), "-j", "1", "--no-progress"]
    assert main(argv) == 0 and load_records([out])
    notes = [line for line in capsys.readouterr().err.splitlines() if "is deprecated" in line]
    assert [n.split()[2] for n in notes] == ["-o", "-b", "-j"]
    assert main(["report", str(out), "-o", str(tmp_path / "table.md")]) == 0  # -o: a file, as everywhere
    assert (tmp_path / "table.md").read_text().startswith("###")


def test_leaderboard_writes_into_the_records_folder_unless_o_names_a_file(tmp_path, monkeypatch):
    out = tmp_path / "runs"
    assert main([*TOY, "--out", str(out)]) == 0
    monkeypatch.chdir(tmp_path)
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "LEADERBOARD.md").write_text("committed")
    assert cli(f"leaderboard {out}") == 0
    assert (out / "LEADERBOARD.md").is_file() and (tmp_path / "results" / "LEADERBOARD.md").read_text() == "committed"


def test_quiet_drops_the_per_cell_lines_and_verbose_shows_info_logs(tmp_path, capsys, caplog):
    out = tmp_path / "runs"
    assert main(["-q", *TOY[:-1], "--out", str(out)]) == 0  # -q: no per-cell lines even where stderr is a file
    assert " cells, " not in capsys.readouterr().err
    assert logging.getLogger("transferbench").level == logging.ERROR
    caplog.set_level(logging.INFO, logger="transferbench")
    assert main(["-v", *TOY, "--out", str(out)]) == 0
    assert logging.getLogger("transferbench").level == logging.INFO
    assert any("already finished" in r.getMessage() and r.levelno == logging.INFO for r in caplog.records)


# --- the cost before the run ----------------------------------------------------------------------------------


def _table(out: str) -> dict:
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in out.splitlines() if line.startswith("| ")]
    return {r[0]: r[1:] for r in rows[1:]}


def test_dry_run_counts_the_plan_and_its_training_images(tmp_path, monkeypatch, capsys):
    from transferbench.adapters import prepare_task

    monkeypatch.setenv("TRANSFERBENCH_HOME", str(tmp_path / "home"))
    out = tmp_path / "runs"
    argv = ["run", "vtab", "--suite", "embedded", "--backbone", "mu4,mu4_dtn", "--dry-run", "--out", str(out)]
    assert main(argv) == 0
    text = capsys.readouterr().out
    task = prepare_task("vtab", suite="embedded")
    cells = 2 * len(task.datasets) * len(task.sweep["lr"]) * len(task.seeds)  # DPN's VTAB: the select runs report
    images = cells * task.hparams["steps"] * task.hparams["batch"]
    assert _table(text)["select"][:3] == [str(cells), "0", f"{images:,}"]
    assert "not probed" in text and not out.exists()  # nothing written, nothing run


def test_dry_run_estimate_from_the_probe(tmp_path, monkeypatch, capsys):
    from transferbench.engine.estimate import read_probe

    monkeypatch.setenv("TRANSFERBENCH_HOME", str(tmp_path / "home"))
    argv = ["run", "vtab", "--suite", "embedded", "--backbone", "mu4", "--seeds", "0", "--dry-run", "--probe"]
    assert main(argv) == 0
    row = _table(capsys.readouterr().out)["all"]
    from transferbench.engine.compute import default_device

    rate = read_probe(default_device(), "mu4", 16)["ms_per_image"]  # the run's device: cuda on a GPU host
    assert float(row[3]) == pytest.approx(int(row[2].replace(",", "")) * rate / 3.6e6, abs=0.005)
    assert cli("run toy --probe") == 2  # --probe is for --dry-run


def test_the_dry_runs_plan_is_the_runs(tmp_path, capsys):
    from transferbench.adapters import prepare_task
    from transferbench.backbones.weights import resolve_backbone
    from transferbench.engine.estimate import full_plan

    task = prepare_task("toy")
    planned = full_plan(task, [resolve_backbone("mu4")])
    assert cli(f"run toy --backbone mu4 --out {tmp_path} --no-progress") == 0
    records = load_records([tmp_path])
    # the selection stage cell for cell; the final stage as many cells (its setting is the dry run's stand-in)
    assert {c.key for c in planned if c.stage == "select"} == {r["key"] for r in records if r["stage"] == "select"}
    count = lambda items: Counter((x["dataset"], x["stage"]) for x in items)  # noqa: E731
    assert count(vars(c) for c in planned) == count(records) and len(planned) == 3 * (4 * 3 + 3)
