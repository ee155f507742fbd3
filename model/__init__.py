"""The Mamba-2 language model as plain PyTorch (no Lightning): mamba2.py, and its FLOP count (flops.py)."""
