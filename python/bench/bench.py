"""Times the Python package on the GPU against the issue's targets for a call with new tensors,
beside the Rust bench (`bundle/bin/run-bench.sh`, whose JSON `--rust` reads): for shapes already
seen, a call costs on the host at most the Rust call it makes + 5 µs + 0.5 µs per tensor passed,
and timed the harness's way it is within 1.05x of the kernel-only time.

Run on the GPU machine after the Rust bench, e.g. `python/gpu-check.sh "$OUT" --rust
"$OUT/nvfp4-bench.json" --rust "$OUT/nvfp4-bench-moe.json"` (it adds --routing), or with the
package importable `python3 python/bench/bench.py --out "$OUT" --routing "$OUT/moe-routing.json"
--rust ...`. The default run's device memory peaks with the d0/d2 stacked sets (16 x ~470 MB).

Rows (each freed before the next; each input set has its own output tensors):
- --shapes (b0..b3, the task's generator `tests/nvfp4_ref.py`; d0..d2 accepted): --sets (16)
  input sets (`data` tuples); `custom_kernel(data)` and `grouped_gemm` on per-group lists taken
  from the same data (a, b, the reordered scale views, c as `out`): 5 tensors per group each;
- --w4a16 (b0..b3): `w4a16.grouped_gemm` on the same rows: bf16 activations (each set's A with its
  block scales applied: exact), fp16 out, set 0's B prepacked once (`w4a16.prepack`, on the GPU)
  for every set: x, b, b_scales, out = 4 tensors per group;
- --stacked (d0..d2 = the Rust bench's decode shapes; b0..b3 accepted): `grouped_gemm_stacked`,
  16 sets of (a [T, K/2], b [G, N, K/2], a_scales, b_scales, out [T, N]) drawn the task's way,
  host alphas 0.5, 1, 2 by group: 5 tensors;
- --moe (m0..m3, d0..d2 as layers: experts = groups, contiguous layout, max_tokens = the row's
  tokens): `MoE.__call__` (W4A4: quantize + GEMM, sizes on the device), weights fixed, 16 sets of
  (x bf16, expert offsets, out fp16): 3 tensors; --moe-w4a16: the same layer with
  `w4a16="bfloat16"` on the same sets (default: every --moe row; the layer prepacks the weights
  on the GPU). Routing: the Rust bench's
  `moe-routing.json` (--routing), else the counts of the Rust JSON's MoE row (--rust), else the
  decode shape's M per group (d rows) or drawn here with the Rust bench's ranges (m rows).

- --block / --block-only (ds, qwen3, mixtral: DeepSeek-V3, Qwen3-30B-A3B, Mixtral-8x7B MoE layers,
  silu, bf16, T = 1..4096, W4A4 and W4A16): `MoEBlock` (fused) against the library's unfused
  composition (torch routing, gather and combine, `MoE` per GEMM, torch silu between) and
  PyTorch's bf16 block (`grouped_mm` on dequantized weights) on the same routing, each checked
  once against an f64 reference, then timed alternated; against the byte floor of the experts
  touched and the issue's targets (block_rows.py; docs/python.md, "Expert-block rows"). Its own
  table after the others, and `block` in the JSON.

Columns (one table line per row and call; µs are medians; JSON: each row's `calls`, with the
columns' names but same_us = `host_same_us`, new/kern = `new_ratio`, harness = `harness_ok` (and
`harness_scope`), rust_us / budget / host = `rust.us` / `rust.budget_us` / `rust.host_ok`; each
timing as {median, min, max, mean, n}):
- check: a first pass (one call per set, outputs poisoned with NaN before): set 0's and the
  last set's outputs against fp64 references from the operands' bits (|got - ref| <= 1e-3 +
  1e-3 |ref|; MoE: up to 8 experts spread over the row); grouped_gemm and the `prepare`d call
  must write custom_kernel's bits; after all the timings, set 0 and the last set called again
  into poisoned outputs (and the MoE graph replayed) must give the first pass's bits;
- comp_us (custom_kernel): per repetition the L2 flushed (a 256 MiB memset), then events around
  15 calls, one per set in turn (the competition's way); region / 15, median of --reps;
- kernel_us: events around one call on set 0 (the same tensors as the call before), L2 flushed
  before each; new_us: the same around one call on the next of the 16 sets (new tensors every
  call: the harness's way); new/kern: their ratio, `harness` PASS when <= 1.05 on the issue's
  rows (every call on b0..b3, the stacked and MoE calls on d0..d2; ok/over elsewhere). Samples
  of the columns alternate in 5 rounds (an untimed call first in each), so that they see the
  same clocks;
- graph_us (MoE): a CUDA graph of the call on set 0, captured once and replayed, in the same rounds;
- host_us: CPU clock around --host-calls back-to-back calls over the 16 sets in turn (no
  synchronization inside a batch), per call, median of --host-batches (after a warm-up batch;
  one untimed call before each batch leaves the plan as the batch's next call expects);
  same_us the same on set 0 only; launch_us the same for a `PreparedGemm` bound to set 0 (the
  native launch alone). Batches of all the columns of a row alternate;
- tensors: the tensors a call passes (budget: 0.5 µs each);
- rust_us, budget, host (with --rust): the Rust bench's host time per call, new tensors every
  call, of the call the Python call makes (its JSON row of the same name: `host_rotating_us`
  (GemmPlan::run over the rotating sets) for custom_kernel and grouped_gemm,
  `host_stacked_new_us` for the stacked call, the bf16 `w4a16` entry's `host_rotating_us`;
  MoE rows: `host_new_us`, the bf16 `w4a16` entry's `host_new_us`; --rust-field names others),
  budget = rust_us + 5 + 0.5 x tensors, host PASS when host_us <= budget. `*`: a JSON without
  that field (an older Rust bench); the budget uses a stand-in named in the JSON (`rust.field`):
  the same call on the same tensors (`host_stacked_us`, `host_cached_us`, `host_us.1`: a
  stricter budget), else W4A4's call.

Prints the table, the calls skipped or failed, the targets met and `checks: all PASS` (or what
failed), and writes `DIR/python-bench.json`. A row or call that raises is reported as ERROR and
the others still run. Exit status 1 when a check fails or a call raised (the targets are
reported, not enforced).
"""

import argparse
import itertools
import json
import math
import os
import platform
import statistics
import sys
import time
import traceback

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import block_rows as br  # noqa: E402
import nvfp4_ref  # noqa: E402

import nvfp4_gemm  # noqa: E402

CUDA = nvfp4_ref.CUDA
NAN = float("nan")

# (M per group, N per group, K per group): the task's benchmark shapes and the Rust bench's
# decode shapes (bench/src/options.rs, DECODE_SHAPES).
DECODE = {
    "d0": ([4] * 64, [7168] * 64, [2048] * 64),
    "d1": (list(range(1, 9)), [7168] * 8, [2048] * 8),
    "d2": ([16] * 32, [4096] * 32, [7168] * 32),
}
SHAPES = {**dict(zip(["b0", "b1", "b2", "b3"], nvfp4_ref.TASK_BENCH)), **DECODE}
# MoE rows: (experts, tokens per expert lo..hi, N, K) (bench/src/moe.rs, MOE_SHAPES and
# DECODE_MOE_SHAPES).
MOE = {
    "m0": (64, (1, 16), 7168, 2048),
    "m1": (256, (1, 8), 7168, 2048),
    "m2": (64, (1, 16), 4096, 7168),
    "m3": (256, (1, 8), 4096, 7168),
    "d0": (64, (4, 4), 7168, 2048),
    "d1": (8, (1, 8), 7168, 2048),
    "d2": (32, (16, 16), 4096, 7168),
}
TASK_ROWS = ("b0", "b1", "b2", "b3")
COMP_SETS = 15  # the competition's input sets per timed region
ROUNDS = 5
HARNESS_RATIO = 1.05
HOST_BASE_US, HOST_PER_TENSOR_US = 5.0, 0.5
MOE_CHECKED_EXPERTS = 8

# Where the Rust bench's JSON keeps the host time of the call each Python call makes: paths in a
# row (`a.b.c`; on a list, an index or the entry whose `activations`/`name` is the segment),
# first the matching fields, then stand-ins (marked `*`): the same call on the same tensors where
# the Rust bench has it (a stricter budget), else the nearest call.
RUST_PATHS = {
    "custom_kernel": ("shapes", ["host_rotating_us"], []),
    "grouped_gemm": ("shapes", ["host_rotating_us"], []),
    "stacked": ("shapes", ["host_stacked_new_us"], ["host_stacked_us"]),
    "w4a16": ("shapes", ["w4a16.bf16.host_rotating_us"], ["w4a16.bf16.host_cached_us", "host_rotating_us"]),
    "moe": ("moe", ["host_new_us"], ["host_us.1"]),
    "moe_w4a16": ("moe", ["w4a16.bf16.host_new_us"], ["w4a16.bf16.host_cached_us", "host_new_us", "host_us.1"]),
}


def stats(xs):
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "mean": statistics.fmean(xs), "n": len(xs)}


def spec(ms, ns, ks):
    """The Rust bench's spec of a shape: `g=2,m=128:384,n=4096,k=1536`."""

    def one(v):
        return str(v[0]) if len(set(v)) == 1 else ":".join(map(str, v))

    return f"g={len(ms)},m={one(ms)},n={one(ns)},k={one(ks)}"


# ---- timing ----------------------------------------------------------------------------------


class Timer:
    """Events around calls, the L2 flushed before each region (a memset of the flush buffer)."""

    def __init__(self, flush_mib=256):
        self.flush = torch.empty(flush_mib << 20, dtype=torch.uint8, device=CUDA)

    def region(self, fn, calls=1):
        """µs per call of `calls` calls of fn, L2 flushed before."""
        self.flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e3 / calls

    def samples(self, fn, n, calls=1, warm=1):
        for _ in range(warm):
            self.region(fn, calls)
        return [self.region(fn, calls) for _ in range(n)]

    def median(self, fn, n, calls=1, warm=1):
        return stats(self.samples(fn, n, calls, warm))

    def rounds(self, fns, n, rounds=ROUNDS):
        """n samples of each of `fns` (name -> function), alternated in rounds: per round a block
        of each, after one untimed (flushed) call that leaves the plan as the block's calls
        expect. {name: stats}."""
        per = max(1, -(-n // rounds))
        out = {name: [] for name in fns}
        for _ in range(rounds):
            for name, fn in fns.items():
                out[name] += self.samples(fn, per, warm=1)
        return {name: stats(v) for name, v in out.items()}


def single(loop, items):
    """A function that runs `loop` on one item, the next of `items` at each call."""
    it = itertools.cycle(items)
    return lambda: loop([next(it)])


def host_times(entries, calls, batches):
    """Host time per call: `entries` name -> (loop, items); each batch runs `loop` over `calls`
    items taken in turn (continuing from the previous batch), CPU clock around it, no
    synchronization inside. Before it, one untimed call on the item before the batch's first
    and a synchronization: a batch on one item is then all same-tensor calls, a rotating batch
    starts with a new set, and the GPU is idle. Batches of the entries alternate; a warm-up
    batch of each first. {name: stats}."""
    times = {name: [] for name in entries}
    start = dict.fromkeys(entries, 0)
    for b in range(batches + 1):
        for name, (loop, items) in entries.items():
            s = start[name]
            order = [items[(s + i) % len(items)] for i in range(calls)]
            start[name] = s + calls
            loop([items[(s - 1) % len(items)]])
            torch.cuda.synchronize()
            t = time.perf_counter()
            loop(order)
            dt = time.perf_counter() - t
            if b:
                times[name].append(dt * 1e6 / calls)
    torch.cuda.synchronize()
    return {name: stats(v) for name, v in times.items()}


# The calls as a user writes them, over a list of argument tuples (no wrapper per call).


def loop_custom_kernel(order):
    call = nvfp4_gemm.custom_kernel
    for data in order:
        call(data)


def loop_grouped_gemm(order):
    call = nvfp4_gemm.grouped_gemm
    for a, b, sa, sb, c in order:
        call(a, b, sa, sb, out=c)


def loop_prepared(order):
    for prepared in order:
        prepared()


def loop_stacked(order):
    call = nvfp4_gemm.grouped_gemm_stacked
    for a, b, sa, sb, ms, alphas, out in order:
        call(a, b, sa, sb, ms, alphas, out=out)


def loop_w4a16(order):
    call = nvfp4_gemm.w4a16.grouped_gemm
    for x, b, sb, out in order:
        call(x, b, sb, out=out)


def loop_moe(order):
    for layer, x, offsets, out in order:
        layer(x, offsets, out=out)


# ---- checks ----------------------------------------------------------------------------------


class Check:
    """Accumulates comparisons: PASS, or FAIL with what failed."""

    def __init__(self):
        self.problems, self.worst = [], 0.0

    def close(self, got, ref, what, tol=1e-3):
        """|got - ref| <= tol + tol |ref| elementwise (NaN fails)."""
        d = (got.reshape(ref.shape).double() - ref).abs()
        bad = int((~(d <= tol + tol * ref.abs())).sum())
        if bad:
            self.problems.append(f"{what}: {bad} of {ref.numel()} elements beyond rtol = atol = {tol:g}")
        if d.numel():
            self.worst = max(self.worst, float(d.nan_to_num(nan=float("inf")).max()))

    def bits(self, got, want, what):
        """The same bits (16-bit outputs)."""
        if not all(torch.equal(g.view(torch.int16), w.view(torch.int16)) for g, w in zip(got, want)):
            self.problems.append(f"{what}: other bits")

    def record(self):
        return {"check": "FAIL" if self.problems else "PASS", "check_detail": "; ".join(self.problems), "max_abs_err": self.worst}


def poison(tensors):
    for t in tensors:
        t.fill_(NAN)


def clones(tensors):
    return [t.clone() for t in tensors]


def ends(n):
    """The sets checked: the first and the last."""
    return (0, n - 1)


def again(check, loop, items, outs, want):
    """After the timings: each set of `want` (set index -> the first pass's outputs) called again
    into poisoned outputs (`outs[i]`: set i's output tensors) must give the same bits."""
    for i, bits in want.items():
        poison(outs[i])
        loop([items[i]])
        check.bits(outs[i], bits, f"set {i} called again after the timings")


def call_record(call, tensors, check, ev, host, scope, **extra):
    """One table line's numbers: `ev` {same, new[, ...]} events, `host` {new, same[, ...]}."""
    kernel, new = ev["same"], ev["new"]
    ratio = new["median"] / kernel["median"]
    rec = {
        "call": call,
        "tensors": tensors,
        **check.record(),
        "kernel_us": kernel,
        "new_us": new,
        "new_ratio": ratio,
        "harness_scope": scope,
        "harness_ok": ratio <= HARNESS_RATIO,
        "host_us": host["new"],
        "host_same_us": host["same"],
    }
    rec.update(extra)
    return rec


def harness_scope(name, call):
    """The issue's harness-way rows: every call on b0..b3, the stacked and MoE calls on d0..d2."""
    return name in TASK_ROWS or (name in DECODE and call in ("stacked", "moe", "moe_w4a16"))


def free():
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


# ---- per-group rows (custom_kernel, grouped_gemm, W4A16) -------------------------------------


def group_lists(data):
    """grouped_gemm's arguments from the task's `data`: a, b, the reordered scale views, c."""
    abc, _, sfr, _ = data
    return ([t[0] for t in abc], [t[1] for t in abc], [s[0] for s in sfr], [s[1] for s in sfr], [t[2] for t in abc])


def bench_shape(name, timer, args, gemm, w4a16):
    ms, ns, ks = SHAPES[name]
    row = {"name": name, "spec": spec(ms, ns, ks), "groups": len(ms), "m": ms, "n": ns[0], "k": ks[0], "calls": []}
    sets = [nvfp4_ref.task_input(ms, ns, ks, 1111 + 42 * (i + 1)) for i in range(args.sets)]
    if gemm:
        row["calls"] += gemm_calls(name, row, sets, timer, args)
    if w4a16:
        call = guarded(name, w4a16_call, name, sets, timer, args)
        row["calls"].append(call if "call" in call else {"call": "w4a16", "tensors": 4 * len(ms), "error": call["error"]})
    del sets
    free()
    return row


def gemm_calls(name, row, sets, timer, args):
    lists = [group_lists(d) for d in sets]
    groups = len(lists[0][0])
    first, last = ends(len(sets))
    refs = {i: nvfp4_ref.task_reference(sets[i]) for i in (first, last)}
    for lst in lists:
        poison(lst[4])
    loop_custom_kernel(sets)
    torch.cuda.synchronize()
    ck, gg = Check(), Check()
    want = {}
    for i in (first, last):
        for g, (c, r) in enumerate(zip(lists[i][4], refs[i])):
            ck.close(c, r, f"set {i} group {g}")
        want[i] = clones(lists[i][4])
    for i in (first, last):
        poison(lists[i][4])
        loop_grouped_gemm([lists[i]])
        gg.bits(lists[i][4], want[i], f"set {i} against custom_kernel")
    prepared = nvfp4_gemm.prepare(*lists[0][:4], out=lists[0][4])
    poison(lists[0][4])
    prepared()
    gg.bits(lists[0][4], want[first], "prepare()'s call on set 0 against custom_kernel")
    row["kernel"] = prepared.kernel
    del refs

    comp_sets = sets[:COMP_SETS]

    def comp():
        loop_custom_kernel(comp_sets)

    comp_us = timer.median(comp, args.reps)
    comp_us = {k: (v / len(comp_sets) if k != "n" else v) for k, v in comp_us.items()}
    ev = timer.rounds(
        {
            "ck_same": single(loop_custom_kernel, sets[:1]),
            "ck_new": single(loop_custom_kernel, sets),
            "gg_same": single(loop_grouped_gemm, lists[:1]),
            "gg_new": single(loop_grouped_gemm, lists),
        },
        args.iters,
    )
    host = host_times(
        {
            "ck_new": (loop_custom_kernel, sets),
            "ck_same": (loop_custom_kernel, sets[:1]),
            "gg_new": (loop_grouped_gemm, lists),
            "gg_same": (loop_grouped_gemm, lists[:1]),
            "launch": (loop_prepared, [prepared]),
        },
        args.host_calls,
        args.host_batches,
    )
    for check, loop, items in ((ck, loop_custom_kernel, sets), (gg, loop_grouped_gemm, lists)):
        again(check, loop, items, [lst[4] for lst in lists], want)
    del prepared
    calls = []
    for call, key, check, extra in (
        ("custom_kernel", "ck", ck, {"comp_us": comp_us}),
        ("grouped_gemm", "gg", gg, {"launch_us": host["launch"]}),
    ):
        calls.append(
            call_record(
                call,
                5 * groups,
                check,
                {"same": ev[f"{key}_same"], "new": ev[f"{key}_new"]},
                {"new": host[f"{key}_new"], "same": host[f"{key}_same"]},
                harness_scope(name, call),
                **extra,
            )
        )
    return calls


def w4a16_call(name, sets, timer, args):
    ms, ns, ks = SHAPES[name]
    groups = len(ms)
    arch = nvfp4_gemm.device(0).arch
    if arch != "sm_90a":
        return {"call": "w4a16", "tensors": 4 * groups, "skipped": f"W4A16 runs on sm_90a; this device is {arch}"}
    # Set 0's B prepacked once (on the GPU) for every set.
    t0 = time.perf_counter()
    abc0, sf0, _, _ = sets[0]
    weights, plain_b = [], []
    for (_, b, _), (_, sb), n, k in zip(abc0, sf0, ns, ks):
        plain = sb.view(torch.uint8).reshape(n, k // 16)
        packed = nvfp4_gemm.w4a16.prepack(b.view(torch.uint8).reshape(n, k // 2), nvfp4_ref.make_blocked(plain, n, k), "bfloat16")
        weights.append(packed)
        plain_b.append((b.view(torch.uint8).reshape(n, k // 2), plain))
    prepack_s = time.perf_counter() - t0
    wv, ws = [w[0] for w in weights], [w[1] for w in weights]
    items = []
    for abc, sf, _, _ in sets:
        xs = [
            nvfp4_ref.dequant(a.view(torch.uint8), sa.view(torch.uint8), m, k).to(torch.bfloat16)
            for (a, _, _), (sa, _), m, k in zip(abc, sf, ms, ks)
        ]
        outs = [torch.full((m, n), NAN, dtype=torch.float16, device=CUDA) for m, n in zip(ms, ns)]
        items.append((xs, wv, ws, outs))
    loop_w4a16(items)
    torch.cuda.synchronize()
    check = Check()
    first, last = ends(len(items))
    for g, ((bv, bs), n, k) in enumerate(zip(plain_b, ns, ks)):
        w = nvfp4_ref.dequant(bv, bs, n, k)
        for i in (first, last):
            check.close(items[i][3][g], items[i][0][g].double() @ w.T, f"set {i} group {g}")
        del w
    want = {i: clones(items[i][3]) for i in (first, last)}
    ev = timer.rounds({"same": single(loop_w4a16, items[:1]), "new": single(loop_w4a16, items)}, args.iters)
    host = host_times({"new": (loop_w4a16, items), "same": (loop_w4a16, items[:1])}, args.host_calls, args.host_batches)
    again(check, loop_w4a16, items, [it[3] for it in items], want)
    return call_record("w4a16", 4 * groups, check, ev, host, harness_scope(name, "w4a16"), prepack_s=prepack_s)


# ---- stacked rows ----------------------------------------------------------------------------


def random_values(shape, gen):
    """Packed e2m1 bytes drawn the task's way: random bytes & 0xBB (±{0, 0.5, 1, 1.5})."""
    return torch.randint(0, 256, shape, generator=gen, device=CUDA, dtype=torch.uint8) & 0xBB


def random_scales(count, gen):
    """e4m3 scale bytes 1.0 (0x38) or 2.0 (0x40), the task's."""
    return torch.randint(0, 2, (count,), generator=gen, device=CUDA, dtype=torch.uint8) * 8 + 0x38


def stacked_offsets(ms, n, k):
    """Each group's first row of A and first byte of the stacked a_scales; the sizes of
    a_scales and b_scales (grouped_gemm_stacked's layout: every group's blocked scales back to
    back, its rows padded to 128)."""
    rows, scales, r, s = [], [], 0, 0
    for m in ms:
        rows.append(r)
        scales.append(s)
        r += m
        s += nvfp4_gemm.blocked_bytes(m, k)
    return rows, scales, s, len(ms) * nvfp4_gemm.blocked_bytes(n, k)


def stacked_alphas(groups):
    """Host alphas, exact powers of two: 0.5, 1, 2, 0.5, ..."""
    return [2.0 ** (g % 3 - 1) for g in range(groups)]


def bench_stacked(name, timer, args):
    ms, ns, ks = SHAPES[name]
    if len(set(ns)) != 1 or len(set(ks)) != 1:
        raise SystemExit(f"{name}: the stacked call needs one N and one K for all groups")
    n, k, groups = ns[0], ks[0], len(ms)
    rows, offs, a_scale_bytes, b_scale_bytes = stacked_offsets(ms, n, k)
    alphas = stacked_alphas(groups)
    gen = torch.Generator(device=CUDA).manual_seed(args.seed)
    items = []
    for _ in range(args.sets):
        a, sa = random_values((sum(ms), k // 2), gen), random_scales(a_scale_bytes, gen)
        b, sb = random_values((groups, n, k // 2), gen), random_scales(b_scale_bytes, gen)
        out = torch.full((sum(ms), n), NAN, dtype=torch.float16, device=CUDA)
        items.append((a, b, sa, sb, ms, alphas, out))
    loop_stacked(items)
    torch.cuda.synchronize()
    check = Check()
    first, last = ends(len(items))
    bb = nvfp4_gemm.blocked_bytes(n, k)
    for i in (first, last):
        a, b, sa, sb, _, _, out = items[i]
        for g, m in enumerate(ms):
            a_plain = sa[offs[g] : offs[g] + nvfp4_gemm.blocked_bytes(m, k)][nvfp4_ref.blocked_index(m, k)]
            b_plain = sb[g * bb : (g + 1) * bb][nvfp4_ref.blocked_index(n, k)]
            ref = nvfp4_ref.reference(a[rows[g] : rows[g] + m], a_plain, b[g], b_plain, m, n, k, alphas[g])
            check.close(out[rows[g] : rows[g] + m], ref, f"set {i} group {g}")
    want = {i: clones(items[i][6:]) for i in (first, last)}
    ev = timer.rounds({"same": single(loop_stacked, items[:1]), "new": single(loop_stacked, items)}, args.iters)
    host = host_times({"new": (loop_stacked, items), "same": (loop_stacked, items[:1])}, args.host_calls, args.host_batches)
    again(check, loop_stacked, items, [it[6:] for it in items], want)
    row = {"name": name, "spec": spec(ms, ns, ks), "groups": groups, "m": ms, "n": n, "k": k, "alphas": "0.5, 1, 2 by group"}
    row["calls"] = [call_record("stacked", 5, check, ev, host, harness_scope(name, "stacked"))]
    del items, want
    free()
    return row


# ---- MoE rows --------------------------------------------------------------------------------


def routing(name, args, rust):
    """(counts, source): the Rust bench's routing file, else its JSON's row, else the decode
    shape's M per group, else drawn with the row's range (seeded)."""
    experts, (lo, hi), _, _ = MOE[name]
    if args.routing:
        with open(args.routing) as f:
            doc = json.load(f)
        for r in doc.get("shapes", []) if isinstance(doc, dict) else doc:
            if r.get("name") == name and len(r.get("counts", [])) == experts:
                return list(r["counts"]), args.routing
    r = rust["moe"].get(name)
    if r and len(r.get("counts", [])) == experts:
        return list(r["counts"]), "the Rust JSON"
    if name in DECODE and len(DECODE[name][0]) == experts:
        return list(DECODE[name][0]), "the decode shape"
    g = torch.Generator().manual_seed(args.seed)
    return torch.randint(lo, hi + 1, (experts,), generator=g).tolist(), f"drawn (seed {args.seed})"


def checked_experts(counts, most=MOE_CHECKED_EXPERTS):
    """Up to `most` experts with tokens, spread over the row (the first and the last included)."""
    have = [e for e, c in enumerate(counts) if c]
    if len(have) <= most:
        return have
    return sorted({have[round(i * (len(have) - 1) / (most - 1))] for i in range(most)})


def bench_moe(name, timer, args, rust, w4a16):
    experts, _, n, k = MOE[name]
    counts, source = routing(name, args, rust)
    tokens = sum(counts)
    offsets = [0] + list(itertools.accumulate(counts))
    gen = torch.Generator(device=CUDA).manual_seed(7)
    w = random_values((experts, n, k // 2), gen)
    ws = torch.randint(0x38, 0x40, (experts, nvfp4_gemm.blocked_bytes(n, k)), generator=gen, device=CUDA, dtype=torch.uint8)
    sets = []
    for _ in range(args.sets):
        x = nvfp4_ref.exact_activations(tokens, k, gen, torch.bfloat16)
        offs = torch.tensor(offsets, dtype=torch.int32, device=CUDA)
        sets.append((x, offs, torch.full((tokens, n), NAN, dtype=torch.float16, device=CUDA)))
    # References of the checked experts' rows in the first and the last set (exact activations:
    # W4A4's quantization is exact, and W4A16 reads them as they are).
    first, last = ends(len(sets))
    refs = {}
    for e in checked_experts(counts):
        wd = nvfp4_ref.dequant(w[e], ws[e][nvfp4_ref.blocked_index(n, k)], n, k)
        for i in (first, last):
            refs[(i, e)] = sets[i][0][offsets[e] : offsets[e + 1]].double() @ wd.T
        del wd
    row = {
        "name": name,
        "experts": experts,
        "n": n,
        "k": k,
        "tokens": tokens,
        "counts": counts,
        "routing": source,
        "weight_bytes": w.numel() + ws.numel(),
        "calls": [],
    }
    layer = nvfp4_gemm.MoE(w, ws, max_tokens=tokens, out_dtype=torch.float16)
    row["kernel"] = layer.kernel
    row["calls"].append(moe_call(name, "moe", layer, sets, refs, offsets, timer, args))
    del layer
    free()
    if w4a16:
        arch = nvfp4_gemm.device(0).arch
        if arch != "sm_90a":
            row["calls"].append({"call": "moe_w4a16", "tensors": 3, "skipped": f"W4A16 runs on sm_90a; this device is {arch}"})
        else:
            call = guarded(name, moe_w4a16_call, name, w, ws, sets, refs, offsets, timer, args)
            row["calls"].append(call if "call" in call else {"call": "moe_w4a16", "tensors": 3, "error": call["error"]})
    del sets, refs, w, ws
    free()
    return row


def moe_w4a16_call(name, w, ws, sets, refs, offsets, timer, args):
    """The W4A16 layer of the same weights (prepacked on the GPU when it is made: `prepack_s`)."""
    t0 = time.perf_counter()
    layer = nvfp4_gemm.MoE(w, ws, max_tokens=offsets[-1], out_dtype=torch.float16, w4a16="bfloat16")
    prepack_s = time.perf_counter() - t0
    rec = moe_call(name, "moe_w4a16", layer, sets, refs, offsets, timer, args, prepack_s)
    rec["kernel"] = layer.kernel
    return rec


def moe_call(name, call, layer, sets, refs, offsets, timer, args, prepack_s=None):
    items = [(layer, x, offs, out) for x, offs, out in sets]
    for item in items:
        poison([item[3]])
    loop_moe(items)
    torch.cuda.synchronize()
    check = Check()
    for (i, e), ref in refs.items():
        check.close(items[i][3][offsets[e] : offsets[e + 1]], ref, f"set {i} expert {e}")
    first, last = ends(len(items))
    want = {i: clones([items[i][3]]) for i in (first, last)}
    graph = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        loop_moe(items[:1])
    # Eager calls and graph replays alternate in rounds, so that all columns see the same clock
    # (the GPU's speed on these GEMMs drifts by up to ~10% over seconds).
    ev = timer.rounds({"same": single(loop_moe, items[:1]), "graph": graph.replay, "new": single(loop_moe, items)}, args.iters)
    host = host_times({"new": (loop_moe, items), "same": (loop_moe, items[:1])}, args.host_calls, args.host_batches)
    outs = [[it[3]] for it in items]
    poison(outs[first])
    graph.replay()
    check.bits(outs[first], want[first], "the graph's replay after the timings")
    again(check, loop_moe, items, outs, want)
    del graph
    extra = {} if prepack_s is None else {"prepack_s": prepack_s}
    return call_record(call, 3, check, ev, host, harness_scope(name, call), graph_us=ev["graph"], **extra)


# ---- expert-block rows (--block) -------------------------------------------------------------

E2M1_F32 = nvfp4_ref.E2M1.to(torch.float32)


def copy_tb_s():
    """The copy ceiling as the Rust bench measures it: a 1 GiB device-to-device copy, (read +
    write bytes) / time, median of 20 after 3 warm-ups (no L2 flush)."""
    n = 1 << 30
    src, dst = torch.empty(n, dtype=torch.uint8, device=CUDA), torch.empty(n, dtype=torch.uint8, device=CUDA)
    for _ in range(3):
        dst.copy_(src)
    times = []
    for _ in range(20):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e-3)
    del src, dst
    free()
    return 2 * n / statistics.median(times) / 1e12


def block_weights(name, seed):
    """A layer's experts as a ModelOpt checkpoint stores them, drawn on the GPU: w13 [E, 2I, H/2]
    and w2 [E, H, I/2] packed e2m1 (every code), plain e4m3 scales [E, rows, K/16] from 0.5 to 2
    (finite, positive), global scales WEIGHT_SCALE / sqrt(K); one input scale for every expert."""
    _, e, _, h, i = br.LAYERS[name]
    gen = torch.Generator(device=CUDA).manual_seed(seed)

    def values(rows, k):
        return torch.randint(0, 256, (e, rows, k // 2), generator=gen, device=CUDA, dtype=torch.uint8)

    def scales(rows, k):
        return torch.randint(br.SCALE_CODE_LO, br.SCALE_CODE_HI + 1, (e, rows, k // 16), generator=gen, device=CUDA, dtype=torch.uint8)

    return {
        "w13": values(2 * i, h),
        "s13": scales(2 * i, h),
        "g13": br.weight_scale(h),
        "w2": values(h, i),
        "s2": scales(h, i),
        "g2": br.weight_scale(i),
        "input_scale": br.INPUT_SCALE,
    }


def dequant_bf16(v, s, g):
    """[E, rows, K/2] packed values and [E, rows, K/16] plain scales -> [E, rows, K] bf16, each
    element e2m1 · e4m3 · g rounded once; a few experts at a time (~2^27 elements)."""
    e, rows, half = v.shape
    k = 2 * half
    out = torch.empty((e, rows, k), dtype=torch.bfloat16, device=CUDA)
    lut = E2M1_F32.to(CUDA)
    chunk = max(1, (1 << 27) // (rows * k))
    for a in range(0, e, chunk):
        vv = v[a : a + chunk].long()
        vals = torch.stack([lut[vv & 15], lut[vv >> 4]], dim=-1).reshape(vv.shape[0], rows, k)
        del vv
        sc = s[a : a + chunk].view(torch.float8_e4m3fn).float().repeat_interleave(16, dim=-1)
        out[a : a + chunk] = (vals * sc * g).to(torch.bfloat16)
        del vals, sc
    return out


def block_routing(tokens, experts, top_k, gen):
    """Per token `top_k` distinct experts drawn uniformly, weights the softmax of random logits:
    (int32 ids, f32 weights), [T, top_k] each, as an engine passes them."""
    ids = torch.rand((tokens, experts), generator=gen, device=CUDA).argsort(dim=1)[:, :top_k].to(torch.int32).contiguous()
    weights = torch.softmax(torch.randn((tokens, top_k), generator=gen, device=CUDA), dim=1).contiguous()
    return ids, weights


def sort_slots(ids, experts):
    """The slots sorted by expert, stably, on the device: (order [R] int64: the slot of each
    sorted row; ends [E] int32: each expert's end row (grouped_mm's offs); offsets [E + 1] int32:
    0 then the ends (nvfp4_gemm.MoE's sizes))."""
    flat = ids.reshape(-1).long()
    order = torch.argsort(flat, stable=True)
    ends = torch.cumsum(torch.bincount(flat, minlength=experts), 0).to(torch.int32)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int32, device=CUDA), ends])
    return order, ends, offsets


def combine(o_sorted, order, weights, out):
    """y[t] = sum_k w[t, k] · o[row of slot (t, k)] in fp32, rounded once into `out` (bf16)."""
    tokens, top_k = weights.shape
    o = torch.empty_like(o_sorted)
    o[order] = o_sorted
    out.copy_((o.view(tokens, top_k, -1).float() * weights.unsqueeze(-1)).sum(1))
    return out


def grouped_mm_function():
    """(function, name) of PyTorch's grouped GEMM, or (None, None)."""
    f = getattr(torch.nn.functional, "grouped_mm", None)
    if f is not None:
        return f, "torch.nn.functional.grouped_mm"
    f = getattr(torch, "_grouped_mm", None)
    return (f, "torch._grouped_mm") if f is not None else (None, None)


class TorchBlock:
    """PyTorch's bf16 expert block with the same routing: the slots sorted by expert on the
    device, the tokens gathered, `grouped_mm` (one launch per GEMM, sizes on the device) on the
    bf16 weights, silu(gate) · up, `grouped_mm`, the weighted combine in fp32; without
    `grouped_mm` (or when it refuses these operands) one `torch.mm` per expert (sizes read on the
    host)."""

    def __init__(self, name, w13, w2):
        _, self.experts, self.top_k, self.hidden, self.inter = br.LAYERS[name]
        self.w13, self.w2 = w13, w2
        gmm, gname = grouped_mm_function()
        self.gmm, self.path = None, "loop (torch.mm per expert)"
        if gmm is not None:
            ends = torch.full((self.experts,), 16, dtype=torch.int32, device=CUDA)
            probe = torch.zeros((16, self.hidden), dtype=torch.bfloat16, device=CUDA)
            # B as [E, K, N] (a K-major view of [E, N, K]); a torch that wants [E, N, K] says so.
            for b13, b2, how in ((w13.transpose(1, 2), w2.transpose(1, 2), "[E, K, N] view"), (w13, w2, "[E, N, K]")):
                try:
                    gmm(probe, b13, offs=ends, out_dtype=torch.bfloat16)
                    torch.cuda.synchronize()
                except RuntimeError:
                    continue
                self.gmm, self.b13, self.b2, self.path = gmm, b13, b2, f"{gname}, B as {how}"
                break

    def _gemm(self, a, which, ends, offsets):
        if self.gmm is not None:
            return self.gmm(a, self.b13 if which == 1 else self.b2, offs=ends, out_dtype=torch.bfloat16)
        w = self.w13 if which == 1 else self.w2
        out = torch.empty((a.shape[0], w.shape[1]), dtype=torch.bfloat16, device=CUDA)
        bounds = offsets.tolist()
        for e in range(self.experts):
            s, t = bounds[e], bounds[e + 1]
            if t > s:
                torch.mm(a[s:t], w[e].t(), out=out[s:t])
        return out

    def __call__(self, x, weights, ids, out):
        order, ends, offsets = sort_slots(ids, self.experts)
        h = self._gemm(x.index_select(0, order // self.top_k), 1, ends, offsets)
        z = torch.nn.functional.silu(h[:, : self.inter]) * h[:, self.inter :]
        return combine(self._gemm(z, 2, ends, offsets), order, weights, out)


class UnfusedBlock:
    """The library's unfused composition of the block, its separate public calls: the routing
    (slots sorted by expert) and the gather in torch, `nvfp4_gemm.MoE` for each GEMM (W4A4: the
    GPU quantization + the grouped GEMM, sizes read on the device; W4A16: the GEMM on the bf16
    rows, weights prepacked once), silu(gate) · up in torch between them, the weighted combine in
    torch. Its buffers are allocated once for `max_tokens`."""

    def __init__(self, name, wts, precision, max_tokens):
        _, self.experts, self.top_k, h, self.inter = br.LAYERS[name]
        bound = max_tokens * self.top_k
        common = {"layout": "contiguous", "max_tokens": bound, "out_dtype": torch.bfloat16, "scale_layout": "plain"}
        s = wts["input_scale"]
        if precision == "w4a16":
            self.gemm1 = nvfp4_gemm.MoE(wts["w13"], wts["s13"], wts["g13"], w4a16="bfloat16", **common)
            self.gemm2 = nvfp4_gemm.MoE(wts["w2"], wts["s2"], wts["g2"], w4a16="bfloat16", **common)
        else:
            self.gemm1 = nvfp4_gemm.MoE(wts["w13"], wts["s13"], wts["g13"] * s, input_global_scale=s, **common)
            self.gemm2 = nvfp4_gemm.MoE(wts["w2"], wts["s2"], wts["g2"] * s, input_global_scale=s, **common)

        def buf(cols):
            return torch.zeros((bound, cols), dtype=torch.bfloat16, device=CUDA)

        self.xs, self.h, self.z, self.o = buf(h), buf(2 * self.inter), buf(self.inter), buf(h)

    def __call__(self, x, weights, ids, out):
        rows = ids.numel()
        order, _, offsets = sort_slots(ids, self.experts)
        torch.index_select(x, 0, order // self.top_k, out=self.xs[:rows])
        self.gemm1(self.xs, offsets, out=self.h)
        torch.mul(torch.nn.functional.silu(self.h[:rows, : self.inter]), self.h[:rows, self.inter :], out=self.z[:rows])
        self.gemm2(self.z, offsets, out=self.o)
        return combine(self.o[:rows], order, weights, out)


def requantized(a, g):
    """Rows of 16-bit values quantized by the library's quantizer with global scale `g` (as the
    block's W4A4 steps quantize) and dequantized exactly, in f64."""
    rows, k = a.shape
    values, blocked = nvfp4_gemm.quantize(a.contiguous(), global_scale=g)
    return nvfp4_ref.dequant(values, blocked.view(torch.uint8)[nvfp4_ref.blocked_index(rows, k)], rows, k) * g


def block_reference(name, wts, x, weights, ids, precision):
    """The block in f64 on exactly dequantized weights, rounding to bf16 where the block stores
    and (W4A4) quantizing each GEMM's input with the library's quantizer (docs/moe-block.md); only
    the experts the routing touches are dequantized, one at a time."""
    _, _, _, h, i = br.LAYERS[name]
    s = wts["input_scale"]
    want = torch.zeros((x.shape[0], h), dtype=torch.float64, device=CUDA)

    def bf(v):
        return v.to(torch.bfloat16).double()

    for ex in ids.unique().tolist():
        tok, slot = (ids == ex).nonzero(as_tuple=True)
        a = x[tok]
        a = requantized(a, s) if precision == "w4a4" else a.double()
        hh = bf(a @ nvfp4_ref.dequant(wts["w13"][ex], wts["s13"][ex], 2 * i, h).T * wts["g13"])
        z = (torch.nn.functional.silu(hh[:, :i]) * hh[:, i:]).to(torch.bfloat16)
        zf = requantized(z, s) if precision == "w4a4" else z.double()
        o = bf(zf @ nvfp4_ref.dequant(wts["w2"][ex], wts["s2"][ex], h, i).T * wts["g2"])
        want.index_add_(0, tok, weights[tok, slot].double().unsqueeze(1) * o)
    return want


def relative_error(got, want):
    """‖got − want‖ / ‖want‖ (inf for a non-finite output)."""
    got = got.double()
    if not bool(torch.isfinite(got).all()):
        return math.inf
    return float((got - want).norm() / want.norm().clamp_min(1e-300))


def block_check(name, wts, paths, precision, tokens, gen):
    """One call of each path (outputs poisoned with NaN) on `tokens` tokens against the f64
    reference: the fused block and the unfused composition against the precision's reference,
    PyTorch's bf16 block against W4A16's (bf16 activations as they are); the fused block within
    CHECK_BOUND, the baselines within BASELINE_BOUND. {path: relative error},
    PASS/FAIL text, passed."""
    _, e, k, h, _ = br.LAYERS[name]
    x = torch.randn((tokens, h), generator=gen, device=CUDA).to(torch.bfloat16)
    ids, weights = block_routing(tokens, e, k, gen)
    errors = {}
    refs = {}
    for path, fn in paths.items():
        want_p = "w4a16" if path == "torch" else precision
        if want_p not in refs:
            refs[want_p] = block_reference(name, wts, x, weights, ids, want_p)
        out = torch.full((tokens, h), NAN, dtype=torch.bfloat16, device=CUDA)
        fn(x, weights, ids, out)
        torch.cuda.synchronize()
        errors[path] = relative_error(out, refs[want_p])
    bound = {p: br.CHECK_BOUND if p == "fused" else br.BASELINE_BOUND for p in errors}
    bad = [f"{p} {err:.2e}" for p, err in errors.items() if not err <= bound[p]]
    text = ", ".join(f"{p} {err:.2e}" for p, err in errors.items())
    touched = ids.unique().numel()
    verdict = "FAIL" if bad else "PASS"
    bounds = f"bound fused {br.CHECK_BOUND:g}, baselines {br.BASELINE_BOUND:g}"
    return errors, f"{verdict}: T = {tokens} ({touched} experts), ‖got − ref‖ / ‖ref‖ {text} ({bounds})", not bad


def bench_block(name, timer, args, copy_rate):
    """One layer: its experts drawn on the GPU, PyTorch's bf16 weights dequantized from them,
    then per precision the fused block (`nvfp4_gemm.MoEBlock`) and the unfused composition made,
    the three paths checked once, and every token count timed on all three alternated in rounds
    (events around one call after an L2 flush, median of --iters). The precision's objects are
    freed before the next precision's."""
    model, e, k, h, i = br.LAYERS[name]
    t0 = time.perf_counter()
    wts = block_weights(name, args.seed)
    torch_block = TorchBlock(name, dequant_bf16(wts["w13"], wts["s13"], wts["g13"]), dequant_bf16(wts["w2"], wts["s2"], wts["g2"]))
    result = {
        "name": name,
        "model": model,
        "experts": e,
        "top_k": k,
        "hidden": h,
        "intermediate": i,
        "weight_bytes": br.weight_bytes(name),
        "bf16_weight_bytes": br.bf16_weight_bytes(name),
        "torch_path": torch_block.path,
        "setup_s": time.perf_counter() - t0,
        "runs": [],
    }
    max_tokens = max(args.block_tokens + [args.block_check_tokens])
    gen = torch.Generator(device=CUDA).manual_seed(args.seed + 1)
    for precision in args.block_precisions:
        run = {"name": name, "precision": precision, "rows": []}
        result["runs"].append(run)
        fused = unfused = paths = None
        # "w4a4-epilogue": W4A4 with the activation in the first GEMM's epilogue (the same
        # arithmetic: the unfused composition and the check are W4A4's).
        kind = "w4a16" if precision == "w4a16" else "w4a4"
        try:
            t1 = time.perf_counter()
            fused = nvfp4_gemm.MoEBlock(
                wts["w13"], wts["s13"], wts["g13"], wts["w2"], wts["s2"], wts["g2"], wts["input_scale"], wts["input_scale"],
                top_k=k, max_tokens=max_tokens, w4a16=kind == "w4a16", activation_epilogue=precision == "w4a4-epilogue",
            )
            run["build_s"] = time.perf_counter() - t1
            unfused = UnfusedBlock(name, wts, kind, max_tokens)
            paths = {
                "fused": lambda x, w, ids, out: fused(x, w, ids, out=out),
                "unfused": unfused,
                "torch": torch_block,
            }
            run["check_errors"], run["check_detail"], ok = block_check(name, wts, paths, kind, args.block_check_tokens, gen)
            run["check"] = "PASS" if ok else "FAIL"
            for tokens in args.block_tokens:
                x = torch.randn((tokens, h), generator=gen, device=CUDA).to(torch.bfloat16)
                ids, weights = block_routing(tokens, e, k, gen)
                outs = {p: torch.empty((tokens, h), dtype=torch.bfloat16, device=CUDA) for p in paths}
                fns = {p: (lambda fn=fn, o=outs[p], x=x, w=weights, i=ids: fn(x, w, i, o)) for p, fn in paths.items()}
                ev = timer.rounds(fns, args.iters)
                finite = all(bool(torch.isfinite(o).all()) for o in outs.values())
                touched = ids.unique().numel()
                fb = br.floor_bytes(name, tokens, touched)
                fu = br.floor_us(fb, copy_rate)
                us, tu, uu = ev["fused"]["median"], ev["torch"]["median"], ev["unfused"]["median"]
                row = {
                    "tokens": tokens,
                    "touched": touched,
                    "floor_bytes": fb,
                    "floor_us": fu,
                    "us": ev["fused"],
                    "torch_us": ev["torch"],
                    "unfused_us": ev["unfused"],
                    "of_floor": fu / us,
                    "x_torch": tu / us,
                    "of_unfused": us / uu,
                    "finite": finite,
                }
                row["targets"] = br.targets(tokens, row["of_floor"], row["x_torch"], row["of_unfused"])
                if not finite:
                    run["check"] = "FAIL"
                    run["check_detail"] += f"; T = {tokens}: a non-finite output"
                run["rows"].append(row)
                del x, ids, weights, outs, fns
        except Exception as ex:  # noqa: BLE001  (the other precision and layers still run)
            traceback.print_exc()
            run["error"] = f"{type(ex).__name__}: {ex}"
            run["check"] = "ERROR"
        finally:
            # The precision's block and layers go before the next precision's are made.
            fused = unfused = paths = None
            free()
    del wts, torch_block
    free()
    return result


def block_runs(result):
    """Every layer's runs (each with its layer's name)."""
    return [run for layer in result["block"]["layers"] for run in layer.get("runs", [])]


def print_block(result, args):
    block = result["block"]
    runs = block_runs(result)
    print(
        f"\nMoE expert block (MoEBlock, bf16 in and out; events around one call after an L2 flush, median of {args.iters}, "
        f"the three paths alternated in rounds): torch = PyTorch's bf16 block with the same routing, unfused = the "
        f"library's separate calls (torch routing, MoE per GEMM, torch silu and combine); floor = (NVFP4 weights of "
        f"the distinct experts touched + x and y) / copy {block['copy_tb_s']:.2f} TB/s"
    )
    print(aligned(br.HEADER, br.table_rows([r for r in runs if r["rows"]])))
    for layer in block["layers"]:
        if layer.get("error"):
            print(f"block {layer['name']}: ERROR {layer['error']}")
            continue
        print(f"block {layer['name']} ({layer['model']}): PyTorch path {layer['torch_path']}")
        for run in layer["runs"]:
            what = run.get("error") or run.get("check_detail", "")
            print(f"block {layer['name']} {run['precision']}: {what}")
    t = block["targets"]
    print(
        "block targets: "
        + "; ".join(f"{k} {t[k][0]}/{t[k][1]}" for k in ("floor", "torch", "unfused"))
        + " (floor: T <= 64 at >= 75%; torch: T <= 64 >= 3x, T = 4096 >= 1.1x; unfused: T <= 64 <= 0.75x)"
    )


# ---- the Rust bench's JSON -------------------------------------------------------------------


def load_rust(paths):
    """The Rust bench's rows by name, merged over its JSON files: {shapes: {}, moe: {}}."""
    out = {"shapes": {}, "moe": {}}
    for path in paths or []:
        with open(path) as f:
            doc = json.load(f)
        for r in doc.get("shapes") or []:
            if isinstance(r, dict) and "name" in r:
                out["shapes"][r["name"]] = r
        moe = doc.get("moe") or {}
        for r in (moe.get("shapes") or []) if isinstance(moe, dict) else []:
            if isinstance(r, dict) and "name" in r:
                out["moe"][r["name"]] = r
    return out


def lookup(row, path):
    """The value at `path` (`a.b.c`) in a Rust row: on a dict its key, on a list an index or the
    entry whose `activations` or `name` is the segment; None when absent."""
    v = row
    for seg in path.split("."):
        if isinstance(v, dict):
            v = v.get(seg)
        elif isinstance(v, list):
            if seg.isdigit():
                v = v[int(seg)] if int(seg) < len(v) else None
            else:
                v = next((e for e in v if isinstance(e, dict) and seg in (e.get("activations"), e.get("name"))), None)
        else:
            return None
        if v is None:
            return None
    return v


def median_us(v):
    """A Rust timing (Stats or a number) as µs, None when it is neither."""
    if isinstance(v, dict):
        v = v.get("median")
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v)


def rust_paths(overrides):
    """RUST_PATHS with `--rust-field CALL=PATH[,PATH...]` replacing a call's paths (no stand-ins)."""
    paths = dict(RUST_PATHS)
    for item in overrides or []:
        call, _, text = item.partition("=")
        if call not in paths or not text:
            raise ValueError(f"{item}: expected CALL=PATH[,PATH...], CALL one of {', '.join(paths)}")
        paths[call] = (paths[call][0], [p for p in text.split(",") if p], [])
    return paths


def rust_budget(rust, paths, name, rec):
    """The Rust call's host time for a call record, its budget and verdict; None without one."""
    section, exact, stand_ins = paths[rec["call"]]
    row = rust[section].get(name)
    if row is None:
        return None
    for stand_in, chain in ((False, exact), (True, stand_ins)):
        for path in chain:
            us = median_us(lookup(row, path))
            if us is not None:
                budget = us + HOST_BASE_US + HOST_PER_TENSOR_US * rec["tensors"]
                return {
                    "field": path,
                    "stand_in": stand_in,
                    "us": us,
                    "budget_us": budget,
                    "host_ok": rec["host_us"]["median"] <= budget,
                }
    return None


# ---- output ----------------------------------------------------------------------------------


def aligned(header, rows):
    """A text table: the first two columns left-aligned, the others right-aligned."""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = []
    for r in [header, *rows]:
        cells = [f"{str(c):<{w}}" if i < 2 else f"{str(c):>{w}}" for i, (c, w) in enumerate(zip(r, widths))]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def every_row(result):
    return result["shapes"] + result["stacked"] + result["moe"]


def table_rows(result):
    """The table's lines (one per row and measured call), and a line per call not measured."""

    def f(v):
        if v is None:
            return "-"
        if isinstance(v, dict):
            v = v["median"]
        return f"{v:.2f}"

    rows, others = [], []
    for r in every_row(result):
        for c in r["calls"]:
            if "host_us" not in c:
                what = f"skipped ({c['skipped']})" if "skipped" in c else f"ERROR {c.get('error')}"
                others.append(f"{r['name']} {c['call']}: {what}")
                continue
            if c["harness_scope"]:
                harness = "PASS" if c["harness_ok"] else "FAIL"
            else:
                harness = "ok" if c["harness_ok"] else "over"
            rb = c.get("rust")
            mark = "*" if rb and rb["stand_in"] else ""
            rows.append(
                [
                    r["name"],
                    c["call"],
                    c["check"],
                    f(c.get("comp_us")),
                    f(c["kernel_us"]),
                    f(c["new_us"]),
                    f"{c['new_ratio']:.3f}",
                    harness,
                    f(c.get("graph_us")),
                    f(c["host_us"]),
                    f(c["host_same_us"]),
                    f(c.get("launch_us")),
                    str(c["tensors"]),
                    f(rb["us"]) + mark if rb else "-",
                    f(rb["budget_us"]) if rb else "-",
                    (("PASS" if rb["host_ok"] else "FAIL") + mark) if rb else "-",
                ]
            )
    return rows, others


HEADER = "row call check comp_us kernel_us new_us new/kern harness graph_us host_us same_us launch_us tensors rust_us budget host"
HEADER = HEADER.split()


def targets(result):
    """The issue's targets over the calls measured: [met, of, failures] for the harness way (its
    rows only) and the host budget (calls with a Rust time)."""
    harness, host = [0, 0, []], [0, 0, []]
    for r in every_row(result):
        for c in r["calls"]:
            if "host_us" not in c:
                continue
            label = f"{r['name']} {c['call']}"
            if c["harness_scope"]:
                harness[1] += 1
                harness[0] += c["harness_ok"]
                if not c["harness_ok"]:
                    harness[2].append(f"{label} {c['new_ratio']:.3f}x")
            if c.get("rust"):
                host[1] += 1
                host[0] += c["rust"]["host_ok"]
                if not c["rust"]["host_ok"]:
                    host[2].append(f"{label} {c['host_us']['median']:.2f} > {c['rust']['budget_us']:.2f} us")
    return {"harness": harness, "host": host}


def guarded(name, fn, *args):
    """fn(*args), or on an exception (printed) a row that says so: the other rows still run and
    the JSON is still written."""
    try:
        return fn(*args)
    except Exception as e:  # noqa: BLE001  (a bench run reports every row it can)
        traceback.print_exc()
        try:
            free()
        except Exception:  # noqa: BLE001
            pass
        return {"name": name, "error": f"{type(e).__name__}: {e}", "calls": []}


def names(known, what):
    """An argparse type: a comma-separated list of `known` names, `all` or `none`."""

    def parse(text):
        if text in ("", "none"):
            return []
        if text == "all":
            return list(known)
        items = [s.strip() for s in text.split(",") if s.strip()]
        bad = [s for s in items if s not in known]
        if bad:
            raise argparse.ArgumentTypeError(f"unknown {what} {', '.join(bad)} (known: {', '.join(known)}, all, none)")
        return items

    return parse


def at_least(low):
    def parse(text):
        v = int(text)
        if v < low:
            raise argparse.ArgumentTypeError(f"at least {low}")
        return v

    return parse


def parser():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=".", help="where python-bench.json goes")
    p.add_argument("--shapes", type=names(SHAPES, "shape"), default="b0,b1,b2,b3", help="custom_kernel and grouped_gemm rows")
    p.add_argument("--w4a16", type=names(SHAPES, "shape"), default="b0,b1,b2,b3", help="w4a16.grouped_gemm rows (sm_90a)")
    p.add_argument("--stacked", type=names(SHAPES, "shape"), default="d0,d1,d2", help="grouped_gemm_stacked rows")
    p.add_argument("--moe", type=names(MOE, "MoE row"), default="m0,m1,m2,m3,d0,d1,d2", help="MoE layer rows (W4A4)")
    p.add_argument("--moe-w4a16", default="all", help="W4A16 MoE layer rows: some of --moe's rows, all (default) or none")
    p.add_argument("--sets", type=at_least(2), default=16, help="input sets per row (rotated)")
    p.add_argument("--reps", type=at_least(1), default=20, help="comp_us repetitions")
    p.add_argument("--iters", type=at_least(1), default=50, help="samples of each event-timed column")
    p.add_argument("--host-calls", type=at_least(1), default=32, help="calls per host batch")
    p.add_argument("--host-batches", type=at_least(1), default=20, help="host batches per column")
    p.add_argument("--seed", type=int, default=2222)
    p.add_argument("--routing", help="the Rust bench's moe-routing.json (same token counts as its MoE rows)")
    p.add_argument(
        "--rust",
        action="append",
        default=[],
        metavar="JSON",
        help="the Rust bench's JSON (nvfp4-bench.json, nvfp4-bench-moe.json; repeatable, a later file's row of a name "
        "replaces an earlier one's): host budgets",
    )
    p.add_argument(
        "--rust-field",
        action="append",
        default=[],
        metavar="CALL=PATH",
        help=f"where the Rust JSON keeps a call's host time (CALL: {', '.join(RUST_PATHS)}; PATH like host_us.1 "
        "or w4a16.bf16.host_rotating_us; several comma-separated, first found wins)",
    )
    p.add_argument("--block", action="store_true", help="the expert-block rows: ds, qwen3, mixtral (MoEBlock against PyTorch's bf16 block and the unfused composition)")
    p.add_argument("--block-shapes", default=None, metavar="LIST", help="which block layers: ds, qwen3, mixtral (comma-separated), all or none; implies --block")
    p.add_argument("--block-tokens", default=None, metavar="LIST", help="the block rows' token counts (default 1,8,64,512,4096)")
    p.add_argument("--block-precision", default="all", metavar="LIST", help="w4a4, w4a4-epilogue, w4a16 (comma-separated) or all (default)")
    p.add_argument("--block-check-tokens", type=at_least(1), default=br.CHECK_TOKENS, help="tokens of each block's check (default 2)")
    p.add_argument("--block-quick", action="store_true", help="the quicker block subset: qwen3 and mixtral at T = 1,64,4096; implies --block")
    p.add_argument("--block-only", action="store_true", help="run the block rows only (--shapes, --w4a16, --stacked and --moe none)")
    return p


def parse_args(argv=None):
    args = parser().parse_args(argv)
    # The W4A16 MoE rows to run.
    if args.moe_w4a16 == "all":
        args.moe_w4a16_rows = list(args.moe)
    else:
        try:
            args.moe_w4a16_rows = names(MOE, "MoE row")(args.moe_w4a16)
        except argparse.ArgumentTypeError as e:
            parser().error(f"argument --moe-w4a16: {e}")
        extra = [n for n in args.moe_w4a16_rows if n not in args.moe]
        if extra:
            parser().error(f"argument --moe-w4a16: {', '.join(extra)} not among --moe's rows")
    # The block rows: layers, token counts and precisions (the options' text replaced by lists).
    tokens_text, args.block_layers, args.block_tokens, args.block_precisions = args.block_tokens, [], [], []
    if args.block or args.block_quick or args.block_shapes is not None or args.block_only:
        try:
            args.block_layers, args.block_tokens, args.block_precisions = br.selection(
                args.block_shapes, tokens_text, args.block_precision, args.block_quick
            )
        except ValueError as e:
            parser().error(f"block options: {e}")
    elif tokens_text is not None:
        parser().error("--block-tokens needs --block, --block-quick or --block-shapes")
    if args.block_only:
        args.shapes, args.w4a16, args.stacked, args.moe, args.moe_w4a16_rows = [], [], [], [], []
    try:
        args.rust_paths = rust_paths(args.rust_field)
    except ValueError as e:
        parser().error(f"argument --rust-field: {e}")
    return args


def main():
    args = parse_args()
    rust = load_rust(args.rust)
    timer = Timer()
    dev = nvfp4_gemm.device(0)
    options = {k: v for k, v in vars(args).items() if k != "rust_paths"}
    result = {
        "tool": "python/bench/bench.py",
        "device": dev.name,
        "arch": dev.arch,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "options": options,
        "rust_files": args.rust,
        "shapes": [],
        "stacked": [],
        "moe": [],
    }
    t_start = time.perf_counter()

    def progress(what):
        print(f"[{time.perf_counter() - t_start:6.1f} s] {what} ...", file=sys.stderr, flush=True)

    for name in dict.fromkeys(args.shapes + args.w4a16):
        progress(name)
        result["shapes"].append(guarded(name, bench_shape, name, timer, args, name in args.shapes, name in args.w4a16))
    nvfp4_gemm.clear_cache()
    for name in args.stacked:
        progress(f"{name} stacked")
        result["stacked"].append(guarded(name, bench_stacked, name, timer, args))
    nvfp4_gemm.clear_cache()
    for name in args.moe:
        progress(f"{name} MoE")
        row = guarded(name, bench_moe, name, timer, args, rust, name in args.moe_w4a16_rows)
        result["moe"].append(row)
    if args.block_layers:
        nvfp4_gemm.clear_cache()
        progress("copy ceiling")
        result["block"] = {"copy_tb_s": copy_tb_s(), "layers": []}
        for name in args.block_layers:
            progress(f"{name} expert block")
            result["block"]["layers"].append(guarded(name, bench_block, name, timer, args, result["block"]["copy_tb_s"]))
        result["block"]["targets"] = br.target_summary(block_runs(result))
    for r in every_row(result):
        for c in r["calls"]:
            if "host_us" in c:
                c["rust"] = rust_budget(rust, args.rust_paths, r["name"], c) if args.rust else None
    result["targets"] = targets(result)
    result["seconds"] = time.perf_counter() - t_start
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "python-bench.json"), "w") as f:
        json.dump(result, f, indent=1)

    rows, others = table_rows(result)
    print(f"device: {dev.name} ({dev.arch}), torch {torch.__version__}, Python {platform.python_version()}; medians, µs")
    print(
        f"{args.sets} input sets per row; harness: new_us <= {HARNESS_RATIO} x kernel_us (PASS/FAIL on b0..b3 and the "
        f"stacked and MoE calls on d0..d2); host budget = Rust call + {HOST_BASE_US:g} + {HOST_PER_TENSOR_US:g} x tensors"
        + ("" if args.rust else " (no --rust: no budgets)")
    )
    if rows or not args.block_layers:
        print(aligned(HEADER, rows))
    for line in others:
        print(line)
    if any((c.get("rust") or {}).get("stand_in") for r in every_row(result) for c in r["calls"]):
        print("*: the Rust JSON has no host time of this call with new tensors; the budget uses a stand-in (JSON: rust.field)")
    for section in ("shapes", "stacked", "moe"):
        for r in result[section]:
            if r.get("error"):
                print(f"{r['name']} ({section} row): ERROR {r['error']}")
    for r in every_row(result):
        for c in r["calls"]:
            if c.get("check_detail"):
                print(f"{r['name']} {c['call']}: {c['check_detail']}")
    t = result["targets"]
    met, of, bad = t["harness"]
    line = f"targets: harness way {met}/{of}" + (f" (FAIL {', '.join(bad)})" if bad else "")
    met, of, bad = t["host"]
    line += f"; host budget {met}/{of}" + (f" (FAIL {', '.join(bad)})" if bad else "") if of else "; host budget: no Rust times"
    print(line)
    bad = [f"{r['name']} ({s} row)" for s in ("shapes", "stacked", "moe") for r in result[s] if r.get("error")]
    bad += [f"{r['name']} {c['call']}" for r in every_row(result) for c in r["calls"] if c.get("check") == "FAIL" or "error" in c]
    if args.block_layers:
        print_block(result, args)
        bad += [f"block {layer['name']}" for layer in result["block"]["layers"] if layer.get("error")]
        bad += [f"block {r['name']} {r['precision']}" for r in block_runs(result) if r.get("check") != "PASS"]
    print("checks: " + ("all PASS" if not bad else "FAIL " + ", ".join(bad)))
    print(f"({result['seconds']:.0f} s)", file=sys.stderr)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
