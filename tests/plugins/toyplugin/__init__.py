"""A synthetic adapter used only by the harness tests, installed as a plugin (see the .dist-info beside it).

Its metric is a closed form of (backbone, dataset, lr, seed): the harness tests know what every
record must hold without training anything.
"""

import math
import os
import time

import numpy as np
from pydantic import BaseModel, ConfigDict

from transferbench.adapters import Adapter, plan_select_then_final
from transferbench.engine.compute import check_finite


class ToyDataset(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    group: str | None = None
    version: str = ""
    offset: float


def toy_accuracy(backbone: str, offset: float, lr: float, seed: int, split: str, dataset: str) -> float:
    bonus = 2.0 if "_dpn" in backbone else 1.0 if "_dtn" in backbone else 0.0
    noise = np.random.default_rng([seed, len(dataset), ord(dataset[0]), 0 if split == "val" else 1]).normal()
    return 60.0 + bonus + offset - 15.0 * (math.log10(lr) + 2.0) ** 2 + noise


def degraded(dataset: str) -> float:
    """TOY_DEGRADE=alpha:5,beta:1 lowers those datasets' accuracy by those points: a deliberate regression,
    outside the cell's identity (as a code change would be) for the nightly tests."""
    spec = dict(part.split(":") for part in os.environ.get("TOY_DEGRADE", "").split(",") if part)
    return float(spec.get(dataset, 0.0))


class ToyAdapter(Adapter):
    name = "toy"
    dataset_schema = ToyDataset

    def plan(self, task, backbone, results):
        return plan_select_then_final(task, backbone, results)

    def run(self, cell, ctx):
        if os.environ.get("TOY_LOG"):  # one line per computation: the tests count recomputations
            with open(os.environ["TOY_LOG"], "a") as f:
                f.write(cell.key + "\n")
        if os.environ.get("TOY_PID_DIR"):  # which process computes which cell: the tests kill one mid-cell
            with open(os.path.join(os.environ["TOY_PID_DIR"], f"{cell.key}.{os.getpid()}.pid"), "w") as f:
                f.write(str(os.getpid()))
        hp = cell.hparams
        if os.environ.get("TOY_FAIL") == cell.dataset:  # outside the cell's identity: a rerun retries it
            raise RuntimeError(f"toy failure on {cell.dataset}")
        loss = 1.0
        for step in ctx.progress(range(hp["steps"]), desc=f"{cell.dataset} lr={hp['lr']}"):
            time.sleep(hp["delay"])
            loss = loss * (10.0 if hp["lr"] >= 1.0 else 0.5)
            if hp["lr"] >= 1.0 and step == hp["steps"] - 1:
                loss = float("inf")
            check_finite(loss, step=step)
        offset = cell.dataset_config["offset"]
        split = "val" if cell.stage == "select" else "test"
        acc = toy_accuracy(cell.backbone, offset, hp["lr"], cell.seed, split, cell.dataset) - degraded(cell.dataset)
        return {split: {"accuracy": acc}, "info": {"final_loss": loss}}


# --- a report kind of the plugin's own: registered under transferbench.reports, named by its adapter's cells ---

from transferbench.cell import make_cell  # noqa: E402


class ToyBestAdapter(ToyAdapter):
    """The toy metric in one final stage whose cells name the plugin's report, 'toybest'."""

    name = "toybest"

    def plan(self, task, backbone, results):
        return [
            make_cell(task, ds, backbone, hp, seed, "final", report="toybest")
            for ds in task.datasets
            for hp in task.grid()
            for seed in task.seeds
        ]
