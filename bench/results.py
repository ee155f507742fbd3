"""The JSON file a measurement writes: its settings, environment and records, in one place; and which of the
backends asked for it could measure (the others are recorded as skipped, with why)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import kernels

# A training-step row's cuTile layers: its label's suffix (bench_step's variants, "triton+conv+norm") -> the
# model.config field that the suffix sets to "cutile" (the report reads the row's layers back from those fields).
STEP_LAYERS = {"conv": "conv_backend", "norm": "norm_backend"}


# Significant digits a float keeps in a results file: timings carry at most four (a microsecond of a millisecond
# kernel), so seven lose nothing a report shows (a token a second at most) and keep committed series small.
SIGNIFICANT_DIGITS = 7


def rounded(value: Any) -> Any:
    """`value` with every float (in nested dicts and lists) rounded to SIGNIFICANT_DIGITS significant digits."""
    if isinstance(value, float):
        return float(f"{value:.{SIGNIFICANT_DIGITS}g}")
    if isinstance(value, dict):
        return {key: rounded(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [rounded(item) for item in value]
    return value


def write_json(path: str | Path, payload: dict[str, Any] | list[Any]) -> Path:
    """Write `payload` as compact JSON (one line) to `path` (parents created), floats `rounded`; values JSON lacks
    become strings. Every results file is written here (bench.report's reconciliation.json too)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rounded(payload), separators=(",", ":"), default=str) + "\n")
    return path


def backward_records(records: list[dict]) -> list[dict]:
    """The backward alone, by subtraction within one process: a record of mode "bwd" for each forward + backward
    record with a forward record of its backend at its shape, the one of its own backward where there are several
    (the forward does not depend on the backward; bench_kernels times it once per backend)."""
    forward: dict[tuple, list[dict]] = {}
    for rec in records:
        if rec["mode"] == "fwd" and "error" not in rec:
            forward.setdefault((rec["backend"], json.dumps(rec["shape"], sort_keys=True)), []).append(rec)
    out = []
    for rec in records:
        found = forward.get((rec["backend"], json.dumps(rec["shape"], sort_keys=True)), [])
        found = [f for f in found if f.get("backward") == rec.get("backward")] if len(found) > 1 else found
        if rec["mode"] != "fwd_bwd" or "error" in rec or len(found) != 1:
            continue
        (fwd,) = found
        gpu = rec.get("gpu_ms") - fwd["gpu_ms"] if None not in (rec.get("gpu_ms"), fwd.get("gpu_ms")) else None
        launches = [r.get("kernels_per_call") for r in (rec, fwd)]
        out.append(
            {
                **{k: rec[k] for k in ("backend", "backward", "shape") if k in rec},
                "mode": "bwd",
                "gpu_ms": gpu,
                "wall_ms": {"median": rec["wall_ms"]["median"] - fwd["wall_ms"]["median"]},
                "kernels_per_call": launches[0] - launches[1] if None not in launches else None,
            }
        )
    return out


def available_backends(names: str, device: str) -> tuple[list[str], dict[str, str]]:
    """Split comma-separated SSD backend names into (those that run on `device`, {skipped: why}), saying why."""
    ok, skipped = [], {}
    for name in names.split(","):
        reason = kernels.unavailable_reason(name, device)
        if reason is None:
            ok.append(name)
        else:
            skipped[name] = reason
            print(f"skipping backend {name}: {reason}", flush=True)
    return ok, skipped
