"""The shared training loop: schedule and SGD momentum by hand, gradient accumulation and the
out-of-memory retry against the whole-batch step, and seeded batch streams that do not depend on the
number of workers."""

import numpy as np
import pytest
import torch

from transferbench.data.transforms import train_transform
from transferbench.engine.batches import _EpochSampler, train_batches
from transferbench.engine.train import fit


class Scalar(torch.nn.Module):
    """logits = w * x (one weight), so every update can be followed by hand."""

    def __init__(self, w=0.0, fail_above=None):
        super().__init__()
        self.w = torch.nn.Parameter(torch.tensor(float(w)))
        self.fail_above, self.sizes = fail_above, []

    def forward(self, x):
        self.sizes.append(len(x))
        if self.fail_above and len(x) > self.fail_above:
            raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1 GB")
        return self.w * x


def mse(pred, y):
    return ((pred - y) ** 2).mean()


def batches(xs, ys):
    return iter([(torch.tensor(x, dtype=torch.float32), torch.tensor(y, dtype=torch.float32)) for x, y in zip(xs, ys)])


def test_sgd_momentum_warmup_cosine_and_clip_by_hand():
    # 3 steps, warm-up 2, base lr 0.1: lrs 0.05, 0.1, then cosine at (2-2)/(3-2)=0 -> 0.1
    m = Scalar(0.0)
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    xs, ys = [[1.0, 3.0]] * 3, [[2.0, 6.0]] * 3  # the best w is 2
    fit(m, batches(xs, ys), opt, steps=3, base_lr=0.1, warmup=2, clip=None, loss_fn=mse, device="cpu", bf16=False)
    w, buf = 0.0, 0.0
    for lr in (0.05, 0.1, 0.1):
        grad = np.mean([2 * (w * x - y) * x for x, y in zip([1.0, 3.0], [2.0, 6.0])])  # d/dw mean (wx - y)^2
        buf = 0.9 * buf + grad
        w -= lr * buf
    assert m.w.item() == pytest.approx(w, rel=1e-6)

    m = Scalar(0.0)  # clip 1.0: the first gradient (-20) is scaled to norm 1
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    fit(
        m, batches(xs[:1], ys[:1]), opt, steps=1, base_lr=0.1, warmup=1, clip=1.0, loss_fn=mse, device="cpu", bf16=False
    )
    assert m.w.item() == pytest.approx(0.1 * 1.0)


def test_micro_batches_and_oom_retry_give_the_whole_batch_step():
    xs, ys = [[1.0, 2.0, 3.0, 4.0, 5.0]] * 2, [[1.0, 0.0, 2.0, 5.0, 3.0]] * 2
    results = {}
    for label, micro, fail in (("whole", None, None), ("micro2", 2, None), ("oom", None, 2)):
        m = Scalar(0.5, fail_above=fail)
        opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
        out = fit(
            m,
            batches(xs, ys),
            opt,
            steps=2,
            base_lr=0.01,
            warmup=1,
            clip=None,
            loss_fn=mse,
            device="cpu",
            bf16=False,
            micro_batch=micro,
        )
        results[label] = (m.w.item(), out, m.sizes)
    assert results["micro2"][0] == pytest.approx(results["whole"][0], rel=1e-6)
    assert results["oom"][0] == pytest.approx(results["whole"][0], rel=1e-6)
    assert results["micro2"][2] == [2, 2, 1, 2, 2, 1]  # 5 examples as 2 + 2 + 1
    assert results["oom"][1]["micro_batch"] == 2  # 5 failed, 2 fits; the second step starts at 2
    assert results["oom"][2] == [5, 2, 2, 1, 2, 2, 1]
    assert results["whole"][1]["final_loss"] == pytest.approx(results["micro2"][1]["final_loss"], rel=1e-6)

    other = Scalar(0.5, fail_above=None)
    opt = torch.optim.SGD(other.parameters(), lr=0.01)

    def broken(pred, y):
        raise RuntimeError("a bug, not memory")

    with pytest.raises(RuntimeError, match="a bug"):  # only out-of-memory errors are retried
        fit(
            other,
            batches(xs, ys),
            opt,
            steps=1,
            base_lr=0.01,
            warmup=1,
            clip=None,
            loss_fn=broken,
            device="cpu",
            bf16=False,
        )


def test_epoch_sampler_shuffles_without_repeats_then_repeats():
    items = list(_EpochSampler(5, seed=3, total=12))
    idx = [i for i, _ in items]
    assert sorted(idx[:5]) == sorted(idx[5:10]) == [0, 1, 2, 3, 4]  # each epoch a permutation
    assert idx[:5] != idx[5:10]  # a new order each epoch
    assert len(items) == 12 and len({s for _, s in items}) == 12  # every example draw has its own seed
    assert items == list(_EpochSampler(5, seed=3, total=12)) and items != list(_EpochSampler(5, seed=4, total=12))


class Images(torch.utils.data.Dataset):
    def __init__(self, n=10):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randint(0, 256, (n, 3, 12, 12), generator=g, dtype=torch.uint8)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], i


def test_batches_do_not_depend_on_workers_or_global_seed():
    tf = train_transform(8, "crop_flip")  # random crops and flips: seeded per example
    torch.manual_seed(123)
    a = list(train_batches(Images(), tf, batch=4, steps=5, seed=7, workers=0))
    torch.manual_seed(999)
    b = list(train_batches(Images(), tf, batch=4, steps=5, seed=7, workers=2))
    c = list(train_batches(Images(), tf, batch=4, steps=5, seed=8, workers=0))
    assert all(torch.equal(x1, x2) and torch.equal(y1, y2) for (x1, y1), (x2, y2) in zip(a, b))
    assert not all(torch.equal(x1, x2) for (x1, _), (x2, _) in zip(a, c))
    assert a[0][0].shape == (4, 3, 8, 8) and float(a[0][0].min()) >= -1 and float(a[0][0].max()) <= 1


class InMemory(torch.utils.data.Dataset):
    """An in-memory set as the folder reader offers it: `array()` of equal-size uint8 images and labels."""

    def __init__(self, n=24, h=11, w=9, seed=0):
        rng = np.random.default_rng(seed)
        self._array = rng.integers(0, 256, (n, h, w, 3), dtype=np.uint8)  # random pixels: a wrong crop shows
        self.labels = rng.integers(0, 5, n)

    def __len__(self):
        return len(self.labels)

    def array(self):
        return self._array

    def __getitem__(self, i):
        return torch.from_numpy(self._array[i]).permute(2, 0, 1), int(self.labels[i])


# the CUDA variants are collected everywhere and skipped with a reason where there is no GPU, so that `pytest -ra`
# says what went unchecked
NO_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
DEVICES = ["cpu", pytest.param("cuda", marks=NO_CUDA)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("augment", ["none", "crop", "flip", "crop_flip"])
def test_resident_augmentation_equals_the_per_example_pipeline(augment, device):
    """Small sets are held on the device and augmented a batch at a time from the same per-example draws: the
    random crop is a gather and the flip a select, so the tensors are the per-example v2 pipeline's (the resize
    runs once per set, on the CPU as per example)."""
    data = InMemory()
    tf = train_transform(8, augment)
    fast = train_batches(data, tf, batch=5, steps=7, seed=3, device=device)
    slow = train_batches(data, tf, batch=5, steps=7, seed=3, per_example=True)
    assert fast.info() == {"data_path": "resident", "data_bytes": 24 * 3 * (9 * 9 if "crop" in augment else 8 * 8)}
    assert slow.info()["data_path"] == "workers"
    fast, slow = list(fast), list(slow)
    assert len(fast) == len(slow) == 7
    for (xf, yf), (xs, ys) in zip(fast, slow):
        assert xf.device.type == yf.device.type == device
        assert xf.shape == xs.shape == (5, 3, 8, 8) and xf.dtype == xs.dtype == torch.float32
        assert torch.equal(yf.cpu(), ys)
        torch.testing.assert_close(xf.cpu(), xs, atol=1e-6, rtol=0)
    if augment != "none":  # the draws differ between examples: some crops or flips differ from the first's
        assert not all(torch.equal(fast[0][0][0], x) for x in fast[0][0][1:])


def smooth_images(n=24, h=40, w=36, seed=0) -> np.ndarray:
    """uint8 (n, h, w, 3) images of low-frequency patterns (interpolation differences stay small on them)."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w]
    out = []
    for a, b, c in rng.uniform(0, 6, (n, 3)):
        v = 127.5 + 100 * np.sin(xx / 5 + a) * np.cos(yy / 7 - b) + 20 * np.sin((xx + yy) / 4 + c)
        out.append(np.stack([v, v[::-1], v[:, ::-1]], -1))
    return np.clip(np.round(out), 0, 255).astype(np.uint8)


@pytest.mark.parametrize("device", DEVICES)
def test_resident_inception_crop_differs_from_the_per_example_one_by_interpolation_only(device):
    """The inception crop's boxes are the per-example draws; roi_align resizes them all at once where the per-example
    path runs an antialiased resize per image: on smooth images the two agree to within one uint8 level on average,
    while the same crops one pixel off, or unflipped, are several levels away."""
    data = InMemory()
    data._array = smooth_images()
    tf = train_transform(16, "inception_flip")
    fast = list(train_batches(data, tf, batch=8, steps=3, seed=5, device=device))
    slow = list(train_batches(data, tf, batch=8, steps=3, seed=5, per_example=True))
    level = 2 / 255  # one uint8 level in the [-1, 1] range
    for (xf, _), (xs, _) in zip(fast, slow):
        assert float((xf.cpu() - xs).abs().mean()) < level
    x = torch.from_numpy(data._array[:8]).permute(0, 3, 1, 2).to(device)
    boxes, flips = tf.draw_batch(list(range(8)), 40, 36)
    step = torch.where(boxes[:, :2] > 0, -1, 1)  # one pixel up and left, or down and right at the border
    shifted = torch.cat([boxes[:, :2] + step, boxes[:, 2:]], 1)
    reference = tf.apply(x, boxes, flips).cpu()
    assert float((reference - tf.apply(x, shifted, flips).cpu()).abs().mean()) > 2 * level
    assert float((reference - tf.apply(x, boxes, ~flips).cpu()).abs().mean()) > 2 * level


class Decoded(torch.utils.data.Dataset):
    """A source decoded per example, as tfds is: PIL images of several sizes, and an identity for the cache."""

    def __init__(self, n=20, seed=0):
        from PIL import Image

        rng = np.random.default_rng(seed)
        self.seed, self.labels = seed, rng.integers(0, 4, n)
        self.images = [
            Image.fromarray(rng.integers(0, 256, (int(h), int(w), 3), dtype=np.uint8))
            for h, w in rng.integers(10, 20, (n, 2))
        ]

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        return self.images[i], int(self.labels[i])

    def identity(self):
        return {"source": "test", "n": len(self), "seed": self.seed}


def test_a_decoded_source_is_resized_once_cached_and_trained_from_memory(tmp_path, monkeypatch, caplog):
    """A source with images of several sizes (tfds) is decoded once through the transform's resize, cached by its
    identity, and gives the per-example pipeline's batches; a damaged cache entry is set aside and decoded again."""
    import logging

    from transferbench.engine import resident

    monkeypatch.setenv("TRANSFERBENCH_HOME", str(tmp_path))
    data, tf = Decoded(), train_transform(8, "crop_flip")
    slow = list(train_batches(data, tf, batch=6, steps=5, seed=1, per_example=True))
    fast = train_batches(data, tf, batch=6, steps=5, seed=1, workers=2)
    assert fast.info() == {"data_path": "resident", "data_bytes": 20 * 3 * 9 * 9}  # resized to 8 * 8 // 7 = 9
    for (xf, yf), (xs, ys) in zip(list(fast), slow, strict=True):
        torch.testing.assert_close(xf, xs, atol=1e-6, rtol=0)  # the same pixels, scaled in place
        assert torch.equal(yf, ys)
    (entry,) = (tmp_path / "decoded").glob("*.npz")
    monkeypatch.setattr(resident, "_decode", lambda *a: pytest.fail("decoded again although cached"))
    again = list(train_batches(data, tf, batch=6, steps=5, seed=1))
    assert all(torch.allclose(a[0], b[0], atol=1e-6, rtol=0) for a, b in zip(again, slow))
    monkeypatch.undo()
    monkeypatch.setenv("TRANSFERBENCH_HOME", str(tmp_path))
    entry.write_bytes(entry.read_bytes()[:-100])
    with caplog.at_level(logging.WARNING, logger="transferbench"):
        healed = list(train_batches(data, tf, batch=6, steps=5, seed=1))
    assert "damaged decoded training set" in caplog.text
    assert all(torch.allclose(a[0], b[0], atol=1e-6, rtol=0) for a, b in zip(healed, slow))


def test_where_the_resident_path_stops(monkeypatch):
    """Over RESIDENT_BYTES of resized pixels, inception crops of images of their own sizes, and per-example ops
    (RandAugment) keep the worker pipeline, and say so."""
    from torchvision.transforms import v2

    from transferbench.engine import resident

    data, tf = InMemory(n=10), train_transform(8, "crop")
    assert resident.plan(data, tf).info() == {"data_path": "resident", "data_bytes": 10 * 3 * 81}
    assert resident.plan(InMemory(), train_transform(8, "inception_flip")).path == "resident"  # one size: it fits
    monkeypatch.setattr(resident, "RESIDENT_BYTES", 10 * 3 * 81 - 1)
    over = train_batches(data, tf, batch=2, steps=1, seed=0)
    assert over.info()["data_path"] == "workers" and "over the" in over.plan.why
    assert resident.plan(Decoded(), train_transform(8, "inception_flip")).path == "workers"
    randaug = train_transform(8, "flip", randaug=v2.RandAugment(2, 5))
    assert resident.plan(data, randaug).path == "workers"


def test_a_tfds_split_has_an_identity_only_with_a_named_label_rule():
    tfds = pytest.importorskip("tensorflow_datasets")
    from transferbench.data.tfds_source import TfdsDataset

    with tfds.testing.mock_data(num_examples=30):
        plain = TfdsDataset("cifar10", "train[:10]")
        ruled = TfdsDataset("cifar10", "train[:10]", label_fn=lambda ex: 0, label_rule="zero")
        unnamed = TfdsDataset("cifar10", "train[:10]", label_fn=lambda ex: 0)
        other = TfdsDataset("cifar10", "train[:12]")
    assert plain.identity()["label"] == "label" and ruled.identity()["label"] == "zero"
    assert unnamed.identity() is None
    assert plain.identity()["version"] == str(plain.sources["train"].dataset_info.version)
    assert other.identity() != plain.identity()


@pytest.mark.parametrize("kwargs", [{}, {"resize_small": 10}, {"resize_square": 12}])
def test_batched_evaluation_equals_the_per_example_pipeline(kwargs):
    from transferbench.data.transforms import eval_transform
    from transferbench.engine.batches import eval_batches

    data, tf = InMemory(n=13), eval_transform(8, **kwargs)
    fast = list(eval_batches(data, tf, batch=4))
    slow = list(eval_batches(data, tf, batch=4, per_example=True))
    assert [len(y) for _, y in fast] == [4, 4, 4, 1]
    for (xf, yf), (xs, ys) in zip(fast, slow):
        assert torch.equal(torch.as_tensor(yf), torch.as_tensor(ys))
        torch.testing.assert_close(xf, xs, atol=2 / 255 + 1e-6, rtol=0)


def _stream(n_steps, bad_at=None):
    for step in range(n_steps):
        y = torch.full((4,), float("inf") if step == bad_at else 1.0)
        yield torch.ones(4), y


def _plain_fit(model, steps, bad_at=None):
    """SGD on the one-weight model over `_stream`, fp32 on the CPU."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    kw = dict(base_lr=0.01, warmup=1, clip=None, loss_fn=mse, device="cpu", bf16=False)
    return fit(model, _stream(steps, bad_at), opt, steps=steps, **kw)


def test_the_loop_reads_the_loss_only_every_loss_every_steps(monkeypatch):
    """No host synchronisation inside the step loop: the loss is read at steps 50, 100 and the last one, and once
    more for the result, not twice a step as when every step checked it."""
    from transferbench.engine import train

    reads = []
    for name in ("__float__", "__int__", "__bool__", "item"):
        real = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name, lambda t, *a, _real=real, _n=name: reads.append(_n) or _real(t, *a))
    model = Scalar(0.5)
    out = _plain_fit(model, 120)
    assert train.LOSS_EVERY == 50 and sorted(reads) == ["__float__", "__int__", "__int__", "__int__"]
    assert out["final_loss"] == pytest.approx(float(mse(model.w.detach() * torch.ones(4), torch.ones(4))), rel=0.05)


def test_divergence_names_the_first_bad_step_though_the_loop_went_on():
    from transferbench.engine.compute import Diverged

    with pytest.raises(Diverged, match=r"^non-finite loss inf at step 3$"):
        _plain_fit(Scalar(0.5), 10, bad_at=3)


def test_a_compiled_cell_gives_the_eager_records(suite_home, tmp_path):
    """--compile: the same VTAB cell through torch.compile (inductor's CPU kernels here) gives the eager record up
    to floating-point summation order."""
    from transferbench.adapters import prepare_task, resolve_backbone
    from transferbench.engine.runner import RunOptions, run_task
    from transferbench.records.store import load_records

    # fp32 on both sides: `bf16: auto` times a probe per input shape and dtype, which under load may choose bf16
    # for one side and fp32 for the other
    task = prepare_task("vtab", suite="embedded", datasets=["mini_digits"], seeds=[0], sets=["lr=0.01", "bf16=off"])
    backbone = [resolve_backbone("mu4_dpn@embedded")]
    records = {}
    for compiled in (False, True):
        out = tmp_path / str(compiled)
        assert run_task(task, backbone, out, RunOptions(show_progress=False, compile=compiled)).failed == 0
        (records[compiled],) = load_records([out])
    eager, compiled = records[False], records[True]
    assert compiled["key"] == eager["key"] and compiled["info"]["compiled"] is True and "compiled" not in eager["info"]
    for split in ("val", "test"):  # accuracy over 200 and 797 images: one image is 0.5 and 0.13 points
        assert compiled["metrics"][split]["accuracy"] == pytest.approx(eager["metrics"][split]["accuracy"], abs=0.6)
    assert compiled["info"]["final_loss"] == pytest.approx(eager["info"]["final_loss"], rel=1e-4)


def test_a_cell_gives_the_same_records_on_either_data_path(suite_home, tmp_path, monkeypatch):
    """One VTAB cell (random crops) trained from the resident set and through the per-example workers: the same
    batches, so the same accuracies and final loss up to floating-point summation order; the record says which
    path ran."""
    from transferbench.adapters import prepare_task, resolve_backbone
    from transferbench.engine import resident
    from transferbench.engine.runner import RunOptions, run_task
    from transferbench.records.store import load_records

    # fp32 on both sides: `bf16: auto` times a probe per input shape and dtype, which under load may choose bf16
    # for one side and fp32 for the other
    task = prepare_task("vtab", suite="embedded", datasets=["mini_digits"], seeds=[0], sets=["lr=0.01", "bf16=off"])
    backbone = [resolve_backbone("mu4_dpn@embedded")]
    records, default = {}, resident.RESIDENT_BYTES
    for limit in (default, 0):
        monkeypatch.setattr(resident, "RESIDENT_BYTES", limit)
        out = tmp_path / str(limit)
        assert run_task(task, backbone, out, RunOptions(show_progress=False)).failed == 0
        (records[limit],) = load_records([out])
    memory, workers = records[default], records[0]
    assert memory["info"]["data_path"] == "resident" and workers["info"]["data_path"] == "workers"
    crop_source = memory["hparams"]["resolution"] * 8 // 7  # random crops from the set resized to 8/7
    nbytes = memory["info"]["train_examples"] * 3 * crop_source**2
    assert memory["info"]["data_bytes"] == workers["info"]["data_bytes"] == nbytes
    for split in ("val", "test"):
        assert memory["metrics"][split]["accuracy"] == pytest.approx(workers["metrics"][split]["accuracy"], abs=0.6)
    assert memory["info"]["final_loss"] == pytest.approx(workers["info"]["final_loss"], rel=1e-4)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["SGD", "AdamW"])
def test_the_fused_update_used_on_cuda_is_the_default_update(name, device):
    """optimizer_options turns on the fused kernel for CUDA devices only; five steps of it (on the CPU, and on the
    GPU where there is one) end where torch's default per-tensor update ends."""
    from transferbench.engine.train import optimizer_options

    assert optimizer_options("cuda:1") == {"fused": True} and optimizer_options("cpu") == {}
    kw = {"lr": 0.1, "momentum": 0.9, "weight_decay": 1e-4} if name == "SGD" else {"lr": 0.01, "weight_decay": 0.1}
    ends = []
    for options in ({}, {"fused": True}):
        torch.manual_seed(0)
        model = torch.nn.Linear(7, 3).to(device)
        start = model.weight.detach().cpu().clone()
        opt = getattr(torch.optim, name)(model.parameters(), **kw, **options)
        assert opt.defaults.get("fused") is options.get("fused", opt.defaults.get("fused"))
        for _ in range(5):
            opt.zero_grad()
            model(torch.randn(4, 7, device=device)).square().sum().backward()
            opt.step()
        ends.append(model.weight.detach().cpu())
    assert float((ends[0] - start).abs().max()) > 1e-3  # the steps moved it
    torch.testing.assert_close(ends[1], ends[0], rtol=1e-5, atol=1e-6)


def test_one_compilation_serves_every_cell_remainder_and_halved_micro_batch(monkeypatch):
    """Compiled training steps compile once per model shape: a second cell's model of the same shape, the remainder
    micro-batch and a micro-batch halved after running out of memory reuse it or run eagerly, never recompile. The
    backend here counts forward graphs handed to it (AOT autograd, no code generation)."""
    import torch._dynamo
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    import transferbench.engine.train as train
    from transferbench import create_backbone

    compiled = []

    def forward_graph(gm, example_inputs):
        compiled.append([tuple(t.shape) for t in example_inputs if isinstance(t, torch.Tensor)][-1])
        return make_boxed_func(gm.forward)

    torch._dynamo.reset()
    monkeypatch.setattr(
        train,
        "COMPILE_BACKEND",
        aot_autograd(fw_compiler=forward_graph, bw_compiler=lambda gm, _: make_boxed_func(gm.forward)),
    )
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(10, 3, 16, 16, generator=gen), torch.randint(0, 5, (10,), generator=gen)
    failed = []

    def loss(logits, target):  # the first 4-example micro-batch of the second cell "runs out of memory"
        if len(compiled) and len(target) == 4 and not failed and cells == 2:
            failed.append(len(target))
            raise RuntimeError("CUDA out of memory: can't allocate memory")
        return torch.nn.functional.cross_entropy(logits, target)

    outs = []
    for cells in (1, 2):
        torch.manual_seed(cells)
        model = create_backbone("mu4", img_size=16, num_classes=5)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        kw = dict(base_lr=0.01, warmup=1, clip=1.0, loss_fn=loss, device="cpu", bf16=False)
        outs.append(fit(model, iter([(x, y)] * 2), opt, steps=2, micro_batch=4, compile="on", **kw))
        model.eval()(x[:3])  # evaluation: the eager model
    assert failed == [4]  # the halving really happened (micro-batch 4 -> 2 in the second cell)
    assert outs[0]["micro_batch"] == 4 and outs[1]["micro_batch"] == 2
    assert outs[0]["compiled"] is True and outs[0]["compile_s"] > 0
    assert len(compiled) == 1, compiled  # batches of 4 + 4 + 2 and 2 + 2 ..., two models: one graph
