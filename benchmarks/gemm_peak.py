"""Achieved FLOP/s of ViT-B/32 inference against this machine's GEMM peak, measured in the same run.

    python -m benchmarks.gemm_peak [--batch 32] [--threads 2]

FLOPs of the model come from torch.utils.flop_counter (matmuls and attention; 2 per multiply-add); the
peak is the best of square matmuls of the same dtype (1024, 2048). Target: >= 50% of the peak, fp32 and bf16.
"""

from __future__ import annotations

import torch
from torch.utils.flop_counter import FlopCounterMode

from benchmarks import batch_script, median_seconds
from transferbench import create_backbone
from transferbench.engine.precision import cpu_bf16_units


def gemm_peak(dtype: torch.dtype, seconds: float) -> float:
    best = 0.0
    for n in (1024, 2048):
        a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
        t = median_seconds("a @ b", {"a": a, "b": b}, seconds)
        best = max(best, 2 * n**3 / t)
    return best


def run(batch: int = 32, seconds: float = 2.0) -> list[dict]:
    model = create_backbone("b32").eval()
    x = torch.randn(batch, 3, 224, 224)
    with torch.inference_mode(), FlopCounterMode(display=False) as fc:
        model(x)
    flops = fc.get_total_flops()
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        bf16 = dtype == torch.bfloat16
        if bf16 and not (cpu_bf16_units() or torch.cuda.is_available()):
            rows.append(
                {
                    "dtype": "bf16",
                    "model_gflops": float("nan"),
                    "peak_gflops": float("nan"),
                    "fraction": float("nan"),
                    "native_bf16": False,
                }
            )
            continue  # emulated bf16: minutes of timing for a number that says nothing

        def infer():
            with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                model(x)

        infer()
        t = median_seconds("f()", {"f": infer}, seconds)
        peak = gemm_peak(dtype, seconds)
        rows.append(
            {
                "dtype": "bf16" if bf16 else "fp32",
                "model_gflops": flops / t / 1e9,
                "peak_gflops": peak / 1e9,
                "fraction": flops / t / peak,
                "native_bf16": cpu_bf16_units(),
            }
        )
    return rows


def markdown(rows: list[dict]) -> str:
    out = [
        "| b32 inference, batch 32 | model GFLOP/s | GEMM peak GFLOP/s | fraction (target >= 50%) |",
        "|---|---|---|---|",
    ]
    for r in rows:
        if r["dtype"] == "bf16" and not r["native_bf16"]:  # torch's bare bf16 GEMM is a slow fallback here
            out.append(
                "| bf16 | - | - | not measured: this CPU has no bf16 units (no AVX512-BF16/AMX); "
                "emulated bf16 runs ~9x slower than fp32 |"
            )
            continue
        out.append(f"| {r['dtype']} | {r['model_gflops']:.0f} | {r['peak_gflops']:.0f} | {r['fraction']:.0%} |")
    return "\n".join(out)


def main() -> None:
    batch_script(__doc__, run, markdown, batch=32)


if __name__ == "__main__":
    main()
