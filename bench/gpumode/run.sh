#!/usr/bin/env bash
# The GPU MODE nvfp4_group_gemm harnesses on this repository's nvfp4_gemm.custom_kernel
# (README.md beside this file). On the GPU machine, from the repository root:
#
#   bench/gpumode/run.sh [--wheel WHEEL] [runner options] UPSTREAM OUT
#
# --wheel installs that nvfp4_gemm wheel (no index, no dependencies) into a scratch folder put
# first on PYTHONPATH; without it, nvfp4_gemm must already import with this python3. Every other
# argument goes to runner.py (--help lists them). Exit status: 0 when every run's harness said
# "check: pass", 1 when one did not, 2 when nothing could run.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
python=${PYTHON:-python3}
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --wheel) wheel=${2:?--wheel needs a path}; shift 2 ;;
    --wheel=*) wheel=${1#--wheel=}; shift ;;
    *) args+=("$1"); shift ;;
  esac
done
if [ -n "${wheel:-}" ]; then
  site=$(mktemp -d /tmp/gpumode-site.XXXXXX)
  "$python" -m pip install --quiet --no-index --no-deps --no-compile --target "$site" "$wheel" || { echo "run.sh: could not install $wheel" >&2; exit 2; }
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
exec "$python" "$here/runner.py" "${args[@]}"
