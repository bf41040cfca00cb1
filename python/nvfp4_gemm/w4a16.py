"""W4A16 on Hopper (sm_90a): fp16 or bf16 activations used as they are, times NVFP4 weights
prepacked once (``docs/w4a16.md``). No activation quantization and no dequantization pass: one
GEMM launch per call. sm_100a multiplies NVFP4 operands natively (use :func:`grouped_gemm` there):
these calls raise :class:`UnsupportedError` on it.

- :func:`prepack`: the one-time weight step (on the CPU: the weights are copied to the host and
  back);
- :func:`grouped_gemm`: per-group activations ``[m_g, K]`` times prepacked weights;
- :class:`nvfp4_gemm.MoE` with ``w4a16=`` for a mixture-of-experts layer with the routing on the
  GPU.
"""

import collections
import ctypes

from . import _native
from ._core import (
    MAX_PLANS,
    _captured_plan,
    _group_lists,
    _lock,
    _out_dtype,
    _output,
    _refuse_in_capture,
    _values,
    device,
)
from ._tensors import (
    DENSE,
    SCALES,
    VALUES,
    blocked_bytes,
    describe,
    dtype_name,
    finite_alphas,
    same_device,
    stream_handle,
    torch_module,
)

# Plans by (device, shapes, output bf16, activations bf16), most recently used last.
_plans = collections.OrderedDict()


def _host_bytes(obj):
    """The bytes of a contiguous uint8-viewable torch tensor, through a host copy."""
    torch = torch_module()
    t = obj.contiguous().view(torch.uint8).cpu()
    return ctypes.string_at(t.data_ptr(), t.numel())


def _torch_tensor(obj, name, dtypes):
    """The shape of a contiguous torch tensor (on the GPU or the CPU) of one of ``dtypes``."""
    if not all(hasattr(obj, a) for a in ("shape", "dtype", "is_contiguous", "data_ptr")):
        raise TypeError(f"{name}: {type(obj).__name__} is not a torch tensor")
    if dtype_name(obj.dtype) not in dtypes:
        raise TypeError(f"{name}: dtype {dtype_name(obj.dtype)}; expected {' or '.join(dtypes)}")
    if not obj.is_contiguous():
        raise ValueError(f"{name}: is not contiguous; call .contiguous() first")
    return tuple(obj.shape)


def _numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def _activations(dtype_name_, what):
    if dtype_name_ not in DENSE:
        raise TypeError(f"{what}: {dtype_name_}; expected float16 or bfloat16")
    return dtype_name_ == "bfloat16"


def prepack_experts(values, scales, experts, n, k, bf16):
    """Prepacks ``experts`` matrices of ``n × k`` (``values`` their packed bytes back to back,
    ``scales`` their blocked scales back to back, both tensors) for bf16 or f16 activations:
    returns new ``uint8`` tensors on the same device, ``[experts, n, k/2]`` and flat scales."""
    torch = torch_module()
    vb, sb = _host_bytes(values), _host_bytes(scales)
    wbytes, sbytes = n * k // 2, blocked_bytes(n, k)
    out_v, out_s = bytearray(), bytearray()
    for e in range(experts):
        v, s = _native.prepack_w4a16(vb[e * wbytes : (e + 1) * wbytes], sb[e * sbytes : (e + 1) * sbytes], n, k, bf16)
        out_v += v
        out_s += s
    dev = values.device
    pv = torch.frombuffer(out_v, dtype=torch.uint8).reshape(experts, n, k // 2).to(dev)
    ps = torch.frombuffer(out_s, dtype=torch.uint8).to(dev)
    return pv, ps


def prepack(values, scales, activations="bfloat16"):
    """Prepacks NVFP4 weights for W4A16 with ``activations`` (``"bfloat16"``/``"float16"`` or a
    torch dtype): the K permutation of the kernels' fragments moved into the weights, and for bf16
    each block's scale sign folded into its codes and the scales re-encoded (``docs/w4a16.md``
    §2). Run once per weight tensor.

    - ``values``: ``[N, K/2]`` or ``[E, N, K/2]`` packed e2m1 (``uint8`` or
      ``float4_e2m1fn_x2``), contiguous, on the GPU or the CPU;
    - ``scales``: the 128x4 blocked e4m3 scales, ``blocked_bytes(N, K)`` bytes per matrix, back to
      back (any contiguous shape).

    Returns ``(values, scales)``: new ``uint8`` tensors of the same sizes on ``values``' device.
    Weights prepacked for one activation type give wrong results with the other.
    """
    bf16 = _activations(dtype_name(activations), "activations")
    shape = _torch_tensor(values, "`values`", VALUES)
    if len(shape) not in (2, 3):
        raise ValueError(f"`values`: shape {list(shape)}; expected [N, K/2] or [E, N, K/2]")
    experts = shape[0] if len(shape) == 3 else 1
    n, k = shape[-2], 2 * shape[-1]
    if k == 0 or k % 64:
        raise ValueError(f"`values`: K = 2·{shape[-1]} = {k} is not a positive multiple of 64")
    want = experts * blocked_bytes(n, k)
    if _numel(_torch_tensor(scales, "`scales`", SCALES)) != want:
        raise ValueError(f"`scales`: has {scales.numel()} bytes; {experts} matrices of N={n}, K={k} need {want} (blocked)")
    pv, ps = prepack_experts(values, scales, experts, n, k, bf16)
    return (pv if len(shape) == 3 else pv[0]), ps


def grouped_gemm(x, b, b_scales, alpha=None, *, out=None, out_dtype=None, stream=None):
    """``out[g] = alpha[g] · x_g · B_gᵀ`` with 16-bit activations and NVFP4 weights (W4A16), on
    the GPU (sm_90a).

    - ``x[g]``: ``[m_g, K_g]`` fp16 or bf16 activations (every group the same type), contiguous;
      ``m_g`` may be 0;
    - ``b[g]``, ``b_scales[g]``: group ``g``'s weights ``[n_g, K_g/2]`` and blocked scales,
      prepacked by :func:`prepack` for ``x``'s type;
    - ``alpha``: None (1.0), one float, or one per group (the weights' global scale times the
      caller's factor);
    - ``out``: a list of ``[m_g, n_g]`` fp16/bf16 tensors, or None for new ones of ``out_dtype``
      (default: ``x``'s type).

    Everything is checked before any launch; the plan is cached per (device, shapes, output and
    activation types). Returns the outputs.
    """
    groups = _group_lists({"x": x, "b": b, "b_scales": b_scales}, out)
    if not groups:
        return []
    tx = [describe(t, f"group {g}: `x`") for g, t in enumerate(x)]
    act = tx[0].dtype
    bf16_act = _activations(act, "group 0: `x`")
    if out is not None:
        first = describe(out[0], "group 0: `out`")
        dtype = _out_dtype(out_dtype, first.dtype if first.dtype in DENSE else act)
    else:
        dtype = _out_dtype(out_dtype, act)
    alphas = finite_alphas(alpha, groups, "alpha")
    shapes, tensors, flat, pending = [], [], [], []
    for g in range(groups):
        t = tx[g]
        if t.dtype != act:
            raise t.error(f"{t.dtype}; group 0's activations are {act} (one type per call)", TypeError)
        if len(t.shape) != 2:
            raise t.error(f"shape {list(t.shape)}; expected [m, K]")
        t.require_contiguous()
        t.require_aligned()
        m, k = t.shape
        tb = describe(b[g], f"group {g}: `b`")
        n, _ = _values(tb, k=k)
        if n % 8:
            raise tb.error(f"N = {n} rows is not a multiple of 8")
        ts = describe(b_scales[g], f"group {g}: `b_scales`")
        ts.require_dtype(SCALES)
        ts.require_contiguous()
        if ts.numel != blocked_bytes(n, k):
            raise ts.error(f"has {ts.numel} bytes; N={n}, K={k} needs {blocked_bytes(n, k)} (blocked)")
        ts.require_aligned()
        tensors += [t, tb, ts]
        tc = None
        if out is not None:
            tc = describe(out[g], f"group {g}: `out`")
            _output(tc, m, n, dtype)
            tensors.append(tc)
        shapes.append((m, n, k))
        pending.append((t, tb, ts, tc))
    ordinal = same_device(tensors)
    bf16 = dtype == "bfloat16"
    _native.check_problem(shapes, bf16)
    if out is None:
        torch = torch_module()
        if torch is None or not tx[0].is_torch:
            raise TypeError("out: required when the inputs are not torch tensors (this package allocates with torch)")
        outs = [torch.empty((m, n), dtype=getattr(torch, dtype), device=f"cuda:{ordinal}") for m, n, _ in shapes]
    else:
        outs = list(out)
    for g, (t, tb, ts, tc) in enumerate(pending):
        m, n, _ = shapes[g]
        cp = outs[g].data_ptr() if tc is None else tc.ptr
        flat += [t.ptr, t.numel, tb.ptr, tb.nbytes, ts.ptr, ts.numel, cp, m * n]
    dev = device(ordinal)
    s = stream_handle(stream, ordinal)
    key = (ordinal, tuple(shapes), bf16, bf16_act)
    with _lock:
        plan = _plans.get(key)
        if plan is not None:
            _plans.move_to_end(key)
    if plan is None:
        _refuse_in_capture(dev, s, "planning a W4A16 GEMM")
        plan = _native.W4a16Plan(dev, shapes, bf16, bf16_act)
        with _lock:
            _plans[key] = plan
            while len(_plans) > MAX_PLANS:
                _plans.popitem(last=False)
    if plan.run(s, flat, alphas):
        # The graph keeps reading the plan's tables: never reused for other tensors or freed.
        _captured_plan(key, plan)
        with _lock:
            if _plans.get(key) is plan:
                del _plans[key]
    return outs


__all__ = ["grouped_gemm", "prepack"]
