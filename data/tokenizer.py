"""A byte-level BPE tokenizer trained on the training split, saved beside the data cache and reused."""

from __future__ import annotations

import functools
import hashlib
import sys
from collections.abc import Iterator
from pathlib import Path

import torch
from tokenizers import Tokenizer
from tokenizers.implementations import ByteLevelBPETokenizer

EOS = "<|endoftext|>"


def train_tokenizer(texts: Iterator[str], vocab_size: int, path: Path) -> Tokenizer:
    """Train byte-level BPE with `vocab_size` entries (EOS first) and save it to `path`."""
    bpe = ByteLevelBPETokenizer()
    # The Rust progress bar only draws on a terminal; elsewhere it prints blank lines.
    show_progress = sys.stderr.isatty()
    bpe.train_from_iterator(
        texts, vocab_size=vocab_size, min_frequency=2, special_tokens=[EOS], show_progress=show_progress
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    bpe.save(str(tmp))
    tmp.replace(path)
    return Tokenizer.from_file(str(path))


def file_digest(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


@functools.lru_cache(maxsize=4)
def load_tokenizer(path: str, digest: str) -> Tokenizer:
    """The tokenizer saved at `path`; `digest` keys the cache so a rewritten file is read again."""
    del digest
    return Tokenizer.from_file(path)


def encode_batch(batch: dict, tokenizer_path: str, tokenizer_digest: str) -> dict:
    """Dataset.map function: {"text": [...]} -> {"ids": [[..., EOS], ...]}. Module-level, so its hash is stable."""
    tok = load_tokenizer(tokenizer_path, tokenizer_digest)
    eos = tok.token_to_id(EOS)
    return {"ids": [enc.ids + [eos] for enc in tok.encode_batch(batch["text"])]}


def pack_batch(batch: dict, block: int) -> dict:
    """Dataset.map function: concatenate documents and cut them into blocks of `block` tokens.

    The tail shorter than a block is dropped; a batch holding less than one block gives no rows.
    """
    flat = [t for ids in batch["ids"] for t in ids]
    n = len(flat) // block
    return {"input_ids": [flat[i * block : (i + 1) * block] for i in range(n)]}


def document_ids(blocks: torch.Tensor, eos_id: int) -> torch.Tensor:
    """The document of every input token of packed blocks: (b, l + 1) token ids -> (b, l) int32 seq_idx.

    The inputs are blocks[:, :-1]. Each row counts from 0; the token after an EOS starts the next document (the EOS
    ends its own). Every document was encoded with an EOS at its end (`encode_batch`), so the count of EOS tokens
    before a token is its document.
    """
    ends = blocks[:, :-1] == eos_id
    return ends.cumsum(-1, dtype=torch.int32) - ends.int()


class PackedBatch:
    """DataLoader collate_fn: the blocks as {"input_ids": (b, l + 1)}, with {"seq_idx": (b, l) int32} (their
    documents, `document_ids`) when `eos_id` is given. A class, so worker processes can pickle it."""

    def __init__(self, eos_id: int | None):
        self.eos_id = eos_id

    def __call__(self, rows: list[dict]) -> dict[str, torch.Tensor]:
        blocks = torch.stack([row["input_ids"] for row in rows])
        if self.eos_id is None:
            return {"input_ids": blocks}
        return {"input_ids": blocks, "seq_idx": document_ids(blocks, self.eos_id)}
