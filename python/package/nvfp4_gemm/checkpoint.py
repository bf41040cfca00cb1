"""An MoE layer's experts from a checkpoint as stored (docs/checkpoints.md).

The library's loader (``nvfp4_format::checkpoint``, in the native module) reads safetensors bytes
in ModelOpt's or compressed-tensors' NVFP4 format and checks every name, dtype, shape and scale;
this module only hands it the layer's tensors: from safetensors files (reading the byte ranges of
the layer's experts, not the whole file) or from a state dict of torch tensors, each source
turned into a small safetensors image of those tensors alone.

- :func:`checkpoint_experts`: what a layer's experts hold (sizes, every scale as a dequantization
  multiplier), without a GPU;
- ``MoEBlock.from_checkpoint`` / ``MoEBlock.from_state_dict`` (:mod:`nvfp4_gemm.block`): the block
  planned from them.
"""

import json
import os
import struct

from . import _native

# torch dtype name -> safetensors dtype, for the dtypes an NVFP4 expert stores.
_SAFETENSORS_DTYPES = {
    "uint8": "U8",
    "float8_e4m3fn": "F8_E4M3",
    "float32": "F32",
    "float4_e2m1fn_x2": "U8",
}

PROJECTIONS = {"w1_w3_w2": ("w1", "w3", "w2"), "gate_up_down": ("gate_proj", "up_proj", "down_proj")}


def _projections(projections):
    if isinstance(projections, str):
        if projections not in PROJECTIONS:
            raise ValueError(f"projections: '{projections}'; expected {', '.join(PROJECTIONS)} or three names")
        return PROJECTIONS[projections]
    names = tuple(str(p) for p in projections)
    if len(names) != 3:
        raise ValueError(f"projections: {projections!r}; expected (gate, up, down) names")
    return names


def _expert_of(name, prefix):
    """The expert index of ``{prefix}.experts.{e}.…`` (None for any other name)."""
    head = prefix + ".experts."
    if not name.startswith(head):
        return None
    index = name[len(head) :].split(".", 1)[0]
    return int(index) if index.isdigit() else None


def _image(tensors):
    """A safetensors image of ``tensors`` (name -> (dtype, shape, bytes)): the 8-byte header
    length, the JSON header padded with spaces to 8 bytes, the data in the header's order."""
    header, parts, offset = {}, [], 0
    for name in sorted(tensors):
        dtype, shape, data = tensors[name]
        header[name] = {"dtype": dtype, "shape": [int(d) for d in shape], "data_offsets": [offset, offset + len(data)]}
        parts.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(parts)


def _header(item):
    """A safetensors source's header (name -> {dtype, shape, data_offsets}) and the offset of its
    data: ``item`` the file's bytes or its path (only the header is read)."""
    if isinstance(item, bytes):
        (length,) = struct.unpack("<Q", item[:8])
        return json.loads(item[8 : 8 + length]), 8 + length
    with open(item, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(length)), 8 + length


def _file_tensors(path, header, base, keep):
    """The tensors of the safetensors file ``path`` (its ``header``, data from ``base``) whose
    names ``keep`` accepts: their byte ranges only."""
    out = {}
    with open(path, "rb") as f:
        for name, info in header.items():
            if name == "__metadata__" or not keep(name):
                continue
            start, end = info["data_offsets"]
            f.seek(base + start)
            out[name] = (info["dtype"], info["shape"], f.read(end - start))
    return out


def _state_dict_tensors(state_dict, keep):
    """The tensors of a state dict whose names ``keep`` accepts, as host bytes."""
    out = {}
    for name, t in state_dict.items():
        if not keep(name):
            continue
        dtype = str(t.dtype).replace("torch.", "")
        if dtype not in _SAFETENSORS_DTYPES:
            raise TypeError(f"{name}: dtype {t.dtype}; an NVFP4 expert stores uint8, float8_e4m3fn and float32")
        import torch

        host = t.detach().to("cpu").contiguous()
        data = host.view(-1).view(torch.uint8).numpy().tobytes() if host.numel() else b""
        out[name] = (_SAFETENSORS_DTYPES[dtype], list(host.shape), data)
    return out


def _experts_range(names, prefix, experts):
    """``experts`` as a range; None: every expert the names hold (they must be 0..E)."""
    if experts is not None:
        r = range(experts) if isinstance(experts, int) else experts
        if not isinstance(r, range) or r.step != 1:
            raise ValueError(f"experts: {experts!r}; expected a count or a range with step 1")
        return r
    found = sorted({e for e in (_expert_of(n, prefix) for n in names) if e is not None})
    if not found:
        raise ValueError(f"no tensor named {prefix}.experts.<e>.… in the checkpoint")
    if found != list(range(len(found))):
        raise ValueError(f"the experts found are {found[:8]}…; pass experts=range(first, end) for a slice")
    return range(len(found))


def _shards(source, prefix, experts):
    """The layer's safetensors images and expert range from ``source``: a path, several paths
    (a sharded checkpoint: each tensor in exactly one), safetensors bytes, or a state dict."""
    if isinstance(source, dict):
        r = _experts_range(source.keys(), prefix, experts)
        keep = lambda n: _expert_of(n, prefix) in r  # noqa: E731
        return [_image(_state_dict_tensors(source, keep))], r
    items = [source] if isinstance(source, (str, bytes, os.PathLike)) else list(source)
    headers = [_header(item) for item in items]
    r = _experts_range([n for header, _ in headers for n in header], prefix, experts)
    keep = lambda n: _expert_of(n, prefix) in r  # noqa: E731
    images = [
        item if isinstance(item, bytes) else _image(_file_tensors(item, header, base, keep))
        for item, (header, base) in zip(items, headers)
    ]
    return images, r


def checkpoint_experts(source, prefix, *, convention="modelopt", experts=None, projections="w1_w3_w2", reconcile="refuse"):
    """What the experts ``experts`` (a count, a ``range``, or None for all) of the MoE layer
    ``prefix`` hold in ``source`` (a safetensors path, several paths, bytes, or a state dict), as
    the block reads them: ``{"first_expert", "experts", "hidden", "intermediate", "w13_rows",
    "w13_global_scales", "w2_global_scales", "w13_input_scales", "w2_input_scales"}``, every
    scale a dequantization multiplier whatever ``convention`` (``"modelopt"`` or
    ``"compressed-tensors"``) stored. ``projections``: ``"w1_w3_w2"``, ``"gate_up_down"`` or three
    names; ``reconcile``: ``"refuse"``, ``"exact"`` or ``"round"`` for w1/w3 global scales that
    differ (docs/checkpoints.md §3). Needs no GPU. Raises ``ValueError`` naming the tensor at
    fault."""
    shards, r = _shards(source, prefix, experts)
    return _native.checkpoint_experts(shards, prefix, convention, r.start, len(r), _projections(projections), reconcile)


__all__ = ["checkpoint_experts", "PROJECTIONS"]
