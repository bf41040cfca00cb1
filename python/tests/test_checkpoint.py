"""An MoE layer's experts read from safetensors as stored (nvfp4_gemm.checkpoint, the library's
loader underneath): files, shards, bytes; ModelOpt and compressed-tensors conventions; expert
slices; the w1/w3 policy; errors naming the tensor. Pure Python files, no torch, no GPU."""

import json
import random
import struct

import pytest

from nvfp4_gemm import checkpoint

PREFIX = "model.layers.3.mlp"
H, I = 128, 64
E4M3_ONE = 0x38  # 1.0


def safetensors(tensors):
    """A safetensors file's bytes: name -> (dtype, shape, data)."""
    header, data, offset = {"__metadata__": {"format": "pt"}}, b"", 0
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        data += raw
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


def f32(x):
    return struct.pack("<f", x)


def layer(experts, convention="modelopt", w3_scale=None, names=("w1", "w3", "w2"), seed=0):
    """The tensors of `experts` (global indices) of one layer: expert e's w1/w3 global scale
    0.01·(e+1) (w3: `w3_scale(e)` when given), w2's 0.02·(e+1), input scales 0.1·(e+1) for w1,
    0.1·(e+1)·1.5 for w3, 0.05·(e+1) for w2 — as a dequantization multiplier, stored as its
    inverse under compressed-tensors."""
    rng = random.Random(seed)
    ct = convention == "compressed-tensors"
    suffix = ("weight_packed", "weight_scale", "weight_global_scale", "input_global_scale") if ct else (
        "weight",
        "weight_scale",
        "weight_scale_2",
        "input_scale",
    )

    def stored(x):
        return f32(1.0 / x if ct else x)

    out = {}
    for e in experts:
        for proj, (rows, k) in zip(names, [(I, H), (I, H), (H, I)]):
            base = f"{PREFIX}.experts.{e}.{proj}."
            g = {names[0]: 0.01 * (e + 1), names[1]: (w3_scale(e) if w3_scale else 0.01 * (e + 1)), names[2]: 0.02 * (e + 1)}[proj]
            s = {names[0]: 0.1 * (e + 1), names[1]: 0.15 * (e + 1), names[2]: 0.05 * (e + 1)}[proj]
            out[base + suffix[0]] = ("U8", [rows, k // 2], bytes(rng.randrange(256) for _ in range(rows * k // 2)))
            out[base + suffix[1]] = ("F8_E4M3", [rows, k // 16], bytes([E4M3_ONE]) * (rows * k // 16))
            out[base + suffix[2]] = ("F32", [], stored(g))
            out[base + suffix[3]] = ("F32", [1], stored(s))
    out["model.layers.3.mlp.gate.weight"] = ("F32", [2], f32(1.0) + f32(2.0))
    return out


def close(a, b):
    return all(abs(x - y) <= 1e-6 * abs(y) for x, y in zip(a, b)) and len(a) == len(b)


def test_a_modelopt_file_as_stored(tmp_path):
    path = tmp_path / "model.safetensors"
    path.write_bytes(safetensors(layer(range(3))))
    info = checkpoint.checkpoint_experts(str(path), PREFIX)
    assert (info["first_expert"], info["experts"], info["hidden"], info["intermediate"], info["w13_rows"]) == (0, 3, H, I, 2 * I)
    assert close(info["w13_global_scales"], [0.01, 0.02, 0.03])
    assert close(info["w2_global_scales"], [0.02, 0.04, 0.06])
    # w13's input scale: the larger of w1's and w3's.
    assert close(info["w13_input_scales"], [0.15, 0.30, 0.45])
    assert close(info["w2_input_scales"], [0.05, 0.10, 0.15])
    # The same from bytes, and from a path object.
    assert checkpoint.checkpoint_experts(path.read_bytes(), PREFIX) == info
    assert checkpoint.checkpoint_experts(path, PREFIX) == info


def test_compressed_tensors_scales_are_inverted(tmp_path):
    path = tmp_path / "ct.safetensors"
    path.write_bytes(safetensors(layer(range(2), "compressed-tensors")))
    info = checkpoint.checkpoint_experts(str(path), PREFIX, convention="compressed-tensors")
    assert close(info["w13_global_scales"], [0.01, 0.02])
    assert close(info["w2_input_scales"], [0.05, 0.10])
    # Read with the wrong convention: the names differ, a missing tensor is named.
    with pytest.raises(ValueError, match="weight"):
        checkpoint.checkpoint_experts(str(path), PREFIX)


def test_shards_and_expert_slices(tmp_path):
    tensors = layer(range(4), names=("gate_proj", "up_proj", "down_proj"))
    names = sorted(tensors)
    a = {n: tensors[n] for n in names[::2]}
    b = {n: tensors[n] for n in names[1::2]}
    (tmp_path / "a.safetensors").write_bytes(safetensors(a))
    (tmp_path / "b.safetensors").write_bytes(safetensors(b))
    shards = [str(tmp_path / "a.safetensors"), str(tmp_path / "b.safetensors")]
    info = checkpoint.checkpoint_experts(shards, PREFIX, projections="gate_up_down")
    assert info["experts"] == 4
    # A rank's slice: experts 2 and 3 only (global numbering kept); a file holding only them.
    only = {n: v for n, v in tensors.items() if ".experts.2." in n or ".experts.3." in n}
    (tmp_path / "slice.safetensors").write_bytes(safetensors(only))
    part = checkpoint.checkpoint_experts(str(tmp_path / "slice.safetensors"), PREFIX, experts=range(2, 4), projections=("gate_proj", "up_proj", "down_proj"))
    assert (part["first_expert"], part["experts"]) == (2, 2)
    assert close(part["w2_global_scales"], info["w2_global_scales"][2:])
    # Without `experts` the slice's numbering does not start at 0: refused, naming what was found.
    with pytest.raises(ValueError, match="experts"):
        checkpoint.checkpoint_experts(str(tmp_path / "slice.safetensors"), PREFIX, projections="gate_up_down")
    # A tensor in two shards is refused.
    (tmp_path / "dup.safetensors").write_bytes(safetensors(a))
    with pytest.raises(ValueError, match="shard|more than one|twice|duplicate"):
        checkpoint.checkpoint_experts(shards + [str(tmp_path / "dup.safetensors")], PREFIX, projections="gate_up_down")


def test_w1_and_w3_global_scales_that_differ(tmp_path):
    path = tmp_path / "m.safetensors"
    # w3's scale twice w1's: refused by default, exact when asked (a power of two).
    path.write_bytes(safetensors(layer(range(2), w3_scale=lambda e: 0.02 * (e + 1))))
    with pytest.raises(ValueError, match="differ"):
        checkpoint.checkpoint_experts(str(path), PREFIX)
    info = checkpoint.checkpoint_experts(str(path), PREFIX, reconcile="exact")
    assert close(info["w13_global_scales"], [0.02, 0.04])
    with pytest.raises(ValueError, match="reconcile"):
        checkpoint.checkpoint_experts(str(path), PREFIX, reconcile="maybe")


def test_bad_arguments_are_named(tmp_path):
    path = tmp_path / "m.safetensors"
    path.write_bytes(safetensors(layer(range(1))))
    with pytest.raises(ValueError, match="convention"):
        checkpoint.checkpoint_experts(str(path), PREFIX, convention="gguf")
    with pytest.raises(ValueError, match="projections"):
        checkpoint.checkpoint_experts(str(path), PREFIX, projections="up_gate")
    with pytest.raises(ValueError, match="no tensor named"):
        checkpoint.checkpoint_experts(str(path), "model.layers.4.mlp")
    with pytest.raises(ValueError, match="empty range|at least one"):
        checkpoint.checkpoint_experts(str(path), PREFIX, experts=range(0))
    # An expert the file lacks.
    with pytest.raises(ValueError, match="experts.1"):
        checkpoint.checkpoint_experts(str(path), PREFIX, experts=2)
