#!/usr/bin/env python3
"""Runs the GPU MODE `nvfp4_group_gemm` harnesses on `nvfp4_gemm.custom_kernel` (README.md here).

    runner.py [options] UPSTREAM OUT

UPSTREAM holds unmodified upstream files: a checkout (or export) of gpu-mode/reference-kernels,
its `problems/nvidia` folder, or the task folder itself with the harness one level up (where
task.yml names it). OUT receives one file of harness results per run (what the harness wrote
to POPCORN_FD), `harness.log` (this runner's messages and every harness's stdout and stderr)
and `summary.txt`. Nothing here imports torch: the harnesses run as child processes of the
`python3` that runs this script.
"""

import argparse
import atexit
import hashlib
import json
import math
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

# name -> (harness, mode, spec list)
RUNS = {
    "ebb-test": ("ebb", "test", "tests"),
    "ebb-benchmark": ("ebb", "benchmark", "benchmarks"),
    "ebb-leaderboard": ("ebb", "leaderboard", "benchmarks"),
    "eval-test": ("eval", "test", "tests"),
    "eval-benchmark": ("eval", "benchmark", "benchmarks"),
    "eval-leaderboard": ("eval", "leaderboard", "benchmarks"),
}
DEFAULT_RUNS = ["ebb-test", "ebb-leaderboard", "eval-test", "eval-leaderboard"]
# eval_better_bench's L2 clear allocates a 16000 x 1024 x 1024 fp32 tensor (62.5 GiB) per timed
# repeat; its benchmark mode is added to the default runs only on cards at least this large.
EBB_BENCHMARK_MIN_MIB = 100 * 1024
# Timeouts kernelbot uses when task.yml names none (its LeaderboardTask defaults).
KERNELBOT_DEFAULT_TIMEOUT_S = 180

SUBMISSION = '''"""The submission the harness imports: this repository's nvfp4_gemm package, as installed."""

import sys

import nvfp4_gemm
from nvfp4_gemm import custom_kernel  # noqa: F401 -- the harness imports it from here

print(f"submission: nvfp4_gemm.custom_kernel from {nvfp4_gemm.__file__}", file=sys.stderr, flush=True)
'''

# Stand-ins for the two names the harnesses import from NVIDIA's CUTLASS Python DSL (they only
# name them in `except` clauses, for errors of CuTe DSL submissions); used only where the DSL
# is not installed. Our submission never raises them.
CUTLASS_STUB = {
    "cutlass/__init__.py": '"""Stand-in for the CUTLASS Python DSL: only the exception types the GPU MODE harnesses import."""\n',
    "cutlass/cute/__init__.py": "",
    "cutlass/cute/nvgpu/__init__.py": "",
    "cutlass/cute/nvgpu/common.py": "class OpError(Exception):\n    pass\n",
    "cutlass/_mlir/__init__.py": "",
    "cutlass/_mlir/ir.py": "class MLIRError(Exception):\n    pass\n",
}


class Log:
    """Prints to stdout and appends to harness.log; the harnesses' output goes to the same file."""

    def __init__(self, path):
        self.file = open(path, "a", buffering=1)

    def __call__(self, *parts):
        line = " ".join(str(p) for p in parts)
        print(line, flush=True)
        self.file.write(line + "\n")
        self.file.flush()


_log = None


def fail(msg, code=2):
    print(f"gpumode: {msg}", file=sys.stderr, flush=True)
    if _log is not None:
        _log.file.write(f"gpumode: {msg}\n")
        _log.file.flush()
    sys.exit(code)


# ---------------------------------------------------------------------------------------------
# task.yml


def load_task_yml(path):
    text = path.read_text()
    try:
        import yaml
    except ImportError:
        return _load_task_yml_plain(text)
    return yaml.safe_load(text)


def _load_task_yml_plain(text):
    """task.yml without PyYAML: top-level scalars, one level of nested scalars, and lists whose
    items are one-line flow maps (JSON as this task writes them). Block scalars are skipped."""
    out, key, block = {}, None, False
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        top = re.match(r"^([A-Za-z_][\w-]*):\s*(.*)$", line)
        if top:
            key, value = top.group(1), top.group(2).strip()
            block = value in ("|", ">", "|-", ">-")
            out[key] = None if (value == "" or block) else _scalar(value)
            continue
        if block or key is None:
            continue
        item = re.match(r"^\s+-\s+(\{.*\})\s*$", line)
        nested = re.match(r"^\s+([A-Za-z_][\w-]*):\s*(.*)$", line)
        if item:
            out[key] = (out[key] or []) + [json.loads(item.group(1))]
        elif nested:
            out[key] = out[key] or {}
            out[key][nested.group(1)] = _scalar(nested.group(2).strip())
    return out


def _scalar(v):
    if len(v) >= 2 and v[0] == v[-1] and v[0] in "\"'":
        return v[1:-1]
    try:
        return int(v)
    except ValueError:
        return v


def spec_line(case):
    """One case as kernelbot writes it into the file it passes the harness: `key: value` joined
    by '; ', values as Python prints them (lists as [1, 2])."""
    return "; ".join(f"{k}: {v}" for k, v in case.items())


# ---------------------------------------------------------------------------------------------
# upstream files


def locate_upstream(src):
    """-> (task folder, eval_better_bench file, task.yml dict)."""
    src = src.resolve()
    for cand in (
        src / "problems/nvidia/nvfp4_group_gemm",
        src / "nvidia/nvfp4_group_gemm",
        src / "nvfp4_group_gemm",
        src,
    ):
        if (cand / "task.yml").is_file():
            task_dir = cand
            break
    else:
        fail(f"{src}: no nvfp4_group_gemm task folder (task.yml) found in it")
    task = load_task_yml(task_dir / "task.yml")
    main = (task.get("config") or {}).get("main", "eval.py")
    named = [f.get("source") for f in task.get("files") or [] if f.get("name") == main]
    ebb = (task_dir / named[0]).resolve() if named and named[0] and not named[0].startswith("@") else None
    if ebb is None or not ebb.is_file():
        for cand in (task_dir.parent / "eval_better_bench_grouped_gemm.py", src / "eval_better_bench_grouped_gemm.py"):
            if cand.is_file():
                ebb = cand
                break
        else:
            fail(
                f"{task_dir}: task.yml ships {named[0] if named else '?'} as {main}, and no eval_better_bench_grouped_gemm.py was found"
            )
    for f in ("eval.py", "reference.py", "task.py", "utils.py"):
        if not (task_dir / f).is_file():
            fail(f"{task_dir}: {f} is missing")
    return task_dir, ebb, task


def check_hashes(task_dir, ebb):
    """Compares the files with upstream.sha256 (the commit README.md names)."""
    bad = []
    for line in (HERE / "upstream.sha256").read_text().splitlines():
        if not line.strip():
            continue
        digest, rel = line.split(None, 1)
        rel = rel.strip()
        path = ebb if rel.endswith("eval_better_bench_grouped_gemm.py") else task_dir / Path(rel).name
        got = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "missing"
        if got != digest:
            bad.append(f"{path}: sha256 {got[:16]}, expected {digest[:16]} ({rel})")
    return bad


def upstream_note(task_dir):
    for cand in (
        task_dir / "UPSTREAM",
        task_dir.parent / "UPSTREAM",
        task_dir.parent.parent / "UPSTREAM",
        task_dir.parent.parent.parent / "UPSTREAM",
    ):
        if cand.is_file():
            m = re.search(r"commit ([0-9a-f]{40})", cand.read_text())
            if m:
                return m.group(1)
    return None


# ---------------------------------------------------------------------------------------------
# scratch folders


def make_harness_dir(work, name, eval_src, task_dir, reference, task):
    d = work / name
    d.mkdir()
    shutil.copyfile(eval_src, d / "eval.py")
    for f in ("task.py", "utils.py"):
        shutil.copyfile(task_dir / f, d / f)
    if reference == "fp32":
        shutil.copyfile(task_dir / "reference.py", d / "reference_upstream.py")
        shutil.copyfile(HERE / "fp32_reference.py", d / "reference.py")
    else:
        shutil.copyfile(task_dir / "reference.py", d / "reference.py")
    (d / "submission.py").write_text(SUBMISSION)
    for kind in ("tests", "benchmarks"):
        cases = task.get(kind) or []
        (d / f"{kind}.txt").write_text("".join(spec_line(c) + "\n" for c in cases))
    return d


def write_cutlass_stub(work):
    root = work / "cutlass-stub"
    for rel, text in CUTLASS_STUB.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root


def probe(python, env, code, timeout=300):
    r = subprocess.run([python, "-c", code], env=env, capture_output=True, text=True, timeout=timeout)
    return r.returncode, r.stdout.strip(), r.stderr.strip()


PREFLIGHT = r"""
import json, sys
info = {"python": sys.version.split()[0]}
try:
    import torch
    info["torch"] = torch.__version__
    info["cuda"] = bool(torch.cuda.is_available())
    if info["cuda"]:
        p = torch.cuda.get_device_properties(0)
        info["device"] = p.name
        info["capability"] = "%d.%d" % (p.major, p.minor)
        info["memory_mib"] = p.total_memory // 2**20
except Exception as e:
    info["torch_error"] = repr(e)
try:
    import numpy
    info["numpy"] = numpy.__version__
except Exception as e:
    info["numpy_error"] = repr(e)
try:
    import nvfp4_gemm
    info["nvfp4_gemm"] = nvfp4_gemm.__file__
except Exception as e:
    info["nvfp4_gemm_error"] = repr(e)
print(json.dumps(info))
"""


# ---------------------------------------------------------------------------------------------
# running and reading


def run_one(log, name, hdir, mode, spec_file, result_path, env, seed, timeout):
    env = dict(env)
    env.pop("POPCORN_SEED", None)
    if seed is not None:
        env["POPCORN_SEED"] = str(seed)
    cmd = [sys.executable, "eval.py", mode, str(spec_file)]
    log(
        f"--- {name}: {hdir}$ POPCORN_FD=<{result_path.name}>"
        + (f" POPCORN_SEED={seed}" if seed is not None else "")
        + " "
        + " ".join(cmd[1:])
        + f"  (timeout {timeout} s)"
    )
    start = time.time()
    with open(result_path, "w") as res:
        fd = res.fileno()
        env["POPCORN_FD"] = str(fd)
        proc = subprocess.Popen(
            cmd,
            cwd=hdir,
            env=env,
            pass_fds=(fd,),
            stdin=subprocess.DEVNULL,
            stdout=log.file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            rc = "timeout"
        # The harness's worker pool is in the child's session: end what is left of it.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if rc == "timeout":
            proc.wait()
    wall = time.time() - start
    log(f"--- {name}: exit {rc}, {wall:.0f} s")
    return rc, wall


def read_results(path):
    """The harness's `key: value` lines, split at the first colon as kernelbot splits them."""
    out = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() or value.strip():
                out[key.strip()] = value.strip()
    return out


def short_shape(case):
    def one(v):
        v = list(v) if isinstance(v, (list, tuple)) else [v]
        return str(v[0]) if len(set(v)) == 1 else ",".join(map(str, v))

    return f"g={case.get('g')} m={one(case.get('m'))} n={one(case.get('n'))} k={one(case.get('k'))}"


def summarize(task, runs_done, results, meta):
    tests, benches = task.get("tests") or [], task.get("benchmarks") or []
    lines = []
    lines.append(f"GPU MODE nvfp4_group_gemm harnesses on nvfp4_gemm.custom_kernel -- {meta['device']}")
    for k in ("env", "upstream", "reference", "seed"):
        if meta.get(k):
            lines.append(f"{k}: {meta[k]}")
    lines.append("")
    lines.append(f"{'run':<17} {'check':<6} {'exit':<8} {'wall':>6}  detail")
    all_pass = True
    for name in runs_done:
        r, rc, wall = results[name]
        check = r.get("check", "none")
        all_pass &= check == "pass"
        if RUNS[name][2] == "tests":
            n = int(r.get("test-count", 0) or 0)
            ok = sum(r.get(f"test.{i}.status") == "pass" for i in range(n))
            detail = f"{ok}/{n} tests pass"
        else:
            n = int(r.get("benchmark-count", 0) or 0)
            ok = sum(f"benchmark.{i}.mean" in r for i in range(n))
            detail = f"{ok}/{n} benchmarks timed"
        if check == "none":
            detail += "; the harness ended without a verdict (harness.log)"
        lines.append(f"{name:<17} {check:<6} {str(rc):<8} {wall:>5.0f}s  {detail}")
    test_runs = [n for n in runs_done if RUNS[n][2] == "tests"]
    bench_runs = [n for n in runs_done if RUNS[n][2] == "benchmarks"]

    def by_spec(r, prefix):
        n = int(r.get(f"{prefix}-count", 0) or 0)
        return {r.get(f"{prefix}.{i}.spec"): i for i in range(n)}

    width = max([len(short_shape(c)) for c in tests + benches] + [27])

    def cell(r, prefix, spec, i):
        if i is None:
            return "-"  # not reached
        return r.get(f"{prefix}.{i}.status", "no verdict")

    if test_runs:
        lines.append("")
        lines.append("tests: pass/fail per run ('no verdict': the harness stopped there; '-': not reached)")
        lines.append(f"{'':<4} {'shape':<{width}} " + " ".join(f"{n:>16}" for n in test_runs))
        for t, case in enumerate(tests):
            spec = spec_line(case)
            cells = [
                f"{cell(results[n][0], 'test', spec, by_spec(results[n][0], 'test').get(spec)):>16}" for n in test_runs
            ]
            lines.append(f"t{t:<3} {short_shape(case):<{width}} " + " ".join(cells))
    if bench_runs:
        lines.append("")
        lines.append("benchmarks: mean us per call [best us] (the harness's Stats, ns / 1000)")
        lines.append(f"{'':<4} {'shape':<{width}} " + " ".join(f"{n:>24}" for n in bench_runs))
        means = {n: [] for n in bench_runs}
        for b, case in enumerate(benches):
            spec = spec_line(case)
            cells = []
            for n in bench_runs:
                r = results[n][0]
                i = by_spec(r, "benchmark").get(spec)
                if i is not None and f"benchmark.{i}.mean" in r:
                    mean, best = float(r[f"benchmark.{i}.mean"]) / 1e3, float(r[f"benchmark.{i}.best"]) / 1e3
                    means[n].append(mean)
                    cells.append(f"{mean:>12.3f} [{best:>9.3f}]")
                else:
                    cells.append(f"{cell(r, 'benchmark', spec, i):>24}")
            lines.append(f"b{b:<3} {short_shape(case):<{width}} " + " ".join(cells))
        geo = []
        for n in bench_runs:
            v = means[n]
            geo.append(
                f"{math.exp(sum(map(math.log, v)) / len(v)):>12.3f}{'':>12}"
                if v and len(v) == len(benches)
                else f"{'-':>24}"
            )
        lines.append(f"{'':<4} {'geometric mean of the means':<{width}} " + " ".join(geo))
    errors = []
    for name in runs_done:
        r = results[name][0]
        for k, v in r.items():
            if k.endswith(".error"):
                errors.append(f"{name} {k}: {v[:400]}")
    if errors:
        lines.append("")
        lines.append("errors:")
        lines.extend("  " + e for e in errors)
    lines.append("")
    lines.append("gpumode: " + ("all runs pass" if all_pass else "NOT all runs pass"))
    return "\n".join(lines), all_pass


# ---------------------------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("upstream", type=Path, help="folder holding the unmodified upstream files (e.g. .gpumode)")
    ap.add_argument("out", type=Path, help="output folder (created)")
    ap.add_argument(
        "--runs",
        default="auto",
        help="comma-separated from: "
        + ", ".join(RUNS)
        + "; 'auto' (default): "
        + ", ".join(DEFAULT_RUNS)
        + ", plus ebb-benchmark on a card of at least 100 GiB",
    )
    ap.add_argument(
        "--seed",
        default="random",
        help="POPCORN_SEED for benchmark and leaderboard runs: an integer, 'random' (default; a fresh 31-bit seed, logged) or 'none'. Test runs never get one",
    )
    ap.add_argument(
        "--timeout",
        type=int,
        default=None,
        help="seconds per harness run (default: task.yml's test/benchmark/ranked timeouts, else 180)",
    )
    ap.add_argument(
        "--reference",
        choices=("fp32", "upstream"),
        default="fp32",
        help="fp32: the fp32 dequantization reference (default; Hopper); upstream: the task's own (Blackwell)",
    )
    ap.add_argument(
        "--any-upstream", action="store_true", help="run even if the upstream files differ from upstream.sha256"
    )
    ap.add_argument("--keep", action="store_true", help="keep the scratch work folder")
    ap.add_argument(
        "--dry-run",
        action="store_true",
        help="prepare the work folders and print the commands, run no harness (no GPU needed)",
    )
    ap.add_argument(
        "--force",
        action="store_true",
        help="run the harnesses even where torch sees no GPU or nvfp4_gemm does not import (to test the plumbing)",
    )
    args = ap.parse_args()

    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out.resolve()
    global _log
    log = _log = Log(out / "harness.log")
    task_dir, ebb, task = locate_upstream(args.upstream)
    log(f"gpumode: task folder {task_dir}; eval_better_bench {ebb}")
    bad = check_hashes(task_dir, ebb)
    commit = upstream_note(task_dir)
    if bad:
        for b in bad:
            log("gpumode: upstream file differs:", b)
        if not args.any_upstream:
            fail("the upstream files are not the ones upstream.sha256 lists (pass --any-upstream to run them anyway)")
    upstream = f"gpu-mode/reference-kernels {commit or '(commit unknown)'}; files {'match upstream.sha256' if not bad else 'DIFFER from upstream.sha256'}"
    log("gpumode: upstream:", upstream)

    work = Path(tempfile.mkdtemp(prefix="gpumode-"))
    if not (args.keep or args.dry_run):
        atexit.register(shutil.rmtree, work, True)
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("POPCORN_FD", None)
    rc, so, se = probe(sys.executable, env, "import cutlass.cute.nvgpu.common, cutlass._mlir.ir")
    if rc == 0:
        log("gpumode: the CUTLASS Python DSL is installed; the harnesses import it as they are")
    else:
        stub = write_cutlass_stub(work)
        env["PYTHONPATH"] = str(stub) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        log(
            f"gpumode: no CUTLASS Python DSL here; stand-in exception types from {stub} (cutlass.cute.nvgpu.common.OpError, cutlass._mlir.ir.MLIRError)"
        )

    rc, so, se = probe(sys.executable, env, PREFLIGHT)
    try:
        info = json.loads(so.splitlines()[-1])
    except (ValueError, IndexError):
        info = {"probe_error": (se or so)[-400:]}
    info["PYTORCH_CUDA_ALLOC_CONF"] = env.get("PYTORCH_CUDA_ALLOC_CONF")
    log("gpumode: environment:", json.dumps(info))
    device = f"{info.get('device', 'no CUDA device')} (sm_{info.get('capability', '?').replace('.', '')}, {info.get('memory_mib', '?')} MiB)"
    if not args.dry_run and not args.force:
        if "nvfp4_gemm" not in info:
            fail(
                f"nvfp4_gemm does not import with {sys.executable}: {info.get('nvfp4_gemm_error', info)} (install the wheel, or pass --wheel to run.sh)"
            )
        if not info.get("cuda"):
            fail(f"torch sees no CUDA device: {info}")

    if args.runs == "auto":
        runs = list(DEFAULT_RUNS)
        if int(info.get("memory_mib", 0) or 0) >= EBB_BENCHMARK_MIN_MIB:
            runs.insert(1, "ebb-benchmark")
        else:
            log(
                f"gpumode: ebb-benchmark skipped: its L2 clear takes 62.5 GiB per timed repeat ({info.get('memory_mib', '?')} MiB card; needs --runs to force)"
            )
    else:
        runs = [r.strip() for r in args.runs.split(",") if r.strip()]
        unknown = [r for r in runs if r not in RUNS]
        if unknown:
            fail(f"unknown run(s) {unknown}; choose from {list(RUNS)}")

    if args.seed == "none":
        seed = None
    elif args.seed == "random":
        seed = random.SystemRandom().randrange(1, 2**31)
    else:
        seed = int(args.seed)
        # The harnesses pair it with each case's seed (Cantor pairing, about seed^2 / 2) and pass
        # that to torch.manual_seed, which takes at most 64 bits.
        if not 0 <= seed < 2**31:
            fail(f"--seed {seed}: use 0 <= seed < 2^31")

    dirs = {}
    for h in sorted({RUNS[r][0] for r in runs}):
        src = ebb if h == "ebb" else task_dir / "eval.py"
        dirs[h] = make_harness_dir(work, h, src, task_dir, args.reference, task)
        log(f"gpumode: {h}: {dirs[h]} (eval.py = {src.name}, reference = {args.reference})")

    timeouts = {
        "test": task.get("test_timeout") or KERNELBOT_DEFAULT_TIMEOUT_S,
        "benchmark": task.get("benchmark_timeout") or KERNELBOT_DEFAULT_TIMEOUT_S,
        "leaderboard": task.get("ranked_timeout") or KERNELBOT_DEFAULT_TIMEOUT_S,
    }
    results, done = {}, []
    for name in runs:
        h, mode, kind = RUNS[name]
        s = seed if mode != "test" else None
        t = args.timeout or int(timeouts[mode])
        if args.dry_run:
            log(
                f"--- {name} (dry run): cd {dirs[h]} && POPCORN_FD=3"
                + (f" POPCORN_SEED={s}" if s is not None else "")
                + f" {sys.executable} eval.py {mode} {dirs[h] / (kind + '.txt')} 3>{out / (name + '.txt')}"
            )
            continue
        rc, wall = run_one(log, name, dirs[h], mode, dirs[h] / f"{kind}.txt", out / f"{name}.txt", env, s, t)
        results[name] = (read_results(out / f"{name}.txt"), rc, wall)
        done.append(name)

    ref_line = None
    for line in (out / "harness.log").read_text(errors="replace").splitlines():
        if line.startswith("reference: "):
            ref_line = line[len("reference: ") :]
            break
    meta = {
        "device": device,
        "env": f"python {info.get('python')}, torch {info.get('torch')}, nvfp4_gemm {info.get('nvfp4_gemm', '?')}"
        + (
            f", PYTORCH_CUDA_ALLOC_CONF={info['PYTORCH_CUDA_ALLOC_CONF']}"
            if info.get("PYTORCH_CUDA_ALLOC_CONF")
            else ""
        ),
        "upstream": upstream,
        "reference": ref_line or ("the task's own" if args.reference == "upstream" else None),
        "seed": f"POPCORN_SEED={seed} for benchmark/leaderboard runs; test runs: none"
        if seed is not None
        else "no POPCORN_SEED",
    }
    if args.dry_run:
        log(f"gpumode: dry run: work folder {work} kept")
        return 0
    text, ok = summarize(task, done, results, meta)
    (out / "summary.txt").write_text(text + "\n")
    log("")
    log(text)
    if args.keep:
        log(f"gpumode: work folder {work} kept")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
