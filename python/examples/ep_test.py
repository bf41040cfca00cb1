"""Checks and times the expert-parallel MoE layer (ep_moe.py) on W GPUs:

    torchrun --nproc_per_node=W python/examples/ep_test.py [--bench-tokens T ...]

On every rank, for the same inputs (made on rank 0 and broadcast):

- the distributed layer's routing and output equal the single-GPU layer's (``ReferenceMoE``, all
  experts, the W source ranks emulated) bit for bit, on a routing with a hot expert (tokens over
  capacity, dropped) and an expert that receives no tokens (both asserted to occur);
- the single-GPU layer is within rounding of a plain f64 computation (dequantized operands, the
  same drop rule);
- the layer captured in a CUDA graph and replayed equals the eager layer bit for bit, also after
  the routing changed (new tokens and router bias written into the captured tensors);
- ``nvfp4_gemm.MoE`` with groups sharing experts' weights equals one group per expert;
- the library raised no status bit (no size beyond the bounds).

Then it times the layer (eager and graph-replayed, max over ranks), the local experts' GEMM
alone and the single-GPU layer, and prints a table. Exit status 1 on any failure on any rank; the
last line is a one-line summary. NVLink multicast is turned off (``NCCL_NVLS_ENABLE=0`` & co.)
unless already set.
"""

import os

for _name, _value in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ.setdefault(_name, _value)

import argparse  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import nvfp4_gemm  # noqa: E402
from ep_moe import EPMoE, Experts, ReferenceMoE, decode_nvfp4, global_scale, plain_reference  # noqa: E402
from ep_routing import assign_slots  # noqa: E402

NEVER = -1e4  # router bias of an expert that must receive no tokens


class Checks:
    def __init__(self, rank):
        self.rank, self.passed, self.failed = rank, 0, []

    def __call__(self, ok, what, detail=""):
        if ok:
            self.passed += 1
        else:
            self.failed.append(what)
        print(f"[rank {self.rank}] {'PASS' if ok else 'FAIL'} {what}{': ' + detail if detail else ''}", flush=True)

    def same_bits(self, got, want, what):
        ok = got.shape == want.shape and got.dtype == want.dtype
        detail = f"{got.dtype}{list(got.shape)} vs {want.dtype}{list(want.shape)}"
        if ok:
            diff = got.contiguous().view(torch.uint8) != want.contiguous().view(torch.uint8)
            ok = not bool(diff.any())
            if not ok:
                d = (got.double() - want.double()).abs()
                detail = f"{int((got != want).sum())} of {got.numel()} elements differ, max |diff| {float(d.max()):.3g}"
        self(ok, what, "" if ok else detail)


def problem(tokens, hidden, n, experts, world, device, seed):
    """Weights, router, tokens for every rank (made on rank 0, broadcast: identical bits)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    w = (torch.randn((experts, n, hidden), generator=gen, device=device) * 0.05).to(torch.bfloat16)
    router = torch.randn((experts, hidden), generator=gen, device=device) / hidden**0.5
    x = torch.randn((world * tokens, hidden), generator=gen, device=device).to(torch.bfloat16)
    for t in (w, router, x):
        dist.broadcast(t, 0)
    return Experts.quantize(w), router, x


def layers(experts, router, bias, top_k, tokens, capacity, g_x, rank, world):
    """This rank's distributed layer and the single-GPU layer, over the same weights and router."""
    local = experts.values.shape[0] // world
    ep = EPMoE(experts.slice(rank * local, local).moe(world, capacity, g_x), router, bias, top_k, tokens)
    ref = ReferenceMoE(experts.moe(world, capacity, g_x), router, bias, top_k, tokens, world)
    return ep, ref


def capture(fn):
    """Warm up on a side stream (the library uploads its tables at the first call), then capture."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    dist.barrier()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    torch.cuda.synchronize()
    return graph


def set_bias(bias, hot, dead, boost):
    """Expert ``hot`` chosen by most tokens (over capacity), expert ``dead`` by none."""
    bias.zero_()
    bias[hot] = boost
    bias[dead] = NEVER


def check_shared_groups(check, experts, router, bias, top_k, capacity, g_x, x):
    """``nvfp4_gemm.MoE`` with ``2 · E`` groups over ``E`` experts (``group_experts = [0..E-1] *
    2``) equals the ``E``-group layer run on each half of ``x`` (bit for bit): the sharing the
    distributed layer relies on, also exercised when W = 1."""
    half = x.shape[0] // 2
    two = ReferenceMoE(experts.moe(2, capacity, g_x), router, bias, top_k, half, 2)
    one = ReferenceMoE(experts.moe(1, capacity, g_x), router, bias, top_k, half, 1)
    want = torch.cat([one(x[:half]).clone(), one(x[half:]).clone()])
    check.same_bits(two(x), want, "MoE with 2·E groups sharing E experts = the E-group MoE on each half")


def check_layer(check, args, rank, world, device):
    t, h, n, e, k, c = args.tokens, args.hidden, args.n, args.experts, args.top_k, args.capacity
    experts, router, x_all = problem(t, h, n, e, world, device, seed=1)
    g_x = global_scale(x_all)
    bias = torch.zeros((e,), dtype=torch.float32, device=device)
    ep, ref = layers(experts, router, bias, k, t, c, g_x, rank, world)
    print(f"[rank {rank}] kernels: distributed {ep.gemm.kernel} ({ep.gemm.groups} groups), "
          f"single-GPU {ref.gemm.kernel} ({ref.gemm.groups} groups)", flush=True)
    x = x_all[rank * t : (rank + 1) * t].clone()  # this rank's tokens (the graph's input)
    x_ref = x_all.clone()
    mine = slice(rank * t, (rank + 1) * t)
    w_f64 = experts.dequantize_f64()

    def compare(step):
        got = ep(x).clone()
        ids, weights = (r.clone() for r in ep.routing)
        want = ref(x_ref).clone()
        rids, rweights = ref.routing
        check.same_bits(ids, rids[mine], f"{step}: routing ids = single-GPU layer's")
        check.same_bits(weights, rweights[mine], f"{step}: routing weights = single-GPU layer's")
        check.same_bits(got, want[mine], f"{step}: distributed output = single-GPU layer's")
        # The routing must exercise the drop rule and an empty expert.
        routed = (rids.reshape(world, t * k)[..., None] == torch.arange(e, device=device)).sum(1)  # [W, E]
        dead = routed.sum(0) == 0
        check(bool(dead.any()), f"{step}: an expert receives no tokens", f"{dead.nonzero().flatten().tolist()}")
        most = int(routed.max())
        check(most > c, f"{step}: tokens over capacity are dropped", f"one (source, expert) has {most} > C = {c}")
        _, _, counts = assign_slots(rids.reshape(world, t, k), e, c)
        check.same_bits(ref.counts, counts.reshape(-1).to(torch.int32), f"{step}: group sizes = min(routed, C)")
        # The single-GPU layer against f64 (dequantized operands, same routing and drop rule).
        values, scales = nvfp4_gemm.quantize(x_ref, g_x)
        x_f64 = decode_nvfp4(values, scales, world * t, h) * g_x
        exact = plain_reference(x_f64, w_f64, rids, rweights, c, world)
        size = plain_reference(x_f64, w_f64, rids, rweights, c, world, absolute=True)
        tol = 2.0**-6 * size + 1e-3  # two bf16 roundings (y_j, then the sum) are at most 2^-7
        ratio = float(((want.double() - exact).abs() / tol).max())
        check(ratio <= 1, f"{step}: single-GPU layer = f64 within 2^-6 Σ|w y| + 1e-3", f"max |err| / tol = {ratio:.3f}")
        return got

    set_bias(bias, hot=0, dead=e - 1, boost=args.boost)
    eager = compare("routing A")
    check_shared_groups(check, experts, router, bias, k, c, g_x, x_ref)
    graph = capture(lambda: ep(x))
    graph.replay()
    check.same_bits(ep.out.clone(), eager, "routing A: graph replay = eager")
    # New tokens and another routing, written into the tensors the graph reads.
    gen = torch.Generator(device=device).manual_seed(2)
    x_ref.copy_(torch.randn(x_ref.shape, generator=gen, device=device).mul_(0.9).to(torch.bfloat16))
    dist.broadcast(x_ref, 0)
    x.copy_(x_ref[mine])
    set_bias(bias, hot=e - 1, dead=0, boost=args.boost)
    graph.replay()
    replayed = ep.out.clone()
    eager = compare("routing B")
    check.same_bits(replayed, eager, "routing B: graph replay = eager")
    for name, layer in (("distributed", ep), ("single-GPU", ref)):
        bits, text = layer.gemm.status()
        check(bits == 0, f"{name} layer: no status bit (sizes within bounds)", text)
    del graph
    torch.cuda.synchronize()


def time_ms(fn, iters):
    torch.cuda.synchronize()
    dist.barrier()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / iters


def bench(args, rank, world, device):
    t, h, n, e, k = args.bench_tokens, args.bench_hidden, args.bench_n, args.bench_experts, args.bench_top_k
    c = args.bench_capacity or max(16, -(-2 * t * k // e))
    experts, router, x_all = problem(t, h, n, e, world, device, seed=3)
    bias = torch.zeros((e,), dtype=torch.float32, device=device)
    ep, ref = layers(experts, router, bias, k, t, c, global_scale(x_all), rank, world)
    x = x_all[rank * t : (rank + 1) * t].clone()
    rows = {}
    g = ep.gemm.groups
    gemm = lambda: ep.gemm(ep.recv_x.view(g, c, h), ep.recv_counts, out=ep.recv_y.view(g, c, n))  # noqa: E731
    for name, fn in (
        (f"distributed layer (E_local = {e // world}, max over ranks)", lambda: ep(x)),
        (f"local experts' quantize + GEMM ({g} groups)", gemm),
        (f"single-GPU layer ({e} experts, {world * t} tokens)", lambda: ref(x_all)),
    ):
        fn()
        eager = time_ms(fn, args.iters)
        graph = capture(fn)
        replay = time_ms(graph.replay, args.iters)
        del graph
        both = torch.tensor([eager, replay], dtype=torch.float64, device=device)
        dist.all_reduce(both, op=dist.ReduceOp.MAX)
        rows[name] = both.tolist()
    if rank == 0:
        print(f"\ntiming: W = {world}, T = {t} tokens per rank, E = {e}, top-{k}, H = K = {h}, N = {n}, "
              f"C = {c}, kernel {ep.gemm.kernel}, {args.iters} calls, {torch.cuda.get_device_name()}")
        print(f"| {'what':<56} | {'eager ms':>9} | {'graph ms':>9} |")
        print(f"|{'-' * 58}|{'-' * 11}|{'-' * 11}|")
        for name, (eager, replay) in rows.items():
            print(f"| {name:<56} | {eager:9.4f} | {replay:9.4f} |")
        print(flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=int, default=256, help="tokens per rank (checks)")
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--n", type=int, default=256)
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--capacity", type=int, default=96, help="slots per (source rank, expert)")
    p.add_argument("--boost", type=float, default=2.0, help="router bias of the hot expert")
    p.add_argument("--bench-tokens", type=int, default=256)
    p.add_argument("--bench-hidden", type=int, default=2048)
    p.add_argument("--bench-n", type=int, default=7168)
    p.add_argument("--bench-experts", type=int, default=64)
    p.add_argument("--bench-top-k", type=int, default=8)
    p.add_argument("--bench-capacity", type=int, default=0, help="0: max(16, 2 T k / E)")
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--no-bench", action="store_true")
    args = p.parse_args()

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    check = Checks(rank)
    check_layer(check, args, rank, world, device)
    if not args.no_bench:
        bench(args, rank, world, device)
    failed = torch.tensor([len(check.failed)], device=device)
    dist.all_reduce(failed)
    if check.failed:
        print(f"[rank {rank}] failed: {'; '.join(check.failed)}", flush=True)
    dist.barrier()
    if rank == 0:
        verdict = "PASS" if int(failed) == 0 else "FAIL"
        total = f"{check.passed} checks passed on rank 0, {int(failed)} failed over all ranks"
        print(f"EP TEST {verdict}: W = {world}, {total}", flush=True)
    dist.destroy_process_group()
    return 1 if int(failed) else 0


if __name__ == "__main__":
    raise SystemExit(main())
