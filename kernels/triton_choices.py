"""mamba_ssm's Triton autotune choices, shipped per GPU so the triton backend's first step does not tune.

mamba_ssm's SSD kernels are `triton.autotune`d: the first call at a new key (chunk size, dims, dtypes) compiles and
times every candidate configuration, which on an H200 keeps medium.yaml's first step waiting for minutes. The
autotuner keeps its answer in `cache` (key tuple -> one of its `configs`); this module writes those answers to a
table and puts them back, so a later process compiles the chosen configuration only, with no timing:

    table = {gpu_name: {"versions": {...}, "kernels": {"module.kernel": [[key, config_index], ...]}}}

The table is kernels/triton_tuned.json, recorded on the GPU it names by `python -m bench.triton_table`. It is used
only where the GPU name and the versions of triton and mamba_ssm match the ones it was recorded with; any key it
lacks is tuned as usual. Works on any object with triton's Autotuner's `cache` and `configs`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

SHIPPED = Path(__file__).with_name("triton_tuned.json")
Rows = list[list[Any]]  # [[key as a list, index into the autotuner's configs], ...]


def recorded(tuners: Mapping[str, Any]) -> dict[str, Rows]:
    """The choices `tuners` (name -> Autotuner) have made in this process, as table rows."""
    return {
        name: [[list(key), tuner.configs.index(config)] for key, config in tuner.cache.items()]
        for name, tuner in sorted(tuners.items())
        if tuner.cache
    }


def seed(tuners: Mapping[str, Any], kernels: Mapping[str, Rows]) -> int:
    """Put the recorded choices into the autotuners' caches (keys already decided are left alone).

    Returns:
        the number of choices put in; rows for an unknown kernel or a config index out of range are skipped.
    """
    count = 0
    for name, rows in kernels.items():
        tuner = tuners.get(name)
        if tuner is None:
            continue
        for key, index in rows:
            if 0 <= index < len(tuner.configs) and tuple(key) not in tuner.cache:
                tuner.cache[tuple(key)] = tuner.configs[index]
                count += 1
    return count


def read(path: Path, gpu: str, versions: Mapping[str, str]) -> dict[str, Rows]:
    """The kernels' rows the table at `path` holds for `gpu` at these versions ({} when it has none)."""
    if not path.is_file():
        return {}
    entry = json.loads(path.read_text()).get(gpu)
    if entry is None or entry.get("versions") != dict(versions):
        return {}
    return entry["kernels"]


def write(path: Path, gpu: str, versions: Mapping[str, str], kernels: Mapping[str, Rows]) -> None:
    """Store `kernels` as the table's entry for `gpu` (other GPUs' entries are kept)."""
    table = json.loads(path.read_text()) if path.is_file() else {}
    table[gpu] = {"versions": dict(versions), "kernels": dict(kernels)}
    path.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
