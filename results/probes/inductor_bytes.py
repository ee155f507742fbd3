"""Bytes each fused kernel of one compiled Mamba-2 block moves, from Inductor's own IR, on the CPU.

One block of the medium model (d_model 768, head dim 64, state 128) with the SSD replaced by the stand-in
(y = x·D, scripts/bench_step.py), under bf16 autocast, compiled fullgraph, forward and backward on `--tokens`
tokens. Inductor writes its post-fusion IR (ir_post_fusion.txt); each top-level node there is one kernel. A node
reads each buffer it depends on once (at most that buffer's size: broadcast weights count once) and writes each
buffer another node or the graph's output reads. The CPU's fusion decisions are Inductor's scheduler's, as on
the GPU, though a GPU build may split or fuse some reductions otherwise; the partition between forward and
backward (what is saved, what is recomputed) is the same. Inductor realizes a reused pointwise result on the CPU
whenever it holds an exp, sigmoid or the like, a rule its GPU builds do not have: the probe turns it off.

    python results/probes/inductor_bytes.py [--tokens 512] [--top 12] [--realize-reads N]
"""

from __future__ import annotations

import argparse
import collections
import math
import os
import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SIZE = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2, "int64": 8, "int32": 4, "bool": 1}
LAYOUT = re.compile(r"^\s*(\w+?)(?:\.layout|_layout) = \w+\('\w+', torch\.(\w+), size=\[([^\]]*)\]", re.M)
NODE = re.compile(r"^(op\w+): (\w+)\(")
DEP = re.compile(r"(?:MemoryDep|StarDep|WeakDep)\('(\w+)'(.*?)\)(?:,|\])")


def kernels(path: Path) -> list[dict]:
    """The top-level nodes of an ir_post_fusion.txt: name, kind, {buffer: bytes} read and written."""
    text = path.read_text()
    dtype, size = {}, {}
    for m in LAYOUT.finditer(text):
        dtype[m[1]] = m[2]
        size[m[1]] = math.prod(int(v) for v in re.findall(r"\d+", m[3])) if m[3].strip() else 1
    lines, nodes = text.split("\n"), []
    for i, line in enumerate(lines):
        m = NODE.match(line)
        inner = i > 0 and re.search(r"\.snodes\[\d+\] =$", lines[i - 1])
        if m and not inner and not (nodes and m[1] in nodes[-1]["members"]):
            nodes.append({"name": m[1], "kind": m[2], "members": set(m[1].split("_")), "text": []})
        if nodes:
            nodes[-1]["text"].append(line)

    def deps(node: dict, field: str) -> list[tuple[str, int]]:
        name, text = node["name"], "\n".join(node["text"])
        m = re.search(re.escape(name) + r"\." + field + r" = (.*?)\n" + re.escape(name) + r"\.", text, re.S)
        found = DEP.findall(m[1]) if m else []
        return [(buf, math.prod(int(v) for v in re.findall(r": (\d+)", rest))) for buf, rest in found]

    readers = collections.defaultdict(set)
    for node in nodes:
        node["reads"] = deps(node, "unmet_dependencies") + deps(node, "met_dependencies")
        node["writes"] = deps(node, "writes")
        node["to_output"] = set(re.findall(r"(buf\d+)\.users = \[[^\]]*?OUTPUT", "\n".join(node["text"]), re.S))
        for buf, _ in node["reads"]:
            readers[buf].add(node["name"])

    def nbytes(buf: str, n: int) -> int:
        return min(n, size.get(buf, n)) * SIZE.get(dtype.get(buf, "float32"), 4)

    out = []
    for node in nodes:
        read, written = {}, {}
        for buf, n in node["reads"]:
            read[buf] = max(read.get(buf, 0), nbytes(buf, n))
        for buf, n in node["writes"]:
            if readers[buf] - {node["name"]} or buf in node["to_output"]:
                written[buf] = max(written.get(buf, 0), nbytes(buf, n))
        out.append({"name": node["name"], "kind": node["kind"], "read": read, "written": written})
    return out


def mb(moved: dict[str, int]) -> str:
    return ", ".join(f"{buf} {v / 1e6:.2f}" for buf, v in moved.items())


def compile_block(tokens: int, trace_dir: str, realize_reads: int | None) -> None:
    import torch
    import torch._inductor.config as inductor
    import torch._inductor.ir as inductor_ir

    sys.path.insert(0, str(ROOT))
    from lightning_modules.model.mamba2 import Mamba2Block, Mamba2Config
    from scripts.bench_step import ssd_standin

    inductor.trace.enabled, inductor.trace.debug_dir = True, trace_dir
    if realize_reads is not None:
        inductor.realize_reads_threshold = realize_reads
    box = inductor_ir.StorageBox

    def gpu_reuse_rule(self, users: int, *, graph_reuse: bool = True) -> bool:
        """StorageBox.should_realize_on_reuse without its CPU-only rule (realize any reused exp, sigmoid, ...)."""
        if users > 1 and isinstance(self.data, (inductor_ir.Pointwise, inductor_ir.Reduction)):
            return self.has_large_inner_fn() or (graph_reuse and self.num_reads() > inductor.realize_reads_threshold)
        return False

    box.should_realize_on_reuse = gpu_reuse_rule
    cfg = Mamba2Config(d_model=768, n_layer=1, d_state=128, headdim=64, expand=2, chunk_size=128, vocab_size=16384)
    block = Mamba2Block(cfg, 0, ssd=ssd_standin)

    def residual(h):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return h + block(h)

    h = torch.randn(1, tokens, cfg.d_model, requires_grad=True)
    torch.compile(residual, fullgraph=True)(h).float().square().mean().backward()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--top", type=int, default=12, help="kernels listed per graph, largest first")
    ap.add_argument(
        "--realize-reads",
        type=int,
        default=None,
        help="Inductor's realize_reads_threshold: a reused pointwise result with more inputs is written out",
    )
    args = ap.parse_args()
    os.environ["TORCHINDUCTOR_FORCE_DISABLE_CACHES"] = "1"  # a cached graph writes no IR
    with tempfile.TemporaryDirectory() as trace_dir:
        compile_block(args.tokens, trace_dir, args.realize_reads)
        for graph in ("forward", "backward"):
            (path,) = Path(trace_dir).glob(f"torchinductor/*_{graph}_*/ir_post_fusion.txt")
            nodes = kernels(path)
            total = sum(sum(n["read"].values()) + sum(n["written"].values()) for n in nodes)
            print(f"{graph}: {len(nodes)} nodes, {total / 1e6:.2f} MB at {args.tokens} tokens")
            for n in sorted(nodes, key=lambda n: -(sum(n["read"].values()) + sum(n["written"].values())))[: args.top]:
                moved = sum(n["read"].values()) + sum(n["written"].values())
                if not moved:
                    continue
                print(f"  {moved / 1e6:6.2f} MB  {n['name'][:40]:40s} read {mb(n['read'])}; write {mb(n['written'])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
