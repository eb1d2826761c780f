#!/usr/bin/env bash
# Rehearses the GPU proof kit on this CPU machine as the lent GPU image would run it (issue 27): Python 3.12
# with the image's jax stack (jax, jaxlib, jax-cuda13-plugin 0.11.2) and the image's packages only, the wheel
# of .ci/gpu_wheel.sh carried in .gpu_wheels/, and no network (unshare -n). The kit must exit 0, skip its GPU
# stages for want of a device, and write a report that names jax 0.11.2; then tests/test_deviceless_gpu.py runs
# in that stack (XLA:GPU compiling without a GPU) and must pass.
#
#   bash .ci/gpu_rehearsal.sh [OUT]      # OUT default: build/gpu_rehearsal
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-build/gpu_rehearsal}"
venv=.gpu_venv
if [ ! -x "$venv/bin/python" ]; then
  "$(pyenv root)/versions/3.12.1/bin/python" -m venv "$venv"
  # The image's packages the kit and its tests use (KINDS.md of the device tool): nothing else.
  "$venv/bin/pip" install -q jax==0.11.2 jaxlib==0.11.2 jax-cuda13-plugin==0.11.2 jax-cuda13-pjrt==0.11.2 \
    nvidia-cuda-nvrtc nanobind scikit-build-core cmake ninja pytest numpy ml_dtypes
fi
bash .ci/gpu_wheel.sh "$venv" >/dev/null
rm -rf "$out"
rc=0
unshare -n env PYTHON="$venv/bin/python" bash .ci/gpu_check.sh "$out" || rc=$?
# The deviceless XLA:GPU checks (issue 34): the same stack, with the kit's zipccl_jax installed, compiles for
# 8 described H100s; the tests read XLA's schedule, command buffers and memory analysis (~1 min).
JAX_SKIP_CUDA_CONSTRAINTS_CHECK=1 JAX_PLATFORMS=cpu ZIPCCL_REQUIRE_DEVICELESS=1 unshare -n \
  "$venv/bin/pytest" -q -p no:cacheprovider --durations=10 tests/test_deviceless_gpu.py || rc=1
"$venv/bin/python" - "$out/gpu_report.json" "$rc" <<'PY'
import json, sys
rep, rc = json.load(open(sys.argv[1])), int(sys.argv[2])
py = rep["stages"]["pytest"]
print(f"gpu rehearsal: exit {rc}, jax {rep['versions'].get('jax')}, stages "
      + ", ".join(f"{k} {v['status']}" for k, v in rep["stages"].items()) + f"; pytest: {py.get('summary')}")
ok = rc == 0 and rep["ok"] and rep["versions"].get("jax") == "0.11.2" and rep["stages"]["install"]["status"] == "passed"
sys.exit(0 if ok else 1)
PY
