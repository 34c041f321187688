"""TensorBoard: each cell a run folder of event files under the log dir (LOG_DIR/TASK/SUITE/BACKBONE/DATASET STAGE
[SWEPT] seedN, with its key appended where another cell took the name), written through torch's SummaryWriter.
Scalars: TAG/loss and TAG/lr per step (TAG: curve, curve_2, ... one per training loop), SPLIT/METRIC and wall_s; text:
the settings with their sources and what each loop was; the HParams dashboard: the cell's backbone, dataset, stage,
seed, task and suite and its hyper-parameters against its final metrics. A rerun of a cell (another attempt, --force)
writes beside the earlier one, in rerun-N, so that no two attempts mix their steps in one run; so does a second run's
report."""

from __future__ import annotations

from pathlib import Path

from ..settings import markdown_table
from .entries import Tracking, entry_parts, final_metrics, fresh_folder, plain


def _writer(folder: Path):
    from torch.utils.tensorboard import SummaryWriter

    _quiet_writer_thread()
    return SummaryWriter(log_dir=str(folder), flush_secs=30)


def _quiet_writer_thread() -> None:
    """TensorBoard writes events in a thread of its own, whose failure (a full disk) would print a traceback; the
    writer raises the same error at its next flush, where `Trackers.guarded` turns it into the one warning. So a
    failure of that thread is left to the flush, and any other thread's goes to the hook as before. The hook is
    installed once per process: the one in place says whether it is this one (`quiets_writer_thread`)."""
    import threading

    if getattr(threading.excepthook, "quiets_writer_thread", False):
        return
    from tensorboard.summary.writer.event_file_writer import _AsyncWriterThread

    previous = threading.excepthook

    def hook(args):
        if not isinstance(args.thread, _AsyncWriterThread):
            previous(args)

    hook.quiets_writer_thread = True
    threading.excepthook = hook


class CellBoard:
    """One cell's TensorBoard run."""

    def __init__(self, tracking: Tracking, cell, settings: list[tuple]):
        self.folder = fresh_folder(Path(tracking.dir).joinpath(*entry_parts(cell, tracking.swept)), cell.key)
        self.writer = _writer(self.folder)
        self.settings = settings
        self.name = str(self.folder)
        # the HParams dashboard's first columns: what tells cells apart (the swept settings are among the settings)
        self.identity = {
            "backbone": cell.backbone,
            "dataset": cell.dataset,
            "stage": cell.stage or "cell",
            "seed": int(cell.seed),
            "task": cell.task,
            "suite": cell.suite or "all",
        }
        try:
            self.writer.add_text("settings", markdown_table(settings, ("setting", "value", "source")), 0)
            self.writer.flush()
        except BaseException:
            self.writer.close()
            raise

    def curve(self, tag: str, steps: list, losses: list, lrs: list) -> None:
        for step, loss, lr in zip(steps, losses, lrs):
            self.writer.add_scalar(f"{tag}/loss", loss, step)
            self.writer.add_scalar(f"{tag}/lr", lr, step)
        self.writer.flush()

    def abandon(self) -> None:
        self.writer.close()

    def close(self, outcome: dict, loops: dict) -> None:
        from torch.utils.tensorboard.summary import hparams

        w = self.writer
        metrics = final_metrics(outcome)
        for tag, value in metrics.items():
            w.add_scalar(tag, value, 0)
        w.add_scalar("wall_s", outcome.get("seconds", 0.0), 0)
        status = outcome.get("status", "")
        reason = outcome.get("reason") or ""
        w.add_text("outcome", f"status: {status}" + (f" ({reason})" if reason else ""), 0)
        if loops:
            w.add_text("loops", markdown_table([(t, d) for d, t in loops.items()], ("tag", "training loop")), 0)
        if metrics:  # the HParams dashboard: this cell's session (its settings, then its end); no experiment
            # summary, so that TensorBoard builds the experiment from every cell's session and not one cell's columns
            values = {k: str(v) if v is None else plain(v) for k, v, _ in self.settings}
            _, start, end = hparams({**values, **self.identity}, metrics)
            w.file_writer.add_summary(start)
            w.file_writer.add_summary(end)
        w.close()


def report(tracking: Tracking, task: str, suite: str, tables: list[tuple[str, str]], figures: list[Path]) -> None:
    """The run's report of `task`: each table as text (its markdown), each figure as an image, in the run folder
    LOG_DIR/TASK/SUITE/report."""
    import numpy as np
    from PIL import Image

    folder = fresh_folder(Path(tracking.dir) / task / (suite or "all") / "report")
    w = _writer(folder)
    try:
        for title, markdown in tables:
            w.add_text(f"tables/{title}", markdown, 0)
        for path in figures:
            with Image.open(path) as im:
                w.add_image(f"figures/{path.stem}", np.asarray(im.convert("RGB")), 0, dataformats="HWC")
    finally:
        w.close()
