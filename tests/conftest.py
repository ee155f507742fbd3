"""Fixtures shared by the CPU tests, built once a session, and the session's end."""

from __future__ import annotations

import pytest

from lightning_modules.language_model import release_compiled_graphs
from tests.helpers import TINY_DATA, write_corpus


@pytest.fixture(scope="session")
def corpus(tmp_path_factory):
    """A small deterministic text corpus, written once per session. Tests only read it."""
    return write_corpus(tmp_path_factory.mktemp("corpus"), n_files=16)


@pytest.fixture(scope="session")
def data_cache(tmp_path_factory, corpus):
    """A data cache holding `corpus` tokenized as tiny_args' runs read it (tokenizer and packed blocks), built once
    per session: pass it to tiny_args(..., cache_dir=data_cache) and a run skips the building."""
    from data.datamodule import TextDataModule  # here: a session that needs no data does not import datasets

    cache = tmp_path_factory.mktemp("data_cache")
    TextDataModule(corpus=str(corpus), cache_dir=str(cache), **TINY_DATA).prepare_data()
    return cache


def pytest_sessionfinish(session, exitstatus):
    """Free compiled code and CUDA graphs before interpreter teardown (see release_compiled_graphs)."""
    release_compiled_graphs()
