"""Where the text comes from: the embedded default, local files, or a hub dataset, as a `datasets.Dataset`.

    corpus: stdlib                 the running Python's standard library sources (every machine has them)
    corpus: path/to/dir_or_file    .txt .text .md .py .rst (text) | .jsonl .json | .parquet, a directory, or a glob
    corpus: hub:owner/name[:config]   a Hugging Face hub dataset (needs network)

Every source becomes one dataset with a single "text" column, one row per document. A directory contributes
its files with these suffixes and skips the others; a file or a glob's files with another suffix are refused.
"""

from __future__ import annotations

import glob
import os
import sysconfig
from pathlib import Path

import datasets

TEXT_SUFFIXES = {".txt", ".md", ".py", ".rst", ".text"}
JSON_SUFFIXES = {".jsonl", ".json"}
PARQUET_SUFFIXES = {".parquet"}
SUFFIXES = TEXT_SUFFIXES | JSON_SUFFIXES | PARQUET_SUFFIXES
STDLIB_SKIP = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}


def stdlib_files() -> list[str]:
    """The .py files of this interpreter's standard library, test suites left out, sorted."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = [str(p) for p in root.rglob("*.py") if not STDLIB_SKIP.intersection(p.relative_to(root).parts[:-1])]
    if not files:
        raise FileNotFoundError(f"no Python standard library sources found under {root}")
    return sorted(files)


def local_files(spec: str) -> list[str]:
    """Files named by a path, a directory (searched recursively) or a glob (its files; directories it matches
    are not searched); raises naming what is missing, or the first file whose suffix is not in SUFFIXES."""
    if any(ch in spec for ch in "*?["):
        files = sorted(f for f in glob.glob(spec, recursive=True) if os.path.isfile(f))
        if not files:
            raise FileNotFoundError(f"corpus glob {spec!r} matches no files")
    elif os.path.isdir(spec):
        files = sorted(str(p) for p in Path(spec).rglob("*") if p.is_file() and p.suffix in SUFFIXES)
        if not files:
            raise FileNotFoundError(f"corpus directory {spec!r} holds no {', '.join(sorted(SUFFIXES))} files")
    elif os.path.isfile(spec):
        files = [spec]
    else:
        raise FileNotFoundError(f"corpus path {spec!r} does not exist")
    for f in files:
        if Path(f).suffix not in SUFFIXES:
            raise ValueError(
                f"corpus file {f!r} is not one the corpus reads (suffix {Path(f).suffix or 'none'}); "
                f"give files ending in {', '.join(sorted(SUFFIXES))}"
            )
    return [os.path.abspath(f) for f in files]


def _builder(files: list[str]) -> str:
    kinds = set()
    for f in files:
        suffix = Path(f).suffix
        if suffix in JSON_SUFFIXES:
            kinds.add("json")
        elif suffix in PARQUET_SUFFIXES:
            kinds.add("parquet")
        else:
            kinds.add("text")
    if len(kinds) > 1:
        raise ValueError(f"corpus mixes file kinds {sorted(kinds)}; name one kind of file (text, jsonl or parquet)")
    return kinds.pop()


def load_corpus(spec: str, text_field: str = "text", sample_by: str = "document", cache_dir: str | None = None):
    """The corpus as a Dataset with one "text" column.

    Args:
        spec: "stdlib", a local path/directory/glob, or "hub:owner/name[:config]".
        text_field: column holding the text in jsonl/parquet/hub data.
        sample_by: for text files, what one row is: "document" (a whole file), "paragraph" or "line".
    """
    if spec.startswith("hub:"):
        name, _, config = spec[4:].partition(":")
        ds = datasets.load_dataset(name, config or None, split="train", cache_dir=cache_dir)
    else:
        files = stdlib_files() if spec == "stdlib" else local_files(spec)
        builder = _builder(files)
        kwargs = {"sample_by": sample_by} if builder == "text" else {}
        ds = datasets.load_dataset(builder, data_files=files, split="train", cache_dir=cache_dir, **kwargs)
    if text_field not in ds.column_names:
        raise ValueError(f"corpus {spec!r} has no column {text_field!r}; its columns: {ds.column_names}")
    if text_field != "text":
        ds = ds.rename_column(text_field, "text")
    ds = ds.select_columns(["text"]).filter(_non_empty, desc="dropping empty documents")
    if len(ds) == 0:
        raise ValueError(f"corpus {spec!r} is empty: no document holds any text")
    return ds


def _non_empty(row: dict) -> bool:
    return bool(row["text"] and row["text"].strip())
