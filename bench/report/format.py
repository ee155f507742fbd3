"""Figures across runs and how the report writes them: Stat (median [min–max]), number formats, tables."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Stat:
    """One figure across runs."""

    median: float
    min: float
    max: float
    n: int

    @classmethod
    def of(cls, values: Iterable[float | None]) -> Stat | None:
        """The median, min and max of the finite values; None when there are none."""
        vs = [float(v) for v in values if v is not None and math.isfinite(v)]
        return cls(statistics.median(vs), min(vs), max(vs), len(vs)) if vs else None

    def cell(self, fmt: Callable[[float], str]) -> str:
        return fmt(self.median) if self.n == 1 else f"{fmt(self.median)} [{fmt(self.min)}–{fmt(self.max)}]"


def num(v: float) -> str:
    """A time or size: three decimals below 10, one above."""
    return f"{v:,.3f}" if abs(v) < 10 else f"{v:,.1f}"


def pct(v: float) -> str:
    """A fraction as a whole percentage: 0.123 -> "12%"."""
    return f"{100 * v:.0f}%"


def pct1(v: float) -> str:
    """A fraction as a percentage to one decimal: 0.123 -> "12.3%"."""
    return f"{100 * v:.1f}%"


def times(v: float) -> str:
    """A speedup: 1.234 -> "1.23x"."""
    return f"{v:.2f}x"


def cell(stat: Stat | None, fmt: Callable[[float], str] = num) -> str:
    """A table cell: the median, with [min–max] over several runs; empty without a figure."""
    return "" if stat is None else stat.cell(fmt)


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b, or None when either is missing, zero or not finite."""
    ok = a is not None and b is not None and math.isfinite(a) and math.isfinite(b) and a > 0 and b > 0
    return a / b if ok else None


def table(header: list[str], rows: list[list[str]]) -> str:
    """A Markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def ordered(values: Iterable) -> list:
    """The distinct values, in first-seen order."""
    return list(dict.fromkeys(values))


def setting(value) -> str:
    """A benchmark setting as text: a list comma-separated."""
    return ",".join(map(str, value)) if isinstance(value, list) else str(value)


def runs_text(runs: list[dict]) -> str:
    """How many runs, as text: "1 run", "3 runs"."""
    return f"{len(runs)} run" + "s" * (len(runs) > 1)
