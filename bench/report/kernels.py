"""The SSD alone (bench/bench_kernels.py): the kernel table per pass and shape, and the table over the shape sweep.

Each row: one backend at one pass and shape, its wall and GPU time pooled over runs, its ratios over the baseline
(the baseline's time over the row's, taken within each run), its bandwidth against the copy ceiling of its run.
"""

from __future__ import annotations

from collections.abc import Iterable

from bench.report.format import Stat, cell, ordered, pct, ratio, table, times
from bench.report.series import Pool, captions

MODE_NAMES = {"fwd": "forward", "fwd_bwd": "forward + backward", "bwd": "backward (forward + backward less forward)"}
SHAPE_NAMES = {
    "seqlen": "L",
    "dstate": "n",
    "nheads": "heads",
    "headdim": "head dim",
    "ngroups": "groups",
    "chunk_size": "chunk",
}


def shape_key(rec: dict) -> tuple:
    """(pass, ((shape field, value), ...)): a bench_kernels record's pool key."""
    return (rec["mode"], tuple(rec["shape"].items()))


def kernel_figures(rec: dict, base: dict | None, run: dict) -> dict[str, float | None]:
    """A bench_kernels record's figures; the ratios over `base` are None for the baseline itself."""
    wall, gpu = rec["wall_ms"]["median"], rec.get("gpu_ms")
    other = base is not None and base is not rec
    return {
        "wall_ms": wall,
        "gpu_ms": gpu,
        "wall_over_base": ratio(base["wall_ms"]["median"], wall) if other else None,
        "gpu_over_base": ratio(base.get("gpu_ms"), gpu) if other else None,
        "GBps": rec.get("GBps_gpu") if rec["mode"] == "fwd" else None,
        "copy_share": ratio(rec.get("GBps_gpu"), run.get("ceilings", {}).get("copy_GBps"))
        if rec["mode"] == "fwd"
        else None,
        "launches": rec.get("kernels_per_call"),
        "warmup_s": rec.get("warmup_s"),
    }


def varying(shapes: Iterable[dict]) -> tuple[list[str], dict]:
    """(fields whose value differs between shapes, {field: value} of those that do not)."""
    shapes = list(shapes)
    values = {k: {repr(s.get(k)): s.get(k) for s in shapes} for k in ordered(k for s in shapes for k in s)}
    return [k for k, v in values.items() if len(v) > 1], {
        k: next(iter(v.values())) for k, v in values.items() if len(v) == 1
    }


def shape_text(shape: dict, fields: Iterable[str]) -> str:
    """The shape's `fields` as shown: "L 2048, n 128, bfloat16"."""
    return ", ".join(f"{SHAPE_NAMES.get(k, k)} {shape[k]}" if k != "dtype" else str(shape[k]) for k in fields)


def kernel_keys(kpool: Pool) -> list[tuple]:
    """Pass first (in the JSON's order), then shape."""
    modes = ordered(k[0] for k in kpool)
    return sorted(kpool, key=lambda k: (modes.index(k[0]), [v for _, v in k[1]]))


def ceilings_text(runs: list[dict]) -> str:
    """The copy and bf16 matmul ceilings the runs measured, pooled; a line saying there are none without a GPU."""
    copy = Stat.of(r.get("ceilings", {}).get("copy_GBps") for r in runs)
    mm = Stat.of(r.get("ceilings", {}).get("bf16_matmul_TFLOPs") for r in runs)
    if not copy and not mm:
        return "No ceilings measured (no GPU)."
    return (
        f"Ceilings measured in the same process: device copy {cell(copy, '{:,.0f}'.format)} GB/s (read + write), "
        f"bf16 matmul {cell(mm, '{:,.0f}'.format)} TFLOP/s."
    )


def kernel_section(
    runs: list[dict],
    kpool: Pool,
    base: str,
    title: str = "The SSD alone (bench/bench_kernels.py)",
    lead: Iterable[str] = (),
) -> str:
    """The kernel table of a bench_kernels series under `title`, with the `lead` paragraphs before its captions."""
    fields, fixed = varying(dict(k[1]) for k in kpool)
    header = ["pass", *(SHAPE_NAMES.get(f, f) for f in fields), "backend", "wall ms", "GPU ms"]
    header += [f"wall: over {base}", f"GPU: over {base}", "GB/s (of copy ceiling)", "launches", "warm-up s"]
    rows = []
    for key in kernel_keys(kpool):
        shape = dict(key[1])
        for name, f in kpool[key].items():
            gbps = cell(f["GBps"], "{:,.0f}".format)
            share = f" ({cell(f['copy_share'], pct)})" if gbps and f["copy_share"] else ""
            rows.append(
                [key[0], *(str(shape[k]) for k in fields), name, cell(f["wall_ms"]), cell(f["gpu_ms"])]
                + [cell(f["wall_over_base"]), cell(f["gpu_over_base"]), gbps + share]
                + [cell(f["launches"], "{:.0f}".format), cell(f["warmup_s"])]
            )
    return "\n".join(
        [
            f"## {title}",
            "",
            *(line for paragraph in lead for line in (paragraph, "")),
            *captions(runs),
            ceilings_text(runs),
            f"Every row: {shape_text(fixed, fixed)}.",
            f"*wall*: CUDA events around back-to-back calls, launch gaps included; *GPU*: the time the GPU runs the "
            "call's kernels, from torch.profiler (kernels running at once count once; the cuTile "
            f"backward's two state walks share one launch); *over {base}*: {base}'s time over the row's; "
            "GB/s: each input read once and y written once, over the GPU time; *launches*: kernels per call; "
            "*warm-up s*: the first call, timed apart.",
            "",
            table(header, rows),
        ]
    )


def sweep_section(runs: list[dict], kpool: Pool, base: str) -> str:
    """The kernel table over a shape sweep, led by the lowest GPU-time ratio over the baseline of each backend."""
    fields, _ = varying(dict(k[1]) for k in kpool)
    lowest = []
    for name in ordered(n for by in kpool.values() for n in by if n != base):
        ratios = [
            (by[name]["gpu_over_base"], key) for key, by in kpool.items() if by.get(name, {}).get("gpu_over_base")
        ]
        if ratios:
            stat, key = min(ratios, key=lambda r: r[0].median)
            lowest.append(f"{name} {cell(stat, times)} at {shape_text(dict(key[1]), fields)} ({key[0]})")
    lead = [f"Lowest GPU-time ratio over {base} across the sweep: " + "; ".join(lowest) + "."] if lowest else []
    return kernel_section(
        runs, kpool, base, "The SSD over the shape sweep (bench/bench_kernels.py --shapes sweep)", lead
    )
