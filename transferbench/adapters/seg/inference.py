"""Sliding-window inference as mmsegmentation's test pipeline: the resize, windows of `window` every `stride`
pixels, logits averaged where windows overlap, resized to the annotation's size; the window logits reach the
output through separable interpolation matrices, never upsampled one by one."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from ...arithmetic import output
from ...backbones.api import patch_grid
from ...data.pixels import DEFAULT_PIXELS
from ...data.segmentation import eval_image
from .metric import SegMetric


def window_starts(size: int, window: int, stride: int) -> list[int]:
    """mmseg's slide_inference grid along one axis: ceil((size - window) / stride) + 1 windows, the last
    one moved back to end at the border; one window at 0 when the image is not larger than it."""
    if size <= window:
        return [0]
    n = (size - window + stride - 1) // stride + 1
    return [min(i * stride, size - window) for i in range(n)]


def _cover(size: int, window: int, starts: list[int], device) -> torch.Tensor:
    """How many windows cover each position along one axis."""
    cover = torch.zeros(size, device=device)
    for st in starts:
        cover[st : st + window] += 1
    return cover


_WORKSPACE: dict = {}


def _workspace(numel: int, device) -> torch.Tensor:
    """A flat float buffer reused across images (one per device): a fresh 150 x 512 x 683 tensor costs
    more in page faults (~0.25 s on a CPU) than the stitching itself."""
    buf = _WORKSPACE.get(str(device))
    if buf is None or buf.numel() < numel:
        buf = _WORKSPACE[str(device)] = torch.empty(numel, device=device)
    return buf[:numel]


@torch.inference_mode()
def slide_logits(
    model, image: torch.Tensor, num_classes: int, *, window: int, stride: int, batch: int = 8, bf16: bool = False
) -> torch.Tensor:
    """Logits (K, H, W) of one image (3, H, W) — or (N, K, H, W) of N images of one size (N, 3, H, W) — from
    windows of `window` px every `stride` px, averaged where windows overlap. Windows (of all N images) go
    through the model `batch` at a time. Where an image is smaller than a window it is padded with 0 at
    the bottom / right and the padding's logits are dropped. The result is a channels-last view of a
    buffer that the next call reuses: use (or copy) it before calling again."""
    device = next(model.parameters()).device
    single = image.dim() == 3
    images = image[None] if single else image
    images = images.to(device)
    n, _, h, w = images.shape
    ph, pw = max(h, window), max(w, window)
    if (ph, pw) != (h, w):
        images = F.pad(images, (0, pw - w, 0, ph - h))
    ys, xs = window_starts(ph, window, stride), window_starts(pw, window, stride)
    boxes = [(i, y, x) for i in range(n) for y in ys for x in xs]
    out = _workspace(n * ph * pw * num_classes, device).view(n, ph, pw, num_classes).zero_()  # (N, H, W, K)
    for start in range(0, len(boxes), batch):
        part = boxes[start : start + batch]
        crops = torch.stack([images[i, :, y : y + window, x : x + window] for i, y, x in part])
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            logits = model(crops)
        for (i, y, x), lg in zip(part, logits):
            out[i, y : y + window, x : x + window] += lg.permute(1, 2, 0)  # a channels-last model output: no transpose
    # how many windows cover each pixel: the grid is separable, so an outer product of two 1-d counts
    cover = _cover(ph, window, ys, device)[:, None] * _cover(pw, window, xs, device)[None, :]
    out /= cover[..., None]
    out = out[:, :h, :w].permute(0, 3, 1, 2)
    return out[0] if single else out


def interp_matrix(n_in: int, n_out: int, device=None) -> torch.Tensor:
    """(n_out, n_in): the 1-d bilinear interpolation (align_corners=False) that F.interpolate applies along one
    axis, read off F.interpolate itself (bilinear resizing is separable, so two of these make it)."""
    eye = torch.eye(n_in, device=device)[None, :, :, None]  # channels = unit vectors, along H
    return F.interpolate(eye, size=(n_out, 1), mode="bilinear", align_corners=False)[0, :, :, 0].T


def _window_maps(size: int, padded: int, out: int, window: int, grid: int, starts: list[int], device) -> list:
    """Per window start along one axis: the (out, grid) matrix taking a window's patch-grid logits to the
    final map: upsample grid -> window, place at the start, divide by the windows covering each pixel,
    drop the padding beyond `size`, resize size -> out."""
    up = interp_matrix(grid, window, device)  # (window, grid)
    cover = _cover(padded, window, starts, device)
    down = interp_matrix(size, out, device) if size != out else torch.eye(size, device=device)  # (out, size)
    maps = []
    for st in starts:
        end = min(st + window, size)  # rows of this window inside the image (padding dropped)
        placed = up[: end - st] / cover[st:end, None]  # (end - st, grid)
        maps.append(down[:, st:end] @ placed)
    return maps


@torch.inference_mode()
def grid_window_logits(
    model,
    images: torch.Tensor,
    num_classes: int,
    *,
    window: int,
    stride: int,
    out_size,
    batch: int = 8,
    bf16: bool = False,
) -> torch.Tensor:
    """(N, H0, W0, K) final logits of N same-size images (N, 3, h, w) for a model with `grid_logits`, through
    the separable maps of `_window_maps`; a view of a buffer that the next call reuses. Each window adds
    one in-place matrix product into the buffer (laid out (N, W0, H0, K)): no full-size temporary."""
    device = next(model.parameters()).device
    n, _, h, w = images.shape
    ph, pw = max(h, window), max(w, window)
    if (ph, pw) != (h, w):
        images = F.pad(images, (0, pw - w, 0, ph - h))
    ys, xs = window_starts(ph, window, stride), window_starts(pw, window, stride)
    gh, gw = patch_grid(model.backbone)
    rows = _window_maps(h, ph, out_size[0], window, gh, ys, device)  # (H0, gh) per window row
    cols = _window_maps(w, pw, out_size[1], window, gw, xs, device)  # (W0, gw) per window column
    boxes = [(i, a, b) for i in range(n) for a in range(len(ys)) for b in range(len(xs))]
    h0, w0 = out_size
    out = _workspace(n * h0 * w0 * num_classes, device).view(n, w0, h0 * num_classes)
    for start in range(0, len(boxes), batch):
        part = boxes[start : start + batch]
        crops = torch.stack([images[i, :, ys[a] : ys[a] + window, xs[b] : xs[b] + window] for i, a, b in part])
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            grid = model.grid_logits(crops)
        grid = grid.float().permute(0, 2, 3, 1)  # (B, gh, gw, K)
        for (i, a, b), g in zip(part, grid):
            tall = torch.einsum("hy,yxk->xhk", rows[a], g).reshape(gw, h0 * num_classes)  # (gw, H0 K)
            if a == 0 and b == 0:  # an image's first window writes, the others add
                torch.mm(cols[b], tall, out=out[i])
            else:
                out[i].addmm_(cols[b], tall)  # (W0, gw) @ (gw, H0 K)
    return out.view(n, w0, h0, num_classes).transpose(1, 2)


@torch.inference_mode()
def predict(
    model,
    image,
    num_classes: int,
    *,
    short: int,
    window: int,
    stride: int,
    out_size=None,
    batch: int = 8,
    bf16: bool = False,
    pixels: str = DEFAULT_PIXELS,
) -> torch.Tensor:
    """The test pipeline on one image (PIL or uint8 (3, H, W)) or on N images of one size (uint8
    (N, 3, H, W)): resize (`data.segmentation.eval_image`, on the model's device), sliding windows whose
    logits are averaged where they overlap, bilinear resize to `out_size` (default: the images' own size),
    argmax -> (H, W) or (N, H, W) class indices on the model's device (uint8 for up to 255 classes).

    For a LinearSegmenter the windows' upsampled logits are never built: upsampling, placing, averaging,
    cropping and the final resize are all separable linear maps, so each window's patch-grid logits go to
    the final map through one (H0, h_grid) and one (W0, w_grid) matrix (`_window_maps`); the result equals
    `slide_logits` followed by F.interpolate up to float rounding (tested). Other models take that path."""
    device = next(model.parameters()).device
    x = eval_image(image, short, device, pixels)
    if out_size is None:
        out_size = (image.height, image.width) if hasattr(image, "height") else tuple(image.shape[-2:])
    single = x.dim() == 3
    if not hasattr(model, "grid_logits"):
        logits = slide_logits(model, x, num_classes, window=window, stride=stride, batch=batch, bf16=bf16)
        logits = logits[None] if single else logits
        if tuple(logits.shape[-2:]) != tuple(out_size):
            logits = F.interpolate(logits, size=tuple(out_size), mode="bilinear", align_corners=False)
        pred = logits.argmax(1)
    else:
        pred = grid_window_logits(
            model,
            x if not single else x[None],
            num_classes,
            window=window,
            stride=stride,
            out_size=out_size,
            batch=batch,
            bf16=bf16,
        ).argmax(-1)
    pred = pred.to(torch.uint8 if num_classes <= 255 else torch.int64)
    output("segmentation.prediction", pred)
    return pred[0] if single else pred


def evaluate(
    model,
    dataset,
    num_classes: int,
    *,
    short: int,
    window: int,
    stride: int,
    bf16: bool = False,
    group: int = 16,
    batch: int = 32,
    progress=None,
    desc: str = "evaluate",
    pixels: str = DEFAULT_PIXELS,
) -> SegMetric:
    """SegMetric over every (image, mask) of `dataset`, predictions at each annotation's own size.
    Consecutive images of one size (and annotation size) are evaluated together, up to `group` at a time,
    their windows `batch` per forward (ADE20K's images vary in size: one at a time)."""
    model.eval()
    device = next(model.parameters()).device
    metric = SegMetric(num_classes, device=device)
    bar = progress(total=len(dataset), desc=desc) if progress else None
    pending: list = []

    def flush():
        images = torch.stack(
            [torch.as_tensor(np.asarray(im)) if not hasattr(im, "height") else _pil_tensor(im) for im, _ in pending]
        )
        masks = torch.stack([torch.as_tensor(np.asarray(m)) for _, m in pending]).to(device)
        preds = predict(
            model,
            images,
            num_classes,
            short=short,
            window=window,
            stride=stride,
            out_size=tuple(masks.shape[-2:]),
            batch=batch,
            bf16=bf16,
            pixels=pixels,
        )
        for p, m in zip(preds, masks):
            metric.update(p, m)
        if bar is not None:
            bar.update(len(pending))
        pending.clear()

    for i in range(len(dataset)):
        image, mask = dataset[i]
        size = (_hw(image), np.shape(mask))
        if pending and (len(pending) == group or (_hw(pending[0][0]), np.shape(pending[0][1])) != size):
            flush()
        pending.append((image, mask))
    if pending:
        flush()
    if bar is not None:
        bar.close()
    return metric


def _hw(image) -> tuple:
    return (image.height, image.width) if hasattr(image, "height") else tuple(image.shape[-2:])


def _pil_tensor(image) -> torch.Tensor:
    from torchvision.transforms import v2

    return v2.functional.pil_to_tensor(image.convert("RGB"))
