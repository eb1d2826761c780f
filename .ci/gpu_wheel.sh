#!/usr/bin/env bash
# Builds the wheel the GPU kit installs (.ci/gpu_check.sh), here and not on the GPU host, whose minutes are
# counted: CPython 3.12 against jax/jaxlib 0.11.2 with jax-cuda13-plugin 0.11.2 (the lent GPU image's stack),
# so the kernels come from NVRTC 13 and the FFI headers from jaxlib 0.11.2. Portable CPU code
# (ZIPCCL_NATIVE=OFF): the GPU host's processor is not this one's.
#
#   bash .ci/gpu_wheel.sh [VENV]      # VENV default: .gpu_venv (made with pyenv's 3.12 if missing)
# Writes .gpu_wheels/zipccl_jax-*-cp312-cp312-*.whl (.gitignored; the device tool carries it: carry=[".gpu_wheels"]).
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${1:-.gpu_venv}"
JAX_STACK=(jax==0.11.2 jaxlib==0.11.2 jax-cuda13-plugin==0.11.2 jax-cuda13-pjrt==0.11.2)
if [ ! -x "$venv/bin/python" ]; then
  "$(pyenv root)/versions/3.12.1/bin/python" -m venv "$venv"
  "$venv/bin/pip" install -q "${JAX_STACK[@]}" nvidia-cuda-nvrtc nanobind scikit-build-core cmake ninja
fi
rm -rf .gpu_wheels
"$venv/bin/pip" wheel -q --no-build-isolation --no-deps -w .gpu_wheels \
  --config-settings=cmake.define.ZIPCCL_NATIVE=OFF --config-settings=build-dir=build/gpu_wheel .
ls .gpu_wheels
