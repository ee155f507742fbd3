"""Step-time panels read back from offline wandb runs' own files: what the wandb dashboard of a run shows, drawn
without an account or a network.

An offline run keeps its history in `offline-run-*/run-*.wandb`: wandb's records (protocol buffers) in the
LevelDB log format (a 7-byte file header, then 32 KiB blocks of records, each with a 7-byte header: crc32,
length, kind; a record longer than its block continues in the next). `history` reads the rows logged there.

    python -m bench.wandb_panels runs/a/wandb/offline-run-*:cutile runs/b/wandb/offline-run-*:triton \\
        --out results/wandb_medium.png
"""

from __future__ import annotations

import argparse
import json
import struct
from pathlib import Path

from bench.report.plots import pyplot, save

FILE_HEADER = 7  # b":W&B", a 2-byte magic, a version byte
BLOCK = 32768
RECORD_HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4
PANELS = (
    ("time/step_ms", "step (ms)"),
    ("throughput/tokens_per_s", "tokens/s"),
    ("time/backward_ms", "backward (ms)"),
    ("train/loss", "training loss"),
)


def run_file(run: Path) -> Path:
    """The .wandb file of an offline run folder (or the file itself)."""
    if run.is_file():
        return run
    found = sorted(run.glob("run-*.wandb"))
    if not found:
        raise FileNotFoundError(f"no run-*.wandb in {run}: not an offline wandb run folder")
    return found[0]


def records(path: Path) -> list[bytes]:
    """The records of a LevelDB-format log, fragments joined."""
    data = path.read_bytes()
    if not data.startswith(b":W&B"):
        raise ValueError(f"{path} is not a wandb run file (no :W&B header)")
    out, pending, pos = [], b"", FILE_HEADER
    while pos + RECORD_HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < RECORD_HEADER:  # a block's tail too short for a header is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + RECORD_HEADER])
        if kind == 0:  # zero-filled rest of a block
            pos += left
            continue
        pending += data[pos + RECORD_HEADER : pos + RECORD_HEADER + length]
        pos += RECORD_HEADER + length
        if kind in (FULL, LAST):
            out.append(pending)
            pending = b""
    return out


def history(run: Path) -> list[dict]:
    """The rows an offline wandb run logged, in order: {metric: value} with wandb's `_step`, `_runtime`."""
    from wandb.proto import wandb_internal_pb2 as pb

    rows = []
    for data in records(run_file(run)):
        record = pb.Record()
        record.ParseFromString(data)
        if record.WhichOneof("record_type") == "history":
            rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item})
    return rows


def series(rows: list[dict], key: str, skip: int) -> tuple[list[int], list[float]]:
    """(trainer step, value) of `key` over the rows that carry it, from trainer step `skip` on."""
    steps, values = [], []
    for row in rows:
        value, step = row.get(key), row.get("trainer/global_step")
        if value is not None and step is not None and step >= skip:
            steps.append(step)
            values.append(value)
    return steps, values


def render(runs: dict[str, list[dict]], out: Path, title: str, skip: int) -> Path:
    """A 2 x 2 figure of PANELS, one line per run (label -> its history rows)."""
    _, plt = pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(9, 5.5), dpi=80)
    for ax, (key, label) in zip(axes.flat, PANELS):
        for name, rows in runs.items():
            steps, values = series(rows, key, skip if key != "train/loss" else 0)
            ax.plot(steps, values, label=name, linewidth=1.2)
        ax.set_title(label, fontsize=10)
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
    axes.flat[0].legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return save(fig, out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.wandb_panels", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("runs", nargs="+", help="RUN_FOLDER:LABEL, an offline-run-* folder and its legend label")
    ap.add_argument("--out", type=Path, default=Path("results/wandb_panels.png"))
    ap.add_argument("--title", default="step time read back from offline wandb runs")
    ap.add_argument("--skip", type=int, default=5, help="leave out the first SKIP steps (compilation) of time panels")
    args = ap.parse_args(argv)
    runs = {}
    for spec in args.runs:
        folder, _, label = spec.rpartition(":")
        if not folder:
            ap.error(f"{spec!r}: give RUN_FOLDER:LABEL")
        try:
            runs[label] = history(Path(folder))
        except (FileNotFoundError, ValueError) as e:
            ap.error(str(e))
    print(f"wandb_panels: {render(runs, args.out, args.title, args.skip)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
