"""The host-time probes that run on a CPU (launches replaced by no-ops) keep running as the launch path changes:
each is run as a user runs it and must report every stage it times."""

from __future__ import annotations

import re

from tests.helpers import run_script


def test_host_path_mock_enqueues_the_cutile_forward_and_backward():
    done = run_script("-m", "bench.probes.host_path", "--shapes", "tiny", "--mock", "--calls", "2", timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    line = re.search(r"cutile:cutile tiny .*: host (\d+) us a call, (\d+) launches mocked", done.stdout)
    assert line, done.stdout[-2000:]
    # forward: chunk_cumsum, fwd_pass_state, compute_out; backward: chunk_cumsum, the walks in one launch, bwd_dx,
    # bwd_dbc, chunk_cumsum_bwd
    assert int(line.group(1)) > 0 and int(line.group(2)) == 8
    assert "kernels/ (this project)" in done.stdout


def test_host_python_cpu_times_each_forward_stage():
    done = run_script("-m", "bench.probes.host_python_cpu", timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    for stage in ("chunk_cumsum", "fwd_pass_state", "compute_out", "torch.empty"):
        assert re.search(rf"^{re.escape(stage)} +\d+\.\d us a call$", done.stdout, re.M), done.stdout[-2000:]
