"""GPU tests (torch + an sm_90a/sm_100a GPU): every function against an fp64 reference computed
here, from the operands' bits (not through the library). Skipped, with the reason, without torch
or a supported GPU; `gpu-check.sh` requires them to run."""

import json
import math
import os
import struct

import pytest


def _unavailable(reason):
    # gpu-check.sh sets NVFP4_REQUIRE_GPU: there a missing GPU is a failure, not a skip.
    if os.environ.get("NVFP4_REQUIRE_GPU"):
        raise RuntimeError(f"NVFP4_REQUIRE_GPU is set but {reason}")
    pytest.skip(reason, allow_module_level=True)


try:
    import torch
except ImportError:
    _unavailable("the GPU tests need torch")
if not torch.cuda.is_available():
    _unavailable("the GPU tests need a CUDA device")

import nvfp4_gemm  # noqa: E402

try:
    DEV = nvfp4_gemm.device(0)
except (nvfp4_gemm.UnsupportedError, nvfp4_gemm.CudaError, nvfp4_gemm.NoDriverError) as e:
    _unavailable(f"no supported GPU: {e}")

from nvfp4_ref import (  # noqa: E402
    CUDA,
    TASK_BENCH,
    TASK_TESTS,
    assert_close,
    blocked_index,
    decode_e4m3,
    dequant,
    exact_activations,
    make_blocked,
    poisoned,
    random_operand,
    reference,
    rest,
    task_input,
    task_reference,
)


# ---- grouped GEMM --------------------------------------------------------------------------

SHAPES = [
    [(0, 128, 256), (7, 8, 64), (130, 136, 192), (1, 256, 512)],
    [(33, 64, 128), (255, 8, 64), (0, 16, 64)],
    [(64, 4096, 7168 // 7 // 64 * 64)],
]


@pytest.mark.parametrize("shapes", SHAPES, ids=["mixed", "odd", "one"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
def test_grouped_gemm_against_fp64(shapes, dtype):
    gen = torch.Generator(device=CUDA).manual_seed(len(shapes))
    a, sa, b, sb, refs, alphas = [], [], [], [], [], []
    for g, (m, n, k) in enumerate(shapes):
        av, asc = random_operand(m, k, gen)
        bv, bsc = random_operand(n, k, gen)
        alpha = 0.5 + g / 4
        a.append(av.view(torch.float4_e2m1fn_x2) if g % 2 else av)
        b.append(bv)
        sa.append(make_blocked(asc, m, k).view(torch.float8_e4m3fn))
        sb.append(make_blocked(bsc, n, k))
        refs.append(reference(av, asc, bv, bsc, m, n, k, alpha))
        alphas.append(alpha)
    out = [poisoned((m, n), dtype) for m, n, _ in shapes]
    got = nvfp4_gemm.grouped_gemm(a, b, sa, sb, alphas, out=out)
    assert got == out
    for g, (o, r) in enumerate(zip(got, refs)):
        assert_close(o, r, dtype, f"group {g}")
    # A new output, and the plain scale layout.
    plain_a = [random_operand(m, k, gen)[1] for m, _, k in shapes]
    sa2 = [make_blocked(p, m, k) for p, (m, _, k) in zip(plain_a, shapes)]
    got_blocked = nvfp4_gemm.grouped_gemm(a, b, sa2, sb, alphas, out_dtype=dtype)
    got_plain = nvfp4_gemm.grouped_gemm(
        a, b, plain_a, [bsc_plain(s, n, k) for s, (_, n, k) in zip(sb, shapes)], alphas, out_dtype=dtype, scale_layout="plain"
    )
    for x, y in zip(got_blocked, got_plain):
        assert x.dtype == dtype and torch.equal(x.view(torch.int16), y.view(torch.int16))


def test_views_and_tensor_subclasses_read_as_torch_describes_them():
    # An output that is a row slice of a larger tensor (its address includes the slice's offset),
    # and weights held as an `nn.Parameter` (a torch.Tensor subclass, read through its attributes).
    gen = torch.Generator(device=CUDA).manual_seed(3)
    m, n, k = 40, 64, 256
    (av, asc), (bv, bsc) = random_operand(m, k, gen), random_operand(n, k, gen)
    big = poisoned((3 * m, n), torch.float16)
    view = big[m : 2 * m]
    weights = torch.nn.Parameter(bv, requires_grad=False)
    got = nvfp4_gemm.grouped_gemm([av], [weights], [make_blocked(asc, m, k)], [make_blocked(bsc, n, k)], out=[view])
    assert got[0] is view
    assert_close(view, reference(av, asc, bv, bsc, m, n, k, 1.0), torch.float16, "the slice")
    assert bool(big[:m].isnan().all()) and bool(big[2 * m :].isnan().all()), "rows outside the slice were written"


def test_tensor_readers_agree_with_torch():
    # Every way the package reads a torch.Tensor (torch's DLPack exchange table when torch has
    # one, to_dlpack, the attributes) gives the address, shape, strides, type and device torch
    # itself reports, on the layouts calls pass: slices with an offset, transposes, broadcasts,
    # the 4- and 8-bit types, empty tensors, the GPU MODE task's permuted scale views.
    from nvfp4_gemm import _native

    base = torch.arange(4 * 96 * 64, device=CUDA, dtype=torch.int32)
    u8 = (base % 251).to(torch.uint8).reshape(4 * 96, 64)
    cases = {
        "f16": torch.zeros(5, 64, device=CUDA, dtype=torch.float16),
        "bf16 row slice": torch.zeros(30, 128, device=CUDA, dtype=torch.bfloat16)[7:19],
        "f32 column slice": torch.zeros(8, 48, device=CUDA)[:, 16:32],
        "transposed": torch.zeros(16, 32, device=CUDA, dtype=torch.float16).t(),
        "broadcast": torch.zeros(1, 64, device=CUDA, dtype=torch.float16).expand(9, 64),
        "uint8 [r, c, 1]": u8[:, :, None],
        "e4m3": u8.view(torch.float8_e4m3fn),
        "e2m1 x2": u8[96:].view(torch.float4_e2m1fn_x2),
        "int64": base[:10].to(torch.int64),
        "int32 0-dim": base[3],
        "empty": torch.empty(0, 32, device=CUDA, dtype=torch.float16),
        "task scale view": u8[:128].reshape(1, 4, 32, 4, 16).permute(2, 1, 0, 3, 4),
    }
    assert _native._tensor_reader() in ("exchange", "to_dlpack")

    def addressing(shape, strides):
        # A dimension of extent 1 addresses nothing with its stride (DLPack producers may
        # normalize it).
        return [(e, s if e != 1 else None) for e, s in zip(shape, strides)]

    for name, t in cases.items():
        want = (t.data_ptr(), addressing(t.shape, t.stride()), t.get_device())
        got = {w: _native._describe_tensor(t, w) for w in ("auto", "attributes", "to_dlpack", "exchange")}
        for way, d in got.items():
            if way == "exchange" and _native._tensor_reader() != "exchange":
                assert d is None, f"{name}: read through an exchange table torch does not have"
                continue
            assert d is not None, f"{name}: {way} did not read it"
            assert (d[0], addressing(d[1], d[2]), d[4]) == want, f"{name}: {way} read {d}, torch says {want}"
            assert d[3] == got["attributes"][3], f"{name}: {way} read the type {d[3]}"
    # A subclass (nn.Parameter) is not read through DLPack (the exchange table is torch.Tensor's).
    p = torch.nn.Parameter(torch.zeros(4, 8, device=CUDA), requires_grad=False)
    assert _native._describe_tensor(p, "exchange") is None and _native._describe_tensor(p, "to_dlpack") is None
    assert _native._describe_tensor(p)[0] == p.data_ptr()
    # The stream a call takes without `stream=` is torch's current one.
    s = torch.cuda.Stream()
    assert _native._current_stream(0) == torch.cuda.current_stream().cuda_stream
    with torch.cuda.stream(s):
        assert _native._current_stream(0) == s.cuda_stream


def bsc_plain(blocked, rows, k):
    return blocked.view(torch.uint8)[blocked_index(rows, k)]


def test_64_groups_and_stacked_equals_lists():
    gen = torch.Generator(device=CUDA).manual_seed(64)
    n, k, groups = 256, 512, 64
    ms = [int(x) for x in torch.randint(0, 40, (groups,), generator=gen, device=CUDA).tolist()]
    ms[3] = 0
    ops = [random_operand(m, k, gen) for m in ms]
    ws = [random_operand(n, k, gen) for _ in range(groups)]
    alphas = [1.0 + (g % 5) / 8 for g in range(groups)]
    a = [v for v, _ in ops]
    sa = [make_blocked(s, m, k) for (_, s), m in zip(ops, ms)]
    b = [v for v, _ in ws]
    sb = [make_blocked(s, n, k) for _, s in ws]
    lists = nvfp4_gemm.grouped_gemm(a, b, sa, sb, alphas, out_dtype=torch.bfloat16)
    for g in range(groups):
        assert_close(lists[g], reference(a[g], ops[g][1], b[g], ws[g][1], ms[g], n, k, alphas[g]), torch.bfloat16, f"group {g}")
    out = poisoned((sum(ms), n), torch.bfloat16)
    stacked = nvfp4_gemm.grouped_gemm_stacked(torch.cat(a), torch.stack(b), torch.cat(sa), torch.stack(sb), ms, alphas, out=out)
    assert torch.equal(stacked.view(torch.int16), torch.cat(lists).view(torch.int16)), "stacked differs from lists"
    # prepare(): bound once, launched twice.
    outs = [poisoned((m, n), torch.bfloat16) for m in ms]
    call = nvfp4_gemm.prepare(a, b, sa, sb, alphas, out=outs)
    for _ in range(2):
        for o in outs:
            o.fill_(float("nan"))
        call()
        assert all(torch.equal(x.view(torch.int16), y.view(torch.int16)) for x, y in zip(outs, lists))


def test_non_default_stream_and_graph_capture():
    gen = torch.Generator(device=CUDA).manual_seed(5)
    shapes = [(40, 128, 256), (96, 64, 128)]
    ops = [(random_operand(m, k, gen), random_operand(n, k, gen)) for m, n, k in shapes]
    a = [x[0][0] for x in ops]
    b = [x[1][0] for x in ops]
    sa = [make_blocked(x[0][1], m, k) for x, (m, _, k) in zip(ops, shapes)]
    sb = [make_blocked(x[1][1], n, k) for x, (_, n, k) in zip(ops, shapes)]
    out = [poisoned((m, n), torch.float16) for m, n, _ in shapes]
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        nvfp4_gemm.grouped_gemm(a, b, sa, sb, out=out)  # warm-up on a side stream (also plans)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    for g, (m, n, k) in enumerate(shapes):
        assert_close(out[g], reference(a[g], ops[g][0][1], b[g], ops[g][1][1], m, n, k), torch.float16, f"stream group {g}")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        nvfp4_gemm.grouped_gemm(a, b, sa, sb, out=out)
    for step in range(3):
        new = [random_operand(m, k, gen) for m, _, k in shapes]
        for g, (v, p) in enumerate(new):
            a[g].copy_(v)
            sa[g].copy_(make_blocked(p, shapes[g][0], shapes[g][2]))
            out[g].fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        for g, (m, n, k) in enumerate(shapes):
            assert_close(out[g], reference(a[g], new[g][1], b[g], ops[g][1][1], m, n, k), torch.float16, f"replay {step} group {g}")
    # A call inside capture with tensors the plan has not seen is refused before anything runs.
    other = [poisoned((m, n), torch.float16) for m, n, _ in shapes]
    g2 = torch.cuda.CUDAGraph()
    with pytest.raises(nvfp4_gemm.CaptureError):
        with torch.cuda.graph(g2):
            nvfp4_gemm.grouped_gemm(a, b, sa, sb, out=other)


def test_capture_with_tensors_the_plan_never_saw():
    # One eager call plans these shapes; the capture then uses other tensors of the same shapes
    # (the plan's tables are per call), and eager calls after it still get right answers.
    gen = torch.Generator(device=CUDA).manual_seed(8)
    shapes = [(24, 64, 128), (130, 136, 192)]

    def operands():
        ops = [(random_operand(m, k, gen), random_operand(n, k, gen)) for m, n, k in shapes]
        a = [x[0][0] for x in ops]
        b = [x[1][0] for x in ops]
        sa = [make_blocked(x[0][1], m, k) for x, (m, _, k) in zip(ops, shapes)]
        sb = [make_blocked(x[1][1], n, k) for x, (_, n, k) in zip(ops, shapes)]
        out = [poisoned((m, n), torch.float16) for m, n, _ in shapes]
        refs = [reference(a[g], ops[g][0][1], b[g], ops[g][1][1], m, n, k) for g, (m, n, k) in enumerate(shapes)]
        return (a, b, sa, sb, out), refs

    first, first_ref = operands()
    nvfp4_gemm.grouped_gemm(*first[:4], out=first[4])
    captured, captured_ref = operands()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        nvfp4_gemm.grouped_gemm(*captured[:4], out=captured[4])
    later, later_ref = operands()
    nvfp4_gemm.grouped_gemm(*later[:4], out=later[4])
    for o in captured[4]:
        o.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    for name, (args, refs) in {"first": (first, first_ref), "captured": (captured, captured_ref), "later": (later, later_ref)}.items():
        for g, o in enumerate(args[4]):
            assert_close(o, refs[g], torch.float16, f"{name} group {g}")


def bits(tensors):
    return [t.view(torch.int16).clone() for t in tensors]


def same_bits(x, y):
    return len(x) == len(y) and all(torch.equal(p, q) for p, q in zip(x, y))


def test_device_alpha_equals_float_alpha_and_follows_graph_replays():
    gen = torch.Generator(device=CUDA).manual_seed(31)
    shapes = SHAPES[0]
    ops = [(random_operand(m, k, gen), random_operand(n, k, gen)) for m, n, k in shapes]
    a = [x[0][0] for x in ops]
    b = [x[1][0] for x in ops]
    sa = [make_blocked(x[0][1], m, k) for x, (m, _, k) in zip(ops, shapes)]
    sb = [make_blocked(x[1][1], n, k) for x, (_, n, k) in zip(ops, shapes)]
    floats = [0.5, -1.25, 2.0, 0.75]
    alpha = torch.tensor(floats, dtype=torch.float32, device=CUDA)
    want = bits(nvfp4_gemm.grouped_gemm(a, b, sa, sb, floats, out_dtype=torch.bfloat16))
    got = bits(nvfp4_gemm.grouped_gemm(a, b, sa, sb, alpha, out_dtype=torch.bfloat16))
    assert same_bits(got, want), "device alpha differs from float alpha"
    for g, (m, n, k) in enumerate(shapes):
        ref = reference(a[g], ops[g][0][1], b[g], ops[g][1][1], m, n, k, floats[g])
        assert_close(got[g].view(torch.bfloat16), ref, torch.bfloat16, f"group {g}")
    # Stacked and prepared calls read it the same way.
    ms = [m for m, _, _ in shapes]
    n, k = 256, 512
    ws = [random_operand(n, k, gen) for _ in shapes]
    ts = [random_operand(m, k, gen) for m in ms]
    stacked_args = (
        torch.cat([v for v, _ in ts]),
        torch.stack([v for v, _ in ws]),
        torch.cat([make_blocked(p, m, k) for (_, p), m in zip(ts, ms)]),
        torch.stack([make_blocked(p, n, k) for _, p in ws]),
        ms,
    )
    stacked_want = nvfp4_gemm.grouped_gemm_stacked(*stacked_args, floats)
    stacked_got = nvfp4_gemm.grouped_gemm_stacked(*stacked_args, alpha)
    assert same_bits(bits([stacked_got]), bits([stacked_want])), "stacked: device alpha differs"
    outs = [poisoned((m, nn), torch.float16) for m, nn, _ in shapes]
    call = nvfp4_gemm.prepare(a, b, sa, sb, alpha, out=outs)
    call()
    assert same_bits(bits(outs), bits(nvfp4_gemm.grouped_gemm(a, b, sa, sb, floats))), "prepare: device alpha differs"

    # Captured once; between replays only the tensor's values change (no call from Python).
    out = [poisoned((m, nn), torch.float16) for m, nn, _ in shapes]
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        nvfp4_gemm.grouped_gemm(a, b, sa, sb, alpha, out=out)  # warm-up outside capture
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        nvfp4_gemm.grouped_gemm(a, b, sa, sb, alpha, out=out)
    previous = None
    for step, values in enumerate([floats, [4.0, 0.125, -0.5, -3.0], [1.0, 1.0, 1.0, 1.0]]):
        alpha.copy_(torch.tensor(values, dtype=torch.float32))
        for o in out:
            o.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        got = bits(out)
        assert same_bits(got, bits(nvfp4_gemm.grouped_gemm(a, b, sa, sb, values))), f"replay {step}"
        assert previous is None or not same_bits(got, previous), f"replay {step}: new alphas, same outputs"
        previous = got
    # Not checked on the device: a NaN alpha gives NaN in its group.
    alpha.copy_(torch.tensor([1.0, 1.0, float("nan"), 1.0]))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.isnan(out[2].float()).all() and not torch.isnan(out[3].float()).any()


# ---- the GPU MODE task ---------------------------------------------------------------------

@pytest.mark.parametrize("case", range(14), ids=[f"test{i}" for i in range(10)] + [f"b{i}" for i in range(4)])
def test_custom_kernel_task_shapes(case):
    ms, ns, ks = (TASK_TESTS + TASK_BENCH)[case]
    data = task_input(ms, ns, ks, 1111 + case)
    refs = task_reference(data)
    for call in range(2):  # the first call plans, the second only launches
        for _, _, c in data[0]:
            c.fill_(float("nan"))
        outs = nvfp4_gemm.custom_kernel(data)
        torch.cuda.synchronize()
        assert [o.data_ptr() for o in outs] == [c.data_ptr() for _, _, c in data[0]]
        for g, (o, r) in enumerate(zip(outs, refs)):
            got = o[:, :, 0].to(torch.float64)
            bad = (got - r).abs() > 1e-3 + 1e-3 * r.abs()
            assert not bool(bad.any()), f"call {call} group {g}: {int(bad.sum())} elements beyond rtol=atol=1e-3"


# ---- quantize / dequantize -----------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
def test_quantize_dequantize(dtype):
    gen = torch.Generator(device=CUDA).manual_seed(9)
    rows, k = 300, 256
    x = (torch.randn((rows, k), generator=gen, device=CUDA, dtype=torch.float32) * 3).to(dtype)
    amax = float(x.abs().max())
    g = amax / (6 * 448)
    values, scales = nvfp4_gemm.quantize(x, g)
    assert values.shape == (rows, k // 2) and scales.numel() == nvfp4_gemm.blocked_bytes(rows, k)
    plain = scales[blocked_index(rows, k)]
    # dequantize: exact in f64, one rounding, against the test's own decode.
    deq = nvfp4_gemm.dequantize(values, scales, g, out_dtype=dtype)
    want = (dequant(values, plain, rows, k) * g).to(dtype)
    assert torch.equal(deq.view(torch.int16), want.view(torch.int16))
    # quantize: each block's scale is e4m3(amax_block / 6 / g) up to one e4m3 step, and every value
    # within the e2m1 rounding of its block (half the largest step, 1, times the block scale).
    blk = x.to(torch.float64).reshape(rows, k // 16, 16)
    s = decode_e4m3(plain) * g
    ideal = blk.abs().amax(dim=2) / 6
    assert bool(((s - ideal).abs() <= ideal * 2.0**-3 + g * 2.0**-9).all()), "block scales"
    err = (blk - dequant(values, plain, rows, k).reshape(rows, k // 16, 16) * g).abs()
    assert bool((err <= s[:, :, None] * 1.0 + blk.abs() * 2.0**-3).all()), "values"
    # Plain layout round trip of the library's layout helpers.
    assert torch.equal(nvfp4_gemm.layout.from_blocked(scales, rows, k), plain)
    assert torch.equal(nvfp4_gemm.layout.to_blocked(plain)[: scales.numel()][plain_rows_mask(rows, k)], scales[plain_rows_mask(rows, k)])


def plain_rows_mask(rows, k):
    m = torch.zeros((rest(rows, 128) * rest(k, 64) * 512,), dtype=torch.bool, device=CUDA)
    m[blocked_index(rows, k).reshape(-1)] = True
    return m


# ---- MoE -----------------------------------------------------------------------------------

def moe_weights(e, n, k, gen):
    w, s = zip(*(random_operand(n, k, gen, competition=True) for _ in range(e)))
    return torch.stack(w), torch.stack([make_blocked(p, n, k) for p in s]), s


@pytest.mark.parametrize("layout", ["contiguous", "masked"])
def test_moe_layer_capture_and_replay_with_changing_routing(layout):
    gen = torch.Generator(device=CUDA).manual_seed(77)
    e, n, k, bound = 8, 256, 512, 96
    w, ws, plain = moe_weights(e, n, k, gen)
    alphas = [0.5 + i / 8 for i in range(e)]
    layer = nvfp4_gemm.MoE(w, ws, alphas, layout=layout, max_tokens=bound, max_rows=bound, out_dtype=torch.bfloat16)
    masked = layout == "masked"
    x = exact_activations(e * bound if masked else bound, k, gen, torch.bfloat16).reshape(layer._x_shape())
    sizes = torch.zeros((layer.sizes_len,), dtype=torch.int32, device=CUDA)
    out = poisoned(layer._out_shape(), torch.bfloat16)
    routings = [[12, 0, 30, 1, 0, 40, 7, 6], [0] * 7 + [96], [0] * 8, [96, 0, 0, 0, 0, 0, 0, 0]]

    def set_routing(counts):
        if masked:
            sizes.copy_(torch.tensor(counts, dtype=torch.int32))
        else:
            c = [min(x, bound) for x in counts]
            offs = [0]
            for x in c:
                offs.append(min(offs[-1] + x, bound))
            sizes.copy_(torch.tensor(offs, dtype=torch.int32))

    set_routing(routings[0])
    layer(x, sizes, out=out)  # outside capture first (uploads the weights' tables)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        layer(x, sizes, out=out)
    for counts in routings:
        set_routing(counts)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        flat_out = out.reshape(-1, n)
        xs = x.reshape(-1, k).to(torch.float64)
        start = 0
        for i in range(e):
            rows = (range(i * bound, i * bound + counts[i]) if masked else range(start, start + counts[i]))
            start += counts[i]
            if not rows:
                continue
            rows = torch.tensor(list(rows), device=CUDA)
            ref = alphas[i] * xs[rows] @ dequant(w[i], plain[i], n, k).T
            assert_close(flat_out[rows], ref, torch.bfloat16, f"{layout} routing {counts} expert {i}")
    assert layer.status()[0] == 0
    # Sizes beyond the bound are clamped and flagged.
    if masked:
        sizes.copy_(torch.tensor([bound + 1] + [0] * (e - 1), dtype=torch.int32))
    else:
        sizes.copy_(torch.tensor([0] + [bound + 5] * e, dtype=torch.int32))
    graph.replay()
    assert layer.status()[0] != 0
    layer.clear_status()
    assert layer.status()[0] == 0


def test_moe_layer_routed_rows_hint():
    # The hint picks the launches (the decode kernel alone, or the general kernel first); every
    # routing within it is computed as without it. 4 experts: above 64 rows the general kernel
    # goes first, even on a call the decode kernel takes.
    gen = torch.Generator(device=CUDA).manual_seed(78)
    e, n, k, bound = 4, 256, 512, 96
    w, ws, plain = moe_weights(e, n, k, gen)
    alphas = [0.5 + i / 4 for i in range(e)]
    layer = nvfp4_gemm.MoE(w, ws, alphas, layout="contiguous", max_tokens=bound, out_dtype=torch.bfloat16)
    x = exact_activations(bound, k, gen, torch.bfloat16)
    xs = x.to(torch.float64)
    sizes = torch.zeros((layer.sizes_len,), dtype=torch.int32, device=CUDA)
    out = poisoned(layer._out_shape(), torch.bfloat16)
    cases = [(None, [12, 0, 30, 40]), (96, [12, 0, 30, 40]), (96, [2, 1, 0, 3]), (16, [3, 0, 13, 0]), (None, [0, 50, 0, 46])]
    for hint, counts in cases:
        layer.set_routed_rows(hint)
        offs = [0]
        for c in counts:
            offs.append(offs[-1] + c)
        sizes.copy_(torch.tensor(offs, dtype=torch.int32))
        out.fill_(float("nan"))
        layer(x, sizes, out=out)
        torch.cuda.synchronize()
        for i in range(e):
            if counts[i]:
                rows = slice(offs[i], offs[i + 1])
                ref = alphas[i] * xs[rows] @ dequant(w[i], plain[i], n, k).T
                assert_close(out[rows], ref, torch.bfloat16, f"hint {hint} routing {counts} expert {i}")
        assert layer.status()[0] == 0, f"hint {hint} routing {counts}"
    for bad, err in [(-1, ValueError), (True, TypeError), (1.5, TypeError), ("3", TypeError)]:
        with pytest.raises(err, match="rows"):
            layer.set_routed_rows(bad)


def test_moe_gemm_on_prequantized_tokens_and_vllm_scales():
    gen = torch.Generator(device=CUDA).manual_seed(3)
    e, n, k, t = 4, 128, 256, 200
    w, ws, plain = moe_weights(e, n, k, gen)
    layer = nvfp4_gemm.MoE(w, ws, max_tokens=t, out_dtype=torch.float16)
    counts = [50, 0, 129, 21]
    offs = torch.tensor([0, 50, 50, 179, 200], dtype=torch.int32, device=CUDA)
    x = exact_activations(t, k, gen, torch.float16)
    y = layer(x, offs)
    # vLLM's layout: expert i's blocked scales from row sum(round_up(m_j, 128), j < i).
    block = 128 * rest(k, 64) * 4
    bso, vllm = [0], []
    for i, m in enumerate(counts):
        start = (int(offs[i]) + 127) // 128 + i
        nblk = rest(m, 128)
        vllm.append(layer.a_scales[start * block:(start + nblk) * block])
        bso.append(bso[-1] + nblk * 128)
    vllm = torch.cat(vllm)
    ours = nvfp4_gemm.layout.vllm_scales_to_moe(vllm, offs, torch.tensor(bso, dtype=torch.int32, device=CUDA), k, t)
    out = poisoned((t, n), torch.float16)
    layer.gemm(layer.a_values, ours, offs, out=out)
    assert torch.equal(out.view(torch.int16), y.view(torch.int16))


# ---- W4A16 (sm_90a) -------------------------------------------------------------------------

needs_sm90 = pytest.mark.skipif(DEV.arch != "sm_90a", reason="W4A16 is an sm_90a path")


@needs_sm90
@pytest.mark.parametrize("act", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
def test_w4a16_grouped_gemm_against_fp64(act):
    gen = torch.Generator(device=CUDA).manual_seed(16)
    shapes = SHAPES[0]
    x, b, sb, refs, alphas = [], [], [], [], []
    for g, (m, n, k) in enumerate(shapes):
        av, asc = random_operand(m, k, gen)
        bv, bsc = random_operand(n, k, gen)
        alpha = 0.5 + g / 4
        # Activations: A's exact values (at most 6 significant bits: exact in f16 and bf16).
        x.append(dequant(av, asc, m, k).to(act))
        pv, ps = nvfp4_gemm.w4a16.prepack(bv, make_blocked(bsc, n, k), activations=act)
        assert pv.shape == bv.shape and pv.device == bv.device
        b.append(pv)
        sb.append(ps)
        refs.append(reference(av, asc, bv, bsc, m, n, k, alpha))
        alphas.append(alpha)
    for out_dtype in (torch.float16, torch.bfloat16):
        out = [poisoned((m, n), out_dtype) for m, n, _ in shapes]
        got = nvfp4_gemm.w4a16.grouped_gemm(x, b, sb, alphas, out=out)
        assert got == out
        for g, (o, r) in enumerate(zip(got, refs)):
            assert_close(o, r, out_dtype, f"{act} activations, group {g}")
    # Activations of two types in one call are refused before any launch.
    other = torch.bfloat16 if act == torch.float16 else torch.float16
    with pytest.raises(TypeError, match="group 0's activations"):
        nvfp4_gemm.w4a16.grouped_gemm([x[0], x[1].to(other)], b[:2], sb[:2])


@needs_sm90
@pytest.mark.parametrize("act", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
def test_w4a16_prepack_on_the_gpu_equals_the_cpu_prepack(act):
    """CUDA weights are prepacked on the GPU (on the current stream: a side stream here), CPU
    weights on the CPU: the same bytes, for one matrix and stacks of experts, N with and without
    scale padding rows, random scale bytes (negative, zero, subnormal and NaN scales included,
    padding rows too)."""
    gen = torch.Generator(device=CUDA).manual_seed(4216)
    side = torch.cuda.Stream()
    for experts, n, k in [(1, 8, 64), (1, 130, 192), (3, 72, 128), (2, 256, 512), (4, 200, 2048)]:
        v = torch.randint(0, 256, (experts, n, k // 2), generator=gen, device=CUDA, dtype=torch.int32).to(torch.uint8)
        s = torch.randint(0, 256, (experts * nvfp4_gemm.blocked_bytes(n, k),), generator=gen, device=CUDA, dtype=torch.int32)
        s = s.to(torch.uint8)
        if experts == 1:
            v = v[0]
        torch.cuda.synchronize()
        with torch.cuda.stream(side):
            pv, ps = nvfp4_gemm.w4a16.prepack(v, s, activations=act)
        side.synchronize()
        cv, cs = nvfp4_gemm.w4a16.prepack(v.cpu(), s.cpu(), activations=act)
        assert pv.device == v.device and pv.shape == v.shape and pv.dtype == torch.uint8
        assert cv.device.type == "cpu"
        assert torch.equal(pv.cpu(), cv), f"{act} E={experts} N={n} K={k}: values"
        assert torch.equal(ps.cpu(), cs), f"{act} E={experts} N={n} K={k}: scales"
    # Scales of the wrong size, or on another device than the values, before any launch.
    with pytest.raises(ValueError, match="scales"):
        nvfp4_gemm.w4a16.prepack(v, s[:-512], activations=act)
    with pytest.raises(TypeError, match="scales"):
        nvfp4_gemm._native.prepack_w4a16_device(v, s.cpu(), 4, 200, 2048, act == torch.bfloat16)


@needs_sm90
@pytest.mark.parametrize("act", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
def test_moe_w4a16_layer_capture_and_replay(act):
    gen = torch.Generator(device=CUDA).manual_seed(78)
    e, n, k, bound = 8, 256, 512, 96
    w, ws, plain = moe_weights(e, n, k, gen)
    alphas = [0.5 + i / 8 for i in range(e)]
    layer = nvfp4_gemm.MoE(w, ws, alphas, max_tokens=bound, out_dtype=torch.bfloat16, w4a16=act)
    assert "w4a16" in layer.kernel
    x = exact_activations(bound, k, gen, act)
    sizes = torch.zeros((e + 1,), dtype=torch.int32, device=CUDA)
    out = poisoned((bound, n), torch.bfloat16)
    routings = [[12, 0, 30, 1, 0, 40, 7, 6], [0] * 7 + [96], [0] * 8, [96] + [0] * 7]

    def set_routing(counts):
        offs = [0]
        for c in counts:
            offs.append(offs[-1] + c)
        sizes.copy_(torch.tensor(offs, dtype=torch.int32))

    set_routing(routings[0])
    layer(x, sizes, out=out)  # outside capture first (uploads the tables: weights and x's maps)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        layer(x, sizes, out=out)
    xs = x.to(torch.float64)
    for counts in routings:
        set_routing(counts)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        start = 0
        for i in range(e):
            rows = torch.arange(start, start + counts[i], device=CUDA)
            start += counts[i]
            if counts[i]:
                ref = alphas[i] * xs[rows] @ dequant(w[i], plain[i], n, k).T
                assert_close(out[rows], ref, torch.bfloat16, f"{act} routing {counts} expert {i}")
        # Rows of no expert keep their NaN.
        assert bool(out[start:].isnan().all())
    assert layer.status()[0] == 0
    with pytest.raises(TypeError, match="gemm: a W4A16 layer"):
        layer.gemm(x, x, sizes)


# ---- bad inputs on the GPU -----------------------------------------------------------------

def test_bad_inputs_raise_and_write_nothing():
    gen = torch.Generator(device=CUDA).manual_seed(1)
    m, n, k = 64, 128, 256
    (av, asc), (bv, bsc) = random_operand(m, k, gen), random_operand(n, k, gen)
    sa, sb = make_blocked(asc, m, k), make_blocked(bsc, n, k)
    out = [poisoned((m, n), torch.float16), poisoned((m, n), torch.float16)]
    good = (av, bv, sa, sb)

    def attempt(kind, text, **over):
        args = dict(zip(("a", "b", "a_scales", "b_scales"), good))
        per = {name: [args[name], over.get(name, args[name])] for name in args}
        with pytest.raises(kind) as ex:
            nvfp4_gemm.grouped_gemm(per["a"], per["b"], per["a_scales"], per["b_scales"], over.get("alpha"), out=over.get("out", out))
        assert text in str(ex.value), str(ex.value)

    attempt(TypeError, "group 1: `a`: dtype float16", a=torch.zeros((m, k // 2), dtype=torch.float16, device=CUDA))
    attempt(TypeError, "group 1: `b`: is on cpu", b=bv.cpu())
    attempt(ValueError, "group 1: `b`: N = 100", b=torch.zeros((100, k // 2), dtype=torch.uint8, device=CUDA))
    attempt(ValueError, "group 1: `a`: K = 2·40 = 80", a=torch.zeros((m, 40), dtype=torch.uint8, device=CUDA))
    attempt(ValueError, "group 1: `a`: is not contiguous", a=torch.zeros((k // 2, m), dtype=torch.uint8, device=CUDA).T)
    attempt(ValueError, "group 1: `a`: address", a=torch.zeros((m * k // 2 + 8,), dtype=torch.uint8, device=CUDA)[8:].view(m, k // 2))
    attempt(ValueError, "group 1: `a_scales`: has", a_scales=sa[:-512])
    attempt(ValueError, "group 1: `alpha`: nan", alpha=[1.0, math.nan])
    attempt(ValueError, "group 1: `out`: shape", out=[out[0], poisoned((m, n - 8), torch.float16)])
    if torch.cuda.device_count() > 1:
        attempt(ValueError, "group 1: `b`: is on cuda:1", b=bv.to("cuda:1"))
    torch.cuda.synchronize()
    assert all(bool(o.isnan().all()) for o in out), "an output was written by a call that failed"


def requantized(row, g):
    """One 16-bit row quantized to NVFP4 with global scale `g` (the library's quantizer, which the
    block uses) and dequantized, in fp32."""
    k = row.shape[1]
    values, blocked = nvfp4_gemm.quantize(row, global_scale=g)
    return dequant(values, blocked.view(torch.uint8)[blocked_index(1, k)], 1, k) * g


@pytest.mark.parametrize("w4a16", [False, True], ids=["w4a4", "w4a16"])
def test_moe_block_against_a_dequantized_reference(w4a16):
    # The whole block (routing, gate/up, silu, down, weighted combine) against the same arithmetic
    # in fp32 on dequantized weights, rounding to bf16 where the block stores (docs/moe-block.md).
    gen = torch.Generator(device=CUDA).manual_seed(42)
    e, i, h, top_k, t = 4, 64, 128, 2, 24
    ops13 = [random_operand(2 * i, h, gen) for _ in range(e)]
    ops2 = [random_operand(h, i, gen) for _ in range(e)]
    w13 = torch.stack([v for v, _ in ops13])
    s13 = torch.stack([s.reshape(2 * i, h // 16) for _, s in ops13])
    w2 = torch.stack([v for v, _ in ops2])
    s2 = torch.stack([s.reshape(h, i // 16) for _, s in ops2])
    # Input scales of each expert's own, as a calibrated checkpoint stores them.
    g13, g2, in13, in2 = 2.0**-9, 2.0**-8, [0.05, 0.06, 0.04, 0.07], [0.05, 0.03, 0.08, 0.05]
    block = nvfp4_gemm.MoEBlock(w13, s13, g13, w2, s2, g2, in13, in2, top_k=top_k, max_tokens=32, w4a16=w4a16)
    x = (torch.randn((t, h), generator=gen, device=CUDA)).to(torch.bfloat16)
    ids = torch.randint(-1, e + 1, (t, top_k), generator=gen, device=CUDA, dtype=torch.int32)
    weights = torch.rand((t, top_k), generator=gen, device=CUDA)
    out = poisoned((t, h), torch.bfloat16)
    got = nvfp4_gemm.fused_experts(x, block, weights, ids, out=out)
    assert got is out
    want = torch.zeros((t, h), device=CUDA)
    for tok in range(t):
        for k in range(top_k):
            ex = int(ids[tok, k])
            if not 0 <= ex < e:
                continue
            # fp64 throughout the products: `dequant` returns fp64 and matmul takes one dtype.
            a = x[tok : tok + 1].double()
            if not w4a16:
                a = requantized(x[tok : tok + 1], in13[ex])
            hh = (a @ dequant(w13[ex], s13[ex], 2 * i, h).T * g13).to(torch.bfloat16).float()
            z = (torch.nn.functional.silu(hh[:, :i]) * hh[:, i:]).to(torch.bfloat16)
            zf = z.double() if w4a16 else requantized(z, in2[ex])
            o = (zf @ dequant(w2[ex], s2[ex], h, i).T * g2).to(torch.bfloat16).float()
            want[tok] += float(weights[tok, k]) * o[0]
    err = (out.float() - want).norm() / want.norm()
    print(f"moe block w4a16={w4a16}: normalized error {float(err):.3e}")
    assert err < 2e-2, f"normalized error {err}"


def test_moe_block_activation_epilogue_is_the_kernel_bit_for_bit():
    # W4A4: the activation and requantization in the first GEMM's epilogue give the activation
    # kernel's output bit for bit (docs/moe-block.md §10), for gated and non-gated activations.
    gen = torch.Generator(device=CUDA).manual_seed(7)
    e, i, h, top_k, t = 4, 64, 128, 2, 40
    for activation, gated in (("silu", True), ("relu2", False)):
        n1 = 2 * i if gated else i
        ops13 = [random_operand(n1, h, gen) for _ in range(e)]
        ops2 = [random_operand(h, i, gen) for _ in range(e)]
        args = (
            torch.stack([v for v, _ in ops13]),
            torch.stack([s.reshape(n1, h // 16) for _, s in ops13]),
            2.0**-9,
            torch.stack([v for v, _ in ops2]),
            torch.stack([s.reshape(h, i // 16) for _, s in ops2]),
            2.0**-8,
            [0.05, 0.06, 0.04, 0.07],
            [0.05, 0.03, 0.08, 0.05],
        )
        kw = dict(top_k=top_k, max_tokens=t, activation=activation)
        separate = nvfp4_gemm.MoEBlock(*args, **kw)
        fused = nvfp4_gemm.MoEBlock(*args, activation_epilogue=True, **kw)
        x = torch.randn((t, h), generator=gen, device=CUDA).to(torch.bfloat16)
        ids = torch.randint(-1, e + 1, (t, top_k), generator=gen, device=CUDA, dtype=torch.int32)
        weights = torch.rand((t, top_k), generator=gen, device=CUDA)
        want = separate(x, weights, ids, out=poisoned((t, h), torch.bfloat16))
        got = fused(x, weights, ids, out=poisoned((t, h), torch.bfloat16))
        assert torch.equal(got.view(torch.int16), want.view(torch.int16)), f"{activation}: the epilogue differs"
    with pytest.raises(Exception, match="epilogue"):
        nvfp4_gemm.MoEBlock(*args, w4a16=True, activation_epilogue=True, **kw)


def test_moe_block_from_a_checkpoint_is_the_stacked_block(tmp_path):
    # The same experts given as a ModelOpt state dict, as a safetensors file and as stacked
    # tensors: the three blocks give the same output bit for bit (the loader reads what the
    # stacked constructor is given).
    gen = torch.Generator(device=CUDA).manual_seed(11)
    e, i, h, top_k, t = 3, 64, 128, 2, 16
    ops = {(x, p): random_operand(*shape, gen) for x in range(e) for p, shape in (("w1", (i, h)), ("w3", (i, h)), ("w2", (h, i)))}
    g13, g2 = [0.01 * (x + 1) for x in range(e)], [0.02 * (x + 1) for x in range(e)]
    in13, in2 = [0.05 * (x + 1) for x in range(e)], [0.04 * (x + 1) for x in range(e)]
    prefix = "model.layers.0.mlp"
    sd = {}
    for (x, p), (values, scales) in ops.items():
        rows, k = (h, i) if p == "w2" else (i, h)
        base = f"{prefix}.experts.{x}.{p}."
        sd[base + "weight"] = values.reshape(rows, k // 2)
        sd[base + "weight_scale"] = scales.reshape(rows, k // 16).view(torch.float8_e4m3fn)
        sd[base + "weight_scale_2"] = torch.tensor(g2[x] if p == "w2" else g13[x], dtype=torch.float32)
        sd[base + "input_scale"] = torch.tensor([in2[x] if p == "w2" else in13[x]], dtype=torch.float32)
    kw = dict(top_k=top_k, max_tokens=t)
    from_sd = nvfp4_gemm.MoEBlock.from_state_dict(sd, prefix, **kw)
    # The file written by hand (the safetensors layout: header length, JSON header, data).
    kinds = {torch.uint8: "U8", torch.float8_e4m3fn: "F8_E4M3", torch.float32: "F32"}
    header, data = {}, b""
    for name, v in sd.items():
        raw = v.contiguous().cpu().reshape(-1).view(torch.uint8).numpy().tobytes()
        header[name] = {"dtype": kinds[v.dtype], "shape": list(v.shape), "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    (tmp_path / "m.safetensors").write_bytes(struct.pack("<Q", len(text)) + text + data)
    from_file = nvfp4_gemm.MoEBlock.from_checkpoint(str(tmp_path / "m.safetensors"), prefix, **kw)
    w13 = torch.stack([torch.cat([ops[(x, "w1")][0].reshape(i, h // 2), ops[(x, "w3")][0].reshape(i, h // 2)]) for x in range(e)])
    s13 = torch.stack([torch.cat([ops[(x, "w1")][1].reshape(i, h // 16), ops[(x, "w3")][1].reshape(i, h // 16)]) for x in range(e)])
    w2 = torch.stack([ops[(x, "w2")][0].reshape(h, i // 2) for x in range(e)])
    s2 = torch.stack([ops[(x, "w2")][1].reshape(h, i // 16) for x in range(e)])
    stacked = nvfp4_gemm.MoEBlock(w13, s13, g13, w2, s2, g2, in13, in2, **kw)
    x = torch.randn((t, h), generator=gen, device=CUDA).to(torch.bfloat16)
    ids = torch.randint(-1, e, (t, top_k), generator=gen, device=CUDA, dtype=torch.int32)
    weights = torch.rand((t, top_k), generator=gen, device=CUDA)
    outs = [b(x, weights, ids, out=poisoned((t, h), torch.bfloat16)) for b in (stacked, from_sd, from_file)]
    assert torch.equal(outs[0].view(torch.int16), outs[1].view(torch.int16)), "state dict vs stacked"
    assert torch.equal(outs[0].view(torch.int16), outs[2].view(torch.int16)), "file vs stacked"
    assert bool(torch.isfinite(outs[0].float()).all())
