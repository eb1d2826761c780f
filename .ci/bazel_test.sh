#!/usr/bin/env bash
# Builds the extension and runs every test with Bazel (offline, Debian's bazel-bootstrap 4.2.3):
#   bazel build //... && bazel test TARGETS   (default //...: C++ codec tests, sanitized variants, pytest suites
#   against the Bazel-built extension; CI names //tests/cc/... //tests:ci)
# The Bazel extension is CPU-only: the CUDA kernels are built by CMake with NVRTC (pip install .); Bazel builds
# the CUDA handlers and their launch layer only for //tests/cc:ffi_contract_test, over a mock driver.
# Prints "N passed, N failed" (test targets; a build failure counts as one failure), exits non-zero on any
# failure, and shuts the Bazel server down. Arguments are the targets (default //...); .ci/run names CI's set.
set -uo pipefail
cd "$(dirname "$0")/.."

# The python the build and the tests use (third_party/local_config.bzl): the repo's venv unless told otherwise.
if [ -z "${PYTHON_BIN_PATH:-}" ]; then
  if [ -n "${VIRTUAL_ENV:-}" ] && [ -x "$VIRTUAL_ENV/bin/python" ]; then
    PYTHON_BIN_PATH="$VIRTUAL_ENV/bin/python"
  elif [ -x .venv/bin/python ]; then
    PYTHON_BIN_PATH="$PWD/.venv/bin/python"
  else
    PYTHON_BIN_PATH="$(command -v python3)"
  fi
fi
export PYTHON_BIN_PATH
echo "bazel_test: python $PYTHON_BIN_PATH"

if ! command -v bazel >/dev/null; then
  echo "bazel_test: bazel not found (apt-get install -y bazel-bootstrap)"
  echo "0 passed, 1 failed"
  exit 1
fi

log=$(mktemp)
trap 'rm -f "$log"' EXIT
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(//...)
# Every target builds (a BUILD error anywhere fails), whichever are tested.
bazel build --curses=no -- //... 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
if [ "$rc" -eq 0 ]; then
  echo "bazel_test: bazel test ${targets[*]}"
  bazel test --curses=no -- "${targets[@]}" 2>&1 | tee -a "$log"
  rc=${PIPESTATUS[0]}
fi

# Bazel's per-target summary lines: "//pkg:target   PASSED in 1.2s", "... FAILED in ...", "... NO STATUS", ...
passed=$(grep -cE '^//[^ ]+ +(\(cached\) )?PASSED' "$log")
failed=$(grep -cE '^//[^ ]+ +(\(cached\) )?(FAILED|TIMEOUT|FLAKY|NO STATUS|FAILED TO BUILD|INCOMPLETE|REMOTE FAILURE)' "$log")
if [ "$rc" -ne 0 ] && [ "$failed" -eq 0 ]; then
  failed=1  # the build failed before any test ran, or a non-test target failed to build
fi
bazel shutdown
echo "${passed} passed, ${failed} failed"
[ "$rc" -eq 0 ] && [ "$failed" -eq 0 ]
