"""What a release is made of, checked against itself: one version (the package's, which pyproject, the changelog
and CITATION.cff repeat), the changelog's protocol table against the task specs, the licence, py.typed, the
workflows' commands against .ci/run, the README, the CLI and the extras, and ruff's lint and format check."""

import re
import shlex
import shutil
import subprocess
from importlib.metadata import metadata, version
from pathlib import Path

import pytest
import yaml
from test_faults import read_pyproject

import transferbench
from transferbench.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
WORKFLOWS = ROOT / ".github" / "workflows"


def test_one_version_written_once():
    project = read_pyproject()["project"]
    assert "version" not in project and project["dynamic"] == ["version"]
    assert read_pyproject()["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "transferbench.__version__"}
    assert version("transferbench") == transferbench.__version__  # the installed metadata reads the package


def test_report_kinds_are_registered_under_the_names_their_cells_carry():
    from transferbench import cell

    kinds = read_pyproject()["project"]["entry-points"]["transferbench.reports"]
    names = {cell.CORRUPTION_REPORT: "robustness", cell.HIRES_REPORT: "hires", cell.DIAGNOSTICS_REPORT: "diagnostics"}
    assert kinds == {name: f"transferbench.reporting.{module}:KIND" for name, module in names.items()}


def test_changelog_names_this_version_and_every_tasks_protocol():
    from transferbench.spec import installed_specs

    text = (ROOT / "CHANGELOG.md").read_text()
    top = re.search(r"^## \[([^\]]+)\]", text, re.M)
    assert top and top.group(1) == transferbench.__version__, "a new version needs its changelog entry"
    section = text[top.end() : re.search(r"^## \[", text[top.end() :], re.M).start() + top.end()]
    table = dict(re.findall(r"^\| (\w+) \| (\w+) \|$", section, re.M))
    table.pop("task")  # the header row
    specs = {
        d["task"]: str(d["protocol_version"])
        for d in map(yaml.safe_load, map(Path.read_text, installed_specs().values()))
    }
    specs.pop("toy", None), specs.pop("toybest", None), specs.pop("toyshots", None)  # the tests' plugin
    assert table == specs, "a changed protocol version raises the version, with a changelog entry"


def test_citation_and_citing_name_this_version():
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    assert str(cff["version"]) == transferbench.__version__ and cff["license"] == "Apache-2.0"
    assert f"version = {{{transferbench.__version__}}}" in (ROOT / "docs" / "citing.md").read_text()
    titles = {r["title"] for r in cff["references"]}
    assert {"Dual PatchNorm", "Dynamic Token Normalization Improves Vision Transformers"} <= titles


def test_licence_metadata_and_typing_marker():
    assert "Apache License\n                           Version 2.0, January 2004" in (ROOT / "LICENSE").read_text()
    meta = metadata("transferbench")
    assert meta["License-Expression"] == "Apache-2.0"
    assert {u.split(",")[0] for u in meta.get_all("Project-URL")} >= {"Homepage", "Repository", "Issues", "Changelog"}
    assert (Path(transferbench.__file__).parent / "py.typed").is_file()
    assert "py.typed" in read_pyproject()["tool"]["setuptools"]["package-data"]["transferbench"]


def test_tests_workflow_runs_the_readme_command_on_each_supported_python_and_ruff():
    flow = yaml.safe_load((WORKFLOWS / "tests.yml").read_text())
    assert set(flow[True]) == {"push", "pull_request"}  # yaml reads the key `on` as True
    tests = flow["jobs"]["tests"]
    pythons = tests["strategy"]["matrix"]["python-version"]
    classifiers = read_pyproject()["project"]["classifiers"]
    assert pythons == [c.rsplit(" :: ", 1)[1] for c in classifiers if re.fullmatch(r".*Python :: 3\.\d+", c)]
    assert [s["run"] for s in tests["steps"] if "run" in s] == ["bash .ci/run"]
    ci = [
        line
        for line in (ROOT / ".ci" / "run").read_text().splitlines()
        if line and not line.startswith(("#", "set", "cd"))
    ]
    readme = (ROOT / "README.md").read_text()
    commands = re.search(r"```bash\n(.*?)\n(.*?)\n```", readme, re.S)
    assert ci == [commands.group(2)]  # .ci/run is the README's second command
    lint = [s["run"] for s in flow["jobs"]["lint"]["steps"] if "run" in s]
    pin = next(d for d in read_pyproject()["project"]["optional-dependencies"]["dev"] if d.startswith("ruff"))
    assert lint == [f'python -m pip install "{pin}"', "ruff check .", "ruff format --check ."]


def test_nightly_workflow_command_parses_with_the_cli():
    flow = yaml.safe_load((WORKFLOWS / "nightly.yml").read_text())
    (script,) = [s["run"] for s in flow["jobs"]["nightly"]["steps"] if "transferbench nightly" in s.get("run", "")]
    command = re.search(r"transferbench nightly [^\n]*", script.replace("\\\n", " ")).group(0)
    values = {
        "$base": "results/nightly",
        "$night": "2026-01-01",
        '${TASKS:+--tasks "$TASKS"}': "--tasks vtab,fewshot",
    }
    for var, value in values.items():
        command = command.replace(var, value)
    assert "$" not in command, command
    argv = shlex.split(command)
    args = build_parser().parse_args(argv[1:])
    assert args.command == "nightly" and args.suite == "nightly" and args.no_progress and args.jobs == 2
    assert args.tasks == ["vtab", "fewshot"] and not args.allow_missing
    # changes meant to move numbers come from the ledger beside the anchor, never from the scheduled job's flags
    assert not args.accept and not args.accept_code and not args.no_rebuild


@pytest.mark.skipif(shutil.which("ruff") is None, reason="ruff is in the dev extra")
@pytest.mark.parametrize("command", [["ruff", "check", "."], ["ruff", "format", "--check", "."]])
def test_ruff_passes(command):
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:]


# --- records outlive the machine they were made on ---------------------------------------------------------------


def test_a_record_names_its_schema_its_checkpoint_portably_and_its_environment(tmp_path, monkeypatch):
    from transferbench.adapters import prepare_task
    from transferbench.backbones import create_backbone, save_checkpoint
    from transferbench.backbones.weights import resolve_backbone
    from transferbench.engine.runner import RunOptions, run_task
    from transferbench.records.store import SCHEMA_VERSION, load_records

    monkeypatch.chdir(tmp_path)
    save_checkpoint(create_backbone("mu4"), tmp_path / "ckpt" / "mine.safetensors")
    task = prepare_task("toy", suite="quick")
    run_task(task, [resolve_backbone("mu4@ckpt/mine.safetensors")], tmp_path / "runs", RunOptions(show_progress=False))
    (rec, *_) = load_records([tmp_path / "runs"])
    assert rec["schema_version"] == SCHEMA_VERSION == 2
    assert rec["checkpoint"] == "ckpt/mine.safetensors"  # relative to where the run was started
    env = rec["environment"]
    assert env["torchvision"] and env["open_clip_torch"] and env["scikit-image"] and "git_dirty" in env
    assert "cuda" in env and "cudnn" in env


def test_portable_paths_never_hold_this_machines_absolute_path(tmp_path, monkeypatch):
    from transferbench.paths.portable import expand, portable

    monkeypatch.setenv("TRANSFERBENCH_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    inside = tmp_path / "home" / "checkpoints" / "a.safetensors"
    assert portable(inside) == "$TRANSFERBENCH_HOME/checkpoints/a.safetensors" and expand(portable(inside)) == inside
    shipped = Path(transferbench.__file__).parent / "weights" / "x.safetensors"
    assert portable(shipped) == "transferbench/weights/x.safetensors" and expand(portable(shipped)) == shipped
    assert portable(tmp_path / "w" / "b.pth") == "w/b.pth"
    assert portable("/elsewhere/c.npz") == "c.npz"  # outside every known root: the name (its sha256 is beside it)


def test_metrics_are_stored_without_float_noise():
    from transferbench.records.store import tidy

    assert tidy(57.699999999999996) == 57.7 and tidy(100 * 797 / 1000) == 79.7
    assert repr(tidy(100 * 0.577)) == "57.7" and repr(100 * 0.577) == "57.699999999999996"
    v = 100 * 123457 / 1000003  # a million examples resolve 1e-4 points; 15 digits keep 1e-13
    assert abs(tidy(v) - v) < 1e-12
    assert tidy(1 / 3) == 0.333333333333333


def test_records_of_schema_1_stay_readable_beside_the_committed_ones():
    """Records of schema 1 (no schema_version, absolute checkpoint paths: six few-shot cells as the committed
    records held them before their regeneration, in tests/fixtures/records_schema1) read strictly beside the
    committed schema-2 records and report together. mu4@embedded against mu4 on mini_digits at 25 shots: seeds 0,
    1, 2 differ by 71.77 - 58.59, 72.15 - 59.97 and 72.27 - 55.08, a mean of 14.2 points."""
    from transferbench.records.aggregate import aggregate
    from transferbench.records.store import load_records, schema_version
    from transferbench.reporting.formats import render
    from transferbench.reporting.kinds import report_tables
    from transferbench.reporting.tables import build_tables, sanity_table

    old = load_records([ROOT / "tests" / "fixtures" / "records_schema1"], strict=True)
    assert len(old) == 6 and {schema_version(r) for r in old} == {1}
    assert {(r["checkpoint"] or "")[:1] for r in old} == {"", "/"}  # random init, an absolute path
    committed = [r for r in load_records([ROOT / "results" / "runs"], strict=True) if r["task"] != "fewshot"]
    assert len(committed) > 500 and 2 in {schema_version(r) for r in committed}
    assert "mu4_dpn@embedded" in render(report_tables(old + committed))
    s = sanity_table(build_tables(aggregate(old))[0])
    assert s.rows["mu4@embedded"]["mini_digits"].delta.mean == pytest.approx(14.18, abs=0.005)
