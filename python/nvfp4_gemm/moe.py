"""A mixture-of-experts layer's grouped GEMM with the routing on the GPU (``nvfp4_gemm::moe``)."""

import operator

from . import _native
from ._core import _out_dtype, device
from ._tensors import (
    DENSE,
    SCALES,
    SIZES,
    VALUES,
    blocked_bytes,
    describe,
    dtype_name,
    finite_alphas,
    same_device,
    stream_handle,
    torch_module,
)
from .layout import to_blocked
from .w4a16 import prepack_experts


class MoE:
    """The experts' NVFP4 weights planned once; each call quantizes the routed bf16/f16
    activations and runs the grouped GEMM with the group sizes read **on the device**: no host
    synchronization and no allocation when ``out`` is given, so a layer can be captured in a CUDA
    graph once and replayed for every routing.

    - ``weights``: ``[E, N, K/2]`` packed e2m1 (``uint8`` or ``float4_e2m1fn_x2``), contiguous;
      ``N`` a multiple of 8, ``K`` of 64.
    - ``weight_scales``: every expert's 128x4 blocked scales back to back
      (``E · blocked_bytes(N, K)`` bytes, any contiguous shape), or ``[E, N, K/16]`` with
      ``scale_layout="plain"`` (converted once, here).
    - ``alphas``: the GEMM's multiplier per expert (None: 1.0; one float; or ``E`` floats):
      ``input_global_scale · weight_global_scale[e]`` in this library's convention
      (:func:`nvfp4_gemm.quantize`). Fixed for the layer's life: they live in the plan's tables.
    - ``layout="contiguous"`` with ``max_tokens``: tokens sorted by expert, ``x`` ``[max_tokens, K]``,
      ``sizes`` = ``expert_offsets`` ``[E + 1]`` (``int32`` as vLLM/FlashInfer hold them, or
      ``uint32``; expert ``e`` owns rows ``offsets[e]:offsets[e+1]``), out ``[max_tokens, N]``.
      ``layout="masked"`` with ``max_rows``: ``x`` ``[E, max_rows, K]``, ``sizes`` = counts ``[E]``,
      out ``[E, max_rows, N]``.
    - ``input_global_scale``: the activations' global scale for the quantizer.
    - ``w4a16``: None (W4A4: the activations are quantized to NVFP4 at each call), or
      ``"bfloat16"``/``"float16"`` (or the torch dtype) for W4A16 on sm_90a (``docs/w4a16.md``):
      the activations ``x`` of that type are read as they are — no quantization — and the
      weights are prepacked for them here, once (on the CPU: copied to the host and back; the
      layer owns the prepacked copy). ``input_global_scale`` is then unused and :meth:`gemm` not
      available; a call with another ``x`` tensor than the previous call's re-uploads the tables
      (keep ``x``'s storage fixed in a captured graph).
    - ``group_experts``: the expert whose weights and alpha each group runs (``G`` ints in
      ``0 .. E-1``; None: one group per expert, ``G = E``). Several groups may run one expert:
      e.g. expert parallelism's received block ``[W, E_local, C, K]`` is ``W · E_local`` masked
      groups over ``E_local`` experts (``group_experts = list(range(E_local)) * W``). The token
      layout, ``sizes`` and ``out`` count groups (``E`` above reads ``G``).

    Sizes beyond the bounds are clamped (nothing outside the tensors is touched) and raise bits of
    a sticky status word (:meth:`status`, :meth:`clear_status`). Rows of no expert in ``out`` are
    left as they are (a new ``out`` is zeroed). The objects the layer was built from (weights and
    scales) are kept alive by it; keep the layer alive while a CUDA graph that captured it may be
    replayed. Call it once outside capture before capturing it (the weights' tables are uploaded
    from the host at the first call; on sm_100a also at the first call with other ``a_values``).
    """

    def __init__(
        self,
        weights,
        weight_scales,
        alphas=None,
        *,
        layout="contiguous",
        max_tokens=None,
        max_rows=None,
        out_dtype=None,
        input_global_scale=1.0,
        scale_layout="blocked",
        group_experts=None,
        w4a16=None,
    ):
        self.w4a16 = None if w4a16 is None else dtype_name(w4a16)
        if self.w4a16 is not None and self.w4a16 not in DENSE:
            raise TypeError(f"w4a16: {self.w4a16}; expected float16 or bfloat16 (the activations' type)")
        tw = describe(weights, "`weights`")
        tw.require_dtype(VALUES)
        if len(tw.shape) != 3:
            raise tw.error(f"shape {list(tw.shape)}; expected [E, N, K/2]")
        tw.require_contiguous()
        tw.require_aligned()
        experts, n, k = tw.shape[0], tw.shape[1], 2 * tw.shape[2]
        if k == 0 or k % 64:
            raise tw.error(f"K = 2·{tw.shape[2]} = {k} is not a positive multiple of 64")
        if n == 0 or n % 8:
            raise tw.error(f"N = {n} is not a positive multiple of 8")
        ts = describe(weight_scales, "`weight_scales`")
        ts.require_dtype(SCALES)
        per_expert = blocked_bytes(n, k)
        self._keep = [weights, weight_scales]
        blocked_obj = weight_scales
        if scale_layout == "plain":
            if ts.shape != (experts, n, k // 16):
                raise ts.error(f"shape {list(ts.shape)}; plain scales are [{experts}, {n}, {k // 16}]")
            torch = torch_module()
            blocked = torch.cat([to_blocked(weight_scales[e]) for e in range(experts)])
            self._keep.append(blocked)
            blocked_obj = blocked
            ts = describe(blocked, "`weight_scales`")
        elif scale_layout != "blocked":
            raise ValueError(f"scale_layout: {scale_layout!r}; expected 'blocked' or 'plain'")
        ts.require_contiguous()
        if ts.numel != experts * per_expert:
            raise ts.error(f"has {ts.numel} bytes; {experts} experts of N={n}, K={k} need {experts * per_expert} (blocked)")
        ts.require_aligned()
        expert_alphas = finite_alphas(alphas, experts, "alphas")
        self.group_experts = _group_experts(group_experts, experts)
        groups = len(self.group_experts)
        self._alphas = [expert_alphas[e] for e in self.group_experts]
        if layout == "contiguous":
            masked, bound, name = False, max_tokens, "max_tokens"
        elif layout == "masked":
            masked, bound, name = True, max_rows, "max_rows"
        else:
            raise ValueError(f"layout: {layout!r}; expected 'contiguous' or 'masked'")
        if not isinstance(bound, int) or bound < 1:
            raise ValueError(f"{name}: {bound!r}; the {layout} layout needs a positive int")
        g = float(input_global_scale)
        if not (g > 0 and g != float("inf")):
            raise ValueError(f"input_global_scale: {g} is not finite and positive")
        self.input_global_scale = g
        self.dtype = _out_dtype(out_dtype, "bfloat16")
        sizes = _native.moe_sizes(groups, n, k, masked, bound)
        (self.token_rows, self.scale_rows, self.sizes_len, a_values, a_scales, _, _, self.c_elements) = sizes
        self.experts, self.groups, self.n, self.k = experts, groups, n, k
        self.layout, self.masked, self.bound = layout, masked, bound
        self._ordinal = same_device([tw, ts])
        self._device = device(self._ordinal)
        flat = []
        wbytes = n * k // 2
        if self.w4a16 is not None:
            bf16_act = self.w4a16 == "bfloat16"
            pv, ps = prepack_experts(weights, blocked_obj, experts, n, k, bf16_act)
            self._keep.append((pv, ps))
            tw, ts = describe(pv, "`weights`"), describe(ps, "`weight_scales`")
        for e in self.group_experts:
            flat += [tw.ptr + e * wbytes, wbytes, ts.ptr + e * per_expert, per_expert]
        bf16_out = self.dtype == "bfloat16"
        if self.w4a16 is not None:
            self._plan = _native.W4a16MoePlan(self._device, groups, n, k, masked, bound, bf16_out, bf16_act, flat, self._alphas)
            return
        self._plan = _native.MoePlan(self._device, groups, n, k, masked, bound, bf16_out, flat, self._alphas)
        torch = torch_module()
        dev = f"cuda:{self._ordinal}"
        # The quantized tokens: owned by the layer, so their address never changes.
        self.a_values = torch.zeros((max(a_values, 16),), dtype=torch.uint8, device=dev)[:a_values]
        self.a_scales = torch.zeros((max(a_scales, 16),), dtype=torch.uint8, device=dev)[:a_scales]
        self._a = [self.a_values.data_ptr(), a_values, self.a_scales.data_ptr(), a_scales]

    @property
    def kernel(self):
        """The GEMM kernel the plan runs (for people)."""
        return self._plan.kernel

    def _x_shape(self):
        if self.masked:
            return (self.groups, self.bound, self.k)
        return (self.bound, self.k)

    def _out_shape(self):
        if self.masked:
            return (self.groups, self.bound, self.n)
        return (self.bound, self.n)

    def _sizes(self, sizes):
        t = describe(sizes, "`sizes`")
        t.require_dtype(SIZES)
        if t.shape != (self.sizes_len,):
            what = "expert_offsets [E + 1]" if not self.masked else "counts [E]"
            raise t.error(f"shape {list(t.shape)}; the {self.layout} layout takes {what} = [{self.sizes_len}]")
        t.require_contiguous()
        if t.ptr % 4:
            raise t.error(f"address {t.ptr:#x} is not 4-byte aligned")
        return t

    def _out(self, out, like):
        if out is None:
            torch = torch_module()
            if torch is None or not like.is_torch:
                raise TypeError("out: required when the inputs are not torch tensors")
            out = torch.zeros(self._out_shape(), dtype=getattr(torch, self.dtype), device=f"cuda:{self._ordinal}")
        t = describe(out, "`out`")
        t.require_dtype((self.dtype,))
        if t.shape != self._out_shape():
            raise t.error(f"shape {list(t.shape)}; expected {list(self._out_shape())}")
        t.require_contiguous()
        t.require_aligned()
        return out, t

    def __call__(self, x, sizes, *, out=None, stream=None):
        """Quantizes ``x`` (the routed activations, fp16/bf16, the layout's shape) into the
        layer's NVFP4 token buffers and runs the grouped GEMM into ``out`` (or a new zeroed
        tensor), with the expert sizes ``sizes`` read on the device; with ``w4a16``, runs the
        GEMM on ``x`` itself (of the layer's activation type). Returns ``out``."""
        tx = describe(x, "`x`")
        tx.require_dtype(DENSE if self.w4a16 is None else (self.w4a16,))
        if tx.shape != self._x_shape():
            raise tx.error(f"shape {list(tx.shape)}; the layer takes {list(self._x_shape())}")
        tx.require_contiguous()
        tx.require_aligned()
        tsz = self._sizes(sizes)
        out, tc = self._out(out, tx)
        same_device([tx, tsz, tc], self._ordinal)
        s = stream_handle(stream, self._ordinal)
        if self.w4a16 is not None:
            self._plan.run(s, tsz.buffer(), tx.buffer(), tc.buffer())
            return out
        self._plan.quantize_run(
            self._device, s, tx.buffer(), tx.dtype == "bfloat16", self.input_global_scale, tsz.buffer(), self._a, tc.buffer()
        )
        return out

    def gemm(self, a_values, a_scales, sizes, *, out=None, stream=None):
        """The grouped GEMM alone on tokens already quantized in this library's layout
        (``a_values``: ``token_rows · K/2`` bytes; ``a_scales``: ``scale_rows · K/16`` bytes,
        expert ``e``'s from row ``128 · (ceil(offsets[e] / 128) + e)`` (contiguous) or
        ``e · ceil(max_rows / 128) · 128`` (masked); see
        :func:`nvfp4_gemm.layout.vllm_scales_to_moe` for vLLM's layout). Returns ``out``."""
        if self.w4a16 is not None:
            raise TypeError("gemm: a W4A16 layer takes 16-bit activations: call the layer itself")
        ta = describe(a_values, "`a_values`")
        ta.require_dtype(VALUES)
        tsa = describe(a_scales, "`a_scales`")
        tsa.require_dtype(SCALES)
        for t, want in ((ta, self.token_rows * self.k // 2), (tsa, self.scale_rows * self.k // 16)):
            t.require_contiguous()
            if t.numel != want:
                raise t.error(f"has {t.numel} bytes; the layer's tokens need {want}")
            t.require_aligned()
        tsz = self._sizes(sizes)
        out, tc = self._out(out, ta)
        same_device([ta, tsa, tsz, tc], self._ordinal)
        s = stream_handle(stream, self._ordinal)
        self._plan.run(s, tsz.buffer(), [ta.ptr, ta.numel, tsa.ptr, tsa.numel], tc.buffer())
        return out

    def status(self, stream=None):
        """The sticky status word ``(bits, text)``: which sizes were beyond the bounds (clamped)
        since the last :meth:`clear_status`. Synchronizes the stream."""
        return self._plan.read_status(stream_handle(stream, self._ordinal))

    def clear_status(self, stream=None):
        """Zeroes the status word on the stream (capturable)."""
        self._plan.clear_status(stream_handle(stream, self._ordinal))


def _group_experts(group_experts, experts):
    """The expert index of each group as a list of ints; ``ValueError`` for an index out of range."""
    if group_experts is None:
        return list(range(experts))
    try:
        out = [operator.index(e) for e in group_experts]
    except TypeError:
        raise TypeError(f"group_experts: {group_experts!r} is not a sequence of ints") from None
    if not out:
        raise ValueError("group_experts: empty; at least one group is needed")
    for g, e in enumerate(out):
        if not 0 <= e < experts:
            raise ValueError(f"group_experts: group {g} runs expert {e}; the weights hold experts 0..{experts - 1}")
    return out


def offsets_from_counts(counts):
    """Expert offsets ``[E + 1]`` (``int32``, on the same device) from per-expert token counts
    ``[E]``: ``[0, cumsum(counts)]``, computed on the GPU (no host synchronization)."""
    torch = torch_module()
    if torch is None:
        raise TypeError("offsets_from_counts needs a torch tensor")
    zero = torch.zeros((1,), dtype=torch.int32, device=counts.device)
    return torch.cat([zero, torch.cumsum(counts, 0).to(torch.int32)])


__all__ = ["MoE", "offsets_from_counts"]
