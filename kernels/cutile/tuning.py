"""Per-shape block sizes for the cuTile kernels, chosen by cuda.tile.tune.exhaustive_search and kept on disk.

One JSON file maps "kernel | shape key | GPU | cuda-tile version" to the winning configuration and the tune
space it was searched over (`space_id`): with tuning on, an entry searched over another space is searched again.
Writes are atomic (temporary file + rename), so DDP ranks on one machine can share the file; a rank
that finds a key already tuned reuses it instead of searching again.

Beside that cache, the package ships a table of configurations tuned on an H200 for the shapes of the shipped
configs and on an H100 for medium.yaml's step (tuned.json, the same keys and entries), read-only. A shape is
decided in this order: the local cache, the shipped table (for a key with document boundaries, "_seq_idx", with
tuning off also the same key without them), then a search (tuning on) or the kernel's fixed default (tuning off).
An entry is used only if its configuration is the default or inside today's tune space and, with tuning on, only if
it was searched over this very space.

Tuning is off by default and is turned on with `set_autotune(True)`; the model does that from the YAML key
`model.cutile_autotune`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import torch

log = logging.getLogger(__name__)
T = TypeVar("T")

SHIPPED = Path(__file__).with_name("tuned.json")

_state: dict[str, Any] = {
    "autotune": False,
    "path": None,
    "memory": None,
    "shipped_path": SHIPPED,
    "shipped": None,
    "chosen": {},
    "forced": {},
    "nth": None,
}


def cache_path() -> Path:
    """Where tuning results live: $XDG_CACHE_HOME/mamba2-cutile/tuning.json unless set_cache_path was called."""
    if _state["path"] is not None:
        return _state["path"]
    base = os.environ.get("XDG_CACHE_HOME", os.path.join(os.path.expanduser("~"), ".cache"))
    return Path(base) / "mamba2-cutile" / "tuning.json"


def set_cache_path(path: str | os.PathLike | None) -> None:
    """Keep tuning results in `path` (None: the default, cache_path()); forgets every choice made so far."""
    _state["path"] = None if path is None else Path(path)
    _state["memory"] = None
    _state["chosen"] = {}


def set_shipped_path(path: str | os.PathLike | None) -> None:
    """Read the shipped table from `path` (None: the package's own, SHIPPED; an empty file such as os.devnull: no
    table, every shape from the cache, a search or its default); forgets every choice made so far."""
    _state["shipped_path"] = SHIPPED if path is None else Path(path)
    _state["shipped"] = None
    _state["chosen"] = {}


def _read_table(path: Path, what: str) -> dict[str, dict]:
    """The JSON table at `path`: empty when there is none or the file is empty, or (with a warning naming `what`)
    when it is unreadable."""
    try:
        text = path.read_text() if path.exists() else ""
        return json.loads(text) if text.strip() else {}
    except (OSError, json.JSONDecodeError) as e:
        log.warning("ignoring unreadable %s %s: %s", what, path, e)
        return {}


def _shipped() -> dict[str, dict]:
    if _state["shipped"] is None:
        _state["shipped"] = _read_table(_state["shipped_path"], "table of tuned cuTile configurations")
    return _state["shipped"]


def set_autotune(enabled: bool) -> None:
    """Search block sizes on first sight of a shape (True) or use the fixed defaults (False)."""
    _state["autotune"] = bool(enabled)


def sweep_verbosely() -> None:
    """Tune on first sight of a shape and print every configuration's time (this module's log at INFO, on
    stderr): for probes that compare tune spaces."""
    logging.basicConfig(format="%(message)s")
    log.setLevel(logging.INFO)
    set_autotune(True)


def _load() -> dict[str, dict]:
    if _state["memory"] is None:
        _state["memory"] = _read_table(cache_path(), "cuTile tuning cache")
    return _state["memory"]


def _store(key: str, value: dict) -> None:
    path = cache_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    try:  # merge with what other processes wrote meanwhile
        on_disk = json.loads(path.read_text()) if path.exists() else {}
    except (OSError, json.JSONDecodeError):
        on_disk = {}
    on_disk.update(_load())
    on_disk[key] = value
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tuning-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(on_disk, f, indent=1, sort_keys=True)
    os.replace(tmp, path)
    _state["memory"] = on_disk


def space_id(candidates: Sequence[Any]) -> str:
    """A short hash naming a tune space (its configurations' reprs, in order), recorded with each tuned entry."""
    return hashlib.sha256(repr(list(candidates)).encode()).hexdigest()[:12]


def _gpu_key(device: torch.device) -> str:
    import cuda.tile

    name = torch.cuda.get_device_name(device).replace(" ", "_")
    return f"{name}|cuda-tile-{cuda.tile.__version__}"


def choose(
    kernel_name: str,
    shape_key: str,
    default: T,
    space: Callable[[], Sequence[T]],
    device: torch.device,
    spec: Callable[[T], tuple[tuple[int, ...], Any, tuple]],
) -> T:
    """The configuration to launch `kernel_name` with for this shape.

    Decided once per (kernel, shape, device, tuning on/off) in a process; later calls are a dict lookup.

    Args:
        default: used when tuning is off and nothing usable is cached.
        space: builds the candidates for exhaustive_search when tuning runs; a cached configuration is used only
            if it is the default or among them (one tuned by older code, outside today's space, is not) and, with
            tuning on, only if it was searched over this very space.
        spec: config -> (grid, kernel, args), the launch that tuning times.
    """
    if _state["nth"] is not None:  # precompiling: neither tuned nor remembered
        index, sizes = _state["nth"]
        candidates = list(space())
        sizes[kernel_name] = max(sizes.get(kernel_name, 0), len(candidates))
        return candidates[index] if index < len(candidates) else default
    pinned, launched = _state["forced"].get(kernel_name, (None, None))
    if pinned is not None:  # neither tuned nor remembered
        launched.append(pinned)
        return pinned
    memo_key = (kernel_name, shape_key, str(device), _state["autotune"])
    decided = _state["chosen"].get(memo_key)
    if decided is None:
        decided = _state["chosen"][memo_key] = _decide(kernel_name, shape_key, default, space, device, spec)
    if launched is not None:
        launched.append(decided[0])
    return decided[0]


def chosen() -> dict[str, dict[str, Any]]:
    """Every configuration decided in this process, for recording beside a measurement what it ran:
    "kernel|shape key" -> {"config": its fields, "source": "cache" | "shipped" | "search" | "default", "mean_us": the
    time tuning measured for it, where known}."""
    return {
        f"{name}|{key}": {"config": dataclasses.asdict(cfg), **info}
        for (name, key, _, _), (cfg, info) in _state["chosen"].items()
    }


@contextlib.contextmanager
def forced(kernel_name: str, config: Any = None) -> Iterator[list]:
    """Within the block, every launch of `kernel_name` runs `config`, with no tuning (None: what tuning chooses);
    yields the list of the configurations launched, in order (launches inside a nested block of the same
    kernel go to that block's list). For checking each configuration tuning can pick, and for probing the one
    a timing used."""
    previous = _state["forced"].get(kernel_name)
    launched: list = []
    _state["forced"][kernel_name] = (config, launched)
    try:
        yield launched
    finally:
        if previous is None:
            del _state["forced"][kernel_name]
        else:
            _state["forced"][kernel_name] = previous


@contextlib.contextmanager
def precompiling(index: int) -> Iterator[dict[str, int]]:
    """Within the block, every launch runs the `index`-th configuration of its kernel's tune space (its default
    past the space's end), with no tuning and nothing remembered: for compiling the candidates tuning will time
    in parallel processes ahead of it (bench/precompile.py; cuTile's compile cache is on disk). Yields kernel
    name -> the size of its tune space, filled in as launches happen."""
    if index < 0:
        raise ValueError(f"precompiling: index must be >= 0, got {index}")
    previous = _state["nth"]
    sizes: dict[str, int] = {}
    _state["nth"] = (index, sizes)
    try:
        yield sizes
    finally:
        _state["nth"] = previous


def _decide(kernel_name, shape_key, default, space, device, spec):
    key = f"{kernel_name}|{shape_key}|{_gpu_key(device)}"
    fields = {f.name for f in dataclasses.fields(default)}
    candidates = list(space()) if _state["autotune"] else []
    sources = [("cache", _load().get(key)), ("shipped", _shipped().get(key))]
    if "_seq_idx" in shape_key and not candidates:  # tuning off, a build with document boundaries borrows its
        # shape's shipped entry without them; tuning on, it is searched: its masks take registers, and the entry
        # without them can spill (bwd_dbc at medium's step: 24 -> 640 bytes of stack, 2.5x the time)
        sources.append(("shipped", _shipped().get(key.replace("_seq_idx", ""))))
    for source, entry in sources:
        if entry is None or not set(entry["config"]) <= fields:  # an entry of another config layout: not used
            continue
        config = type(default)(**entry["config"])
        # one outside today's tune space (older code) is not used; nor, with tuning on, one searched over another
        # space (a space that grew, or an entry from before the space was recorded)
        searched_here = not candidates or entry.get("space") == space_id(candidates)
        if (config == default or config in (candidates or space())) and searched_here:
            return config, {"source": source, "mean_us": entry.get("mean_us")}
    if len(candidates) <= 1:
        return default, {"source": "default", "mean_us": None}
    from cuda.tile.tune import exhaustive_search

    start = time.perf_counter()
    log.warning(
        "cuTile: tuning %s for %s over %d configurations (once per shape)", kernel_name, shape_key, len(candidates)
    )
    result = exhaustive_search(
        candidates,
        torch.cuda.current_stream(device),
        grid_fn=lambda cfg: spec(cfg)[0],
        kernel=lambda cfg: spec(cfg)[1],
        args_fn=lambda cfg: spec(cfg)[2],
        quiet=True,
    )
    best = result.best.config
    seconds = time.perf_counter() - start
    log.warning(
        "cuTile: %s best %s at %.1f us (%d ok, %d failed, %.1f s)",
        kernel_name,
        best,
        result.best.mean_us,
        len(result.successes),
        len(result.failures),
        seconds,
    )
    log.info("cuTile: %s on %s, every configuration: %s", kernel_name, shape_key, result.summary(top_k=len(candidates)))
    entry = {"config": dataclasses.asdict(best), "mean_us": result.best.mean_us, "tuned_s": seconds}
    _store(key, {**entry, "space": space_id(candidates)})
    return best, {"source": "search", "mean_us": result.best.mean_us}
