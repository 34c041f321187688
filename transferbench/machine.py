"""The machine a number is computed on, as the arithmetic digest records it (transferbench.arithmetic): ATen's CPU
capability, the CPU's vendor, family, model and kernel-selecting ISA flags, the threads, every BLAS/OpenMP pool, a
digest of torch's build, the environment variables that steer kernels, the library versions, torch's determinism
and matmul-precision flags and, on CUDA, the device, driver, cuDNN and TF32 flags (`machine()`, once per process)."""

from __future__ import annotations

import hashlib
import os
import platform
from functools import lru_cache
from pathlib import Path

from .hashing import digest

# the environment variables that steer which kernels run and how they reduce (a name ending in _NUM_THREADS too)
KERNEL_VARIABLES = (
    "ATEN_CPU_CAPABILITY",
    "MKL_CBWR",
    "MKL_ENABLE_INSTRUCTIONS",
    "MKL_DYNAMIC",
    "ONEDNN_MAX_CPU_ISA",
    "DNNL_MAX_CPU_ISA",
    "ONEDNN_DEFAULT_FPMATH_MODE",
    "OPENBLAS_CORETYPE",
    "OPENBLAS_L2_SIZE",
    "OPENBLAS_VERBOSE",
    "KMP_AFFINITY",
    "GOMP_CPU_AFFINITY",
    "CUBLAS_WORKSPACE_CONFIG",
    "NVIDIA_TF32_OVERRIDE",
    "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE",
    "CUDA_VISIBLE_DEVICES",
)
# the CPU flags that decide which vector kernels ATen, oneDNN and the BLAS pick (x86 and Arm)
ISA_FLAGS = (
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx_vnni",
    "avx512f",
    "avx512cd",
    "avx512bw",
    "avx512dq",
    "avx512vl",
    "avx512ifma",
    "avx512vbmi",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
    "asimd",
    "asimdhp",
    "sve",
    "sve2",
    "bf16",
    "i8mm",
)


# --- the machine --------------------------------------------------------------------------------------------------


@lru_cache(maxsize=1)
def _cpuinfo() -> dict:
    """vendor, family, model, model name and the kernel-selecting flags of the first processor in /proc/cpuinfo."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {"vendor": platform.machine(), "flags": []}
    first = text.split("\n\n")[0]
    fields = {}
    for line in first.splitlines():
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    flags = set((fields.get("flags") or fields.get("Features") or "").split())
    return {
        "vendor": fields.get("vendor_id") or fields.get("CPU implementer"),
        "family": fields.get("cpu family") or fields.get("CPU architecture"),
        "model": fields.get("model") or fields.get("CPU part"),
        "model_name": fields.get("model name") or fields.get("Hardware"),
        "flags": sorted(flags & set(ISA_FLAGS)),
    }


@lru_cache(maxsize=1)
def _torch_config() -> str:
    import torch

    return hashlib.sha256(torch.__config__.show().encode()).hexdigest()[:16]


def _pools() -> dict:
    """The BLAS and OpenMP pools of numpy, scipy and torch, as threadpoolctl sees them, without their file paths,
    each kind once. The three are loaded first, so that the list does not depend on what a cell happened to import
    before."""
    import numpy  # noqa: F401 - each loads its own BLAS or OpenMP runtime
    import scipy.linalg  # noqa: F401
    import torch  # noqa: F401
    from threadpoolctl import threadpool_info

    pools = {}
    for p in threadpool_info():
        # OpenMP's thread count is torch's intra-op threads (held apart) as seen from whichever thread asks: it is
        # not kept, so that it cannot tell two runs of one cell apart
        keep = ("internal_api", "threading_layer", "architecture") + (
            ("num_threads",) if p.get("user_api") == "blas" else ()
        )
        pools[f"{p.get('user_api')}:{p.get('prefix')}:{p.get('version')}"] = {
            k: p.get(k) for k in keep if p.get(k) is not None
        }
    return dict(sorted(pools.items()))


def _variables() -> dict:
    names = set(KERNEL_VARIABLES) | {k for k in os.environ if k.endswith("_NUM_THREADS")}
    return {k: os.environ[k] for k in sorted(names) if k in os.environ}


def _cuda() -> dict | None:
    import torch

    if not torch.cuda.is_available():
        return None
    driver = None
    try:
        import ctypes

        version = ctypes.c_int()
        ctypes.CDLL("libcuda.so.1").cuDriverGetVersion(ctypes.byref(version))
        driver = version.value
    except OSError:
        pass
    return {
        "device": torch.cuda.get_device_name(0),
        "capability": list(torch.cuda.get_device_capability(0)),
        "runtime": torch.version.cuda,
        "driver": driver,
        "cudnn": torch.backends.cudnn.version(),
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
        "tf32_cudnn": torch.backends.cudnn.allow_tf32,
        "cudnn_deterministic": torch.backends.cudnn.deterministic,
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
    }


def _libraries() -> dict:
    from .fingerprint import CORE, CORRUPT, DATA, TEXT, library_versions

    return dict(library_versions(tuple(sorted(set(CORE + DATA + TEXT + CORRUPT)))))


def machine() -> dict:
    """This process's arithmetic as a dict with its `digest` (module docstring). Threads and flags are read at
    each call (a worker sets its threads after start); the rest once per process."""
    import torch

    parts = {
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu": _cpuinfo(),
        "threads": {"intra_op": torch.get_num_threads(), "inter_op": torch.get_num_interop_threads()},
        "pools": _pools(),
        "torch_config": _torch_config(),
        "variables": _variables(),
        "libraries": _libraries(),
        "flags": {
            "deterministic": torch.are_deterministic_algorithms_enabled(),
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
            "mkldnn": torch.backends.mkldnn.enabled,  # oneDNN's kernels (convolutions, bf16 matmuls) on or off
        },
        "cuda": _cuda(),
    }
    return {"digest": digest(parts, 16), **parts}


def machine_digest() -> str:
    return machine()["digest"]


def only_libraries(m: dict, libraries) -> dict:
    """A machine (`machine()`) with the versions of `libraries` alone (and Python's), its digest made again."""
    keep = set(libraries) | {"python"}
    parts = {k: v for k, v in m.items() if k != "digest"}
    parts["libraries"] = {k: v for k, v in (m.get("libraries") or {}).items() if k in keep}
    return {"digest": digest(parts, 16), **parts}
