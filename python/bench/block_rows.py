"""The expert-block rows of the Python bench (`bench.py --block`), their pure half: the layers,
the byte floor, the issue's targets, the option parsing and the table. No torch, no GPU: unit-tested
on any machine (python/tests/test_block_rows.py). The same layers, floor and targets as the Rust
bench's block rows (bench/src/block.rs).

The expert block's performance targets, per row:
- floor: T <= 64 at >= 75% of the byte floor (floor time / block time);
- torch: T <= 64 at >= 3x PyTorch's bf16 block, T = 4096 at >= 1.1x (PyTorch time / block time);
- unfused: T <= 64 the fused block at <= 0.75x the library's unfused composition.
"""

import math

# name -> (model, experts, top_k, hidden, intermediate); silu, gated (W13 = gate rows, then up).
LAYERS = {
    "ds": ("DeepSeek-V3", 256, 8, 7168, 2048),
    "qwen3": ("Qwen3-30B-A3B", 128, 8, 2048, 768),
    "mixtral": ("Mixtral-8x7B", 8, 2, 4096, 14336),
}
TOKENS = (1, 8, 64, 512, 4096)
PRECISIONS = ("w4a4", "w4a4-epilogue", "w4a16")
QUICK_LAYERS = ("qwen3", "mixtral")
QUICK_TOKENS = (1, 64, 4096)
MAX_TOKENS = 16384
CHECK_TOKENS = 2
CHECK_BOUND = 2e-2
# The baselines' bound (PyTorch's bf16 block, the unfused composition): they round where the block
# does not (the activation in bf16, one quantizer scale per GEMM), so at a check's 2 tokens they sit
# at 1-3e-2 of the block's reference; the bound shows they compute the same function.
BASELINE_BOUND = 5e-2

# The weights' global scale is WEIGHT_SCALE / sqrt(K) (outputs of order 1); both GEMMs' input
# scale (W4A4's quantizer global scale) INPUT_SCALE for every expert: the unfused composition's
# `MoE` layers take one quantizer scale per GEMM.
WEIGHT_SCALE = 0.5
INPUT_SCALE = 1.0 / 32.0
# e4m3 block-scale codes drawn: 0x30 (0.5) to 0x40 (2.0), finite and positive.
SCALE_CODE_LO, SCALE_CODE_HI = 0x30, 0x40

FLOOR_TARGET = 0.75
TORCH_TARGET_DECODE = 3.0
TORCH_TARGET_PREFILL = 1.1
UNFUSED_TARGET = 0.75


def weight_scale(k):
    """The dequantization global scale of a weight with K = k."""
    return WEIGHT_SCALE / math.sqrt(k)


def matrix_bytes(rows, k):
    """A weight's NVFP4 bytes: packed values and 128x4 blocked scales."""
    return rows * k // 2 + -(-rows // 128) * 128 * -(-k // 64) * 4


def expert_bytes(name):
    """One expert's NVFP4 bytes: W13 (2I x H) and W2 (H x I)."""
    _, _, _, h, i = LAYERS[name]
    return matrix_bytes(2 * i, h) + matrix_bytes(h, i)


def weight_bytes(name):
    """Every expert's NVFP4 bytes."""
    return LAYERS[name][1] * expert_bytes(name)


def bf16_weight_bytes(name):
    """Every expert's weights in bf16 (PyTorch's block)."""
    _, e, _, h, i = LAYERS[name]
    return e * 2 * (2 * i * h + h * i)


def floor_bytes(name, tokens, touched):
    """The floor's bytes: the touched experts' NVFP4 weights, plus x read and y written (bf16,
    T x H each)."""
    return touched * expert_bytes(name) + 2 * 2 * tokens * LAYERS[name][3]


def floor_us(nbytes, copy_tb_s):
    """`nbytes` at the copy rate (bytes read + written per second / 1e12), µs."""
    return nbytes / (copy_tb_s * 1e12) * 1e6


def targets(tokens, of_floor=None, x_torch=None, of_unfused=None):
    """The targets of a row: {floor, torch, unfused} -> True / False / None (not applicable to
    the token count, or not measured)."""
    decode = tokens <= 64
    torch_t = None
    if x_torch is not None:
        if decode:
            torch_t = x_torch >= TORCH_TARGET_DECODE
        elif tokens == 4096:
            torch_t = x_torch >= TORCH_TARGET_PREFILL
    return {
        "floor": (of_floor >= FLOOR_TARGET) if decode and of_floor is not None else None,
        "torch": torch_t,
        "unfused": (of_unfused <= UNFUSED_TARGET) if decode and of_unfused is not None else None,
    }


def cell(t):
    """A target's cell."""
    return "-" if t is None else ("pass" if t else "MISS")


def parse_layers(text):
    """`ds,qwen3,mixtral`, `all` or `none` -> names (ValueError on an unknown one)."""
    if text in ("", "none"):
        return []
    if text == "all":
        return list(LAYERS)
    items = [s.strip() for s in text.split(",") if s.strip()]
    bad = [s for s in items if s not in LAYERS]
    if bad:
        raise ValueError(f"unknown layer {', '.join(bad)} (known: {', '.join(LAYERS)}, all, none)")
    return items


def parse_tokens(text):
    """`1,8,64` -> [1, 8, 64] (each 1..MAX_TOKENS)."""
    out = []
    for s in text.split(","):
        try:
            n = int(s)
        except ValueError:
            raise ValueError(f"`{s}` is not a whole number") from None
        if not 1 <= n <= MAX_TOKENS:
            raise ValueError(f"{n} tokens: 1 to {MAX_TOKENS}")
        out.append(n)
    return out


def parse_precisions(text):
    """`w4a4,w4a4-epilogue,w4a16` or `all` -> names, in order, without repeats."""
    if text == "all":
        return list(PRECISIONS)
    out = []
    for s in text.split(","):
        s = s.strip()
        if s not in PRECISIONS:
            raise ValueError(f"unknown precision `{s}` (w4a4, w4a4-epilogue, w4a16)")
        if s not in out:
            out.append(s)
    return out


def selection(layers, tokens, precisions, quick):
    """The rows a run asks for: (layers, tokens, precisions). `quick` is the subset QUICK_LAYERS
    at QUICK_TOKENS, unless `layers` / `tokens` (None: not given) say otherwise."""
    layers = parse_layers(layers) if layers is not None else list(QUICK_LAYERS if quick else LAYERS)
    tokens = parse_tokens(tokens) if tokens is not None else list(QUICK_TOKENS if quick else TOKENS)
    return layers, tokens, parse_precisions(precisions)


HEADER = "block prec check T experts us floor_us %floor torch_us x_torch unfused_us x_unfused floor>=75% torch unfused".split()


def table_rows(runs):
    """One line per layer, precision and token count. `runs`: [{name, precision, check, rows:
    [{tokens, touched, experts, us, floor_us, of_floor, torch_us, x_torch, unfused_us,
    of_unfused, targets}]}], times in µs (a number, a stats dict: its median, or None)."""

    def f(v, fmt="{:.2f}"):
        if isinstance(v, dict):
            v = v["median"]
        return "-" if v is None else fmt.format(v)

    out = []
    for run in runs:
        for r in run["rows"]:
            t = r["targets"]
            out.append(
                [
                    run["name"],
                    run["precision"],
                    run["check"],
                    str(r["tokens"]),
                    f"{r['touched']}/{LAYERS[run['name']][1]}",
                    f(r["us"]),
                    f(r["floor_us"]),
                    f(None if r["of_floor"] is None else 100 * r["of_floor"], "{:.0f}%"),
                    f(r.get("torch_us")),
                    f(r.get("x_torch")),
                    f(r.get("unfused_us")),
                    f(r.get("of_unfused"), "{:.3f}"),
                    cell(t["floor"]),
                    cell(t["torch"]),
                    cell(t["unfused"]),
                ]
            )
    return out


def target_summary(runs):
    """{target: [met, of]} over every row."""
    out = {k: [0, 0] for k in ("floor", "torch", "unfused")}
    for run in runs:
        for r in run["rows"]:
            for k, v in r["targets"].items():
                if v is not None:
                    out[k][0] += bool(v)
                    out[k][1] += 1
    return out
