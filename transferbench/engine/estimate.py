"""What a run will cost before it runs (`transferbench run --dry-run`): the whole plan, every stage enumerated as if
each selection had already been made, the images each cell trains on, and, where this device has been probed for
the cells' model shapes, the device-hours of those training steps.

The probe (`--probe`) times a few training steps (forward, backward, an SGD step) of one model shape at a small
batch on the current device and keeps milliseconds per image in $TRANSFERBENCH_HOME/cost-probe, one entry per
device kind, model shape and resolution (written and checked as every cache entry is). The estimate scales that
rate linearly with the images a cell trains on: larger batches usually run faster per image on a GPU, so it is an
upper bound there; evaluation, feature extraction and data loading are not counted.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field

from ..backbones.registry import backbone_code
from ..fingerprint import for_cache
from ..hashing import digest
from ..paths.entries import sealed, verified
from ..paths.home import cache

log = logging.getLogger("transferbench")


class Chosen:
    """Planning's view of results in a dry run: every selection stage is taken as decided (by its first setting), so
    that the plan shows the stages that would follow it."""

    def best(self, cells: list) -> dict | None:
        return {k: cells[0].hparams[k] for k in cells[0].select} if cells else None


def full_plan(task, backbones: list) -> list:
    """Every cell a run of `task` for `backbones` would compute, all stages included, once each."""
    return list({c.key: c for b in backbones for c in task.adapter.plan(task, b, Chosen())}.values())


@dataclass
class Stage:
    name: str
    cells: int = 0
    finished: int = 0
    images: int = 0
    hours: float = 0.0
    unprobed: set = field(default_factory=set)


def shape_of(task, cell) -> tuple[str, int]:
    """The model shape a cell trains: the backbone's architecture name and the side of its images, as its adapter
    says (`Adapter.input_size`)."""
    return cell.backbone_name, int(task.adapter.input_size(cell))


def training_images(task, cell) -> int:
    """The images `cell` trains the backbone on, as its adapter counts them (`Adapter.training_images`)."""
    return int(task.adapter.training_images(cell))


def trained_shapes(task, cells: list) -> list[tuple[str, int]]:
    """The model shapes the cells that train a backbone train: what `--probe` measures."""
    return sorted({shape_of(task, c) for c in cells if training_images(task, c)})


def stages(task, cells: list, store=None, device: str = "cpu") -> list[Stage]:
    """Per stage (in plan order): cells, those already finished in `store`, training images and the estimated
    device-hours where every shape the stage trains has been probed on `device` (`Stage.unprobed` lists the rest)."""
    out: dict[str, Stage] = {}
    rates: dict = {}
    for c in cells:
        st = out.setdefault(c.stage or "-", Stage(c.stage or "-"))
        st.cells += 1
        st.finished += bool(store is not None and store.finished(c))
        images = training_images(task, c)
        st.images += images
        if images:
            shape = shape_of(task, c)
            if shape not in rates:
                rates[shape] = read_probe(device, *shape)
            if rates[shape] is None:
                st.unprobed.add(shape)
            else:
                st.hours += images * rates[shape]["ms_per_image"] / 3.6e6
    return list(out.values())


def _key(device: str, name: str, resolution: int) -> str:
    from .precision import device_kind

    code = for_cache("cost-probe", *backbone_code(name)).digest
    return digest({"code": code, "device": device_kind(device), "backbone": name, "resolution": resolution})


def read_probe(device: str, name: str, resolution: int) -> dict | None:
    path = cache("cost-probe") / f"{_key(device, name, resolution)}.json"
    if not verified(path, "cost probe entry"):
        return None
    return json.loads(path.read_text())


def probe(device: str, name: str, resolution: int, *, batch: int | None = None, steps: int = 3) -> dict:
    """Milliseconds per image of a training step of `name` at `resolution` on `device` (bf16 autocast on CUDA, fp32
    elsewhere), the median of `steps` timed steps after one warm-up; stored for `read_probe`."""
    import statistics

    import torch

    from ..backbones import create_backbone
    from .precision import cuda_bf16_units, device_kind
    from .train import optimizer_options

    batch = batch or (32 if device.startswith("cuda") else 4)
    model = create_backbone(name, img_size=resolution, num_classes=10).to(device).train()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9, **optimizer_options(device))
    x = torch.randn(batch, 3, resolution, resolution, device=device)
    y = torch.randint(0, 10, (batch,), device=device)
    bf16 = device.startswith("cuda") and cuda_bf16_units(device)[0]
    times = []
    for i in range(steps + 1):
        started = time.perf_counter()
        with torch.autocast(device.split(":")[0], dtype=torch.bfloat16, enabled=bf16):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        if i:
            times.append(time.perf_counter() - started)
    entry = {
        "ms_per_image": round(1000 * statistics.median(times) / batch, 4),
        "batch": batch,
        "bf16": bf16,
        "device": device_kind(device),
        "backbone": name,
        "resolution": resolution,
    }
    with sealed(cache("cost-probe") / f"{_key(device, name, resolution)}.json") as tmp:
        tmp.write_text(json.dumps(entry, indent=1))
    log.info(
        "probed %s at %d px on %s: %.3f ms per training image", name, resolution, entry["device"], entry["ms_per_image"]
    )
    return entry
