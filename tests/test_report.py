import copy
import csv
import io
import json
from pathlib import Path

import numpy as np
import pytest
import scipy.stats
from conftest import TOY_NOISE, toy_noise_model
from conftest import shifted as shifted_by
from conftest import write_records as write
from kit import cli
from toyplugin import toy_accuracy

from transferbench.adapters import prepare_task
from transferbench.backbones.weights import resolve_backbone
from transferbench.cli import main
from transferbench.engine.runner import RunOptions, run_task
from transferbench.gate.decide import gate
from transferbench.records.aggregate import aggregate
from transferbench.records.store import load_records
from transferbench.reporting.formats import render
from transferbench.reporting.kinds import report_kinds, report_tables
from transferbench.reporting.tables import build_tables, sanity_references, stem_references


@pytest.fixture(scope="module")
def toy_runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs")
    task = prepare_task("toy", sets=["lr=0.001,0.01"])
    run_task(task, [resolve_backbone(b) for b in ("mu4", "mu4_dpn", "mu4_dtn")], out, RunOptions(show_progress=False))
    shots = prepare_task("toyshots")
    run_task(shots, [resolve_backbone(b) for b in ("mu4", "mu4_dpn")], out, RunOptions(show_progress=False))
    return out


def table(out, task="toy", reference="mu4", split_axes=True):
    (t,) = [
        t
        for t in build_tables(aggregate(load_records([out])), reference=reference, split_axes=split_axes)
        if t.task == task
    ]
    return t


def test_cells_are_t_intervals_of_the_selected_test_values(toy_runs):
    t = table(toy_runs)
    e = {(x.backbone, x.dataset): x for x in aggregate(load_records([toy_runs])) if x.task == "toy"}
    vals = list(e[("mu4_dpn", "beta")].per_seed.values())
    low, high = scipy.stats.t.interval(0.95, 2, loc=np.mean(vals), scale=scipy.stats.sem(vals))
    cell = t.rows["mu4_dpn"]["beta"]
    assert cell.estimate.mean == pytest.approx(np.mean(vals)) and cell.estimate.ci == pytest.approx((high - low) / 2)
    # the toy gives dpn exactly +2 over mu4 on every seed: a significant paired improvement, bold
    assert cell.delta.mean == pytest.approx(2.0) and cell.better
    md = render([t])
    assert f"**{np.mean(vals):.1f} ± {(high - low) / 2:.1f}**" in md


def test_group_columns_and_seed_counts(toy_runs):
    t = table(toy_runs)
    # natural holds alpha and beta; structured only gamma (a one-dataset group is not averaged)
    assert t.columns == ["alpha", "beta", "gamma", "natural", "mean"]
    nat = t.rows["mu4"]["natural"].estimate
    e = {x.dataset: x for x in aggregate(load_records([toy_runs])) if x.backbone == "mu4" and x.task == "toy"}
    assert nat.mean == pytest.approx(
        (np.mean(list(e["alpha"].per_seed.values())) + np.mean(list(e["beta"].per_seed.values()))) / 2
    )
    assert t.seeds == {"mu4": "3", "mu4_dpn": "3", "mu4_dtn": "3"}


def test_unselected_sweep_becomes_columns_in_the_wide_form(toy_runs):
    t = table(toy_runs, task="toyshots", split_axes=False)
    # no means across shot counts; shots by value
    assert t.columns == ["alpha (shots=1)", "alpha (shots=5)", "beta (shots=1)", "beta (shots=5)"]


def test_one_table_per_axis_setting_headline_first_with_means(toy_runs):
    tables = [t for t in build_tables(aggregate(load_records([toy_runs])), reference="mu4") if t.task == "toyshots"]
    assert [t.setting for t in tables] == ["shots=5", "shots=1"]  # the largest setting is the headline
    five = tables[0]
    assert five.columns == ["alpha", "beta", "mean"]
    # the toy's closed form (toyshots: lr 0.01, offsets 5 and 0): mean over datasets of the seed means
    expected = np.mean(
        [
            np.mean([toy_accuracy("mu4", off, 0.01, seed, "test", ds) for seed in (0, 1)])
            for ds, off in (("alpha", 5.0), ("beta", 0.0))
        ]
    )
    assert five.rows["mu4"]["mean"].estimate.mean == pytest.approx(expected, abs=1e-12)
    # dpn is +2 on every seed of every dataset: the paired suite difference is exactly +2, and bold
    assert five.rows["mu4_dpn"]["mean"].delta.mean == pytest.approx(2.0) and five.rows["mu4_dpn"]["mean"].better
    md = render(tables)
    assert md.index("### toyshots — shots=5") < md.index("### toyshots — shots=1")
    assert md.count("Paired difference vs mu4") == 2
    wide = json.loads(render(build_tables(aggregate(load_records([toy_runs])), split_axes=False), "json"))["rows"]
    assert {r["column"] for r in wide if r["task"] == "toyshots"} == {
        "alpha (shots=1)",
        "alpha (shots=5)",
        "beta (shots=1)",
        "beta (shots=5)",
    }


def test_worse_is_not_bold(toy_runs):
    t = table(toy_runs, reference="mu4_dpn")
    v = t.rows["mu4"]["alpha"]
    assert v.delta.mean == pytest.approx(-2.0) and v.worse and not v.better
    assert "**" not in render([t]).split("Paired difference")[0].split("| mu4 ")[1].split("\n")[0]


def test_single_seed_shows_no_interval(tmp_path):
    run_task(
        prepare_task("toy", suite="quick", seeds=[0]),
        [resolve_backbone("mu4")],
        tmp_path,
        RunOptions(show_progress=False),
    )
    md = render(build_tables(aggregate(load_records([tmp_path]))))
    row = next(line for line in md.splitlines() if line.startswith("| mu4"))
    assert "±" not in row and row.split("|")[-2].strip() == "1"


def test_csv_and_json_rows_hold_the_markdown_tables_numbers(toy_runs):
    rows = json.loads(render([table(toy_runs)], "json"))["rows"]
    dpn_alpha = next(r for r in rows if r["backbone"] == "mu4_dpn" and r["column"] == "alpha")
    assert dpn_alpha["n"] == 3 and dpn_alpha["better"] and dpn_alpha["delta"] == pytest.approx(2.0)
    parsed = list(csv.DictReader(io.StringIO(render([table(toy_runs)], "csv"))))
    assert len(parsed) == len(rows) and float(parsed[0]["mean"]) == pytest.approx(rows[0]["mean"])


def test_report_prints_the_paired_table_and_names_a_misspelled_reference(toy_runs, capsys):
    assert cli(f"report {toy_runs} --reference mu4 --task toy") == 0
    out = capsys.readouterr().out
    assert "### toy — accuracy (higher is better), protocol v1" in out and "Paired difference vs mu4" in out
    assert cli(f"report {toy_runs} --reference mu5") == 2
    assert "did you mean mu4" in capsys.readouterr().err


def test_leaderboard_writes_each_task_with_its_figure_and_provenance(toy_runs, tmp_path):
    out = tmp_path / "results" / "LEADERBOARD.md"
    assert cli(f"leaderboard {toy_runs} -o {out}") == 0
    text = out.read_text()
    assert "## toy" in text and "## toyshots" in text and "Task `toy`, protocol v1" in text and "git" in text
    assert "![Δ vs each row's reference](LEADERBOARD_toy.png)" in text  # mu4 is the plain backbone the others modify
    # an axis task: one table per setting, headline first, and the wide form folded away
    assert text.index("shots=5: accuracy") < text.index("shots=1: accuracy") < text.index("<details>")
    assert "| alpha (shots=1)" in text.split("<details>")[1] and "![Δ vs each row's reference at shots=5]" in text
    png = out.parent / "LEADERBOARD_toy.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    svg = out.parent / "LEADERBOARD_toy.svg"
    assert svg.read_text().lstrip().startswith("<?xml")  # the vector twin
    # the same records give the same bytes (matplotlib's default stamps a date and draws random element ids)
    first, first_png = svg.read_bytes(), png.read_bytes()
    assert cli(f"leaderboard {toy_runs} -o {out}") == 0
    assert svg.read_bytes() == first and png.read_bytes() == first_png and b"<dc:date>" not in first


def test_the_leaderboard_names_each_tasks_figures_apart_from_a_task_named_like_it(toy_runs, tmp_path):
    """`draw_leaderboard`'s figures per task (a nightly logs them to each task's report entry) are those its section
    shows: toy's are not toyshots', whose files' names begin with toy's."""
    from transferbench.reporting.leaderboard import draw_leaderboard

    out = tmp_path / "LEADERBOARD.md"
    board, figures = draw_leaderboard([toy_runs], out)
    text = out.read_text()
    assert board == out and set(figures) == {"toy", "toyshots"}
    assert figures["toy"] == [tmp_path / "LEADERBOARD_toy.png"]
    assert figures["toyshots"] == [tmp_path / "LEADERBOARD_toyshots_curve.png", tmp_path / "LEADERBOARD_toyshots.png"]
    assert text.index("(LEADERBOARD_toyshots_curve.png)") < text.index("(LEADERBOARD_toyshots.png)")
    assert sorted(sum(figures.values(), [])) == sorted(tmp_path.glob("*.png"))  # every figure drawn, in one task


def test_each_backbone_is_paired_with_the_plain_backbone_of_its_weights_source():
    names = [
        "mu4",
        "mu4_dpn",
        "mu4_dtn",
        "mu4@embedded",
        "mu4_dpn@embedded",
        "mu4_dtn@embedded",
        "b16_dpn@a.npz",
        "b16@b.npz",
        "b16_dpn_dtn_rep",
        "b16_rep",
        "s16_dpn",
    ]
    assert stem_references(names) == {
        "mu4_dpn": "mu4",
        "mu4_dtn": "mu4",
        "mu4_dpn@embedded": "mu4@embedded",
        "mu4_dtn@embedded": "mu4@embedded",
        "b16_dpn_dtn_rep": "b16_rep",
    }
    # a file of its own has no partner of the same source: the user names one, and then it is everyone's
    assert stem_references(names, "b16@b.npz")["b16_dpn@a.npz"] == "b16@b.npz"
    assert sanity_references(names) == {
        "mu4@embedded": "mu4",
        "mu4_dpn@embedded": "mu4_dpn",
        "mu4_dtn@embedded": "mu4_dtn",
    }


def test_a_plugin_brings_its_own_report(tmp_path):
    """The toy plugin registers report kind 'toybest' (entry point transferbench.reports) and its adapter's cells
    name it: report and leaderboard use the plugin's tables and section, not the built-in mean +- CI ones."""
    assert {"corruption", "hires", "diagnostics", "toybest"} <= set(report_kinds())
    out = tmp_path / "runs"
    run_task(
        prepare_task("toybest"), [resolve_backbone(b) for b in ("mu4", "mu4_dpn")], out, RunOptions(show_progress=False)
    )
    recs = load_records([out])
    assert len(recs) == 12 and {r["report"] for r in recs} == {"toybest"}
    (t,) = report_tables(recs)
    assert t.task == "toybest" and t.footnote == "best seed"
    for b in ("mu4", "mu4_dpn"):
        for d, offset in (("alpha", 5.0), ("beta", 0.0)):
            best = max(toy_accuracy(b, offset, 0.01, seed, "test", d) for seed in (0, 1, 2))
            assert t.rows[b][d].estimate.mean == pytest.approx(best)
    board = tmp_path / "LEADERBOARD.md"
    assert cli(f"leaderboard {out} -o {board}") == 0
    text = board.read_text()
    assert "## toybest" in text and "The best seed of each backbone:" in text and "±" not in text.split("## toybest")[1]


# --- regression verdict ------------------------------------------------------------------------------


def shifted(records, dataset, backbone, shift):
    """`shift` points on every ok record of one dataset and backbone, as another machine's run: without the
    arithmetic digest, so that the statistical tier judges every cell."""
    out = shifted_by(
        records, lambda r: shift if (r["dataset"], r["backbone"], r["status"]) == (dataset, backbone, "ok") else 0.0
    )
    for r in out:
        r.pop("arithmetic", None)
    return out


def test_regress_flags_a_real_drop_only(toy_runs, tmp_path, capsys):
    base = [r for r in load_records([toy_runs]) if r["task"] == "toy"]
    # a shift shared by both seeds is significant (the paired differences do not vary); -3 regresses, +3 improves,
    # -0.3 is under the 0.5 floor
    cur = shifted(shifted(shifted(base, "alpha", "mu4", -3.0), "beta", "mu4", +3.0), "gamma", "mu4", -0.3)
    g = gate(base, cur, noise=TOY_NOISE["tasks"])
    verdict = {(c.dataset, c.backbone, c.split, c.stage): c.verdict for c in g.of("cell")}
    assert verdict[("alpha", "mu4", "test", "final")] == "regressed"
    assert verdict[("beta", "mu4", "test", "final")] == "improved"
    assert verdict[("gamma", "mu4", "test", "final")] == "unchanged"
    assert verdict[("alpha", "mu4_dpn", "test", "final")] == "unchanged"
    small = next(c for c in g.of("cell") if (c.dataset, c.backbone, c.split) == ("gamma", "mu4", "test"))
    assert small.change == pytest.approx(-0.3) and small.p < 1e-9 and small.significant  # beyond arithmetic
    assert g.missing == [] and g.new == [] and g.protocol == []
    b, c = write(base, tmp_path / "base"), write(cur, tmp_path / "cur")
    model = toy_noise_model(tmp_path)
    assert cli(f"regress --baseline {b} --current {c} --noise-model {model}") == 1
    out = capsys.readouterr().out
    assert "**REGRESSION**" in out and "## Regressions" in out and "## Improvements" in out
    ok = write(shifted(base, "gamma", "mu4", -0.3), tmp_path / "ok")
    assert cli(f"regress --baseline {b} --current {ok} --noise-model {model}") == 0
    assert "**OK**" in capsys.readouterr().out


def test_regress_reports_missing_cells(toy_runs, tmp_path, capsys):
    base = [r for r in load_records([toy_runs]) if r["task"] == "toy"]
    cur = [r for r in base if r["dataset"] != "gamma"]
    g = gate(base, cur, noise=TOY_NOISE["tasks"])
    assert {k[1] for k in g.missing} == {"gamma"} and g.new == []
    b, c = write(base, tmp_path / "b"), write(cur, tmp_path / "c")
    assert cli(f"regress --baseline {b} --current {c}") == 1  # missing cells fail by default, as in `nightly`
    assert "## Missing from current" in capsys.readouterr().out
    assert cli(f"regress --baseline {b} --current {c} --no-fail-on-missing") == 0


# --- CLI ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv,message",
    [
        (["run", "toi", "--backbone", "mu4"], "unknown task 'toi'; did you mean toy"),
        (["run", "toy", "--backbone", "mu4_dpm"], "unknown backbone 'mu4_dpm'; did you mean mu4_dpn"),
        (["run", "toy", "--backbone", "mu4", "--datasets", "alfa"], "no dataset 'alfa'; did you mean alpha?"),
        (["run", "toy"], "give --backbone"),
        (["report", "/nonexistent/runs"], "records folder /nonexistent/runs does not exist"),
    ],
)
def test_cli_errors_are_one_line_exit_2(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and err.startswith("transferbench: error: ")


def test_an_unwritable_output_is_one_line_exit_2_before_any_work(tmp_path, monkeypatch, capsys):
    """`leaderboard results/runs -o /proc/x.md` ended in a FileNotFoundError traceback once the tables and figures
    were made. -o of leaderboard and report is checked first: one line naming the problem and the fix, exit 2,
    no record read. A missing folder on the way is made, as before, and the probe leaves nothing behind."""
    import transferbench.records.store
    import transferbench.reporting.leaderboard

    def no_work(*a, **k):
        raise AssertionError("the work began before -o was checked")

    monkeypatch.setattr(transferbench.records.store, "load_records", no_work)
    monkeypatch.setattr(transferbench.reporting.leaderboard, "write_leaderboard", no_work)
    runs = tmp_path / "runs"
    runs.mkdir()
    (tmp_path / "a-file").write_text("x")
    cases = [
        (tmp_path / "a-file" / "x.md", f"-o {tmp_path}/a-file/x.md: {tmp_path}/a-file is a file, not a folder"),
        (tmp_path, f"-o {tmp_path} is a folder, not a file"),
    ]
    if Path("/proc/self").is_dir():  # Linux: /proc takes no new files
        cases.append((Path("/proc/x.md"), "-o /proc/x.md: cannot write in /proc (no such file or directory)"))
    for out, message in cases:
        for command in ("leaderboard", "report"):
            assert main([command, str(runs), "-o", str(out)]) == 2, (command, out)
            err = capsys.readouterr().err
            assert err == f"transferbench: error: {message}; give -o a file in a writable folder\n", err
    monkeypatch.setattr(transferbench.reporting.leaderboard, "write_leaderboard", lambda dirs, out, **k: out)
    assert main(["leaderboard", str(runs), "-o", str(tmp_path / "new" / "deeper" / "LB.md")]) == 0
    assert list((tmp_path / "new" / "deeper").iterdir()) == []


def test_cli_run_prints_the_table_and_resumes(tmp_path, capsys):
    line = "run toy --suite quick --backbone mu4,mu4_dpn --no-progress --reference mu4 --out"
    assert cli(line, tmp_path) == 0
    cap = capsys.readouterr()
    assert "8 ok, 0 diverged, 0 failed, 0 skipped" in cap.err and "| mu4_dpn" in cap.out
    assert cli(line, tmp_path) == 0
    assert "0 ok, 0 diverged, 0 failed, 8 skipped" in capsys.readouterr().err


def test_cli_help_teaches(capsys):
    with pytest.raises(SystemExit):
        cli("--help")
    out = capsys.readouterr().out
    assert "examples:" in out and "transferbench run vtab --backbone b32,b32_dpn" in out
    with pytest.raises(SystemExit):
        cli("run --help")
    assert "NAME@CHECKPOINT" in capsys.readouterr().out


def test_list_shows_tasks_suites_and_backbones_with_their_facts(capsys):
    assert cli("list tasks") == 0 and "toyshots" in capsys.readouterr().out
    assert cli("list suites") == 0 and "quick" in capsys.readouterr().out
    assert cli("list backbones") == 0
    out = capsys.readouterr().out
    b16 = next(line for line in out.splitlines() if line.startswith("| b16 "))
    assert "85.8" in b16  # ViT-B/16 without its 1000-class head: 86.57M - 0.77M


# --- records of mixed types, pipes ---------------------------------------------------------------------


def test_reports_survive_records_of_mixed_hyper_parameter_types(toy_runs, tmp_path, capsys):
    """A folder as earlier versions could leave it: `--set steps=abc` recorded failed cells with a string
    where the spec has an int, and an axis holds 5 and '5'. report, leaderboard and regress still work, and
    the good results are exactly those of the clean folder."""
    clean = load_records([toy_runs])
    poisoned = copy.deepcopy(clean)
    for r in [r for r in clean if r["task"] == "toy" and r["dataset"] == "alpha"][:6]:
        bad = copy.deepcopy(r)
        bad.update(
            status="failed",
            reason="TypeError: 'str' object cannot be interpreted as an integer",
            metrics={},
            key="bad" + r["key"][3:],
            hparams={**r["hparams"], "steps": "abc"},
        )
        poisoned.append(bad)
    for r in [r for r in clean if r["task"] == "toyshots" and r["hparams"]["shots"] == 5]:
        text = copy.deepcopy(r)
        text.update(key="txt" + r["key"][3:], hparams={**r["hparams"], "shots": "5"})
        poisoned.append(text)
    folder = write(poisoned, tmp_path / "runs")
    assert cli(f"report {folder} --reference mu4") == 0
    cap = capsys.readouterr()
    assert "6 failed cells have no metric" in cap.err and "steps=abc" not in cap.out
    # the text '5' of an older version gets its own table, after the numbers'
    assert (
        cap.out.index("### toyshots — shots=5 —")
        < cap.out.index("### toyshots — shots=1 —")
        < cap.out.index("### toyshots — shots='5' —")
    )
    good = {(t.task, t.setting): t.rows for t in build_tables(aggregate(clean), reference="mu4")}
    mixed = {(t.task, t.setting): t.rows for t in build_tables(aggregate(load_records([folder])), reference="mu4")}
    assert mixed[("toy", "")] == good[("toy", "")]
    assert cli(f"report {folder} --format csv") == 0
    assert main(["leaderboard", str(folder), "-o", str(tmp_path / "LB.md")]) == 0
    # regress reads them too, and fails on the failed cells, as a night does
    capsys.readouterr()
    assert cli(f"regress --baseline {toy_runs} --current {folder}") == 1
    assert capsys.readouterr().out.splitlines()[2].startswith("**REGRESSION** (6 cells failed or diverged)")


@pytest.mark.parametrize(
    "argv", [["report", "{runs}"], ["list", "suites"], ["regress", "--baseline", "{runs}", "--current", "{runs}"]]
)
def test_a_closed_pipe_ends_quietly_with_exit_0(toy_runs, argv):
    import os
    import subprocess
    import sys

    argv = [a.format(runs=toy_runs) for a in argv]
    read, write_end = os.pipe()
    os.close(read)  # the reader is gone before anything is written: the first write meets EPIPE
    proc = subprocess.run(
        [sys.executable, "-m", "transferbench.cli", *argv], stdout=write_end, stderr=subprocess.PIPE, text=True
    )
    os.close(write_end)
    assert (proc.returncode, proc.stderr) == (0, "")
    # and as a user types it: the reader stops after a few lines
    line = " ".join(f"'{a}'" for a in argv)
    shell = subprocess.run(
        ["bash", "-c", f"set -o pipefail; '{sys.executable}' -m transferbench.cli {line} | head -1"],
        capture_output=True,
        text=True,
    )
    assert shell.returncode == 0 and shell.stderr == "" and len(shell.stdout.splitlines()) == 1


def test_every_comparison_of_the_committed_leaderboard_has_one_verdict():
    """Over every comparison the committed records make (each task's tables, their sanity tables and the
    overview's headlines): the mark, the interval and the p-value come from one test, so they agree."""
    from pathlib import Path

    from transferbench.records.store import load_records
    from transferbench.reporting.kinds import report_tables
    from transferbench.reporting.overview import headline_cells
    from transferbench.reporting.tables import sanity_table, stem_references

    records = load_records([Path(__file__).resolve().parent.parent / "results" / "runs"])
    tables = report_tables(records)
    tables += [s for s in map(sanity_table, list(tables)) if s is not None]
    cells = [v for t in tables for row in t.rows.values() for v in row.values()]
    refs = {}
    for t in tables:
        refs.setdefault(t.task, set()).update(t.rows)
    cells += [
        v
        for _, values, _ in headline_cells(tables, lambda task: stem_references(refs.get(task, ())))
        for v in values.values()
    ]
    judged = [v for v in cells if v.delta is not None and v.delta.ci is not None]
    assert len(judged) > 500  # the leaderboard's comparisons, suite means among them
    assert any(v.delta.method == "welch" for v in judged) and any(v.shared for v in judged)
    for v in judged:
        d = v.delta
        assert d.p is not None and (d.p < 0.05) == d.excludes_zero, d
        assert (v.better or v.worse) == d.excludes_zero, d


def test_pretrain_levers_reads_the_sanity_question_as_the_leaderboard_does():
    """benchmarks.pretrain_levers judges a pretraining variant by the leaderboard's few-shot sanity column (each
    checkpoint against random init of its architecture, the paired suite mean over the 7 sets, and the sets whose
    paired interval lies below 0); on the committed records both must give the same figures."""
    from pathlib import Path

    from benchmarks.pretrain_levers import gains
    from transferbench.reporting.kinds import report_tables
    from transferbench.reporting.tables import sanity_table

    records = load_records([Path(__file__).resolve().parent.parent / "results" / "runs" / "fewshot"])
    for shots in (25, 10):
        (table,) = [t for t in report_tables(records) if t.axes == {"shots": shots}]
        sanity = sanity_table(table)
        for arch in ("mu4", "mu4_dpn", "mu4_dtn"):
            mine = [r for r in records if r["backbone"] in (arch, f"{arch}@embedded")]
            mean, worse = gains(mine, arch)[shots]
            row = sanity.rows[f"{arch}@embedded"]
            assert (mean.mean, mean.ci) == pytest.approx((row["mean"].delta.mean, row["mean"].delta.ci), abs=1e-9)
            assert worse == [c for c in table.columns if c not in table.group_columns and row[c].worse]


def test_a_records_folder_that_is_a_file_or_missing_is_named_so(tmp_path):
    from transferbench.errors import UserError
    from transferbench.records.store import load_records

    (tmp_path / "notes.md").write_text("# not records\n")
    with pytest.raises(UserError, match=r"notes\.md is a file, not a records folder \(give the --out folder"):
        load_records([tmp_path / "notes.md"])
    with pytest.raises(UserError, match=r"nowhere does not exist \(give the --out folder"):
        load_records([tmp_path / "nowhere"])
