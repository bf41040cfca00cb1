#!/usr/bin/env bash
# The expert-parallel example on the GPU machine (Python 3 + torch + numpy + pytest there, no
# network, no Rust): installs the wheel built on the development machine (python/dist/, carried
# over) as python/gpu-check.sh does, runs the example's CPU tests (torch + gloo) and
# python/examples/ep_test.py under torchrun with W = 1, and W = 2 when two GPUs are visible;
# logs under OUT.
#
#   python/examples/ep-check.sh OUT [ep_test.py options...]     (from the repository root)
#
# Success: W = 1 ran (and W = 2 where two GPUs are visible), every run ends with "EP TEST PASS",
# the CPU tests pass with none skipped, and the last line is "ep-check: OK"; the exit status is
# non-zero otherwise.
set -uo pipefail
# NVLink multicast off (the 2-GPU machines require it).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:?usage: python/examples/ep-check.sh OUT [ep_test.py options]}
shift
mkdir -p "$out"
out=$(cd "$out" && pwd)
wheel=$(ls "$root"/python/dist/nvfp4_gemm-*.whl 2>/dev/null | head -n 1)
[ -n "$wheel" ] || { echo "ep-check: no wheel in python/dist (build it with maturin on the development machine)" >&2; exit 2; }
site=$(mktemp -d /tmp/nvfp4-site.XXXXXX)
python3 -m pip install --no-index --no-deps --quiet --target "$site" "$wheel" || exit 2
export PYTHONPATH="$site"
# Run from OUT so that the source tree's python/ is not on sys.path (the package is the wheel;
# torchrun puts the script's folder, python/examples/, first on sys.path).
cd "$out"
gpus=$(python3 -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
python3 -c "import nvfp4_gemm, torch; print('nvfp4_gemm from', nvfp4_gemm.__file__, '| torch', torch.__version__, '| NCCL', torch.cuda.nccl.version(), '| GPUs', [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])" 2>&1 | tee "$out/ep-env.log"
status=0
lines=()
NVFP4_REQUIRE_TORCH=1 python3 -m pytest -p no:cacheprovider -q -rs "$root/python/tests/test_ep_routing.py" 2>&1 | tee "$out/ep-cpu-tests.log"
cpu_rc=${PIPESTATUS[0]}
cpu=$(grep -E '[0-9]+ (passed|failed)' "$out/ep-cpu-tests.log" | tail -n 1)
{ [ "$cpu_rc" = 0 ] && ! grep -qE '[0-9]+ skipped' <<<"$cpu"; } || status=1
lines+=("CPU tests: ${cpu:-no summary} (pytest exit $cpu_rc)")
for w in 1 2; do
    if [ "$w" -gt "$gpus" ]; then
        lines+=("W = $w: not run ($gpus GPU(s) visible)")
        [ "$w" -gt 1 ] || status=1  # W = 1 must run
        continue
    fi
    python3 -m torch.distributed.run --standalone --nproc_per_node="$w" "$root/python/examples/ep_test.py" "$@" 2>&1 | tee "$out/ep-w$w.log"
    rc=${PIPESTATUS[0]}
    last=$(grep -E '^EP TEST' "$out/ep-w$w.log" | tail -n 1)
    { [ "$rc" = 0 ] && [[ "$last" == "EP TEST PASS"* ]]; } || status=1
    lines+=("W = $w: ${last:-no EP TEST line} (exit $rc)")
done
echo
for w in 1 2; do
    [ -f "$out/ep-w$w.log" ] && sed -n '/^timing:/,/^$/p' "$out/ep-w$w.log"
done
printf '%s\n' "${lines[@]}"
echo "ep-check: $([ $status = 0 ] && echo OK || echo FAILED) (logs in $out)"
exit $status
