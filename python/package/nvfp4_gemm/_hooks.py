"""What the native module asks of this package (registered at import): the device handle of an
ordinal, torch's current device and stream, and torch allocations and conversions. The native
module checks every argument; nothing here does."""

import ctypes
import sys

from . import _core


def torch_module():
    """torch if it was imported (a torch tensor was seen), else None: never imports it."""
    return sys.modules.get("torch")


def device(ordinal):
    # Looked up at each call: tests replace the package's device lookup.
    return _core.device(ordinal)


def current_device():
    torch = torch_module()
    return 0 if torch is None else torch.cuda.current_device()


def current_stream(ordinal):
    """The current stream of device ``ordinal`` as a ``CUstream`` integer (0: the legacy default)."""
    torch = torch_module()
    if torch is None:
        return 0
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw(ordinal)
    return torch.cuda.current_stream(ordinal).cuda_stream


def _alloc(like, shape, dtype, ordinal, zeroed):
    torch = torch_module()
    if torch is None or not hasattr(like, "data_ptr") or not hasattr(like, "stride"):
        raise TypeError("out: required when the inputs are not torch tensors (this package allocates with torch)")
    make = torch.zeros if zeroed else torch.empty
    return make(tuple(shape), dtype=getattr(torch, dtype), device=f"cuda:{ordinal}")


def empty(like, shape, dtype, ordinal):
    return _alloc(like, shape, dtype, ordinal, False)


def zeros(like, shape, dtype, ordinal):
    return _alloc(like, shape, dtype, ordinal, True)


def to_blocked(plain, rows):
    from .layout import to_blocked as convert

    return convert(plain.reshape(plain.shape[0], plain.shape[1]), rows)


def experts_to_blocked(plain, experts):
    from .layout import to_blocked as convert

    torch = torch_module()
    return torch.cat([convert(plain[e]) for e in range(experts)])


def host_bytes(obj):
    """The bytes of a contiguous uint8-viewable torch tensor, through a host copy."""
    torch = torch_module()
    t = obj.contiguous().view(torch.uint8).cpu()
    # A ctypes array over the tensor's memory (its length a Py_ssize_t: `ctypes.string_at` takes
    # a C int and refuses tensors of 2 GiB and more, e.g. DeepSeek-V3's stacked W13).
    return bytes((ctypes.c_ubyte * t.numel()).from_address(t.data_ptr()))
