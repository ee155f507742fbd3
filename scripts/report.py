"""Turn the benchmark JSON into BENCHMARKS.md tables, PNG plots, and README's headline table.

    python scripts/report.py --kernels results/kernels_h200.json --step results/step_h200.json

Every number in BENCHMARKS.md and in README's headline block comes from the JSON files; rerun this
after rerunning the benchmarks. The Amdahl reconciliation: with s the SSD's share of the Triton
step and k an SSD speedup of cutile over Triton, the predicted step speedup is 1 / ((1 - s) + s / k).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from lightning_modules.flops import PEAK_BF16_TFLOPS  # noqa: E402

HEADLINE_START, HEADLINE_END = "<!-- headline:start -->", "<!-- headline:end -->"


def amdahl(share: float, speedup: float) -> float:
    """Whole-step speedup when a part taking `share` of the time gets `speedup` faster."""
    return 1.0 / ((1.0 - share) + share / speedup)


def _table(header: list[str], rows: list[list]) -> str:
    def fmt(v):
        if isinstance(v, float):
            return f"{v:,.3f}" if abs(v) < 10 else f"{v:,.1f}"
        return str(v)

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def _env_line(env: dict) -> str:
    keys = ("gpu", "driver", "cuda_runtime", "torch", "triton", "cuda_tile", "mamba_ssm", "date")
    return ", ".join(f"{k} {env.get(k)}" for k in keys)


def kernel_rows(kern: dict) -> dict[tuple, dict[str, dict]]:
    """(mode, seqlen, dstate) -> backend -> record."""
    out: dict[tuple, dict[str, dict]] = {}
    for r in kern["records"]:
        key = (r["mode"], r["shape"]["seqlen"], r["shape"]["dstate"])
        out.setdefault(key, {})[r["backend"]] = r
    return out


def kernel_section(kern: dict) -> tuple[str, list[dict]]:
    rows = kernel_rows(kern)
    ceil = kern.get("ceilings", {})
    copy = ceil.get("copy_GBps")
    table_rows, speedups = [], []
    for (mode, seqlen, n), by in sorted(rows.items()):
        cu, tr = by.get("cutile"), by.get("triton")
        if not cu or not tr:
            continue
        sp_wall = tr["wall_ms"]["median"] / cu["wall_ms"]["median"]
        sp_gpu = tr["gpu_ms"] / cu["gpu_ms"]
        speedups.append({"mode": mode, "seqlen": seqlen, "dstate": n, "wall": sp_wall, "gpu": sp_gpu})
        table_rows.append(
            [
                mode,
                seqlen,
                n,
                cu["wall_ms"]["median"],
                tr["wall_ms"]["median"],
                sp_wall,
                cu["gpu_ms"],
                tr["gpu_ms"],
                sp_gpu,
                f"{cu['GBps_gpu']:,.0f} ({100 * cu['GBps_gpu'] / copy:.0f}%)" if copy and mode == "fwd" else "",
                by["torch"]["wall_ms"]["median"] if "torch" in by else "",
            ]
        )
    header = [
        "pass",
        "L",
        "n",
        "cutile wall ms",
        "triton wall ms",
        "speedup wall",
        "cutile GPU ms",
        "triton GPU ms",
        "speedup GPU",
        "cutile GB/s (of copy ceiling)",
        "torch wall ms",
    ]
    text = [
        "## The SSD alone (scripts/bench_kernels.py)",
        "",
        f"Environment: {_env_line(kern['environment'])}.",
        f"Ceilings measured in the same run: device copy {ceil.get('copy_GBps', 0):,.0f} GB/s (read + write), "
        f"bf16 matmul {ceil.get('bf16_matmul_TFLOPs', 0):,.0f} TFLOP/s.",
        "Batch 4, 8 heads, head dim 64, chunk 128, bf16 x/B/C, fp32 dt and state; cuTile block sizes tuned per "
        "shape (`--autotune`). *wall*: CUDA events around back-to-back calls, launch gaps included; *GPU*: sum of "
        "kernel durations from torch.profiler. `fwd_bwd` for cutile is the cuTile forward plus the reference "
        "backward (PyTorch ops), as the design prescribes. GB/s counts each input read once and y written once.",
        "",
        _table(header, table_rows),
    ]
    return "\n".join(text), speedups


def step_records(step: dict) -> dict[tuple, dict[str, dict]]:
    out: dict[tuple, dict[str, dict]] = {}
    for r in step["records"]:
        if "error" in r:
            continue
        out.setdefault((r["size"], r["seqlen"], r["mode"]), {})[r["backend"]] = r
    return out


def step_section(step: dict) -> str:
    rows = []
    for (size, seqlen, mode), by in sorted(step_records(step).items()):
        for backend, r in sorted(by.items()):
            m = r["median"]
            rows.append(
                [
                    f"{size} ({r['parameters'] / 1e6:.0f}M)",
                    seqlen,
                    r["batch"],
                    mode,
                    backend,
                    m["step_ms"],
                    m["forward_ms"],
                    m["backward_ms"],
                    m["optimizer_ms"],
                    m["ssd_forward_ms"],
                    m["ssd_backward_ms"],
                    f"{r['tokens_per_s']:,.0f}",
                    f"{100 * r['mfu']:.1f}%" if r.get("mfu") else "",
                    m.get("peak_gib", 0.0),
                    r["warmup_s"],
                ]
            )
    header = [
        "model",
        "L",
        "batch",
        "mode",
        "backend",
        "step ms",
        "fwd",
        "bwd",
        "opt",
        "SSD fwd",
        "SSD bwd",
        "tokens/s",
        "MFU",
        "peak GiB",
        "warm-up s",
    ]
    errors = [r for r in step["records"] if "error" in r]
    text = [
        "## The training step (scripts/bench_step.py)",
        "",
        f"Environment: {_env_line(step['environment'])}.",
        "Mamba-2 LM, d_state 128, head dim 64, chunk 128, vocab 16384, 16384 tokens per step, AdamW, bf16 autocast, "
        "gradient clipping; same initial weights and batches for every backend; backends alternate step by step "
        f"after {step['settings']['warmup']} warm-up steps (timed apart, *warm-up s*: compilation, autotuning); "
        f"medians of {step['settings']['steps']} steps. SSD fwd/bwd: time inside `kernels.ssd` within the step. "
        "MFU: analytic FLOPs per token (lightning_modules/flops.py) over the GPU's dense bf16 peak "
        f"({PEAK_BF16_TFLOPS['H200']} TFLOP/s for the H200).",
        "",
        _table(header, rows),
    ]
    if errors:
        text += [
            "",
            "Not measured: " + "; ".join(f"{e['size']} L={e['seqlen']} {e['mode']}: {e['error']}" for e in errors),
        ]
    return "\n".join(text)


def reconcile(kern: dict, step: dict) -> list[dict]:
    """Amdahl predictions of the cutile/triton step speedup, from isolated and from in-step SSD times."""
    krows = kernel_rows(kern)
    out = []
    for (size, seqlen, mode), by in sorted(step_records(step).items()):
        cu, tr = by.get("cutile"), by.get("triton")
        if not cu or not tr or mode != "eager":
            continue
        n = tr["config"]["d_state"]
        tm, cm = tr["median"], cu["median"]
        share = (tm["ssd_forward_ms"] + tm["ssd_backward_ms"]) / tm["step_ms"]
        share_fwd = tm["ssd_forward_ms"] / tm["step_ms"]
        iso_fb = krows.get(("fwd_bwd", seqlen, n), {})
        iso_f = krows.get(("fwd", seqlen, n), {})
        k_iso = iso_fb["triton"]["wall_ms"]["median"] / iso_fb["cutile"]["wall_ms"]["median"] if iso_fb else None
        k_iso_fwd = iso_f["triton"]["wall_ms"]["median"] / iso_f["cutile"]["wall_ms"]["median"] if iso_f else None
        k_in = (tm["ssd_forward_ms"] + tm["ssd_backward_ms"]) / (cm["ssd_forward_ms"] + cm["ssd_backward_ms"])
        k_in_fwd = tm["ssd_forward_ms"] / cm["ssd_forward_ms"]
        measured = tm["step_ms"] / cm["step_ms"]
        out.append(
            {
                "size": size,
                "parameters": tr["parameters"],
                "seqlen": seqlen,
                "ssd_share_triton": share,
                "ssd_fwd_share_triton": share_fwd,
                "k_isolated_fwd_bwd": k_iso,
                "predicted_from_isolated": amdahl(share, k_iso) if k_iso else None,
                "k_in_step": k_in,
                "predicted_from_in_step": amdahl(share, k_in),
                "measured": measured,
                "k_isolated_fwd": k_iso_fwd,
                "k_in_step_fwd": k_in_fwd,
                "forward_only_prediction": amdahl(share_fwd, k_in_fwd),
                "non_ssd_ms_cutile": cm["step_ms"] - cm["ssd_forward_ms"] - cm["ssd_backward_ms"],
                "non_ssd_ms_triton": tm["step_ms"] - tm["ssd_forward_ms"] - tm["ssd_backward_ms"],
            }
        )
    return out


def reconcile_section(rec: list[dict]) -> str:
    rows = [
        [
            r["size"],
            r["seqlen"],
            f"{100 * r['ssd_share_triton']:.0f}%",
            r["k_isolated_fwd_bwd"] or "",
            r["predicted_from_isolated"] or "",
            r["k_in_step"],
            r["predicted_from_in_step"],
            r["measured"],
            f"{100 * (r['measured'] / r['predicted_from_isolated'] - 1):+.0f}%" if r["predicted_from_isolated"] else "",
            f"{100 * r['ssd_fwd_share_triton']:.0f}%",
            r["k_in_step_fwd"],
            r["forward_only_prediction"],
        ]
        for r in rec
    ]
    header = [
        "model",
        "L",
        "SSD share (triton step)",
        "k isolated fwd+bwd",
        "predicted",
        "k in step",
        "predicted",
        "measured",
        "measured vs isolated prediction",
        "SSD fwd share",
        "k fwd in step",
        "step speedup if only the forward changed",
    ]
    return "\n".join(
        [
            "## Isolated speedup vs step speedup (Amdahl)",
            "",
            "Speedups are cutile over triton (above 1: cutile faster). s is the SSD's share of the Triton step; "
            "*k isolated* comes from the SSD-alone benchmark at the same L and state size (wall clock, batch 4, 8 "
            "heads), *k in step* from the SSD's own time inside the step; predicted = 1 / ((1 - s) + s / k). The last "
            "column asks what the forward-only speedup the seed reports could give a training step at best: the "
            "cutile forward with Triton's backward.",
            "",
            _table(header, rows),
        ]
    )


def plots(kern_speedups: list[dict], step: dict, rec: list[dict], out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), sharey=True)
    for ax, mode in zip(axes, ("fwd", "fwd_bwd")):
        for n, marker, color in ((64, "o", "tab:blue"), (128, "s", "tab:green")):
            pts = sorted((s["seqlen"], s) for s in kern_speedups if s["mode"] == mode and s["dstate"] == n)
            if pts:
                xs = [p[0] for p in pts]
                ax.plot(xs, [p[1]["wall"] for p in pts], marker + "-", color=color, label=f"n={n}, wall clock")
                ax.plot(xs, [p[1]["gpu"] for p in pts], marker + "--", color=color, alpha=0.6, label=f"n={n}, GPU time")
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_title("forward" if mode == "fwd" else "forward + backward")
        ax.set_xlabel("sequence length")
    axes[0].set_ylabel("cutile speedup over triton")
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    paths.append(out_dir / "kernel_speedup.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    groups = [(k, by) for k, by in sorted(step_records(step).items()) if k[2] == "eager"]
    if groups:
        fig, ax = plt.subplots(figsize=(11, 4))
        labels, positions, x = [], [], 0.0
        parts = [
            ("ssd fwd", "#1f77b4"),
            ("other fwd", "#aec7e8"),
            ("ssd bwd", "#d62728"),
            ("other bwd", "#ff9896"),
            ("optimizer", "#7f7f7f"),
        ]
        for (size, seqlen, _), by in groups:
            for backend in ("cutile", "triton", "torch"):
                if backend not in by:
                    continue
                m = by[backend]["median"]
                values = [
                    m["ssd_forward_ms"],
                    m["forward_ms"] - m["ssd_forward_ms"],
                    m["ssd_backward_ms"],
                    m["backward_ms"] - m["ssd_backward_ms"],
                    m["optimizer_ms"],
                ]
                bottom = 0.0
                for (name, color), v in zip(parts, values):
                    ax.bar(x, v, bottom=bottom, color=color, label=name if not positions else None)
                    bottom += v
                labels.append(f"{size}\nL={seqlen}\n{backend}")
                positions.append(x)
                x += 1
            x += 0.5
        ax.set_xticks(positions, labels, fontsize=7)
        ax.set_ylabel("ms per training step")
        ax.set_title("Training-step breakdown per SSD backend (H200)")
        ax.legend(fontsize=8)
        fig.tight_layout()
        paths.append(out_dir / "step_breakdown.png")
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)

    if rec:
        fig, ax = plt.subplots(figsize=(6, 3.6))
        names = [f"{r['size']} L={r['seqlen']}" for r in rec]
        xs = range(len(rec))
        ax.bar(
            [i - 0.2 for i in xs], [r["predicted_from_isolated"] or 0 for r in rec], 0.2, label="predicted (isolated k)"
        )
        ax.bar(list(xs), [r["predicted_from_in_step"] for r in rec], 0.2, label="predicted (in-step k)")
        ax.bar([i + 0.2 for i in xs], [r["measured"] for r in rec], 0.2, label="measured")
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.set_xticks(list(xs), names, fontsize=8)
        ax.set_ylabel("step speedup, cutile over triton")
        ax.legend(fontsize=8)
        fig.tight_layout()
        paths.append(out_dir / "amdahl.png")
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)
    return paths


def headline(kern_speedups: list[dict], rec: list[dict]) -> str:
    seed = next((s for s in kern_speedups if s["mode"] == "fwd" and s["seqlen"] == 16384 and s["dstate"] == 128), None)
    seed_fb = next(
        (s for s in kern_speedups if s["mode"] == "fwd_bwd" and s["seqlen"] == 16384 and s["dstate"] == 128), None
    )
    rows = []
    if seed:
        rows.append(["SSD forward alone, seed shape (L 16384, n 128)", f"{seed['wall']:.2f}x", f"{seed['gpu']:.2f}x"])
    if seed_fb:
        rows.append(["SSD forward + backward alone, seed shape", f"{seed_fb['wall']:.2f}x", f"{seed_fb['gpu']:.2f}x"])
    for r in rec:
        params = f"{r['parameters'] / 1e6:.0f}M parameters"
        rows.append(
            [f"training step, {r['size']}-layout model ({params}), L {r['seqlen']}", f"{r['measured']:.2f}x", ""]
        )
    return _table(["cutile over triton (H200)", "wall clock", "GPU kernel time"], rows)


def _short(name: str) -> str:
    return name.split("_Kt")[0].split("(")[0][:60]


def findings(kern: dict, speedups: list[dict], rec: list[dict]) -> str:
    """The conclusions, with every number computed from the JSON."""
    lines = ["## Findings", ""]
    fwd = [s for s in speedups if s["mode"] == "fwd"]
    fb = [s for s in speedups if s["mode"] == "fwd_bwd"]
    if fwd:
        for n in sorted({s["dstate"] for s in fwd}):
            sub = [s for s in fwd if s["dstate"] == n]
            lines.append(
                f"- SSD forward alone, state {n}: cutile over triton {min(s['wall'] for s in sub):.2f}-"
                f"{max(s['wall'] for s in sub):.2f}x by wall clock, {min(s['gpu'] for s in sub):.2f}-"
                f"{max(s['gpu'] for s in sub):.2f}x by GPU kernel time (L 2048-16384)."
            )
    seed = {
        r["backend"]: r
        for r in kern["records"]
        if r["mode"] == "fwd" and r["shape"]["seqlen"] == 16384 and r["shape"]["dstate"] == 128
    }
    if "cutile" in seed and "triton" in seed:
        cu, tr = seed["cutile"], seed["triton"]
        sh = cu["shape"]
        c = -(-sh["seqlen"] // sh["chunk_size"])
        states = 2 * 4 * sh["batch"] * c * sh["nheads"] * sh["headdim"] * sh["dstate"]  # fp32, written then read
        io = cu["GBps_gpu"] * cu["gpu_ms"] * 1e6
        copy = kern["ceilings"].get("copy_GBps")
        floor_ms = (io + states) / (copy * 1e6) if copy else float("nan")
        target = (
            "met"
            if tr["gpu_ms"] / cu["gpu_ms"] >= 2 and tr["wall_ms"]["median"] / cu["wall_ms"]["median"] >= 2
            else "not met"
        )
        parts = ", ".join(f"{_short(k)} {v:.3f} ms" for k, v in list(cu["top_kernels_ms"].items())[:3])
        tparts = ", ".join(f"{_short(k)} {v:.3f} ms" for k, v in list(tr["top_kernels_ms"].items())[:4])
        lines += [
            f"- Seed shape (batch 4, 16384 tokens, 8 heads, head 64, state 128, chunk 128, bf16): cutile "
            f"{cu['wall_ms']['median']:.3f} ms wall / {cu['gpu_ms']:.3f} ms GPU against triton "
            f"{tr['wall_ms']['median']:.3f} ms / {tr['gpu_ms']:.3f} ms. The 2x-on-both target is {target}; "
            f"the stretch goal of at most 0.15 ms of GPU time is {'met' if cu['gpu_ms'] <= 0.15 else 'not met'}. "
            f"cutile's kernels: {parts}; triton's: {tparts}.",
            f"- This design's HBM traffic (inputs and y once, plus the fp32 chunk states written and read back) "
            f"takes {floor_ms:.3f} ms at the measured copy rate: the cutile forward runs at "
            f"{100 * floor_ms / cu['gpu_ms']:.0f}% of that floor, compute_out being the kernel furthest from it.",
        ]
    if fb:
        lines.append(
            f"- Forward + backward alone, cutile (cuTile forward + reference backward) over triton: "
            f"{min(s['wall'] for s in fb):.2f}-{max(s['wall'] for s in fb):.2f}x wall, "
            f"{min(s['gpu'] for s in fb):.2f}-{max(s['gpu'] for s in fb):.2f}x GPU: the reference backward, "
            "a few dozen generic PyTorch kernels over (chunk x chunk) tiles in fp32, costs far more than "
            "mamba_ssm's fused Triton backward."
        )
    if rec:
        meas = [r["measured"] for r in rec]
        err_in = max(abs(r["measured"] / r["predicted_from_in_step"] - 1) for r in rec)
        err_iso = [abs(r["measured"] / r["predicted_from_isolated"] - 1) for r in rec if r["predicted_from_isolated"]]
        fwd_only = [r["forward_only_prediction"] for r in rec]
        lines += [
            f"- Training step, cutile over triton: {min(meas):.2f}-{max(meas):.2f}x, i.e. the cutile step is slower. "
            f"The SSD takes {min(r['ssd_share_triton'] for r in rec) * 100:.0f}-"
            f"{max(r['ssd_share_triton'] for r in rec) * 100:.0f}% of the Triton step; everything else "
            "(projections, convolution, norms, LM head, optimizer) costs the same with either backend.",
            f"- Amdahl with the SSD speedup measured inside the step predicts the measured step speedup within "
            f"{100 * err_in:.0f}%. With the speedup measured on the isolated benchmark shape (batch 4, 8 heads) the "
            f"prediction is off by up to {100 * max(err_iso):.0f}%: at that shape Triton's fused forward+backward is "
            "bound by kernel launches (its wall time barely moves with the work), while the reference backward "
            "scales with the work, so the isolated ratio flatters cutile compared with the larger per-layer "
            "problem of the training step (batch 8 or 2, 12 or 24 heads). The isolated speedup transfers only "
            "when measured at the step's own shape.",
            f"- What the seed's forward-only speedup can buy: had the backward stayed Triton's, the cutile forward "
            f"(measured {min(r['k_in_step_fwd'] for r in rec):.2f}-{max(r['k_in_step_fwd'] for r in rec):.2f}x faster "
            f"than Triton's inside the step) would have sped the step up by {min(fwd_only):.2f}-{max(fwd_only):.2f}x, "
            f"because the SSD forward is only {min(r['ssd_fwd_share_triton'] for r in rec) * 100:.0f}-"
            f"{max(r['ssd_fwd_share_triton'] for r in rec) * 100:.0f}% of a Triton training step.",
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kernels", default=str(ROOT / "results" / "kernels_h200.json"))
    ap.add_argument("--step", default=str(ROOT / "results" / "step_h200.json"))
    ap.add_argument("--out", default=str(ROOT / "BENCHMARKS.md"))
    ap.add_argument("--plots", default=str(ROOT / "results"))
    ap.add_argument("--readme", default=str(ROOT / "README.md"), help="README whose headline block is refreshed")
    ap.add_argument("--notes", default=str(ROOT / "results" / "notes.md"), help="hand-written analysis appended")
    args = ap.parse_args(argv)

    kern = json.loads(Path(args.kernels).read_text())
    step = json.loads(Path(args.step).read_text())
    kern_text, speedups = kernel_section(kern)
    rec = reconcile(kern, step)
    out_dir = Path(args.plots)
    out_dir.mkdir(parents=True, exist_ok=True)
    pngs = plots(speedups, step, rec, out_dir)
    out = Path(args.out)
    rel = [p.relative_to(out.parent) if p.is_relative_to(out.parent) else p for p in pngs]
    parts = [
        "# Benchmarks",
        "",
        "Generated by `python scripts/report.py` from the JSON in results/ (written by scripts/bench_kernels.py and "
        "scripts/bench_step.py); do not edit by hand.",
        "",
        headline(speedups, rec),
        "",
        findings(kern, speedups, rec),
        "",
        *[f"![{p.stem}]({p})" for p in rel],
        "",
        kern_text,
        "",
        step_section(step),
        "",
        reconcile_section(rec),
    ]
    notes = Path(args.notes)
    if notes.is_file():
        parts += ["", notes.read_text().strip()]
    out.write_text("\n".join(parts) + "\n")
    (out_dir / "reconciliation.json").write_text(json.dumps(rec, indent=1) + "\n")
    readme = Path(args.readme)
    if readme.is_file():
        text = readme.read_text()
        block = f"{HEADLINE_START}\n{headline(speedups, rec)}\n{HEADLINE_END}"
        if HEADLINE_START in text:
            text = re.sub(
                re.escape(HEADLINE_START) + ".*?" + re.escape(HEADLINE_END), lambda _: block, text, flags=re.S
            )
            readme.write_text(text)
    print(f"wrote {out} and {', '.join(str(p) for p in pngs)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
