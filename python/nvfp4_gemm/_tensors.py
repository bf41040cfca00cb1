"""Reading tensors without importing torch: what a call needs from each argument (device address,
shape, strides, dtype, device), and the checks every public function makes before a launch.

Two kinds of objects are read:

- torch tensors (duck-typed: ``data_ptr()``, ``shape``, ``stride()``, ``dtype``, ``device``);
- objects with ``__cuda_array_interface__`` (CuPy, Numba, ...), taken to be on the current device.

NumPy arrays and CPU tensors are rejected with a ``TypeError`` naming the argument.
"""

import functools
import sys

# dtype names as this package spells them (torch's without the "torch." prefix).
_TYPESTR = {
    "|u1": "uint8",
    "<u1": "uint8",
    "|i1": "int8",
    "<f2": "float16",
    "<f4": "float32",
    "<i4": "int32",
    "<u4": "uint32",
    "<i8": "int64",
}
_ITEMSIZE = {
    "uint8": 1,
    "int8": 1,
    "float4_e2m1fn_x2": 1,
    "float8_e4m3fn": 1,
    "float16": 2,
    "bfloat16": 2,
    "float32": 4,
    "int32": 4,
    "uint32": 4,
    "int64": 8,
}

VALUES = ("uint8", "float4_e2m1fn_x2")  # packed e2m1, two per byte
SCALES = ("float8_e4m3fn", "uint8")  # e4m3 block scales
DENSE = ("float16", "bfloat16")
SIZES = ("int32", "uint32")

ALIGN = 16  # bytes: every buffer the kernels read or write starts on a 16-byte boundary


class Tensor:
    """What the package reads from one tensor argument."""

    __slots__ = ("obj", "name", "ptr", "shape", "strides", "dtype", "itemsize", "device", "is_torch")

    def __init__(self, obj, name, ptr, shape, strides, dtype, device, is_torch):
        self.obj = obj
        self.name = name  # for messages: "group 2: `a`" or "`x`"
        self.ptr = ptr
        self.shape = shape
        self.strides = strides  # in elements
        self.dtype = dtype
        self.itemsize = _ITEMSIZE.get(dtype, 0)
        self.device = device  # CUDA device ordinal, or None for the current device
        self.is_torch = is_torch

    @property
    def numel(self):
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self):
        return self.numel * self.itemsize

    def error(self, text, kind=ValueError):
        return kind(f"{self.name}: {text}")

    def contiguous(self):
        """Row-major without gaps (size-1 dimensions may have any stride)."""
        want = 1
        for d, s in zip(reversed(self.shape), reversed(self.strides)):
            if d != 1 and s != want:
                return False
            want *= d
        return True

    def require_dtype(self, allowed):
        if self.dtype not in allowed:
            raise self.error(f"dtype {self.dtype}; expected {' or '.join(allowed)}", TypeError)

    def require_contiguous(self):
        if not self.contiguous():
            raise self.error(
                f"is not contiguous (shape {list(self.shape)}, strides {list(self.strides)}); "
                "call .contiguous() first"
            )

    def require_aligned(self):
        if self.numel and self.ptr % ALIGN:
            raise self.error(f"address {self.ptr:#x} is not {ALIGN}-byte aligned")

    def buffer(self):
        """(address, length in elements) for the native layer."""
        return self.ptr, self.numel


def describe(obj, name):
    """Reads a tensor argument; ``TypeError`` for anything that is not a CUDA tensor."""
    if obj is None:
        raise TypeError(f"{name}: is None; a CUDA tensor is needed")
    if hasattr(obj, "data_ptr") and hasattr(obj, "stride") and hasattr(obj, "device"):
        dev = obj.device
        if getattr(dev, "type", None) != "cuda":
            raise TypeError(f"{name}: is on {dev}; a CUDA tensor is needed")
        dtype = str(obj.dtype)
        if dtype.startswith("torch."):
            dtype = dtype[6:]
        return Tensor(obj, name, obj.data_ptr(), tuple(obj.shape), tuple(obj.stride()), dtype, dev.index, True)
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is not None:
        shape = tuple(cai["shape"])
        typestr = cai["typestr"]
        dtype = _TYPESTR.get(typestr)
        if dtype is None:
            raise TypeError(f"{name}: typestr {typestr!r} is not a dtype this package reads")
        item = _ITEMSIZE[dtype]
        strides = cai.get("strides")
        if strides is None:
            strides, acc = [], 1
            for d in reversed(shape):
                strides.append(acc)
                acc *= d
            strides = tuple(reversed(strides))
        else:
            if any(s % item for s in strides):
                raise TypeError(f"{name}: strides {strides} are not multiples of the element size {item}")
            strides = tuple(s // item for s in strides)
        return Tensor(obj, name, int(cai["data"][0]), shape, strides, dtype, None, False)
    if hasattr(obj, "__array_interface__") or hasattr(obj, "__array__"):
        raise TypeError(f"{name}: is a CPU array ({type(obj).__name__}); a CUDA tensor is needed")
    raise TypeError(f"{name}: {type(obj).__name__} is not a tensor; a CUDA tensor is needed")


def same_device(tensors, device=None):
    """The one CUDA ordinal of ``tensors`` (``device`` if given); ``ValueError`` naming the first
    tensor on another GPU. Objects without a device (CUDA array interface) count as the current
    device."""
    for t in tensors:
        if t.device is None:
            continue
        if device is None:
            device = t.device
        elif t.device != device:
            raise t.error(f"is on cuda:{t.device} but the call runs on cuda:{device}")
    if device is None:
        device = current_device()
    return device


def torch_module():
    """torch if it was imported (a torch tensor was seen), else None: never imports it."""
    return sys.modules.get("torch")


def current_device():
    torch = torch_module()
    if torch is None:
        return 0
    return torch.cuda.current_device()


def current_stream(device):
    """The current stream of ``device`` as a ``CUstream`` integer (0: the legacy default stream)."""
    torch = torch_module()
    if torch is None:
        return 0
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw(device)
    return torch.cuda.current_stream(device).cuda_stream


def stream_getter(device):
    """A function of no arguments returning ``current_stream(device)``, with torch's lookups done
    once (for calls that only launch)."""
    torch = torch_module()
    if torch is None:
        return lambda: 0
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return functools.partial(raw, device)
    return lambda: torch.cuda.current_stream(device).cuda_stream


def stream_handle(stream, device):
    """``stream`` as a ``CUstream`` integer: None (the current stream), an int, or an object
    with ``cuda_stream`` (``torch.cuda.Stream``)."""
    if stream is None:
        return current_stream(device)
    if isinstance(stream, int):
        return stream
    handle = getattr(stream, "cuda_stream", None)
    if handle is None:
        raise TypeError(f"stream: {type(stream).__name__} is not a stream (an int or an object with .cuda_stream)")
    return int(handle)


def is_tensor(obj):
    """Whether ``obj`` is a tensor this package reads (torch-like or CUDA array interface)."""
    return hasattr(obj, "data_ptr") or hasattr(obj, "__cuda_array_interface__")


def gemm_alphas(alpha, groups, name="alpha"):
    """A grouped GEMM's ``alpha``: ``(floats, None)`` for None, one number or one per group
    (:func:`finite_alphas`); ``([], tensor)`` for a CUDA float32 tensor ``[groups]``, contiguous
    and 4-byte aligned, whose values the GEMM reads on the device when it runs."""
    if not is_tensor(alpha):
        return finite_alphas(alpha, groups, name), None
    t = describe(alpha, f"`{name}`")
    t.require_dtype(("float32",))
    if t.shape != (groups,):
        raise t.error(f"shape {list(t.shape)}; expected [{groups}] (one float32 per group)")
    t.require_contiguous()
    if t.ptr % 4:
        raise t.error(f"address {t.ptr:#x} is not 4-byte aligned")
    return [], t


def finite_alphas(alpha, groups, name="alpha"):
    """``alpha`` (None, one number, or one per group) as a list of ``groups`` floats;
    ``ValueError`` for a wrong count or a value that is not finite."""
    if alpha is None:
        return [1.0] * groups
    if is_tensor(alpha):
        raise TypeError(
            f"{name}: a device tensor is not supported here: the MoE layer's alphas are uploaded "
            "with its weights, so pass Python floats (a list, one per expert); grouped_gemm, "
            "prepare and grouped_gemm_stacked take a device tensor"
        )
    if isinstance(alpha, (int, float)):
        values = [float(alpha)] * groups
    else:
        values = [float(a) for a in alpha]
        if len(values) != groups:
            raise ValueError(f"{name}: {len(values)} values for {groups} groups")
    for g, a in enumerate(values):
        if a != a or a in (float("inf"), float("-inf")):
            raise ValueError(f"group {g}: `{name}`: {a} is not finite")
    return values


def blocked_bytes(rows, k):
    """Bytes of ``rows × k/16`` scales in the 128x4 blocked layout: rows padded to 128, scale
    columns to 4."""
    return -(-rows // 128) * -(-k // 64) * 512


def dtype_name(dtype):
    """A torch dtype (or its name) as this package spells it."""
    name = str(dtype)
    return name[6:] if name.startswith("torch.") else name
