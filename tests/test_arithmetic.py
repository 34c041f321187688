"""The arithmetic digest (transferbench/arithmetic.py): what it holds and what changes it, the cache entries that say
which arithmetic computed them, the records that say when they read one computed elsewhere, the outputs digest that
sees a change the quantised accuracy hides, and the bf16 probe's margin and pins."""

import json

import numpy as np
import pytest
import torch
from kit import cli, embedded_home

from transferbench import arithmetic, machine
from transferbench.engine import precision
from transferbench.records.store import load_records

FEWSHOT = "run fewshot --suite nightly --datasets mini_digits --backbone mu4 --seeds 0 --set bf16=off --no-progress"


def test_the_machine_digest_holds_kernels_threads_and_steering_variables(monkeypatch):
    a = arithmetic.machine()
    assert a == arithmetic.machine()  # stable within a process
    assert a["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert a["threads"]["intra_op"] == torch.get_num_threads()
    assert a["libraries"]["torch"] == torch.__version__.split("+")[0] or a["libraries"]["torch"] in torch.__version__
    assert {"numpy", "scipy", "timm", "open_clip_torch", "python"} <= set(a["libraries"])
    # another thread count is another arithmetic (another reduction order), and says so
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(threads + 1)
        b = arithmetic.machine()
    finally:
        torch.set_num_threads(threads)
    assert b["digest"] != a["digest"]
    rec = lambda m: {"machine": m, "cell": {}, "caches": {}}  # noqa: E731
    assert f"threads.intra_op {threads} -> {threads + 1}" in arithmetic.differences(rec(a), rec(b))
    # so is a variable that steers kernels
    monkeypatch.setenv("MKL_CBWR", "COMPATIBLE")
    c = arithmetic.machine()
    assert c["digest"] != a["digest"] and arithmetic.differences(rec(a), rec(c)) == [
        "variables.MKL_CBWR (none) -> COMPATIBLE"
    ]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_the_digest_holds_the_device_libraries_and_tf32_flags():
    a = arithmetic.machine()["cuda"]
    assert a["device"] == torch.cuda.get_device_name(0) and a["runtime"] == torch.version.cuda
    assert a["cudnn"] == torch.backends.cudnn.version() and tuple(a["capability"]) == torch.cuda.get_device_capability()
    major, minor = (int(x) for x in torch.version.cuda.split(".")[:2])
    assert a["driver"] >= 1000 * major + 10 * minor  # the driver API version runs this runtime
    flag = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = not flag
        b = arithmetic.machine()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = flag
    assert b["cuda"]["tf32_matmul"] is (not flag) and b["digest"] != arithmetic.machine()["digest"]


def test_outputs_outside_a_cell_are_not_hashed_and_a_cell_digests_its_own_alone():
    def cell(extra_before=None):
        if extra_before is not None:
            arithmetic.output("stray", extra_before)  # no trace open: ignored
        arithmetic.begin()
        arithmetic.output("logits", torch.tensor([[1.0, 2.0]], dtype=torch.bfloat16))
        return arithmetic.finish({"test": {"acc": 0.5}}, device="cpu", workers=0, compile=False, micro_batch=0)[1]

    import hashlib

    first = cell()
    assert cell(extra_before=torch.ones(3)) == first
    # by hand: each output is its name, dtype and shape, then its bytes (bf16 widened to float32 exactly; a number
    # is a one-element array)
    h = hashlib.sha256()
    for name, a in (("logits", np.array([[1.0, 2.0]], np.float32)), ("metrics.test.acc", np.array([0.5]))):
        h.update(f"{name}|{a.dtype.str}|{a.shape}|".encode() + a.tobytes())
    assert first == h.hexdigest()[:24]


def test_records_carry_arithmetic_and_outputs_and_recompute_a_cache_entry_of_other_arithmetic(
    suite_home, tmp_path, monkeypatch
):
    home = embedded_home(suite_home, tmp_path / "home")
    monkeypatch.setenv("TRANSFERBENCH_HOME", str(home))
    assert cli(f"{FEWSHOT} --out", tmp_path / "a") == 0
    first = {r["key"]: r for r in load_records([tmp_path / "a"])}
    assert len(first) == 4
    cuda = torch.cuda.is_available()  # a GPU host runs on cuda, where `auto` takes bf16 (no probe)
    for r in first.values():
        assert r["arithmetic"]["cell"] == {
            "device": "cuda" if cuda else "cpu",
            "precision": ["bf16" if cuda else "fp32"],
            "micro_batch": 0,
            "compile": False,
            "workers": 0,
        }
        # the machine with the versions of the libraries the cell's code names (its fingerprint's) alone
        whole = arithmetic.machine()
        assert r["arithmetic"]["machine"] == arithmetic.only_libraries(whole, r["fingerprint"]["libraries"])
        kept = set(r["arithmetic"]["machine"]["libraries"])
        assert kept == set(whole["libraries"]) & set(r["fingerprint"]["libraries"])
        assert "open_clip_torch" in whole["libraries"] and "open_clip_torch" not in kept
        assert r["arithmetic"]["caches"] == {} and len(r["outputs"]) == 24
    # every cache entry records the arithmetic that computed it
    sides = sorted((home / "features").glob("*.digest"))
    assert sides and all(json.loads(p.read_text())["arithmetic"] == arithmetic.machine_digest() for p in sides)
    # a rerun in the same arithmetic reads the features and reproduces every output
    assert cli(f"{FEWSHOT} --force --out", tmp_path / "b") == 0
    for r in load_records([tmp_path / "b"]):
        assert r["info"]["cache_hit"] == {"train": True, "test": True}
        assert (r["arithmetic"]["digest"], r["outputs"]) == (
            first[r["key"]]["arithmetic"]["digest"],
            first[r["key"]]["outputs"],
        )
    # entries said to be computed elsewhere (a home restored from another CPU): computed again here, never read, so
    # the records keep this machine's arithmetic and the entries now record it
    for p in sides:
        p.write_text(json.dumps({**json.loads(p.read_text()), "arithmetic": "elsewhere"}))
    assert cli(f"{FEWSHOT} --force --out", tmp_path / "c") == 0
    third = load_records([tmp_path / "c"])
    # the first cell computes both entries again; the other three read them, now of this arithmetic
    assert sorted(r["info"]["cache_hit"]["train"] for r in third) == [False, True, True, True]
    for r in third:
        assert r["arithmetic"]["caches"] == {}
        assert r["arithmetic"]["digest"] == first[r["key"]]["arithmetic"]["digest"]
        assert r["outputs"] == first[r["key"]]["outputs"]  # the same features, computed again
    assert all(json.loads(p.read_text())["arithmetic"] == arithmetic.machine_digest() for p in sides)


def test_the_outputs_digest_sees_a_solver_change_that_the_accuracy_hides(suite_home, tmp_path, monkeypatch):
    """benchmarks/gate_power.py's `fewshot_bias`: the ridge probe's bias feature 1 instead of 100 changes the
    probe's weights and scores in every cell, but an accuracy (a count of right answers) in few of them."""
    from transferbench.adapters import fewshot

    home = embedded_home(suite_home, tmp_path / "home")
    monkeypatch.setenv("TRANSFERBENCH_HOME", str(home))
    assert cli(f"{FEWSHOT} --out", tmp_path / "a") == 0
    monkeypatch.setattr(fewshot, "BIAS", 1.0)
    assert cli(f"{FEWSHOT} --force --out", tmp_path / "b") == 0
    a = {r["key"]: r for r in load_records([tmp_path / "a"])}
    b = {r["key"]: r for r in load_records([tmp_path / "b"])}
    assert all(b[k]["outputs"] != a[k]["outputs"] for k in a)
    assert all(b[k]["arithmetic"]["digest"] == a[k]["arithmetic"]["digest"] for k in a)


def test_the_probe_takes_bf16_only_past_its_margin():
    assert precision.faster({"fp32_ms": 100.0, "bf16_ms": 99.4}) is False  # a 0.6% tie stays fp32
    assert precision.faster({"fp32_ms": 100.0, "bf16_ms": 89.0}) is True
    assert precision.faster({"fp32_ms": 100.0, "bf16_ms": 91.0}) is False
    assert precision.PROBE_MARGIN == 0.10


@pytest.mark.parametrize("pin", [True, False])
def test_a_pin_decides_auto_while_the_probe_still_runs(tmp_path, monkeypatch, pin):
    import time

    monkeypatch.setenv("TRANSFERBENCH_HOME", str(tmp_path))
    monkeypatch.setattr(precision, "cpu_bf16_units", lambda: True)
    ran = []

    def make_step():
        def step(bf16):
            ran.append(bf16)
            end = time.process_time() + (0.004 if bf16 else 0.0005)  # fp32 is 8x faster: the probe picks fp32
            while time.process_time() < end:  # work, not sleep: the probe times CPU time
                pass

        return step

    arithmetic.begin([pin])
    choice = precision.resolve("auto", "cpu", {"mode": "eval", "pin": pin}, make_step)
    assert ran and choice.bf16 is pin and choice.info["probe_bf16"] is False
    assert choice.info["decided_by"] == "baseline"
    # without a pin the probe decides (read from its cache now)
    arithmetic.begin()
    again = precision.resolve("auto", "cpu", {"mode": "eval", "pin": pin}, make_step)
    assert again.bf16 is False and again.info["decided_by"] == "probe" and again.info["probe_cached"]
    # the i-th pin is the i-th resolve's, whatever the setting: `off` consumes one and keeps fp32
    arithmetic.begin([True, pin])
    assert precision.resolve("off", "cpu", {}, make_step).bf16 is False
    assert precision.resolve("auto", "cpu", {"mode": "eval", "pin": pin}, make_step).bf16 is pin
    record, _ = arithmetic.finish({}, device="cpu", workers=0, compile=False, micro_batch=None)
    assert record["cell"]["precision"] == ["fp32", "bf16" if pin else "fp32"]


def test_pins_come_from_the_baseline_records_in_order():
    recs = [
        {"key": "k1", "status": "ok", "arithmetic": {"cell": {"precision": ["bf16", "fp32"]}}},
        {"key": "k2", "status": "failed", "arithmetic": {"cell": {"precision": ["bf16"]}}},
        {"key": "k3", "status": "ok"},  # a record of older code: no pin
    ]
    assert arithmetic.pins_of(recs) == {"k1": [True, False]}


def test_a_library_the_task_never_imports_parts_no_two_runs(monkeypatch):
    """Two environments that differ only in a library the cell's code does not name (imagecorruptions-imaug beside
    a VTAB cell): one machine digest, so the exact tier judges the pair."""
    digests = []
    for corrupt in ("1.1.5", None):
        libraries = {"torch": "2.14.1", "imagecorruptions-imaug": corrupt}
        monkeypatch.setattr(machine, "_libraries", lambda c=libraries: c)
        arithmetic.begin()
        record, _ = arithmetic.finish({}, device="cpu", workers=0, compile=False, micro_batch=0, libraries=("torch",))
        digests.append((record["digest"], record["machine"]["digest"]))
        assert record["machine"]["libraries"] == {"torch": "2.14.1"}
    assert digests[0] == digests[1]
    arithmetic.begin()
    whole, _ = arithmetic.finish({}, device="cpu", workers=0, compile=False, micro_batch=0)
    assert whole["machine"]["libraries"]["imagecorruptions-imaug"] is None  # unrestricted: every library


def test_precision_pins_are_keyed_by_step_so_a_skipped_step_shifts_nothing():
    """A warm home reads a trained classifier from the cache where the anchor's rerun trained it: the training step's
    precision is not resolved, and the evaluation step must still take the anchor's choice for evaluation."""
    train, evaluate = arithmetic.step_key({"mode": "train", "x": 1}), arithmetic.step_key({"mode": "eval", "x": 1})
    anchor = {
        "key": "k",
        "status": "ok",
        "arithmetic": {"cell": {"precision": ["fp32", "bf16"]}, "steps": [train, evaluate]},
    }
    pins = arithmetic.pins_of([anchor])
    assert pins == {"k": {train: False, evaluate: True}}
    arithmetic.begin(pins["k"])
    assert arithmetic.pinned(evaluate) is True  # the training step was skipped: no shift
    arithmetic.end()
    # records of older code name no steps: their pins are taken in order
    old = {"key": "k", "status": "ok", "arithmetic": {"cell": {"precision": ["fp32", "bf16"]}}}
    assert arithmetic.pins_of([old]) == {"k": [False, True]}
    arithmetic.begin([False, True])
    assert arithmetic.pinned(evaluate) is False and arithmetic.pinned(train) is True
    # a pin of another source (the shipped profile's) decides where the baseline has none for that step
    arithmetic.begin({train: True})
    arithmetic.pin_next(False, "the shipped profile")
    assert arithmetic.pinned(evaluate) == (False, "the shipped profile")
    arithmetic.pin_next(False, "the shipped profile")
    assert arithmetic.pinned(train) is True
    arithmetic.end()
