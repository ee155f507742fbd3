"""Fixtures shared by the CPU training tests, and the session's end."""

from __future__ import annotations

import pytest

from lightning_modules.language_model import release_compiled_graphs
from tests.helpers import write_corpus


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A small deterministic text corpus, written once per test module."""
    return write_corpus(tmp_path_factory.mktemp("corpus"), n_files=16)


def pytest_sessionfinish(session, exitstatus):
    """Free compiled code and CUDA graphs before interpreter teardown (see release_compiled_graphs)."""
    release_compiled_graphs()
