"""The task's `reference` module with an fp32 reference kernel, for GPUs without FP4 tensor cores.

The runner copies this file into each scratch harness folder as `reference.py` and the task's own
`reference.py`, unchanged, beside it as `reference_upstream.py`. Every name the harnesses import
from `reference` (`generate_input`, `check_implementation`) and every other public name of the
task's module is the task's own object, except two:

- `ref_kernel`: the task's computes each group with `torch._scaled_mm` on FP4 operands, which only
  Blackwell runs. Here each group is dequantized to fp32 instead -- every e2m1 value (two per
  byte, element 2j in the low nibble) times its e4m3 block scale (one per 16 values along K, from
  the plain `sfasfb_tensors`, the scales the task's kernel blocks and passes to `_scaled_mm`) --
  multiplied in fp32 (`A @ B.T`), cast to `c`'s dtype and written into `c`, as the task's kernel
  writes its result into `c`. The returned list is the list of `c`.
- `check_implementation`: rebuilt with the task's own `make_match_reference` around the fp32
  kernel, with the keyword arguments (rtol, atol) read out of the task's `check_implementation`
  closure, so the tolerance is the task's by construction. If that closure is not the expected
  shape, importing this module fails rather than guessing a tolerance.

With the task's inputs (values in +-{0, 0.5, 1, 1.5}, scales in {1, 2}) every product is a
multiple of 1/4 of magnitude at most 9, so every partial sum for K <= 7168 is an integer multiple
of 1/4 below 2^16: fp32 holds each exactly whatever the summation order, and the fp32 result is
the exact product rounded once to fp16 -- what an exact FP4 tensor-core product rounded once
gives. Nibble order cannot change the result either: both nibbles of a byte lie in the same
16-value scale block and pair with the same nibble of the other operand.

`REFERENCE` says which reference is in force; the module prints it once per process on stderr.
"""

import inspect
import sys

import torch

import reference_upstream as _task
from reference_upstream import *  # noqa: F401,F403 -- the task's public names, unchanged

REFERENCE = "fp32 dequantization"

_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
_SF_VEC = 16


def _task_tolerance():
    """The keyword arguments the task gave `make_match_reference` for its check."""
    try:
        free = inspect.getclosurevars(_task.check_implementation).nonlocals
    except TypeError as e:
        raise RuntimeError(f"reference_upstream.check_implementation is not a closure: {e}") from None
    kwargs = free.get("kwargs")
    if free.get("reference") is not _task.ref_kernel or not isinstance(kwargs, dict) or not kwargs:
        raise RuntimeError(
            "reference_upstream.check_implementation is not make_match_reference(ref_kernel, **tolerance): "
            f"closure holds {sorted(free)}; refusing to guess the tolerance"
        )
    unknown = set(kwargs) - {"rtol", "atol"}
    if unknown:
        raise RuntimeError(f"unexpected check arguments {sorted(unknown)} in the task's check_implementation")
    return dict(kwargs)


TOLERANCE = _task_tolerance()


def dequantize_fp32(values, scales, k):
    """`values` [rows, k/2] (float4_e2m1fn_x2 or uint8), `scales` [rows, k/16] (float8_e4m3fn),
    any device -> [rows, k] float32 on `values`' device."""
    rows = values.shape[0]
    if values.shape[-1] * 2 != k or scales.shape[-1] * _SF_VEC != k:
        raise ValueError(
            f"dequantize_fp32: values {list(values.shape)} / scales {list(scales.shape)} do not match K={k}"
        )
    bits = values.view(torch.uint8).to(torch.int64)
    lut = torch.tensor(_E2M1, dtype=torch.float32, device=values.device)
    v = torch.stack((lut[bits & 15], lut[bits >> 4]), dim=-1).reshape(rows, k)
    s = scales.to(device=values.device).to(torch.float32).repeat_interleave(_SF_VEC, dim=1)
    return v * s


def ref_kernel(data):
    """fp32 stand-in for the task's `ref_kernel`: same input, same output (the list of `c`, each
    written in place in its own dtype)."""
    abc_tensors, sfasfb_tensors, _, problem_sizes = data
    result = []
    for (a, b, c), (sfa, sfb), (_, _, k, l) in zip(abc_tensors, sfasfb_tensors, problem_sizes):
        for i in range(l):
            a32 = dequantize_fp32(a[:, :, i], sfa[:, :, i], k)
            b32 = dequantize_fp32(b[:, :, i], sfb[:, :, i], k)
            c[:, :, i] = (a32 @ b32.T).to(c.dtype)
        result.append(c)
    return result


check_implementation = _task.make_match_reference(ref_kernel, **TOLERANCE)

print(
    f"reference: {REFERENCE} in place of the task's torch._scaled_mm; check tolerance from the task: "
    + ", ".join(f"{k}={v}" for k, v in sorted(TOLERANCE.items())),
    file=sys.stderr,
    flush=True,
)
