"""Executors: a local process pool and Ray run the toy plan with the guarantees of the in-process runner
(same records, plan re-evaluated as results arrive, a killed worker's cell retried or failed, never torn or
duplicated, two drivers on one folder computing each cell once)."""

import hashlib
import json
import os
import signal
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from kit import cli, cli_argv
from toyplugin import toy_accuracy

from transferbench.adapters import prepare_task
from transferbench.backbones.weights import resolve_backbone
from transferbench.cli import main
from transferbench.engine.executors import InlineExecutor, PoolExecutor, make_executor
from transferbench.engine.runner import RunOptions, run_task
from transferbench.errors import UserError
from transferbench.records.aggregate import aggregate
from transferbench.records.store import load_records
from transferbench.reporting.formats import render
from transferbench.reporting.tables import build_tables

BACKBONES = ["mu4", "mu4_dpn"]
OFFSET = {"alpha": 5.0, "beta": 0.0, "gamma": -10.0}
SETS = ["lr=0.01,0.1", "steps=2"]  # per dataset and backbone: 2 lrs x 2 seeds -> val, then the winner x 2 seeds
CELLS = 3 * 2 * (2 * 2 + 2)


def run(out, executor=None, sets=(), **kw):
    task = prepare_task("toy", sets=[*SETS, *sets], seeds=[0, 1])
    return run_task(
        task, [resolve_backbone(b) for b in BACKBONES], out, RunOptions(show_progress=False, **kw), executor=executor
    )


def metrics(out) -> dict:
    """key -> (status, metrics as JSON text): what must be byte-identical whichever executor computed it."""
    return {r["key"]: (r["status"], json.dumps(r["metrics"], sort_keys=True)) for r in load_records([out])}


def table(out) -> str:
    return render(build_tables(aggregate(load_records([out])), reference="mu4"))


def check_toy_records(out) -> None:
    """Every record parses, none is left half-written, and each final metric is the closed form's."""
    assert not [p for p in Path(out).rglob("*") if ".tmp" in p.name]
    for e in aggregate(load_records([out])):
        assert e.selected == {"lr": 0.01}
        assert e.per_seed == pytest.approx(
            {s: toy_accuracy(e.backbone, OFFSET[e.dataset], 0.01, s, "test", e.dataset) for s in (0, 1)}, abs=1e-12
        )


def kill_first_worker(pid_dir: Path, done: threading.Event, killed: list) -> None:
    """SIGKILL the process that computes the first cell to start (once), as the OOM killer would."""
    deadline = time.time() + 120
    while not done.is_set() and time.time() < deadline:
        files = sorted(pid_dir.glob("*.pid"))
        if files:
            key, pid = files[0].name.split(".")[:2]
            os.kill(int(pid), signal.SIGKILL)
            killed.append((key, int(pid)))
            return
        time.sleep(0.01)


def run_killing_one(out, executor, retries: int, log: Path, pids: Path):
    """Run the toy plan (cells of 2 x 0.1 s) with `executor` while the first cell's process is SIGKILLed; checks
    what holds either way and returns (summary, killed cell's key, its pid, records by key, computations by key)."""
    done, killed = threading.Event(), []
    killer = threading.Thread(target=kill_first_worker, args=(pids, done, killed))
    killer.start()
    try:
        s = run(out, executor, sets=["delay=0.1"], retries=retries)
    finally:
        done.set()
        killer.join()
    ((key, pid),) = killed
    records = {r["key"]: r for r in load_records([out])}
    computed = Counter(log.read_text().split())
    assert {n for k, n in computed.items() if k != key} == {1}  # the cells beside the killed one ran once
    assert not [p for p in Path(out).rglob("*") if ".tmp" in p.name]
    if retries:
        assert computed[key] == 2 and (s.ok, s.failed) == (CELLS, 0) and len(records) == CELLS
        check_toy_records(out)
    else:
        assert computed[key] == 1 and s.failed == 1 and records[key]["status"] == "failed"
    return s, key, pid, records


def two_drivers(out: Path, log: Path, executor_args: list[str], env=None) -> None:
    """Two `transferbench run` processes at once into `out`: both succeed and every cell is computed once."""
    line = f"run toy --datasets alpha,beta --backbone {','.join(BACKBONES)} --seeds 0,1 --set lr=0.01,0.1"
    line += " --set steps=2 --set delay=0.05"
    cmd = cli_argv(f"{line} {' '.join(executor_args)} --no-progress --out", out)
    procs = [
        subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for _ in range(2)
    ]
    errs = [p.communicate(timeout=300)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errs
    computed = Counter(log.read_text().split())
    assert set(computed) == {r["key"] for r in load_records([out])} and set(computed.values()) == {1}
    assert len(computed) == CELLS // 3 * 2  # two of the three data sets
    check_toy_records(out)


# --- the local process pool -----------------------------------------------------------------------------------


def test_pool_gives_the_inline_records_and_starts_a_final_stage_before_the_sweep_ends(tmp_path, monkeypatch):
    log = tmp_path / "computed.log"
    monkeypatch.setenv("TOY_LOG", str(log))
    inline = run(tmp_path / "inline")
    log.unlink()
    pooled = run(tmp_path / "pool", PoolExecutor(2))
    assert (pooled.ok, pooled.diverged, pooled.failed) == (inline.ok, inline.diverged, inline.failed) == (CELLS, 0, 0)
    assert metrics(tmp_path / "pool") == metrics(tmp_path / "inline")  # same keys, byte-identical metrics
    assert table(tmp_path / "pool") == table(tmp_path / "inline")
    check_toy_records(tmp_path / "pool")
    # the plan is asked again as cells finish: the first final cell starts while other select cells are still
    # to come (a round-based runner would run all 24 select cells first)
    stage = {r["key"]: r["stage"] for r in load_records([tmp_path / "pool"])}
    order = [stage[k] for k in log.read_text().split()]
    assert len(order) == CELLS and order.index("final") < len(order) - 1 - order[::-1].index("select")


@pytest.mark.slow
@pytest.mark.parametrize("retries", [1, 0])
def test_pool_worker_killed_mid_cell_is_retried_or_recorded_failed(tmp_path, monkeypatch, retries):
    log, pids = tmp_path / "computed.log", tmp_path / "pids"
    pids.mkdir()
    monkeypatch.setenv("TOY_LOG", str(log))
    monkeypatch.setenv("TOY_PID_DIR", str(pids))
    s, key, pid, records = run_killing_one(tmp_path / "out", PoolExecutor(2), retries, log, pids)
    if not retries:  # recorded failed, naming the lost worker; a rerun computes exactly that cell (and what it unlocks)
        assert records[key]["reason"].startswith(f"WorkerLost: worker process {pid} died while computing the cell")
        again = run(tmp_path / "out", PoolExecutor(2), sets=["delay=0.1"])
        assert again.failed == 0 and again.ok == CELLS - s.ok
        check_toy_records(tmp_path / "out")


@pytest.mark.slow
def test_two_pool_drivers_into_one_folder_compute_each_cell_once(tmp_path):
    log = tmp_path / "computed.log"
    two_drivers(tmp_path / "shared", log, ["--jobs", "2"], env={**os.environ, "TOY_LOG": str(log)})


def test_inline_is_jobs_1_and_bad_executor_options_are_one_line(tmp_path, capsys):
    assert isinstance(make_executor("local", jobs=1), InlineExecutor)
    pool = make_executor("local", jobs=3)
    assert (
        isinstance(pool, PoolExecutor) and pool.slots == 3 and pool.threads == max(1, len(os.sched_getaffinity(0)) // 3)
    )
    assert make_executor("local", jobs=2, cpus_per_cell=1).threads == 1
    for argv, message in (
        (["--executor", "rya"], "--executor 'rya' is not one of local, ray; did you mean ray?"),
        (["--jobs", "0"], "--jobs must be >= 1, got 0"),
        (["--address", "auto"], "--address and --gpus-per-cell are for --executor ray"),
        (["--executor", "ray", "--jobs", "2"], "--jobs is for --executor local"),
        (["--executor", "ray", "--cpus-per-cell", "0"], "--cpus-per-cell must be > 0, got 0"),
        (["--retries", "-1"], "--retries must be >= 0, got -1"),
        # the local executor sets torch's threads: once clamped silently to 1, now refused
        (["--cpus-per-cell", "0.5"], "--cpus-per-cell 0.5: the local executor gives each cell that many torch threads"),
        (["--cpus-per-cell", "-2"], "--cpus-per-cell must be > 0, got -2"),
        (["--workers", "-1"], "--workers must be >= 0, got -1"),
        (["--micro-batch", "0"], "--micro-batch must be >= 1, got 0"),
    ):
        assert main(["run", "toy", "--backbone", "mu4", "--out", str(tmp_path / "never-made"), *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("transferbench: error: ") and message in err and "\n" not in err
    assert not (tmp_path / "never-made").exists()


@pytest.mark.xdist_group("ray")  # on the Ray tests' worker, before its Ray instance starts (collection order)
def test_an_address_where_no_ray_cluster_answers_is_one_line_and_leaves_no_folder(tmp_path, capsys):
    pytest.importorskip("ray", reason="the scale extra (Ray) is not installed")
    out = tmp_path / "runs" / "x"
    # port 1 refuses at once (Ray alone would retry an unreachable head for minutes); runs before this module's
    # Ray instance starts, so the executor does not find Ray already initialised
    assert cli(f"run toy --backbone mu4 --out {out} --executor ray --address 127.0.0.1:1") == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == (
        "transferbench: error: --address 127.0.0.1:1: no Ray cluster there (127.0.0.1:1 does not answer: "
        "Connection refused); start one with `ray start --head`, or leave --address out to run Ray on this "
        "machine"
    )
    assert not (tmp_path / "runs").exists()


# --- Ray --------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory):
    """A 2-CPU Ray instance on the loopback address, started once for this module. The toy's log and pid folder
    are set before it starts, so its workers see them. Room for 4 idle workers: Ray's workers belong to one job (one
    driver), and at its default limit (the CPUs) two drivers taking turns kill each other's idle workers, each
    restart importing torch again (the two-driver test took 79 s instead of 40)."""
    ray = pytest.importorskip("ray", reason="the scale extra (Ray) is not installed")
    d = tmp_path_factory.mktemp("ray")
    mp = pytest.MonkeyPatch()
    mp.setenv("TOY_LOG", str(d / "computed.log"))
    mp.setenv("TOY_PID_DIR", str(d / "pids"))
    (d / "pids").mkdir()
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        object_store_memory=80 * 2**20,
        _node_ip_address="127.0.0.1",
        logging_level="WARNING",
        log_to_driver=False,
        _system_config={"num_workers_soft_limit": 4},
    )
    yield d, ray.get_runtime_context().gcs_address
    ray.shutdown()
    mp.undo()


def fresh(d: Path) -> tuple[Path, Path]:
    log, pids = d / "computed.log", d / "pids"
    log.unlink(missing_ok=True)
    for p in pids.glob("*.pid"):
        p.unlink()
    return log, pids


@pytest.mark.xdist_group("ray")  # one worker starts the module's Ray instance once
def test_ray_gives_the_local_records(ray_cluster, tmp_path):
    from transferbench.engine.ray_executor import RayExecutor

    d, _ = ray_cluster
    log, _ = fresh(d)
    run(tmp_path / "local")
    log.unlink()
    s = run(tmp_path / "ray", RayExecutor())
    assert (s.ok, s.failed) == (CELLS, 0)
    assert metrics(tmp_path / "ray") == metrics(tmp_path / "local")
    assert table(tmp_path / "ray") == table(tmp_path / "local")
    assert set(Counter(log.read_text().split()).values()) == {1}
    again = run(tmp_path / "ray", RayExecutor())  # a rerun skips every finished cell
    assert (again.ok, again.skipped) == (0, CELLS)


@pytest.mark.xdist_group("ray")  # one worker starts the module's Ray instance once
@pytest.mark.parametrize("retries", [1, 0])
def test_ray_worker_killed_mid_cell_is_retried_or_recorded_failed(ray_cluster, tmp_path, retries):
    from transferbench.engine.ray_executor import RayExecutor

    log, pids = fresh(ray_cluster[0])
    s, key, pid, records = run_killing_one(tmp_path / "out", RayExecutor(), retries, log, pids)
    if not retries:
        assert records[key]["reason"].startswith("WorkerLost: Ray worker lost while computing the cell")


@pytest.mark.xdist_group("ray")  # one worker starts the module's Ray instance once
def test_ray_workers_log_each_cell_to_its_own_tracker_entries(ray_cluster, tmp_path, monkeypatch):
    """Ray's workers, two at a time, each log the cells they compute: one TensorBoard run and one W&B run per cell,
    none shared, each holding its own record's metric."""
    pytest.importorskip("wandb", reason="the tracking extra is not installed")
    import numpy as np
    from test_tracking import board, cell_of, wandb_runs

    from transferbench.engine.ray_executor import RayExecutor
    from transferbench.tracking import Tracking, entry_parts, wandb_name

    monkeypatch.setenv("WANDB_MODE", "offline")
    fresh(ray_cluster[0])
    logs = tmp_path / "logs"
    tracking = Tracking(kinds=("tensorboard", "wandb"), dir=logs)
    task = prepare_task("toy", sets=[*SETS, "lr=0.01"], seeds=[0, 1], datasets=["alpha"])
    options = RunOptions(show_progress=False, tracking=tracking)
    s = run_task(task, [resolve_backbone(b) for b in BACKBONES], tmp_path / "ray", options, executor=RayExecutor())
    records = load_records([tmp_path / "ray"])
    assert s.ok == len(records) == 2 * 4  # two backbones: two seeds at the one lr, then their final cells
    runs = wandb_runs(logs)
    swept = tuple(sorted(task.sweep))
    assert set(runs) == {wandb_name(cell_of(r), swept) for r in records}
    for r in records:
        parts = entry_parts(cell_of(r), swept)
        ((split, values),) = r["metrics"].items()
        assert runs[wandb_name(cell_of(r), swept)]["summary"][f"{split}/accuracy"] == values["accuracy"]
        assert len(list(logs.joinpath(*parts).glob("events.*"))) == 1  # no second writer, no rerun folder
        assert board(logs.joinpath(*parts)).Scalars(f"{split}/accuracy")[0].value == np.float32(values["accuracy"])


@pytest.mark.xdist_group("ray")  # one worker starts the module's Ray instance once
def test_two_ray_drivers_into_one_folder_compute_each_cell_once(ray_cluster, tmp_path):
    log, _ = fresh(ray_cluster[0])  # the cluster's workers log there: the drivers are only clients
    two_drivers(tmp_path / "shared", log, ["--executor", "ray", "--address", ray_cluster[1]])


@pytest.mark.xdist_group("ray")  # one worker starts the module's Ray instance once
def test_ray_checkpoint_from_the_object_store_where_the_node_lacks_the_file(ray_cluster, tmp_path, monkeypatch):
    import dataclasses

    import ray

    from transferbench.cell import Cell
    from transferbench.engine.ray_executor import local_checkpoint

    monkeypatch.setenv("TRANSFERBENCH_HOME", str(tmp_path / "home"))
    blob = os.urandom(4096)
    sha = hashlib.sha256(blob).hexdigest()
    cell = Cell("toy", "alpha", "mu4@x", sha, {}, 0, "1", checkpoint=str(tmp_path / "driver-only" / "w.safetensors"))
    ref = [ray.put(blob)]
    got = local_checkpoint(cell, ref)  # the driver's path does not exist here: the object store's bytes
    assert got == tmp_path / "home" / "checkpoints" / f"{sha}.safetensors" and got.read_bytes() == blob
    same = tmp_path / "shared.safetensors"
    same.write_bytes(blob)
    assert local_checkpoint(dataclasses.replace(cell, checkpoint=str(same)), ref) == same  # a shared path is used
    stale = tmp_path / "stale.safetensors"
    stale.write_bytes(blob[::-1])  # same path, other bytes (a node's own old file): not trusted
    assert local_checkpoint(dataclasses.replace(cell, checkpoint=str(stale)), ref) == got


@pytest.mark.xdist_group("ray")  # one worker starts the module's Ray instance once
def test_ray_refuses_a_cell_no_node_can_hold(ray_cluster, tmp_path):
    from transferbench.engine.ray_executor import RayExecutor

    with pytest.raises(
        UserError,
        match=r"no node of the Ray cluster can hold a cell of 1 CPUs and 1 GPUs \(nodes: "
        r"2 CPUs, 0 GPUs\); lower --cpus-per-cell / --gpus-per-cell",
    ):
        run(tmp_path / "out", RayExecutor(gpus_per_cell=1))
    assert not list(tmp_path.rglob("*.json"))  # refused before any cell


def test_real_cells_give_the_same_records_in_process_and_in_the_pool_at_the_same_threads(suite_home, tmp_path):
    """VTAB fine-tuning on embedded digits: the executor does not change a metric; only the threads per cell
    (the floating-point reduction order) could."""
    task = prepare_task(
        "vtab", suite="embedded", datasets=["mini_digits"], seeds=[0], sets=["lr=0.03", "steps=8", "final=retrain"]
    )
    backbone = [resolve_backbone("mu4")]
    inline = run_task(
        task,
        backbone,
        tmp_path / "inline",
        RunOptions(show_progress=False),
        executor=make_executor("local", jobs=1, cpus_per_cell=1),
    )
    pooled = run_task(
        task, backbone, tmp_path / "pool", RunOptions(show_progress=False), executor=PoolExecutor(2, threads=1)
    )
    assert (inline.ok, pooled.ok) == (2, 2)  # select (train -> val) and final (trainval -> test)
    a, b = load_records([tmp_path / "inline"]), load_records([tmp_path / "pool"])
    assert metrics(tmp_path / "inline") == metrics(tmp_path / "pool")
    assert [r["info"]["final_loss"] for r in a] == [r["info"]["final_loss"] for r in b]


def test_gpu_slots_share_a_gpu_and_its_memory():
    from transferbench.engine.executors import gpu_slots

    assert gpu_slots(3, ["0", "1"]) == [("0", 0.5), ("1", 1.0), ("0", 0.5)]  # round-robin, memory split per GPU
    assert gpu_slots(4, ["GPU-a"]) == [("GPU-a", 0.25)] * 4  # --jobs 4 on one GPU: a quarter each
    assert gpu_slots(2, ["0", "1", "2"]) == [("0", 1.0), ("1", 1.0)]
    assert gpu_slots(2, []) == [(None, 1.0)] * 2
