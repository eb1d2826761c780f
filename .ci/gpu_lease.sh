#!/usr/bin/env bash
# One call of a lent GPU, prepared here (a lease has room for one full call): the kernels of this tree
# against a baseline build, interleaved (benchmarks/codec_gpu_ab.py), then the GPU proof kit
# (.ci/gpu_check.sh) with what is left of the call's time. If this tree's build does not run bit-exact in
# the A/B, the kit checks the baseline instead and says so.
#
#   bash .ci/gpu_wheel.sh && mv .gpu_wheels .gpu_base     # here, at the baseline commit
#   bash .ci/gpu_wheel.sh                                 # here, at the commit under test
#   bash .ci/gpu_lease.sh OUT                             # there: run(command="bash .ci/gpu_lease.sh $OUT",
#                                                         #   carry=[".gpu_wheels", ".gpu_base"], timeout_s=600)
# OUT gets codec_gpu_ab.json and kit/ (the kit's seven files): eight files, the device tool's limit.
# LEASE_S (default 590): the seconds the whole script may take; AB_LIMIT_S (default 150): the A/B's share;
# AB_ARGS: more codec_gpu_ab.py arguments (a rehearsal here: "--platform cpu --device-mb 0.25 --reps 2").
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:?usage: bash .ci/gpu_lease.sh OUT}"
py="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1
mkdir -p "$out/kit"
smi() {
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw,power.limit \
    --format=csv 2>/dev/null || echo "nvidia-smi: none"
}
smi
rm -rf /tmp/zipccl_a /tmp/zipccl_b
pipi() { "$py" -m pip install -q --no-index --no-deps --no-compile --target "$1" "$2"; }
pipi /tmp/zipccl_a .gpu_base/*.whl && pipi /tmp/zipccl_b .gpu_wheels/*.whl || exit 3
timeout "${AB_LIMIT_S:-150}" "$py" benchmarks/codec_gpu_ab.py --a /tmp/zipccl_a --b /tmp/zipccl_b --rounds 2 \
  --reps 7 --device-mb 64,256 --dtypes bfloat16 --json "$out/codec_gpu_ab.json" ${AB_ARGS:-}
ab=$?
if [ "$ab" -ne 0 ] && [ "$ab" -ne 124 ]; then
  echo "gpu_lease: the A/B exited $ab (this tree's build failed or is not bit-exact): the kit checks the baseline"
  rm -rf .gpu_wheels && cp -r .gpu_base .gpu_wheels
fi
budget=$(( ${LEASE_S:-590} - SECONDS ))
echo "gpu_lease: A/B exit $ab after ${SECONDS} s; the kit's budget ${budget} s"
ZIPCCL_KIT_KEEP_GOING=1 ZIPCCL_KIT_BUDGET_S="$budget" bash .ci/gpu_check.sh "$out/kit"
kit=$?
smi
echo "gpu_lease: A/B exit $ab, kit exit $kit, ${SECONDS} s"
exit "$kit"
