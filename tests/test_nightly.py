"""`transferbench nightly` end to end with the toy adapter: an unchanged backbone passes, a degraded one fails
with its regressed cells named, a crashing cell fails the night too, and bad input is one line."""

import numpy as np
import pytest
from conftest import toy_noise_model
from kit import cli
from toyplugin import toy_accuracy

from transferbench.cli import main
from transferbench.spec import BUILTIN_TASKS as BUILTIN

NIGHTLY = ["nightly", "--suite", "quick", "--backbone", "mu4,mu4_dpn", "--no-progress"]


@pytest.fixture
def baseline(tmp_path):
    base = tmp_path / "baseline"
    assert cli(f"run toy --suite quick --backbone mu4,mu4_dpn --out {base} --no-progress") == 0
    return base


def night(baseline, out, date: str, *more: str) -> tuple[int, str]:
    """`transferbench nightly` of the quick suite against `baseline` into OUT/DATE: (exit code, its report)."""
    code = main([*NIGHTLY, "--baseline", str(baseline), "--out", str(out), "--date", date, *more])
    return code, (out / date / "REGRESSION.md").read_text()


def test_unchanged_passes_and_writes_report_and_leaderboard(baseline, tmp_path, capsys):
    out = tmp_path / "nightly"
    assert main([*NIGHTLY, "--baseline", str(baseline), "--out", str(out), "--date", "2026-11-23"]) == 0
    night = out / "2026-11-23"
    report = (night / "REGRESSION.md").read_text()
    # 2 backbones x (select on val, final on test), every one compared on both seeds
    # one machine, the same libraries and threads: every cell is judged to the bit, and reproduced
    assert report.startswith(
        f"# Nightly 2026-11-23: {night}\n\n**OK**: all 8 cells judged exactly (8 bit-identical, "
        "0 changed by code, 0 irreproducible), 0 by the statistical tier (their arithmetic differs or is unrecorded).\n"
    )
    # the anchor was computed in tonight's arithmetic: it is the baseline itself, nothing rebuilt
    assert f"- Against the anchor {baseline}: passes; all 8 cells judged exactly" in report
    assert "## toy" in (night / "LEADERBOARD.md").read_text()
    assert capsys.readouterr().out.strip() == report.strip()
    # the same date again resumes: every cell is skipped
    assert main([*NIGHTLY, "--baseline", str(baseline), "--out", str(out), "--date", "2026-11-23"]) == 0
    assert "0 ok, 0 diverged, 0 failed, 8 skipped" in capsys.readouterr().err


def test_rolling_baselines_one_per_arithmetic_written_only_from_exact_passing_nights(baseline, tmp_path, monkeypatch):
    from transferbench.records.store import load_records

    roll, out = tmp_path / "rolling", tmp_path / "nightly"
    night = [*NIGHTLY, "--baseline", str(baseline), "--out", str(out), "--rolling", str(roll), "--date"]
    # the first night of this arithmetic: none yet, so the anchor alone (exact: the same machine); it passes
    # and becomes the rolling baseline
    assert main([*night, "n1"]) == 0
    report = (out / "n1" / "REGRESSION.md").read_text()
    assert "No rolling baseline of this arithmetic yet" in report and "all 8 cells judged exactly" in report
    (kept,) = list(roll.iterdir())
    assert len(load_records([kept])) == 8 and f"kept as the rolling baseline {kept}" in report
    # the next night: exact against the anchor and against the rolling baseline
    assert main([*night, "n2"]) == 0
    report = (out / "n2" / "REGRESSION.md").read_text()
    assert f"- Against the rolling baseline {kept}: passes; all 8 cells judged exactly" in report
    assert f"- Against the anchor {baseline}: passes; all 8 cells judged exactly" in report
    # a failing night replaces nothing
    monkeypatch.setenv("TOY_DEGRADE", "alpha:5")
    assert main([*night, "n3"]) == 1
    report = (out / "n3" / "REGRESSION.md").read_text()
    assert "against the anchor: 8 irreproducible; against the rolling baseline: 8 irreproducible" in report
    assert "not kept as the rolling baseline: the night failed" in report
    assert sorted(r["finished_at"] for r in load_records([kept])) == sorted(
        r["finished_at"] for r in load_records([out / "n2"])
    )
    # another arithmetic (a variable that steers kernels) with --no-rebuild: judged statistically, and such a night
    # never becomes a rolling baseline (it passed no exact judgment)
    monkeypatch.delenv("TOY_DEGRADE")
    monkeypatch.setenv("MKL_CBWR", "COMPATIBLE")
    assert main([*night, "n4", "--no-rebuild", "--noise-model", str(toy_noise_model(tmp_path))]) == 0
    report = (out / "n4" / "REGRESSION.md").read_text()
    assert "8 of its cells were computed in other arithmetic than tonight's; --no-rebuild: not rebuilt" in report
    assert "0 cells judged exactly" in report and "not kept as the rolling baseline: tonight was not judged" in report
    assert len(list(roll.iterdir())) == 1


def test_outputs_that_move_with_code_and_arithmetic_unchanged_are_irreproducible(baseline, tmp_path, monkeypatch):
    # the toy adapter reads this variable: to the gate it is a cause outside code, weights, data and arithmetic
    monkeypatch.setenv("TOY_DEGRADE", "alpha:5")
    code, report = night(baseline, tmp_path / "nightly", "2026-11-24")
    assert code == 1 and report.split("\n")[2].startswith(
        "**REGRESSION** (against the anchor: 8 irreproducible): all 8 cells judged exactly"
    )
    assert "- toy / alpha / mu4_dpn final seed 1 (Δ -5)" in report.split("## Irreproducible")[1]


def test_a_degraded_backbone_fails_with_its_cells_named(baseline, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TOY_DEGRADE", "alpha:5")
    monkeypatch.setenv("MKL_CBWR", "COMPATIBLE")  # another arithmetic, not rebuilt: the statistical tier judges
    model = toy_noise_model(tmp_path)
    code, report = night(baseline, tmp_path / "nightly", "2026-11-24", "--no-rebuild", "--noise-model", str(model))
    assert code == 1
    # every seed 5 points down, far beyond the toy's arithmetic noise (0.001 points); each backbone's pooled test too
    assert report.startswith("# Nightly 2026-11-24")
    assert "**REGRESSION** (against the anchor: 6 regressed): 0 cells judged exactly" in report
    assert "Statistical tier: 4 regressed, 0 improved" in report
    section = report.split("## Regressions")[1].split("##")[0]
    rows = [line for line in section.splitlines() if line.startswith("| toy ")]
    assert len(rows) == 4
    for backbone in ("mu4", "mu4_dpn"):
        for split, stage in (("val", "select"), ("test", "final")):
            base = np.mean([toy_accuracy(backbone, 5.0, 0.01, s, split, "alpha") for s in (0, 1)])
            cells = [
                *("toy", "alpha", backbone, split, "accuracy", f"{base:.2f}", f"{base - 5:.2f}", "-5.00"),
                *("[-5.00, -5.00]", "2", stage),
            ]
            parsed = [[c.strip() for c in row.strip("|").split("|")] for row in rows]
            # p: the t of a 5-point change against the model's 0.002-point allowance
            assert any(r[:9] + r[10:] == cells and float(r[9]) < 1e-9 for r in parsed), (cells, rows)
    assert "REGRESSION" in capsys.readouterr().out


def test_a_failed_cell_fails_the_night(baseline, tmp_path, monkeypatch):
    monkeypatch.setenv("TOY_FAIL", "alpha")
    code, report = night(baseline, tmp_path / "nightly", "d")
    assert code == 1
    # the select cells failed, so the final cells never ran: both fail the night, and the missing ones are named
    assert report.split("\n")[2].startswith(
        "**REGRESSION** (against the anchor: 4 cells failed or diverged, 4 cells or metrics missing): 0 cells"
    )
    assert "; 4 cells missing from current, 0 new; 4 cells of current failed or diverged." in report
    assert "- toy / alpha / mu4_dpn final seed 1" in report.split("## Missing from current")[1]
    failed = report.split("## Failed in current")[1]
    assert failed.count("RuntimeError: toy failure on alpha") == 4


def test_bad_input_is_one_line_and_runs_nothing(baseline, tmp_path, capsys):
    out = tmp_path / "nightly"
    for argv, message in (
        (["--suite", "default"], "holds no records of suite 'default'"),
        (["--tasks", "toyy"], "did you mean toy"),
        (["--date", "../x"], "--date '../x': give a plain folder name"),
        (["--backbone", "mu4_dnp"], "mu4_dnp"),
    ):
        code = main([*NIGHTLY, "--baseline", str(baseline), "--out", str(out), *argv])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and err[0].startswith("transferbench: error: ") and message in err[0], err
    assert not list(tmp_path.glob("nightly/**/*.json"))


def test_the_workflow_runs_nightly_with_options_it_has_on_a_baseline_that_exists():
    import re
    from pathlib import Path

    import yaml

    from transferbench.cli import build_parser
    from transferbench.records.store import load_records

    root = Path(__file__).parent.parent
    flow = yaml.safe_load((root / ".github/workflows/nightly.yml").read_text())
    triggers = flow.get("on", flow.get(True))  # YAML 1.1 reads the bare key `on` as true
    assert {"schedule", "workflow_dispatch"} <= set(triggers)
    steps = flow["jobs"]["nightly"]["steps"]
    (script,) = [s["run"] for s in steps if "transferbench nightly" in s.get("run", "")]
    nightly = next(a for a in build_parser()._subparsers._group_actions[0].choices.items() if a[0] == "nightly")[1]
    known = {o for a in nightly._actions for o in a.option_strings}
    used = set(re.findall(r"(?<![\w-])--[a-z][a-z-]+", script.split("transferbench nightly", 1)[1]))
    assert used and used <= known, used - known
    assert "--suite nightly" in script and "base=results/nightly" in script and "--rolling rolling" in script
    # every library pinned: a release is an announced change of the arithmetic
    (install,) = [s["run"] for s in steps if s.get("name") == "Install"]
    assert "-c .github/nightly-constraints.txt" in install
    pins = dict(
        line.split("==")
        for line in (root / ".github/nightly-constraints.txt").read_text().splitlines()
        if line and not line.startswith("#")
    )
    assert {"torch", "torchvision", "numpy", "timm", "scipy", "pillow", "open_clip_torch"} <= set(pins)
    uploads = next(s for s in steps if s.get("uses", "").startswith("actions/upload-artifact"))["with"]["path"]
    assert "REGRESSION.md" in uploads and "LEADERBOARD" in uploads
    # the first night's baseline: the committed nightly records, of every task that has a nightly suite
    records = load_records([root / "results/nightly"])
    assert {r["suite"] for r in records} == {"nightly"}
    assert {r["task"] for r in records} == set(BUILTIN)


def test_a_backbone_of_the_baseline_that_did_not_run_fails_unless_named(tmp_path):
    """The suite's backbones changed (or one was dropped): tonight lacks a backbone the baseline holds. That fails,
    unless --backbone named tonight's backbones or --allow-missing names the absent one."""
    from pathlib import Path

    import kit

    from transferbench.gate.decide import GateOptions, noise_model_at
    from transferbench.night import Night

    recs = lambda bbs: [  # noqa: E731
        kit.record("toy", "alpha", bb, s, {"test": {"accuracy": 50.0 + s}}, suite="quick") for bb in bbs for s in (0, 1)
    ]
    base, tonight = recs(["mu4", "mu4_dpn"]), recs(["mu4"])
    opts = GateOptions(floor=0.5, alpha=0.01, noise=noise_model_at(toy_noise_model(tmp_path)))
    ran = {("toy", "mu4")}
    night = Night(Path("base"), tmp_path / "n", "d", "quick", gate=opts)
    judged = night.judge("the anchor", Path("base"), base, tonight, ran)
    assert judged.code == 1 and "tasks or backbones absent" in judged.decision.reasons[0]
    assert judged.decision.gate.absent == [("toy", "mu4_dpn")]
    night.allow_missing = ["toy:mu4_dpn"]
    assert night.judge("the anchor", Path("base"), base, tonight, ran).code == 0
    named = Night(Path("base"), tmp_path / "n", "d", "quick", backbones=["mu4"], gate=opts)
    assert named.judge("the anchor", Path("base"), base, tonight, ran).code == 0
