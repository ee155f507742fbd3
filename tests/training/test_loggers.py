"""The run's loggers as wandb sees them: an offline run starts without warnings of ours."""

from __future__ import annotations

import pytest

from tests.helpers import run_script

pytest.importorskip("wandb")


def test_offline_wandb_run_starts_without_a_warning(tmp_path):
    """make_loggers' wandb run, started and finished in a process of its own (wandb.init leaves global state
    behind): wandb prints no WARNING line, the deprecated `anonymous` setting among them."""
    script = (
        "import sys\n"
        "from lightning_modules.loggers import LoggingConfig, make_loggers\n"
        "wandb_logger, csv_logger = make_loggers(LoggingConfig(), sys.argv[1])\n"
        "wandb_logger.log_metrics({'train/loss': 1.0}, step=0)\n"
        "wandb_logger.experiment.finish()\n"
    )
    done = run_script("-c", script, str(tmp_path), timeout=120)
    assert done.returncode == 0, done.stderr
    output = done.stdout + done.stderr
    assert "offline" in output, output  # wandb did speak: its run started offline
    assert [line for line in output.splitlines() if "WARNING" in line] == []
    assert list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
