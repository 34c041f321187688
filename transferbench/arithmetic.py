"""The arithmetic a number was computed in, and a digest of the raw outputs that computed it.

The code fingerprint (fingerprint.py) says *what* computed a number. This module says *how the machine did the
arithmetic*: everything that can change a number's bits while the code stays the same.

- **machine** (one per process, `transferbench.machine`): ATen's CPU capability, the CPU's vendor, family, model
  and the ISA flags that select kernels, the effective intra-op and inter-op threads, every BLAS/OpenMP pool with
  its settings (threadpoolctl), a digest of `torch.__config__.show()`, the environment variables that steer kernels
  (`ATEN_CPU_CAPABILITY`, `*_NUM_THREADS`, `MKL_CBWR`, `ONEDNN_MAX_CPU_ISA`, `OPENBLAS_CORETYPE`, ...), the version
  of every library a code fingerprint may name, torch's determinism and matmul-precision flags and, on CUDA, the
  device, driver, cuDNN, TF32 flags and `CUBLAS_WORKSPACE_CONFIG`.
- **cell** (one per cell): the precision each step actually ran in (bf16 or fp32, in the order the cell resolved
  them), the micro-batch training really used, torch.compile, the data workers, the device and the cell's execution
  settings (an evaluation batch size), where it has any.
- **caches**: the machine digests of cache entries the cell read that were computed under another machine's
  arithmetic (every cache entry's digest file records the arithmetic that wrote it, `paths.entries.sealed`).

A record's `arithmetic.digest` is the digest of those three: two records with equal digests were computed in the
same arithmetic, so unchanged code with unchanged inputs gives them the same bits (the gate's exact tier,
gate.decide). A record's `outputs` is the sha256 of its raw outputs (predictions and logits, the few-shot
probe's scores, features, the training loss curve and the trained weights, the metrics before rounding): accuracy
is quantised, so a change can move the outputs and leave the accuracy.

A cell's trace (`begin`/`finish`) is per process: one cell at a time runs in a process (the inline executor, and
each worker of the pool and Ray executors).
"""

from __future__ import annotations

import hashlib

from .hashing import canon, digest
from .machine import machine, machine_digest, only_libraries


class Difference(str):
    """One thing that differs between two records' arithmetic, as data: `path` (a dotted field, 'cell.precision',
    'threads.intra_op'; 'arithmetic' where one side records none), `before` and `after` (the values; None where a
    side lacks the field). It reads as its words, 'cell.precision [bf16] -> [fp32]', wherever it is shown."""

    path: str
    before: object
    after: object

    def __new__(cls, path: str, before=None, after=None, text: str | None = None):
        self = super().__new__(cls, text if text is not None else f"{path} {short(before)} -> {short(after)}")
        self.path, self.before, self.after = path, before, after
        return self


NO_ARITHMETIC = Difference("arithmetic", text="no arithmetic recorded")  # one side records none


def differences(a: dict | None, b: dict | None) -> list[Difference]:
    """What differs between two records' `arithmetic` sections, in words: 'threads.intra_op 1 -> 2',
    'cell.precision [fp32] -> [bf16]', 'cpu_capability AVX512 -> DEFAULT'; ['no arithmetic recorded'] where one
    side has none."""
    if not a or not b:
        return [NO_ARITHMETIC]
    out: list[Difference] = []

    def walk(x, y, path):
        if isinstance(x, dict) and isinstance(y, dict):
            for k in sorted(set(x) | set(y)):
                if k != "digest":
                    walk(x.get(k), y.get(k), f"{path}.{k}" if path else k)
        elif canon(x) != canon(y):
            out.append(Difference(path, x, y))

    walk(
        {**a.get("machine", {}), "cell": a.get("cell"), "caches": a.get("caches")},
        {**b.get("machine", {}), "cell": b.get("cell"), "caches": b.get("caches")},
        "",
    )
    return out


# a part of the machine that only one side records (a field that later code added) says nothing about the machine:
# it is skipped, at the top level, among the libraries and among the flags
_OPTIONAL = ("libraries", "flags")


def machine_differences(a: dict | None, b: dict | None) -> list[Difference]:
    """What differs between two records' machines (`arithmetic.machine`), in words: empty where the two ran on
    one kind of machine with one set of kernels, threads and libraries. Equal digests agree at once; otherwise
    the parts both record are compared, so that a field a later version of this module added (the anchor's
    records were made by older code) does not part two runs of one machine. ['no arithmetic recorded'] where one
    side has none."""
    if not a or not b or not a.get("digest") or not b.get("digest"):
        return [NO_ARITHMETIC]
    ma, mb = a.get("machine") or {}, b.get("machine") or {}
    if not ma.get("digest") or not mb.get("digest"):  # no machine of its own: the whole digest decides
        if a["digest"] == b["digest"]:
            return []
        return differences(a, b) or [Difference("arithmetic", text="arithmetic differs")]
    if ma["digest"] == mb["digest"]:
        return []
    shared = lambda x, y: {k: x[k] for k in x if k in y and k != "digest"}  # noqa: E731
    xa, xb = shared(ma, mb), shared(mb, ma)
    for part in _OPTIONAL:
        if isinstance(xa.get(part), dict) and isinstance(xb.get(part), dict):
            xa[part], xb[part] = shared(xa[part], xb[part]), shared(xb[part], xa[part])
    return differences({"machine": xa}, {"machine": xb})


def cell_differences(a: dict | None, b: dict | None) -> list[Difference]:
    """What differs between two records' cell arithmetic (the precision each step ran in, the micro-batch, compile,
    data workers, the device, execution settings such as the evaluation batch), in words: 'cell.precision [bf16]
    -> [fp32]'. These are chosen by the code and the command, not by the machine."""
    return differences({"machine": {}, "cell": (a or {}).get("cell")}, {"machine": {}, "cell": (b or {}).get("cell")})


def cache_differences(a: dict | None, b: dict | None) -> list[Difference]:
    """What differs between the cache entries of other arithmetic that two records read."""
    ca, cb = (a or {}).get("caches") or {}, (b or {}).get("caches") or {}
    return [] if canon(ca) == canon(cb) else [Difference("caches", ca, cb)]


def short(v) -> str:
    if v is None:
        return "(none)"
    text = v if isinstance(v, str) else canon(v)
    return text if len(text) <= 60 else text[:57] + "..."


# --- one cell's trace ---------------------------------------------------------------------------------------------


class _Trace:
    """What one cell did to the arithmetic and what it produced (one per process: the cell running in it)."""

    def __init__(self, pins=None, active=True):
        self.active = active  # outside a cell (benchmarks, library use) outputs are not hashed: no cost
        self.precision: list[str] = []  # 'bf16' | 'fp32' per resolved step, in order
        self.steps: list[str] = []  # ... and the step each was resolved for (`step_key` of its shape)
        self.micro_batch: list[int] = []  # the micro-batch each training loop ended with (0: the whole batch)
        self.compiled: list[bool] = []  # whether each training loop ran through torch.compile
        self.caches: dict[str, set] = {}  # cache folder -> machine digests of entries read that another computed
        self.outputs = hashlib.sha256()
        # the baseline's precision choices (nightly): {step key: bf16?}, or a list in order (records of older code)
        self.pins = dict(pins) if isinstance(pins, dict) else list(pins) if pins else []
        self.next: tuple | None = None  # a pin of another source for the next step (`pin_next`)


_TRACE = _Trace(active=False)


def begin(pins=None) -> None:
    """Start a cell's trace (`pins`: the precision each auto-resolved step must take, {step key: bf16?}; or bools
    in order, as `pins_of` reads them from records that name no steps)."""
    global _TRACE
    _TRACE = _Trace(pins)


def step_key(signature: dict) -> str:
    """The name of one step whose precision a cell resolves: a digest of its shape (model, batch, input size,
    forward or training), so that a pin finds its step whatever steps ran before it (a model read from a cache on
    one side and trained on the other skips the training steps)."""
    return digest(signature, 12)


def note_precision(bf16: bool, step: str = "") -> None:
    _TRACE.precision.append("bf16" if bf16 else "fp32")
    _TRACE.steps.append(step)


def pinned(step: str = "") -> bool | tuple | None:
    """The precision pin of this cell's step `step`, or None where it has none (then the probe decides): a bool
    (the baseline's choice), or (bool, who decided it) for a pin of another source (`pin_next`). Pins read from
    records that name no steps are taken in order."""
    if isinstance(_TRACE.pins, dict):
        mine = _TRACE.pins.get(step)
    else:
        mine = _TRACE.pins.pop(0) if _TRACE.pins else None
    other, _TRACE.next = _TRACE.next, None
    return mine if mine is not None else other


def pin_next(bf16: bool, by: str) -> None:
    """Pin the next precision this cell resolves to `bf16`, decided by `by` (in words, for the record), unless the
    cell carries a baseline pin for that step (the nightly's baseline choice wins)."""
    _TRACE.next = (bf16, by)


def note_compiled(compiled: bool) -> None:
    """Whether a training loop of the cell ran through torch.compile (engine.train.fit decides per loop)."""
    _TRACE.compiled.append(bool(compiled))


def note_micro_batch(micro: int) -> None:
    _TRACE.micro_batch.append(int(micro or 0))


# caches of timings, not of numbers: the precision a probe picked is held per cell, whoever timed it
TIMINGS = ("bf16-probe", "cost-probe")


def note_cache_read(kind: str, arithmetic: str | None) -> None:
    """A cache entry of `kind` was read; `arithmetic` is the machine digest that computed it (None: unrecorded)."""
    if kind not in TIMINGS and arithmetic != machine_digest():
        _TRACE.caches.setdefault(kind, set()).add(arithmetic or "unrecorded")


def output(name: str, value) -> None:
    """Feed one raw output of the cell (a tensor, an array, a number or a mapping of them) into its outputs
    digest, with its name, dtype and shape. Outside a cell's trace it does nothing."""
    import numpy as np

    if not _TRACE.active:
        return
    if isinstance(value, dict):
        for k in sorted(value):
            output(f"{name}.{k}", value[k])
        return
    if hasattr(value, "detach"):  # a torch tensor
        import torch

        value = value.detach()
        if value.dtype.is_floating_point and value.dtype not in (torch.float16, torch.float32, torch.float64):
            value = value.float()  # bf16 has no numpy type; widening keeps every bit
        value = value.cpu().contiguous().numpy()
    a = np.ascontiguousarray(np.asarray(value))
    h = _TRACE.outputs
    h.update(f"{name}|{a.dtype.str}|{a.shape}|".encode())
    h.update(a.tobytes() if a.dtype != object else canon(a.tolist()).encode())


def finish(
    metrics: dict,
    *,
    device: str,
    workers: int,
    compile: bool | str,
    micro_batch,
    execution: dict | None = None,
    libraries=None,
) -> tuple[dict, str]:
    """(the record's `arithmetic`, its `outputs` digest) for the cell whose trace `begin` started; the metrics at
    full precision end the outputs. The cell's execution settings (an evaluation batch size: no part of its key,
    but a batch size can move the last bits of a sum) are part of its arithmetic where it has any. `libraries`: the
    distributions the cell's code path names (its fingerprint's); the machine's library versions are kept for those
    alone, so that a library the task never imports parts no two runs."""
    output("metrics", {s: {k: float(v) for k, v in m.items()} for s, m in metrics.items()})
    m = machine() if libraries is None else only_libraries(machine(), libraries)
    cell = {
        "device": device.split(":")[0],
        "precision": list(_TRACE.precision),
        "micro_batch": list(_TRACE.micro_batch) or micro_batch or 0,
        # what ran: any training loop compiled; a cell without one keeps the setting asked for (on: True)
        "compile": any(_TRACE.compiled) if _TRACE.compiled else compile is True or compile == "on",
        "workers": int(workers),
    }
    if execution:
        cell["execution"] = {k: execution[k] for k in sorted(execution)}
    caches = {k: sorted(v) for k, v in sorted(_TRACE.caches.items())}
    record = {"digest": digest({"machine": m["digest"], "cell": cell, "caches": caches}, 16), "machine": m}
    record.update(cell=cell, caches=caches)
    if any(_TRACE.steps):  # which step each precision is of: what pins are keyed by (outside the digest)
        record["steps"] = list(_TRACE.steps)
    outputs = _TRACE.outputs.hexdigest()[:24]
    end()
    return record, outputs


def end() -> None:
    """Close the cell's trace (also where the cell failed): later outputs of the process are not the cell's."""
    global _TRACE
    _TRACE = _Trace(active=False)


# --- records ------------------------------------------------------------------------------------------------------


def pins_of(records: list[dict]) -> dict:
    """{cell key: {step key: bf16?}} of the finished records that hold their arithmetic: what `transferbench
    nightly` pins tonight's `bf16: auto` steps to, each by the step it was resolved for; records that name no steps
    (older code) give their choices as a list, taken in order."""
    out = {}
    for r in records:
        arith = r.get("arithmetic") or {}
        cell = arith.get("cell") or {}
        if r.get("status") != "ok" or not cell.get("precision"):
            continue
        bf16 = [p == "bf16" for p in cell["precision"]]
        steps = arith.get("steps") or []
        out[r["key"]] = dict(zip(steps, bf16)) if len(steps) == len(bf16) and all(steps) else bf16
    return out


def arithmetic_key(records: list[dict]) -> str:
    """The name of a night's arithmetic (its rolling baseline's folder): the digest of the machine digests its
    records were computed under."""
    machines = {((r.get("arithmetic") or {}).get("machine") or {}).get("digest") for r in records}
    return digest(sorted(m or "unrecorded" for m in machines), 16)


if __name__ == "__main__":  # `python -m transferbench.arithmetic`: this machine's digest (the nightly's cache keys)
    print(machine_digest())
