"""The paths that exist only on a GPU: CUDA's out-of-memory retry, bf16 `auto` on CUDA, a worker slot's share of
GPU memory, and DTN's GPU kernels (the Gram product for the kernels' gradients, the compiled layer). Skipped
without CUDA; `python -m benchmarks.paper_step` runs them on a GPU host."""

import copy
import multiprocessing

import pytest
import torch

from transferbench.engine.train import fit

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


class _Greedy(torch.nn.Module):
    """w * x, but a batch larger than `fits` asks CUDA for twice the card's memory (a real out-of-memory error)."""

    def __init__(self, fits: int):
        super().__init__()
        self.w = torch.nn.Parameter(torch.tensor(0.5, device="cuda"))
        self.fits, self.sizes = fits, []

    def forward(self, x):
        self.sizes.append(len(x))
        if len(x) > self.fits:
            torch.empty(2 * torch.cuda.get_device_properties(0).total_memory, dtype=torch.uint8, device="cuda")
        return self.w * x


@cuda
def test_cuda_out_of_memory_halves_the_micro_batch_and_gives_the_whole_batch_step():
    x = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0], device="cuda")
    y = torch.tensor([1.0, 0.0, 2.0, 5.0, 3.0], device="cuda")
    weights, infos = [], []
    for fits in (5, 2):
        m = _Greedy(fits)
        opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
        kw = dict(base_lr=0.01, warmup=1, clip=None, device="cuda", bf16=False)
        infos.append(fit(m, iter([(x, y)] * 2), opt, steps=2, loss_fn=lambda p, t: ((p - t) ** 2).mean(), **kw))
        weights.append(m.w.item())
    assert infos[1]["micro_batch"] == 2  # 5 ran out of memory, 2 fits
    assert weights[1] == pytest.approx(weights[0], rel=1e-6)  # accumulated micro-batches: the whole batch's step


@cuda
def test_bf16_auto_on_cuda_follows_the_device_and_runs_no_probe():
    from transferbench.engine import precision

    def no_probe():
        raise AssertionError("CUDA needs no timing probe")

    choice = precision._resolve("auto", "cuda", {"mode": "train"}, no_probe, None)
    major, minor = torch.cuda.get_device_capability()
    assert choice.bf16 is ((major, minor) >= (8, 0))
    assert choice.info["decided_by"].endswith(f"cuda bf16 units (compute capability {major}.{minor})")


def _slot(fraction: float, results) -> None:
    from multiprocessing import Value

    from transferbench.engine.executors import _init_worker

    _init_worker(1, "0", Value("i", 0), fraction)
    total = torch.cuda.get_device_properties(0).total_memory
    out = {}
    for share in (0.5 * fraction, 1.5 * fraction):
        try:
            t = torch.empty(int(share * total), dtype=torch.uint8, device="cuda")
            del t
            torch.cuda.empty_cache()
            out[share / fraction] = "fits"
        except torch.cuda.OutOfMemoryError:
            out[share / fraction] = "out of memory"
    results.put(out)


@cuda
def test_a_worker_slot_keeps_to_its_share_of_the_gpu():
    # gpu_slots gives each of k slots on one GPU 1/k of its memory; the worker's initialiser enforces it
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    p = ctx.Process(target=_slot, args=(0.25, results))
    p.start()
    out = results.get(timeout=300)
    p.join()
    assert out == {0.5: "fits", 1.5: "out of memory"}


def _dtn(dim=96, heads=6, grid=(7, 5), seed=0):
    from transferbench.backbones.dtn import DynamicTokenNorm

    g = torch.Generator().manual_seed(seed)
    m = DynamicTokenNorm(dim, heads, grid)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g))
    return m


def _run(m, x, g):
    m.zero_grad()
    x = x.detach().requires_grad_()
    out = m(x)
    (out.float() * g).sum().backward()
    return [out.detach().double().cpu(), x.grad.double().cpu()] + [p.grad.double().cpu() for p in m.parameters()]


def _errors(m, x, g, path, kernels):
    """Relative errors of the CUDA layer (KERNELS = `kernels`) against the CPU's layer in float64, by output name."""
    from transferbench.backbones import dtn

    ref = _run(copy.deepcopy(m).double(), x.double(), g.double())
    gpu = copy.deepcopy(m).cuda()
    if path == "float64":
        gpu = gpu.double()
        x, g = x.double(), g.double()
    if path == "compiled":
        gpu = torch.compile(gpu, fullgraph=True)
    old, dtn.KERNELS = dtn.KERNELS, kernels
    try:
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=path == "eager bf16 autocast"):
            ours = _run(gpu, x.cuda(), g.cuda())
    finally:
        dtn.KERNELS = old
    names = ["output", "x"] + [n for n, _ in m.named_parameters()]
    return {n: float((a - b).norm() / b.norm().clamp_min(1e-12)) for n, a, b in zip(names, ours, ref)}


@cuda
@pytest.mark.parametrize("path", ["eager fp32", "eager bf16 autocast", "compiled", "float64"])
def test_dtn_on_cuda_matches_the_cpu_in_float64(path):
    # the default path on CUDA (the fused Triton kernels, eager and compiled) and the torch formulation (KERNELS "off":
    # Gram product, TF32 under autocast; compiled, inductor's kernels around dtn_kron) against the CPU's hand-written
    # layer in float64. The fused kernels in fp32: the output and dense gradients to 1e-6 relative, the mixing and
    # position logits' gradients (sums whose terms cancel) no worse than 4x the torch formulation's own error or 1e-6;
    # in float64 to 1e-10. Under autocast the statistics stay fp32-accurate (three-pass TF32) and dL/dP runs in TF32.
    m = _dtn()
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(4, 35, 96, generator=gen) * 2 + 0.5
    g = torch.randn(4, 35, 96, generator=gen)
    fused, plain = _errors(m, x, g, path, "auto"), _errors(m, x, g, path, "off")
    for name, err in fused.items():
        if path == "float64":
            tol = 1e-10
        elif path == "eager bf16 autocast":
            tol = 1e-2 if name == "pos_weight" else 1e-4
        elif name in ("mix_mean", "mix_var", "pos_weight"):
            tol = max(1e-6, 4 * plain[name])
        else:
            tol = 1e-6
        assert err < tol, (path, name, err)
    for name, err in plain.items():  # the torch formulation keeps its own promise too
        tol = 1e-2 if path == "eager bf16 autocast" and name == "pos_weight" else 1e-4
        assert err < tol, (path, "torch formulation", name, err)
