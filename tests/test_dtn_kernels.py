"""DTN's fused Triton kernels (the GPU's default path) against the float64 equations, on every machine: the kernels run
on CPU tensors in Triton's interpreter, in a process of its own (tests/fixtures/dtn_interpreted.py), since the
interpreter must be chosen before Triton is imported."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")
# the interpreted process (about 15 s of a core) runs once for the module: its tests on one pytest-xdist worker
pytestmark = pytest.mark.xdist_group("dtn_kernels")
SCRIPT = Path(__file__).resolve().parent / "fixtures" / "dtn_interpreted.py"
CASES = ("grid 5x4, 3 heads of 8", "grid 1x7, 2 heads of 16")
DENSE = ("output", "x", "weight", "bias")  # full tensors: each element is a short, well-conditioned computation
SUMS = ("mix_mean", "mix_var", "pos_weight")  # a few numbers, each a sum over B.T.C terms that cancel


@pytest.fixture(scope="module")
def interpreted():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    out = subprocess.run([sys.executable, str(SCRIPT)], env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", CASES)
def test_fused_kernels_in_float64_are_the_equations(interpreted, case):
    # the kernels' hand-derived backward (three kernels, LayerNorm's statistics, the mixing partial sums, dL/dP taken to
    # the Kronecker factors by autograd) against autograd through eq. 4-7 written plainly, both float64: every
    # derivative right, not only close
    errors = interpreted[case]["fused float64"]
    assert set(errors) == set(DENSE + SUMS)
    assert max(errors.values()) < 1e-11, errors


@pytest.mark.parametrize("case", CASES)
def test_fused_kernels_in_fp32_match_the_float64_equations(interpreted, case):
    # fp32, as a run outside autocast: the output and the dense gradients to 1e-6 relative; the mixing and position
    # logits' gradients are sums whose terms cancel, so fp32 rounding alone moves them further (the torch formulation's
    # own error on the same input is the yardstick): no worse than 4x it, or 1e-6
    fused, torch_path = interpreted[case]["fused fp32"], interpreted[case]["torch fp32"]
    for name in DENSE:
        assert fused[name] < 1e-6, (name, fused[name])
    for name in SUMS:
        assert fused[name] < max(1e-6, 4 * torch_path[name]), (name, fused[name], torch_path[name])


@pytest.mark.parametrize("case", CASES)
def test_compiler_keeps_the_fused_operators_whole(interpreted, case):
    # torch.compile (aot_eager: dynamo's tracing and the derived autograd graph, no codegen) calls the same operators:
    # the same numbers, bit for bit
    assert set(interpreted[case]["compiled vs eager float64"].values()) == {0.0}


def test_fused_operators_pass_torch_opcheck(interpreted):
    # schema, fake kernels (what torch.compile traces with) and autograd registration of dtn_fused and its backward
    assert interpreted["opcheck"] is True


def test_fused_kernels_refuse_cpu_tensors_outside_the_interpreter():
    # here Triton was imported without the interpreter: a CPU tensor is refused in one line that names the fix
    from transferbench.backbones import dtn_kernels

    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("this process runs Triton's interpreter")
    x = torch.randn(1, 4, 16)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        dtn_kernels.forward(
            x, torch.full((1, 4, 4), 0.25), torch.full((1, 2), 0.5), torch.ones(16), torch.zeros(16), 1e-5, True
        )


def test_the_cpu_never_takes_the_fused_path():
    # the CPU's records come from _DTN and dtn_plain whatever KERNELS says: fused_on is false for CPU tensors
    from transferbench.backbones import dtn

    assert dtn.KERNELS == "auto"
    assert not dtn.fused_on(torch.randn(2, 4, 8))


def test_cuda_without_triton_is_refused_in_one_line(monkeypatch):
    # never silently the slower path: a CUDA tensor with Triton missing names the two ways out
    from transferbench.backbones import dtn, dtn_kernels

    monkeypatch.setattr(dtn_kernels, "available", lambda: False)
    cuda_like = torch.empty(0, device="meta")
    monkeypatch.setattr(type(cuda_like), "device", property(lambda self: torch.device("cuda")), raising=True)
    with pytest.raises(RuntimeError, match="pip install triton.*KERNELS = 'off'"):
        dtn.fused_on(cuda_like)
