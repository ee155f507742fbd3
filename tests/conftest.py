"""Fixtures shared by the CPU training tests."""

from __future__ import annotations

import pytest

from tests.helpers import write_corpus


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A small deterministic text corpus, written once per test module."""
    return write_corpus(tmp_path_factory.mktemp("corpus"), n_files=16)
