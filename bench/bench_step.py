"""The full training step of the Mamba-2 LM per SSD variant, eager and compiled, in one process, on the same data.

Models come from the training configs (configs/<name>.yaml: its model section, data.vocab_size),
built as train.py builds them (LanguageModel: its fused AdamW, its torch.compile settings for the
compiled rows), one per variant with the same initial weights, bf16 autocast on a GPU, gradient
clipping. Variants (--backends):

    torch, triton, cutile   kernels.ssd with that backend (cutile: its reference backward)
    cutile_bwd              the cutile backend with its backward kernels (model.config.ssd_backward: cutile)
    standin                 kernels.ssd's standin backend, y = x·D (kernels/standin.py): the rest of the step
                            alone; each other row's SSD time and share then come by subtraction
                            (ssd_ms_by_subtraction), compiled too
    <variant>+conv, +norm   that variant with the cuTile causal conv + SiLU (model.config.conv_backend: cutile)
                            and/or the cuTile gated RMSNorm (norm_backend: cutile) in place of the compiled
                            PyTorch ones (triton+conv+norm: both); subtraction pairs it with the standin of the same

Warm-up steps (compilation, autotuning) are timed on their own, then steady-state steps alternate
between variants, each timed step right after an untimed one of its own (bench.step.alternate); a variant
that fails in warm-up is left out of the cell with its error recorded (and printed as one line), the others
are measured. Per step (bench.step): total, forward, backward and optimizer
time, the SSD's own forward and backward time inside it (eager only: compiled graphs have no SSD
marks), tokens/s, peak memory (the process's, every variant resident, and own_peak_gib: the variant's
parameters, gradients and optimizer state plus what its step allocated above the step's start, i.e. its
peak alone in a process; not under CUDA graphs), MFU with the FLOP count it uses. The marks are read after the loop,
so measuring does not synchronize the steps it measures; the same loop without any marks, run before and
after it, gives the timer's own cost (timer_cost: the marked loop over the mean of the two, so that a first
loop's or a drifting GPU's cost does not land on the timer; timer_loops_ms holds the three). The lead-ins run
unmarked, so per timed step the timer costs about 2 x timer_cost. --profile adds
each variant's GPU time (busy, and idle between its kernels, split by the kernels around each gap) and kernel
launches per step, and each kernel's time per step by the name BENCHMARKS.md shows (step_profile: those under
0.25 ms summed).
--documents lists packed-document kinds (bench.documents: seq_idx); every variant runs once per kind, all rows
alternating in one loop, so the cost of document boundaries is measured side by side (row variant@kind).

    python -m bench.bench_step --quick --modes compile --backends standin,triton --out results/step.json
    python -m bench.bench_step --modes compile --backends triton,cutile_bwd+conv+norm --documents none,short,stdlib
    python -m bench.bench_step --configs tiny --seqlens 64 --tokens_per_step 128 --backends torch,standin --steps 2
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import torch
import yaml

import kernels
from bench.documents import DOCUMENTS, packed_seq_idx
from bench.kernel_names import by_listed_name, short_name
from bench.results import STEP_LAYERS, available_backends, write_json
from bench.step import TimedStep, alternate, median_split, token_batches, warm_up
from bench.timing import gpu_kernel_ms, summarize
from bench.tuning_switches import add_table_arguments, apply_table_arguments
from lightning_modules.environment import environment, peak_tflops
from lightning_modules.language_model import LanguageModel, release_compiled_graphs
from model.flops import ssd_flops_per_token, train_flops_per_token
from model.mamba2 import Mamba2Config, next_token_loss

CONFIGS = Path(__file__).resolve().parent.parent / "configs"
VARIANTS = {  # label: (model.config.ssd_backend, model.config.ssd_backward)
    "torch": ("torch", "reference"),
    "triton": ("triton", "reference"),
    "cutile": ("cutile", "reference"),
    "cutile_bwd": ("cutile", "cutile"),
    "standin": ("standin", "reference"),
}


def split_label(label: str) -> tuple[str, dict[str, str]]:
    """A variant label -> (its VARIANTS entry, its model.config layer backends); ValueError if unknown."""
    base, *extras = label.split("+")
    if base not in VARIANTS or any(e not in STEP_LAYERS for e in extras) or len(set(extras)) < len(extras):
        raise ValueError(label)
    return base, {key: "cutile" if suffix in extras else "torch" for suffix, key in STEP_LAYERS.items()}


def documents_kinds(value: str) -> list[str]:
    """--documents' comma-separated kinds; ValueError, one line naming the choices, if one is unknown or repeated."""
    kinds = value.split(",")
    unknown = [k for k in kinds if k not in DOCUMENTS]
    repeated = sorted({k for k in kinds if kinds.count(k) > 1 and k not in unknown})
    if unknown or repeated:
        bad = [f"unknown {k!r}" for k in unknown] + [f"{k!r} given twice" for k in repeated]
        raise ValueError(f"--documents: {', '.join(bad)}; choose from {', '.join(DOCUMENTS)}, each once")
    return kinds


def row_key(label: str, kind: str) -> str:
    """A row's name in a cell: its variant label, with "@kind" where its documents are not "none"."""
    return label if kind == "none" else f"{label}@{kind}"


def compile_mode(name: str, args: argparse.Namespace) -> str | None:
    """The torch.compile mode of the compiled rows: --compile_mode, else configs/<name>.yaml's model.compile_mode."""
    if args.compile_mode is not None:
        return None if args.compile_mode == "default" else args.compile_mode
    path = CONFIGS / f"{name}.yaml"
    return yaml.safe_load(path.read_text())["model"].get("compile_mode") if path.is_file() else None


def load_module(name: str, label: str, seqlen: int, compile_model: bool, compile_mode: str | None) -> LanguageModel:
    """LanguageModel as configs/<name>.yaml builds it, for variant `label`, compiled or not (in torch.compile
    mode `compile_mode`, None its default: see compile_mode()). The chunk is capped at the sequence length
    (tiny CPU shapes).
    """
    path = CONFIGS / f"{name}.yaml"
    if not path.is_file():
        choices = ", ".join(p.stem for p in sorted(CONFIGS.glob("*.yaml")))
        raise FileNotFoundError(f"no config {path}; choose from {choices}")
    experiment = yaml.safe_load(path.read_text())
    settings = dict(experiment["model"])
    cfg = Mamba2Config(**settings.pop("config"), vocab_size=experiment["data"]["vocab_size"])
    base, layers = split_label(label)
    backend, backward = VARIANTS[base]
    chunk = min(cfg.chunk_size, seqlen)
    cfg = dataclasses.replace(cfg, ssd_backend=backend, ssd_backward=backward, chunk_size=chunk, **layers)
    torch.manual_seed(0)  # the same initial weights for every variant
    module = LanguageModel(config=cfg, **{**settings, "compile": compile_model, "compile_mode": compile_mode})
    module.configure_model()  # compiles, as Lightning does before fit, when compile_model
    return module


def bench(
    name: str, seqlen: int, batch: int, labels: list[str], kinds: list[str], compile_model: bool, args, device: str
) -> list[dict]:
    """One cell: every variant in `labels` once per documents kind in `kinds`, alternating; its records."""
    mode = compile_mode(name, args)
    rows = {row_key(label, kind): (label, kind) for label in labels for kind in kinds}
    modules = {
        key: load_module(name, label, seqlen, compile_model, mode).to(device) for key, (label, _) in rows.items()
    }
    seq_idx = {kind: packed_seq_idx(kind, batch, seqlen, device) for kind in kinds}  # the same in every step
    steps = {
        key: TimedStep(
            lambda tokens, m=m.model, s=seq_idx[rows[key][1]]: next_token_loss(m, tokens, s),
            list(m.parameters()),
            m.optimizer(fused=True),  # as training under bf16-mixed or fp32: see LanguageModel
            device,
        )
        for key, m in modules.items()
    }
    first = next(iter(modules.values()))
    cfg = first.config
    kernels.set_autotune(first.hparams.cutile_autotune if args.autotune is None else args.autotune)
    batches = token_batches(cfg.vocab_size, batch, seqlen, 0, device)
    warmup, failed = {}, {}
    for key in list(steps):  # compilation and autotuning, timed apart; a row failing here is left out alone
        try:
            warmup |= warm_up({key: steps[key]}, batches, args.warmup, device)
        except Exception as e:
            failed[key] = f"{type(e).__name__}: {e}"
            print(f"FAILED {name} L={seqlen} {key}: {failed[key]}", flush=True)
            del steps[key], modules[key]  # its memory does not stay resident beside the others
    if not steps:
        raise RuntimeError("every variant failed in warm-up: " + "; ".join(f"{k}: {v}" for k, v in failed.items()))

    def loop(timed: bool) -> tuple[float, dict[str, list]]:
        """All variants, alternating step by step; ms of the whole loop, marks."""
        kernels.ssd_timer.enabled = timed and not compile_model  # compiled graphs carry no SSD marks
        try:
            return alternate(steps, batches, args.steps, device, timed)
        finally:
            kernels.ssd_timer.enabled = False

    plain_before_ms, _ = loop(timed=False)
    timed_ms, marks = loop(timed=True)
    plain_after_ms, _ = loop(timed=False)
    timer_loops_ms = {"plain_before": plain_before_ms, "timed": timed_ms, "plain_after": plain_after_ms}
    peak = peak_tflops(torch.cuda.get_device_name()) if device == "cuda" else None
    flops = train_flops_per_token(cfg)
    records = []
    for key in steps:
        label, kind = rows[key]
        base = split_label(label)[0]
        samples = [m.read() for m in marks[key]]
        med = median_split(samples)
        tok_s = batch * seqlen / (med["step_ms"] / 1e3)
        rec = {
            "size": name,
            "parameters": modules[key].model.num_parameters(),
            "config": dataclasses.asdict(modules[key].config),
            "seqlen": seqlen,
            "batch": batch,
            "documents": kind,
            "variant": label,
            "backend": VARIANTS[base][0],
            "backward": None if base == "standin" else VARIANTS[base][1],
            "mode": "compile" if compile_model else "eager",
            "compile_mode": mode if compile_model else None,
            "median": med,
            "step_ms_spread": summarize([s["step_ms"] for s in samples]),
            "tokens_per_s": tok_s,
            "train_flops_per_token": flops,
            "mfu": flops * tok_s / (peak * 1e12) if peak else None,
            "ssd_share": (med["ssd_forward_ms"] + med["ssd_backward_ms"]) / med["step_ms"],
            "ssd_flops_share": ssd_flops_per_token(cfg) * cfg.n_layer / (flops / 3),
            "warmup_s": warmup[key],
            "warmup_steps": args.warmup,
            # the whole loop with marks over the mean of the loop without, run before and after it
            "timer_cost": 2 * timed_ms / (plain_before_ms + plain_after_ms) - 1.0,
            "timer_loops_ms": timer_loops_ms,
        }
        if "above_start_gib" in med and not (compile_model and mode == "reduce-overhead"):
            # the variant alone in a process: what it keeps between steps plus what its step allocates on top
            # (not under CUDA graphs, whose replays allocate from a pool recorded in warm-up)
            rec["own_peak_gib"] = steps[key].resident_gib() + med["above_start_gib"]
        if args.profile:
            rec["profile"] = step_profile(gpu_kernel_ms(lambda s=steps[key]: s(batches[0], timed=False), 2))
        records.append(rec)

    def pairing(rec: dict) -> tuple[str, ...]:
        """What pairs a row with its standin: its layers' backends and its documents."""
        return (*(rec["config"][key] for key in STEP_LAYERS.values()), rec["documents"])

    rests = {pairing(r): r["median"]["step_ms"] for r in records if r["backend"] == "standin"}
    for rec in records:
        rest = rests.get(pairing(rec))
        if rest is not None and rec["backend"] != "standin":
            rec["ssd_ms_by_subtraction"] = rec["median"]["step_ms"] - rest
            rec["ssd_share_by_subtraction"] = rec["ssd_ms_by_subtraction"] / rec["median"]["step_ms"]
        med, row = rec["median"], row_key(rec["variant"], rec["documents"])
        print(
            f"{name:6s} L={seqlen:6d} {rec['mode']:7s} {row:10s} step {med['step_ms']:8.2f} ms "
            f"(fwd {med['forward_ms']:.2f} bwd {med['backward_ms']:.2f} opt {med['optimizer_ms']:.2f}; "
            f"ssd in-step {med['ssd_forward_ms'] + med['ssd_backward_ms']:.2f}, by subtraction "
            f"{rec.get('ssd_ms_by_subtraction', float('nan')):.2f}) {rec['tokens_per_s']:,.0f} tok/s "
            f"mfu {rec['mfu'] or 0:.3f} peak {med.get('peak_gib', 0):.1f} GiB "
            f"(reserved {med.get('reserved_gib', 0):.1f}) warm-up {rec['warmup_s']:.1f} s "
            f"timer cost {rec['timer_cost']:+.1%}",
            flush=True,
        )
    mode_fields = {"mode": "compile" if compile_model else "eager"} | ({"compile_mode": mode} if compile_model else {})
    failures = [
        {"size": name, "seqlen": seqlen, "variant": rows[k][0], "documents": rows[k][1], **mode_fields, "error": v}
        for k, v in failed.items()
    ]
    return records + failures


def parse_run_arguments(ap: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """Adds the benchmarks' shared tuning switches (--autotune and bench.tuning_switches'), parses, points cuTile's
    tuning at the tables named, and applies --quick (2 warm-up, 4 timed steps)."""
    ap.add_argument(
        "--autotune",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="tune cuTile block sizes (cached on disk); default: the config's model.cutile_autotune",
    )
    add_table_arguments(ap)
    args = ap.parse_args(argv)
    if args.quick:
        args.warmup, args.steps = 2, 4
    apply_table_arguments(ap, args)
    return args


PROFILE_MIN_MS = 0.25  # a kernel below this many ms per step is summed into OTHER_KERNELS in a record's profile
OTHER_KERNELS = "other kernels"
IDLE_PAIRS = 4  # a record's profile keeps the idle time between this many kernel pairs, the largest


def step_profile(prof: dict) -> dict:
    """A step's profile (bench.timing.gpu_kernel_ms) as a record keeps it: GPU ms (busy), idle ms (no kernel
    running, from the first kernel of the profiled steps to the last) and kernel launches per step, and each
    kernel's ms per step under the name BENCHMARKS.md shows (bench.kernel_names.short_name: a cuTile kernel's
    specializations summed), largest first; the kernels below PROFILE_MIN_MS summed as OTHER_KERNELS. idle_ms_by_pair:
    the IDLE_PAIRS largest parts of idle_ms, "kernel before -> kernel after" (short names, pairs that share them
    summed) to ms per step."""
    ms, _ = by_listed_name(prof["by_kernel"], prof["launches"], short_name)
    ranked = {k: t for k, t in ms.items() if t >= PROFILE_MIN_MS}
    ranked[OTHER_KERNELS] = sum(t for t in ms.values() if t < PROFILE_MIN_MS)
    idle: dict[str, float] = {}
    for (before, after), t in prof["idle_by_pair"].items():
        pair = f"{short_name(before)} -> {short_name(after)}"
        idle[pair] = idle.get(pair, 0.0) + t
    largest = dict(sorted(idle.items(), key=lambda kv: -kv[1])[:IDLE_PAIRS])
    return {
        "gpu_ms": prof["ms"],
        "idle_ms": prof["idle_ms"],
        "idle_ms_by_pair": largest,
        "kernels": prof["kernels"],
        "kernels_ms": ranked,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="results/step.json")
    ap.add_argument("--configs", default="medium", help="names of configs/*.yaml, comma-separated")
    ap.add_argument("--seqlens", default="2048")
    ap.add_argument("--tokens_per_step", type=int, default=16384, help="batch = tokens_per_step // seqlen")
    ap.add_argument(
        "--backends",
        default="standin,triton,cutile,cutile_bwd,torch",
        help=f"{', '.join(VARIANTS)}; each may end in +conv and/or +norm (the cuTile conv, gated RMSNorm)",
    )
    ap.add_argument("--modes", default="eager,compile", help="eager, compile, or both: eager,compile")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument(
        "--compile_mode",
        default=None,
        help="torch.compile mode for the compiled rows: default, reduce-overhead (CUDA graphs), "
        "max-autotune-no-cudagraphs, ...; unset: the config's model.compile_mode",
    )
    ap.add_argument("--quick", action="store_true", help="--warmup 2 --steps 4: a minute or two per compiled cell")
    ap.add_argument(
        "--documents",
        default="none",
        help=f"packed documents (seq_idx): kinds of bench.documents ({', '.join(DOCUMENTS)}), comma-separated; "
        "every variant runs once per kind, side by side (e.g. none,short,stdlib)",
    )
    ap.add_argument("--profile", action="store_true", help="record each variant's 20 largest GPU kernels")
    args = parse_run_arguments(ap, argv)
    unknown = []
    for b in args.backends.split(","):
        try:
            split_label(b)
        except ValueError:
            unknown.append(b)
    if unknown or args.steps < 1 or args.warmup < 0:
        ap.error(
            f"unknown variants {unknown} (choose from {', '.join(VARIANTS)}, each optionally +conv, +norm), "
            "or steps < 1, or warmup < 0"
        )
    try:
        kinds = documents_kinds(args.documents)
    except ValueError as e:
        ap.error(str(e))

    torch.set_float32_matmul_precision("high")  # as train.py: float32 matmuls may use TF32
    torch._dynamo.config.cache_size_limit = 64  # one compiled graph per variant and mode in this process
    device = "cuda" if torch.cuda.is_available() else "cpu"
    wanted = args.backends.split(",")
    needs = {b: {VARIANTS[split_label(b)[0]][0]} | ({"cutile"} if "+" in b else set()) for b in wanted}
    runnable, skipped = available_backends(",".join(sorted(set().union(*needs.values()))), device)
    labels = [b for b in wanted if needs[b] <= set(runnable)]
    if not labels:
        print("no variant can run here", file=sys.stderr)
        return 2
    records: list[dict] = []
    payload = {
        "kind": "bench_step",
        "environment": environment(),
        "settings": {**vars(args), "device": device, "skipped": skipped, "variants": labels},
        "records": records,
    }
    for mode in args.modes.split(","):
        for name in args.configs.split(","):
            for seqlen in (int(s) for s in args.seqlens.split(",")):
                batch = max(1, args.tokens_per_step // seqlen)
                try:
                    records += bench(name, seqlen, batch, labels, kinds, mode == "compile", args, device)
                except Exception as e:  # keep what was measured; say what failed
                    print(f"FAILED {name} L={seqlen} {mode}: {type(e).__name__}: {e}", flush=True)
                    error = {"size": name, "seqlen": seqlen, "mode": mode, "error": f"{type(e).__name__}: {e}"}
                    records.append(error | ({"compile_mode": compile_mode(name, args)} if mode == "compile" else {}))
                payload["tuning"] = kernels.tuning_choices()  # the cuTile configurations every cell ran
                write_json(args.out, payload)  # after every cell: a timeout keeps what was measured
                torch._dynamo.reset()
                if device == "cuda":
                    torch.cuda.empty_cache()
    print(f"wrote {write_json(args.out, payload)}")
    return 0


if __name__ == "__main__":
    try:
        code = main()
    finally:
        release_compiled_graphs()
    sys.exit(code)
