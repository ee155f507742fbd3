"""The first step a user waits for (bench/first_step.py): per SSD variant, train.py's process time to the end of a
one-step run on empty caches, the step timer's time to the first step, and the steady step of the run after."""

from __future__ import annotations

from pathlib import Path

from bench.report.format import table

FIRST_STEP_DEFAULT = "first_step_h200"  # --first_step's file (NAME.json) when present; no section when absent


def first_step_section(data: dict, source: Path) -> str:
    """The section for one bench/first_step.py JSON (`data`, read from `source`)."""
    env, settings = data["environment"], data["settings"]
    rows = []
    for rec in data["records"]:
        first, steady = rec["first"], rec["steady"]
        rows.append(
            [
                rec["variant"],
                f"{first['process_s']:.1f}" if first["exit_code"] == 0 else f"exit {first['exit_code']}",
                f"{first['first_step_s']:.1f}" if "first_step_s" in first else "—",
                f"{steady['time/step_ms']:.2f}" if "time/step_ms" in steady else "—",
                f"{steady['throughput/tokens_per_s'] / 1e3:.0f}k" if "throughput/tokens_per_s" in steady else "—",
            ]
        )
    return "\n".join(
        [
            f"## The first step on a fresh machine (bench/first_step.py, {source.name})",
            "",
            f"`python -m bench.first_step --config {settings['config']} --steps {settings['steps']}`, every cache "
            f"empty for each variant's first run; one process per figure. {env['gpu']}, driver {env['driver']}, "
            f"torch {env['torch']}, triton {env['triton']}, cuda-tile {env['cuda_tile']}, mamba_ssm "
            f"{env['mamba_ssm']}, lightning {env['lightning']}, {env['date'][:10]}. The cuTile kernels run the "
            "shipped tuning table (kernels/cutile/tuned.json), mamba_ssm's the shipped autotune choices "
            "(kernels/triton_tuned.json).",
            "",
            table(
                [
                    "SSD (backend:backward)",
                    "process to exit, 1 step (s)",
                    "first step at (s)",
                    "steady step (ms)",
                    "tokens/s",
                ],
                rows,
            ),
        ]
    )
