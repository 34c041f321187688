"""The paper-scale step benchmark's report (benchmarks.paper_step): its figures as the markdown that
benchmarks/RESULTS.md holds, with each target met or missed."""

from __future__ import annotations

STUDY_CELLS = 19 * 3 * 3  # VTAB-1k: 19 tasks x 3 learning rates x 3 seeds, each 2,500 steps of 512


NO_GPU = "no GPU"


def _ms(v) -> str:
    return "-" if v is None else f"{1e3 * v:.1f}"


def _failed(row: str, value: dict) -> str | None:
    """A row's one line where it failed or was skipped, else None."""
    if "error" in value:
        return f"{row} failed: {value['error']}"
    if "skipped" in value:
        return f"{row} skipped: {value['skipped']}"
    return None


def _rows(label: str, rows: list, row) -> list[str]:
    """A table's lines: `row(t)` for each row, or its one line where it failed or was skipped."""
    return [f"| {why} |" if (why := _failed(label, t)) else row(t) for t in rows]


def _mfu(r: dict):
    pk = r.get("peak")
    return lambda s, k: f"{100 * s['flops'] / s[k] / pk[0]:.0f}%" if pk and s.get(k) else "-"


def markdown(r: dict) -> str:
    v = r.get("versions", {})
    lines = [
        f"Device: {r['device']}" + (" (--small: toy shapes, the figures mean nothing)" if r["small"] else ""),
        "Versions: " + ", ".join(f"{k} {val}" for k, val in v.items()),
    ]
    if "used_s" in r:
        lines.append(f"All rows: {r['used_s']:.0f} s of a {r['budget_s']:.0f} s budget.")
    lines += _dtn_lines(r.get("dtn", []))
    lines += _step_lines(r)
    lines += _data_lines(r["data"])
    if "cell" not in r:
        lines += [
            "",
            f"Paper-scale VTAB-1k cell and DTN block overhead in bf16: {NO_GPU} (on a machine with one: "
            "`python -m benchmarks.paper_step`, under 8 minutes on one H200).",
        ]
        return "\n".join(lines)
    lines += _cell_lines(r["cell"])
    lines += _embedded_lines(r.get("embedded"))
    lines += _lever_lines(r)
    return "\n".join(lines)


def _step_lines(r: dict) -> list[str]:
    mfu, pk = _mfu(r), r.get("peak")
    lines = [
        "",
        "| model | batch | ours eager ms | ours compiled ms (default) | eager, cuDNN SDPA ms | timm eager ms | "
        "compiled vs timm | MFU eager / compiled (b16 >= 40%, b32 >= 35%) |",
        "|---|---|---|---|---|---|---|---|",
    ]

    def row(s: dict) -> str:
        best = s.get("compiled") or s["ours"]
        return (
            f"| {s['size']} | {s['batch']} | {_ms(s['ours'])} | {_ms(s.get('compiled'))} | {_ms(s.get('cudnn'))} | "
            f"{_ms(s['timm'])} | {s['timm'] / best:.2f}x | {mfu(s, 'ours')} / {mfu(s, 'compiled')} |"
        )

    lines += _rows("step row", r["step"], row)
    if pk:
        lines.append(f"\nMFU: the step's FLOPs per second over {pk[0] / 1e12:.1f} TFLOP/s ({pk[1]}).")
    return lines


def _dtn_lines(rows: list) -> list[str]:
    lines = [
        "",
        "| DTN block, fwd+bwd, bf16 | batch | plain compiled ms | DTN compiled ms, fused kernels (default) | "
        "default-path overhead (<= 1.35x) | DTN compiled ms, torch formulation | its overhead | plain eager ms | "
        "DTN eager ms (fused) | DTN eager ms (torch) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    return lines + _rows("DTN row", rows, _dtn_row)


def _dtn_row(t: dict) -> str:
    over = lambda k: f"{t[k] / t['plain_compiled']:.2f}x" if t.get(k) else "-"  # noqa: E731
    return (
        f"| {t['size']} | {t['batch']} | {_ms(t.get('plain_compiled'))} | {_ms(t.get('dtn_compiled'))} | "
        f"**{over('dtn_compiled')}** | {_ms(t.get('torch_compiled'))} | {over('torch_compiled')} | "
        f"{_ms(t['plain'])} | {_ms(t['dtn'])} | {_ms(t.get('torch_eager'))} |"
    )


def _cell_lines(c: dict) -> list[str]:
    if _failed("Paper-scale cell", c):
        return ["", _failed("Paper-scale cell", c)]
    return [
        "",
        f"Paper-scale VTAB-1k cell ({c['size']}, {c['steps']} steps of {c['batch']}, synthetic images, data path "
        f"{c['info'].get('data_path')}, bf16 {c['info'].get('bf16')}, compiled "
        f"{c['info'].get('compiled', False)}): compilation {c['compile_s']:.0f} s (once per run), then "
        f"{1e3 * c['step_s']:.1f} ms a step ({c['images_per_s']:.0f} training images/s); a 2,500-step cell "
        f"{c['cell_s'] / 60:.1f} min; the full study ({STUDY_CELLS} cells) projects to "
        f"**{c['study_hours']:.1f} GPU-hours** (target <= 4.5).",
    ]


def _embedded_lines(e: dict | None) -> list[str]:
    if not e:
        return []
    head = "The README's main command (`transferbench run vtab --suite embedded`, default --jobs): "
    if _failed("", e):
        return ["", head + _failed("it", e)]
    lines = [
        "",
        head + f"**{e['wall_s']:.0f} s**, exit {e['exit']} (target <= 60 s); `regress` against the committed CPU "
        f"records: exit {e['regress_exit']}.",
    ]
    b = e.get("breakdown") or {}
    if b.get("cells"):
        lines += [
            "",
            "| where the time went | s |",
            "|---|---|",
            f"| Python and imports (`--help`) | {b['import_s']:.1f} |",
            f"| before the first cell began | {b['before_first_cell_s']:.1f} |",
            f"| cells' set-up ({b['cells']} cells, {b['setup_per_cell_s']:.2f} s each, {b['cells_at_once']:.1f} at "
            f"once) | {b['setup_s']:.1f} |",
            f"| cells' training steps ({b['train_per_cell_s']:.2f} s a cell) | {b['train_s']:.1f} |",
            f"| after the last cell (tables, summary) | {b['after_last_cell_s']:.1f} |",
        ]
    return lines


def _lever_lines(r: dict) -> list[str]:
    rows, mfu = r.get("levers") or [], _mfu(r)
    lines = [] if not rows else ["", "| MFU lever: compiled step | batch | mode | ms | MFU | compile + timing s |"]
    lines += ["|---|---|---|---|---|---|"] if rows else []
    lines += _rows(
        "lever",
        rows,
        lambda t: (
            f"| {t['size']} | {t['batch']} | {t['mode']} | {_ms(t['compiled'])} | {mfu(t, 'compiled')} | {t['row_s']} |"
        ),
    )
    for d in r.get("data_levers") or []:
        if _failed("data lever", d):
            lines.append(f"\n{_failed('data lever', d)}")
        elif "step_ready" in d:
            share = (d["step_resident"] - d["step_ready"]) / d["step_resident"]
            lines.append(
                f"\nData lever, {d['workers']} DataLoader workers for the resident path's draws: the step "
                f"{_ms(d['step_ready'])} ms ready, {_ms(d['step_resident'])} ms fed, share {100 * share:.1f}% (<= 3%)"
            )
    return lines


def _data_lines(d: dict) -> list[str]:
    if _failed("Data row", d):
        return ["", _failed("Data row", d)]
    lines = [
        "",
        f"Data path, batches of {d['batch']} at {d['res']} px from {d['n']:,} images of {d['res'] * 8 // 7} px "
        f"(random crop and flip), `fit`'s own loop, {d['workers']} DataLoader workers (a cell's default):",
    ]
    if "step_ready" in d:
        share = (d["step_resident"] - d["step_ready"]) / d["step_resident"]
        lines += [
            f"- the {d['size']} step on a ready batch: {1e3 * d['step_ready']:.1f} ms",
            f"- fed by the resident path: {1e3 * d['step_resident']:.1f} ms, share {100 * share:.1f}% (<= 3%)",
        ]
    else:
        lines.append(f"- the share of a step: {NO_GPU}")
    if "data_workers" in d:
        lines.append(
            f"- batches alone: resident {1e3 * d['data_resident']:.1f} ms, the per-example worker pipeline "
            f"(8 workers) {1e3 * d['data_workers']:.1f} ms ({d['data_workers'] / d['data_resident']:.1f}x)"
        )
    return lines


def versions(device: str) -> dict:
    """The device, driver and libraries the figures were measured with."""
    import platform
    import subprocess

    import timm
    import torch

    v = {"torch": torch.__version__, "timm": timm.__version__, "python": platform.python_version()}
    try:
        import triton

        v["triton"] = triton.__version__
    except ImportError:
        v["triton"] = None
    if device.startswith("cuda"):
        v["cuda"] = torch.version.cuda
        v["cudnn"] = torch.backends.cudnn.version()
        v["capability"] = ".".join(map(str, torch.cuda.get_device_capability(device)))
        v["memory_mib"] = torch.cuda.get_device_properties(device).total_memory // 2**20
        try:
            q = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
            v["driver"] = subprocess.run(q, capture_output=True, text=True, timeout=20).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            v["driver"] = None
    return v
