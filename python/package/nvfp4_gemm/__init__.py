"""nvfp4_gemm: NVFP4 block-scaled grouped GEMM on NVIDIA Hopper (sm_90a) and Blackwell (sm_100a)
for PyTorch users — prebuilt kernels (no JIT, no CUDA toolkit at run time), typed errors.

``C_g = alpha_g · A_g · B_gᵀ`` over groups; A and B NVFP4 (packed e2m1 values, two per byte, with
one e4m3 scale per 16 values in the 128x4 blocked layout), C fp16 or bf16.

- :func:`grouped_gemm` (per-group lists), :func:`grouped_gemm_stacked` (one tensor per operand),
  :func:`prepare` (bound once, then launch only);
- :func:`quantize` / :func:`dequantize`;
- :class:`MoE`: a mixture-of-experts layer's GEMM with the routing on the GPU (CUDA-graph
  capturable), NVFP4 activations or (``w4a16=``) 16-bit ones used as they are;
- :class:`MoEBlock` / :func:`fused_experts`: the whole expert block (routing, gate/up GEMM,
  activation, down GEMM, weighted combine) from a ModelOpt checkpoint's experts, stacked or read
  from safetensors / a state dict (``MoEBlock.from_checkpoint``, ``from_state_dict``;
  :mod:`nvfp4_gemm.checkpoint` reads a layer's experts without a GPU);
- :mod:`nvfp4_gemm.w4a16`: W4A16 on Hopper — fp16/bf16 activations times NVFP4 weights
  prepacked once (:func:`nvfp4_gemm.w4a16.prepack`, :func:`nvfp4_gemm.w4a16.grouped_gemm`);
- :func:`custom_kernel`: the GPU MODE ``nvfp4_group_gemm`` entry point;
- :mod:`nvfp4_gemm.layout`: scale layouts (plain ↔ blocked, vLLM's MoE scales).

Importing needs nothing but this package; torch is used when torch tensors are passed (never
imported here). Calls run on the current torch stream of the tensors' device, in its primary
context, without host synchronization. Every argument is read once and checked by the library's
own rules (the native module) before anything is launched: bad arguments raise
``TypeError``/``ValueError`` naming the group and argument; driver failures raise
:class:`CudaError`. The rules' numbers are the native module's (``_native.K_MULTIPLE``,
``N_MULTIPLE``, ``ALIGN``, ``MAX_GROUPS``, :func:`blocked_bytes`).
"""

from . import _hooks, _native, checkpoint, layout, w4a16
from ._core import PreparedGemm, clear_cache, dequantize, device, grouped_gemm, grouped_gemm_stacked, prepare, quantize
from ._native import CaptureError, CudaError, NoDriverError, UnsupportedError, blocked_bytes
from .block import MoEBlock, fused_experts
from .competition import custom_kernel
from .moe import MoE, offsets_from_counts

_native.set_hooks(_hooks)

__version__ = "0.1.0"


def driver_present():
    """True when the CUDA driver library (libcuda.so.1) can be loaded."""
    return _native.driver_present()


__all__ = [
    "CaptureError",
    "CudaError",
    "MoE",
    "MoEBlock",
    "NoDriverError",
    "PreparedGemm",
    "UnsupportedError",
    "blocked_bytes",
    "clear_cache",
    "custom_kernel",
    "dequantize",
    "device",
    "driver_present",
    "fused_experts",
    "grouped_gemm",
    "grouped_gemm_stacked",
    "layout",
    "offsets_from_counts",
    "prepare",
    "quantize",
    "w4a16",
]
