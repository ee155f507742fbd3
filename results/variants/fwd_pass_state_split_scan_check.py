"""The split scan planned for fwd_pass_state (results/tuning_log.md, "Next" item 6), in float64 on the CPU, against
`kernels.reference.fwd_pass_state`: each segment of chunks walked from a zero state, a carry pass over the
segments, and each chunk's state as its local state plus the decayed carry. Not a kernel: the algebra a kernel
version must reproduce. Run from the repository root: `python results/variants/fwd_pass_state_split_scan_check.py`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels import reference
from kernels.testing import stage_inputs


def split_scan(x, B, dt_out, dA_cumsum, initial_states, segments: int):
    """fwd_pass_state's outputs from `segments` independent walks and a carry pass. Shapes as the reference."""
    b, l, h, p = x.shape
    _, _, c, Q = dt_out.shape
    g, n = B.shape[-2:]
    xc = F.pad(x, (0, 0, 0, 0, 0, c * Q - l)).reshape(b, c, Q, h, p)
    Bc = F.pad(B, (0, 0, 0, 0, 0, c * Q - l)).reshape(b, c, Q, g, n).repeat_interleave(h // g, dim=3)
    added = torch.einsum("bhcs,bcshp,bcshn->bchpn", torch.exp(dA_cumsum[..., -1:] - dA_cumsum) * dt_out, xc, Bc)
    g_end = dA_cumsum[..., -1]  # (b, h, c): each chunk's total log-decay
    bounds = [round(i * c / segments) for i in range(segments + 1)]
    local = torch.empty((b, c, h, p, n), dtype=x.dtype)
    finals = []
    for s in range(segments):  # in parallel on a GPU: each segment from a zero state
        state = torch.zeros((b, h, p, n), dtype=x.dtype)
        for k in range(bounds[s], bounds[s + 1]):
            local[:, k] = state
            state = torch.exp(g_end[:, :, k])[..., None, None] * state + added[:, k]
        finals.append(state)
    carry = torch.zeros((b, h, p, n), dtype=x.dtype) if initial_states is None else initial_states.clone()
    states = torch.empty_like(local)
    for s in range(segments):  # serial over segments only; the chunk states' fix-up is parallel over chunks
        decay = torch.zeros((b, h), dtype=x.dtype)  # log-decay from the segment's start to chunk k
        for k in range(bounds[s], bounds[s + 1]):
            states[:, k] = local[:, k] + torch.exp(decay)[..., None, None] * carry
            decay = decay + g_end[:, :, k]
        carry = torch.exp(decay)[..., None, None] * carry + finals[s]
    return states, carry


def main() -> None:
    worst = 0.0
    for chunk, l, segments, init in (
        (64, 64 * 37 + 5, 4, True),
        (128, 2048, 16, False),
        (32, 288, 3, True),
        (64, 321, 7, True),
    ):
        t = stage_inputs(torch.float64, chunk, 16, 8, b=2, l=l, h=4, g=2, device="cpu")
        init_states = t["initial_states"] if init else None
        args = (t["x"], t["B"], t["dt_out"], t["dA_cumsum"], init_states)
        want, want_final = reference.fwd_pass_state(*args)
        got, got_final = split_scan(*args, segments=segments)
        err = max(((a - w).norm() / w.norm()).item() for a, w in ((got, want), (got_final, want_final)))
        worst = max(worst, err)
        print(
            f"chunk {chunk:3d}  l {l:5d}  chunks {want.shape[1]:3d}  segments {segments:2d}  init {init!s:5}  rel err {err:.1e}"
        )
    print(f"largest relative error {worst:.1e}")
    if worst > 1e-12:
        raise SystemExit(f"split scan disagrees with the reference: largest relative error {worst:.1e} > 1e-12")


if __name__ == "__main__":
    main()
