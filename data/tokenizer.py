"""A byte-level BPE tokenizer trained on the training split, saved beside the data cache and reused."""

from __future__ import annotations

import functools
import hashlib
import sys
from collections.abc import Iterator
from pathlib import Path

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
