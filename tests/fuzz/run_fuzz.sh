#!/usr/bin/env bash
# Builds the codec fuzzers with clang (libFuzzer + AddressSanitizer + UndefinedBehaviorSanitizer), replays the
# regression inputs, then fuzzes for a bounded time and prints the executions.
#
#   tests/fuzz/run_fuzz.sh [SECONDS]     # total fuzzing time, split between the fuzzers (default 60)
#   FUZZ_DEADLINE=<epoch seconds> tests/fuzz/run_fuzz.sh 50   # also stop fuzzing by then (CI budget; each
#                                        # fuzzer still runs >= 2 s so that CI always fuzzes a little)
#
# Needs clang and its compiler-rt (libFuzzer). On Debian bookworm:
#   apt-get install -y clang libclang-rt-14-dev
# (clang 14; `clang` alone pulls the runtime in, the second package makes it explicit.) Set CXX_FUZZ to use
# another clang++. Build products and the growing working corpus live in build/fuzz/ (FUZZ_BUILD_DIR), never in
# the tree; the seeds in tests/fuzz/corpus/ are read-only inputs.
#
# Fuzzers:
#   decode_fuzzer     DecodeFrame on arbitrary bytes (seeds: tests/fuzz/corpus/decode)
#   roundtrip_fuzzer  EncodeFrame -> DecodeFrame on fuzzer-shaped data (seeds: tests/fuzz/corpus/roundtrip)
# A crash, sanitizer report or property violation is copied to tests/fuzz/regressions/<fuzzer>/ (commit it: the
# next run replays it first, and tests/test_hardening.py replays it through the Python extension) and the
# script exits 1. Output ends with one line per fuzzer and a summary:
#   fuzz: decode_fuzzer: 123456 executions in 30 s (4115/s), corpus 321 inputs, 0 crashes
#   fuzz: total 234567 executions in 60 s, 0 crashes
set -uo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
TOTAL="${1:-60}"
BUILD="${FUZZ_BUILD_DIR:-$ROOT/build/fuzz}"
CXX="${CXX_FUZZ:-clang++}"
FUZZERS=(decode_fuzzer roundtrip_fuzzer)

if ! command -v "$CXX" >/dev/null 2>&1; then
  echo "fuzz: $CXX not found; on Debian: apt-get install -y clang libclang-rt-14-dev" >&2
  exit 2
fi
mkdir -p "$BUILD"

# ---- build (incremental: relink only when a source changed) ------------------------------------------------
CODEC="$ROOT/xla_ffi/codec"
# -O2 for the codec (executions per second), -O1 for the harnesses; line tables for the sanitizer reports;
# -march=native, as the extension is built, so that the codec's vector path for this CPU (if any) is fuzzed,
# each input also through the portable loops (the harnesses compare the two).
FLAGS=(-std=c++17 -gline-tables-only -fno-omit-frame-pointer -fsanitize=address,undefined
       -fno-sanitize-recover=all -march=native -I"$CODEC" -Wall)
newer() {  # newer TARGET SOURCES...: true if TARGET is missing or older than any source
  local t=$1; shift
  [ -e "$t" ] || return 0
  local s
  for s in "$@"; do [ "$s" -nt "$t" ] && return 0; done
  return 1
}
t0=$(date +%s)
codec_obj="$BUILD/cpu_driver.o"
if newer "$codec_obj" "$CODEC"/*.h "$CODEC"/cpu_driver.cc "$0"; then
  echo "fuzz: compiling the codec with -fsanitize=fuzzer-no-link,address,undefined"
  "$CXX" "${FLAGS[@]}" -O2 -fsanitize=fuzzer-no-link -c "$CODEC/cpu_driver.cc" -o "$codec_obj" || exit 2
fi
for f in "${FUZZERS[@]}"; do
  if newer "$BUILD/$f" "$HERE/$f.cc" "$codec_obj" "$CODEC"/*.h; then
    echo "fuzz: building $f"
    "$CXX" "${FLAGS[@]}" -O1 -fsanitize=fuzzer "$HERE/$f.cc" "$codec_obj" -o "$BUILD/$f" || exit 2
  fi
done
echo "fuzz: build took $(( $(date +%s) - t0 )) s"

export ASAN_OPTIONS="${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1:allocator_may_return_null=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"

status=0
keep_crashers() {  # keep_crashers FUZZER: move new artifacts into tests/fuzz/regressions/FUZZER/
  local f=$1 a dst
  for a in "$BUILD/artifacts/$f/"*; do
    [ -e "$a" ] || continue
    dst="$HERE/regressions/${f%_fuzzer}/$(basename "$a")"
    mkdir -p "$(dirname "$dst")"
    mv "$a" "$dst"
    echo "fuzz: $f: NEW CRASHER kept as ${dst#$ROOT/} (commit it; it is replayed from now on)"
    status=1
  done
}

# ---- replay the regression inputs ------------------------------------------------------------------------------
for f in "${FUZZERS[@]}"; do
  reg="$HERE/regressions/${f%_fuzzer}"
  mapfile -t inputs < <(find "$reg" -type f ! -name '*.md' 2>/dev/null | sort)
  if [ "${#inputs[@]}" -gt 0 ]; then
    if "$BUILD/$f" -runs=1 "${inputs[@]}" >"$BUILD/$f.replay.log" 2>&1; then
      echo "fuzz: $f: replayed ${#inputs[@]} regression input(s), all pass"
    else
      echo "fuzz: $f: a regression input FAILS again:"; tail -n 30 "$BUILD/$f.replay.log"
      status=1
    fi
  fi
done

# ---- fuzz --------------------------------------------------------------------------------------------------------
per=$(( TOTAL / ${#FUZZERS[@]} ))
[ "$per" -ge 1 ] || per=1
total_execs=0
fuzz_secs=0
crashes=0
left=${#FUZZERS[@]}
for f in "${FUZZERS[@]}"; do
  t=$per
  if [ -n "${FUZZ_DEADLINE:-}" ]; then
    remain=$(( (FUZZ_DEADLINE - $(date +%s) - 1) / left ))
    [ "$remain" -lt "$t" ] && t=$remain
    [ "$t" -ge 2 ] || t=2
  fi
  left=$(( left - 1 ))
  work="$BUILD/corpus/${f%_fuzzer}"
  seeds="$HERE/corpus/${f%_fuzzer}"
  mkdir -p "$work" "$BUILD/artifacts/$f"
  log="$BUILD/$f.log"
  # One process, one job: the machine is shared. The working corpus (first directory) grows across runs;
  # the seeds are only read.
  "$BUILD/$f" -max_total_time="$t" -timeout=10 -rss_limit_mb=2048 -max_len=16384 -print_final_stats=1 \
      -artifact_prefix="$BUILD/artifacts/$f/" "$work" "$seeds" >"$log" 2>&1
  rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
  [ -n "$execs" ] || execs=$(sed -n 's/^#\([0-9]*\).*/\1/p' "$log" | tail -n 1)
  execs=${execs:-0}
  n_corpus=$(find "$work" -type f | wc -l)
  crashed=0
  if [ "$rc" -ne 0 ]; then
    crashed=1
    echo "fuzz: $f FAILED (exit $rc); last lines of $log:"
    grep -E 'ERROR|SUMMARY|property violated|runtime error' "$log" | head -n 5
    tail -n 25 "$log"
    status=1
  fi
  keep_crashers "$f"
  crashes=$(( crashes + crashed ))
  total_execs=$(( total_execs + execs ))
  fuzz_secs=$(( fuzz_secs + t ))
  echo "fuzz: $f: $execs executions in $t s ($(( execs / t ))/s), corpus $n_corpus inputs, $crashed crashes"
done
echo "fuzz: total $total_execs executions in $fuzz_secs s, $crashes crashes"
exit $status
