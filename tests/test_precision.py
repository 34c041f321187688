"""bf16 auto: a timed probe of the cell's own step decides, once per device kind and shape; the choice is
recorded, never part of the cell key."""

import json
import time

import pytest
import torch

from transferbench.backbones import create_backbone
from transferbench.engine import precision
from transferbench.engine.losses import cross_entropy
from transferbench.engine.train import fit


@pytest.fixture
def bf16_cpu(monkeypatch, tmp_path):
    """A CPU that lists bf16 units (so auto probes) and a fresh cache."""
    monkeypatch.setenv("TRANSFERBENCH_HOME", str(tmp_path))
    monkeypatch.setattr(precision, "cpu_bf16_units", lambda: True)


def burn(ms: float) -> None:
    """Work on the CPU for `ms` milliseconds of this process's CPU time."""
    end = time.process_time() + ms / 1000
    while time.process_time() < end:
        pass


def sleeper(fp32_ms: float, bf16_ms: float, calls: list, waits=(0.0, 0.0)):
    """A step that works `fp32_ms` or `bf16_ms` of CPU time, then waits `waits` (fp32, bf16) ms on the wall clock
    without working, as a step does while another program holds the cores."""

    def make_step():
        calls.append("built")

        def step(bf16):
            burn(bf16_ms if bf16 else fp32_ms)
            time.sleep(waits[bf16] / 1000)

        return step

    return make_step


def test_bf16_setting_spellings_map_to_on_off_or_auto():
    assert [precision.check_setting(s) for s in ("on", True, "true", "off", False, "false", "auto")] == [
        "on",
        "on",
        "on",
        "off",
        "off",
        "off",
        "auto",
    ]
    with pytest.raises(ValueError, match="bf16 must be auto, on or off"):
        precision.check_setting("fast")
    never = lambda: pytest.fail("on/off never probe")  # noqa: E731
    assert precision.resolve("on", "cpu", {}, never).bf16 is True
    assert precision.resolve("off", "cpu", {}, never).bf16 is False


def test_auto_takes_the_faster_and_records_why(bf16_cpu):
    calls = []
    slow_bf16 = precision.resolve("auto", "cpu", {"shape": 1}, sleeper(2, 12, calls))
    fast_bf16 = precision.resolve("auto", "cpu", {"shape": 2}, sleeper(12, 2, calls))
    assert (slow_bf16.bf16, fast_bf16.bf16) == (False, True)
    assert calls == ["built", "built"]
    info = slow_bf16.info
    assert info["decided_by"] == "probe" and info["probe_cached"] is False
    assert 2 <= info["fp32_ms"] < info["bf16_ms"]  # the fastest of steps of 2 and 12 ms of CPU time
    assert info["bf16_ms"] >= 12 and info["clock"] == "cpu"


def test_a_loaded_machine_decides_as_an_idle_one(bf16_cpu):
    """Another program's load stretches the wall clock of a step, not the work it does: the probe times CPU time,
    so a step that waits 40 ms for the cores on every bf16 run (by the wall clock bf16 is 3x slower) is still
    judged by its 4 ms of work against fp32's 12, as it would be on an idle machine."""
    calls = []
    idle = precision.resolve("auto", "cpu", {"shape": 1}, sleeper(12, 4, calls))
    loaded = precision.resolve("auto", "cpu", {"shape": 2}, sleeper(12, 4, calls, waits=(0.0, 40.0)))
    assert idle.bf16 is loaded.bf16 is True
    assert loaded.info["bf16_ms"] < 0.9 * loaded.info["fp32_ms"]


def test_decision_is_cached_per_shape_and_a_damaged_entry_is_probed_again(bf16_cpu, tmp_path):
    calls = []
    first = precision.resolve("auto", "cpu", {"shape": 1}, sleeper(12, 2, calls))
    # the same shape on the same device: the cached timings decide, even if the machine changed its mind
    again = precision.resolve("auto", "cpu", {"shape": 1}, sleeper(2, 12, calls))
    assert calls == ["built"] and again.bf16 is first.bf16 is True and again.info["probe_cached"] is True
    entries = list((tmp_path / "bf16-probe").glob("*.json"))
    assert len(entries) == 1 and json.loads(entries[0].read_text())["step"] == {"shape": 1}
    entries[0].write_text('{"fp32_ms": "garbage"')  # a torn write
    redo = precision.resolve("auto", "cpu", {"shape": 1}, sleeper(2, 12, calls))
    assert calls == ["built", "built"] and redo.bf16 is False and redo.info["probe_cached"] is False


def test_no_bf16_units_means_fp32_without_a_probe(monkeypatch, tmp_path):
    monkeypatch.setenv("TRANSFERBENCH_HOME", str(tmp_path))
    monkeypatch.setattr(precision, "cpu_bf16_units", lambda: False)
    p = precision.resolve("auto", "cpu", {}, lambda: pytest.fail("emulated bf16 is never probed"))
    assert p.bf16 is False and "no cpu bf16 units" in p.info["decided_by"]


def test_probe_leaves_the_random_state_and_the_model_as_they_were(bf16_cpu):
    torch.manual_seed(0)
    model = create_backbone("mu4", img_size=16, num_classes=3, drop_rate=0.1)  # dropout draws in the probe
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x, y = torch.randn(4, 3, 16, 16), torch.tensor([0, 1, 2, 0])
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    timing = precision.probe(precision.training_step(model, x, y, cross_entropy, "cpu"), pairs=2)
    assert torch.equal(torch.rand(3), expected)
    assert timing["pairs"] >= 1 and timing["fp32_ms"] > 0 and timing["bf16_ms"] > 0
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_fit_resolves_auto_on_the_first_batch_and_trains_the_same(bf16_cpu, monkeypatch):
    """A probe that picks fp32 gives exactly the weights of a plain fp32 run: the probe draws nothing."""
    real = precision.probe  # runs the steps (dropout draws included), then reports fp32 as the faster
    monkeypatch.setattr(precision, "probe", lambda step, **kw: {**real(step, pairs=1), "fp32_ms": 1.0, "bf16_ms": 2.0})

    def run(bf16):
        torch.manual_seed(0)
        m = create_backbone("mu4", img_size=16, num_classes=3, drop_rate=0.1)
        gen = torch.Generator().manual_seed(1)
        batches = iter([(torch.randn(4, 3, 16, 16, generator=gen), torch.tensor([0, 1, 2, 0])) for _ in range(3)])
        out = fit(
            m,
            batches,
            torch.optim.SGD(m.parameters(), lr=0.1),
            steps=3,
            base_lr=0.1,
            warmup=0,
            clip=1.0,
            loss_fn=cross_entropy,
            device="cpu",
            bf16=bf16,
        )
        return m, out

    auto_model, auto_out = run("auto")
    plain_model, plain_out = run(False)
    assert auto_out["bf16"] is False and auto_out["bf16_choice"]["fp32_ms"] == 1.0
    assert "bf16_choice" not in plain_out
    for (k, a), b in zip(auto_model.state_dict().items(), plain_model.state_dict().values()):
        assert torch.equal(a, b), k


@pytest.mark.parametrize(
    "card, capability, native",
    [("Tesla V100", (7, 0), False), ("Tesla T4", (7, 5), False), ("A100", (8, 0), True), ("H200", (9, 0), True)],
)
def test_bf16_auto_on_cuda_takes_bf16_only_on_cards_that_compute_it(monkeypatch, card, capability, native):
    # torch 2.x's is_bf16_supported() says yes on a V100 or T4 too (emulated bf16, slower than fp32 there): auto goes by
    # the compute capability, bf16 from 8.0 (Ampere) on, and names the card's capability; no timing probe on CUDA
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a, **k: capability)
    monkeypatch.setattr(torch.version, "hip", None)

    def no_probe():
        raise AssertionError(f"{card}: CUDA needs no timing probe")

    choice = precision._resolve("auto", "cuda", {"mode": "train"}, no_probe, None)
    assert choice.bf16 is native
    cc = f"compute capability {capability[0]}.{capability[1]}"
    assert choice.info["decided_by"] == (
        f"cuda bf16 units ({cc})" if native else f"no cuda bf16 units ({cc}: emulated bf16 is slower)"
    )
    assert precision._resolve("on", "cuda", {"mode": "train"}, no_probe, None).bf16  # asked for, it is given
