"""bench.documents: packed document ids for the boundaries variants, shaped as the datamodule emits them."""

from __future__ import annotations

import pytest
import torch

from bench.documents import SHORT, document_lengths, packed_seq_idx


@pytest.mark.parametrize("kind", ["stdlib", "short"])
def test_rows_count_their_documents_from_zero_and_cut_where_lengths_say(kind):
    seq_idx = packed_seq_idx(kind, 4, 2048, seed=3)
    assert seq_idx.shape == (4, 2048) and seq_idx.dtype == torch.int32
    assert (seq_idx[:, 0] == 0).all() and (seq_idx.diff(dim=1) >= 0).all() and (seq_idx.diff(dim=1) <= 1).all()
    lengths = document_lengths(kind, 4 * 2048, seed=3)
    starts = torch.tensor(lengths).cumsum(0)[:-1]
    flat_starts = torch.zeros(4 * 2048, dtype=torch.bool)
    flat_starts[starts[starts < 4 * 2048]] = True
    within_rows = flat_starts.reshape(4, 2048)[:, 1:]  # a document starting on a row's first token shows as 0 there
    assert torch.equal(seq_idx.diff(dim=1) == 1, within_rows)
    if kind == "short":
        assert all(SHORT[0] <= n <= SHORT[1] for n in lengths) and int(seq_idx[:, -1].min()) >= 2048 // SHORT[1] - 1
    assert torch.equal(seq_idx, packed_seq_idx(kind, 4, 2048, seed=3))  # seeded


def test_none_is_no_seq_idx_and_an_unknown_kind_is_refused():
    assert packed_seq_idx("none", 2, 64) is None
    with pytest.raises(ValueError, match="documents must be one of none, stdlib, short"):
        packed_seq_idx("long", 2, 64)
