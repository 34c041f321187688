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
    assert choice.bf16 is torch.cuda.is_bf16_supported()
    assert choice.info["decided_by"] == "cuda bf16 support"


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


@cuda
@pytest.mark.parametrize("path", ["eager fp32", "eager bf16 autocast", "compiled"])
def test_dtn_on_cuda_matches_the_cpu_in_float64(path):
    # the GPU's kernels' gradients (Gram product: TF32 under autocast) and the compiled layer (inductor's fused
    # kernels around dtn_kron) against the CPU's hand-written layer in float64: fp32 to 1e-4 relative; under
    # autocast the statistics stay fp32 and only the kernels' gradient runs in TF32 (1e-2)
    m = _dtn()
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(4, 35, 96, generator=gen) * 2 + 0.5
    g = torch.randn(4, 35, 96, generator=gen)
    bf16 = path == "eager bf16 autocast"
    ref = _run(copy.deepcopy(m).double(), x.double(), g.double())
    gpu = copy.deepcopy(m).cuda()
    if path == "compiled":
        gpu = torch.compile(gpu, fullgraph=True)
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
        ours = _run(gpu, x.cuda(), g.cuda())
    names = ["output", "x"] + [n for n, _ in m.named_parameters()]
    for name, a, b in zip(names, ours, ref):
        tol = 1e-2 if bf16 and name == "pos_weight" else 1e-4
        err = (a - b).norm() / b.norm().clamp_min(1e-12)
        assert err < tol, (path, name, float(err))
