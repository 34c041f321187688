"""A runner's first night (transferbench.night): the anchor's records were computed in other arithmetic, so the nightly
checks out the commit they name, reruns the suite there on this runner, caches it, and judges tonight exactly
against it, with the acceptance ledger beside the anchor; re-anchoring is one command. Everything runs in a git
repository of its own holding a copy of the package, through `python -m transferbench` as a user runs it."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
QUICK = ["--suite", "quick", "--backbone", "mu4,mu4_dpn", "--no-progress"]
# a sub-noise fault of the kind benchmarks/gate_power.py catalogues: every metric 0.3 points lower, in the engine
FAULT = (
    "        metrics = _check_metrics(result, cell)\n",
    "        metrics = {s: {k: v - 0.3 for k, v in m.items()} for s, m in _check_metrics(result, cell).items()}\n",
)


def git(repo: Path, *args: str) -> str:
    out = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True)
    return out.stdout.strip()


def tb(repo: Path, *args: str, env=None) -> subprocess.CompletedProcess:
    environment = {**os.environ, **(env or {})}
    environment["PYTHONPATH"] = os.pathsep.join(p for p in (str(repo), os.environ.get("PYTHONPATH")) if p)
    return subprocess.run(
        [sys.executable, "-m", "transferbench.cli", *args], cwd=repo, env=environment, capture_output=True, text=True
    )


def commit(repo: Path, message: str) -> str:
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD")


@pytest.fixture
def repo(tmp_path):
    """A checkout of its own: the package (without the shipped weights, which the toy task never reads)."""
    repo = tmp_path / "repo"
    shutil.copytree(
        ROOT / "transferbench",
        repo / "transferbench",
        ignore=shutil.ignore_patterns("__pycache__", "*.safetensors", "*.safetensors.digest"),
    )
    shutil.copytree(ROOT / "tasks", repo / "tasks")
    (repo / ".gitignore").write_text("__pycache__/\n")
    git(repo.parent, "init", "-q", str(repo))
    return repo


@pytest.mark.slow
def test_a_first_night_rebuilds_the_anchor_judges_exactly_and_catches_a_sub_noise_fault(repo, tmp_path):
    home = {"TRANSFERBENCH_HOME": str(tmp_path / "home")}
    a = commit(repo, "anchor")
    base, roll, out = tmp_path / "anchor", tmp_path / "rolling", tmp_path / "nightly"
    # the anchor, computed in another arithmetic (a variable that steers kernels: another runner, to the digest)
    made = tb(repo, "run", "toy", *QUICK, "--out", str(base), env={**home, "MKL_CBWR": "COMPATIBLE"})
    assert made.returncode == 0, made.stderr
    night = ["nightly", *QUICK, "--baseline", str(base), "--rolling", str(roll), "--out", str(out), "--date"]
    # tonight's checkout is a later commit whose code differs (a statement that moves no number): the rebuild must
    # run the anchor's code, not tonight's
    compute = repo / "transferbench" / "engine" / "compute.py"
    compute.write_text(compute.read_text() + "\nNOTHING_MOVES = 1\n")
    commit(repo, "a change that moves no number")

    first = tb(repo, *night, "d1", env=home)
    assert first.returncode == 0, first.stdout + first.stderr
    report = (out / "d1" / "REGRESSION.md").read_text()
    # every cell judged to the bit, against the anchor's own code rerun here: none by statistics alone
    assert report.split("\n")[2].startswith("**OK**: all 8 cells judged exactly (8 bit-identical")
    assert "rebuilt on this runner tonight" in report and f"the anchor at {a[:12]}" in report
    (rebuilt,) = [p for p in (roll / "anchors").iterdir() if p.is_dir()]
    info = yaml.safe_load((rebuilt / "ANCHOR.yaml").read_text())
    assert info["commit"] == a and info["exit"] in (0, 1)
    # the rerun against the committed anchor: a pure change of arithmetic, reported, and judged statistically
    assert "8 by the statistical tier" in (rebuilt / "ARITHMETIC.md").read_text()
    again = [json.loads(p.read_text()) for p in rebuilt.rglob("*/*/*.json")]
    anchor = [json.loads(p.read_text()) for p in base.rglob("*/*/*.json")]
    tonight = [json.loads(p.read_text()) for p in (out / "d1").rglob("*/*/*.json")]
    assert {r["environment"]["git_sha"] for r in again} == {a}
    code = lambda rs: {r["fingerprint"]["digest"] for r in rs}  # noqa: E731
    assert code(again) == code(anchor) and not code(again) & code(tonight)
    assert not [p for p in roll.parent.rglob(".worktree-*")]  # the worktree is gone
    # a passing night judged exactly became the rolling baseline
    (kept,) = [p for p in roll.iterdir() if p.name != "anchors"]

    # a commit with a fault far below the statistical tier's floors: named by module, exactly
    path = repo / "transferbench" / "engine" / "compute.py"
    text = path.read_text()
    assert text.count(FAULT[0]) == 1
    path.write_text(text.replace(*FAULT))
    commit(repo, "fault")
    second = tb(repo, *night, "d2", env=home)
    assert second.returncode == 1, second.stdout + second.stderr
    report = (out / "d2" / "REGRESSION.md").read_text()
    assert "8 changed by code" in report.split("\n")[2] and ", cached)" in report
    assert "| transferbench.engine.compute | 8       | toy     | 0.3                     | FAILS     |" in report
    assert "rebuilding" not in second.stderr  # the anchor rebuilt on this runner is reused
    assert sorted(kept.rglob("*.json")) and "not kept as the rolling baseline" in report

    # the change declared in the ledger beside the anchor: honoured against the anchor (computed before it) and
    # against the rolling baseline (computed before it too); the night passes, exactly, and becomes the baseline
    accepted = tb(repo, "accept", "--anchor", str(base), "--code", "engine.compute", "--why", "a meant shift")
    assert accepted.returncode == 0, accepted.stderr
    third = tb(repo, *night, "d3", env=home)
    assert third.returncode == 0, third.stdout + third.stderr
    report = (out / "d3" / "REGRESSION.md").read_text()
    assert "8 changed by accepted code" in report and "- transferbench.engine.compute@" in report
    assert "kept as the rolling baseline" in report
    # a second change of that module has another fingerprint: the entry no longer covers it, on either baseline
    path.write_text(path.read_text().replace("v - 0.3", "v - 0.6"))
    commit(repo, "another fault in the same module")
    fourth = tb(repo, *night, "d4", env=home)
    assert fourth.returncode == 1
    report = (out / "d4" / "REGRESSION.md").read_text()
    rolling = report.split("## Against the rolling baseline")[1]
    assert "8 changed by code" in rolling.split("\n")[2]


@pytest.mark.slow
def test_reanchoring_is_one_command_that_compares_and_empties_the_ledger(repo, tmp_path):
    home = {"TRANSFERBENCH_HOME": str(tmp_path / "home")}
    commit(repo, "anchor")
    base = tmp_path / "anchor"
    assert tb(repo, "run", "toy", *QUICK, "--out", str(base), env=home).returncode == 0
    path = repo / "transferbench" / "engine" / "compute.py"
    path.write_text(path.read_text().replace(*FAULT))
    b = commit(repo, "a meant change")
    assert tb(repo, "accept", "--anchor", str(base), "--code", "engine", "--why", "x").returncode == 0
    done = tb(repo, "reanchor", "--anchor", str(base), *QUICK, env=home)
    assert done.returncode == 0, done.stdout + done.stderr
    records = [json.loads(p.read_text()) for p in base.rglob("*/*/*.json")]
    assert len(records) == 8 and {r["environment"]["git_sha"] for r in records} == {b}
    comparison = (base / "REANCHOR.md").read_text()
    # exact (one runner), and the old ledger's entry, which names the engine's modules, marks the change accepted
    assert "8 changed by accepted code" in comparison and "transferbench.engine.compute" in comparison
    assert "accepted: []" in (base / "ACCEPTED.yaml").read_text()
    # a dirty checkout cannot make an anchor that a later night could rebuild
    (repo / "transferbench" / "errors.py").write_text((repo / "transferbench" / "errors.py").read_text() + "\n# x\n")
    dirty = tb(repo, "reanchor", "--anchor", str(base), *QUICK, env=home)
    assert dirty.returncode == 2 and "uncommitted changes" in dirty.stderr
    assert len(dirty.stderr.strip().splitlines()) == 1
