#!/usr/bin/env bash
# XLA:GPU's compile without a GPU in the newest JAX (tests/test_deviceless_gpu.py): Python 3.12 + jax 0.12.0.1 +
# jax-cuda12-plugin. Not in CI (~12 min on a slow day, which CI does not have): CI runs the same tests in the
# GPU image's stack (jax 0.11.2, .ci/gpu_rehearsal.sh). Run it by hand after a change to the collectives'
# lowering or schedule: bash .ci/deviceless_newest.sh
set -uo pipefail
cd "$(dirname "$0")/.."
PYENV_ROOT="${PYENV_ROOT:-$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")}"

deviceless_newest() {
  local venv=.venv-deviceless
  echo "=== python 3.12 + jax 0.12.0.1 + jax-cuda12-plugin: pytest tests/test_deviceless_gpu.py"
  rm -rf "$venv"
  "$PYENV_ROOT/versions/3.12.1/bin/python" -m venv "$venv" || return 1
  "$venv/bin/pip" install -q "jax==0.12.0.1" "jaxlib==0.12.0.1" "jax-cuda12-plugin==0.12.0.1" || return 1
  # the kernels of the plugin's CUDA major (NVRTC 12 fetched for the build), as a user's install gets them
  ZIPCCL_CUDA=12 "$venv/bin/pip" install -q '.[test]' || return 1
  JAX_SKIP_CUDA_CONSTRAINTS_CHECK=1 JAX_PLATFORMS=cpu ZIPCCL_REQUIRE_DEVICELESS=1 \
    "$venv/bin/pytest" -q -p no:cacheprovider tests/test_deviceless_gpu.py
  local rc=$?
  rm -rf "$venv"
  return "$rc"
}
deviceless_newest
