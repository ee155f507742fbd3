"""Sample text from a checkpoint with the recurrent step: constant state per token, the prompt read once.

    python scripts/generate.py runs/tiny/checkpoints/last.ckpt --prompt "def " --max_new_tokens 200

The tokenizer travels inside the checkpoint (as text), so the checkpoint is all it needs. Checkpoints are
opened as tensors and plain data only: a file holding pickled code is refused. Tokens are drawn on the CPU
whatever --device runs the model: one --seed gives one text on a device, and the same text on another as
long as the two devices' probabilities pick the same tokens. An error ends in one
line on stderr (exit code 2); --debug shows the traceback.
"""

from __future__ import annotations

import argparse
import math
import sys

import torch

from data.tokenizer import EOS
from lightning_modules.checkpoint import CheckpointError, load_trained


def check_sampling(temperature: float, top_k: int | None) -> None:
    """Raise ValueError (one line) unless temperature is a finite number >= 0 and top_k is None or >= 1."""
    if not (math.isfinite(temperature) and temperature >= 0):
        raise ValueError(f"--temperature must be a finite number >= 0 (0: greedy), got {temperature}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"--top_k must be at least 1 (1: greedy), got {top_k}")


@torch.no_grad()
def generate(
    model: torch.nn.Module,
    prompt_ids: list[int],
    max_new_tokens: int,
    temperature: float = 0.8,
    top_k: int | None = 50,
    eos_id: int | None = None,
    generator: torch.Generator | None = None,
) -> list[int]:
    """Continue `prompt_ids` with a Mamba2LM: one recurrent step per token, prompt included; greedy when
    temperature == 0, else a draw from the top_k most likely tokens (all when None) at that temperature.
    Draws are made on the CPU with `generator` (a CPU torch.Generator; None: torch's default one), whatever
    the model's device. Returns the new token ids (the EOS that ends them left out)."""
    check_sampling(temperature, top_k)
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
            probs = torch.softmax(scaled, -1).cpu()  # drawn on the CPU: one seed, the same draws on any device
            nxt = int(torch.multinomial(probs, 1, generator=generator))
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
    ap.add_argument("--temperature", type=float, default=0.8, help="a number >= 0; 0 for greedy")
    ap.add_argument("--top_k", type=int, default=50, help="draw from the k most likely tokens (k >= 1)")
    ap.add_argument("--seed", type=int, default=0, help="seeds the CPU generator the tokens are drawn with")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--debug", action="store_true", help="show the full traceback of an error")
    args = ap.parse_args(argv)
    try:
        check_sampling(args.temperature, args.top_k)  # before the checkpoint is read
        module, tokenizer = load_trained(args.checkpoint, args.device)
        prompt_ids = tokenizer.encode(args.prompt).ids
        ids = generate(
            module.model,
            prompt_ids,
            args.max_new_tokens,
            args.temperature,
            args.top_k,
            tokenizer.token_to_id(EOS),
            torch.Generator().manual_seed(args.seed),
        )
    except Exception as err:
        if args.debug:
            raise
        message = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        if not isinstance(err, (CheckpointError, ValueError)):
            message = f"{type(err).__name__}: {message} (the traceback: rerun with --debug)"
        print(f"generate.py: error: {message}", file=sys.stderr)
        return 2
    print(args.prompt + tokenizer.decode(ids))
    return 0


if __name__ == "__main__":
    sys.exit(main())
