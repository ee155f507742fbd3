"""The cuTile conv and gated RMSNorm kernels' loop arithmetic (tiles, shifts, out-of-range rows read as zero,
partial tiles), and that of the variants results/variants/causal_conv_two_pass.patch, causal_conv_gv_loop.patch
and rms_norm_one_pass.patch, emulated in float64 with PyTorch on the CPU against autograd through the references;
exits with an error past 1e-12. `python results/probes/cutile_layers_emulation.py`"""

import torch

from lightning_modules.model.layers import causal_conv1d_silu, rms_norm

F64 = torch.float64


def gather_rows(x, t):  # x (b, l, c), t (T,) token indices -> (b, T, c), zero outside [0, l)
    ok = (t >= 0) & (t < x.shape[1])
    out = x[:, t.clamp(0, x.shape[1] - 1)]
    return out * ok[None, :, None]


def preactivation(x, w, bias, t):  # v at tokens t: bias + Σ_j w[:, j] · x[t - (K - 1) + j]
    K = w.shape[1]
    return bias + sum(w[:, j] * gather_rows(x, t - (K - 1) + j) for j in range(K))


def silu_grad(g, v):  # the gradient of SiLU(v) given g, its output's
    s = 1 / (1 + torch.exp(-v))
    return g * s * (1 + v * (1 - s))


def add_weight_grads(dw, db, gv, x, t):  # a tile's share of dw and dbias, gv at tokens t
    K = dw.shape[1]
    for j in range(K):
        dw[:, j] += (gv * gather_rows(x, t - (K - 1) + j)).sum((0, 1))
    db += gv.sum((0, 1))


def conv_fwd(x, w, bias, T):
    l = x.shape[1]
    y = torch.zeros_like(x)
    for t0 in range(0, l, T):
        v = preactivation(x, w, bias, torch.arange(t0, t0 + T))
        n = min(T, l - t0)
        y[:, t0 : t0 + n] = (v / (1 + torch.exp(-v)))[:, :n]
    return y


def conv_bwd(dy, x, w, bias, T):
    b, l, c = x.shape
    K = w.shape[1]
    dx, dw, db = torch.zeros_like(x), torch.zeros_like(w), torch.zeros_like(bias)
    for t0 in range(0, l, T):
        t = torch.arange(t0, t0 + T)
        acc = torch.zeros(b, T, c, dtype=F64)
        for i in range(K):
            m = K - 1 - i
            gv = silu_grad(gather_rows(dy, t + m), preactivation(x, w, bias, t + m))
            acc = acc + w[:, K - 1 - m] * gv
        n = min(T, l - t0)
        dx[:, t0 : t0 + n] = acc[:, :n]
        add_weight_grads(dw, db, gv, x, t)  # gv of the last shift, m = 0: this tile's own
    return dx, dw, db


def dx_from_gv(gv_all, w, T):
    """The two-pass backward's dx kernel: dx[t] = Σ_m w[:, K - 1 - m] · gv[t + m], tiles of T tokens."""
    l, K = gv_all.shape[1], w.shape[1]
    dx = torch.zeros_like(gv_all)
    for t0 in range(0, l, T):
        t = torch.arange(t0, t0 + T)
        acc = sum(w[:, K - 1 - m] * gather_rows(gv_all, t + m) for m in range(K))
        n = min(T, l - t0)
        dx[:, t0 : t0 + n] = acc[:, :n]
    return dx


def conv_bwd_two_pass(dy, x, w, bias, T, T_dx):
    """results/variants/causal_conv_two_pass.patch: gv in one pass (tiles of T tokens, with dw and dbias), then dx
    from shifted rows of gv (tiles of T_dx tokens)."""
    l = x.shape[1]
    gv_all, dw, db = torch.zeros_like(x), torch.zeros_like(w), torch.zeros_like(bias)
    for t0 in range(0, l, T):
        t = torch.arange(t0, t0 + T)
        gv = silu_grad(gather_rows(dy, t), preactivation(x, w, bias, t))
        n = min(T, l - t0)
        gv_all[:, t0 : t0 + n] = gv[:, :n]
        add_weight_grads(dw, db, gv, x, t)
    return dx_from_gv(gv_all, w, T_dx), dw, db


def conv_bwd_gv_loop(dy, x, w, bias, T, steps):
    """results/variants/causal_conv_gv_loop.patch's gv kernel: a program walks `steps` tiles of T tokens (its
    segment, fewer at the sequence end), holding the 4 shifted rows (K <= 4: the taps past K have zero weight) and
    summing gv x shifted rows and gv elementwise over its tiles, then reduces once into tap-major partials
    (b, segments, 4, c) that the host sums; dx as the two-pass kernel forms it."""
    b, l, c = x.shape
    K = w.shape[1]
    KP = 4
    wp = torch.cat([w, torch.zeros(c, KP - K, dtype=w.dtype)], 1)  # gathered past K: zero
    segments = -(-l // (T * steps))
    dw_part = torch.zeros(b, segments, KP, c, dtype=x.dtype)
    db_part = torch.zeros(b, segments, c, dtype=x.dtype)
    gv_all = torch.zeros_like(x)
    for si in range(segments):
        acc_w, acc_b = torch.zeros(KP, b, T, c, dtype=x.dtype), torch.zeros(b, T, c, dtype=x.dtype)
        first = si * steps
        for s in range(min(steps, -(-l // T) - first)):
            t = (first + s) * T + torch.arange(T)
            xs = torch.stack([gather_rows(x, t - (K - 1) + j) for j in range(KP)])  # (KP, b, T, c)
            v = bias + (wp.t()[:, None, None, :] * xs).sum(0)
            gv = silu_grad(gather_rows(dy, t), v)
            t0, n = (first + s) * T, min(T, l - (first + s) * T)
            gv_all[:, t0 : t0 + n] = gv[:, :n]
            acc_w += gv * xs
            acc_b += gv
        dw_part[:, si] = acc_w.sum(2).transpose(0, 1)
        db_part[:, si] = acc_b.sum(1)
    dw, db = dw_part[:, :, :K].sum((0, 1)).t(), db_part.sum((0, 1))
    return dx_from_gv(gv_all, w, T), dw, db


def norm_fwd(x, w, z, G, eps):
    N, d = x.shape
    v = x * z / (1 + torch.exp(-z))
    vg = v.reshape(N, d // G, G)
    r = torch.rsqrt((vg * vg).sum(-1, keepdim=True) / G + eps)
    return (vg * r).reshape(N, d) * w, r[..., 0]


def norm_one_pass(g, x, w, z, G, eps, T, steps):
    """results/variants/rms_norm_one_pass.patch: each group's row padded with zero columns to the power of two
    TILE_G, one pass per tile of T rows (forward), the backward's programs walking `steps` row tiles (the last
    one fewer) with dw summed per program. -> out, dx, dz, dw."""
    N, d = x.shape
    TG = 1 << (G - 1).bit_length()

    def padded(t):  # (N, d) -> (N, groups, TG), zeros past G
        return torch.nn.functional.pad(t.reshape(N, d // G, G), (0, TG - G))

    xp, zp, gp = padded(x), padded(z), padded(g)
    wp = torch.nn.functional.pad(w.reshape(d // G, G), (0, TG - G))
    out, dx, dz = torch.zeros_like(xp), torch.zeros_like(xp), torch.zeros_like(xp)
    r_all = torch.zeros(N, d // G, 1, dtype=F64)
    for t0 in range(0, N, T):  # forward programs
        xv, zv = xp[t0 : t0 + T], zp[t0 : t0 + T]
        v = xv * zv / (1 + torch.exp(-zv))
        r = torch.rsqrt((v * v).sum(-1, keepdim=True) / G + eps)
        r_all[t0 : t0 + T] = r
        out[t0 : t0 + T] = v * r * wp
    tiles = -(-N // T)
    dw_parts = []
    for p0 in range(0, tiles, steps):  # backward programs
        dw = torch.zeros_like(wp)
        for ti in range(p0, min(p0 + steps, tiles)):
            rows = slice(ti * T, ti * T + T)
            xv, zv, gv, r = xp[rows], zp[rows], gp[rows], r_all[rows]
            s = 1 / (1 + torch.exp(-zv))
            n = xv * zv * s * r
            mean = (gv * wp * n).sum(-1, keepdim=True) / G
            dv = r * (gv * wp - n * mean)
            dw = dw + (gv * n).sum(0)
            dx[rows], dz[rows] = dv * zv * s, dv * xv * s * (1 + zv * (1 - s))
        dw_parts.append(dw)

    def unpadded(t):
        return t[..., :G].reshape(N, d)

    return unpadded(out), unpadded(dx), unpadded(dz), sum(dw_parts)[:, :G].reshape(d)


def norm_bwd(g, x, w, z, r, G):
    N, d = x.shape
    rr = r.repeat_interleave(G, dim=1)
    s = 1 / (1 + torch.exp(-z))
    v = x * z * s
    dot = (g * w * v * rr).reshape(N, d // G, G).sum(-1, keepdim=True)
    mean = (dot / G).expand(N, d // G, G).reshape(N, d)
    n = v * rr
    dv = rr * (g * w - n * mean)
    return dv * z * s, dv * x * s * (1 + z * (1 - s)), (g * n).sum(0)


torch.manual_seed(0)
for b, l, c, K, T in ((2, 37, 12, 4, 16), (1, 3, 5, 4, 16), (2, 70, 8, 3, 32), (1, 65, 7, 2, 16)):
    x = torch.randn(b, l, c, dtype=F64, requires_grad=True)
    w = torch.randn(c, K, dtype=F64, requires_grad=True)
    bias = torch.randn(c, dtype=F64, requires_grad=True)
    dy = torch.randn(b, l, c, dtype=F64)
    ref = causal_conv1d_silu(x, w, bias)
    want = torch.autograd.grad(ref, (x, w, bias), dy)
    got_y = conv_fwd(x.detach(), w.detach(), bias.detach(), T)
    for name, got in (
        ("conv", conv_bwd(dy, x.detach(), w.detach(), bias.detach(), T)),
        ("conv two-pass", conv_bwd_two_pass(dy, x.detach(), w.detach(), bias.detach(), T, 2 * T)),
        *(
            (f"conv gv loop, steps {steps}", conv_bwd_gv_loop(dy, x.detach(), w.detach(), bias.detach(), T, steps))
            for steps in (1, 3, 16)
        ),
    ):
        errs = [((a - r).norm() / r.norm()).item() for a, r in zip((got_y, *got), (ref, *want))]
        print(name, (b, l, c, K, T), " ".join(f"{e:.1e}" for e in errs))
        assert max(errs) < 1e-12
for N, d, G in ((37, 256, 64), (5, 1536, 768), (300, 48, 48)):
    x = torch.randn(N, d, dtype=F64, requires_grad=True)
    z = torch.randn(N, d, dtype=F64, requires_grad=True)
    w = torch.randn(d, dtype=F64, requires_grad=True)
    g = torch.randn(N, d, dtype=F64)
    ref = rms_norm(x, w, 1e-5, z, G)
    want = torch.autograd.grad(ref, (x, z, w), g)
    out, r = norm_fwd(x.detach(), w.detach(), z.detach(), G, 1e-5)
    got = norm_bwd(g, x.detach(), w.detach(), z.detach(), r, G)
    errs = [((a - rf).norm() / rf.norm()).item() for a, rf in zip((out, *got), (ref, *want))]
    print("norm", (N, d, G), " ".join(f"{e:.1e}" for e in errs))
    assert max(errs) < 1e-12
    for T, steps in ((1, 4), (2, 3), (4, 16)):
        got = norm_one_pass(g, x.detach(), w.detach(), z.detach(), G, 1e-5, T, steps)
        errs = [((a - rf).norm() / rf.norm()).item() for a, rf in zip(got, (ref, *want))]
        print("norm one-pass", (N, d, G, T, steps), " ".join(f"{e:.1e}" for e in errs))
        assert max(errs) < 1e-12
print("ok")
