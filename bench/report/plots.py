"""The plots BENCHMARKS.md shows, written beside the JSON as small palette PNGs."""

from __future__ import annotations

import io
import textwrap
from pathlib import Path
from types import ModuleType

from bench.report.format import Stat, ordered
from bench.report.kernels import MODE_NAMES, SHAPE_NAMES, kernel_keys, varying
from bench.report.series import Pool

DPI = 100  # pixels per inch of figure: the smallest at which the 6-point tick labels stay legible
COLORS = 16  # the palette a plot is quantized to: its few flat colours and their anti-aliased edges


def pyplot() -> tuple[ModuleType, ModuleType]:
    """(matplotlib, matplotlib.pyplot) on the Agg backend, imported on first use: the report's text needs neither."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return matplotlib, plt


def save(fig, path: Path) -> Path:
    """Write `fig` to `path` as a PNG of at most COLORS colours (Pillow, matplotlib's own dependency, quantizes),
    optimized and without metadata, and close it."""
    from PIL import Image

    _, plt = pyplot()
    fig.tight_layout()
    rendered = io.BytesIO()
    fig.savefig(rendered, format="png", dpi=DPI)
    plt.close(fig)
    Image.open(rendered).convert("RGB").quantize(COLORS, method=Image.Quantize.FASTOCTREE).save(path, optimize=True)
    return path


def plots(kpool: Pool, spool: Pool, rec: list[dict], base: str, gpu: str, out_dir: Path) -> list[Path]:
    """kernel_speedup.png (each backend over `base` per pass against L, wall clock and GPU time), step_breakdown.png
    (each step row's medians split into SSD and the rest, forward and backward, and the optimizer) and, when `rec`
    holds rows, amdahl.png (predicted and measured step speedups), written into `out_dir`; their paths."""
    matplotlib, plt = pyplot()

    def bar_err(stat: Stat | None) -> tuple[float, list[float]]:
        return (stat.median, [stat.median - stat.min, stat.max - stat.median]) if stat else (0.0, [0.0, 0.0])

    paths = []
    modes = ordered(k[0] for k in kpool)
    fields, _ = varying(dict(k[1]) for k in kpool)
    others = [f for f in fields if f != "seqlen"]
    fig, axes = plt.subplots(1, len(modes), figsize=(5 * len(modes), 3.8), sharey=True, squeeze=False)
    for ax, mode in zip(axes[0], modes):
        keys = [k for k in kernel_keys(kpool) if k[0] == mode]
        series = ordered((n, tuple(dict(k[1])[f] for f in others)) for k in keys for n in kpool[k] if n != base)
        for i, (name, rest) in enumerate(series):
            pts = [
                (dict(k[1]), kpool[k][name])
                for k in keys
                if name in kpool[k] and tuple(dict(k[1])[f] for f in others) == rest
            ]
            what = ", ".join([name, *(f"{SHAPE_NAMES.get(f, f)}={v}" for f, v in zip(others, rest))])
            for clock, style in (("wall_over_base", "o-"), ("gpu_over_base", "^--")):
                xy = [(s.get("seqlen", j), f[clock]) for j, (s, f) in enumerate(pts) if f[clock]]
                if xy:
                    ax.errorbar(
                        [x for x, _ in xy],
                        [st.median for _, st in xy],
                        yerr=[[st.median - st.min for _, st in xy], [st.max - st.median for _, st in xy]],
                        fmt=style,
                        color=f"C{i}",
                        label=f"{what}, {'wall clock' if clock == 'wall_over_base' else 'GPU time'}",
                    )
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set(yscale="log", title=MODE_NAMES.get(mode, mode), xlabel="sequence length")
        ax.yaxis.set_major_locator(matplotlib.ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    axes[0][0].set_ylabel(f"speedup over {base}")
    axes[0][-1].legend(fontsize=6)
    paths.append(save(fig, out_dir / "kernel_speedup.png"))

    parts = [
        ("SSD fwd", "#1f77b4", lambda m: m["ssd_forward_ms"]),
        ("other fwd", "#aec7e8", lambda m: m["forward_ms"] - m["ssd_forward_ms"]),
        ("SSD bwd", "#d62728", lambda m: m["ssd_backward_ms"]),
        ("other bwd", "#ff9896", lambda m: m["backward_ms"] - m["ssd_backward_ms"]),
        ("optimizer", "#7f7f7f", lambda m: m["optimizer_ms"]),
    ]
    fig, ax = plt.subplots(figsize=(max(6, 0.75 * sum(len(by) for by in spool.values())), 4.8))
    ticks, x = [], 0.0
    for (size, seqlen, _, mode), by in spool.items():
        for name, f in by.items():
            medians = {k: (v.median if v else 0.0) for k, v in f.items()}
            bottom = 0.0
            for part, color, value in parts:
                ax.bar(x, value(medians), bottom=bottom, color=color, label=part if not ticks else None)
                bottom += value(medians)
            ticks.append((x, "\n".join([size, f"L={seqlen}", textwrap.fill(mode, 12), textwrap.fill(name, 12)])))
            x += 1
        x += 0.5
    ax.set_xticks([t for t, _ in ticks], [n for _, n in ticks], fontsize=6)
    ax.set(ylabel="ms per training step (medians)", title=f"Training-step breakdown per SSD backend ({gpu})")
    ax.legend(fontsize=8)
    paths.append(save(fig, out_dir / "step_breakdown.png"))

    if rec:
        fig, ax = plt.subplots(figsize=(max(6, 1.5 * len(rec)), 4.2))
        bars = (
            ("predicted_from_isolated", "predicted (isolated k)"),
            ("predicted_from_in_step", "predicted (in-step k)"),
        )
        shown = [(k, name) for k, name in (*bars, ("measured", "measured")) if any(r[k] for r in rec)]
        for j, (k, name) in enumerate(shown):
            stats = [bar_err(Stat(**r[k]) if r[k] else None) for r in rec]
            xs = [i + 0.2 * (j - (len(shown) - 1) / 2) for i in range(len(rec))]
            ax.bar(xs, [m for m, _ in stats], 0.2, yerr=list(zip(*[e for _, e in stats])), label=name)
        ax.axhline(1.0, color="gray", lw=0.8)
        names = [
            f"{r['size']} L={r['seqlen']}\n{textwrap.fill(r['mode'], 22)}\n{textwrap.fill(r['backend'], 22)}"
            for r in rec
        ]
        ax.set_xticks(range(len(rec)), names, fontsize=7)
        ax.set_ylabel(f"step speedup over {base}")
        ax.legend(fontsize=8)
        paths.append(save(fig, out_dir / "amdahl.png"))
    return paths


def scaling_plot(scpool: Pool, gpu: str, runs: str, out_dir: Path) -> Path:
    """results/scaling.png: tokens/s on 1 and on N GPUs per backend, one panel per step shape and mode; a black
    tick at N x the 1-GPU figure (perfect scaling); error bars span the runs."""
    matplotlib, plt = pyplot()
    keys = list(scpool)
    width = max(5, 1.6 * max(len(by) for by in scpool.values()))
    fig, axes = plt.subplots(1, len(keys), figsize=(width * len(keys), 4.2), squeeze=False)
    for ax, key in zip(axes[0], keys):
        size, seqlen, batch, mode, gpus = key
        names = list(scpool[key])
        for j, (fig_name, what) in enumerate((("tokens_1", "1 GPU"), ("tokens_n", f"{gpus} GPUs (DDP)"))):
            stats = [scpool[key][n][fig_name] for n in names]
            xs = [i + 0.4 * (j - 0.5) for i in range(len(names))]
            heights = [st.median if st else 0.0 for st in stats]
            err = [
                [st.median - st.min if st else 0.0 for st in stats],
                [st.max - st.median if st else 0.0 for st in stats],
            ]
            ax.bar(xs, heights, 0.4, yerr=err, color=f"C{j}", label=what)
        ideal = [(i, gpus * f["tokens_1"].median) for i, f in enumerate(scpool[key].values()) if f["tokens_1"]]
        ax.hlines([y for _, y in ideal], [i for i, _ in ideal], [i + 0.4 for i, _ in ideal], color="k")
        ax.plot([], [], color="k", label=f"{gpus} x the 1-GPU tokens/s")
        ax.set_xticks(range(len(names)), names, fontsize=7)
        ax.set(ylabel="tokens/s", title=f"{mode}: {size}, L {seqlen}, batch {batch} per GPU ({gpu}, {runs})")
        ax.yaxis.set_major_formatter(matplotlib.ticker.StrMethodFormatter("{x:,.0f}"))
        ax.legend(fontsize=7, loc="upper left")
    return save(fig, out_dir / "scaling.png")
