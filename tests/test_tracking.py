"""`--log-to tensorboard,wandb`, read back as a user's tools read it: TensorBoard's event files through its own
EventAccumulator, W&B's offline runs through W&B's own record schema (wandb.proto's Record, from the run's
transaction log). Each cell's logged curve, metrics, wall time and settings are checked against its record and a hand
computation of its schedule; the records themselves against a run without logging, by the gate's exact tier."""

from __future__ import annotations

import json
import math
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from kit import TINY, cli, embedded_home, tiny_args

pytest.importorskip("tensorboard", reason="the tracking extra is not installed")
wandb = pytest.importorskip("wandb", reason="the tracking extra is not installed")

from transferbench.adapters import prepare_task  # noqa: E402
from transferbench.cell import Cell  # noqa: E402
from transferbench.engine.train import schedule_lr  # noqa: E402
from transferbench.records.store import load_records  # noqa: E402
from transferbench.spec import load_task  # noqa: E402
from transferbench.tracking import Trackers, Tracking, entry_parts, wandb_name  # noqa: E402

# --- the readers --------------------------------------------------------------------------------------------------


def board(folder: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0, "tensors": 0, "images": 0})
    acc.Reload()
    return acc


def board_text(acc, tag: str) -> str:
    return acc.Tensors(f"{tag}/text_summary")[0].tensor_proto.string_val[0].decode()


def markdown_rows(text: str) -> list[tuple]:
    """A markdown table's rows (its header first), each cell stripped, its separator line left out."""
    import re

    lines = [line.strip().strip("|") for line in text.splitlines() if line.strip().startswith("|")]
    rows = [tuple(c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line)) for line in lines]
    return [row for row in rows if not all(set(c) <= set("-: ") for c in row)]


def wandb_records(path: Path):
    """The records of a W&B transaction log (run-ID.wandb): its header (:W&B, 0xBEE1, version 0), then LevelDB-log
    blocks of 32 KiB whose chunks (CRC-32 of type and data, length, type: full, first, middle, last) carry
    wandb.proto's Record messages. Every chunk's checksum is checked."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:7] == b":W&B" + struct.pack("<HB", 0xBEE1, 0), data[:7]
    pos, block, pending = 7, 32768, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a chunk header is padding
            pos += block - pos % block
            continue
        crc, n, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if (crc, n, kind) == (0, 0, 0):
            pos += block - pos % block
            continue
        chunk = data[pos + 7 : pos + 7 + n]
        assert zlib.crc32(bytes([kind]) + chunk) == crc, f"{path}: damaged chunk at {pos}"
        pos, pending = pos + 7 + n, pending + chunk
        if kind in (1, 4):  # full, last
            record = pb.Record()
            record.ParseFromString(pending)
            yield record
            pending = b""


def wandb_runs(folder: Path) -> dict:
    """display name -> {group, job_type, config, history (rows), summary} of every offline run under `folder`."""
    runs = {}
    for log in sorted(folder.glob("wandb/offline-run-*/run-*.wandb")):
        run = {"history": [], "summary": {}, "config": {}, "folder": log.parent}
        for r in wandb_records(log):
            what = r.WhichOneof("record_type")
            if what == "run":
                run.update(name=r.run.display_name, group=r.run.run_group, job_type=r.run.job_type)
                run["config"] = {u.key: json.loads(u.value_json) for u in r.run.config.update}
            elif what == "history":
                run["history"].append(
                    {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
                )
            elif what == "summary":
                for u in r.summary.update:
                    run["summary"][u.key or "/".join(u.nested_key)] = json.loads(u.value_json)
        assert run["name"] not in runs, f"two W&B runs named {run['name']}"
        runs[run["name"]] = run
    return runs


# --- what a cell's entries must hold --------------------------------------------------------------------------------


def cell_of(r: dict) -> Cell:
    fields = {k: r[k] for k in Cell.__dataclass_fields__ if k in r}
    return Cell(**{**fields, "select": tuple(r.get("select") or ())})


def expected_lrs(r: dict) -> list[float]:
    """The learning rate of every step, by hand from the record's settings (warm-up, then cosine to 0)."""
    hp = r["hparams"]
    return [
        schedule_lr("cosine", s, base=hp["lr"], warmup=hp["warmup_steps"], total=hp["steps"])
        for s in range(hp["steps"])
    ]


def check_cell_entries(r: dict, log_dir: Path, runs: dict, settings_model, swept: tuple) -> None:
    """The cell's TensorBoard run and W&B run hold its curve (every step once; the last loss the record's final
    loss; the rates the schedule's), its metrics, its wall time and its settings with their sources."""
    parts = entry_parts(cell_of(r), swept)
    steps, lrs = r["hparams"]["steps"], expected_lrs(r)
    defaults = {k: f.json_schema_extra["source"] for k, f in settings_model.model_fields.items()}
    # the source of the value that ran: the suite's, --set's, the weights' (the record's own), else the default's
    sources = {k: r["sources"].get(k) or defaults.get(k, "") for k in r["hparams"]}
    suite_set = load_task(r["task"]).suites[r["suite"]].hparams if r["suite"] else {}
    set_keys = set(TINY)  # the tests' runs --set the tiny profile (kit.tiny_args)
    for k in suite_set:
        if k in r["hparams"]:
            assert sources[k] == ("--set" if k in set_keys else f"suite {r['suite']}"), (k, sources[k])

    acc = board(log_dir.joinpath(*parts))
    loss = acc.Scalars("curve/loss")
    assert [e.step for e in loss] == list(range(1, steps + 1))
    assert loss[-1].value == np.float32(r["info"]["final_loss"])  # a float32 loss, kept exactly
    assert all(math.isfinite(e.value) for e in loss)
    assert [e.value for e in acc.Scalars("curve/lr")] == [np.float32(x) for x in lrs]
    for split, values in r["metrics"].items():
        for metric, v in values.items():
            assert acc.Scalars(f"{split}/{metric}")[0].value == np.float32(v)
    assert acc.Scalars("wall_s")[0].value == np.float32(r["seconds"])
    hparams = acc.PluginTagToContent("hparams")  # the HParams dashboard: this cell's session, no experiment of its own
    assert set(hparams) == {"_hparams_/session_start_info", "_hparams_/session_end_info"}
    from tensorboard.plugins.hparams import plugin_data_pb2

    start = plugin_data_pb2.HParamsPluginData.FromString(hparams["_hparams_/session_start_info"]).session_start_info
    columns = {k: v.WhichOneof("kind") and getattr(v, v.WhichOneof("kind")) for k, v in start.hparams.items()}
    # what tells cells apart is a column each: backbone, data set, stage, seed, and each swept setting
    assert {k: columns[k] for k in ("backbone", "dataset", "stage", "seed")} == {
        "backbone": r["backbone"],
        "dataset": r["dataset"],
        "stage": r["stage"],
        "seed": float(r["seed"]),
    }
    assert all(k in columns for k in swept if k in r["hparams"])
    rows = markdown_rows(board_text(acc, "settings"))
    assert rows[0] == ("setting", "value", "source")
    for k, v in r["hparams"].items():
        assert (k, str(v), sources.get(k, "")) in rows

    run = runs[wandb_name(cell_of(r), swept)]
    assert run["group"] == f"{r['task']}/{r['suite']}" and run["job_type"] == r["stage"]
    assert run["config"]["settings"] == r["hparams"]
    assert run["config"]["sources"] == {k: sources.get(k, "") for k in r["hparams"]}
    assert run["config"]["cell"]["key"] == r["key"]
    rows = [h for h in run["history"] if "curve/loss" in h]
    assert [h["curve/step"] for h in rows] == list(range(1, steps + 1))
    assert [h["curve/lr"] for h in rows] == lrs  # JSON keeps the double exactly
    assert rows[-1]["curve/loss"] == r["info"]["final_loss"]
    for split, values in r["metrics"].items():
        for metric, v in values.items():
            assert run["summary"][f"{split}/{metric}"] == v
    assert run["summary"]["wall_s"] == r["seconds"] and run["summary"]["status"] == "ok"


def exact_line(baseline: Path, current: Path, capsys) -> str:
    capsys.readouterr()
    assert cli(f"regress --baseline {baseline} --current {current}") == 0
    return capsys.readouterr().out.split("\n")[2]


# --- the tests ------------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_every_cell_logs_its_curve_metrics_and_settings_and_no_record_moves(suite_home, tmp_path, monkeypatch, capsys):
    """Two worker processes (--jobs 2), each logging its own cells to both trackers; 60 steps, so the curve goes out
    in two reads (at step 50 and at the end). The records equal those of the same run without logging, bit for bit
    (the gate's exact tier), and the report entry holds the run's table."""
    from transferbench.reporting.formats import to_markdown, to_rows
    from transferbench.reporting.kinds import report_tables
    from transferbench.settings.finetune import VtabSettings

    monkeypatch.setenv("TRANSFERBENCH_HOME", str(embedded_home(suite_home, tmp_path / "home")))
    monkeypatch.delenv("WANDB_MODE", raising=False)
    logs = tmp_path / "logs"
    common = f"run vtab --suite embedded --datasets mini_dsprites_loc --backbone mu4 {tiny_args('vtab', steps=60)} "
    common += "--set lr=0.01,0.03 --jobs 2"
    assert cli(f"{common} --out {tmp_path / 'plain'}") == 0
    assert cli(f"{common} --out {tmp_path / 'logged'} --log-to tensorboard,wandb --log-dir {logs}") == 0
    err = capsys.readouterr().err
    assert f"vtab: logging each cell to TensorBoard (tensorboard --logdir {logs}) and W&B, offline" in err
    assert "vtab: logged to TensorBoard (tensorboard --logdir" in err

    records = load_records([tmp_path / "logged"])
    assert len(records) == 4 and {r["status"] for r in records} == {"ok"}
    runs = wandb_runs(logs)
    assert len(runs) == 5  # four cells and the report
    for r in records:
        check_cell_entries(r, logs, runs, VtabSettings, ("lr",))
    r0 = next(r for r in records if r["hparams"]["lr"] == 0.01 and r["seed"] == 0)
    assert f"vtab/embedded/mu4/mini_dsprites_loc select lr=0.01 seed0 {r0['key'][:8]}" in runs
    assert exact_line(tmp_path / "plain", tmp_path / "logged", capsys).startswith(
        "**OK**: all 4 cells judged exactly (4 bit-identical"
    )

    (table,) = report_tables(records)
    acc = board(logs / "vtab" / "embedded" / "report")
    assert board_text(acc, "tables/01_vtab") == to_markdown(table)
    report = runs["vtab/embedded/report"]
    assert report["job_type"] == "report" and report["group"] == "vtab/embedded"
    (entry,) = [h for h in report["history"] if "tables/01_vtab/_type" in h]
    assert entry["tables/01_vtab/_type"] == "table-file"
    logged = json.loads((report["folder"] / "files" / entry["tables/01_vtab/path"]).read_text())
    rows = to_rows(table)
    assert logged["columns"] == list(rows[0]) and len(logged["data"]) == len(rows) == entry["tables/01_vtab/nrows"]
    assert [dict(zip(logged["columns"], d))["mean"] for d in logged["data"]] == [row["mean"] for row in rows]


@pytest.mark.slow
def test_the_paper_protocols_path_logs_the_same(tmp_path, monkeypatch):
    """A few-step cell of the paper's VTAB-1k protocol (the default suite) on dtd as tensorflow-datasets' own writer
    made it (tests/fixtures/tfds): the same entries, named by the paper suite, against the same record."""
    from transferbench.settings.finetune import VtabSettings

    monkeypatch.setenv("TRANSFERBENCH_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("WANDB_MODE", raising=False)
    data = Path(__file__).resolve().parent / "fixtures" / "tfds"
    logs = tmp_path / "logs"
    line = f"run vtab --datasets dtd --backbone mu4 {tiny_args('vtab', lr='0.003')} --seeds 0 --data-dir {data} "
    assert cli(f"{line} --out {tmp_path / 'runs'} --log-to tensorboard,wandb --log-dir {logs}") == 0
    (r,) = load_records([tmp_path / "runs"])
    assert r["suite"] == "default" and r["status"] == "ok"  # the paper's protocol
    runs = wandb_runs(logs)
    check_cell_entries(r, logs, runs, VtabSettings, ())  # one lr: nothing swept
    assert set(runs) == {wandb_name(cell_of(r)), "vtab/default/report"}


def test_entries_name_what_the_task_sweeps_and_never_two_cells_alike(tmp_path):
    """Few-shot's shots are swept but not selected: each shot count is named, and cells that differ in a setting
    nobody sweeps (or in a backbone name's separator) still get entries of their own; a second attempt of the same
    cell writes beside the first (rerun-2)."""
    from transferbench.tracking.entries import fresh_folder

    def cell(backbone="mu4", **hp):
        return Cell("fewshot", "digits", backbone, "random-init", {"shots": 5, "l2": 1.0, **hp}, 0, "1", stage="final")

    swept = ("shots",)
    # the backbone, then one part of words: TensorBoard's run list shows a name's start and its end (shots, seed)
    assert entry_parts(cell(), swept) == ["fewshot", "all", "mu4", "digits final shots=5 seed0"]
    others = (cell(shots=10), cell(l2=2.0), cell(backbone="a/b"), cell(backbone="a b"))
    # l2 is not swept, and a/b and "a b" are one folder name: three names for five cells
    assert len({"/".join(entry_parts(c, swept)) for c in (cell(), *others)}) == 3
    assert len({wandb_name(c, swept) for c in (cell(), *others)}) == 5  # W&B's names carry the key
    folders = [fresh_folder(tmp_path.joinpath(*entry_parts(c, swept)), c.key) for c in (cell(), *others)]
    assert len(set(folders)) == 5  # TensorBoard's: the second cell of a name takes its key beside the first
    assert folders[2].name == f"digits final shots=5 seed0 {cell(l2=2.0).key[:8]}"
    folder = tmp_path.joinpath(*entry_parts(cell(), swept))
    assert fresh_folder(folder, cell().key) == folder / "rerun-2"  # the same cell again: a rerun beside it


def test_a_cells_wandb_entry_is_whole_on_disk_the_moment_its_cell_ends(tmp_path, monkeypatch):
    """W&B's service writes a run's file after `finish` returns: read at once, about one run in ten was still partly
    written (nothing past its header, or a chunk cut short). A pool worker ends through os._exit and a reader may
    look as soon as the run ends, so each entry must be whole when its cell is closed: its records end with the exit
    record, its summary the metrics it was closed with. A W&B run the caller holds open meanwhile stays open (the
    entries are whole once W&B ends, at the caller's exit at the latest)."""
    import torch

    logs = tmp_path / "logs"
    trackers = Trackers()
    track = Tracking(kinds=("wandb",), dir=logs, mode="offline")
    seen: set = set()

    def cell(seed):
        cell = Cell("vtab", "d", "mu4", "random-init", {"lr": 0.1}, seed, "2", stage="final", suite="embedded")
        with trackers.cell_entry(track, cell) as entry:
            entry.curve("fit").send([torch.tensor(2.0 - step / 100) for step in range(300)], lambda step: 0.1)
            entry.close({"status": "ok", "seconds": 1.5, "metrics": {"test": {"accuracy": 50.0 + seed}}})
        (log,) = [p for p in logs.glob("wandb/offline-run-*/run-*.wandb") if p.parent.name not in seen]
        seen.add(log.parent.name)
        return log

    def whole(log, seed):
        records = list(wandb_records(log))
        assert records[-1].WhichOneof("record_type") == "exit" and records[-1].exit.exit_code == 0, seed
        summary = {u.key: json.loads(u.value_json) for r in records if r.HasField("summary") for u in r.summary.update}
        assert summary["test/accuracy"] == 50.0 + seed

    for seed in range(24):
        whole(cell(seed), seed)
    own = wandb.init(project="mine", dir=str(tmp_path / "own"), mode="offline", reinit="create_new")
    try:
        later = [cell(seed) for seed in (24, 25)]
        assert not own._is_finished
    finally:
        own.finish()
        wandb.teardown()
    for seed, log in zip((24, 25), later):
        whole(log, seed)


def test_each_training_loop_of_a_cell_gets_a_tag_of_its_own():
    from transferbench.tracking import CellLog

    entry = CellLog(Tracking(kinds=("tensorboard",)), cell=None)
    assert [entry.curve(d).tag for d in ("text tower", "image tower", "text tower")] == ["curve", "curve_2", "curve"]


def test_a_report_tables_key_is_short_and_plain_whatever_its_setting():
    """W&B names a table's artifact after its key and refuses names over 128 characters: ImageNet-C's tables carry a
    sentence as their setting."""
    from types import SimpleNamespace

    from transferbench.cli.tracked import _title

    long = SimpleNamespace(task="imagenet_c", setting="CE normalised by mu4@embedded's mean errors (×100); " * 4)
    assert _title(0, long) == "01_imagenet_c_CE_normalised_by_mu4_embedded_s_mean_errors_100_CE"
    assert _title(2, SimpleNamespace(task="fewshot", setting="shots=10")) == "03_fewshot_shots=10"


def test_a_tracker_that_fails_mid_run_costs_one_warning_and_no_cell(suite_home, tmp_path, monkeypatch, caplog):
    """W&B's log call failing from the first step on (a broken install, a full disk): one warning, every cell
    recorded ok with the metrics of a run without logging; TensorBoard, which did not fail, logs every cell."""
    monkeypatch.setenv("TRANSFERBENCH_HOME", str(embedded_home(suite_home, tmp_path / "home")))
    monkeypatch.setenv("WANDB_MODE", "offline")

    def broken(self, *args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(wandb.Run, "log", broken)
    common = f"run vtab --suite embedded --datasets mini_dsprites_loc --backbone mu4 {tiny_args('vtab')} --jobs 1"
    assert cli(f"{common} --out {tmp_path / 'plain'}") == 0
    with caplog.at_level("WARNING", logger="transferbench"):
        assert cli(f"{common} --out {tmp_path / 'logged'} --log-to wandb,tensorboard --log-dir {tmp_path / 'l'}") == 0
    warned = [m for m in caplog.messages if "--log-to" in m]
    assert len(warned) == 1 and "--log-to wandb failed while logging a training curve" in warned[0]
    assert "No space left on device" in warned[0] and "the cells go on" in warned[0]
    plain, logged = (
        sorted((r["key"], r["metrics"]) for r in load_records([tmp_path / d])) for d in ("plain", "logged")
    )
    assert logged == plain and len(logged) == 4
    assert len(list((tmp_path / "l" / "vtab").rglob("events.out.tfevents.*"))) == 5  # four cells, the report


def test_a_full_disk_under_tensorboard_is_one_warning(tmp_path, monkeypatch, caplog):
    """TensorBoard's event files on a full filesystem (a 64 KiB tmpfs): the writer's own thread fails quietly and
    its error reaches the next flush, which is one warning; the caller goes on."""
    import subprocess

    from transferbench.tracking.tensorboard import CellBoard

    small = tmp_path / "small"
    small.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(small)], capture_output=True).returncode:
        pytest.skip("mounting a tmpfs needs root")
    try:
        trackers = Trackers()
        cell = Cell("vtab", "d", "mu4", "random-init", {"lr": 0.1}, 0, "2", stage="select", suite="embedded")
        entry = trackers.guarded("tensorboard", "opening a cell's entry", CellBoard, Tracking(dir=small), cell, [])
        with caplog.at_level("WARNING", logger="transferbench"):
            for start in range(1, 40_001, 5_000):
                steps = list(range(start, start + 5_000))
                trackers.guarded(
                    "tensorboard", "logging a training curve", entry.curve, "train", steps, [1.0] * 5_000, [0.1] * 5_000
                )
        warned = [m for m in caplog.messages if "--log-to" in m]
        assert len(warned) == 1 and "No space left on device" in warned[0]
        assert "tensorboard" in trackers.off
    finally:
        subprocess.run(["umount", str(small)], check=True)


def test_the_warning_names_every_run_a_full_disk_left_running(monkeypatch):
    """On a full disk W&B can lose an early run's records while a later, smaller run still ends whole: the warning
    names each of the process's last runs that W&B's inspector does not read as ended, not only those after the
    newest whole one (a run was once left reading as running, unnamed, behind a finished one)."""
    from transferbench.tracking import wandb as tracked

    states = {"/a": "running", "/b": "finished", "/c": "unknown", "/d": "failed"}
    monkeypatch.setattr(tracked, "_run_state", lambda folder: states[str(folder)])
    finished = [("a", Path("/a")), ("b", Path("/b")), ("c", Path("/c")), ("d", Path("/d"))]
    assert tracked.unfinished(finished) == ["a (/a)", "c (/c)"]
    assert tracked.unfinished(finished, limit=2) == ["c (/c)"]  # the last `limit` runs only


def test_tracker_calls_leave_the_random_generators_as_they_were(monkeypatch):
    """What a tracker draws (W&B's run ids, say) never moves a cell's random streams."""
    import random

    import torch

    def draws():
        return random.random(), np.random.rand(), torch.rand(()).item()

    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    expected = draws()
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    assert Trackers().guarded("wandb", "testing", draws) == expected  # it drew from each stream...
    assert draws() == expected  # ...and the streams go on as if it had not


@pytest.mark.parametrize(
    "extra, message",
    [
        (
            "--log-to wandb",
            "--log-to wandb needs the wandb package, which does not import here (ModuleNotFoundError: "
            "import of wandb halted; None in sys.modules): pip install 'transferbench[tracking]'",
        ),
        ("--log-to mlflow", "--log-to 'mlflow' is not a tracker; choose from tensorboard, wandb (comma-separated)"),
        (
            "--log-to tensorbord",
            "--log-to 'tensorbord' is not a tracker; choose from tensorboard, wandb (comma-separated); did you mean "
            "tensorboard?",
        ),
        (
            "--log-to tensorboard --log-dir {out}/tb",
            "--log-dir {out}/tb lies inside the records folder {out} (whose .json files are read as records); give a "
            "folder beside it, e.g. --log-dir tracking",
        ),
        (
            "--log-to tensorboard --log-dir /proc/tb",
            "--log-dir /proc/tb: cannot write there (no such file or directory); give a writable folder",
        ),
        # outside the documented values: one line, never argparse's usage block, never silently nothing
        ("--wandb-mode dryrun", "--wandb-mode 'dryrun' is not a W&B mode; choose from offline, online, disabled"),
        ("--log-to ''", "--log-to names no tracker; give one or more of tensorboard, wandb, comma-separated"),
        ("--log-to ' , '", "--log-to names no tracker; give one or more of tensorboard, wandb, comma-separated"),
        ("--log-to tensorboard --wandb-project ''", "--wandb-project is empty; give a name, or leave the option out"),
    ],
)
def test_a_tracker_that_cannot_work_is_one_line_and_exit_2_before_any_cell(
    tmp_path, monkeypatch, capsys, extra, message
):
    import sys

    monkeypatch.setitem(sys.modules, "wandb", None)  # as if the package were not installed
    monkeypatch.setenv("TRANSFERBENCH_HOME", str(tmp_path / "home"))
    out = tmp_path / "runs"
    assert cli(f"run toy --backbone mu4 --out {out} {extra.format(out=out)}") == 2
    err = capsys.readouterr().err.strip()
    assert err == f"transferbench: error: {message.format(out=out)}"
    assert not out.exists()  # before any cell: not even the records folder


def test_the_nightly_logs_each_cell_and_each_tasks_report(tmp_path, monkeypatch):
    """`nightly --log-to`: every cell of the night one entry in each tracker, its metrics the record's, in the group
    of its task and suite; the task's report entry beside them."""
    monkeypatch.delenv("WANDB_MODE", raising=False)
    base, out, logs = tmp_path / "baseline", tmp_path / "nightly", tmp_path / "logs"
    assert cli(f"run toy --suite quick --backbone mu4,mu4_dpn --out {base} --no-progress") == 0
    line = f"nightly --suite quick --backbone mu4,mu4_dpn --no-progress --baseline {base} --out {out} --date d1"
    import transferbench.reporting.leaderboard as leaderboard

    def drawn_again(*args, **kwargs):
        raise AssertionError("the report entry drew the night's leaderboard again")

    monkeypatch.setattr(leaderboard, "write_leaderboard", drawn_again)  # the night draws through draw_leaderboard
    assert cli(f"{line} --log-to tensorboard,wandb --log-dir {logs}") == 0
    records = load_records([out / "d1"])
    logs = logs / "d1"  # each night in a folder of its own
    runs = wandb_runs(logs)
    swept = tuple(sorted(prepare_task("toy", suite="quick").sweep))
    assert len(records) == 8 and set(runs) == {wandb_name(cell_of(r), swept) for r in records} | {"toy/quick/report"}
    for r in records:
        parts = entry_parts(cell_of(r), swept)
        acc, run = board(logs.joinpath(*parts)), runs[wandb_name(cell_of(r), swept)]
        assert run["group"] == "toy/quick" and "curve/loss" not in acc.Tags()["scalars"]  # the toy trains nothing
        for split, values in r["metrics"].items():
            assert acc.Scalars(f"{split}/accuracy")[0].value == np.float32(values["accuracy"])
            assert run["summary"][f"{split}/accuracy"] == values["accuracy"]
    report = board(logs / "toy" / "quick" / "report")
    assert "tables/01_toy/text_summary" in report.Tags()["tensors"]
    # the night's own figures (one task: all of them)
    assert set(report.Tags()["images"]) == {f"figures/{p.stem}" for p in (out / "d1").glob("*.png")}
    # the leaderboard's figure, pixel for pixel as the night's own leaderboard drew it
    import io

    from PIL import Image

    (image,) = report.Images("figures/LEADERBOARD_toy")
    logged = np.asarray(Image.open(io.BytesIO(image.encoded_image_string)).convert("RGB"))
    drawn = np.asarray(Image.open(out / "d1" / "LEADERBOARD_toy.png").convert("RGB"))
    assert logged.shape == drawn.shape and np.array_equal(logged, drawn)
    (row,) = [h for h in runs["toy/quick/report"]["history"] if "figures/LEADERBOARD_toy/_type" in h]
    assert row["figures/LEADERBOARD_toy/_type"] == "image-file"
    assert (row["figures/LEADERBOARD_toy/width"], row["figures/LEADERBOARD_toy/height"]) == drawn.shape[1::-1]


def test_a_settings_source_is_where_the_value_that_ran_came_from(suite_home, tmp_path, monkeypatch, capsys):
    """The embedded suite's batch 32 was labelled "DPN App. E", which specifies 512: each place that shows a source
    says where the value that ran came from. By hand: batch (the suite sets 32), steps (--set), momentum (the paper's
    default, 0.9), pixels (auto, and random init states none)."""
    monkeypatch.setenv("TRANSFERBENCH_HOME", str(embedded_home(suite_home, tmp_path / "home")))
    monkeypatch.delenv("WANDB_MODE", raising=False)
    out, logs = tmp_path / "runs", tmp_path / "logs"
    line = (
        "run vtab --suite embedded --datasets mini_digits --backbone mu4 --seeds 0 --set steps=3 --set lr=0.01 "
        f"--no-progress --out {out} --log-to tensorboard,wandb --log-dir {logs}"
    )
    assert cli(line) == 0
    paper = "DPN App. E (its big_vision config)"
    want = {"batch": "suite embedded", "steps": "--set", "momentum": paper, "pixels": "auto: the weights state none"}
    records = load_records([out])
    assert records
    for r in records:
        assert {k: r["sources"][k] for k in want} == want  # the record
        assert r["hparams"]["batch"] == 32 and r["hparams"]["steps"] == 3 and r["hparams"]["momentum"] == 0.9
        parts = entry_parts(cell_of(r), ("lr",))
        rows = markdown_rows(board_text(board(logs.joinpath(*parts)), "settings"))  # TensorBoard's settings table
        assert {("batch", "32", "suite embedded"), ("steps", "3", "--set"), ("momentum", "0.9", paper)} <= set(rows)
        run = wandb_runs(logs)[wandb_name(cell_of(r), ("lr",))]  # W&B's config
        assert {k: run["config"]["sources"][k] for k in want} == want
    capsys.readouterr()
    assert cli(f"report {out}") == 0  # the report names what did not come from the protocol's defaults
    report = capsys.readouterr().out
    assert "Settings not at the protocol's defaults: steps 3 (--set); batch 32, loss softmax, resolution 16, " in report
    assert "warmup_steps 5 (suite embedded)." in report and "momentum" not in report.split("Settings not")[1][:200]
    assert cli("list tasks --show vtab") == 0  # the settings table's source column is the default's
    assert "source of the default" in capsys.readouterr().out
