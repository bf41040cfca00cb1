"""The tests' own NVFP4 arithmetic and input generators (fp64 references from the operands'
bits, never through the library), shared by test_gpu.py and bench/bench.py. Needs torch."""

import torch

CUDA = torch.device("cuda:0")
E2M1 = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=torch.float64)


def rest(x, d):
    return -(-x // d)


def decode_values(packed, rows, k):
    """[rows, k/2] packed bytes -> [rows, k] f64 (element 2j in the low nibble)."""
    p = packed.reshape(rows, k // 2).view(torch.uint8).to(torch.int64)
    e2m1 = E2M1.to(p.device)
    return torch.stack([e2m1[p & 15], e2m1[p >> 4]], dim=-1).reshape(rows, k)


def decode_e4m3(b):
    """uint8 e4m3fn bits -> f64 (bias 7, no inf, 0x7F/0xFF NaN)."""
    b = b.to(torch.int64)
    s = torch.where(b >= 128, -1.0, 1.0).to(torch.float64)
    e, m = (b >> 3) & 15, (b & 7).to(torch.float64)
    v = torch.where(e == 0, m / 8 * 2.0**-6, (1 + m / 8) * torch.pow(2.0, (e - 7).to(torch.float64)))
    v = torch.where((b & 127) == 127, float("nan"), v)
    return s * v


def blocked_index(rows, k):
    """Byte offset of each plain scale [rows, k/16] in the 128x4 blocked layout (the test's own
    formula)."""
    i = torch.arange(rows, device=CUDA)[:, None]
    j = torch.arange(k // 16, device=CUDA)[None, :]
    return ((i // 128) * rest(k, 64) + j // 4) * 512 + (i % 32) * 16 + ((i % 128) // 32) * 4 + j % 4


def make_blocked(plain, rows, k, pad=0):
    out = torch.full((rest(rows, 128) * rest(k, 64) * 512,), pad, dtype=torch.uint8, device=CUDA)
    out[blocked_index(rows, k).reshape(-1)] = plain.reshape(-1)
    return out


def dequant(values, plain_scales, rows, k):
    s = decode_e4m3(plain_scales.reshape(rows, k // 16)).repeat_interleave(16, dim=1)
    return decode_values(values, rows, k) * s


def reference(a, sa, b, sb, m, n, k, alpha=1.0):
    return alpha * dequant(a, sa, m, k) @ dequant(b, sb, n, k).T


def random_operand(rows, k, gen, competition=False):
    """Random NVFP4: values (all e2m1 codes, or the task's ±{0..1.5}), plain scales (the task's
    1..2, or powers of two 2^-3..2^3 with a random mantissa)."""
    v = torch.randint(0, 256, (rows, k // 2), generator=gen, device=CUDA, dtype=torch.int32).to(torch.uint8)
    if competition:
        v &= 0b1011_1011
        s = torch.randint(1, 3, (rows, k // 16), generator=gen, device=CUDA).to(torch.float8_e4m3fn).view(torch.uint8)
    else:
        e = torch.randint(4, 11, (rows, k // 16), generator=gen, device=CUDA)
        m = torch.randint(0, 8, (rows, k // 16), generator=gen, device=CUDA)
        s = ((e << 3) | m).to(torch.uint8)
    return v, s


def assert_close(got, ref, dtype, what):
    """|got - ref| <= atol + rtol |ref|, rtol one output rounding (f16 2^-11, bf16 2^-8) plus
    fp32 summation slack."""
    rtol = 2.0**-10 if dtype == torch.float16 else 2.0**-7
    got = got.to(torch.float64).reshape(ref.shape)
    bad = (got - ref).abs() > 1e-3 + rtol * ref.abs()
    assert not bool(bad.any()), f"{what}: {int(bad.sum())} of {ref.numel()} elements differ (first {bad.nonzero()[:3].tolist()})"


def poisoned(shape, dtype):
    return torch.full(shape, float("nan"), dtype=dtype, device=CUDA)


TASK_TESTS = [
    ([96, 128], [128, 256], [256, 512]), ([256, 72], [512, 384], [256, 256]), ([128, 128], [128, 256], [512, 256]),
    ([80, 128, 256], [384, 256, 128], [256, 512, 256]), ([64, 72, 96], [128, 384, 512], [512, 512, 256]),
    ([64, 256, 128], [768, 128, 256], [512, 256, 512]), ([128, 128, 64], [256, 512, 512], [768, 256, 768]),
    ([128] * 4, [128] * 4, [512, 256, 512, 256]), ([40, 56, 384, 512], [512, 384, 256, 128], [256] * 4),
    ([512, 384, 256, 128], [256] * 4, [512, 768, 512, 768]),
]
TASK_BENCH = [
    ([80, 176, 128, 72, 64, 248, 96, 160], [4096] * 8, [7168] * 8), ([40, 76, 168, 72, 164, 148, 196, 160], [7168] * 8, [2048] * 8),
    ([192, 320], [3072] * 2, [4096] * 2), ([128, 384], [4096] * 2, [1536] * 2),
]


def task_input(ms, ns, ks, seed):
    """An input made the way the task's generator makes it (this project's own code): values
    random bytes masked to ±{0, 0.5, 1, 1.5}, plain scales 1 or 2, the blocked scales as the
    permuted (32, 4, rest_m, 4, rest_k, 1) view of storage whose padding is random 1..2, c random
    fp16; all [rows, cols, 1]."""
    gen = torch.Generator(device=CUDA).manual_seed(seed)
    abc, sf, sfr, sizes = [], [], [], []
    for m, n, k in zip(ms, ns, ks):
        ops, views = [], []
        for rows in (m, n):
            v = (torch.randint(0, 255, (1, rows, k // 2), generator=gen, device=CUDA, dtype=torch.int32).to(torch.uint8) & 0xBB)
            plain = torch.randint(1, 3, (1, rows, k // 16), generator=gen, device=CUDA).to(torch.float8_e4m3fn)
            storage = torch.randint(1, 3, (1, rest(rows, 128), rest(k, 64), 32, 4, 4), generator=gen, device=CUDA).to(torch.float8_e4m3fn)
            flat = storage.view(torch.uint8).reshape(-1)
            flat[blocked_index(rows, k).reshape(-1)] = plain.view(torch.uint8).reshape(-1)
            views.append(storage.permute(3, 4, 1, 5, 2, 0))
            ops.append((v.permute(1, 2, 0).view(torch.float4_e2m1fn_x2), plain.permute(1, 2, 0)))
        c = torch.randn((1, m, n), generator=gen, device=CUDA, dtype=torch.float16).permute(1, 2, 0)
        abc.append((ops[0][0], ops[1][0], c))
        sf.append((ops[0][1], ops[1][1]))
        sfr.append(tuple(views))
        sizes.append((m, n, k, 1))
    return abc, sf, sfr, sizes


def task_reference(data):
    abc, sf, _, sizes = data
    return [
        reference(a.view(torch.uint8), sa.view(torch.uint8), b.view(torch.uint8), sb.view(torch.uint8), m, n, k)
        for (a, b, _), (sa, sb), (m, n, k, _) in zip(abc, sf, sizes)
    ]


def exact_activations(rows, k, gen, dtype):
    """bf16/f16 activations that NVFP4 holds exactly at global scale 1: each 16-block a power of
    two 2^-2..2^0 times e2m1 magnitudes, one of them ±6 (so the block's scale is that power)."""
    v = E2M1.to(CUDA)[torch.randint(0, 16, (rows, k // 16, 16), generator=gen, device=CUDA)]
    v[:, :, 0] = 6.0
    p = torch.pow(2.0, -torch.randint(0, 3, (rows, k // 16, 1), generator=gen, device=CUDA).to(torch.float64))
    return (v * p).reshape(rows, k).to(dtype)
