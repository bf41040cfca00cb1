#!/usr/bin/env bash
# The library's figures on a GPU in one command under a time budget: each step runs the commands
# the docs give for it, writes its logs and results under OUT, and a table of the steps ends the
# output. On the GPU machine, from the repository root:
#
#   bench/gpu-proof.sh [--budget SECONDS] [--pack] OUT STEP...
#
# Steps (run in the order given):
#   host     the host cost of every call (docs/python.md, "host budget of every row"): the Rust
#            bench with W4A16, the MoE rows m0..m3 and d0..d2 with W4A16, then python/gpu-check.sh
#            (the Python suites and bench) against both JSONs
#   gpumode  both GPU MODE harnesses on the wheel (bench/gpumode/README.md; needs .gpumode/)
#   moe      device-sized against host-sized plans (MoePlan ÷ GemmPlan) on m0..m3, d0..d2 and the
#            prefill-sized p0..p3 (nvfp4-bench --help), W4A4 and W4A16 (bench/README.md, "MoE rows");
#            W4A4 also with the general kernel launched first (auto-general-first) and with one
#            GEMM kernel launched (decode, general-n192): what the launch of the kernel the
#            scheduler does not choose costs, before and after the chosen one
#   block    the expert block's rows, the Rust bench then the Python one (bench/README.md,
#            docs/python.md "Expert-block rows")
#   tests    every bundled GPU test binary (bundle/run-gpu-tests.sh)
#   chains   what the device-sized plans' extra time is made of: each MoE row of $CHAIN_ROWS
#            (default d0 d1 p0 p1 p2) under ncu, one launch per line (bench/ncu-launches.py),
#            the W4A4 chains (first 40 launches) and the W4A16 GEMMs with the scheduler (16)
#
# Needs bundle/ (or bundle.tar.xz in the root, unpacked first: `cargo xtask bundle`, then
# `cargo xtask bench`) and, for host, gpumode and block, the wheel in python/dist/. A step runs
# for at most what is left of the budget (default 570 s) and is not started with less than its
# minimum left: it is then reported as not run. --pack also writes OUT/results.tar.xz with every
# file under OUT (one file to copy back). Exit status: 0 when every step ran and passed.
set -uo pipefail
budget=570
pack=0
while [ $# -gt 0 ]; do
  case "$1" in
    --budget) budget=${2:?--budget needs seconds}; shift 2 ;;
    --pack) pack=1; shift ;;
    -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
    *) break ;;
  esac
done
out=${1:?usage: bench/gpu-proof.sh [--budget SECONDS] [--pack] OUT STEP...}
shift
# Each step and the least time it is started with (its usual length on an H100, with some margin).
minimums="host:150 gpumode:90 moe:150 block:150 tests:170 chains:120"
steps=""
for e in $minimums; do steps+="${steps:+ }${e%%:*}"; done
[ $# -gt 0 ] || { echo "gpu-proof: name at least one step: $steps" >&2; exit 2; }
for s in "$@"; do
  known=0
  for t in $steps; do [ "$s" = "$t" ] && known=1; done
  [ "$known" = 1 ] || { echo "gpu-proof: unknown step $s" >&2; exit 2; }
done
mkdir -p "$out"
out=$(cd "$out" && pwd)
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root" || exit 2
start=$(date +%s)
left() { echo $((budget - ($(date +%s) - start))); }

nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > "$out/gpu.txt" 2>&1
if [ ! -x bundle/bin/run-bench.sh ] && [ -f bundle.tar.xz ]; then
  tar xJf bundle.tar.xz || exit 2
fi
[ -x bundle/bin/run-bench.sh ] || { echo "gpu-proof: no bundle/ (cargo xtask bundle, then cargo xtask bench)" >&2; exit 2; }
bench=bundle/bin/run-bench.sh

# `run LIMIT LOG CMD...`: CMD with its output in LOG, stopped after LIMIT seconds.
run() {
  local limit=$1 log=$2
  shift 2
  timeout "$limit" "$@" > "$log" 2>&1
}

# The wheel in python/dist/ (the first one), or nothing.
wheel() { ls python/dist/nvfp4_gemm-*.whl 2>/dev/null | head -n 1; }

step_host() {
  local d="$out/host"
  mkdir -p "$d"
  run "$1" "$d/rust-bench.log" "$bench" --w4a16 --out "$d" || return 1
  run "$(left)" "$d/rust-moe.log" "$bench" --moe --shapes none --w4a16 --moe-shapes m0,m1,m2,m3,d0,d1,d2 --out "$d" || return 1
  run "$(left)" "$d/gpu-check.log" python/gpu-check.sh "$d" --rust "$d/nvfp4-bench.json" --rust "$d/nvfp4-bench-moe.json"
}

step_gpumode() {
  local w
  w=$(wheel)
  [ -n "$w" ] || { echo "gpu-proof: no wheel in python/dist" > "$out/gpumode.log"; return 1; }
  run "$1" "$out/gpumode.log" bench/gpumode/run.sh --wheel "$w" --timeout 80 .gpumode "$out/gpumode"
}

step_moe() {
  run "$1" "$out/moe.log" "$bench" --moe --shapes none --w4a16 --moe-shapes m0,m1,m2,m3,d0,d1,d2,p0,p1,p2,p3 \
    --moe-kernels auto,auto-general-first,decode,general-n192 --torch off --no-baseline --out "$out/moe"
}

step_block() {
  local w site
  run "$1" "$out/block.log" "$bench" --block --shapes none --block-precision all --out "$out/block" || return 1
  w=$(wheel)
  [ -n "$w" ] || { echo "gpu-proof: no wheel in python/dist" > "$out/python-block.log"; return 1; }
  site=$(mktemp -d /tmp/gpu-proof-site.XXXXXX)
  python3 -m pip install --quiet --no-index --no-deps --target "$site" "$w" || return 1
  mkdir -p "$out/python-block"
  run "$(left)" "$out/python-block.log" env PYTHONPATH="$site" python3 python/bench/bench.py --block-only --out "$out/python-block"
}

step_tests() {
  run "$1" "$out/gpu-tests.log" bundle/run-gpu-tests.sh
  local rc=$?
  cp -r bundle/logs "$out/gpu-test-logs" 2>/dev/null
  return $rc
}

# `ncu` over the bench's first launches of each row (short timing loops, no check: the launches
# are what is read), then each report as one line per launch. The kernel filter keeps the GEMM
# chain's kernels (the bench's TMA ceiling probe runs before them).
step_chains() {
  local d="$out/chains" ncu=${NCU:-ncu} row rep quick
  # Only what the table prints: one pass per kernel (the default sections replay each many times).
  local metrics=gpu__time_duration.sum,launch__grid_size,launch__block_size
  mkdir -p "$d"
  command -v "$ncu" > /dev/null || { echo "gpu-proof: no ncu on PATH (or \$NCU)" > "$d/chains.log"; return 1; }
  quick=(--shapes none --torch off --no-baseline --no-check --iters 4 --reps 1 --sets 1 --host-batches 1 --host-calls 2)
  for row in ${CHAIN_ROWS:-d0 d1 p0 p1 p2}; do
    run "$(left)" "$d/$row-w4a4.log" "$ncu" --clock-control none --metrics "$metrics" --launch-count 40 -f -o "$d/$row-w4a4" \
      -k 'regex:^(sm90_(grouped_gemm|schedule|quantize_schedule|dequant_tokens)|nvfp4_quantize_grouped)' "$bench" --moe-shapes "$row" \
      "${quick[@]}" --out "$d/bench" || return 1
    run "$(left)" "$d/$row-w4a16.log" "$ncu" --clock-control none --metrics "$metrics" --launch-count 16 -f -o "$d/$row-w4a16" \
      -k 'regex:^sm90_(w4a16_(gemm|bf16_gemm)|schedule)' "$bench" --moe-shapes "$row" --w4a16 "${quick[@]}" \
      --out "$d/bench" || return 1
  done
  for rep in "$d"/*.ncu-rep; do
    "$ncu" -i "$rep" --csv --page raw --print-units base --metrics "$metrics" > "${rep%.ncu-rep}.csv" || return 1
  done
  python3 bench/ncu-launches.py "$d"/*.csv > "$d/launches.txt"
}

# The least time step $1 is started with (`minimums`).
minimum() {
  local e
  for e in $minimums; do [ "${e%%:*}" = "$1" ] && echo "${e#*:}"; done
}

table=()
status=0
for s in "$@"; do
  t0=$(date +%s)
  if [ "$(left)" -lt "$(minimum "$s")" ]; then
    table+=("$(printf '%-8s %-8s %5s s  %s' "$s" "not run" 0 "$(left) s left of the budget, $(minimum "$s") needed")")
    status=1
    continue
  fi
  "step_$s" "$(left)"
  rc=$?
  [ "$rc" = 0 ] || status=1
  what=$([ "$rc" = 0 ] && echo pass || { [ "$rc" = 124 ] && echo "timeout" || echo "FAIL"; })
  table+=("$(printf '%-8s %-8s %5s s  rc %s' "$s" "$what" $(($(date +%s) - t0)) "$rc")")
done

{
  echo "GPU: $(cat "$out/gpu.txt")"
  printf '%s\n' "${table[@]}"
  grep -h -E '^(checks:|CPU SUITE|GPU SUITE|block targets)' "$out"/host/gpu-check.log "$out"/python-block.log 2>/dev/null
  grep -h -E '^(ebb|eval)-' "$out/gpumode.log" 2>/dev/null | grep -v '^---'
  grep -h -E '^total:' "$out/gpu-tests.log" 2>/dev/null
  echo "gpu-proof: $([ $status = 0 ] && echo OK || echo 'NOT ALL PASSED') ($(($(date +%s) - start)) s; logs in $out)"
} | tee "$out/summary.txt"
if [ "$pack" = 1 ]; then
  tar cJf /tmp/gpu-proof-results.tar.xz -C "$out" . && mv /tmp/gpu-proof-results.tar.xz "$out/results.tar.xz"
fi
exit $status
