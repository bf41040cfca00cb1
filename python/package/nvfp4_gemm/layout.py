"""The 128x4 blocked scale layout: reading it from the tensors callers hold, and converting the
plain ``[rows, K/16]`` layout to it (and back) on the GPU.

Blocked layout (what the kernels read; cuBLAS's and the GPU MODE task's): rows padded to a
multiple of 128, scale columns (K/16) to a multiple of 4 (docs/format.md; its size is
:func:`blocked_bytes`). The GPU MODE task hands the same bytes as a permuted view of logical shape
``(32, 4, rest_m, 4, rest_k, 1)`` (strides :func:`blocked_view_strides`); the calls accept both as
they are (no copy). The conversions here are torch operations on the GPU.
"""

from ._hooks import torch_module
from ._native import blocked_bytes, blocked_view_strides  # noqa: F401  (the library's formulas)


def _torch():
    torch = torch_module()
    if torch is None:
        raise TypeError("converting scale layouts needs torch tensors")
    return torch


def to_blocked(plain, rows=None):
    """Plain scales ``[rows, K/16]`` (``float8_e4m3fn`` or ``uint8``, a torch tensor on any device)
    → the 128x4 blocked layout as a flat ``uint8`` tensor on the same device (padding zero).
    One pad, one permuted copy; allocates."""
    torch = _torch()
    if plain.dim() != 2:
        raise ValueError(f"plain scales: shape {list(plain.shape)}; expected [rows, K/16]")
    rows = plain.shape[0] if rows is None else rows
    cols = plain.shape[1]
    rest_m, rest_k = -(-rows // 128), -(-cols // 4)
    src = plain.contiguous().view(torch.uint8)
    padded = torch.zeros((rest_m * 128, rest_k * 4), dtype=torch.uint8, device=plain.device)
    padded[: src.shape[0], :cols] = src
    # (mm, mm4, mm32, kk, kk4) -> (mm, kk, mm32, mm4, kk4): the byte order of the blocked layout.
    return padded.view(rest_m, 4, 32, rest_k, 4).permute(0, 3, 2, 1, 4).contiguous().view(-1)


def from_blocked(blocked, rows, k):
    """Blocked scales of a ``rows × k`` operand (a torch tensor holding them, contiguous) → plain
    ``[rows, K/16]`` ``uint8``. Allocates."""
    torch = _torch()
    rest_m, rest_k = -(-rows // 128), -(-k // 64)
    b = blocked.contiguous().view(torch.uint8).reshape(-1)
    if b.numel() != rest_m * rest_k * 512:
        raise ValueError(f"blocked scales: {b.numel()} bytes; {rows} rows × K={k} need {rest_m * rest_k * 512}")
    plain = b.view(rest_m, rest_k, 32, 4, 4).permute(0, 3, 2, 1, 4).reshape(rest_m * 128, rest_k * 4)
    return plain[:rows, : k // 16].contiguous()


def vllm_scales_to_moe(scales, expert_offsets, blockscale_offsets, k, max_tokens, out=None):
    """Activation scales as vLLM's NVFP4 MoE path lays them out — expert ``e``'s 128x4 blocked
    scales from row ``blockscale_offsets[e]`` on, where ``blockscale_offsets`` are the prefix sums
    of ``round_up(m_e, 128)`` — into this library's contiguous MoE layout (expert ``e`` from row
    ``128 * (ceil(expert_offsets[e] / 128) + e)``, ``MoE.scale_rows`` rows in all).

    Both offset tensors are the device ``[E + 1]`` int32/int64 tensors the router produced; the
    copy runs on the GPU with torch operations (no host synchronization: capturable), one
    128-row block (``128 * ceil(K/64) * 4`` bytes) at a time. Blocks of no expert are zero.
    Returns ``out`` (a ``uint8`` tensor of ``scale_rows * ceil(K/64) * 4`` bytes) or a new one.
    """
    torch = _torch()
    experts = expert_offsets.numel() - 1
    block = 128 * -(-k // 64) * 4
    dst_blocks = -(-max_tokens // 128) + experts
    device = scales.device
    src = scales.contiguous().view(torch.uint8).reshape(-1, block)
    off = expert_offsets.to(torch.int64)
    bso = blockscale_offsets.to(torch.int64)
    nblk = (off[1:] - off[:-1]).clamp(min=0).add(127).div(128, rounding_mode="floor")
    dst_start = off[:-1].add(127).div(128, rounding_mode="floor") + torch.arange(experts, device=device)
    src_start = bso[:-1].div(128, rounding_mode="floor")
    d = torch.arange(dst_blocks, device=device)
    g = (torch.searchsorted(dst_start, d, right=True) - 1).clamp(min=0)
    rel = d - dst_start[g]
    valid = (d >= dst_start[0]) & (rel < nblk[g])
    idx = torch.where(valid, src_start[g] + rel, torch.zeros_like(rel)).clamp(max=src.shape[0] - 1)
    blocks = torch.where(valid[:, None], src[idx], torch.zeros((), dtype=torch.uint8, device=device))
    if out is None:
        return blocks.reshape(-1)
    out.view(torch.uint8).reshape(-1, block).copy_(blocks)
    return out
