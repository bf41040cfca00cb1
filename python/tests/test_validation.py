"""Argument checks, on the CPU (numpy and fake device tensors; no GPU, no torch).

Every call here must fail before it reaches the device: `no_device` replaces the package's
device lookup with one that fails the test, so even on a GPU machine nothing is launched on the
fake addresses these tensors carry.
"""

import numpy as np
import pytest

import nvfp4_gemm
from nvfp4_gemm import _core, _native, moe, w4a16
from nvfp4_gemm.layout import blocked_view_strides

BASE = 0x7F00_0000_0000


class Reached(Exception):
    """The call got past every check (the device lookup was reached)."""


@pytest.fixture(autouse=True)
def no_device(monkeypatch):
    def fail(ordinal=None):
        raise Reached(ordinal)

    monkeypatch.setattr(_core, "device", fail)
    monkeypatch.setattr(moe, "device", fail)
    monkeypatch.setattr(w4a16, "device", fail)


_next = [BASE]


def addr(nbytes, misalign=0):
    a = _next[0]
    _next[0] += (nbytes + 255) // 256 * 256 + 256
    return a + misalign


class Dev:
    def __init__(self, index, type_="cuda"):
        self.type, self.index = type_, index

    def __str__(self):
        return f"{self.type}:{self.index}"


class FakeTorch:
    """Duck-typed like a torch tensor on a CUDA device (never dereferenced)."""

    _item = {"uint8": 1, "float4_e2m1fn_x2": 1, "float8_e4m3fn": 1, "float16": 2, "bfloat16": 2, "int32": 4, "float32": 4}

    def __init__(self, shape, dtype, device=0, strides=None, ptr=None, type_="cuda"):
        self.shape = tuple(shape)
        self.dtype = "torch." + dtype
        self.device = Dev(device, type_)
        if strides is None:
            strides, acc = [], 1
            for d in reversed(self.shape):
                strides.append(acc)
                acc *= d
            strides = tuple(reversed(strides))
        self._strides = tuple(strides)
        n = int(np.prod(self.shape)) * self._item[dtype]
        self._ptr = addr(n) if ptr is None else ptr

    def data_ptr(self):
        return self._ptr

    def stride(self):
        return self._strides


class Cai:
    """A __cuda_array_interface__ object (CuPy-like)."""

    def __init__(self, shape, typestr="|u1", strides=None, ptr=None):
        n = int(np.prod(shape)) * int(typestr[-1])
        self.__cuda_array_interface__ = {
            "shape": tuple(shape),
            "typestr": typestr,
            "data": (addr(n) if ptr is None else ptr, False),
            "strides": strides,
            "version": 3,
        }


def group(m, n, k, with_out=True, **over):
    t = {
        "a": FakeTorch((m, k // 2), "uint8"),
        "b": FakeTorch((n, k // 2), "float4_e2m1fn_x2"),
        "a_scales": FakeTorch((nvfp4_gemm.blocked_bytes(m, k),), "float8_e4m3fn"),
        "b_scales": FakeTorch((nvfp4_gemm.blocked_bytes(n, k),), "uint8"),
        "out": FakeTorch((m, n), "float16") if with_out else None,
    }
    t.update(over)
    return t


def call(groups, **kw):
    lists = {name: [g[name] for g in groups] for name in ("a", "b", "a_scales", "b_scales")}
    out = [g["out"] for g in groups] if groups and groups[0]["out"] is not None else None
    return nvfp4_gemm.grouped_gemm(lists["a"], lists["b"], lists["a_scales"], lists["b_scales"], out=out, **kw)


def shapes3():
    return [(96, 128, 256), (0, 256, 512), (130, 136, 64)]


def test_import_needs_no_torch():
    import subprocess
    import sys

    code = "import sys, nvfp4_gemm; assert 'torch' not in sys.modules, 'torch was imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_good_arguments_reach_the_device():
    with pytest.raises(Reached):
        call([group(*s) for s in shapes3()])
    # The task's permuted view of the blocked scales, with a trailing 1, and 3-D operands.
    m, n, k = 80, 384, 256
    rm, rk = 1, -(-k // 64)
    view = FakeTorch((32, 4, rm, 4, rk, 1), "float8_e4m3fn", strides=blocked_view_strides(m, k) + (512 * rm * rk,))
    g = group(m, n, k, a=FakeTorch((m, k // 2, 1), "float4_e2m1fn_x2"), a_scales=view, out=FakeTorch((m, n, 1), "float16"))
    with pytest.raises(Reached):
        call([g])
    # CUDA array interface objects.
    with pytest.raises(Reached):
        nvfp4_gemm.grouped_gemm(
            [Cai((64, 128))], [Cai((128, 128))], [Cai((2048,))], [Cai((2048,))], out=[Cai((64, 128), "<f2")]
        )


@pytest.mark.parametrize(
    "case, over, kind, text",
    [
        ("dtype of a", {"a": FakeTorch((96, 128), "float16")}, TypeError, "group 1: `a`: dtype float16"),
        ("dtype of scales", {"b_scales": FakeTorch((4096,), "int32")}, TypeError, "group 1: `b_scales`: dtype int32"),
        ("cpu tensor", {"b": FakeTorch((128, 128), "uint8", type_="cpu")}, TypeError, "group 1: `b`: is on cpu"),
        ("numpy array", {"a": np.zeros((96, 128), np.uint8)}, TypeError, "group 1: `a`: is a CPU array"),
        ("not a tensor", {"a": [1, 2]}, TypeError, "group 1: `a`: list is not a tensor"),
        ("another gpu", {"b": FakeTorch((128, 128), "uint8", device=1)}, ValueError, "group 1: `b`: is on cuda:1 but the call runs on cuda:0"),
        ("k not multiple of 64", {"a": FakeTorch((96, 48), "uint8"), "b": FakeTorch((128, 48), "uint8")}, ValueError, "group 1: `a`: K = 2·48 = 96 is not a positive multiple of 64"),
        ("n not multiple of 8", {"b": FakeTorch((100, 128), "uint8")}, ValueError, "group 1: `b`: N = 100 rows is not a multiple of 8"),
        ("k differs", {"b": FakeTorch((128, 64), "uint8")}, ValueError, "group 1: `b`: K = 2·64 = 128 differs from A's K = 256"),
        ("3-D a", {"a": FakeTorch((2, 96, 128), "uint8")}, ValueError, "group 1: `a`: shape [2, 96, 128]"),
        ("strides", {"a": FakeTorch((96, 128), "uint8", strides=(256, 1))}, ValueError, "group 1: `a`: is not contiguous"),
        ("transposed", {"b": FakeTorch((128, 128), "uint8", strides=(1, 128))}, ValueError, "group 1: `b`: is not contiguous"),
        ("alignment", {"a": FakeTorch((96, 128), "uint8", ptr=BASE - 0x10_0000 + 8)}, ValueError, "group 1: `a`: address"),
        ("scale bytes", {"a_scales": FakeTorch((4095,), "uint8")}, ValueError, "group 1: `a_scales`: has 4095 bytes"),
        ("plain scales", {"a_scales": FakeTorch((96, 16), "uint8")}, ValueError, "scale_layout='plain'"),
        ("scale strides", {"a_scales": FakeTorch((32, 4, 1, 4, 4), "uint8", strides=(1, 32, 512, 128, 2048))}, ValueError, "group 1: `a_scales`: shape [32, 4, 1, 4, 4]"),
        ("out shape", {"out": FakeTorch((96, 120), "float16")}, ValueError, "group 1: `out`: shape [96, 120]; expected [96, 128]"),
        ("out dtype", {"out": FakeTorch((96, 128), "bfloat16")}, TypeError, "group 1: `out`: dtype bfloat16; expected float16"),
        ("out strides", {"out": FakeTorch((96, 128), "float16", strides=(1, 96))}, ValueError, "group 1: `out`: is not contiguous"),
        ("none", {"b": None}, TypeError, "group 1: `b`: is None"),
    ],
)
def test_bad_group_arguments_name_group_and_argument(case, over, kind, text):
    groups = [group(64, 128, 256), group(96, 128, 256, **over)]
    with pytest.raises(kind) as e:
        call(groups)
    assert text in str(e.value), (case, str(e.value))


def test_list_lengths_must_agree():
    g = [group(64, 128, 256), group(64, 128, 256)]
    with pytest.raises(ValueError, match="b_scales: 1 tensors but `a` has 2 groups"):
        nvfp4_gemm.grouped_gemm([x["a"] for x in g], [x["b"] for x in g], [x["a_scales"] for x in g], [g[0]["b_scales"]])
    with pytest.raises(ValueError, match="out: 1 tensors"):
        nvfp4_gemm.grouped_gemm(*[[x[n] for x in g] for n in ("a", "b", "a_scales", "b_scales")], out=[g[0]["out"]])
    with pytest.raises(TypeError, match="a: FakeTorch; expected a list"):
        nvfp4_gemm.grouped_gemm(g[0]["a"], [], [], [])


@pytest.mark.parametrize("alpha, text", [([1.0, float("nan")], "group 1: `alpha`: nan is not finite"), ([float("inf"), 1.0], "group 0: `alpha`: inf"), ([1.0], "alpha: 1 values for 2 groups")])
def test_alphas(alpha, text):
    with pytest.raises(ValueError) as e:
        call([group(64, 128, 256), group(64, 128, 256)], alpha=alpha)
    assert text in str(e.value)


def test_device_alphas_reach_the_device():
    two = [group(64, 128, 256), group(0, 128, 256)]
    with pytest.raises(Reached):
        call(two, alpha=FakeTorch((2,), "float32"))
    with pytest.raises(Reached):
        call(two, alpha=Cai((2,), "<f4"))
    with pytest.raises(Reached):
        nvfp4_gemm.grouped_gemm_stacked(**stacked(), alpha=FakeTorch((4,), "float32"))
    with pytest.raises(Reached):
        lists = [[g[n] for g in two] for n in ("a", "b", "a_scales", "b_scales")]
        nvfp4_gemm.prepare(*lists, FakeTorch((2,), "float32"), out=[g["out"] for g in two])


@pytest.mark.parametrize(
    "alpha, kind, text",
    [
        (FakeTorch((2,), "float16"), TypeError, "`alpha`: dtype float16; expected float32"),
        (FakeTorch((2,), "float32", type_="cpu"), TypeError, "`alpha`: is on cpu"),
        (FakeTorch((3,), "float32"), ValueError, "`alpha`: shape [3]; expected [2] (one float32 per group)"),
        (FakeTorch((2, 1), "float32"), ValueError, "`alpha`: shape [2, 1]; expected [2]"),
        (FakeTorch((), "float32"), ValueError, "`alpha`: shape []; expected [2]"),
        (FakeTorch((2,), "float32", strides=(2,)), ValueError, "`alpha`: is not contiguous"),
        (FakeTorch((2,), "float32", ptr=BASE - 0x20_0000 + 2), ValueError, "`alpha`: address"),
        (FakeTorch((2,), "float32", device=1), ValueError, "`alpha`: is on cuda:1 but the call runs on cuda:0"),
    ],
)
def test_bad_device_alphas(alpha, kind, text):
    with pytest.raises(kind) as e:
        call([group(64, 128, 256), group(64, 128, 256)], alpha=alpha)
    assert text in str(e.value), str(e.value)


def test_bad_device_alphas_of_stacked_calls():
    with pytest.raises(ValueError, match=r"`alpha`: shape \[3\]; expected \[4\]"):
        nvfp4_gemm.grouped_gemm_stacked(**stacked(), alpha=FakeTorch((3,), "float32"))
    with pytest.raises(ValueError, match="is on cuda:1"):
        nvfp4_gemm.grouped_gemm_stacked(**stacked(), alpha=FakeTorch((4,), "float32", device=1))


def test_moe_refuses_device_alphas_with_the_reason():
    e, n, k = 8, 256, 512
    w = FakeTorch((e, n, k // 2), "uint8")
    ws = FakeTorch((e, nvfp4_gemm.blocked_bytes(n, k)), "uint8")
    with pytest.raises(TypeError, match="uploaded with its weights"):
        nvfp4_gemm.MoE(w, ws, FakeTorch((e,), "float32"), max_tokens=100)


def test_out_dtype_and_scale_layout_names():
    with pytest.raises(TypeError, match="out_dtype: float32"):
        call([group(64, 128, 256, with_out=False)], out_dtype="float32")
    with pytest.raises(ValueError, match="scale_layout: 'swizzled'"):
        call([group(64, 128, 256)], scale_layout="swizzled")


def test_library_rules_are_checked_without_a_gpu():
    # The library's own problem check (pure Rust, no device): its text, as a ValueError.
    with pytest.raises(ValueError, match=r"group 0: `n`: 100 is not a positive multiple of 8"):
        _native.check_problem([(4, 100, 64)], False)
    with pytest.raises(ValueError, match=r"`groups` is 5000; at most \d+ groups"):
        _native.check_problem([(1, 8, 64)] * 5000, False)
    offsets = _native.check_problem([(96, 128, 256), (0, 256, 512), (130, 136, 64)], True)
    assert offsets[0] == (0, 0, 0, 0, 0)
    # The stacked offsets agree with this package's blocked_bytes.
    total = offsets[-1]
    assert total[1] == sum(nvfp4_gemm.blocked_bytes(m, k) for m, _, k in shapes3())
    assert total[3] == sum(nvfp4_gemm.blocked_bytes(n, k) for _, n, k in shapes3())
    assert total[4] == sum(m * n for m, n, _ in shapes3())


def stacked(groups=4, n=128, k=256, ms=(3, 0, 130, 64), **over):
    t = sum(ms)
    args = {
        "a": FakeTorch((t, k // 2), "uint8"),
        "b": FakeTorch((groups, n, k // 2), "uint8"),
        "a_scales": FakeTorch((sum(nvfp4_gemm.blocked_bytes(m, k) for m in ms),), "uint8"),
        "b_scales": FakeTorch((groups, nvfp4_gemm.blocked_bytes(n, k)), "float8_e4m3fn"),
        "m_sizes": list(ms),
        "out": FakeTorch((t, n), "bfloat16"),
    }
    args.update(over)
    return args


def test_stacked_arguments():
    with pytest.raises(Reached):
        nvfp4_gemm.grouped_gemm_stacked(**stacked())
    cases = [
        ({"m_sizes": [3, 0, 130]}, ValueError, "m_sizes: 3 sizes but `b` has 4 groups"),
        ({"m_sizes": [3, 0, 130, -1]}, ValueError, "group 3: `m_sizes`: -1"),
        ({"a": FakeTorch((190, 128), "uint8")}, ValueError, "`a`: has 190 rows; expected 197"),
        ({"b": FakeTorch((4, 100, 128), "uint8")}, ValueError, "`b`: N = 100"),
        ({"a_scales": FakeTorch((100,), "uint8")}, ValueError, "`a_scales`: has 100 bytes"),
        ({"out": FakeTorch((197, 120), "bfloat16")}, ValueError, "`out`: shape [197, 120]"),
    ]
    for over, kind, text in cases:
        with pytest.raises(kind) as e:
            nvfp4_gemm.grouped_gemm_stacked(**stacked(**over))
        assert text in str(e.value), str(e.value)


def test_quantize_arguments():
    x = FakeTorch((300, 256), "bfloat16")
    v, s = FakeTorch((300, 128), "uint8"), FakeTorch((nvfp4_gemm.blocked_bytes(300, 256),), "uint8")
    with pytest.raises(Reached):
        nvfp4_gemm.quantize(x, 0.5, values=v, scales=s)
    with pytest.raises(TypeError, match="`x`: dtype float32"):
        nvfp4_gemm.quantize(FakeTorch((300, 256), "float32"), values=v, scales=s)
    with pytest.raises(ValueError, match="`x`: K = 100"):
        nvfp4_gemm.quantize(FakeTorch((300, 100), "float16"), values=v, scales=s)
    for g in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="global_scale"):
            nvfp4_gemm.quantize(x, g, values=v, scales=s)
    with pytest.raises(ValueError, match="`values`: has 299 rows"):
        nvfp4_gemm.quantize(x, values=FakeTorch((299, 128), "uint8"), scales=s)
    with pytest.raises(ValueError, match="`scales`: has 16 bytes"):
        nvfp4_gemm.quantize(x, values=v, scales=FakeTorch((16,), "uint8"))
    with pytest.raises(Reached):
        nvfp4_gemm.dequantize(v, s, 2.0, out=FakeTorch((300, 256), "float16"))
    with pytest.raises(ValueError, match="`out`: shape"):
        nvfp4_gemm.dequantize(v, s, out=FakeTorch((300, 255), "float16"))


def test_moe_constructor_arguments():
    e, n, k = 8, 256, 512
    w = FakeTorch((e, n, k // 2), "uint8")
    ws = FakeTorch((e, nvfp4_gemm.blocked_bytes(n, k)), "uint8")
    with pytest.raises(Reached):
        nvfp4_gemm.MoE(w, ws, 0.5, max_tokens=100)
    with pytest.raises(Reached):
        nvfp4_gemm.MoE(w, ws, [1.0] * e, layout="masked", max_rows=16)
    # Groups sharing experts (expert parallelism's [W, E_local] blocks): 3 x 8 groups over 8 experts.
    with pytest.raises(Reached):
        nvfp4_gemm.MoE(w, ws, [1.0] * e, layout="masked", max_rows=16, group_experts=list(range(e)) * 3)
    cases = [
        ((FakeTorch((e, n, 100), "uint8"), ws), {"max_tokens": 4}, ValueError, "`weights`: K = 2·100"),
        ((FakeTorch((e, 100, k // 2), "uint8"), ws), {"max_tokens": 4}, ValueError, "`weights`: N = 100"),
        ((FakeTorch((n, k // 2), "uint8"), ws), {"max_tokens": 4}, ValueError, "`weights`: shape"),
        ((w, FakeTorch((e, 100), "uint8")), {"max_tokens": 4}, ValueError, "`weight_scales`: has 800 bytes"),
        ((w, ws), {}, ValueError, "max_tokens: None"),
        ((w, ws), {"layout": "masked", "max_rows": 0}, ValueError, "max_rows: 0"),
        ((w, ws), {"layout": "ragged", "max_rows": 4}, ValueError, "layout: 'ragged'"),
        ((w, ws, [1.0] * 7), {"max_tokens": 4}, ValueError, "alphas: 7 values for 8 groups"),
        ((w, ws, float("nan")), {"max_tokens": 4}, ValueError, "`alphas`: nan"),
        ((w, ws), {"max_tokens": 4, "input_global_scale": 0.0}, ValueError, "input_global_scale"),
        ((w, ws), {"max_tokens": 4, "out_dtype": "float32"}, TypeError, "out_dtype"),
        ((w, ws), {"max_tokens": 4, "group_experts": [0, 8]}, ValueError, "group_experts: group 1 runs expert 8"),
        ((w, ws), {"max_tokens": 4, "group_experts": [0, -1]}, ValueError, "group_experts: group 1 runs expert -1"),
        ((w, ws), {"max_tokens": 4, "group_experts": []}, ValueError, "group_experts: empty"),
        ((w, ws), {"max_tokens": 4, "group_experts": [0, 1.0]}, TypeError, "group_experts"),
    ]
    for args, kw, kind, text in cases:
        with pytest.raises(kind) as ex:
            nvfp4_gemm.MoE(*args, **kw)
        assert text in str(ex.value), str(ex.value)
    # The library's own bounds (pure): too many groups.
    with pytest.raises(ValueError, match="groups"):
        _native.moe_sizes(100000, 8, 64, False, 4)
    rows, scale_rows, sizes_len, *_ = _native.moe_sizes(e, n, k, False, 100)
    assert (rows, scale_rows, sizes_len) == (100, 128 * (1 + e), e + 1)


def test_custom_kernel_input_checks():
    with pytest.raises(TypeError, match="data: expected"):
        nvfp4_gemm.custom_kernel((1, 2))
    g = group(
        64, 128, 256, a=FakeTorch((64, 128, 1), "float4_e2m1fn_x2"), b=FakeTorch((128, 128, 1), "float4_e2m1fn_x2"),
        out=FakeTorch((64, 128, 1), "float16"),
    )
    abc = [(g["a"], g["b"], g["out"])]
    sfr = [(g["a_scales"], g["b_scales"])]
    with pytest.raises(ValueError, match="problem_sizes: 2 entries"):
        nvfp4_gemm.custom_kernel((abc, None, sfr, [(64, 128, 256, 1)] * 2))
    with pytest.raises(ValueError, match="l = 2"):
        nvfp4_gemm.custom_kernel((abc, None, sfr, [(64, 128, 256, 2)]))
    bad_c = [(g["a"], g["b"], FakeTorch((64, 120, 1), "float16"))]
    with pytest.raises(ValueError, match="group 0: `c`: shape"):
        nvfp4_gemm.custom_kernel((bad_c, None, sfr, [(64, 128, 256, 1)]))
    with pytest.raises(Reached):
        nvfp4_gemm.custom_kernel((abc, None, sfr, [(64, 128, 256, 1)]))


def test_without_a_driver_the_device_error_is_typed(monkeypatch):
    monkeypatch.undo()  # the real device lookup
    if nvfp4_gemm.driver_present():
        pytest.skip("a CUDA driver is present: opening a device would succeed")
    with pytest.raises(nvfp4_gemm.NoDriverError, match="no CUDA driver"):
        nvfp4_gemm.device(0)
    assert issubclass(nvfp4_gemm.NoDriverError, RuntimeError)


# ---- W4A16 ------------------------------------------------------------------------------


def packed_column(q, h, i):
    """The natural column of element ``i`` of word ``h`` of thread ``q`` (docs/w4a16.md §2)."""
    p = 4 * h + i % 4
    return 16 * (p // 2) + 2 * q + 8 * (p % 2) + i // 4


# The decoders of docs/w4a16.md §2: the output fields (m, e0, e1, sign) of the low half, and how
# output word k is made from a prepacked word: as it is, rotated right, or masked and multiplied.
DECODERS = {
    False: ([9, 10, 11, 15], [None, ("rot", 3), ("mul", 0x00330033, (6, 8, 15)), ("mul", 0x01C801C8, (3, 12))]),
    True: ([6, 7, 8, 15], [None, ("rot", 3), ("rot", 6), ("mul", 0x001B001B, (3, 8, 14))]),
}


def source_bit(bf16, i, field):
    """The bit of a prepacked word that holds bit ``field`` of element ``i``'s code."""
    fields, steps = DECODERS[bf16]
    target = fields[field] + 16 * (i // 4)
    step = steps[i % 4]
    if step is None:
        return target
    if step[0] == "rot":
        return (target + step[1]) % 32
    (src,) = [b for b in range(32) if step[1] >> b & 1 and target - b in step[2]]
    return src


@pytest.mark.parametrize("bf16", [False, True], ids=["f16", "bf16"])
def test_prepack_moves_every_code_where_the_kernel_reads_it(bf16):
    rows, k = 130, 192
    rng = np.random.default_rng(7)
    values = rng.integers(0, 256, rows * k // 2, dtype=np.uint8)
    scales = rng.integers(0, 0x7E, nvfp4_gemm.blocked_bytes(rows, k), dtype=np.uint8)
    scales[::5] |= 0x80  # negative scales
    scales[::7] = 0  # zero scales
    pv, ps = _native.prepack_w4a16(values.tobytes(), scales.tobytes(), rows, k, bf16)
    pv, ps = np.frombuffer(pv, dtype=np.uint8), np.frombuffer(ps, dtype=np.uint8)
    assert pv.shape == values.shape and ps.shape == scales.shape

    def at(r, block):
        # The blocked layout (docs/format.md): 128-row tiles of 4 scale columns, 512 bytes each.
        rest_k = -(-k // 64)
        return ((r // 128) * rest_k + block // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + block % 4

    code = lambda buf, r, c: (buf[r * k // 2 + c // 2] >> (4 * (c % 2))) & 15
    for r in range(rows):
        for chunk in range(k // 64):
            for q in range(4):
                for h in range(2):
                    start = r * k // 2 + chunk * 32 + 8 * q + 4 * h
                    word = int.from_bytes(pv[start : start + 4].tobytes(), "little")
                    for i in range(8):
                        got = sum((word >> source_bit(bf16, i, f) & 1) << f for f in range(4))
                        col = chunk * 64 + packed_column(q, h, i)
                        want = code(values, r, col)
                        s = scales[at(r, col // 16)]
                        if bf16 and s & 0x7F == 0:
                            want = 0
                        elif bf16 and s & 0x80:
                            want ^= 8
                        assert got == want, (r, col)
            # The scale words pair rows r and r + 8 (r % 16 < 8) by k-step j: f16 half-word j % 2,
            # bf16 bytes j % 2 (row r) and 2 + j % 2 (row r + 8), of row r + 8 * (j // 2)'s word.
            second = r % 16 // 8
            for j in range(4):
                word_row = r - 8 * second + 8 * (j // 2)
                byte = 2 * (j % 2) + second if not bf16 else j % 2 + 2 * second
                got = ps[at(word_row, 4 * chunk) + byte]
                s = scales[at(r, 4 * chunk + j)]
                if bf16:
                    assert (got == 0) == (s & 0x7F == 0), (r, chunk, j)
                else:
                    assert got == s, (r, chunk, j)
    with pytest.raises(ValueError, match="prepack_w4a16"):
        _native.prepack_w4a16(values.tobytes()[:-1], scales.tobytes(), rows, k, bf16)


def w4a16_group(m, n, k, act="bfloat16", **over):
    t = {
        "x": FakeTorch((m, k), act),
        "b": FakeTorch((n, k // 2), "uint8"),
        "b_scales": FakeTorch((nvfp4_gemm.blocked_bytes(n, k),), "uint8"),
        "out": FakeTorch((m, n), "bfloat16"),
    }
    t.update(over)
    return t


def w4a16_call(groups, **kw):
    lists = {name: [g[name] for g in groups] for name in ("x", "b", "b_scales", "out")}
    return w4a16.grouped_gemm(lists["x"], lists["b"], lists["b_scales"], out=lists["out"], **kw)


def test_w4a16_arguments():
    with pytest.raises(Reached):
        w4a16_call([w4a16_group(*s) for s in shapes3()])
    with pytest.raises(Reached):
        w4a16_call([w4a16_group(*s, act="float16") for s in shapes3()], alpha=[0.5, 1.0, 2.0])
    assert w4a16.grouped_gemm([], [], [], out=[]) == []
    cases = [
        ({"x": FakeTorch((96, 256), "float16")}, TypeError, "group 1: `x`: float16; group 0's activations are bfloat16"),
        ({"x": FakeTorch((96, 256), "float32")}, TypeError, "float32"),
        ({"x": FakeTorch((96, 2, 128), "bfloat16")}, ValueError, "group 1: `x`: shape"),
        ({"b": FakeTorch((128, 64), "uint8")}, ValueError, "group 1: `b`: K = 2·64 = 128 differs"),
        ({"b": FakeTorch((100, 128), "uint8")}, ValueError, "group 1: `b`: N = 100"),
        ({"b_scales": FakeTorch((100,), "uint8")}, ValueError, "group 1: `b_scales`: has 100 bytes"),
        ({"b_scales": FakeTorch((4096,), "float16")}, TypeError, "group 1: `b_scales`: dtype float16"),
        ({"out": FakeTorch((96, 64), "bfloat16")}, ValueError, "group 1: `out`: shape"),
        ({"out": FakeTorch((96, 128), "bfloat16", device=1)}, ValueError, "is on cuda:1"),
        ({"x": FakeTorch((96, 256), "bfloat16", ptr=BASE + 8)}, ValueError, "group 1: `x`: address"),
    ]
    for over, kind, text in cases:
        groups = [w4a16_group(8, 64, 256), w4a16_group(96, 128, 256, **over)]
        with pytest.raises(kind) as ex:
            w4a16_call(groups)
        assert text in str(ex.value), str(ex.value)
    with pytest.raises(ValueError, match="alpha: 2 values for 3 groups"):
        w4a16_call([w4a16_group(*s) for s in shapes3()], alpha=[1.0, 2.0])
    with pytest.raises(ValueError, match="b: 1 tensors but `x` has 2 groups"):
        w4a16.grouped_gemm([FakeTorch((8, 64), "bfloat16")] * 2, [FakeTorch((8, 32), "uint8")], [FakeTorch((512,), "uint8")] * 2)
    with pytest.raises(TypeError, match="activations: float32"):
        w4a16.prepack(FakeTorch((8, 32), "uint8"), FakeTorch((512,), "uint8"), activations="float32")


def test_moe_w4a16_arguments():
    e, n, k = 8, 256, 512
    w = FakeTorch((e, n, k // 2), "uint8")
    ws = FakeTorch((e, nvfp4_gemm.blocked_bytes(n, k)), "uint8")
    with pytest.raises(Reached):
        nvfp4_gemm.MoE(w, ws, 0.5, max_tokens=100, w4a16="bfloat16")
    with pytest.raises(TypeError, match="w4a16: float32"):
        nvfp4_gemm.MoE(w, ws, 0.5, max_tokens=100, w4a16="float32")


def test_moe_block_arguments():
    # The experts as a checkpoint stores them, on the host; every check runs before the device.
    e, i, h = 2, 64, 128
    w13, s13 = np.zeros((e, 2 * i, h // 2), np.uint8), np.zeros((e, 2 * i, h // 16), np.uint8)
    w2, s2 = np.zeros((e, h, i // 2), np.uint8), np.zeros((e, h, i // 16), np.uint8)

    def make(w13=w13, s13=s13, **kw):
        return nvfp4_gemm.MoEBlock(w13, s13, 1.0, w2, s2, 1.0, 1.0, 1.0, top_k=2, max_tokens=8, **kw)

    with pytest.raises(ValueError, match="activation: 'swish'"):
        make(activation="swish")
    with pytest.raises(ValueError, match="dtype: float32"):
        make(dtype="float32")
    with pytest.raises(ValueError, match="scale bytes"):
        make(s13=s13[:, :64])
    # relu2 is not gated: W13 must hold I rows, not 2I.
    with pytest.raises(ValueError, match="scale bytes"):
        make(activation="relu2")
    with pytest.raises(Reached):
        make()
