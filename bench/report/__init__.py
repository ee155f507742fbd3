"""Render the benchmark JSON into BENCHMARKS.md, its plots, results/reconciliation.json and README's headline.

One module per thing it renders: series (loading and pooling runs), format (figures as text), kernels (the SSD
alone and the shape sweep), per_kernel (GPU time per kernel against its floor), step (the training step), scaling,
amdahl (isolated vs step speedup), headline (and README's block), plots; cli holds main(): `python -m bench.report`.
"""
