import os
import signal
import subprocess
import time
from collections import Counter

import pytest
from kit import cli_argv
from toyplugin import toy_accuracy

from transferbench.adapters import prepare_task
from transferbench.backbones.weights import resolve_backbone
from transferbench.engine.compute import Diverged, check_finite
from transferbench.engine.runner import RunOptions, run_task
from transferbench.records.aggregate import aggregate
from transferbench.records.store import load_records
from transferbench.reporting.formats import render
from transferbench.reporting.tables import build_tables

BACKBONES = ["mu4", "mu4_dpn"]
OFFSET = {"alpha": 5.0, "beta": 0.0, "gamma": -10.0}


def run(out, backbones=BACKBONES, **kw):
    sets = kw.pop("sets", ())
    task = prepare_task("toy", sets=sets, seeds=kw.pop("seeds", None), suite=kw.pop("suite", None))
    return run_task(task, [resolve_backbone(b) for b in backbones], out, RunOptions(show_progress=False, **kw))


def test_plan_selects_on_val_and_reports_test_at_the_winner(tmp_path):
    s = run(tmp_path)
    # per dataset and backbone: 4 lrs x 3 seeds on train -> val, then the winner x 3 seeds -> test
    assert (s.ok, s.diverged, s.failed, s.skipped) == (3 * 2 * (3 * 3 + 3), 3 * 2 * 3, 0, 0)
    records = load_records([tmp_path])
    assert len(records) == 3 * 2 * 15
    diverged = [r for r in records if r["status"] == "diverged"]
    assert {r["hparams"]["lr"] for r in diverged} == {3.0}
    assert diverged[0]["reason"] == "non-finite loss inf at step 2"
    for e in aggregate(records):
        assert e.selected == {"lr": 0.01}  # the closed form peaks at lr = 0.01
        expected = {
            seed: toy_accuracy(e.backbone, OFFSET[e.dataset], 0.01, seed, "test", e.dataset) for seed in (0, 1, 2)
        }
        assert e.per_seed == pytest.approx(expected, abs=1e-12)
        assert e.counts == {"ok": 15 - 3, "diverged": 3, "failed": 0}
    r = records[0]
    assert r["environment"]["torch"] and r["environment"]["device"] and r["seconds"] >= 0
    assert set(r) >= {
        "key",
        "task",
        "dataset",
        "backbone",
        "checkpoint_sha256",
        "hparams",
        "seed",
        "protocol_version",
        "metrics",
        "status",
        "reason",
        "finished_at",
    }


def test_rerun_skips_and_force_recomputes(tmp_path):
    first = run(tmp_path)
    ids = {r["key"]: r["run_id"] for r in load_records([tmp_path])}
    again = run(tmp_path)
    assert (again.ok, again.diverged, again.skipped) == (0, 0, len(ids))
    assert {r["key"]: r["run_id"] for r in load_records([tmp_path])} == ids
    forced = run(tmp_path, force=True)
    assert forced.ok + forced.diverged == len(ids)
    assert {r["run_id"] for r in load_records([tmp_path])} == {forced.run_id} != {first.run_id}


def test_failed_cells_do_not_stop_the_plan_and_are_retried(tmp_path, monkeypatch):
    monkeypatch.setenv("TOY_FAIL", "alpha")
    s = run(tmp_path, sets=["lr=0.01"], seeds=[0, 1])
    # alpha's 2 select cells fail (so it never reaches its final stage); beta and gamma go on
    assert (s.failed, s.ok) == (2 * 2, 2 * 2 * (2 + 2))
    assert "RuntimeError: toy failure on alpha" in s.failures[0]
    failed = [r for r in load_records([tmp_path]) if r["status"] == "failed"]
    assert {r["dataset"] for r in failed} == {"alpha"} and "Traceback" in failed[0]["traceback"]
    monkeypatch.delenv("TOY_FAIL")  # the cause is fixed: a rerun retries exactly the failed cells
    s = run(tmp_path, sets=["lr=0.01"], seeds=[0, 1])
    assert (s.ok, s.failed, s.skipped) == (2 * (2 + 2), 0, 2 * 2 * (2 + 2))
    assert all(r["status"] == "ok" for r in load_records([tmp_path]))


def test_a_non_finite_loss_raises_diverged_naming_the_step():
    check_finite(1.5)
    with pytest.raises(Diverged, match="non-finite loss nan at step 7"):
        check_finite(float("nan"), step=7)


SLOW = "run toy --backbone mu4,mu4_dpn --seeds 0,1 --set lr=0.01,0.1 --set delay=0.04 --no-progress --out"


def test_sigkill_mid_plan_then_resume_gives_the_same_table(tmp_path):
    out = tmp_path / "killed"
    log = tmp_path / "computed.log"
    env = {**os.environ, "TOY_LOG": str(log)}
    proc = subprocess.Popen(cli_argv(SLOW, out), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while len(list(out.rglob("*.json"))) < 8 and time.time() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = {r["key"]: r["run_id"] for r in load_records([out])}  # every file parses: nothing torn
    assert 8 <= len(before) < 36, "the kill should land mid-plan"
    done = subprocess.run(cli_argv(SLOW, out), env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    after = {r["key"]: r["run_id"] for r in load_records([out])}
    assert len(after) == 3 * 2 * (2 * 2 + 2)
    assert {k: after[k] for k in before} == before  # finished cells kept, not recomputed
    computed = Counter(log.read_text().split())
    assert all(computed[k] == 1 for k in before)
    assert not [p for p in out.rglob("*") if ".tmp" in p.name]
    # the same table as an uninterrupted run
    fresh = tmp_path / "fresh"
    run(fresh, sets=["lr=0.01,0.1", "delay=0.0"], seeds=[0, 1])
    table = lambda d: render(build_tables(aggregate(load_records([d])), reference="mu4"))  # noqa: E731
    # the same table, but for the header line that names each run's own --set delay
    assert table(out).replace("delay 0.04", "delay 0.0") == table(fresh)
    assert "Settings not at the protocol's defaults: delay 0.04 (--set)" in table(out)


def test_two_runs_into_one_folder_compute_each_cell_once(tmp_path):
    out, log = tmp_path / "shared", tmp_path / "computed.log"
    env = {**os.environ, "TOY_LOG": str(log)}
    procs = [
        subprocess.Popen(cli_argv(SLOW, out), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    errs = [p.communicate(timeout=300)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errs
    records = load_records([out])
    assert len(records) == 3 * 2 * (2 * 2 + 2)
    computed = Counter(log.read_text().split())
    assert set(computed) == {r["key"] for r in records} and set(computed.values()) == {1}
