"""A mixture-of-experts layer's grouped GEMM with the routing on the GPU (``nvfp4_gemm::moe``)."""

from . import _native
from ._core import device  # noqa: F401  (the package's device lookup; tests replace it)
from ._hooks import torch_module


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
      weights are prepacked for them here, once (on the GPU, on the current stream, waited for
      before the layer is returned; the layer owns the prepacked copy). ``input_global_scale`` is then unused and :meth:`gemm` not
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
        self._layer = _native.MoeLayer(
            weights, weight_scales, alphas, layout, max_tokens, max_rows, out_dtype, float(input_global_scale),
            scale_layout, group_experts, w4a16,
        )
        (self.token_rows, self.scale_rows, self.sizes_len, self.c_elements, self.experts, self.groups, self.n, self.k) = (
            self._layer.sizes
        )
        self.group_experts = self._layer.group_experts
        self.layout, self.masked = layout, layout == "masked"
        self.bound = max_rows if self.masked else max_tokens
        self.w4a16 = None if w4a16 is None else str(w4a16).removeprefix("torch.")
        buffers = self._layer.token_buffers
        if buffers is not None:
            # The quantized tokens: owned by the layer, so their address never changes.
            self.a_values = buffers[0][: self.token_rows * self.k // 2]
            self.a_scales = buffers[1][: self.scale_rows * self.k // 16]

    def _x_shape(self):
        """The shape ``x`` must have: ``[max_tokens, K]`` (contiguous) or ``[experts, max_rows, K]``
        (masked)."""
        return (self.groups, self.bound, self.k) if self.masked else (self.bound, self.k)

    def _out_shape(self):
        """The shape of ``out``: ``x``'s with ``N`` for ``K``."""
        return (self.groups, self.bound, self.n) if self.masked else (self.bound, self.n)

    @property
    def kernel(self):
        """The GEMM kernel the plan runs (for people)."""
        return self._layer.kernel

    def __call__(self, x, sizes, *, out=None, stream=None):
        """Quantizes ``x`` (the routed activations, fp16/bf16, the layout's shape) into the
        layer's NVFP4 token buffers and runs the grouped GEMM into ``out`` (or a new zeroed
        tensor), with the expert sizes ``sizes`` read on the device; with ``w4a16``, runs the
        GEMM on ``x`` itself (of the layer's activation type). Returns ``out``."""
        return self._layer.run(x, sizes, out, stream)

    def gemm(self, a_values, a_scales, sizes, *, out=None, stream=None):
        """The grouped GEMM alone on tokens already quantized in this library's layout
        (``a_values``: ``token_rows · K/2`` bytes; ``a_scales``: ``scale_rows · K/16`` bytes,
        expert ``e``'s from row ``128 · (ceil(offsets[e] / 128) + e)`` (contiguous) or
        ``e · ceil(max_rows / 128) · 128`` (masked); see
        :func:`nvfp4_gemm.layout.vllm_scales_to_moe` for vLLM's layout). Returns ``out``."""
        return self._layer.gemm(a_values, a_scales, sizes, out, stream)

    def set_routed_rows(self, rows):
        """Tells the layer that the calls that follow route at most ``rows`` rows to its groups
        in all (e.g. ``T · top_k`` of an engine's step; None, the default: no bound beyond the
        layout's), like DeepGEMM's ``expected_m``. On sm_90a, with both GEMM kernels planned, at
        most 16 rows launch the decode kernel alone, and more than 16 per group launch the
        general kernel first (the one that then does the work), its launch without work after
        it. A call that routes more rows than told is still computed, or flagged in
        :meth:`status` where the decode kernel's list cannot hold it. A CUDA graph replays the
        launches of its capture: tell the layer before capturing."""
        self._layer.set_routed_rows(rows)

    def status(self, stream=None):
        """The sticky status word ``(bits, text)``: which sizes were beyond the bounds (clamped)
        since the last :meth:`clear_status`. Synchronizes the stream."""
        return self._layer.status(stream)

    def clear_status(self, stream=None):
        """Zeroes the status word on the stream (capturable)."""
        self._layer.clear_status(stream)


def offsets_from_counts(counts):
    """Expert offsets ``[E + 1]`` (``int32``, on the same device) from per-expert token counts
    ``[E]``: ``[0, cumsum(counts)]``, computed on the GPU (no host synchronization)."""
    torch = torch_module()
    if torch is None:
        raise TypeError("offsets_from_counts needs a torch tensor")
    zero = torch.zeros((1,), dtype=torch.int32, device=counts.device)
    return torch.cat([zero, torch.cumsum(counts, 0).to(torch.int32)])


__all__ = ["MoE", "offsets_from_counts"]
