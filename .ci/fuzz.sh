#!/usr/bin/env bash
# CI step: fuzz the codec (decoder on arbitrary bytes, encode->decode round trips) under libFuzzer with ASan +
# UBSan, within about 60 s in all: toolchain check, build, regression replay, then fuzzing until the deadline.
# Installs clang from Debian if it is missing (apt-get install -y clang libclang-rt-14-dev on bookworm).
# Prints tests/fuzz/run_fuzz.sh's per-fuzzer lines and "fuzz: total N executions in S s, K crashes"; exits non-zero
# on a crash, a failing regression input, or a build failure (exit 2 if no clang could be had).
set -uo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
budget="${FUZZ_BUDGET_SECONDS:-60}"

if ! command -v clang++ >/dev/null 2>&1; then
  echo "ci/fuzz: clang++ not found, installing clang and libclang-rt-14-dev"
  (apt-get update -qq && apt-get install -y -qq clang libclang-rt-14-dev) >/dev/null 2>&1 \
    || echo "ci/fuzz: could not install clang"
fi
if ! command -v clang++ >/dev/null 2>&1; then
  echo "ci/fuzz: no clang++; fuzzing skipped"
  exit 2
fi
# Leave ~3 s for the fuzzers' final stats and the summary.
export FUZZ_DEADLINE=$(( start + budget - 3 ))
nice -n 5 bash tests/fuzz/run_fuzz.sh $(( budget - 10 ))
rc=$?
echo "ci/fuzz: done in $(( $(date +%s) - start )) s (exit $rc)"
exit $rc
