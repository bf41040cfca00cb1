#!/usr/bin/env python3
"""Checks of this folder's pieces that need no GPU (README.md, "Checks without a GPU").

    python3 bench/gpumode/check_cpu.py UPSTREAM

Needs torch (a CPU build will do) and numpy; without torch it says so and exits 0. It builds the
runner's scratch folders, then, for each harness, a CPU copy of the task's reference module in
which only the device of the generated tensors is changed ("cuda" -> "cpu"), and in a child
process per harness checks:

- the tolerance the fp32 reference uses is the task's (read from its check, and as written in
  its reference.py);
- the harness reads the runner's tests.txt / benchmarks.txt back into the task.yml cases (and
  combines their seeds with POPCORN_SEED);
- on the task's inputs (every test shape, and groups of the benchmark shapes at full K), the fp32
  reference equals, bit for bit, (1) the exact product rounded once to fp16, computed in fp64
  from the operands' bits with the scales read from the *reordered* tensors' storage by the
  128x4 blocked layout's byte-offset formula (what the kernel reads), and (2) the task's own
  `ref_kernel` with `torch._scaled_mm` emulated exactly from the blocked scales the task builds;
- the harness's own test path (`_run_single_test`) and timed paths (`_run_single_benchmark`, with
  recheck) accept an exact kernel and reject wrong ones, with `torch.cuda.synchronize`, the CUDA
  events and the L2 clear replaced by CPU stand-ins; and which inputs each timed path generates.
Ends with "N passed, M failed".
"""

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.dont_write_bytecode = True  # no __pycache__ beside the runner


def outer(upstream):
    try:
        import torch  # noqa: F401
    except ImportError:
        print("check_cpu: torch is not installed here; skipped")
        return 0
    sys.path.insert(0, str(HERE))
    import runner

    task_dir, ebb, task = runner.locate_upstream(Path(upstream))
    bad = runner.check_hashes(task_dir, ebb)
    work = Path(tempfile.mkdtemp(prefix="gpumode-check-"))
    stub = runner.write_cutlass_stub(work)
    passed = failed = 0
    if bad:
        print("FAIL upstream files differ from upstream.sha256:", *bad, sep="\n  ")
        failed += 1
    else:
        print("ok   upstream files match upstream.sha256")
        passed += 1
    for h, src in (("ebb", ebb), ("eval", task_dir / "eval.py")):
        d = runner.make_harness_dir(work, h, src, task_dir, "fp32", task)
        text = (d / "reference_upstream.py").read_text()
        cpu = re.sub(r"""device\s*=\s*['"]cuda['"]""", 'device="cpu"', text).replace(".cuda()", ".cpu()")
        (d / "reference_upstream.py").write_text(cpu)
        env = dict(
            os.environ,
            PYTHONPATH=str(stub) + os.pathsep + os.environ.get("PYTHONPATH", ""),
            CHECK_UPSTREAM_REFERENCE=str(task_dir / "reference.py"),
        )
        r = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "--inside", h, str(d)],
            env=env,
            capture_output=True,
            text=True,
        )
        sys.stdout.write(r.stdout)
        if r.returncode not in (0, 1):
            sys.stdout.write(r.stderr[-3000:])
            failed += 1
        for line in r.stdout.splitlines():
            passed += line.startswith("ok ")
            failed += line.startswith("FAIL ")
    shutil.rmtree(work, ignore_errors=True)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


# ---------------------------------------------------------------------------------------------
# inside a harness folder (child process)


def inside(h, d):
    import torch

    os.chdir(d)
    sys.path.insert(0, d)
    results = []

    def check(name, fn):
        try:
            msg = fn()
            print(f"ok   [{h}] {name}" + (f": {msg}" if msg else ""), flush=True)
            results.append(True)
        except Exception:
            print(f"FAIL [{h}] {name}\n" + traceback.format_exc(), flush=True)
            results.append(False)

    import reference  # this folder's fp32_reference.py

    spec = importlib.util.spec_from_file_location("harness_eval", os.path.join(d, "eval.py"))
    harness = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(harness)  # `if __name__ == "__main__"` does not fire

    sys.path.insert(0, str(HERE))
    import runner

    task = runner.load_task_yml(Path(os.environ["CHECK_UPSTREAM_REFERENCE"]).parent / "task.yml")

    # -- tolerance
    def tolerance():
        src = Path(os.environ["CHECK_UPSTREAM_REFERENCE"]).read_text()
        m = re.search(
            r"check_implementation\s*=\s*make_match_reference\(\s*ref_kernel\s*,\s*rtol\s*=\s*([0-9.eE+-]+)\s*,\s*atol\s*=\s*([0-9.eE+-]+)\s*\)",
            src,
        )
        assert m, "the task's check_implementation line is not make_match_reference(ref_kernel, rtol=..., atol=...)"
        written = {"rtol": float(m.group(1)), "atol": float(m.group(2))}
        assert reference.TOLERANCE == written, (reference.TOLERANCE, written)
        assert harness.check_implementation is reference.check_implementation, "the harness does not use the fp32 check"
        assert reference.generate_input is sys.modules["reference_upstream"].generate_input
        return f"rtol={written['rtol']}, atol={written['atol']}; the harness's check_implementation is the fp32 one"

    check("tolerance is the task's", tolerance)

    # -- spec files
    def parse():
        for kind in ("tests", "benchmarks"):
            cases = harness.get_test_cases(os.path.join(d, f"{kind}.txt"), None)
            want = [{k: tuple(v) if isinstance(v, list) else v for k, v in c.items()} for c in task[kind]]
            assert [c.args for c in cases] == want, (kind, [c.args for c in cases][:2], want[:2])
        seeded = harness.get_test_cases(os.path.join(d, "tests.txt"), 12345)
        assert all(c.args["seed"] == harness._combine(1111, 12345) for c in seeded)
        return f"{len(task['tests'])} tests, {len(task['benchmarks'])} benchmarks; seeds combined with POPCORN_SEED"

    check("spec files parse back to task.yml", parse)

    # -- independent exact arithmetic
    def e2m1_f64(byte_tensor):
        b = byte_tensor.to(torch.int64)
        out = []
        for nib in (b & 15, b >> 4):
            s = torch.where(nib >= 8, -1.0, 1.0).to(torch.float64)
            e, m = (nib >> 1) & 3, (nib & 1).to(torch.float64)
            mag = torch.where(e == 0, m * 0.5, (1 + m / 2) * torch.pow(2.0, (e - 1).to(torch.float64)))
            out.append(s * mag)
        return torch.stack(out, dim=-1).reshape(b.shape[0], -1)

    def e4m3_f64(byte_tensor):
        b = byte_tensor.to(torch.int64)
        s = torch.where(b >= 128, -1.0, 1.0).to(torch.float64)
        e, m = (b >> 3) & 15, (b & 7).to(torch.float64)
        v = torch.where(e == 0, m / 8 * 2.0**-6, (1 + m / 8) * torch.pow(2.0, (e - 7).to(torch.float64)))
        return s * v

    def blocked_offset(rows, sfk):
        i = torch.arange(rows)[:, None]
        j = torch.arange(sfk)[None, :]
        rest_k = -(-sfk // 4)
        return ((i // 128) * rest_k + j // 4) * 512 + (i % 32) * 16 + ((i % 128) // 32) * 4 + j % 4

    def scales_from_reordered(r, rows, sfk):
        # r: (32, 4, rest_m, 4, rest_k, 1), a permuted view of (1, rest_m, rest_k, 32, 4, 4) storage
        storage = r.permute(5, 2, 4, 0, 1, 3)
        assert storage.is_contiguous(), "the reordered scales are not a permuted view of contiguous storage"
        flat = storage.reshape(-1).view(torch.uint8)
        return e4m3_f64(flat[blocked_offset(rows, sfk)])

    def exact(data):
        abc, _, sfr, sizes = data
        outs = []
        for (a, b, c), (ra, rb), (m, n, k, l) in zip(abc, sfr, sizes):
            av = e2m1_f64(a[:, :, 0].view(torch.uint8)) * scales_from_reordered(ra, m, k // 16).repeat_interleave(
                16, dim=1
            )
            bv = e2m1_f64(b[:, :, 0].view(torch.uint8)) * scales_from_reordered(rb, n, k // 16).repeat_interleave(
                16, dim=1
            )
            outs.append((av @ bv.T).to(c.dtype).unsqueeze(-1))
        return outs

    def fake_scaled_mm(a, b, scale_a, scale_b, bias=None, out_dtype=torch.float32, **_):
        # torch._scaled_mm's FP4 product, exactly: a [m, k/2], b [k/2, n] (a view of [n, k/2]),
        # scales in the flat 128x4 blocked layout
        assert bias is None
        m, n, k = a.shape[0], b.shape[1], a.shape[1] * 2
        av = e2m1_f64(a.view(torch.uint8)) * e4m3_f64(
            scale_a.view(torch.uint8)[blocked_offset(m, k // 16)]
        ).repeat_interleave(16, dim=1)
        bv = e2m1_f64(b.T.view(torch.uint8)) * e4m3_f64(
            scale_b.view(torch.uint8)[blocked_offset(n, k // 16)]
        ).repeat_interleave(16, dim=1)
        return (av @ bv.T).to(out_dtype)

    up = sys.modules["reference_upstream"]
    clone = harness._clone_data

    def compare(data, what):
        ours = reference.ref_kernel(clone(data))
        want = exact(data)
        real = torch._scaled_mm
        torch._scaled_mm = fake_scaled_mm
        try:
            task_ref = up.ref_kernel(clone(data))
        finally:
            torch._scaled_mm = real
        for g, (o, w, t) in enumerate(zip(ours, want, task_ref)):
            assert o.dtype == torch.float16 and o.shape == w.shape, (o.dtype, o.shape, w.shape)
            assert torch.equal(o.view(torch.int16), w.view(torch.int16)), (
                f"{what} group {g}: fp32 reference != exact ({int((o != w).sum())} elements)"
            )
            assert torch.equal(o.view(torch.int16), t.view(torch.int16)), (
                f"{what} group {g}: fp32 reference != the task's ref_kernel ({int((o != t).sum())} elements)"
            )
        return max(float(w.abs().max()) for w in want)

    def references():
        peak = 0.0
        for i, case in enumerate(task["tests"]):
            peak = max(peak, compare(up.generate_input(**case), f"test {i}"))
        # one group of each benchmark shape, at the benchmark's N and full K (CPU time)
        for i, case in enumerate(task["benchmarks"]):
            one = dict(m=case["m"][:1], n=case["n"][:1], k=case["k"][:1], g=1, seed=case["seed"])
            peak = max(peak, compare(up.generate_input(**one), f"benchmark {i} group 0"))
        return f"bit for bit on {len(task['tests'])} test inputs and 4 benchmark groups (largest |c| {peak:g})"

    check("fp32 reference == exact == task's ref_kernel (scaled_mm emulated)", references)

    # -- the harness's own paths with CPU stand-ins for CUDA
    class Event:
        def __init__(self, enable_timing=False):
            self.t = None

        def record(self, stream=None):
            import time

            self.t = time.perf_counter()

        def elapsed_time(self, other):
            return (other.t - self.t) * 1e3

    torch.cuda.synchronize = lambda *a, **k: None
    torch.cuda.Event = Event
    harness.clear_l2_cache = lambda: None
    seeds = []
    real_generate = harness.generate_input

    def generate(**kw):
        seeds.append(kw.get("seed"))
        return real_generate(**kw)

    harness.generate_input = generate

    def install(kernel):
        mod = type(sys)("submission")
        mod.custom_kernel = kernel
        sys.modules["submission"] = mod

    def exact_kernel(data):
        outs = exact(data)
        for (_, _, c), o in zip(data[0], outs):
            c.copy_(o)
        return [c for _, _, c in data[0]]

    def off_by(delta_rel):
        def kernel(data):
            outs = exact_kernel(data)
            for c in outs:
                c.copy_((c.float() * (1 + delta_rel) + 4e-3).to(c.dtype))
            return outs

        return kernel

    def test_path():
        install(exact_kernel)
        cases = harness.get_test_cases(os.path.join(d, "tests.txt"), None)
        for c in cases:
            good, msg = harness._run_single_test(c)
            assert good, (c.spec, msg)
        install(off_by(0.0))  # 4e-3 absolute on every element: above atol + rtol|c| where |c| < 3
        good, msg = harness._run_single_test(cases[0])
        assert not good and "mismatch" in msg, msg
        return f"{len(cases)} tests pass with an exact kernel; a kernel off by 4e-3 is rejected"

    check("harness test path", test_path)

    def timed_path():
        install(exact_kernel)
        case = harness.get_test_cases(os.path.join(d, "tests.txt"), 777)[0]
        base = case.args["seed"]  # the harness advances it in place
        seeds.clear()
        stats = harness._run_single_benchmark(case, True, 3, 1e12)
        assert isinstance(stats, harness.Stats) and stats.runs == 3, stats
        used = list(seeds)
        install(off_by(0.01))
        bad = harness._run_single_benchmark(case, True, 3, 1e12)
        assert not isinstance(bad, harness.Stats), "a wrong kernel was timed"
        steps = [s - base for s in used]
        return f"recheck run of 3 repeats passes; wrong kernel rejected; generate_input seeds (offset from the case's): {steps}"

    check("harness timed path (recheck)", timed_path)
    return 0 if all(results) else 1


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--inside":
        sys.exit(inside(sys.argv[2], sys.argv[3]))
    if len(sys.argv) != 2:
        print(__doc__)
        sys.exit(2)
    sys.exit(outer(sys.argv[1]))
