"""Faults cost no more than the cell they hit: each cache entry of each kind, truncated, is set aside (renamed into
`.quarantine/`, not deleted) with one warning line and computed again to the same values; a torn record is set aside
and recomputed by `run` and skipped with one line by the readers; a full disk and a read-only home are one line and
exit 2, with no temporary left and the finished cells kept; the nightly workflow installs what its tasks need; and a
run killed with SIGKILL again and again ends with the records of an uninterrupted one."""

import errno
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from kit import cli, embedded_home, mounted_tmpfs

from transferbench.cli import main
from transferbench.errors import UserError
from transferbench.paths.entries import QUARANTINE, damage, digest_path, verified
from transferbench.records.store import load_records

ROOT = Path(__file__).resolve().parent.parent


def read_pyproject() -> dict:
    try:
        import tomllib
    except ImportError:  # Python 3.10: pytest's own dependency
        import tomli as tomllib
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


def truncate(path: Path, keep: int) -> None:
    with open(path, "r+b") as f:
        f.truncate(keep)


def damaged_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "damaged" in r.getMessage()]


def set_aside(path: Path) -> list[Path]:
    """What `path` was quarantined as (its digest file left out)."""
    return [p for p in (path.parent / QUARANTINE).glob(f"{path.name}.*") if not p.name.endswith(".digest")]


@pytest.fixture
def home(suite_home, tmp_path, monkeypatch):
    """A home of this test's own whose embedded data are links to the shared sets (faults go into its caches and
    records, which are its own)."""
    h = embedded_home(suite_home, tmp_path / "home")
    monkeypatch.setenv("TRANSFERBENCH_HOME", str(h))
    return h


@pytest.fixture
def own_home(suite_home, tmp_path, monkeypatch):
    """A home with a copy of the embedded data, for a test that damages a set in place (not the shared one)."""
    h = tmp_path / "home"
    shutil.copytree(suite_home / "embedded", h / "embedded")
    monkeypatch.setenv("TRANSFERBENCH_HOME", str(h))
    return h


def metrics(out) -> dict:
    return {r["key"]: r["metrics"] for r in load_records([out])}


# --- caches ---------------------------------------------------------------------------------------------

FEWSHOT_RUN = "run fewshot --suite embedded --backbone mu4_dpn@embedded --set shots=1,5 --no-progress".split()
FEWSHOT = [*FEWSHOT_RUN, "--seeds", "0", "--datasets", "mini_digits"]


def test_truncated_feature_cache_is_set_aside_and_recomputed(home, tmp_path, caplog):
    out = tmp_path / "runs"
    assert main([*FEWSHOT, "--out", str(out)]) == 0
    first = metrics(out)
    entries = sorted((home / "features").glob("*.npz"))
    assert len(entries) == 2 and all(verified(e) for e in entries)  # train and test features, each with its digest
    size = entries[0].stat().st_size
    truncate(entries[0], 500)
    caplog.clear()
    assert main([*FEWSHOT, "--out", str(out), "--force"]) == 0  # failed on every rerun before
    (line,) = damaged_warnings(caplog)
    assert str(entries[0]) in line and "500 bytes" in line and "\n" not in line
    (aside,) = set_aside(entries[0])
    assert aside.stat().st_size == 500  # renamed, not deleted
    assert verified(entries[0]) and entries[0].stat().st_size == size  # recomputed, with a new digest
    assert all(r["status"] == "ok" for r in load_records([out])) and metrics(out) == first  # the same features


def test_a_feature_entry_without_its_digest_is_not_trusted(tmp_path, monkeypatch, caplog):
    from transferbench.engine import features

    monkeypatch.setenv("TRANSFERBENCH_HOME", str(tmp_path))
    feats, labels = np.arange(12, dtype=np.float32).reshape(4, 3), np.array([0, 1, 0, 1])
    calls = []

    def compute():
        calls.append(1)
        return feats, labels

    assert features.cached("k", compute)[2] is False and features.cached("k", compute)[2] is True
    digest_path(features.cache_dir() / "k.npz").unlink()  # as a writer killed between its two renames leaves it
    f, y, hit = features.cached("k", compute)
    assert (hit, len(calls)) == (False, 2) and np.array_equal(f, feats) and np.array_equal(y, labels)
    assert "no digest" in damaged_warnings(caplog)[0]


@pytest.mark.parametrize("array,keep", [("images.npy", 200), ("labels.npy", 140)])
def test_truncated_corruption_arrays_are_set_aside_and_regenerated(tmp_path, monkeypatch, caplog, array, keep):
    from transferbench.data import corruptions

    monkeypatch.setenv("TRANSFERBENCH_HOME", str(tmp_path))
    rng = np.random.default_rng(0)
    images, labels = rng.integers(0, 256, (10, 8, 8, 3), dtype=np.uint8), np.arange(10) % 3
    calls = []

    def compute():
        calls.append(1)
        return images, labels

    assert corruptions.cached("k", compute)[1] is False and corruptions.cached("k", compute)[1] is True
    folder = corruptions.cache_dir() / corruptions.entry_name("k")  # the key with its code's fingerprint
    truncate(folder / array, keep)  # unchecked, np.load said 'mmap length is greater than file size' here
    data, hit = corruptions.cached("k", compute)
    assert (hit, len(calls)) == (False, 2)
    assert np.array_equal(data.images, images) and np.array_equal(data.labels, labels)
    (line,) = damaged_warnings(caplog)
    assert str(folder) in line and array in line
    (aside,) = set_aside(folder)
    assert (aside / array).stat().st_size == keep


def test_imagenet_c_rerun_after_truncated_corruption_arrays(home, tmp_path, caplog):
    from test_corruption import _task

    from transferbench.adapters import resolve_backbone
    from transferbench.engine.runner import RunOptions, run_task

    task, out = _task(tmp_path, limit=40), tmp_path / "runs"
    mu4 = [resolve_backbone("mu4")]
    assert run_task(task, mu4, out, RunOptions(show_progress=False)).failed == 0
    first = metrics(out)
    arrays = sorted((home / "corruptions").glob("*/images.npy"))
    assert len(arrays) > 2 * 5  # two corruptions at five severities, and clean images
    truncate(arrays[0], 300)
    truncate(arrays[1].with_name("labels.npy"), 130)
    s = run_task(task, mu4, out, RunOptions(force=True, show_progress=False))
    assert (s.failed, s.ok) == (0, 3)  # 2 of the cells failed on every rerun before
    assert len(damaged_warnings(caplog)) == 2 and metrics(out) == first


def _lit_hparams():
    from transferbench.adapters import prepare_task

    task = prepare_task("lit", suite="embedded", sets=["steps=3", "batch=8", "warmup_steps=1", "text_layers=1"])
    from transferbench.settings.lit import LitSettings

    return LitSettings.of(task.grid()[0])


def test_truncated_text_tower_is_set_aside_and_retrained(tmp_path, monkeypatch, caplog):
    from transferbench.adapters.lit.training import home_dir, text_tower
    from transferbench.engine.compute import CellContext

    monkeypatch.setenv("TRANSFERBENCH_HOME", str(tmp_path))
    hp, ctx = _lit_hparams(), CellContext("cpu", show_progress=False)
    feats = [np.random.default_rng(0).normal(size=(32, 8)).astype(np.float32)]
    captions = [f"a photo of the digit {i % 10}" for i in range(32)]
    first, info = text_tower(feats, captions, hp, 0, "pairs", ctx)
    assert info["tower_cache_hit"] is False and text_tower(feats, captions, hp, 0, "pairs", ctx)[1]["tower_cache_hit"]
    (path,) = home_dir().glob("*.safetensors")
    truncate(path, path.stat().st_size - 7)
    again, info = text_tower(feats, captions, hp, 0, "pairs", ctx)
    assert info["tower_cache_hit"] is False and set_aside(path)
    assert str(path) in damaged_warnings(caplog)[0]
    a, b = first.state_dict(), again.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)  # the same seed trains the same tower


def test_truncated_classifier_is_set_aside_and_fine_tuned_again(home, tmp_path, caplog):
    from test_corruption import _task

    from transferbench.adapters import resolve_backbone
    from transferbench.adapters.corruption import classifier, home_dir
    from transferbench.cell import make_cell
    from transferbench.engine.compute import CellContext

    task = _task(tmp_path)
    cell = make_cell(task, task.datasets[0], resolve_backbone("mu4"), task.grid()[0], 0, "classifier")
    ctx = CellContext("cpu", show_progress=False)
    first, info = classifier(cell, ctx)
    assert info["classifier_cache_hit"] is False and classifier(cell, ctx)[1]["classifier_cache_hit"] is True
    (path,) = home_dir().glob("*.safetensors")
    with open(path, "r+b") as f:  # same size, one byte changed: only the checksum sees it
        f.seek(-1, 2)
        last = f.read(1)
        f.seek(-1, 2)
        f.write(bytes([last[0] ^ 0xFF]))
    again, info = classifier(cell, ctx)
    assert info["classifier_cache_hit"] is False and "checksum differs" in damaged_warnings(caplog)[0]
    a, b = first.state_dict(), again.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_truncated_bf16_probe_entry_is_set_aside(tmp_path, monkeypatch, caplog):
    from transferbench.engine import precision

    monkeypatch.setenv("TRANSFERBENCH_HOME", str(tmp_path))
    path = tmp_path / "bf16-probe" / "k.json"
    precision._write(path, {"fp32_ms": 2.0, "bf16_ms": 3.0})
    assert precision._read(path) == {"fp32_ms": 2.0, "bf16_ms": 3.0}
    truncate(path, 10)
    assert precision._read(path) is None and set_aside(path) and not path.exists()
    assert len(damaged_warnings(caplog)) == 1


def test_damaged_embedded_set_is_set_aside_and_generated_again(own_home, caplog):
    from transferbench.data.sources import open_split

    folder = own_home / "embedded" / "digits"
    manifest = (folder / "MANIFEST.sha256").read_text()
    png = sorted((folder / "images" / "test").glob("*.png"))[3]
    truncate(png, 20)
    ds = open_split({"source": "embedded", "name": "mini_digits", "set": "digits"}, "test")
    (line,) = damaged_warnings(caplog)
    assert "digits" in line and png.name in line and set_aside(folder)
    assert (folder / "MANIFEST.sha256").read_text() == manifest  # generated again, file for file the same
    assert len(ds) == 797 and ds[3][0].size == (8, 8)
    (folder / "info.json").write_text('{"num_cl')  # torn info: set aside, generated again
    caplog.clear()
    ds = open_split({"source": "embedded", "name": "mini_digits", "set": "digits"}, "test")
    assert "info.json unreadable" in damaged_warnings(caplog)[0] and len(ds) == 797


def test_shipped_checkpoints_match_their_digests_and_a_damaged_one_is_one_line(tmp_path, monkeypatch):
    from transferbench.adapters import pretrain

    shipped = sorted(pretrain.SHIPPED.glob("*.safetensors"))
    assert len(shipped) == 3 and all(damage(p) is None for p in shipped)
    copy = tmp_path / "weights"
    shutil.copytree(pretrain.SHIPPED, copy)
    monkeypatch.setattr(pretrain, "SHIPPED", copy)
    monkeypatch.setenv("TRANSFERBENCH_HOME", str(tmp_path / "home"))
    truncate(copy / shipped[0].name, 1000)
    with pytest.raises(UserError, match="is damaged .*reinstall transferbench") as e:
        pretrain.embedded_checkpoint(shipped[0].name.split("-")[0])
    assert "\n" not in str(e.value)


# --- records ----------------------------------------------------------------------------------------------

TOY = ["run", "toy", "--suite", "quick", "--backbone", "mu4,mu4_dpn", "--no-progress"]


def tear(path: Path) -> bytes:
    data = path.read_bytes()
    path.write_bytes(data[:50])
    return data


def test_torn_record_is_set_aside_and_recomputed_by_run(tmp_path, caplog):
    out = tmp_path / "runs"
    assert main([*TOY, "--out", str(out)]) == 0
    before = {r["key"]: r for r in load_records([out])}
    victim = sorted(p for p in out.rglob("*.json") if p.name != "results.json")[0]
    tear(victim)
    caplog.clear()
    assert main([*TOY, "--out", str(out)]) == 0  # a JSONDecodeError traceback before
    (line,) = damaged_warnings(caplog)
    assert str(victim) in line and "not a valid record" in line
    (aside,) = set_aside(victim)
    assert len(aside.read_bytes()) == 50  # renamed as it was, not deleted
    after = {r["key"]: r for r in load_records([out])}
    assert set(after) == set(before)
    assert after[victim.stem]["metrics"] == before[victim.stem]["metrics"]  # the closed form, computed again
    assert after[victim.stem]["run_id"] != before[victim.stem]["run_id"]
    assert all(after[k]["run_id"] == before[k]["run_id"] for k in before if k != victim.stem)  # the rest kept


def test_torn_record_is_skipped_by_every_reader_with_one_line(tmp_path, caplog, capsys):
    out, base = tmp_path / "runs", tmp_path / "base"
    assert main([*TOY, "--out", str(out)]) == 0
    shutil.copytree(out, base)
    victim = sorted(p for p in out.rglob("*.json") if p.name != "results.json")[0]
    tear(victim)
    capsys.readouterr()
    for argv, code in (
        (["report", str(out)], 0),
        (["leaderboard", str(out), "-o", str(tmp_path / "LB.md")], 0),
        (["regress", "--baseline", str(base), "--current", str(out)], 1),  # the torn cell is missing: it fails
        (["regress", "--baseline", str(out), "--current", str(base)], 0),  # ... and new on the other side
    ):
        caplog.clear()
        assert main(argv) == code, argv
        (line,) = [r.getMessage() for r in caplog.records if "skipping" in r.getMessage()]
        assert str(victim) in line and "not a valid record" in line
    assert "mu4_dpn" in (tmp_path / "LB.md").read_text()
    capsys.readouterr()
    assert cli(f"report {out} --strict") == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and str(victim) in err and "--strict" in err
    # nightly: a torn baseline record is skipped; the run's own folder is a run's (set aside, recomputed)
    tear(sorted(p for p in base.rglob("*.json") if p.name != "results.json")[1])
    caplog.clear()
    line = "nightly --suite quick --tasks toy --backbone mu4,mu4_dpn --date d --no-progress"
    code = cli(f"{line} --baseline {base} --out {tmp_path / 'nightly'}")
    assert code == 0 and any("skipping" in r.getMessage() for r in caplog.records)


# --- full disks, read-only homes, vanished data, killed workers --------------------------------------------

TOY_ALL = ["run", "toy", "--backbone", "mu4", "--no-progress"]  # 3 datasets x (4 lrs x 3 seeds + 3) = 45 records


def _check_full_disk_run(out: Path, reference: dict, capsys, code: int) -> dict:
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].startswith("transferbench: error: cannot write record ")
    assert str(out) in err[-1] and "no space left on device" in err[-1] and "needs " in err[-1]
    assert not [p for p in out.rglob("*") if ".tmp" in p.name]  # no temporary left behind
    kept = {r["key"]: r for r in load_records([out])}
    assert 0 < len(kept) < len(reference)
    assert all(r["metrics"] == reference[k]["metrics"] for k, r in kept.items())
    return kept


def _rerun_completes(out: Path, reference: dict, kept: dict) -> None:
    assert main([*TOY_ALL, "--out", str(out)]) == 0
    final = {r["key"]: r for r in load_records([out])}
    assert {k: r["metrics"] for k, r in final.items()} == {k: r["metrics"] for k, r in reference.items()}
    assert all(final[k]["run_id"] == r["run_id"] for k, r in kept.items())  # finished cells were kept


@pytest.fixture
def reference(tmp_path):
    assert main([*TOY_ALL, "--out", str(tmp_path / "reference")]) == 0
    return {r["key"]: r for r in load_records([tmp_path / "reference"])}


def test_full_out_disk_patched_writes(tmp_path, monkeypatch, capsys, reference):
    from transferbench.paths import writes as writing

    real, writes = os.replace, []

    def replace(src, dst):  # the 21st record write finds the disk full
        if str(dst).endswith(".json"):
            writes.append(dst)
            if len(writes) > 20:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(src))
        return real(src, dst)

    out = tmp_path / "runs"
    monkeypatch.setattr(writing.os, "replace", replace)
    kept = _check_full_disk_run(out, reference, capsys, main([*TOY_ALL, "--out", str(out)]))
    assert len(kept) == 20
    monkeypatch.setattr(writing.os, "replace", real)
    _rerun_completes(out, reference, kept)


@pytest.fixture
def tmpfs(tmp_path):
    """A 64 kB tmpfs (root only; the patched-writes test covers a full disk without it): each record takes a 4 kB
    page."""
    yield from mounted_tmpfs(tmp_path / "mnt", "size=64k")


def test_full_out_disk_on_a_small_tmpfs(tmpfs, capsys, reference):
    out = tmpfs / "runs"
    kept = _check_full_disk_run(out, reference, capsys, main([*TOY_ALL, "--out", str(out)]))
    subprocess.run(["mount", "-o", "remount,size=1m", str(tmpfs)], check=True)  # space freed
    _rerun_completes(out, reference, kept)


def test_full_home_stops_the_run_with_one_line(home, tmp_path, monkeypatch, capsys):
    from transferbench.paths import writes as writing

    real = os.replace

    def replace(src, dst):
        if "features" in str(dst):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(src))
        return real(src, dst)

    monkeypatch.setattr(writing.os, "replace", replace)
    assert main([*FEWSHOT, "--out", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"transferbench: error: $TRANSFERBENCH_HOME={home}: cannot write {home / 'features'}")
    assert "set TRANSFERBENCH_HOME to a folder on a bigger disk" in err
    assert not [p for p in home.rglob("*") if ".tmp" in p.name]


@pytest.fixture
def read_only_home(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    if IS_ROOT:  # root writes through permissions: a read-only mount
        if subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=64k,ro", "tmpfs", str(ro)], capture_output=True
        ).returncode:
            pytest.skip("mount -t tmpfs failed here")
        yield ro
        subprocess.run(["umount", "-l", str(ro)], capture_output=True)
    else:
        ro.chmod(0o555)
        yield ro
        ro.chmod(0o755)


def test_read_only_home_is_one_line_before_any_cell(read_only_home, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TRANSFERBENCH_HOME", str(read_only_home / "home"))
    out = tmp_path / "runs"
    assert main([*FEWSHOT, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert f"$TRANSFERBENCH_HOME={read_only_home / 'home'}: cannot write to" in err
    assert "set TRANSFERBENCH_HOME to a writable folder" in err
    assert not out.exists()  # before any cell, before --out is made


def test_missing_home_is_made_and_an_impossible_one_is_one_line(tmp_path, monkeypatch, capsys):
    from transferbench.paths.writes import check_home

    monkeypatch.setenv("TRANSFERBENCH_HOME", str(tmp_path / "a" / "b"))
    assert check_home() == tmp_path / "a" / "b" and (tmp_path / "a" / "b").is_dir()
    (tmp_path / "file").write_text("x")
    monkeypatch.setenv("TRANSFERBENCH_HOME", str(tmp_path / "file" / "home"))
    with pytest.raises(UserError, match=r"\$TRANSFERBENCH_HOME=.*file/home: cannot write to .*Not a directory"):
        check_home()


class _Dies(torch.utils.data.Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        os.kill(os.getpid(), signal.SIGKILL)  # as the out-of-memory killer does


def test_a_killed_dataloader_worker_is_one_line(tmp_path):
    from transferbench.engine.compute import CellContext, environment_fault

    with pytest.raises(RuntimeError) as e:
        list(torch.utils.data.DataLoader(_Dies(), num_workers=1, timeout=60))
    line = environment_fault(e.value, CellContext("cpu"))
    assert line and "\n" not in line and "--workers" in line and "out-of-memory" in line


def test_a_data_folder_vanishing_mid_run_is_one_line(tmp_path):
    from transferbench.data.folder import FolderDataset, write_folder_dataset
    from transferbench.engine.compute import CellContext, environment_fault

    data = tmp_path / "data"
    write_folder_dataset(data, "set", {"test": [(np.zeros((4, 4), np.uint8), 0)] * 3}, {"num_classes": 1})
    ds = FolderDataset(data, "set", "test")
    shutil.rmtree(data)
    with pytest.raises(FileNotFoundError) as e:
        ds[0]
    line = environment_fault(e.value, CellContext("cpu", data_dir=str(data)))
    assert line.startswith(f"--data-dir {data}: ") and "vanished" in line and "finished cells are kept" in line
    assert environment_fault(ValueError("a bug"), CellContext("cpu")) is None  # the cell's own: recorded failed


# --- the nightly workflow installs what its tasks need ---------------------------------------------------------


def test_nightly_workflow_installs_the_extras_of_the_baselines_tasks():
    import re

    from transferbench.adapters import prepare_task

    baseline = load_records([ROOT / "results" / "nightly"])
    tasks = sorted({r["task"] for r in baseline if r.get("suite") == "nightly"})
    assert "imagenet_c" in tasks
    needed = set().union(*(t.adapter.extras(t) for t in (prepare_task(n, suite="nightly") for n in tasks)))
    assert needed == {"corruptions"}  # generating ImageNet-C's corruptions
    flow = yaml.safe_load((ROOT / ".github" / "workflows" / "nightly.yml").read_text())
    (install,) = [s["run"] for s in flow["jobs"]["nightly"]["steps"] if s.get("name") == "Install"]
    m = re.search(r"pip install (?:-c \S+ )?-e \"?\.\[([\w,-]+)\]\"?", install)
    assert m, f"the install step installs no extras: {install!r}"
    extras = set(m.group(1).split(","))
    assert needed <= extras
    declared = read_pyproject()["project"]["optional-dependencies"]
    assert extras <= set(declared)


# --- soak: killed at random moments, rerun each time -------------------------------------------------------------

SOAK = [*FEWSHOT_RUN, "--seeds", "0", "--datasets", "mini_digits,mini_photos"]  # 4 cells, 2 feature caches


def _cli(args, home, **kw):
    env = {**os.environ, "TRANSFERBENCH_HOME": str(home), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "transferbench.cli", *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        **kw,
    )


@pytest.mark.slow
def test_soak_sigkill_at_five_random_moments(home, tmp_path):
    fresh = tmp_path / "fresh-home"
    shutil.copytree(home / "embedded", fresh / "embedded")
    started = time.monotonic()
    p = _cli([*SOAK, "--out", str(tmp_path / "uninterrupted")], fresh)
    assert p.wait(timeout=300) == 0, p.stderr.read()
    whole = time.monotonic() - started
    out, rng = tmp_path / "killed", random.Random(31)
    for _ in range(5):
        p = _cli([*SOAK, "--out", str(out)], home)
        time.sleep(rng.uniform(0.3, whole))
        p.send_signal(signal.SIGKILL)
        p.wait()
        load_records([out]) if out.exists() else None  # every file parses: nothing torn
    p = _cli([*SOAK, "--out", str(out)], home)
    assert p.wait(timeout=300) == 0, p.stderr.read()
    assert metrics(out) == metrics(tmp_path / "uninterrupted")
    assert not [q for q in [*out.rglob("*"), *home.rglob("*")] if ".tmp" in q.name]
    # every entry whole (the workers computed them with their own threads: another arithmetic than this process's,
    # whose `verified` would take them for entries to compute again)
    assert all(damage(e) is None for e in (home / "features").glob("*.npz"))


# --- a --jobs worker that generated corruptions exits -----------------------------------------------------------


def _generate_in_a_worker():
    from transferbench.data import corruptions

    assert list(corruptions.pool(2).map(abs, [-1, -2, -3])) == [1, 2, 3]


def test_a_cell_process_that_used_the_generator_pool_exits():
    """`run imagenet_c --jobs 2` finished every cell, then hung: each cell process, ending, joined the generator
    pool's processes, which nothing had shut down (atexit does not run in multiprocessing children)."""
    import multiprocessing

    p = multiprocessing.get_context("spawn").Process(target=_generate_in_a_worker)
    p.start()
    p.join(timeout=120)
    hung = p.is_alive()
    if hung:
        p.kill()
    assert not hung and p.exitcode == 0


def _fill(folder: Path) -> None:
    """Fill a tmpfs to its last page: one file written as far as it goes (unbuffered, so nothing fails on close)."""
    fd = os.open(folder / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(fd, b"\0" * 4096):
            pass
    except OSError as e:
        assert e.errno == errno.ENOSPC
    finally:
        os.close(fd)


def _as_nobody(fn):
    """fn() in a child process of uid/gid 65534 (root writes through permissions); its exception's errno, or 0."""
    import multiprocessing

    def child(queue):
        os.setgid(65534)
        os.setuid(65534)
        try:
            fn()
            queue.put(0)
        except OSError as e:
            queue.put(e.errno)

    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    p = ctx.Process(target=child, args=(queue,))
    p.start()
    p.join(60)
    return queue.get(timeout=5)


def test_the_write_probe_leaves_nothing_on_any_failure(tmpfs, tmp_path):
    # ENOSPC makes the probe's file and refuses its byte; EROFS and EACCES refuse the file: each raises the error
    # and leaves the folder as it was, the folders the probe made included (a full --out used to keep an empty
    # .write-test file)
    from transferbench.paths.writes import probe

    _fill(tmpfs)
    before = sorted(p.name for p in tmpfs.iterdir())
    for target in (tmpfs, tmpfs / "runs" / "vtab"):
        with pytest.raises(OSError) as e:
            probe(target)
        assert e.value.errno == errno.ENOSPC
        assert sorted(p.name for p in tmpfs.iterdir()) == before
    for ro in mounted_tmpfs(tmp_path / "ro", "size=64k,ro"):
        with pytest.raises(OSError) as e:
            probe(ro)
        assert e.value.errno == errno.EROFS and list(ro.iterdir()) == []
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    assert _as_nobody(lambda: probe(locked)) == errno.EACCES
    assert _as_nobody(lambda: probe(locked / "a" / "b")) == errno.EACCES
    assert list(locked.iterdir()) == []


def test_a_full_out_and_a_full_output_file_are_one_line_and_leave_nothing(tmpfs, capsys):
    # the command line's probes: run's --out and report's -o, each on the full tmpfs: one line, exit 2, no file
    _fill(tmpfs)
    before = sorted(p.name for p in tmpfs.iterdir())
    assert main([*FEWSHOT, "--out", str(tmpfs / "runs")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no space left on device" in err.lower(), err
    assert main(["report", "results/runs/vtab", "-o", str(tmpfs / "tables" / "vtab.md")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "-o" in err, err
    assert sorted(p.name for p in tmpfs.iterdir()) == before
