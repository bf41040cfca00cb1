"""Devices, the plan cache, the grouped GEMM and the quantizer: each function hands its arguments
to the native module, which reads every tensor once, checks it against the library's rules and
runs; this module adds nothing but the device handles."""

import threading

from . import _native

_lock = threading.Lock()
_devices = {}


def device(ordinal=None):
    """The library's handle of CUDA device ``ordinal`` (default: the current device), opened once:
    its kernels loaded into the device's primary context (the one PyTorch uses)."""
    if ordinal is None:
        from ._hooks import current_device

        ordinal = current_device()
    d = _devices.get(ordinal)
    if d is None:
        with _lock:
            d = _devices.get(ordinal)
            if d is None:
                d = _native.Device(ordinal)
                _devices[ordinal] = d
    return d


def clear_cache():
    """Drops every cached plan (grouped GEMM, stacked, W4A16, ``custom_kernel``'s), but those
    captured into CUDA graphs (the graphs read them). Waits for the device."""
    _native.clear_cache()


def grouped_gemm(a, b, a_scales, b_scales, alpha=None, *, out=None, out_dtype=None, scale_layout="blocked", stream=None):
    """``out[g] = alpha[g] · A_g · B_gᵀ`` for every group ``g``, on the GPU.

    - ``a[g]``: ``[m_g, K_g/2]`` packed e2m1 values (``uint8`` or ``torch.float4_e2m1fn_x2``; two
      values per byte, element ``2j`` in the low nibble), row-major; ``m_g`` may be 0.
    - ``b[g]``: ``[n_g, K_g/2]`` likewise; ``n_g`` a multiple of 8, ``K_g`` a multiple of 64.
    - ``a_scales[g]``, ``b_scales[g]``: e4m3 block scales (``float8_e4m3fn`` or ``uint8``), one per
      16 values, in the 128x4 blocked layout (any contiguous tensor of those bytes, or the GPU
      MODE task's permuted ``(32, 4, rest, 4, rest_k, 1)`` view), or with
      ``scale_layout="plain"`` as ``[rows, K/16]`` (converted on the GPU first: one extra copy
      per operand and call).
    - ``alpha``: None (1.0), one float, or one per group (NVFP4's global scales: ``g_a · g_b``);
      or a CUDA ``float32`` tensor ``[G]`` read on the device when the call runs (in stream
      order, no host synchronization: a captured graph reads its values at each replay; they
      are not checked, and a NaN alpha gives NaN outputs).
    - ``out``: a list of ``[m_g, n_g]`` fp16/bf16 tensors to write, or None for new ones of
      ``out_dtype`` (default fp16).

    A trailing size-1 dimension (``[rows, cols, 1]``) is accepted everywhere. Everything is
    checked before any launch (``TypeError``/``ValueError`` naming the group and argument); runs
    on ``stream`` (default: the current stream), with no host synchronization. The plan is
    cached per (device, shapes, output type) and serves any tensors of those shapes: a call with
    other tensors than the previous one uploads a few kilobytes of tables in stream order (no
    allocation, no synchronization). Returns the list of outputs.
    """
    return _native.grouped_gemm(a, b, a_scales, b_scales, alpha, out, out_dtype, scale_layout, stream)


class PreparedGemm:
    """A grouped GEMM bound to its tensors (:func:`prepare`): calling it launches on the current
    (or given) stream and returns the outputs; nothing is read from the tensors again. The tensors
    must stay alive and keep their storage (no ``resize_``/``set_``) while it is used."""

    __slots__ = ("outputs", "_prepared", "__weakref__")

    def __init__(self, prepared, outputs):
        self._prepared = prepared
        self.outputs = outputs

    @property
    def kernel(self):
        return self._prepared.kernel

    def __call__(self, stream=None):
        self._prepared.launch(stream)
        return self.outputs


def prepare(a, b, a_scales, b_scales, alpha=None, *, out=None, out_dtype=None, scale_layout="blocked", stream=None):
    """:func:`grouped_gemm`'s arguments checked once and bound to a plan of their own: returns a
    :class:`PreparedGemm`, whose calls launch only (the plan's tables hold these tensors). Plain
    scales are converted once, here."""
    prepared, outputs = _native.prepare(a, b, a_scales, b_scales, alpha, out, out_dtype, scale_layout, stream)
    return PreparedGemm(prepared, list(outputs))


def grouped_gemm_stacked(a, b, a_scales, b_scales, m_sizes, alpha=None, *, out=None, out_dtype=None, stream=None):
    """The grouped GEMM with one tensor per operand for all groups (a mixture-of-experts layer's
    usual form), group sizes known on the host:

    - ``a``: ``[T, K/2]`` tokens sorted by group, ``T = sum(m_sizes)``;
    - ``b``: ``[G, N, K/2]`` weights;
    - ``a_scales``: every group's blocked scales back to back (group ``g``'s ``m_g`` rows padded
      to 128): ``sum(blocked_bytes(m_g, K))`` bytes, contiguous;
    - ``b_scales``: ``G · blocked_bytes(N, K)`` bytes, contiguous (e.g. ``[G, ...]``);
    - ``out``: ``[T, N]`` or None (new, ``out_dtype``).

    Computes bit for bit what :func:`grouped_gemm` computes on each group's part. For sizes that
    live on the GPU use :class:`MoE`. Returns ``out``.
    """
    return _native.grouped_gemm_stacked(a, b, a_scales, b_scales, m_sizes, alpha, out, out_dtype, stream)


def quantize(x, global_scale=1.0, *, values=None, scales=None, stream=None):
    """NVFP4-quantizes ``x`` (``[rows, K]`` fp16/bf16, contiguous, K a multiple of 64) on the GPU.

    Global-scale convention (this library's, the same as the Rust API's): ``global_scale`` is the
    *dequantization* factor ``g``. Each 16-value block gets the e4m3 scale ``s = e4m3(amax_block
    / 6 / g)`` and values ``e2m1(x / (s · g))``, so ``x ≈ e2m1 · s · g``; for one tensor the
    usual choice is ``g = amax(x) / (6 · 448)``. FlashInfer's ``fp4_quantize`` (and TensorRT-LLM's)
    take the inverse, ``(6 · 448) / amax``: pass ``1 / their_scale`` here. The GEMM's alpha is
    ``g_a · g_b``.

    Returns ``(values, scales)``: ``values`` ``[rows, K/2]`` ``uint8`` (view it as
    ``torch.float4_e2m1fn_x2`` if wanted), ``scales`` the 128x4 blocked layout as a flat
    ``uint8`` tensor of ``blocked_bytes(rows, K)`` bytes (padding rows zero; see
    :func:`nvfp4_gemm.layout.from_blocked` for the plain layout). Pass ``values``/``scales`` to
    write into existing tensors. Bit for bit the library's CPU quantizer. NaN in a block gives
    that block the NaN scale; ±inf saturates.
    """
    return _native.quantize(x, float(global_scale), values, scales, stream)


def dequantize(values, scales, global_scale=1.0, *, out=None, out_dtype=None, scale_layout="blocked", stream=None):
    """``e2m1 · e4m3 · global_scale`` of an NVFP4 tensor (``values`` ``[rows, K/2]``, ``scales``
    as in :func:`grouped_gemm`), exact in f64 and rounded once to fp16/bf16 (``out_dtype``,
    default bf16), on the GPU. Returns ``[rows, K]`` (``out`` if given)."""
    return _native.dequantize(values, scales, float(global_scale), out, out_dtype, scale_layout, stream)


__all__ = ["device", "clear_cache", "grouped_gemm", "grouped_gemm_stacked", "prepare", "PreparedGemm", "quantize", "dequantize"]
