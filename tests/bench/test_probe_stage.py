"""bench.probe_stage's document boundaries, on a CPU: what it refuses, and the seq_idx it adds to a stage's call."""

from __future__ import annotations

import importlib
import inspect

import pytest
import torch

from bench import probe_stage


def test_documents_only_for_the_stages_that_mask_and_refused_in_one_line(capsys):
    with pytest.raises(SystemExit) as exit_info:
        probe_stage.main(["chunk_cumsum", "--documents", "short"])
    assert exit_info.value.code == 2
    assert (
        capsys.readouterr()
        .err.strip()
        .splitlines()[-1]
        .endswith(
            "--documents applies to the stages that mask by document: "
            "fwd_pass_state, compute_out, bwd_pass_state, bwd_dx, bwd_dbc, not chunk_cumsum"
        )
    )
    for stage in probe_stage.MASKING:  # each takes seq_idx right after the arguments the probe passes
        names = probe_stage.STAGES[stage][1]
        host = getattr(importlib.import_module(f"kernels.cutile.{stage}"), stage)
        for fn in (probe_stage.STAGES[stage][0], host):
            params = list(inspect.signature(fn).parameters)
            assert params[len(names)] == "seq_idx", (stage, fn)


def test_documents_pack_the_rows_of_the_inputs():
    t = {"x": torch.zeros(3, 700, 2, 4)}
    assert probe_stage.documents(t, "none") == []
    (ids,) = probe_stage.documents(t, "short")
    assert ids.shape == (3, 700) and ids.dtype == torch.int32
    steps = ids[:, 1:] - ids[:, :-1]
    assert bool(((steps == 0) | (steps == 1)).all()) and int(steps.sum()) >= 3 * 700 // 256 - 3  # many documents
