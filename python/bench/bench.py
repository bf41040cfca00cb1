"""Times the Python package on the GPU, beside the Rust bench (`bundle/bin/run-bench.sh`) run in
the same device call: `custom_kernel` competition-style on b0..b3 and the MoE rows m0..m3.

Per shape (b0..b3, the task's generator, `tests/nvfp4_ref.py`):
- check: set 0 through `custom_kernel` against the fp64 reference (rtol = atol = 1e-3);
- comp_us: 15 input sets; per repetition the L2 is flushed (256 MiB zeroed), then events around
  15 `custom_kernel` calls, one per set; region / 15, median of --reps;
- kernel_us: events around one call on set 0 (L2 flushed before), median of --iters;
- host_us: CPU clock around 50 `custom_kernel` calls on set 0 without synchronization, per call,
  median of 20 batches; launch_us the same for the bound plan's launch alone (the native call,
  no Python checks), its batches alternated with host_us's after a warm-up batch of each:
  host_us - launch_us is what the Python layer adds.
Per MoE row (bf16 activations sorted by expert, fp16 out; routing from the Rust bench's
`moe-routing.json` when --routing names it, else drawn here with the same ranges):
- moe_us: `MoE.__call__` (quantize + GEMM, sizes on the device), flushed, events, median;
- graph_us: the same captured once in a CUDA graph and replayed, its samples alternated with
  moe_us's in rounds (the GPU's speed drifts over seconds); host_us of the eager call.

Prints a table and writes `DIR/python-bench.json`.
"""

import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import nvfp4_ref  # noqa: E402

import nvfp4_gemm  # noqa: E402

SHAPES = dict(zip(["b0", "b1", "b2", "b3"], nvfp4_ref.TASK_BENCH))
MOE_ROUNDS = 5
MOE = {"m0": (64, (1, 16), 7168, 2048), "m1": (256, (1, 8), 7168, 2048), "m2": (64, (1, 16), 4096, 7168), "m3": (256, (1, 8), 4096, 7168)}


def stats(xs):
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "mean": statistics.fmean(xs), "n": len(xs)}


class Timer:
    def __init__(self):
        self.flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")

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

    def samples(self, fn, n, calls=1, warm=3):
        for _ in range(warm):
            self.region(fn, calls)
        return [self.region(fn, calls) for _ in range(n)]

    def median(self, fn, n, calls=1, warm=3):
        return stats(self.samples(fn, n, calls, warm))


def host_us(fn, calls=50, batches=20):
    return host_pair(fn, None, calls, batches)[0]


def host_pair(fn, base, calls=50, batches=20):
    """Host time per call of ``fn`` (and of ``base``, when given), batches of the two alternated
    after one warm-up batch each, so that both see the same machine state."""
    out = ([], [])
    for b in range(batches + 1):
        for f, o in ((fn, out[0]), (base, out[1])):
            if f is None:
                continue
            torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(calls):
                f()
            if b:
                o.append((time.perf_counter() - t) * 1e6 / calls)
    torch.cuda.synchronize()
    return stats(out[0]), (stats(out[1]) if base is not None else None)


def bench_shape(name, timer, args):
    ms, ns, ks = SHAPES[name]
    sets = [nvfp4_ref.task_input(ms, ns, ks, 1111 + 42 * (i + 1)) for i in range(args.sets)]
    refs = nvfp4_ref.task_reference(sets[0])
    outs = nvfp4_gemm.custom_kernel(sets[0])
    torch.cuda.synchronize()
    worst = 0.0
    ok = True
    for o, r in zip(outs, refs):
        d = (o[:, :, 0].double() - r).abs()
        ok &= bool((d <= 1e-3 + 1e-3 * r.abs()).all())
        worst = max(worst, float(d.max()) if d.numel() else 0.0)
    for d in sets[1:]:
        nvfp4_gemm.custom_kernel(d)

    def comp():
        for d in sets:
            nvfp4_gemm.custom_kernel(d)

    row = {"name": name, "m": ms, "n": ns[0], "k": ks[0], "check": "PASS" if ok else "FAIL", "max_abs_err": worst}
    row["comp_us"] = timer.median(comp, args.reps, calls=1, warm=1)
    row["comp_us"] = {k: (v / len(sets) if k != "n" else v) for k, v in row["comp_us"].items()}
    row["kernel_us"] = timer.median(lambda: nvfp4_gemm.custom_kernel(sets[0]), args.iters)
    entry = nvfp4_gemm.competition._entries[id(sets[0])]
    plan, ordinal = entry.call._plan, entry.ordinal
    stream = nvfp4_gemm._tensors.current_stream(ordinal)
    row["host_us"], row["launch_us"] = host_pair(lambda: nvfp4_gemm.custom_kernel(sets[0]), lambda: plan.launch(stream))
    row["kernel"] = entry.call.kernel
    nvfp4_gemm.competition.clear()
    return row


def routing(name, args):
    experts, (lo, hi), n, k = MOE[name]
    if args.routing:
        with open(args.routing) as f:
            doc = json.load(f)
        for r in doc.get("shapes", doc if isinstance(doc, list) else []):
            if r.get("name") == name:
                return experts, list(r["counts"]), n, k
    g = torch.Generator().manual_seed(args.seed)
    return experts, torch.randint(lo, hi + 1, (experts,), generator=g).tolist(), n, k


def bench_moe(name, timer, args):
    experts, counts, n, k = routing(name, args)
    tokens = sum(counts)
    gen = torch.Generator(device="cuda").manual_seed(7)
    w = torch.randint(0, 256, (experts, n, k // 2), generator=gen, device="cuda", dtype=torch.int32).to(torch.uint8) & 0xBB
    ws = torch.randint(0x38, 0x40, (experts, nvfp4_gemm.blocked_bytes(n, k)), generator=gen, device="cuda", dtype=torch.int32).to(torch.uint8)
    layer = nvfp4_gemm.MoE(w, ws, max_tokens=tokens, out_dtype=torch.float16)
    x = nvfp4_ref.exact_activations(tokens, k, gen, torch.bfloat16)
    offs = torch.tensor([0] + list(torch.tensor(counts).cumsum(0).tolist()), dtype=torch.int32, device="cuda")
    out = torch.zeros((tokens, n), dtype=torch.float16, device="cuda")
    layer(x, offs, out=out)
    torch.cuda.synchronize()
    # Check: expert 0's rows against the fp64 reference (weights' plain scales read back).
    rows = counts[0]
    plain = ws[0][nvfp4_ref.blocked_index(n, k)]
    ref = x[:rows].double() @ nvfp4_ref.dequant(w[0], plain, n, k).T
    ok = bool(((out[:rows].double() - ref).abs() <= 1e-3 + 1e-3 * ref.abs()).all())
    row = {"name": name, "experts": experts, "n": n, "k": k, "tokens": tokens, "counts": counts, "check": "PASS" if ok else "FAIL"}
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        layer(x, offs, out=out)
    # Eager calls and graph replays alternate in rounds, so that both columns see the same clock
    # (the H200's speed on these GEMMs drifts by up to ~10% over seconds).
    eager, replay = [], []
    per = max(1, -(-args.iters // MOE_ROUNDS))
    for _ in range(MOE_ROUNDS):
        eager += timer.samples(lambda: layer(x, offs, out=out), per, warm=1)
        replay += timer.samples(graph.replay, per, warm=1)
    row["moe_us"], row["graph_us"] = stats(eager), stats(replay)
    row["host_us"] = host_us(lambda: layer(x, offs, out=out))
    row["kernel"] = layer.kernel
    row["weight_bytes"] = w.numel() + ws.numel()
    return row


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=".")
    p.add_argument("--shapes", default="b0,b1,b2,b3")
    p.add_argument("--moe", default="m0,m1,m2,m3")
    p.add_argument("--sets", type=int, default=15)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--seed", type=int, default=2222)
    p.add_argument("--routing", help="the Rust bench's moe-routing.json (same token counts as its MoE rows)")
    args = p.parse_args()
    timer = Timer()
    dev = nvfp4_gemm.device(0)
    result = {"device": dev.name, "arch": dev.arch, "torch": torch.__version__, "shapes": [], "moe": []}
    for name in [s for s in args.shapes.split(",") if s]:
        print(f"{name} ...", file=sys.stderr, flush=True)
        result["shapes"].append(bench_shape(name, timer, args))
    for name in [s for s in args.moe.split(",") if s]:
        print(f"{name} ...", file=sys.stderr, flush=True)
        result["moe"].append(bench_moe(name, timer, args))
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "python-bench.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(f"device: {dev.name} ({dev.arch}), torch {torch.__version__}; medians, µs")
    print(f"{'shape':6} {'check':5} {'comp_us':>9} {'kernel_us':>9} {'host_us':>8} {'launch_us':>9} {'py_us':>6}")
    for r in result["shapes"]:
        h, l = r["host_us"]["median"], r["launch_us"]["median"]
        print(f"{r['name']:6} {r['check']:5} {r['comp_us']['median']:9.2f} {r['kernel_us']['median']:9.2f} {h:8.2f} {l:9.2f} {h - l:6.2f}")
    if result["moe"]:
        print(f"{'moe':6} {'check':5} {'tokens':>6} {'moe_us':>9} {'graph_us':>9} {'host_us':>8}")
        for r in result["moe"]:
            print(f"{r['name']:6} {r['check']:5} {r['tokens']:6} {r['moe_us']['median']:9.2f} {r['graph_us']['median']:9.2f} {r['host_us']['median']:8.2f}")
    bad = [r["name"] for r in result["shapes"] + result["moe"] if r["check"] != "PASS"]
    print("checks: " + ("all PASS" if not bad else "FAIL " + ", ".join(bad)))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
