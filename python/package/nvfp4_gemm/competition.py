"""``custom_kernel`` for the GPU MODE ``nvfp4_group_gemm`` task: its input exactly, this library's
kernels, and the package's plan cache, so that any input of shapes already seen costs the launch
and the reading of its tensors.

The task's input (its ``reference.py``): ``data = (abc_tensors, sfasfb_tensors,
sfasfb_reordered_tensors, problem_sizes)`` with, per group, ``a [m, k/2, 1]`` and
``b [n, k/2, 1]`` (``float4_e2m1fn_x2``), ``c [m, n, 1]`` (fp16), plain scales ``sfa [m, k/16, 1]``
and ``sfb [n, k/16, 1]`` (``float8_e4m3fn``), the same scales in the 128x4 blocked layout as
permuted ``(32, 4, rest_m, 4, rest_k, 1)`` views, and ``problem_sizes`` ``[(m, n, k, 1), ...]``.
It returns the list of ``c``, filled. The blocked views are read in place (no copy); the plain
scales are not used.
"""

from . import _native
from ._core import PreparedGemm


def custom_kernel(data):
    """The GPU MODE ``nvfp4_group_gemm`` entry: fills every group's ``c`` with ``a · bᵀ`` (block
    scales from the reordered views, alpha 1) on the current stream and returns the list of
    ``c``. Every call reads and checks ``data``'s tensors; the plan is the one cached for their
    shapes (made at the first call of those shapes), whatever tensors ``data`` holds."""
    return _native.custom_kernel(data)


def clear():
    """Drops the cached plans (:func:`nvfp4_gemm.clear_cache`)."""
    _native.clear_cache()


__all__ = ["custom_kernel", "clear", "PreparedGemm"]
