"""Scaling to several GPUs (bench/bench_scaling.py): per step shape, each backend's 1-GPU, DDP and no_sync steps
with every rank's figure, tokens/s, scaling efficiency and the all-reduce's cost and overlap."""

from __future__ import annotations

from bench.report.format import Stat, cell, ordered, pct, pct1, table, times
from bench.report.series import Pool, captions
from bench.report.step import model_text

PHASES = ("single", "ddp", "no_sync")  # bench_scaling's phases: 1 GPU, DDP, DDP without the all-reduce
SCALING_DEFAULT = "scaling_h200x2"  # --scaling's series when present; no scaling section when absent


def scaling_key(rec: dict) -> tuple:
    """(model size, L, batch per GPU, mode, GPUs): a bench_scaling record's pool key."""
    return (rec["size"], rec["seqlen"], rec["batch_per_gpu"], rec["mode"], rec["world_size"])


def scaling_figures(rec: dict, base: dict | None, run: dict) -> dict[str, float | None]:
    """A bench_scaling record's figures; per-rank ones as `<figure>@<rank>`. `base` is not used."""
    phases, allreduce = rec["phases"], rec.get("allreduce", {})
    out: dict[str, float | None] = {}
    for phase, p in ((ph, phases[ph]) for ph in PHASES if ph in phases):
        out[f"{phase}_ms"] = p["step_ms"]
        out |= {f"{phase}_ms@{i}": r["step_ms"] for i, r in enumerate(p["per_rank"])}
    for part in ("forward", "backward"):
        out |= {f"ssd_{part}_ms@{i}": r.get(f"ssd_{part}_ms") for i, r in enumerate(phases["single"]["per_rank"])}
    return out | {
        "tokens_1": phases["single"]["tokens_per_s"],
        "tokens_n": phases.get("ddp", {}).get("tokens_per_s"),
        "speedup": rec.get("speedup"),
        "efficiency": rec.get("scaling_efficiency"),
        "allreduce_MB": allreduce["bytes"] / 1e6 if "bytes" in allreduce else None,
        "allreduce_ms": allreduce.get("ms"),
        "busbw_GBps": allreduce.get("busbw_GBps"),
        "exposed_ms": rec.get("exposed_comm_ms"),
        "overlap": rec.get("overlap"),
        "warmup_ddp_s": rec.get("warmup_s", {}).get("ddp"),
        "stream_warnings": rec.get("stream_warnings"),
        "parameters": rec.get("parameters"),
    }


def ranks(f: dict[str, Stat | None], figure: str) -> list[Stat | None]:
    """The per-rank Stats of `figure`, rank 0 first."""
    n = 0
    while f"{figure}@{n}" in f:
        n += 1
    return [f[f"{figure}@{i}"] for i in range(n)]


def per_rank_cell(f: dict[str, Stat | None], figure: str, main: str | None = None) -> str:
    """`main` (the figure across ranks) with every rank's in parentheses; the ranks alone without `main`;
    – where the figure is zero on every rank (not timed)."""
    each = ranks(f, figure)
    if all(s is None or s.median == 0 for s in each) and not (main and f.get(main)):
        return "–"
    text = " / ".join(cell(s) for s in each)
    return f"{cell(f[main])} ({text})" if main else text


def scaling_section(runs: list[dict], scpool: Pool) -> str:
    """A table per step shape of a bench_scaling series, captioned, with its warnings and failed variants."""
    world = ordered(k[4] for k in scpool) or [runs[0]["settings"].get("world_size")]
    n = " / ".join(map(str, world))
    header = ["backend", "1-GPU step ms (ranks)", "DDP step ms: slowest (ranks)", "no_sync step ms (ranks)"]
    header += ["tokens/s, 1 GPU", f"tokens/s, {n} GPUs", "speedup", "scaling efficiency", "all-reduce MB"]
    header += ["all-reduce ms", "bus GB/s", "exposed all-reduce ms", "overlap", "SSD fwd ms, 1 GPU (ranks)"]
    header += ["SSD bwd ms, 1 GPU (ranks)", "warm-up s (DDP)"]
    tables = []
    for (size, seqlen, batch, mode, gpus), by in scpool.items():
        rows = [
            [name, per_rank_cell(f, "single_ms", "single_ms"), per_rank_cell(f, "ddp_ms", "ddp_ms")]
            + [per_rank_cell(f, "no_sync_ms", "no_sync_ms")]
            + [cell(f["tokens_1"], "{:,.0f}".format), cell(f["tokens_n"], "{:,.0f}".format), cell(f["speedup"], times)]
            + [cell(f["efficiency"], pct1), cell(f["allreduce_MB"], "{:,.0f}".format), cell(f["allreduce_ms"])]
            + [cell(f["busbw_GBps"], "{:,.0f}".format), cell(f["exposed_ms"]), cell(f["overlap"], pct)]
            + [per_rank_cell(f, "ssd_forward_ms"), per_rank_cell(f, "ssd_backward_ms"), cell(f["warmup_ddp_s"])]
            for name, f in by.items()
        ]
        what = f"### {mode}: {model_text(size, by)}, L {seqlen}, batch {batch} per GPU, {gpus} GPUs"
        tables += [what, "", table(header, rows), ""]
    warned = {
        f"{name} {k[3]}": f["stream_warnings"].median
        for k, by in scpool.items()
        for name, f in by.items()
        if f["stream_warnings"] and f["stream_warnings"].median
    }
    errors = ordered(
        f"{r['variant']} {r['mode']}: {r['error']}" for run in runs for r in run["records"] if "error" in r
    )
    lines = [
        f"## Scaling to {n} GPUs (bench/bench_scaling.py)",
        "",
        *captions(runs),
        "The same per-GPU batch on 1 and on N GPUs, one process per GPU; each process times the three phases "
        "step by step in turn. *1 GPU*: the plain model, no communication, every rank timing its own at the same "
        "time (the figure is the median of the ranks'); *DDP*: the model in DistributedDataParallel, the slowest "
        "rank's step; *no_sync*: the same DDP step without the all-reduce (slowest rank). (ranks): each rank's "
        "median step, rank 0 first. tokens/s on N GPUs: N x the per-GPU tokens over the slowest DDP step; "
        "*speedup*: N-GPU over 1-GPU tokens/s; *scaling efficiency*: the 1-GPU step over the DDP step (speedup / "
        "N). *all-reduce*: one all-reduce of every gradient at once (float32), its time and bus bandwidth "
        "2 (N - 1) / N x bytes / time; *exposed*: DDP step - no_sync step; *overlap*: 1 - exposed / all-reduce "
        "time (below 0: the exposed time exceeds one whole all-reduce). *SSD fwd/bwd*: time inside `kernels.ssd` "
        "in the 1-GPU step, per rank (– where not timed: compiled). *warm-up s (DDP)*: the DDP phase's warm-up "
        "steps, compilation and autotuning included, slowest rank.",
        "AccumulateGrad stream warnings: "
        + ("; ".join(f"{k}: {v:.0f}" for k, v in warned.items()) if warned else "none in any record")
        + ".",
        "",
        *tables,
    ]
    return "\n".join(lines + (["Not measured: " + "; ".join(errors) + "."] if errors else [])).rstrip()
