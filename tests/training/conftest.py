"""The training tests' process: one intra-op thread, as in the runs they start as subprocesses."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="package", autouse=True)
def one_thread():
    """The models trained here are tiny: on a machine of few cores, more threads only wait on each other, the more
    so while other processes run. Subprocesses get OMP_NUM_THREADS=1 (tests.helpers.subprocess_env); this process
    gets the same while these tests run."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
