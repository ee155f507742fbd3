"""The JSON file a measurement writes: its settings, environment and records, in one place."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# A training-step row's cuTile layers: its label's suffix (bench_step's variants, "triton+conv+norm") -> the
# model.config field that the suffix sets to "cutile" (the report reads the row's layers back from those fields).
STEP_LAYERS = {"conv": "conv_backend", "norm": "norm_backend"}


def write_json(path: str | Path, payload: dict[str, Any]) -> Path:
    """Write `payload` as compact JSON (one line) to `path` (parents created); values JSON lacks become strings."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, separators=(",", ":"), default=str) + "\n")
    return path
