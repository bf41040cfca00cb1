#!/usr/bin/env bash
# The Python package on the GPU machine (Python 3.12 + torch + numpy + pytest there, no network,
# no Rust): installs the wheel built on the development machine (python/dist/, carried over),
# runs the CPU and GPU test suites and the Python bench, and writes logs under OUT.
#
#   python/gpu-check.sh OUT [bench options...]     (from the repository root)
#
# Success: "GPU SUITE: N passed, 0 failed, 0 skipped" (N > 0) and "checks: all PASS" from the
# bench; the exit status is non-zero otherwise. With the Rust bench's MoE routing in
# OUT/moe-routing.json (run-bench.sh --moe --out OUT first, same call), the MoE rows use the
# same token counts as the Rust rows.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:?usage: python/gpu-check.sh OUT [bench options]}
shift
mkdir -p "$out"
out=$(cd "$out" && pwd)
wheel=$(ls "$root"/python/dist/nvfp4_gemm-*.whl 2>/dev/null | head -n 1)
[ -n "$wheel" ] || { echo "gpu-check: no wheel in python/dist (build it with maturin on the development machine)" >&2; exit 2; }
site=$(mktemp -d /tmp/nvfp4-site.XXXXXX)
python3 -m pip install --no-index --no-deps --quiet --target "$site" "$wheel" || exit 2
export PYTHONPATH="$site"
# The tests' helpers (tests/nvfp4_ref.py) are found beside the tests; the package is the
# installed wheel: run from OUT so that the source tree's python/ is not on sys.path.
cd "$out"
python3 -c "import nvfp4_gemm, torch; print('nvfp4_gemm from', nvfp4_gemm.__file__, '| torch', torch.__version__, '| device', nvfp4_gemm.device(0).name, nvfp4_gemm.device(0).arch)" 2>&1 | tee "$out/python-env.log"
status=0
python3 -m pytest -p no:cacheprovider -q "$root/python/tests/test_validation.py" 2>&1 | tee "$out/python-cpu-tests.log" || status=1
# The GPU suite must run, not skip: NVFP4_REQUIRE_GPU turns a missing GPU or torch into a failure.
start=$(date +%s)
NVFP4_REQUIRE_GPU=1 python3 -m pytest -p no:cacheprovider -q -rs --durations=5 "$root/python/tests/test_gpu.py" 2>&1 | tee "$out/python-gpu-tests.log"
gpu_rc=${PIPESTATUS[0]}
[ "$gpu_rc" = 0 ] || status=1
python3 "$root/python/bench/bench.py" --out "$out" $( [ -f "$out/moe-routing.json" ] && echo --routing "$out/moe-routing.json" ) "$@" 2>&1 | tee "$out/python-bench.log" || status=1
summary=$(grep -E '[0-9]+ (passed|failed)' "$out/python-gpu-tests.log" | tail -n 1)
passed=$(echo "$summary" | grep -oE '[0-9]+ passed' | grep -oE '[0-9]+' || echo 0)
failed=$(echo "$summary" | grep -oE '[0-9]+ failed' | grep -oE '[0-9]+' || echo 0)
skipped=$(echo "$summary" | grep -oE '[0-9]+ skipped' | grep -oE '[0-9]+' || echo 0)
[ "$passed" -gt 0 ] && [ "$skipped" = 0 ] || status=1
echo
echo "CPU SUITE: $(grep -E '[0-9]+ (passed|failed)' "$out/python-cpu-tests.log" | tail -n 1)"
echo "GPU SUITE: ${passed:-0} passed, ${failed:-0} failed, ${skipped:-0} skipped (pytest exit $gpu_rc, $(( $(date +%s) - start )) s)"
grep -E '^checks:' "$out/python-bench.log" | sed 's/^/BENCH /'
echo "gpu-check: $([ $status = 0 ] && echo OK || echo FAILED) (logs in $out)"
exit $status
