"""The datamodule on temporary corpora: split, tokenizer, packing, caching, sampler, clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer

from data.corpus import load_corpus, stdlib_files
from data.datamodule import ResumableSampler, TextDataModule
from data.tokenizer import EOS, document_ids
from tests.helpers import TINY_DATA, write_corpus


def build(tmp_path, corpus, **kw):
    args = dict(
        corpus=str(corpus),
        vocab_size=300,
        seq_len=32,
        batch_size=4,
        val_fraction=0.25,
        cache_dir=str(tmp_path / "cache"),
    )
    dm = TextDataModule(**{**args, **kw})
    dm.prepare_data()
    dm.setup("fit")
    return dm


def test_text_corpus_to_packed_blocks(tmp_path):
    corpus = write_corpus(tmp_path / "corpus", n_files=8)
    dm = build(tmp_path, corpus)
    assert len(dm.train_set) > 0 and len(dm.val_set) > 0
    row = dm.train_set[0]["input_ids"]
    assert row.shape == (33,) and not row.is_floating_point()
    tok = Tokenizer.from_file(str(dm.tokenizer_path))
    assert tok.get_vocab_size() <= 300
    assert int(dm.train_set[:]["input_ids"].max()) < 300
    text = tok.decode(row.tolist())
    assert "def function_" in text or "return value" in text


def test_tokenizer_round_trip(tmp_path):
    dm = build(tmp_path, write_corpus(tmp_path / "corpus", n_files=6))
    tok = Tokenizer.from_file(str(dm.tokenizer_path))
    for sample in ["def f(x):\n    return x * 2  # ünïcode ✓\n", "    \t\n", "x = {'a': [1, 2]}"]:
        assert tok.decode(tok.encode(sample).ids) == sample


def test_split_is_deterministic_and_cached(tmp_path, monkeypatch):
    """A second build of the same corpus and settings trains no tokenizer and reads the tokenized blocks from the
    first build's cache files; another seed gives another split."""
    import data.datamodule

    corpus = write_corpus(tmp_path / "corpus", n_files=10)
    a = build(tmp_path, corpus)
    trained = []
    monkeypatch.setattr(data.datamodule, "train_tokenizer", lambda *args: trained.append(args))
    b = build(tmp_path, corpus)
    assert trained == []  # the tokenizer came from the cache
    assert [f["filename"] for f in b.train_set.cache_files] == [f["filename"] for f in a.train_set.cache_files]
    assert torch.equal(a.train_set[:]["input_ids"], b.train_set[:]["input_ids"])
    assert torch.equal(a.val_set[:]["input_ids"], b.val_set[:]["input_ids"])
    assert a.tokenizer_path == b.tokenizer_path
    monkeypatch.undo()
    c = build(tmp_path, corpus, seed=7)  # another seed, another split
    assert c.tokenizer_path != a.tokenizer_path
    ids_a, ids_c = a.val_set[:]["input_ids"], c.val_set[:]["input_ids"]
    assert ids_a.shape != ids_c.shape or not torch.equal(ids_a, ids_c)


def test_jsonl_and_parquet(tmp_path):
    rows = [{"content": f"record {i}: " + "tokens and more tokens " * 20} for i in range(20)]
    jsonl = tmp_path / "d.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in rows))
    dm = build(tmp_path, jsonl, text_field="content")
    assert len(dm.train_set) > 0
    with pytest.raises(ValueError, match="no column 'text'"):
        build(tmp_path, jsonl)
    import datasets

    parquet = tmp_path / "d.parquet"
    datasets.Dataset.from_list(rows).to_parquet(str(parquet))
    assert len(build(tmp_path, parquet, text_field="content").train_set) > 0


def test_stdlib_default_corpus_is_there():
    files = stdlib_files()
    assert len(files) > 100 and all(f.endswith(".py") for f in files)
    assert not any("/test/" in f or "site-packages" in f for f in files)
    ds = load_corpus("stdlib")  # a document per file, the empty ones dropped
    non_empty = sum(1 for f in files if Path(f).read_bytes().strip())
    assert len(ds) == non_empty and all(row["text"].strip() for row in ds.select(range(20)))


def test_missing_path_is_named_when_the_datamodule_is_made(tmp_path):
    """A corpus path is checked by the constructor, before any data is read or cached."""
    with pytest.raises(FileNotFoundError, match="does-not-exist"):
        TextDataModule(corpus=str(tmp_path / "does-not-exist"), cache_dir=str(tmp_path / "cache"))
    (tmp_path / "empty_dir").mkdir()
    with pytest.raises(FileNotFoundError, match=r"empty_dir.*holds no"):
        TextDataModule(corpus=str(tmp_path / "empty_dir"), cache_dir=str(tmp_path / "cache"))
    assert not (tmp_path / "cache").exists()


def test_a_glob_reads_the_files_it_matches_not_directories(tmp_path):
    corpus = write_corpus(tmp_path / "corpus", n_files=3)
    (corpus / "notes.text").write_text("plain prose in a .text file")
    (corpus / "package").mkdir()  # matched by the glob below: once ended in "Unable to find"
    (corpus / "package" / "inner.py").write_text("x = 1")
    ds = load_corpus(f"{corpus}/*")
    assert len(ds) == 4 and "plain prose in a .text file" in ds["text"]


def test_a_file_of_another_kind_is_refused_by_name(tmp_path):
    image = tmp_path / "picture.png"
    image.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)))
    allowed = r"\.json, \.jsonl, \.md, \.parquet, \.py, \.rst, \.text, \.txt"
    with pytest.raises(ValueError, match=rf"picture\.png.*suffix \.png.*{allowed}"):
        load_corpus(str(image))
    corpus = write_corpus(tmp_path / "corpus", n_files=2)
    (corpus / "README").write_text("no suffix")
    with pytest.raises(ValueError, match=r"README.*suffix none"):
        load_corpus(f"{corpus}/*")
    assert len(load_corpus(str(corpus))) == 2  # a directory skips what it cannot read


def test_empty_corpus_is_named(tmp_path):
    d = tmp_path / "blank"
    d.mkdir()
    for i in range(3):
        (d / f"{i}.txt").write_text("  \n\n ")
    with pytest.raises(ValueError, match=r"blank.*is empty"):
        build(tmp_path, d)


def test_too_little_validation_text(tmp_path):
    corpus = write_corpus(tmp_path / "corpus", n_files=4, lines=2)
    with pytest.raises(ValueError, match="fewer than seq_len"):
        build(tmp_path, corpus, seq_len=2000)


def test_bad_settings():
    with pytest.raises(ValueError, match="val_fraction"):
        TextDataModule(val_fraction=1.5)
    with pytest.raises(ValueError, match="vocab_size must be at least 257"):
        TextDataModule(vocab_size=100)


def test_resumable_sampler_continues_where_it_stopped():
    data = list(range(103))
    consumed = {"n": 0}
    full = list(ResumableSampler(data, 1, 0, seed=3, batch_size=8, consumed=lambda: consumed["n"]))
    assert len(full) == 96 and len(set(full)) == 96  # whole batches only, no repeats
    consumed["n"] = 40
    assert list(ResumableSampler(data, 1, 0, seed=3, batch_size=8, consumed=lambda: consumed["n"])) == full[40:]
    consumed["n"] = 96  # next epoch: a new permutation
    nxt = list(ResumableSampler(data, 1, 0, seed=3, batch_size=8, consumed=lambda: consumed["n"]))
    assert len(nxt) == 96 and nxt != full
    ranks = [set(ResumableSampler(data, 2, r, seed=3, batch_size=8)) for r in (0, 1)]
    assert not ranks[0] & ranks[1]


def test_checkpoint_with_another_tokenizer_is_refused(tmp_path):
    a = build(tmp_path / "a", write_corpus(tmp_path / "corpus_a", n_files=6))
    b = build(tmp_path / "b", write_corpus(tmp_path / "corpus_b", n_files=9, lines=40))
    a.load_state_dict(a.state_dict())  # its own tokenizer: accepted
    with pytest.raises(ValueError, match="another tokenizer"):
        a.load_state_dict(b.state_dict())


def test_document_ids_count_the_eos_before_each_input_token():
    eos = 0
    blocks = torch.tensor([[5, 0, 7, 8, 0, 0, 9, 4], [0, 3, 3, 3, 3, 3, 3, 0]])
    expected = torch.tensor([[0, 0, 1, 1, 1, 2, 3], [0, 1, 1, 1, 1, 1, 1]], dtype=torch.int32)
    assert torch.equal(document_ids(blocks, eos), expected)  # the last token (a target only) has no id


@pytest.mark.parametrize("boundaries", [True, False])
def test_batches_carry_the_documents_of_their_tokens(corpus, data_cache, boundaries):
    dm = TextDataModule(corpus=str(corpus), cache_dir=str(data_cache), **TINY_DATA, document_boundaries=boundaries)
    dm.prepare_data()
    dm.setup("fit")
    eos = Tokenizer.from_file(str(dm.tokenizer_path)).token_to_id(EOS)
    for loader in (dm.train_dataloader(), dm.val_dataloader()):
        boundaries_seen = 0
        for batch in loader:
            if not boundaries:
                assert set(batch) == {"input_ids"}
                continue
            blocks, seq_idx = batch["input_ids"], batch["seq_idx"]
            assert seq_idx.dtype == torch.int32 and seq_idx.shape == (blocks.shape[0], blocks.shape[1] - 1)
            assert (seq_idx[:, 0] == 0).all() and (seq_idx.diff(dim=1) >= 0).all()
            starts = seq_idx.diff(dim=1) == 1  # a new document starts exactly after each EOS of the inputs
            assert torch.equal(starts, blocks[:, :-2] == eos)
            boundaries_seen += int(starts.sum())
        assert boundaries_seen > 0 or not boundaries  # the packed rows do hold several documents
