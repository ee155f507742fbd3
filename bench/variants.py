"""A variant file: a changed copy of one of this package's modules, loaded beside the original for the probes
(bench/probe_stage.py, probe_layer.py) and bench/kernel_resources.py."""

from __future__ import annotations

import sys
import types
from pathlib import Path


def load_variant(path: str, until: str | None = None) -> types.ModuleType:
    """The module in `path`, named probe_<file stem> and registered in sys.modules (dataclasses look their module
    up); with `until`, its source from the first occurrence of that text on is left out."""
    source = Path(path).read_text()
    cut = -1 if until is None else source.find(until)
    module = types.ModuleType(f"probe_{Path(path).stem}")
    module.__file__ = path
    sys.modules[module.__name__] = module
    exec(compile(source if cut < 0 else source[:cut], path, "exec"), module.__dict__)
    return module
