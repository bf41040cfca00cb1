"""W4A16 on Hopper (sm_90a): fp16 or bf16 activations used as they are, times NVFP4 weights
prepacked once (``docs/w4a16.md``). No activation quantization and no dequantization pass: one
GEMM launch per call. sm_100a multiplies NVFP4 operands natively (use :func:`grouped_gemm` there):
these calls raise :class:`UnsupportedError` on it.

- :func:`prepack`: the one-time weight step (CUDA tensors on the GPU, on the current stream;
  CPU tensors on the CPU; the same bytes);
- :func:`grouped_gemm`: per-group activations ``[m_g, K]`` times prepacked weights;
- :class:`nvfp4_gemm.MoE` with ``w4a16=`` for a mixture-of-experts layer with the routing on the
  GPU.
"""

from . import _native
from ._core import device  # noqa: F401  (the package's device lookup; tests replace it)
from ._hooks import host_bytes as _host_bytes, torch_module

VALUES = ("uint8", "float4_e2m1fn_x2")
SCALES = ("float8_e4m3fn", "uint8")


def _dtype_name(dtype):
    name = str(dtype)
    return name[6:] if name.startswith("torch.") else name


def _torch_tensor(obj, name, dtypes):
    """The shape of a contiguous torch tensor (on the GPU or the CPU) of one of ``dtypes``."""
    if not all(hasattr(obj, a) for a in ("shape", "dtype", "is_contiguous", "data_ptr")):
        raise TypeError(f"{name}: {type(obj).__name__} is not a torch tensor")
    if _dtype_name(obj.dtype) not in dtypes:
        raise TypeError(f"{name}: dtype {_dtype_name(obj.dtype)}; expected {' or '.join(dtypes)}")
    if not obj.is_contiguous():
        raise ValueError(f"{name}: is not contiguous; call .contiguous() first")
    return tuple(obj.shape)


def _numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def _activations(dtype_name_, what):
    if dtype_name_ not in ("float16", "bfloat16"):
        raise TypeError(f"{what}: {dtype_name_}; expected float16 or bfloat16")
    return dtype_name_ == "bfloat16"


def _on_cuda(t):
    device = getattr(t, "device", None)
    return getattr(device, "type", None) == "cuda"


def prepack_experts(values, scales, experts, n, k, bf16, stream=None):
    """Prepacks ``experts`` matrices of ``n × k`` (``values`` their packed bytes back to back,
    ``scales`` their blocked scales back to back, both tensors) for bf16 or f16 activations:
    returns new ``uint8`` tensors on the same device, ``[experts, n, k/2]`` and flat scales.
    CUDA weights are prepacked on the GPU (on ``stream``, or the current stream), CPU weights on
    the CPU; both give the same bytes."""
    if _on_cuda(values):
        return _native.prepack_w4a16_device(values, scales, experts, n, k, bf16, stream)
    torch = torch_module()
    vb, sb = _host_bytes(values), _host_bytes(scales)
    wbytes, sbytes = n * k // 2, _native.blocked_bytes(n, k)
    out_v, out_s = bytearray(), bytearray()
    for e in range(experts):
        v, s = _native.prepack_w4a16(vb[e * wbytes : (e + 1) * wbytes], sb[e * sbytes : (e + 1) * sbytes], n, k, bf16)
        out_v += v
        out_s += s
    dev = values.device
    pv = torch.frombuffer(out_v, dtype=torch.uint8).reshape(experts, n, k // 2).to(dev)
    ps = torch.frombuffer(out_s, dtype=torch.uint8).to(dev)
    return pv, ps


def prepack(values, scales, activations="bfloat16", *, stream=None):
    """Prepacks NVFP4 weights for W4A16 with ``activations`` (``"bfloat16"``/``"float16"`` or a
    torch dtype): the K permutation of the kernels' fragments moved into the weights, and for bf16
    each block's scale sign folded into its codes and the scales re-encoded (``docs/w4a16.md``
    §2). Run once per weight tensor.

    - ``values``: ``[N, K/2]`` or ``[E, N, K/2]`` packed e2m1 (``uint8`` or
      ``float4_e2m1fn_x2``), contiguous, on the GPU or the CPU;
    - ``scales``: the 128x4 blocked e4m3 scales, ``blocked_bytes(N, K)`` bytes per matrix, back to
      back (any contiguous shape), on the same device.

    CUDA tensors are prepacked on the GPU (sm_90a; one kernel, on ``stream`` or the current
    stream, no host synchronization; :class:`UnsupportedError` on sm_100a), CPU tensors on the
    CPU; both give the same bytes. Returns ``(values, scales)``: new ``uint8`` tensors of the same
    sizes on ``values``' device. Weights prepacked for one activation type give wrong results
    with the other.
    """
    bf16 = _activations(_dtype_name(activations), "activations")
    shape = _torch_tensor(values, "`values`", VALUES)
    if len(shape) not in (2, 3):
        raise ValueError(f"`values`: shape {list(shape)}; expected [N, K/2] or [E, N, K/2]")
    experts = shape[0] if len(shape) == 3 else 1
    n, k = shape[-2], 2 * shape[-1]
    want = experts * _native.blocked_bytes(n, k)
    if _numel(_torch_tensor(scales, "`scales`", SCALES)) != want:
        raise ValueError(f"`scales`: has {scales.numel()} bytes; {experts} matrices of N={n}, K={k} need {want} (blocked)")
    pv, ps = prepack_experts(values, scales, experts, n, k, bf16, stream)
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
    activation types) in the package's one cache. Returns the outputs.
    """
    return list(_native.w4a16_grouped_gemm(x, b, b_scales, alpha, out, out_dtype, stream))


__all__ = ["grouped_gemm", "prepack"]
