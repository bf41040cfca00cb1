"""Devices, the plan cache, the grouped GEMM and the quantizer."""

import collections
import threading

from . import _native
from ._tensors import (
    DENSE,
    VALUES,
    blocked_bytes,
    current_stream,
    describe,
    dtype_name,
    gemm_alphas,
    same_device,
    stream_handle,
    torch_module,
)
from .layout import blocked_scales, to_blocked

_lock = threading.Lock()
_devices = {}
# Plans by (device, shapes, bf16), most recently used last.
_plans = collections.OrderedDict()
# Plans captured into a CUDA graph: never reused for other tensors or freed (the graph reads
# their tables).
_captured = []
MAX_PLANS = 64


def device(ordinal=None):
    """The library's handle of CUDA device ``ordinal`` (default: the current device), opened once:
    its kernels loaded into the device's primary context (the one PyTorch uses)."""
    if ordinal is None:
        from ._tensors import current_device

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
    """Drops the cached plans (not those captured into CUDA graphs). Waits for the device."""
    with _lock:
        _plans.clear()


def _refuse_in_capture(dev, stream, what):
    if dev.is_capturing(stream):
        raise _native.CaptureError(
            f"{what} inside CUDA graph capture: a new plan allocates device memory; call once with "
            "these shapes outside capture first"
        )


def _plan(dev, shapes, bf16, stream):
    key = (dev.ordinal, shapes, bf16)
    with _lock:
        plan = _plans.get(key)
        if plan is not None:
            _plans.move_to_end(key)
            return key, plan
    _refuse_in_capture(dev, stream, "planning a grouped GEMM")
    plan = _native.GemmPlan(dev, list(shapes), bf16)
    with _lock:
        _plans[key] = plan
        while len(_plans) > MAX_PLANS:
            _plans.popitem(last=False)
    return key, plan


def _captured_plan(key, plan):
    """A plan whose call was just captured: the graph keeps reading its tables."""
    with _lock:
        if _plans.get(key) is plan:
            del _plans[key]
        _captured.append(plan)


def _out_dtype(out_dtype, default="float16"):
    name = default if out_dtype is None else dtype_name(out_dtype)
    if name not in DENSE:
        raise TypeError(f"out_dtype: {name}; expected float16 or bfloat16")
    return name


def _new_tensor(like, shape, dtype_name_, device_index):
    """A new CUDA tensor of ``shape`` (torch only)."""
    torch = torch_module()
    if torch is None or not like.is_torch:
        raise TypeError("out: required when the inputs are not torch tensors (this package allocates with torch)")
    return torch.empty(shape, dtype=getattr(torch, dtype_name_), device=f"cuda:{device_index}")


def _values(t, rows=None, k=None):
    """Packed e2m1 values ``[rows, k/2]`` (a trailing size-1 dimension allowed): (rows, k)."""
    t.require_dtype(VALUES)
    shape = t.shape
    if len(shape) == 3 and shape[2] == 1:
        shape = shape[:2]
    if len(shape) != 2:
        raise t.error(f"shape {list(t.shape)}; expected [rows, K/2]")
    t.require_contiguous()
    r, kk = shape[0], 2 * shape[1]
    if rows is not None and r != rows:
        raise t.error(f"has {r} rows; expected {rows}")
    if k is not None and kk != k:
        raise t.error(f"K = 2·{shape[1]} = {kk} differs from A's K = {k}")
    if kk == 0 or kk % 64:
        raise t.error(f"K = 2·{shape[1]} = {kk} is not a positive multiple of 64")
    t.require_aligned()
    return r, kk


def _scales(t, rows, k, scale_layout, keep):
    """(address, bytes) of an operand's blocked scales; plain ones converted (kept in ``keep``)."""
    if scale_layout == "blocked":
        return blocked_scales(t, rows, k)
    if scale_layout != "plain":
        raise ValueError(f"scale_layout: {scale_layout!r}; expected 'blocked' or 'plain'")
    from ._tensors import SCALES

    t.require_dtype(SCALES)
    shape = t.shape[:2] if len(t.shape) == 3 and t.shape[2] == 1 else t.shape
    if shape != (rows, k // 16):
        raise t.error(f"shape {list(t.shape)}; plain scales of {rows} rows × K={k} are [{rows}, {k // 16}]")
    blocked = to_blocked(t.obj.reshape(rows, k // 16), rows)
    keep.append(blocked)
    return blocked.data_ptr(), blocked.numel()


def _output(t, rows, n, dtype):
    t.require_dtype((dtype,))
    shape = t.shape[:2] if len(t.shape) == 3 and t.shape[2] == 1 else t.shape
    if shape != (rows, n):
        raise t.error(f"shape {list(t.shape)}; expected [{rows}, {n}]")
    t.require_contiguous()
    t.require_aligned()


def _group_lists(lists, out):
    """Checks that every argument of ``lists`` (name to value; the first one counts the groups)
    and ``out`` (unless None) is a list of one tensor per group; returns the group count."""
    lists = dict(lists)
    if out is not None:
        lists["out"] = out
    for name, v in lists.items():
        if not isinstance(v, (list, tuple)):
            raise TypeError(f"{name}: {type(v).__name__}; expected a list with one tensor per group")
    first = next(iter(lists))
    groups = len(lists[first])
    for name, v in lists.items():
        if len(v) != groups:
            raise ValueError(f"{name}: {len(v)} tensors but `{first}` has {groups} groups")
    return groups


def _collect(a, b, a_scales, b_scales, alpha, out, out_dtype, scale_layout):
    """Reads and checks one grouped call's arguments (no launch): the device ordinal, shapes,
    output dtype, the native layer's flat buffer list, alphas (host floats and the device
    tensor's ``(address, length)`` or None), outputs (new ones allocated) and the converted
    scales to keep alive."""
    groups = _group_lists({"a": a, "b": b, "a_scales": a_scales, "b_scales": b_scales}, out)
    if out is not None and groups:
        first = describe(out[0], "group 0: `out`")
        dtype = _out_dtype(out_dtype, first.dtype if first.dtype in DENSE else "float16")
    else:
        dtype = _out_dtype(out_dtype)
    alphas, device_alpha = gemm_alphas(alpha, groups)
    shapes, buffers, tensors, keep = [], [], [], []
    for g in range(groups):
        ta = describe(a[g], f"group {g}: `a`")
        tb = describe(b[g], f"group {g}: `b`")
        m, k = _values(ta)
        n, _ = _values(tb, k=k)
        if n % 8:
            raise tb.error(f"N = {n} rows is not a multiple of 8")
        tsa = describe(a_scales[g], f"group {g}: `a_scales`")
        tsb = describe(b_scales[g], f"group {g}: `b_scales`")
        tensors += [ta, tb, tsa, tsb]
        tc = None
        if out is not None:
            tc = describe(out[g], f"group {g}: `out`")
            _output(tc, m, n, dtype)
            tensors.append(tc)
        sa = _scales(tsa, m, k, scale_layout, keep)
        sb = _scales(tsb, n, k, scale_layout, keep)
        shapes.append((m, n, k))
        buffers.append((ta.ptr, ta.nbytes, sa, tb.ptr, tb.nbytes, sb, tc))
    ordinal = same_device(tensors + ([] if device_alpha is None else [device_alpha]))
    bf16 = dtype == "bfloat16"
    _native.check_problem(shapes, bf16)
    if out is None:
        like = tensors[0] if tensors else None
        outs = [_new_tensor(like, (m, n), dtype, ordinal) for (m, n, _) in shapes]
    else:
        outs = list(out)
    flat = []
    for g, (ap, an, sa, bp, bn, sb, tc) in enumerate(buffers):
        cp = outs[g].data_ptr() if tc is None else tc.ptr
        m, n, _ = shapes[g]
        flat += [ap, an, sa[0], sa[1], bp, bn, sb[0], sb[1], cp, m * n]
    alphas = (alphas, None if device_alpha is None else device_alpha.buffer())
    return ordinal, tuple(shapes), bf16, flat, alphas, outs, keep


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
    cached per (device, shapes, output type): a call with other tensors than the plan's previous
    call re-encodes its tables (host work, one small upload); :func:`prepare` binds tensors to a
    plan of their own. Returns the list of outputs.
    """
    ordinal, shapes, bf16, flat, alphas, outs, keep = _collect(a, b, a_scales, b_scales, alpha, out, out_dtype, scale_layout)
    if not shapes:
        return outs
    dev = device(ordinal)
    s = stream_handle(stream, ordinal)
    key, plan = _plan(dev, shapes, bf16, s)
    if plan.run(s, flat, *alphas):
        _captured_plan(key, plan)
    return outs


class PreparedGemm:
    """A grouped GEMM bound to its tensors (:func:`prepare`): calling it launches on the current
    (or given) stream and returns the outputs; nothing is read from the tensors again, so a call
    costs the launch and a few microseconds of host time. The tensors must stay alive and keep
    their storage (no ``resize_``/``set_``) while it is used."""

    __slots__ = ("outputs", "_plan", "_ordinal", "_keep", "_tensors", "__weakref__")

    def __init__(self, ordinal, plan, outputs, keep, tensors):
        self._ordinal = ordinal
        self._plan = plan
        self.outputs = outputs
        self._keep = keep
        self._tensors = tensors

    @property
    def kernel(self):
        return self._plan.kernel

    def __call__(self, stream=None):
        s = current_stream(self._ordinal) if stream is None else stream_handle(stream, self._ordinal)
        self._plan.launch(s)
        return self.outputs


def prepare(a, b, a_scales, b_scales, alpha=None, *, out=None, out_dtype=None, scale_layout="blocked", stream=None):
    """:func:`grouped_gemm`'s arguments checked once and bound to a plan of their own: returns a
    :class:`PreparedGemm`, whose calls launch only (the plan's tables hold these tensors). Plain
    scales are converted once, here. The first call must be outside CUDA graph capture."""
    ordinal, shapes, bf16, flat, alphas, outs, keep = _collect(a, b, a_scales, b_scales, alpha, out, out_dtype, scale_layout)
    dev = device(ordinal)
    _refuse_in_capture(dev, stream_handle(stream, ordinal), "preparing a grouped GEMM")
    plan = _native.GemmPlan(dev, list(shapes), bf16)
    plan.bind(flat, *alphas)
    return PreparedGemm(ordinal, plan, outs, keep, (a, b, a_scales, b_scales, alpha))


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
    if not isinstance(m_sizes, (list, tuple)):
        raise TypeError(f"m_sizes: {type(m_sizes).__name__}; expected a list of ints (one per group)")
    tb = describe(b, "`b`")
    tb.require_dtype(VALUES)
    if len(tb.shape) != 3:
        raise tb.error(f"shape {list(tb.shape)}; expected [G, N, K/2]")
    groups, n, k = tb.shape[0], tb.shape[1], 2 * tb.shape[2]
    if len(m_sizes) != groups:
        raise ValueError(f"m_sizes: {len(m_sizes)} sizes but `b` has {groups} groups")
    tb.require_contiguous()
    tb.require_aligned()
    if k == 0 or k % 64:
        raise tb.error(f"K = 2·{tb.shape[2]} = {k} is not a positive multiple of 64")
    if n % 8:
        raise tb.error(f"N = {n} is not a multiple of 8")
    ms = []
    for g, m in enumerate(m_sizes):
        if not isinstance(m, int) or m < 0:
            raise ValueError(f"group {g}: `m_sizes`: {m!r} is not a non-negative int")
        ms.append(m)
    tokens = sum(ms)
    ta = describe(a, "`a`")
    _values(ta, rows=tokens, k=k)
    tsa = describe(a_scales, "`a_scales`")
    tsb = describe(b_scales, "`b_scales`")
    for t, want in ((tsa, sum(blocked_bytes(m, k) for m in ms)), (tsb, groups * blocked_bytes(n, k))):
        from ._tensors import SCALES

        t.require_dtype(SCALES)
        t.require_contiguous()
        if t.numel != want:
            raise t.error(f"has {t.numel} bytes; the stacked groups' blocked scales are {want}")
        t.require_aligned()
    tensors = [ta, tb, tsa, tsb]
    if out is not None:
        tc = describe(out, "`out`")
        dtype = _out_dtype(out_dtype, tc.dtype if tc.dtype in DENSE else "float16")
        _output(tc, tokens, n, dtype)
        tensors.append(tc)
    else:
        dtype = _out_dtype(out_dtype)
    alphas, device_alpha = gemm_alphas(alpha, groups)
    if device_alpha is not None:
        tensors.append(device_alpha)
    ordinal = same_device(tensors)
    shapes = tuple((m, n, k) for m in ms)
    _native.check_problem(list(shapes), dtype == "bfloat16")
    if out is None:
        out = _new_tensor(ta, (tokens, n), dtype, ordinal)
        cp = out.data_ptr()
    else:
        cp = tc.ptr
    flat = [ta.ptr, ta.nbytes, tsa.ptr, tsa.numel, tb.ptr, tb.nbytes, tsb.ptr, tsb.numel, cp, tokens * n]
    dev = device(ordinal)
    s = stream_handle(stream, ordinal)
    key, plan = _plan(dev, shapes, dtype == "bfloat16", s)
    if plan.run_stacked(s, flat, alphas, None if device_alpha is None else device_alpha.buffer()):
        _captured_plan(key, plan)
    return out


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
    tx = describe(x, "`x`")
    tx.require_dtype(DENSE)
    if len(tx.shape) != 2:
        raise tx.error(f"shape {list(tx.shape)}; expected [rows, K]")
    tx.require_contiguous()
    tx.require_aligned()
    rows, k = tx.shape
    if k == 0 or k % 64:
        raise tx.error(f"K = {k} is not a positive multiple of 64")
    _check_global_scale(global_scale)
    tv, ts = _nvfp4_outputs(tx, rows, k, values, scales)
    ordinal = same_device([tx, tv, ts])
    dev = device(ordinal)
    dev.quantize(
        stream_handle(stream, ordinal), tx.buffer(), tx.dtype == "bfloat16", rows, k, float(global_scale),
        (tv.ptr, tv.nbytes), (ts.ptr, ts.nbytes),
    )
    return tv.obj, ts.obj


def _check_global_scale(g):
    g = float(g)
    if not (g > 0 and g != float("inf")):
        raise ValueError(f"global_scale: {g} is not finite and positive")


def _nvfp4_outputs(like, rows, k, values, scales):
    torch = torch_module()
    if values is None:
        values = _new_tensor(like, (rows, k // 2), "uint8", like.device if like.device is not None else 0)
    if scales is None:
        scales = torch.empty((blocked_bytes(rows, k),), dtype=torch.uint8, device=values.device)
    tv = describe(values, "`values`")
    _values(tv, rows=rows, k=k)
    ts = describe(scales, "`scales`")
    ptr, n = blocked_scales(ts, rows, k)
    if not ts.contiguous():
        raise ts.error("must be contiguous to be written")
    return tv, ts


def dequantize(values, scales, global_scale=1.0, *, out=None, out_dtype=None, scale_layout="blocked", stream=None):
    """``e2m1 · e4m3 · global_scale`` of an NVFP4 tensor (``values`` ``[rows, K/2]``, ``scales``
    as in :func:`grouped_gemm`), exact in f64 and rounded once to fp16/bf16 (``out_dtype``,
    default bf16), on the GPU. Returns ``[rows, K]`` (``out`` if given)."""
    tv = describe(values, "`values`")
    rows, k = _values(tv)
    ts = describe(scales, "`scales`")
    keep = []
    sp, sn = _scales(ts, rows, k, scale_layout, keep)
    _check_global_scale(global_scale)
    tensors = [tv, ts]
    if out is not None:
        to = describe(out, "`out`")
        dtype = _out_dtype(out_dtype, to.dtype if to.dtype in DENSE else "bfloat16")
        _output(to, rows, k, dtype)
        tensors.append(to)
    else:
        dtype = _out_dtype(out_dtype, "bfloat16")
    ordinal = same_device(tensors)
    if out is None:
        out = _new_tensor(tv, (rows, k), dtype, ordinal)
    dev = device(ordinal)
    dev.dequantize(
        stream_handle(stream, ordinal), (tv.ptr, tv.nbytes), (sp, sn), rows, k, float(global_scale),
        (out.data_ptr() if hasattr(out, "data_ptr") else to.ptr, rows * k), dtype == "bfloat16",
    )
    return out


__all__ = ["device", "clear_cache", "grouped_gemm", "grouped_gemm_stacked", "prepare", "PreparedGemm", "quantize", "dequantize", "current_stream"]
