"""The expert-parallel example's dispatch on the CPU (python/examples/): the capacity slots with
NumPy against the rule written as a loop; with torch (skipped without it), the distributed layer
against the single-GPU layer over 1 and 2 gloo processes, a dense f64 stand-in for the NVFP4
expert GEMM (the layers' routing, slots, all-to-alls and combine; the GPU run is ep_test.py)."""

import importlib.util
import multiprocessing
import os
import socket
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))

from ep_routing import assign_slots, assign_slots_loop  # noqa: E402


def random_ids(rng, tokens, k, experts, skew=None):
    """``[tokens, k]`` distinct experts per token; ``skew``: an expert put first for most tokens."""
    ids = np.stack([rng.permutation(experts)[:k] for _ in range(tokens)]) if tokens else np.zeros((0, k), np.int64)
    if skew is not None and tokens:
        for t in np.flatnonzero(rng.random(tokens) < 0.8):
            row = [skew] + [e for e in ids[t] if e != skew]
            ids[t] = row[:k]
    return ids.astype(np.int64)


@pytest.mark.parametrize(
    "tokens,k,experts,capacity", [(0, 2, 4, 3), (1, 1, 1, 1), (37, 2, 8, 5), (64, 4, 16, 8), (50, 3, 5, 100)]
)
def test_slots_follow_the_rule(tokens, k, experts, capacity):
    rng = np.random.default_rng(tokens * 1000 + k)
    for skew in (None, 0, experts - 1):
        ids = random_ids(rng, tokens, k, experts, skew)
        dest, kept, counts = assign_slots(ids, experts, capacity)
        want_dest, want_kept, want_counts = assign_slots_loop(ids.tolist(), experts, capacity)
        assert dest.tolist() == want_dest
        assert kept.tolist() == want_kept
        assert counts.tolist() == want_counts
        # Kept pairs have distinct rows inside their expert's slots; counts are min(routed, C).
        assert len(set(dest[kept].tolist())) == int(kept.sum())
        assert all(0 <= d - e * capacity < capacity for d, e in zip(dest[kept], ids.reshape(-1)[kept]))
        routed = np.bincount(ids.reshape(-1), minlength=experts)
        assert counts.tolist() == np.minimum(routed, capacity).tolist()
        assert (dest[~kept] == experts * capacity).all()


def test_dropped_pairs_are_the_later_tokens():
    rng = np.random.default_rng(7)
    ids = random_ids(rng, 200, 2, 6, skew=3)
    _, kept, _ = assign_slots(ids, 6, 20)
    positions = np.flatnonzero(ids.reshape(-1) == 3)
    assert kept[positions].tolist() == [True] * 20 + [False] * (len(positions) - 20)


def test_batched_sources_equal_one_call_per_source():
    rng = np.random.default_rng(3)
    ids = np.stack([random_ids(rng, 30, 3, 7, skew=w) for w in range(4)])  # [W, T, k]
    dest, kept, counts = assign_slots(ids, 7, 9)
    for w in range(4):
        d, kk, c = assign_slots(ids[w], 7, 9)
        assert (dest[w] == d).all() and (kept[w] == kk).all() and (counts[w] == c).all()


# ---- torch (CPU, gloo): the layers themselves ------------------------------------------------
# Run in fresh processes: torch never enters this one (the validation tests assume it absent).


def _require_torch():
    """Skip without torch (a failure when NVFP4_REQUIRE_TORCH is set, as on the GPU machine)."""
    if importlib.util.find_spec("torch") is None:
        if os.environ.get("NVFP4_REQUIRE_TORCH"):
            pytest.fail("torch is not installed (NVFP4_REQUIRE_TORCH is set)")
        pytest.skip("needs torch")


def _run(target, world):
    """``target(rank, world, port)`` in ``world`` spawned processes; all must exit with 0."""
    _require_torch()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=target, args=(rank, world, port)) for rank in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    assert [p.exitcode for p in procs] == [0] * world, "a process failed (its traceback is above)"


class DenseMoE:
    """``nvfp4_gemm.MoE``'s masked interface over dense weights ``[E, N, K]``, each group's rows
    ``x · wᵀ`` in f64 rounded to ``out``'s dtype, rows past the count left as they are: a CPU
    stand-in for the NVFP4 expert GEMM."""

    def __init__(self, w, group_experts, capacity):
        self.w, self.group_experts = w, group_experts
        self.groups, self.bound, self.n, self.k = len(group_experts), capacity, w.shape[1], w.shape[2]

    def __call__(self, x, sizes, *, out):
        import torch

        rows = torch.arange(self.bound)[:, None]
        for g, e in enumerate(self.group_experts):
            y = (x[g].double() @ self.w[e].T).to(out.dtype)
            out[g].copy_(torch.where(rows < sizes[g], y, out[g]))
        return out


def _ep_worker(rank, world, port):
    import torch
    import torch.distributed as dist
    from ep_moe import EPMoE, ReferenceMoE, plain_reference

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        t, h, n, e, k, c = 48, 64, 16, 4, 2, 20
        gen = torch.Generator().manual_seed(5)  # the same inputs on every rank
        w = torch.randn((e, n, h), generator=gen, dtype=torch.float64).to(torch.bfloat16).double()
        router = torch.randn((e, h), generator=gen) / h**0.5
        x_all = torch.randn((world * t, h), generator=gen).to(torch.bfloat16)
        bias = torch.zeros(e)
        bias[0], bias[e - 1] = 2.0, -1e4  # expert 0 over capacity, expert E-1 never chosen
        local = e // world
        ep = EPMoE(DenseMoE(w[rank * local : (rank + 1) * local], list(range(local)) * world, c), router, bias, k, t)
        ref = ReferenceMoE(DenseMoE(w, list(range(e)) * world, c), router, bias, k, t, world)
        mine = slice(rank * t, (rank + 1) * t)
        for step in range(2):
            got = ep(x_all[mine].contiguous()).clone()
            want = ref(x_all).clone()
            ids, weights = ref.routing
            assert torch.equal(ep.routing[0], ids[mine]) and torch.equal(ep.routing[1], weights[mine])
            assert torch.equal(got.view(torch.int16), want[mine].view(torch.int16)), f"rank {rank} step {step}"
            routed = torch.stack([torch.bincount(b.reshape(-1), minlength=e) for b in ids.reshape(world, t * k)])
            assert int(routed[:, e - 1 if step == 0 else 0].sum()) == 0 and bool((routed > c).any())
            exact = plain_reference(x_all.double(), w, ids, weights, c, world)
            size = plain_reference(x_all.double(), w, ids, weights, c, world, absolute=True)
            assert bool(((want.double() - exact).abs() <= 2.0**-6 * size + 1e-6).all())
            # Another routing: new tokens, the hot and the empty expert swapped.
            x_all = torch.randn((world * t, h), generator=gen).to(torch.bfloat16)
            bias[0], bias[e - 1] = -1e4, 2.0
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [1, 2])
def test_distributed_layer_equals_single_gpu_layer_on_gloo(world):
    _run(_ep_worker, world)


def _slots_worker(rank, world, port):
    import torch

    rng = np.random.default_rng(11)
    ids = np.stack([random_ids(rng, 40, 3, 9, skew=w) for w in range(3)])
    for got, want in zip(assign_slots(torch.from_numpy(ids), 9, 7), assign_slots(ids, 9, 7)):
        assert got.numpy().tolist() == want.tolist()


def test_slots_torch_equal_numpy():
    _run(_slots_worker, 1)
