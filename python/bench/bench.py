"""Times the Python package on the GPU against the issue's targets for a call with new tensors,
beside the Rust bench (`bundle/bin/run-bench.sh`, whose JSON `--rust` reads): for shapes already
seen, a call costs on the host at most the Rust call it makes + 5 µs + 0.5 µs per tensor passed,
and timed the harness's way it is within 1.05x of the kernel-only time.

Run on the GPU machine after the Rust bench, e.g. `python/gpu-check.sh "$OUT" --rust
"$OUT/nvfp4-bench.json" --rust "$OUT/nvfp4-bench-moe.json"` (it adds --routing), or with the
package importable `python3 python/bench/bench.py --out "$OUT" --routing "$OUT/moe-routing.json"
--rust ...`. The default run's device memory peaks with the d0/d2 stacked sets (16 x ~470 MB);
its time is mostly the W4A16 MoE layers' CPU prepack (~40-60 s).

Rows (each freed before the next; each input set has its own output tensors):
- --shapes (b0..b3, the task's generator `tests/nvfp4_ref.py`; d0..d2 accepted): --sets (16)
  input sets (`data` tuples); `custom_kernel(data)` and `grouped_gemm` on per-group lists taken
  from the same data (a, b, the reordered scale views, c as `out`): 5 tensors per group each;
- --w4a16 (b0..b3): `w4a16.grouped_gemm` on the same rows: bf16 activations (each set's A with its
  block scales applied: exact), fp16 out, set 0's B prepacked once (`w4a16.prepack`, on the CPU)
  for every set: x, b, b_scales, out = 4 tensors per group;
- --stacked (d0..d2 = the Rust bench's decode shapes; b0..b3 accepted): `grouped_gemm_stacked`,
  16 sets of (a [T, K/2], b [G, N, K/2], a_scales, b_scales, out [T, N]) drawn the task's way,
  host alphas 0.5, 1, 2 by group: 5 tensors;
- --moe (m0..m3, d0..d2 as layers: experts = groups, contiguous layout, max_tokens = the row's
  tokens): `MoE.__call__` (W4A4: quantize + GEMM, sizes on the device), weights fixed, 16 sets of
  (x bf16, expert offsets, out fp16): 3 tensors; --moe-w4a16: the same layer with
  `w4a16="bfloat16"` on the same sets (by default the rows whose CPU prepack is estimated within
  --prepack-limit, 30 s: m3's ~51 s is skipped and listed). Routing: the Rust bench's
  `moe-routing.json` (--routing), else the counts of the Rust JSON's MoE row (--rust), else the
  decode shape's M per group (d rows) or drawn here with the Rust bench's ranges (m rows).

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
import os
import platform
import statistics
import sys
import time
import traceback

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
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
# The CPU prepack's cost (docs/w4a16.md: ~0.2 s per 4096 x 7168 matrix on one core).
PREPACK_S_PER_ELEMENT = 0.2 / (4096 * 7168)
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
    # Set 0's B prepacked once (on the CPU) for every set.
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


def moe_prepack_estimate_s(name):
    """The W4A16 MoE layer's CPU prepack time of a row, estimated from its weight count."""
    experts, _, n, k = MOE[name]
    return experts * n * k * PREPACK_S_PER_ELEMENT


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
    """The W4A16 layer of the same weights (prepacked on the CPU when it is made: `prepack_s`)."""
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
    p.add_argument(
        "--moe-w4a16",
        default="auto",
        help="W4A16 MoE layer rows: some of --moe's rows, all, none, or auto (default: every --moe row whose CPU "
        "prepack is estimated within --prepack-limit; the others are listed as skipped)",
    )
    p.add_argument("--prepack-limit", type=float, default=30.0, help="--moe-w4a16 auto: the most seconds of CPU prepack a row may take")
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
    return p


def parse_args(argv=None):
    args = parser().parse_args(argv)
    # The W4A16 MoE rows to run; `auto` skips those whose CPU prepack would exceed the limit.
    args.moe_w4a16_skipped = {}
    if args.moe_w4a16 == "auto":
        args.moe_w4a16_rows = []
        for name in args.moe:
            est = moe_prepack_estimate_s(name)
            if est <= args.prepack_limit:
                args.moe_w4a16_rows.append(name)
            else:
                args.moe_w4a16_skipped[name] = f"CPU prepack ~{est:.0f} s > --prepack-limit {args.prepack_limit:g} s"
    elif args.moe_w4a16 == "all":
        args.moe_w4a16_rows = list(args.moe)
    else:
        try:
            args.moe_w4a16_rows = names(MOE, "MoE row")(args.moe_w4a16)
        except argparse.ArgumentTypeError as e:
            parser().error(f"argument --moe-w4a16: {e}")
        extra = [n for n in args.moe_w4a16_rows if n not in args.moe]
        if extra:
            parser().error(f"argument --moe-w4a16: {', '.join(extra)} not among --moe's rows")
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
        if name in args.moe_w4a16_skipped:
            row["calls"].append({"call": "moe_w4a16", "tensors": 3, "skipped": args.moe_w4a16_skipped[name]})
        result["moe"].append(row)
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
    print("checks: " + ("all PASS" if not bad else "FAIL " + ", ".join(bad)))
    print(f"({result['seconds']:.0f} s)", file=sys.stderr)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
