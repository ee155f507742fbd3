"""The cuTile SSD and the block's cuTile layers, one kernel stage a file.

ssd.py               the differentiable op: forward chunk_cumsum -> fwd_pass_state -> compute_out; backward
                     chunk_cumsum (with log2 e) -> state_walks -> bwd_dx -> bwd_dbc -> chunk_cumsum_bwd
<stage>.py           the kernel, its host function (named after the stage, returning what kernels.reference's
                     stage returns), its tune space and untuned default, its AOT specializations
causal_conv.py, rms_norm.py   the block's causal conv + SiLU and gated RMSNorm, forward and backward
launch.py            launching with a tuned configuration on the inputs' device and current stream
tuning.py, tuned.json    per-shape configurations: the local cache, the table shipped (H200, H100), the search
signature.py         the helpers the AOT specializations are written with
toolchain.py         whether the cuTile compiler can run here, and why not
"""
