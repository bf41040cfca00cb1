"""Where a Python call's host time goes (GPU machine, torch + the installed wheel): the torch
attribute reads a binding makes per tensor, the stream lookup, the library's shape check, and
the calls themselves (same tensors, and 16 sets in turn), on the task's shapes b0 (8 groups)
and d0 (64 groups). Host clock around batches of calls, no synchronization inside a batch;
median of the batches, µs per call (or per tensor where it says so).

    python3 python/bench/host_profile.py [--out DIR]
"""

import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__))))
import bench  # noqa: E402

nvfp4_gemm = bench.nvfp4_gemm
nvfp4_ref = bench.nvfp4_ref


def per_call(fn, items, calls=32, batches=15):
    """Median µs per call of `fn(item)` over batches of `calls` items taken in turn."""
    times = []
    k = 0
    for b in range(batches + 1):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(calls):
            fn(items[k % len(items)])
            k += 1
        dt = time.perf_counter() - t
        if b:
            times.append(dt * 1e6 / calls)
    torch.cuda.synchronize()
    return statistics.median(times)


def profile(name, sets_n=16):
    ms, ns, ks = bench.SHAPES[name]
    sets = [nvfp4_ref.task_input(ms, ns, ks, 77 + i) for i in range(sets_n)]
    lists = [bench.group_lists(d) for d in sets]
    tensors = [t for lst in lists[:1] for part in lst for t in part]
    n = len(tensors)
    row = {"shape": name, "groups": len(ms), "tensors": n}

    def attrs(kind):
        def f(_):
            for t in tensors:
                if kind == "data_ptr":
                    t.data_ptr()
                elif kind == "device":
                    t.device
                elif kind == "device_type_index":
                    d = t.device
                    d.type, d.index
                elif kind == "get_device":
                    t.get_device()
                elif kind == "shape":
                    t.shape
                elif kind == "stride":
                    t.stride()
                elif kind == "dtype":
                    t.dtype
                elif kind == "is_contiguous":
                    t.is_contiguous()
                elif kind == "dim":
                    t.dim()
                elif kind == "numel":
                    t.numel()
                elif kind == "loop":
                    pass

        return f

    loop = per_call(attrs("loop"), [0])
    for kind in ("data_ptr", "device", "device_type_index", "get_device", "shape", "stride", "dtype",
                 "is_contiguous", "dim", "numel"):
        row[f"attr_{kind}_ns_per_tensor"] = (per_call(attrs(kind), [0]) - loop) * 1e3 / n
    row["current_stream_us"] = per_call(lambda _: torch.cuda.current_stream().cuda_stream, [0])
    row["current_device_us"] = per_call(lambda _: torch.cuda.current_device(), [0])
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        row["raw_stream_us"] = per_call(lambda _: raw(0), [0])
    hooks = sys.modules.get("nvfp4_gemm._hooks")
    if hooks is not None:
        row["stream_hook_us"] = per_call(lambda _: hooks.current_stream(0), [0])
    shapes = list(zip(ms, ns, ks))
    row["check_problem_us"] = per_call(lambda _: nvfp4_gemm._native.check_problem(shapes, False), [0])
    gg = lambda lst: nvfp4_gemm.grouped_gemm(*lst[:4], out=lst[4])  # noqa: E731
    row["grouped_gemm_same_us"] = per_call(gg, lists[:1])
    row["grouped_gemm_new_us"] = per_call(gg, lists)
    prepared = nvfp4_gemm.prepare(*lists[0][:4], out=lists[0][4])
    row["prepared_launch_us"] = per_call(lambda p: p(), [prepared])
    row["custom_kernel_same_us"] = per_call(nvfp4_gemm.custom_kernel, sets[:1])
    row["custom_kernel_new_us"] = per_call(nvfp4_gemm.custom_kernel, sets)
    if len(set(ns)) == 1 and len(set(ks)) == 1:
        stacked_rows(row, ms, ns[0], ks[0], sets_n)
    return row


def stacked_rows(row, ms, n, k, sets_n):
    """`grouped_gemm_stacked` on `sets_n` sets of stacked tensors: host µs per call, same and
    new tensors."""
    _, _, a_scale_bytes, b_scale_bytes = bench.stacked_offsets(ms, n, k)
    alphas = bench.stacked_alphas(len(ms))
    gen = torch.Generator(device=bench.CUDA).manual_seed(5)
    items = []
    for _ in range(sets_n):
        a, sa = bench.random_values((sum(ms), k // 2), gen), bench.random_scales(a_scale_bytes, gen)
        b, sb = bench.random_values((len(ms), n, k // 2), gen), bench.random_scales(b_scale_bytes, gen)
        out = torch.empty((sum(ms), n), dtype=torch.float16, device=bench.CUDA)
        items.append((a, b, sa, sb, ms, alphas, out))
    call = lambda it: nvfp4_gemm.grouped_gemm_stacked(*it[:6], out=it[6])  # noqa: E731
    row["stacked_same_us"] = per_call(call, items[:1])
    row["stacked_new_us"] = per_call(call, items)
    # The same call with each Python-level argument in another form: what reading it costs.
    a, b, sa, sb, _, _, out = items[0]
    device_alphas = torch.tensor(alphas, dtype=torch.float32, device=bench.CUDA)
    variants = {
        "alpha_none": (ms, None),
        "alpha_scalar": (ms, 1.0),
        "alpha_tensor": (ms, device_alphas),
        "sizes_tuple": (tuple(ms), alphas),
    }
    for name, (sizes, alpha) in variants.items():
        row[f"stacked_same_{name}_us"] = per_call(
            lambda _: nvfp4_gemm.grouped_gemm_stacked(a, b, sa, sb, sizes, alpha, out=out), [None]
        )
    row["native_call_us"] = per_call(lambda _: nvfp4_gemm.blocked_bytes(128, k), [None])


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=".")
    p.add_argument("--shapes", default="b0,d0")
    p.add_argument("--stacked-only", action="store_true", help="only the stacked call's rows (shapes of one N and K)")
    args = p.parse_args()
    if args.stacked_only:
        rows = []
        for s in args.shapes.split(","):
            ms, ns, ks = bench.SHAPES[s]
            row = {"shape": s, "groups": len(ms)}
            stacked_rows(row, ms, ns[0], ks[0], 16)
            rows.append(row)
    else:
        rows = [profile(s) for s in args.shapes.split(",")]
    result = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "rows": rows}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "host-profile.json"), "w") as f:
        json.dump(result, f, indent=1)
    keys = [k for k in rows[0] if k not in ("shape",) and all(k in r for r in rows)]
    print(f"device: {result['device']}, torch {result['torch']}")
    print(f"{'':34s}" + "".join(f"{r['shape']:>12s}" for r in rows))
    for k in keys:
        print(f"{k:34s}" + "".join(f"{r[k]:12.2f}" if isinstance(r[k], float) else f"{r[k]:12d}" for r in rows))


if __name__ == "__main__":
    main()
