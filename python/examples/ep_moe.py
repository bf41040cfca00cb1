"""Expert parallelism with ``nvfp4_gemm``: an MoE layer whose ``E`` experts are split over the
``W`` ranks of a ``torch.distributed`` (NCCL) group, tokens moved with ``all_to_all_single``, the
local experts run by :class:`nvfp4_gemm.MoE` with device-resident sizes. No host
synchronization and no allocation by the library inside a call: a rank's whole layer (routing,
dispatch, quantization and GEMM, combine) captures into one CUDA graph.

One step on a rank holding ``T`` tokens ``x [T, H]`` (bf16):

1. Routing (:func:`route`): softmax over the experts of ``x · Wrᵀ + b`` in f32, the ``k``
   largest, their weights renormalised to sum to 1.
2. Slots (:func:`ep_routing.assign_slots`): each (source rank, expert) has ``C`` slots
   (``capacity``); pairs beyond them — the later tokens in the rank's order — are dropped and that
   expert contributes zero to that token. The routed rows are copied into the send block
   ``[E, C, H]``; its per-expert counts ``[E]`` are int32 on the device.
3. Dispatch: two ``all_to_all_single`` with equal splits (no host sizes): the counts, then the
   rows. Rank ``r`` owns experts ``r · E_local ..`` (``E_local = E / W``) and receives
   ``[W, E_local, C, H]`` with counts ``[W, E_local]``.
4. Experts: the received block is ``W · E_local`` masked groups (group ``w · E_local + e``:
   source ``w``, local expert ``e``) whose weights point at the ``E_local`` local experts
   (``nvfp4_gemm.MoE(..., layout="masked", max_rows=C, group_experts=list(range(E_local)) * W)``):
   the library quantizes each group's first ``count`` rows (global scale ``g_x``) and runs the
   grouped GEMM into ``[W, E_local, C, N]``. Experts that receive no tokens are empty groups.
5. Combine: one ``all_to_all_single`` sends every output row back to its source rank, which
   sums ``Σ_j w_j · y_j`` in f32 over its tokens' choices, ``j`` in order, rounded once to bf16.

The expert here is one GEMM (``N`` outputs). A gated FFN is two such calls with the activation
(and its NVFP4 quantization, by the second call) between them, on the same counts.
"""

import torch
import torch.distributed as dist

import nvfp4_gemm
from ep_routing import assign_slots

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def global_scale(t):
    """This library's global scale for ``t``: ``amax / (6 · 448)`` (a Python float; synchronizes,
    for setup)."""
    return max(float(t.abs().max()), 1e-30) / (6.0 * 448.0)


def route(x, router_weight, router_bias, top_k):
    """Top-k routing of ``x [T, H]``: softmax over the ``E`` experts of ``x · Wrᵀ + b`` (f32;
    ``router_weight [E, H]``, ``router_bias [E]``), the ``top_k`` most probable experts (distinct,
    most probable first), their probabilities renormalised to sum to 1. Returns ``(ids [T, k]
    int64, weights [T, k] f32)``. An expert whose bias is ``-1e4`` is never chosen."""
    probs = torch.softmax(x.float() @ router_weight.t() + router_bias, dim=-1)
    weights, ids = probs.topk(top_k, dim=-1)
    return ids, weights / weights.sum(-1, keepdim=True)


def pair_rows(x, top_k):
    """``x [T, H]`` repeated per routed pair: ``[T · k, H]``, row ``t · k + j`` is token ``t``."""
    return x[:, None, :].expand(-1, top_k, -1).reshape(-1, x.shape[-1])


def combine(rows, dest, kept, weights, out):
    """``out[t] = Σ_j kept[t, j] · weights[t, j] · rows[dest[t, j]]``: f32, ``j`` in order (one
    elementwise operation at a time, so a token's sum never depends on the other tokens or on the
    tensors' shapes), rounded once to ``out``'s dtype. Dropped pairs read row 0 and are zeroed.
    ``dest``/``kept`` ``[T · k]``, ``weights [T, k]``, ``rows [R, N]``, ``out [T, N]``."""
    k = weights.shape[-1]
    dest, kept = dest.reshape(-1, k), kept.reshape(-1, k)
    acc = None
    for j in range(k):
        y = rows.index_select(0, dest[:, j] * kept[:, j])
        y = torch.where(kept[:, j, None], y.float(), 0.0) * weights[:, j, None]
        acc = y if acc is None else acc + y
    return out.copy_(acc)


class Experts:
    """``E`` experts' NVFP4 weights: ``values [E, N, K/2]`` (uint8), ``scales`` ``[E,
    blocked_bytes(N, K)]`` (uint8, the 128x4 blocked layout), one global scale per expert."""

    def __init__(self, values, scales, global_scales):
        self.values, self.scales, self.global_scales = values, scales, list(global_scales)

    @classmethod
    def quantize(cls, w):
        """From ``w [E, N, K]`` bf16, each expert with its own global scale."""
        experts, n, k = w.shape
        values = torch.empty((experts, n, k // 2), dtype=torch.uint8, device=w.device)
        scales = torch.empty((experts, nvfp4_gemm.blocked_bytes(n, k)), dtype=torch.uint8, device=w.device)
        gs = [global_scale(w[e]) for e in range(experts)]
        for e in range(experts):
            nvfp4_gemm.quantize(w[e], gs[e], values=values[e], scales=scales[e])
        return cls(values, scales, gs)

    def slice(self, first, count):
        """Experts ``first .. first + count`` (views, no copy)."""
        end = first + count
        return Experts(self.values[first:end], self.scales[first:end], self.global_scales[first:end])

    def moe(self, sources, capacity, input_global_scale):
        """The layer's expert GEMM: ``sources · E`` masked groups of ``capacity`` rows, group
        ``w · E + e`` running expert ``e`` (alpha ``g_x · g_e``), bf16 out."""
        experts = self.values.shape[0]
        return nvfp4_gemm.MoE(
            self.values,
            self.scales,
            [input_global_scale * g for g in self.global_scales],
            layout="masked",
            max_rows=capacity,
            out_dtype=torch.bfloat16,
            input_global_scale=input_global_scale,
            group_experts=list(range(experts)) * sources,
        )

    def dequantize_f64(self):
        """``[E, N, K]`` f64 from the bits (e2m1 · e4m3 · global scale), not through the library."""
        experts, n, half = self.values.shape
        return torch.stack(
            [decode_nvfp4(self.values[e], self.scales[e], n, 2 * half) * self.global_scales[e] for e in range(experts)]
        )


def decode_nvfp4(values, scales, rows, k):
    """Packed e2m1 ``[rows, k/2]`` (element ``2i`` in the low nibble) with blocked e4m3 scales →
    ``[rows, k]`` f64 at global scale 1, exactly."""
    lut = torch.tensor(E2M1, dtype=torch.float64, device=values.device)
    v = values.reshape(rows, k // 2).to(torch.int64)
    x = torch.stack([lut[v & 15], lut[v >> 4]], dim=-1).reshape(rows, k)
    s = nvfp4_gemm.layout.from_blocked(scales, rows, k).view(torch.float8_e4m3fn).double()
    return x * s.repeat_interleave(16, dim=1)


class _Layer:
    """What both layers share: the router, the expert GEMM and the buffers' geometry."""

    def __init__(self, gemm, router_weight, router_bias, top_k, tokens):
        self.gemm, self.router_weight, self.router_bias = gemm, router_weight, router_bias
        self.experts, self.top_k, self.tokens = router_weight.shape[0], top_k, tokens
        self.capacity, self.hidden, self.n = gemm.bound, gemm.k, gemm.n
        self.routing = None  # the last call's (ids, weights), for inspection

    def _zeros(self, *shape, dtype=torch.bfloat16):
        return torch.zeros(shape, dtype=dtype, device=self.router_weight.device)


class EPMoE(_Layer):
    """This rank's part of the expert-parallel layer (module docstring).

    - ``gemm``: the local experts' GEMM over ``W · E_local`` masked groups of ``C`` rows
      (:meth:`Experts.moe` with ``sources = W`` on this rank's slice of the experts; anything
      with :class:`nvfp4_gemm.MoE`'s masked interface: ``gemm(x, counts, out=out)``, ``.k``,
      ``.n``, ``.groups``, ``.bound``).
    - ``router_weight [E, H]``, ``router_bias [E]``: f32, the same on every rank.
    - ``tokens``: ``T``, the rows of ``x`` per call.

    Buffers are allocated here, once; a call writes ``self.out [T, N]`` (returned) and allocates
    only torch temporaries (a CUDA graph's pool when captured).
    """

    def __init__(self, gemm, router_weight, router_bias, top_k, tokens, group=None):
        super().__init__(gemm, router_weight, router_bias, top_k, tokens)
        self.group = group
        self.ranks = dist.get_world_size(group)
        e, w, c = self.experts, self.ranks, self.capacity
        if e % w:
            raise ValueError(f"{e} experts do not split over {w} ranks")
        self.local_experts = e // w
        if gemm.groups != w * self.local_experts:
            raise ValueError(f"the GEMM has {gemm.groups} groups; {w} sources x {self.local_experts} local experts needed")
        # Send rows by (destination rank, local expert, slot) = (expert, slot); one more row takes
        # the dropped pairs (never sent).
        self.send_x = self._zeros(e * c + 1, self.hidden)
        self.recv_x = self._zeros(e * c, self.hidden)  # (source rank, local expert, slot)
        self.send_counts = self._zeros(e, dtype=torch.int32)
        self.recv_counts = self._zeros(e, dtype=torch.int32)  # [W, E_local]: the groups' sizes
        self.recv_y = self._zeros(e * c, self.n)
        self.back_y = self._zeros(e * c, self.n)  # (expert, slot) of this rank's pairs
        self.out = self._zeros(tokens, self.n)

    def __call__(self, x):
        e, c, g = self.experts, self.capacity, self.gemm.groups
        ids, weights = route(x, self.router_weight, self.router_bias, self.top_k)
        dest, kept, counts = assign_slots(ids, e, c)
        self.routing = (ids, weights)
        self.send_counts.copy_(counts)
        self.send_x.index_copy_(0, dest, pair_rows(x, self.top_k))
        dist.all_to_all_single(self.recv_counts, self.send_counts, group=self.group)
        dist.all_to_all_single(self.recv_x, self.send_x[: e * c], group=self.group)
        self.gemm(self.recv_x.view(g, c, self.hidden), self.recv_counts, out=self.recv_y.view(g, c, self.n))
        dist.all_to_all_single(self.back_y, self.recv_y, group=self.group)
        return combine(self.back_y, dest, kept, weights, self.out)


class ReferenceMoE(_Layer):
    """The same layer on one GPU: all ``E`` experts, the ``W`` source ranks emulated by splitting
    ``x [W · T, H]`` into ``W`` blocks of ``T`` tokens, each routed on its own and given its own
    ``C`` slots per expert. ``gemm``: ``W · E`` masked groups (:meth:`Experts.moe` with
    ``sources = W`` on all experts), group ``w · E + e`` = block ``w``, expert ``e``.

    Why it equals :class:`EPMoE` bit for bit (on GPUs of one model, same torch and library):

    - routing runs per block on ``[T, H]``, the shape each rank routes, so the router's matmul,
      softmax and top-k are the same kernels on the same rows;
    - the slots are integer arithmetic (exact), so group ``(w, e)`` here holds the same rows in
      the same order as group ``(w, e mod E_local)`` on the rank owning ``e``, with the same count;
    - the library quantizes row by row with the same global scale ``g_x`` and the same alpha, and
      a group's GEMM result for a row depends only on that row, the expert's weights and the
      group's size (which picks the tile height: the same count gives the same tiles); the kernel
      variant is picked from the bounds (``C``), the same on both (printed by the test);
    - the combine is the same elementwise sequence per token (:func:`combine`).

    Where it would not: a per-rank global scale (e.g. from each rank's own amax); routing all
    ``W · T`` tokens at once (another matmul shape may sum in another order); a combine that adds
    in another order (e.g. a reduce-scatter); a kernel variant that accumulates differently (the
    sm_100a plan picks its stage count from the work list's capacity, which grows with the
    groups: the 3- and 6-stage kernels do the same MMAs in the same K order, so they should agree,
    but that has never run).
    """

    def __init__(self, gemm, router_weight, router_bias, top_k, tokens, sources):
        super().__init__(gemm, router_weight, router_bias, top_k, tokens)
        self.sources = sources
        e, c = self.experts, self.capacity
        if gemm.groups != sources * e:
            raise ValueError(f"the GEMM has {gemm.groups} groups; {sources} sources x {e} experts needed")
        self.x_groups = self._zeros(sources * e * c + 1, self.hidden)  # + the dropped pairs' row
        self.counts = self._zeros(sources * e, dtype=torch.int32)
        self.y = self._zeros(sources * e * c, self.n)
        self.out = self._zeros(sources * tokens, self.n)

    def __call__(self, x):
        w, t, e, c, k = self.sources, self.tokens, self.experts, self.capacity, self.top_k
        blocks = [route(x[i * t : (i + 1) * t], self.router_weight, self.router_bias, k) for i in range(w)]
        ids = torch.stack([b[0] for b in blocks])  # [W, T, k]
        weights = torch.cat([b[1] for b in blocks])  # [W · T, k]
        dest, kept, counts = assign_slots(ids, e, c)
        dest = torch.where(kept, dest + torch.arange(w, device=x.device)[:, None] * (e * c), w * e * c).reshape(-1)
        kept = kept.reshape(-1)
        self.routing = (ids.reshape(w * t, k), weights)
        self.counts.copy_(counts.reshape(-1))
        self.x_groups.index_copy_(0, dest, pair_rows(x, k))
        self.gemm(self.x_groups[: w * e * c].view(w * e, c, self.hidden), self.counts, out=self.y.view(w * e, c, self.n))
        return combine(self.y, dest, kept, weights, self.out)


def plain_reference(x, w, ids, weights, capacity, sources, absolute=False):
    """The layer's meaning in f64, for checking a layer: ``out[t] = Σ_j kept · weights[t, j] ·
    x[t] · w[ids[t, j]]ᵀ`` with the drop rule applied per block of ``T = rows / sources`` tokens.
    ``x [rows, K]`` and ``w [E, N, K]`` f64 (e.g. dequantized), ``ids``/``weights [rows, k]``.
    ``absolute``: ``Σ_j kept · |weights[t, j] · x[t] · w[ids[t, j]]ᵀ|`` instead (for tolerances)."""
    rows, k = ids.shape
    experts, n, _ = w.shape
    _, kept, _ = assign_slots(ids.reshape(sources, rows // sources, k), experts, capacity)
    y = torch.einsum("tk,enk->ten", x, w)  # every expert on every token: small shapes only
    picked = y.gather(1, ids[..., None].expand(-1, -1, n))  # [rows, k, N]
    terms = picked * (weights.double() * kept.reshape(rows, k))[..., None]
    return (terms.abs() if absolute else terms).sum(1)
