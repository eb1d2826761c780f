#!/usr/bin/env bash
# The GPU proof kit (issue 27): one offline command that installs zipccl_jax into this machine's Python and
# proves the GPU path: `pytest -m gpu -x -rs`, the codec kernels under compute-sanitizer (memcheck, racecheck),
# the GPU benchmark, and OUT/gpu_report.json + OUT/gpu_check.log. Exits 0 only if nothing failed.
#
#   bash .ci/gpu_check.sh OUT                    # on a GPU host (or, to rehearse, on a CPU one: GPU parts skip)
#   PYTHON=/path/to/python bash .ci/gpu_check.sh OUT
#   ZIPCCL_KIT_KEEP_GOING=1 bash .ci/gpu_check.sh OUT   # pytest without -x (every failure, not the first)
#   ZIPCCL_KIT_INSTALLED=1 bash .ci/gpu_check.sh OUT     # no install: the zipccl_jax this Python has
#   ZIPCCL_KIT_BUDGET_S=300 bash .ci/gpu_check.sh OUT    # the wall-clock budget (default 480 s)
#
# Install: a wheel from .gpu_wheels/ built for this Python (`bash .ci/gpu_wheel.sh` makes it, off the GPU
# host), else a source build with no network (`pip install --no-build-isolation --no-deps .`, which needs
# nanobind, scikit-build-core, cmake and ninja in that Python). Neither touches the installed jax.
# Stages and their time limits: .ci/gpu_check.py.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:?usage: bash .ci/gpu_check.sh OUT}"
mkdir -p "$out"
exec "${PYTHON:-python3}" -u .ci/gpu_check.py "$out"
