"""Isolated speedup vs step speedup: Amdahl's law reconciles the SSD-alone ratios with the measured step.

With s the SSD's share of the baseline's step and k the SSD speedup of a backend over the baseline, the predicted
step speedup is 1 / ((1 - s) + s / k). k is taken in isolation (the kernel benchmark at the step's L and SSD
dimensions) and inside the step (the SSD's own time there); both predictions sit beside the measured speedup.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict

from bench.report.format import Stat, cell, num, ordered, pct, ratio, table
from bench.report.series import Pool, label, pool
from bench.report.step import model_text, step_key

# Kernel shape field -> step record config field describing the same SSD problem dimension.
SHAPE_IN_CONFIG = {"dstate": "d_state", "headdim": "headdim", "chunk_size": "chunk_size", "ngroups": "ngroups"}
GRAPH_MODES = ("reduce-overhead", "max-autotune")  # torch.compile modes that replay CUDA graphs: no launch overhead


def amdahl(share: float, speedup: float) -> float:
    """Whole-step speedup when a part taking `share` of the time gets `speedup` faster."""
    return 1.0 / ((1.0 - share) + share / speedup)


def isolated_key(kpool: Pool, rec: dict, mode: str) -> tuple | None:
    """The kernel-benchmark shape of `mode` at the step's sequence length and SSD dimensions; among several,
    the one with the step's batch and number of heads too; None when there is no single one."""
    cfg = rec.get("config", {})

    def same_problem(shape: dict) -> bool:
        both = [(shape[s], cfg[c]) for s, c in SHAPE_IN_CONFIG.items() if s in shape and c in cfg]
        return shape.get("seqlen") == rec["seqlen"] and all(a == b for a, b in both)

    keys = [k for k in kpool if k[0] == mode and same_problem(dict(k[1]))]
    if len(keys) > 1 and {"expand", "d_model", "headdim"} <= cfg.keys():
        heads = cfg["expand"] * cfg["d_model"] // cfg["headdim"]
        keys = [k for k in keys if (dict(k[1]).get("batch"), dict(k[1]).get("nheads")) == (rec["batch"], heads)]
    return keys[0] if len(keys) == 1 else None


def reconcile_figures(kpool: Pool) -> Callable[[dict, dict | None, dict], dict]:
    """pool()'s figures of a step record against the baseline's in its run: the measured step speedup, the SSD's
    share s of the baseline step, k isolated (from `kpool`) and in the step, and the Amdahl predictions of each."""

    def figures(rec: dict, base: dict | None, run: dict) -> dict[str, float | None]:
        b, x = (base or {}).get("median", {}), rec["median"]
        marks = has_ssd_marks(base or {}) and has_ssd_marks(rec)  # one source for both, or the subtraction
        b_ssd, x_ssd = ssd_ms(base or {}, marks), ssd_ms(rec, marks)
        if base is None or base is rec or not ratio(b_ssd, x_ssd):
            return {"measured": None}
        k_iso = {}
        clock = "gpu_over_base" if rec.get("compile_mode") in GRAPH_MODES else "wall_over_base"
        for mode in ("fwd_bwd", "fwd"):
            key = isolated_key(kpool, rec, mode)
            stat = kpool[key].get(label(rec), {}).get(clock) if key else None
            k_iso[mode] = stat.median if stat else None
        s, s_fwd = b_ssd / b["step_ms"], (b["ssd_forward_ms"] / b["step_ms"] if marks else None)
        k_in, k_in_fwd = b_ssd / x_ssd, ratio(b["ssd_forward_ms"], x["ssd_forward_ms"])
        measured = b["step_ms"] / x["step_ms"]
        predicted_iso = amdahl(s, k_iso["fwd_bwd"]) if k_iso["fwd_bwd"] else None
        return {
            "measured": measured,
            "ssd_share_base": s,
            "k_isolated_fwd_bwd": k_iso["fwd_bwd"],
            "predicted_from_isolated": predicted_iso,
            "measured_vs_isolated": measured / predicted_iso - 1 if predicted_iso else None,
            "k_in_step": k_in,
            "predicted_from_in_step": amdahl(s, k_in) if marks else None,  # by subtraction: = measured
            "ssd_fwd_share_base": s_fwd,
            "k_isolated_fwd": k_iso["fwd"],
            "k_in_step_fwd": k_in_fwd,
            "forward_only_prediction": amdahl(s_fwd, k_in_fwd) if k_in_fwd and s_fwd else None,
            "non_ssd_ms": x["step_ms"] - x_ssd,
            "non_ssd_ms_base": b["step_ms"] - b_ssd,
            "ssd_by_subtraction": float(not marks),
        }

    return figures


def has_ssd_marks(rec: dict) -> bool:
    """Whether a step record timed the SSD with its own CUDA events (eager steps do; compiled graphs carry none)."""
    return bool(rec.get("median", {}).get("ssd_forward_ms"))


def ssd_ms(rec: dict, marks: bool) -> float | None:
    """The SSD's time in a step: its own marks (eager steps) if `marks`, else the step minus the stand-in step."""
    m = rec.get("median", {})
    return m["ssd_forward_ms"] + m["ssd_backward_ms"] if marks else rec.get("ssd_ms_by_subtraction")


def reconcile(step_runs: list[dict], spool: Pool, kpool: Pool, base: str) -> list[dict]:
    """Amdahl predictions of each backend's step speedup over the baseline, one row per step shape and backend."""
    rows = []
    for key, by in pool(step_runs, step_key, reconcile_figures(kpool), base).items():
        for name, f in by.items():
            if f.get("measured"):
                size, seqlen, batch, mode = key
                row = {"size": size, "model": model_text(size, spool[key]), "seqlen": seqlen, "batch": batch}
                row |= {"mode": mode, "backend": name, "baseline": base}
                rows.append(row | {k: asdict(v) if v else None for k, v in f.items()})
    return rows


def ssd_source(row: dict) -> str:
    """Where a reconciliation row's SSD time came from: "marks" or "stand-in" (the subtraction)."""
    flag = row["ssd_by_subtraction"]
    return "stand-in" if flag and flag["median"] else "marks"


def reconcile_section(rec: list[dict], base: str, kpool: Pool) -> str:
    """The reconciliation table of `rec` (reconcile's rows), captioned; `kpool` names the lengths k isolated had."""

    def c(row: dict, k: str, fmt: Callable[[float], str] = num) -> str:
        return cell(Stat(**row[k]) if row[k] else None, fmt)

    rows = [
        [r["model"], str(r["seqlen"]), str(r["batch"]), r["mode"], r["backend"], ssd_source(r)]
        + [c(r, "ssd_share_base", pct)]
        + [c(r, k) for k in ("k_isolated_fwd_bwd", "predicted_from_isolated", "k_in_step", "predicted_from_in_step")]
        + [c(r, "measured"), c(r, "measured_vs_isolated", "{:+.0%}".format), c(r, "ssd_fwd_share_base", pct)]
        + [c(r, "k_in_step_fwd"), c(r, "forward_only_prediction")]
        for r in rec
    ]
    header = ["model", "L", "batch", "mode", "backend", "SSD time", f"SSD share ({base} step)", "k isolated fwd+bwd"]
    header += ["predicted", "k in step", "predicted", "measured", "measured vs isolated prediction"]
    header += ["SSD fwd share", "k fwd in step", "step speedup if only the forward changed"]
    lengths = ", ".join(map(str, sorted({dict(k[1]).get("seqlen") for k in kpool} - {None})))
    blank = [r for r in rec if not r["k_isolated_fwd_bwd"]]
    blank_text = (
        f" *k isolated* and its prediction are blank where the SSD-alone series has no single shape at the step's "
        f"L and SSD dimensions (among several, none with the step's batch and heads; it holds L {lengths}; the "
        "step rows: L " + ", ".join(map(str, ordered(r["seqlen"] for r in blank))) + ")."
        if blank
        else ""
    )
    return "\n".join(
        [
            "## Isolated speedup vs step speedup (Amdahl)",
            "",
            f"Speedups are the backend's over {base} (above 1: faster). s is the SSD's share of the {base} step; "
            "*k isolated* is the ratio from the SSD-alone benchmark at the same L and SSD dimensions, of wall "
            "clock, or of GPU time for steps replayed as CUDA graphs (compile modes reduce-overhead and "
            "max-autotune), whose launches cost the host nothing; "
            "*k in step* the ratio of the SSD's own time inside the step; predicted = 1 / ((1 - s) + s / k). "
            "*SSD time*: *marks*, the SSD's own CUDA events (eager steps); *stand-in*, the step's time minus the "
            "stand-in step's (compiled graphs carry no marks; used for both backends of a row unless both have "
            "marks), which leaves out the forward-only columns and the in-step prediction (it would equal the "
            "measured speedup by construction). "
            f"The last column is the step speedup had only the SSD forward changed (the backend's forward, "
            f"{base}'s backward)." + blank_text,
            "",
            table(header, rows) if rows else f"No step shape holds both {base} and another backend with SSD times.",
        ]
    )
