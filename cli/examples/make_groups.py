#!/usr/bin/env python3
"""Write random NVFP4 groups to a safetensors file for `nvfp4-gemm run`, and check its output
independently of the Rust code.

    python3 cli/examples/make_groups.py groups.safetensors [--shape SPEC] [--seed N] [--blocked] [--alpha X]
    python3 cli/examples/make_groups.py --verify groups.safetensors out.safetensors

The file holds, for each group i (the format `nvfp4-gemm --help` documents):
    g{i}.a        torch.uint8 [m, k/2]   two e2m1 codes per byte, element 2j in the LOW nibble
    g{i}.a_scale  torch.float8_e4m3fn   [m, k/16] plain, or 1-D 128x4 blocked with --blocked
    g{i}.b        torch.uint8 [n, k/2]
    g{i}.b_scale  torch.float8_e4m3fn   [n, k/16] (or 1-D blocked)
    g{i}.alpha    torch.float32 []
Values follow the competition's generator: bytes uniform in 0..254 masked with 0b1011_1011 (codes
+-{0, 0.5, 1, 1.5}), scales 1.0 or 2.0. No fp4 torch dtype is needed.

--verify dequantizes both operands in float64 with torch, computes alpha * A @ B^T, rounds once to
the output's dtype and applies the competition's check |out - ref| <= 1e-3 + 1e-3*|ref|.
"""

import argparse
import math
import sys

import torch
from safetensors.torch import load_file, save_file

BENCHMARKS = {
    "b0": ([80, 176, 128, 72, 64, 248, 96, 160], 4096, 7168),
    "b1": ([40, 76, 168, 72, 164, 148, 196, 160], 7168, 2048),
    "b2": ([192, 320], 3072, 4096),
    "b3": ([128, 384], 4096, 1536),
}

# e2m1 code -> value (bit 3 is the sign).
E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0],
                    dtype=torch.float64)


def parse_shape(spec):
    """b0..b3, or `g=2,m=128:384,n=4096,k=1536` (m, n, k: one value or one per group, ':'-joined)."""
    if spec in BENCHMARKS:
        m, n, k = BENCHMARKS[spec]
        return [(mi, n, k) for mi in m]
    fields = {}
    for item in spec.split(","):
        key, sep, value = item.partition("=")
        if not sep or key.strip() not in ("g", "m", "n", "k", "name"):
            raise SystemExit(f"bad shape spec item {item!r} in {spec!r}")
        fields[key.strip()] = value.strip()
    lists = {key: [int(v) for v in fields[key].split(":")] for key in "mnk" if key in fields}
    if len(lists) != 3:
        raise SystemExit(f"shape spec {spec!r} needs m, n and k")
    g = int(fields["g"]) if "g" in fields else max(len(v) for v in lists.values())
    for key, values in lists.items():
        if len(values) not in (1, g):
            raise SystemExit(f"shape spec {spec!r}: {key} lists {len(values)} values for {g} groups")
    pick = lambda values, i: values[0] if len(values) == 1 else values[i]  # noqa: E731
    return [(pick(lists["m"], i), pick(lists["n"], i), pick(lists["k"], i)) for i in range(g)]


def blocked_geometry(rows, k):
    return math.ceil(rows / 128), math.ceil(k // 16 / 4)


def plain_to_blocked(plain_u8, rows, k):
    """[rows, k/16] bytes -> 1-D 128x4 blocked bytes, zero padded:
    offset(i, j) = ((i/128)*rest_k + j/4)*512 + (i%32)*16 + ((i%128)/32)*4 + j%4."""
    rest_m, rest_k = blocked_geometry(rows, k)
    padded = torch.zeros(rest_m * 128, rest_k * 4, dtype=torch.uint8)
    padded[:rows, : k // 16] = plain_u8
    # Row i = (mm, mm4, mm32) = (i//128, (i%128)//32, i%32); column j = (kk, kk4) = (j//4, j%4).
    return padded.view(rest_m, 4, 32, rest_k, 4).permute(0, 3, 2, 1, 4).reshape(-1).contiguous()


def blocked_to_plain(blocked_u8, rows, k):
    rest_m, rest_k = blocked_geometry(rows, k)
    grid = blocked_u8.view(rest_m, rest_k, 32, 4, 4).permute(0, 3, 2, 1, 4).reshape(rest_m * 128, rest_k * 4)
    return grid[:rows, : k // 16]


def random_operand(rows, k, gen, blocked):
    values = torch.randint(0, 255, (rows, k // 2), dtype=torch.uint8, generator=gen) & 0b1011_1011
    ones = torch.rand(rows, k // 16, generator=gen) < 0.5
    plain = torch.where(ones, 1.0, 2.0).to(torch.float8_e4m3fn)
    if blocked:
        return values, plain_to_blocked(plain.view(torch.uint8), rows, k).view(torch.float8_e4m3fn)
    return values, plain


def make(path, shapes, seed, blocked, alpha):
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for i, (m, n, k) in enumerate(shapes):
        if k % 64 or n % 8 or n == 0:
            raise SystemExit(f"group {i}: k must be a positive multiple of 64 and n of 8 (got m={m} n={n} k={k})")
        tensors[f"g{i}.a"], tensors[f"g{i}.a_scale"] = random_operand(m, k, gen, blocked)
        tensors[f"g{i}.b"], tensors[f"g{i}.b_scale"] = random_operand(n, k, gen, blocked)
        tensors[f"g{i}.alpha"] = torch.tensor(alpha, dtype=torch.float32)
    save_file(tensors, path, metadata={"format": "nvfp4-grouped-gemm", "content": "input"})
    layout = "blocked" if blocked else "plain"
    print(f"wrote {len(shapes)} groups ({layout} scales, seed {seed}) to {path}")


def dequantize(values_u8, scales, rows, k):
    codes = torch.stack([values_u8 & 0xF, values_u8 >> 4], dim=-1).reshape(rows, k).long()
    raw = scales.view(torch.uint8)
    plain = raw if raw.dim() == 2 else blocked_to_plain(raw, rows, k)
    scale = plain.contiguous().view(torch.float8_e4m3fn).to(torch.float64)
    return E2M1[codes] * scale.repeat_interleave(16, dim=1)


def verify(in_path, out_path):
    inputs, outputs = load_file(in_path), load_file(out_path)
    failed = 0
    for i in range(sum(1 for name in inputs if name.endswith(".a") and name.startswith("g"))):
        a, b = inputs[f"g{i}.a"], inputs[f"g{i}.b"]
        (m, half_k), n = a.shape, b.shape[0]
        k = 2 * half_k
        alpha = float(inputs[f"g{i}.alpha"]) if f"g{i}.alpha" in inputs else 1.0
        ref = alpha * dequantize(a, inputs[f"g{i}.a_scale"], m, k) @ dequantize(b, inputs[f"g{i}.b_scale"], n, k).T
        out = outputs[f"g{i}.c"]
        ref = ref.to(out.dtype).to(torch.float64)  # one rounding, as the reference
        got = out.to(torch.float64)
        bad = ~((got - ref).abs() <= 1e-3 + 1e-3 * ref.abs())
        max_err = (got - ref).abs().max().item() if got.numel() else 0.0
        failed += int(bad.sum())
        status = "PASS" if not bad.any() else "FAIL"
        print(f"group {i}: m={m} n={n} k={k} {out.dtype} {status}: {int(bad.sum())}/{got.numel()} outside, "
              f"max |diff| {max_err:.3e}")
    print("verify:", "PASS" if failed == 0 else f"FAIL ({failed} elements)")
    return 0 if failed == 0 else 1


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="+", help="OUT.safetensors, or IN OUT with --verify")
    p.add_argument("--shape", default="b3", help="b0..b3 or g=2,m=128:384,n=4096,k=1536 (default b3)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--blocked", action="store_true", help="write scales in the 1-D 128x4 blocked layout")
    p.add_argument("--alpha", type=float, default=1.0)
    p.add_argument("--verify", action="store_true", help="check OUT's g{i}.c against a float64 torch reference")
    args = p.parse_args()
    if args.verify:
        if len(args.files) != 2:
            p.error("--verify takes IN and OUT")
        return verify(*args.files)
    if len(args.files) != 1:
        p.error("give one output file")
    make(args.files[0], parse_shape(args.shape), args.seed, args.blocked, args.alpha)
    return 0


if __name__ == "__main__":
    sys.exit(main())
