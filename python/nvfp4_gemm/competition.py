"""``custom_kernel`` for the GPU MODE ``nvfp4_group_gemm`` task: its input exactly, this library's
kernels, and a cache so that a repeated call on the same tensors costs only the launch.

The task's input (its ``reference.py``): ``data = (abc_tensors, sfasfb_tensors,
sfasfb_reordered_tensors, problem_sizes)`` with, per group, ``a [m, k/2, 1]`` and
``b [n, k/2, 1]`` (``float4_e2m1fn_x2``), ``c [m, n, 1]`` (fp16), plain scales ``sfa [m, k/16, 1]``
and ``sfb [n, k/16, 1]`` (``float8_e4m3fn``), the same scales in the 128x4 blocked layout as
permuted ``(32, 4, rest_m, 4, rest_k, 1)`` views, and ``problem_sizes`` ``[(m, n, k, 1), ...]``.
It returns the list of ``c``, filled. The blocked views are read in place (no copy); the plain
scales are not used.
"""

import collections
import operator

from ._core import PreparedGemm, prepare
from ._tensors import stream_getter

MAX_ENTRIES = 32
# id(data) -> entry, most recently used last. An entry holds `data` itself, so the id cannot be
# reused while it is cached.
_entries = collections.OrderedDict()


class _Entry:
    __slots__ = ("data", "abc", "sfr", "cs", "c_ptrs", "ptr_of", "outs", "call", "ordinal", "stream")


def _check_sizes(data):
    if not isinstance(data, (tuple, list)) or len(data) != 4:
        raise TypeError("data: expected (abc_tensors, sfasfb_tensors, sfasfb_reordered_tensors, problem_sizes)")
    abc, _, sfr, sizes = data
    for name, v in (("abc_tensors", abc), ("sfasfb_reordered_tensors", sfr), ("problem_sizes", sizes)):
        if not isinstance(v, (list, tuple)):
            raise TypeError(f"{name}: {type(v).__name__}; expected a list with one entry per group")
    groups = len(abc)
    for name, v in (("sfasfb_reordered_tensors", sfr), ("problem_sizes", sizes)):
        if len(v) != groups:
            raise ValueError(f"{name}: {len(v)} entries but abc_tensors has {groups} groups")
    for g in range(groups):
        for name, v, n in (("abc_tensors", abc[g], 3), ("sfasfb_reordered_tensors", sfr[g], 2), ("problem_sizes", sizes[g], 4)):
            if not isinstance(v, (list, tuple)) or len(v) != n:
                raise TypeError(f"group {g}: `{name}`: expected a tuple of {n}")
    return groups


def _prepare(data):
    groups = _check_sizes(data)
    abc, _, sfr, sizes = data
    for g in range(groups):
        m, n, k, l = sizes[g]
        if l != 1:
            raise ValueError(f"group {g}: `problem_sizes`: l = {l}; only l = 1 is supported")
        a, b, c = abc[g]
        for name, t, want in (("a", a, (m, k // 2, 1)), ("b", b, (n, k // 2, 1)), ("c", c, (m, n, 1))):
            if tuple(t.shape) != want:
                raise ValueError(f"group {g}: `{name}`: shape {list(t.shape)} but problem_sizes gives (m, n, k) = {(m, n, k)}")
    call = prepare(
        [t[0] for t in abc],
        [t[1] for t in abc],
        [t[0] for t in sfr],
        [t[1] for t in sfr],
        out=[t[2] for t in abc],
    )
    e = _Entry()
    e.data = data
    e.abc = tuple(abc)
    e.sfr = tuple(sfr)
    e.cs = tuple(t[2] for t in abc)
    e.c_ptrs = tuple(c.data_ptr() for c in e.cs)
    # The tensors' own (unbound) `data_ptr`, so that the repeated call's check maps it in C.
    e.ptr_of = type(e.cs[0]).data_ptr if e.cs else None
    e.outs = list(e.cs)
    e.call = call
    e.ordinal = call._ordinal
    e.stream = stream_getter(e.ordinal)
    return e


def _unchanged(e, data):
    """The same lists holding the same tuples, and every C still at its address."""
    abc, sfr = data[0], data[2]
    return (
        len(abc) == len(e.abc)
        and len(sfr) == len(e.sfr)
        and all(map(operator.is_, abc, e.abc))
        and all(map(operator.is_, sfr, e.sfr))
        and tuple(map(e.ptr_of, e.cs)) == e.c_ptrs
    )


def custom_kernel(data):
    """The GPU MODE ``nvfp4_group_gemm`` entry: fills every group's ``c`` with ``a · bᵀ`` (block
    scales from the reordered views, alpha 1) on the current stream and returns the list of
    ``c``. The first call with a ``data`` checks it and plans (a plan of its own, its tables
    bound to these tensors); later calls with the same ``data`` (the same lists of the same
    tensors, each ``c`` at the same address) only launch. At most ``MAX_ENTRIES`` inputs are
    cached (least recently used dropped)."""
    e = _entries.get(id(data))
    if e is not None and e.data is data and _unchanged(e, data):
        _entries.move_to_end(id(data))
        e.call._plan.launch(e.stream())
        return list(e.outs)
    e = _prepare(data)
    _entries[id(data)] = e
    _entries.move_to_end(id(data))
    while len(_entries) > MAX_ENTRIES:
        _entries.popitem(last=False)
    e.call()
    return list(e.outs)


def clear():
    """Drops the cached inputs and their plans."""
    _entries.clear()


__all__ = ["custom_kernel", "clear", "PreparedGemm"]
