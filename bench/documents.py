"""Packed documents for the benchmarks' boundaries variants: seq_idx (b, l) as the datamodule would emit it.

    none    no seq_idx: one document per row (the variant without boundaries)
    stdlib  document lengths of the stdlib corpus (train.py's default data): each standard-library .py file's size
            in bytes over BYTES_PER_TOKEN, in a seeded random order
    short   the stress case: many documents of 64-256 tokens (uniform)

Documents are concatenated and cut into rows of l tokens, as the datamodule packs them (data.tokenizer.pack_batch),
so a document may run from one row into the next; each row counts its documents from 0 (data.tokenizer.document_ids).
"""

from __future__ import annotations

import functools
import os
import random

import torch

from data.corpus import stdlib_files

DOCUMENTS = ("none", "stdlib", "short")
# bytes per token of configs/medium.yaml's byte-level BPE (16384 entries) trained on and encoding the whole stdlib
# corpus (CPython 3.11's: 734 files, 3.02M tokens): 4.01
BYTES_PER_TOKEN = 4.0
SHORT = (64, 256)


@functools.cache
def stdlib_lengths() -> tuple[int, ...]:
    """Token lengths of the stdlib corpus's documents (at least 1 each), in file order."""
    return tuple(max(1, round(os.path.getsize(f) / BYTES_PER_TOKEN)) for f in stdlib_files())


def document_lengths(kind: str, tokens: int, seed: int = 0) -> list[int]:
    """Lengths of whole documents of `kind` ("stdlib" or "short") adding up to at least `tokens`."""
    rng = random.Random(seed)
    if kind == "stdlib":
        pool = list(stdlib_lengths())
        rng.shuffle(pool)
        draw = iter(pool * (1 + tokens // max(1, sum(pool))))
        pick = lambda: next(draw)
    elif kind == "short":
        pick = lambda: rng.randint(*SHORT)
    else:
        raise ValueError(f"documents must be one of {', '.join(DOCUMENTS)}, got {kind!r}")
    lengths: list[int] = []
    while sum(lengths) < tokens:
        lengths.append(pick())
    return lengths


def packed_seq_idx(kind: str, batch: int, seqlen: int, device: torch.device | str = "cpu", seed: int = 0):
    """seq_idx (batch, seqlen) int32 of documents of `kind` packed into rows, or None for "none"."""
    if kind == "none":
        return None
    return packed(document_lengths(kind, batch * seqlen, seed), batch, seqlen, device)


def packed(lengths: list[int], batch: int, seqlen: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """seq_idx (batch, seqlen) int32 of documents of `lengths` (adding up to at least batch * seqlen tokens) packed
    into rows, each row counting its documents from 0."""
    doc = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))[: batch * seqlen]
    rows = doc.reshape(batch, seqlen)
    return (rows - rows[:, :1]).to(device=device, dtype=torch.int32)
