#!/usr/bin/env python3
"""PyTorch's best option for the MoE rows of nvfp4-bench: the same shapes and routings, bf16
activations times bf16 weights (the NVFP4 weights dequantized ahead of time, which a Hopper user
without FP4 tensor instructions would do), bf16 output.

    python3 bundle/bin/torch_moe.py --out DIR [--routing FILE] [--iters 50] [--flush-mib 256]
                                    [--flush write|read] [--seed 2222] [--moe-shapes m0,m1,m2,m3]

Routings: from FILE (`nvfp4-bench --write-moe-routing FILE` writes it; `nvfp4-bench --moe` writes
DIR/moe-routing.json and runs this script itself), or, without --routing, drawn by running
`nvfp4-bench --write-moe-routing` beside this script with --seed and --moe-shapes.

Per shape, with T tokens sorted by expert (x: [T, K] bf16), expert weights w: [E, N, K] bf16
(random: the time does not depend on the values), offsets on the device, output [T, N] bf16:
    grouped_mm        torch.nn.functional.grouped_mm (or torch._grouped_mm) of x and w^T with the
                      end offsets (int32, on the device): one launch, sizes read on the device
    grouped_mm+graph  the same captured once in a CUDA graph and replayed
    loop              one torch.mm per non-empty expert into its rows of the output (sizes on the host)
    loop+graph        the loop captured in a graph: reported, but never "best", since the graph
                      bakes in this routing's sizes and cannot serve the next step
Each path is checked once against an fp32 reference (|got - ref| <= 2e-2 * (|ref| + rms(ref)))
and timed like nvfp4-bench's kernel-only rows: the L2 flushed before each call (--flush write, the
default: zeroing a FLUSH-MiB buffer, which leaves dirty lines; --flush read: summing it, which
leaves clean ones; nvfp4-bench passes its own mode), CUDA events around it, median of ITERS after 3 warm-ups. `best` is the fastest path
that passed among grouped_mm, grouped_mm+graph and loop.

Writes DIR/torch-moe.json ({"tool", "torch", "device", ..., "shapes": [{"name", "experts", "n",
"k", "tokens", "counts", "paths": {path: {median, min, max, mean, n}}, "path_errors",
"checks", "best", "best_us"}]}) and prints a table. Without torch or a GPU it writes
{"unavailable": why} and exits with status 3.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

BEST_CANDIDATES = ("grouped_mm", "grouped_mm+graph", "loop")
TOOL = "torch_moe.py"


def write_json(out_dir, payload):
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "torch-moe.json")
    with open(path, "w") as f:
        json.dump(payload, f, indent=2)
        f.write("\n")
    return path


def unavailable(out_dir, why):
    path = write_json(out_dir, {"tool": TOOL, "unavailable": why})
    print(f"{TOOL}: unavailable: {why} (wrote {path})", file=sys.stderr)
    sys.exit(3)


def load_routing(args):
    if args.routing:
        with open(args.routing) as f:
            return json.load(f), args.routing
    here = os.path.dirname(os.path.abspath(__file__))
    bench = os.path.join(here, "nvfp4-bench")
    path = os.path.join(args.out, "moe-routing.json")
    os.makedirs(args.out, exist_ok=True)
    cmd = [bench, "--write-moe-routing", path, "--seed", str(args.seed)]
    if args.moe_shapes:
        cmd += ["--moe-shapes", args.moe_shapes]
    subprocess.run(cmd, check=True)
    with open(path) as f:
        return json.load(f), path


def stats(samples):
    return {
        "median": statistics.median(samples),
        "min": min(samples),
        "max": max(samples),
        "mean": statistics.fmean(samples),
        "n": len(samples),
    }


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="bench-results", help="folder for torch-moe.json")
    p.add_argument("--routing", help="routing file (nvfp4-bench --write-moe-routing)")
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--flush-mib", type=int, default=256)
    p.add_argument("--flush", choices=["write", "read"], default="write")
    p.add_argument("--seed", type=int, default=2222)
    p.add_argument("--moe-shapes", help="without --routing: which MoE shapes (nvfp4-bench --moe-shapes)")
    args = p.parse_args()

    try:
        import torch
    except ImportError as e:
        unavailable(args.out, f"python3 cannot import torch ({e})")
    if not torch.cuda.is_available():
        unavailable(args.out, f"torch {torch.__version__} sees no CUDA device")
    routing, routing_path = load_routing(args)

    dev = torch.device("cuda", 0)
    grouped_mm = getattr(torch.nn.functional, "grouped_mm", None)
    grouped_name = "torch.nn.functional.grouped_mm"
    if grouped_mm is None:
        grouped_mm = getattr(torch, "_grouped_mm", None)
        grouped_name = "torch._grouped_mm" if grouped_mm is not None else None
    flush_buffer = torch.zeros(args.flush_mib << 20, dtype=torch.uint8, device=dev)

    def flush():
        if args.flush == "read":
            flush_buffer.view(torch.int64).sum()
        else:
            flush_buffer.zero_()

    def time_us(fn):
        for _ in range(3):
            flush()
            fn()
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(args.iters)]
        for start, end in events:
            flush()
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize()
        return stats([start.elapsed_time(end) * 1e3 for start, end in events])

    def captured(fn):
        """fn captured in a CUDA graph (after warm-up on a side stream); returns (replay, output)."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = fn()
        return graph.replay, out

    def run_shape(shape):
        experts, n, k, counts = shape["experts"], shape["n"], shape["k"], shape["counts"]
        tokens = sum(counts)
        gen = torch.Generator(device=dev).manual_seed(args.seed)
        x = torch.randn(tokens, k, device=dev, dtype=torch.bfloat16, generator=gen)
        w = torch.randn(experts, n, k, device=dev, dtype=torch.bfloat16, generator=gen).mul_(k**-0.5)
        ends, total = [], 0
        for c in counts:
            total += c
            ends.append(total)
        starts = [e - c for e, c in zip(ends, counts)]
        offs = torch.tensor(ends, dtype=torch.int32, device=dev)
        wt = w.transpose(1, 2)  # [E, K, N], K-major: the layout grouped_mm wants for its B
        out = torch.empty(tokens, n, device=dev, dtype=torch.bfloat16)

        def loop():
            for e in range(experts):
                if counts[e]:
                    s, t = starts[e], ends[e]
                    torch.mm(x[s:t], w[e].t(), out=out[s:t])
            return out

        paths = {}
        if grouped_mm is not None:
            # B as [E, K, N] (a K-major view of w), as out = x @ w_e^T needs; should this torch
            # want the weights as [E, N, K] instead, the probe's error says so and w is passed.
            b = wt
            try:
                grouped_mm(x, wt, offs=offs, out_dtype=torch.bfloat16)
                torch.cuda.synchronize()
            except RuntimeError:
                b = w
            paths["grouped_mm"] = lambda: grouped_mm(x, b, offs=offs, out_dtype=torch.bfloat16)
        paths["loop"] = loop

        reference = torch.empty(tokens, n, device=dev, dtype=torch.float32)
        for e in range(experts):
            if counts[e]:
                s, t = starts[e], ends[e]
                reference[s:t] = x[s:t].float() @ w[e].float().t()
        rms = reference.square().mean().sqrt().item()

        def check(result):
            diff = (result.float() - reference).abs()
            bad = int((diff > 2e-2 * (reference.abs() + rms)).sum())
            worst = diff.max().item() / max(reference.abs().max().item(), 1e-30)
            return ("PASS" if bad == 0 else "FAIL") + f": {bad}/{diff.numel()} outside, max |diff| / max |ref| {worst:.2e}"

        timings, errors, checks = {}, {}, {}
        for name in list(paths):
            fn = paths[name]
            for variant in (name, name + "+graph"):
                try:
                    if variant.endswith("+graph"):
                        replay, result = captured(fn)
                        out.zero_()
                        replay()
                        call = replay
                    else:
                        out.zero_()
                        result = fn()
                        call = fn
                    torch.cuda.synchronize()
                    checks[variant] = check(result)
                    timings[variant] = time_us(call)
                except Exception as e:  # noqa: BLE001 - any failure of one path is reported, the rest go on
                    errors[variant] = f"{type(e).__name__}: {e}".strip()
                    torch.cuda.synchronize()
        eligible = {
            p: t["median"] for p, t in timings.items() if p in BEST_CANDIDATES and checks.get(p, "").startswith("PASS")
        }
        row = {
            "name": shape["name"],
            "spec": shape.get("spec"),
            "experts": experts,
            "n": n,
            "k": k,
            "tokens": tokens,
            "counts": counts,
            "weight_bytes_bf16": experts * n * k * 2,
            "paths": timings,
            "path_errors": errors,
            "checks": checks,
        }
        if eligible:
            row["best"] = min(eligible, key=eligible.get)
            row["best_us"] = eligible[row["best"]]
        else:
            row["error"] = "no path passed its check: " + "; ".join(f"{p}: {m}" for p, m in {**errors, **checks}.items())
        return row

    rows = []
    for shape in routing["shapes"]:
        try:
            rows.append(run_shape(shape))
        except Exception as e:  # noqa: BLE001 - e.g. out of memory on one shape
            rows.append({**{key: shape[key] for key in ("name", "experts", "n", "k", "counts")}, "error": f"{type(e).__name__}: {e}"})
        torch.cuda.empty_cache()

    payload = {
        "tool": TOOL,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name(dev),
        "grouped_mm": grouped_name,
        "iters": args.iters,
        "flush_bytes": args.flush_mib << 20,
        "flush": args.flush,
        "seed": routing.get("seed"),
        "routing": routing_path,
        "shapes": rows,
    }
    path = write_json(args.out, payload)

    names = ["grouped_mm", "grouped_mm+graph", "loop", "loop+graph"]
    print(f"PyTorch {torch.__version__} (CUDA {torch.version.cuda}) on {payload['device']}; grouped mm: {grouped_name}")
    header = ["moe", "tokens"] + [f"{p}_us" for p in names] + ["best"]
    table = [header]
    for r in rows:
        cells = [r["name"], str(r.get("tokens", sum(r["counts"])))]
        for p in names:
            t = r.get("paths", {}).get(p)
            cells.append(f"{t['median']:.2f}" if t else "n/a")
        cells.append(r.get("best", "ERROR"))
        table.append(cells)
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for row in table:
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))))
    for r in rows:
        for p, m in {**r.get("path_errors", {}), **({"error": r["error"]} if "error" in r else {})}.items():
            print(f"{r['name']}: {p}: {m}")
        for p, m in r.get("checks", {}).items():
            print(f"{r['name']}: {p} check {m}")
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
