"""Sample text from a checkpoint with the recurrent step: constant state per token, the prompt read once.

    python scripts/generate.py runs/tiny/checkpoints/last.ckpt --prompt "def " --max_new_tokens 200

The tokenizer travels inside the checkpoint (the datamodule's state), so the checkpoint is all it needs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from tokenizers import Tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from data.tokenizer import EOS
from lightning_modules.language_model import LanguageModel
from lightning_modules.model.mamba2 import Mamba2LM


def load(checkpoint: str | Path, device: str = "cpu") -> tuple[Mamba2LM, Tokenizer]:
    """The model and tokenizer saved in a training checkpoint."""
    path = Path(checkpoint)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {str(path)!r} does not exist")
    ckpt = torch.load(path, map_location="cpu", weights_only=False)
    data_state = ckpt.get("TextDataModule") or next(
        (v for k, v in ckpt.items() if isinstance(v, dict) and "tokenizer_json" in v), None
    )
    if not data_state:
        raise ValueError(f"checkpoint {str(path)!r} carries no tokenizer (was it written by train.py?)")
    tokenizer = Tokenizer.from_str(data_state["tokenizer_json"])
    module = LanguageModel.load_from_checkpoint(path, map_location=device)
    module.eval()
    return module.model, tokenizer


@torch.no_grad()
def generate(
    model: Mamba2LM,
    prompt_ids: list[int],
    max_new_tokens: int,
    temperature: float = 0.8,
    top_k: int | None = 50,
    eos_id: int | None = None,
    generator: torch.Generator | None = None,
) -> list[int]:
    """Continue `prompt_ids`: one recurrent step per token, prompt included; greedy when temperature == 0."""
    if not prompt_ids:
        raise ValueError("the prompt must hold at least one token")
    device = next(model.parameters()).device
    cache = model.allocate_cache(1, device, next(model.parameters()).dtype)
    logits = None
    for t in prompt_ids:
        logits = model.step(torch.tensor([t], device=device), cache)
    out: list[int] = []
    for _ in range(max_new_tokens):
        if temperature == 0:
            nxt = int(logits.argmax(-1))
        else:
            scaled = logits[0].float() / temperature
            if top_k is not None:
                kth = torch.topk(scaled, min(top_k, scaled.numel())).values[-1]
                scaled = scaled.masked_fill(scaled < kth, float("-inf"))
            nxt = int(torch.multinomial(torch.softmax(scaled, -1), 1, generator=generator))
        if nxt == eos_id:
            break
        out.append(nxt)
        logits = model.step(torch.tensor([nxt], device=device), cache)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint", help="a .ckpt written by train.py")
    ap.add_argument("--prompt", default="def ")
    ap.add_argument("--max_new_tokens", type=int, default=200)
    ap.add_argument("--temperature", type=float, default=0.8, help="0 for greedy")
    ap.add_argument("--top_k", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args(argv)
    model, tokenizer = load(args.checkpoint, args.device)
    gen = torch.Generator().manual_seed(args.seed)
    ids = generate(
        model,
        tokenizer.encode(args.prompt).ids,
        args.max_new_tokens,
        args.temperature,
        args.top_k,
        tokenizer.token_to_id(EOS),
        gen,
    )
    print(args.prompt + tokenizer.decode(ids))
    return 0


if __name__ == "__main__":
    sys.exit(main())
