"""Which arithmetic a cell runs in: `bf16: on | off | auto`.

`auto` uses bf16 autocast only where it measures faster. On a CUDA card that computes bf16 natively (compute
capability 8.0 or newer) it is bf16 without probing (the tensor cores' format); an older card (V100, T4) emulates
it, so it is fp32 there. On a CPU without bf16 units (no `avx512_bf16` / `amx_bf16` in
/proc/cpuinfo) bf16 is emulated, so it is fp32 without probing. Elsewhere a short probe times the cell's own
step (forward + backward for training, forward for feature extraction and evaluation) at the cell's own
model and batch shape in fp32 and in bf16, alternating, and takes bf16 only where it is at least PROBE_MARGIN
faster (a near tie stays fp32, so that two fresh homes on one kind of machine decide alike). A measured 2-core Xeon with
AMX ran a small ViT's training step 1.9x slower under bf16 autocast, so the CPU flags alone do not decide.

The decision is cached per (machine and library digest, step signature) under $TRANSFERBENCH_HOME/bf16-probe, so
one machine decides once per shape and a repeat run reads the decision whatever the load; a damaged entry is probed
again. The probe times CPU time on a CPU and takes the fastest pair, so that a fresh home on a loaded machine
decides as an idle one does. A pin decides instead of the probe: `transferbench nightly` pins each step to the
baseline record's choice, and the embedded pretraining profile trains in the precision its shipped checkpoints
were trained in (adapters.pretrain.SHIPPED_PRECISION). The
choice and its timings go into the record's `info` (not into the cell key: fp32 and bf16 are the same
protocol).
"""

from __future__ import annotations

import copy
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import torch

from ..arithmetic import note_precision, pinned, step_key
from ..fingerprint import for_cache
from ..hashing import digest
from ..paths.entries import quarantine, sealed, verified
from ..paths.home import cache

PROBE_PAIRS = 7  # timed (fp32, bf16) step pairs at most ...
PROBE_SECONDS = 2.0  # ... or fewer once this much time is spent (at least one pair)
# bf16 only where it measures at least this much faster: a near tie (a fraction of a percent) stays fp32, so that a
# fresh home's probe does not flip the arithmetic of a cell from one run to the next
PROBE_MARGIN = 0.10


@dataclass(frozen=True)
class Precision:
    """The resolved choice: `bf16` for autocast, `info` for the record."""

    bf16: bool
    info: dict = field(default_factory=dict)


def autocast(device: str, enabled: bool):
    return torch.autocast(device_type=device.split(":")[0], dtype=torch.bfloat16, enabled=enabled)


def check_setting(setting) -> str:
    """'auto' | 'on' | 'off' from a spec or --set value (YAML may give a boolean)."""
    if setting in (True, "true", "on"):
        return "on"
    if setting in (False, "false", "off"):
        return "off"
    if setting != "auto":
        raise ValueError(f"bf16 must be auto, on or off, got {setting!r}")
    return "auto"


@lru_cache(maxsize=1)
def _cpuinfo() -> str:
    """/proc/cpuinfo, read once per process ('' where there is none)."""
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def cpu_model() -> str | None:
    """The CPU's model name from /proc/cpuinfo, or None."""
    return next(
        (line.split(":", 1)[1].strip() for line in _cpuinfo().splitlines() if line.startswith("model name")), None
    )


def cpu_bf16_units() -> bool:
    flags = _cpuinfo()
    return "avx512_bf16" in flags or "amx_bf16" in flags


def device_kind(device: str) -> str:
    """What the speed of a step depends on besides its shape: the machine and library digest
    (`arithmetic.machine`: the processor and its kernel flags, threads, BLAS pools, every library's version), and
    the device. One decision per step shape is taken per machine and library digest, and kept in the home."""
    from ..arithmetic import machine_digest

    if device.startswith("cuda"):
        name = torch.cuda.get_device_name(torch.device(device))
    elif device == "cpu":
        name = f"{cpu_model() or 'cpu'} bf16-units={cpu_bf16_units()}"
    else:
        name = device
    return f"{name} | machine {machine_digest()}"


# NVIDIA cards compute bf16 natively from Ampere on (compute capability 8.0: A100, A10, RTX 30xx; H100, H200 are 9.0).
# Older cards (V100 7.0, T4 7.5) emulate it, and torch 2.x's is_bf16_supported() still says yes for them (its
# `including_emulation` defaults to True), so `auto` asks for the capability itself.
BF16_NATIVE_CC = (8, 0)


def cuda_bf16_units(device: str = "cuda") -> tuple[bool, str]:
    """(whether the card computes bf16 natively, 'compute capability M.N') for a CUDA device; ROCm: torch's own
    native check."""
    major, minor = torch.cuda.get_device_capability(device)
    card = f"compute capability {major}.{minor}"
    if getattr(torch.version, "hip", None):
        return bool(torch.cuda.is_bf16_supported(including_emulation=False)), card
    return (major, minor) >= BF16_NATIVE_CC, card


def resolve(setting, device: str, signature: dict, make_step: Callable[[], Callable[[bool], None]]) -> Precision:
    """The precision for a cell. `signature` names the step's shape (model, batch, input size, forward or
    training); `make_step()` is called only when a probe must run and returns `step(bf16)`, which runs one
    step and returns once it is finished. Where the cell carries a pin (`transferbench nightly` pins `auto` to the
    baseline record's choice), the probe still runs and its pick is kept in the info, but the pin decides
    (`decided_by: baseline`). The choice is noted in the cell's arithmetic (transferbench.arithmetic)."""
    step = step_key(signature)
    choice = _resolve(setting, device, signature, make_step, pinned(step))  # the pin of this step, by its shape
    note_precision(choice.bf16, step)
    return choice


def _resolve(setting, device: str, signature: dict, make_step, pin: bool | None) -> Precision:
    setting = check_setting(setting)
    if setting != "auto":
        return Precision(setting == "on", {"setting": setting})
    if device.startswith("cuda"):
        ok, card = cuda_bf16_units(device)
        why = f"cuda bf16 units ({card})" if ok else f"no cuda bf16 units ({card}: emulated bf16 is slower)"
        return Precision(ok, {"setting": "auto", "decided_by": why})
    if device == "cpu" and not cpu_bf16_units():
        return Precision(False, {"setting": "auto", "decided_by": "no cpu bf16 units (emulated bf16 is slower)"})
    kind = device_kind(device)
    path = cache("bf16-probe") / f"{probe_key(kind, signature)}.json"
    timing = _read(path)
    cached = timing is not None
    if timing is None:
        timing = probe(make_step())
        _write(path, {**timing, "device": kind, "step": signature})
    bf16 = faster(timing)
    info = {
        "setting": "auto",
        "decided_by": "probe",
        "probe_cached": cached,
        "fp32_ms": timing["fp32_ms"],
        "bf16_ms": timing["bf16_ms"],
        "margin": PROBE_MARGIN,
        "clock": timing.get("clock", "wall"),
    }
    if pin is not None:
        pin, by = pin if isinstance(pin, tuple) else (pin, "baseline")
        info.update(decided_by=by, probe_bf16=bf16)
        bf16 = pin
    return Precision(bf16, info)


def faster(timing: dict, margin: float = PROBE_MARGIN) -> bool:
    """Whether bf16 wins a probe: at least `margin` (a fraction) faster than fp32."""
    return timing["bf16_ms"] < (1.0 - margin) * timing["fp32_ms"]


def probe_key(kind: str, signature: dict) -> str:
    """A bf16 decision's cache key: the device kind, the step's shape and the fingerprint of the probe's code."""
    return digest({"code": for_cache("bf16-probe").digest, "device": kind, "step": signature}, 24)


def probe(step: Callable[[bool], None], pairs: int = PROBE_PAIRS, seconds: float = PROBE_SECONDS) -> dict:
    """The fastest of `step(False)` and of `step(True)`, after two warm-up steps each, timed in pairs whose order
    alternates (so neither a slow spell of the machine nor going first favours one) until `pairs` pairs or
    `seconds` have passed. On a CPU the time is the process's CPU time, which another program's load does not
    inflate as it does the wall clock (a loaded 2-core machine once measured fp32 6.6x slower and bf16 2.8x slower
    by the wall clock, and flipped the choice); the fastest of the pairs is the one least disturbed. On CUDA it is
    the wall clock (the host waits on the device). The CPU random state is restored afterwards: a probe never
    changes what the cell draws."""
    clock = time.perf_counter if getattr(step, "device", "cpu").startswith("cuda") else time.process_time
    with torch.random.fork_rng(devices=[]):
        for bf16 in (False, True, False, True):
            step(bf16)
        times: dict[bool, list[float]] = {False: [], True: []}
        started = time.perf_counter()
        while len(times[True]) < pairs and (not times[True] or time.perf_counter() - started < seconds):
            for bf16 in (False, True) if len(times[True]) % 2 == 0 else (True, False):
                t = clock()
                step(bf16)
                times[bf16].append(1000 * (clock() - t))
    return {
        "fp32_ms": round(max(min(times[False]), 1e-3), 3),
        "bf16_ms": round(max(min(times[True]), 1e-3), 3),
        "pairs": len(times[True]),
        "clock": "wall" if clock is time.perf_counter else "cpu",
        "median_fp32_ms": round(statistics.median(times[False]), 3),
        "median_bf16_ms": round(statistics.median(times[True]), 3),
    }


def _read(path: Path) -> dict | None:
    """A cached decision, or None where there is none; a damaged one is set aside (paths.entries.verified) and probed
    again."""
    if not verified(path, "bf16 probe cache entry"):
        return None
    d = json.loads(path.read_text())
    if all(isinstance(d.get(k), (int, float)) and d[k] > 0 for k in ("fp32_ms", "bf16_ms")):
        return d
    quarantine(path, "no positive fp32_ms and bf16_ms", "bf16 probe cache entry")
    return None


def _write(path: Path, entry: dict) -> None:
    with sealed(path) as tmp:
        tmp.write_text(json.dumps(entry, indent=1, sort_keys=True))


def shapes(model: torch.nn.Module) -> dict:
    """A model's architecture as far as speed goes: its class and every parameter's name and shape."""
    return {
        "class": type(model).__name__,
        "parameters": digest([(n, list(p.shape)) for n, p in model.named_parameters()], 16),
    }


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(torch.device(device))


def training_step(model: torch.nn.Module, x, y, loss_fn: Callable, device: str) -> Callable[[bool], None]:
    """One forward + backward of a copy of `model` on (x, y) as engine.train.fit runs it (the copy keeps the
    model's gradients and state untouched)."""
    twin = copy.deepcopy(model)
    twin.train(model.training)
    x, y = x.to(device), y.to(device)

    def step(bf16: bool) -> None:
        twin.zero_grad(set_to_none=True)
        with autocast(device, bf16):
            out = twin(x)
        loss_fn(out.float(), y).backward()
        _sync(device)

    step.device = device
    return step


def probe_images(batch: int, resolution: int) -> torch.Tensor:
    """A fixed batch of square images in [-1, 1] for a forward probe (its own generator: no global draw)."""
    return torch.rand(batch, 3, resolution, resolution, generator=torch.Generator().manual_seed(0)) * 2 - 1


def forward_step(
    forward: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, device: str
) -> Callable[[bool], None]:
    """One inference-mode forward of `forward` on `x`."""
    x = x.to(device)

    def step(bf16: bool) -> None:
        with torch.inference_mode(), autocast(device, bf16):
            forward(x)
        _sync(device)

    step.device = device
    return step


def for_forward(setting, device: str, model: torch.nn.Module, batch: int, resolution: int) -> Precision:
    """bf16 or fp32 for evaluating `model` (already on `device`) in batches of `batch` square images."""

    def make_step():
        return forward_step(model, probe_images(batch, resolution), device)

    return resolve(
        setting, device, {"mode": "eval", "model": shapes(model), "x": [batch, 3, resolution, resolution]}, make_step
    )
