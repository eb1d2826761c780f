#!/usr/bin/env bash
# The current JAX releases, installed the way a user has them (issue 26): a venv that already holds its JAX,
# then `pip install '.[test]'`, which must keep that JAX (no downgrade, no upgrade), then the tests.
#   Python 3.13.0 + jax 0.12.0.1 (the newest): every suite that calls JAX's API (collectives, transformations,
#   lowering, the codec's FFI calls and their errors, the examples, multi-process, the strategy and model);
#   not those of the C++ codec (test_codec.py, test_fp8.py: the bytes of every dtype and damage, through the
#   same FFI calls that every collective suite here makes), the emulator, the build or the benchmarks'
#   scripts, which no JAX version changes (the README command runs them).
#   Python 3.12.1 + jax 0.11.2 (the GPU image's pair): the collectives, drop-in, ragged, FP8 collectives,
#   transformations, tracer leaks, model and roofline, ppermute's arguments (the rehearsal runs the kit there).
# (Python 3.11 + jax 0.10.2 is the README's command, which .ci/run runs beside this, in its other lane.)
# Both interpreters come from pyenv ($(pyenv root)/versions/), present on every machine of this kind.
# Exits non-zero if any install, JAX check or test fails; prints pytest's summary line of each run.
set -uo pipefail
cd "$(dirname "$0")/.."
status=0
PYENV_ROOT="${PYENV_ROOT:-$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")}"

# $1 python, $2 venv dir, $3 jax version; then the pytest arguments.
run_pair() {
  local py="$1" venv="$2" jaxv="$3"
  shift 3
  local label="python $("$py" -c 'import platform; print(platform.python_version())') + jax $jaxv"
  echo "=== $label: pytest $*"
  rm -rf "$venv"
  "$py" -m venv "$venv" || return 1
  # The user's JAX first, then zipccl_jax beside it.
  "$venv/bin/pip" install -q "jax==$jaxv" "jaxlib==$jaxv" || return 1
  "$venv/bin/pip" install -q '.[test]' || return 1
  local now
  now="$("$venv/bin/python" -c 'import jax, jaxlib; print(jax.__version__, jaxlib.__version__)')"
  if [ "$now" != "$jaxv $jaxv" ]; then
    echo "ci: installing zipccl_jax changed jax/jaxlib $jaxv to $now"
    return 1
  fi
  # the installed package, not the source tree (the root would be first on sys.path)
  (cd / && "$OLDPWD/$venv/bin/python" -m zipccl_jax.info >/dev/null) || return 1
  # From the repository root, as the README's command: the installed package is what runs (pytest puts
  # tests/, not the root, on sys.path).
  # --durations: the slowest tests in CI's log, as in lane A (where this lane's time goes)
  "$venv/bin/pytest" -q -p no:cacheprovider --durations=20 "$@"
  local rc=$?
  echo "=== $label: pytest exit $rc"
  rm -rf "$venv"  # ~1.5 GB each: CI's clone must not fill the disk (stop 48's run ran out of space)
  return "$rc"
}

# The suites that call JAX's API. (The whole suite here took 28 of CI's 90 minutes on a slow day.)
JAX_SUITES=(
  tests/test_collectives.py tests/test_adversarial_collectives.py tests/test_arguments.py tests/test_dropin.py
  tests/test_ragged.py tests/test_ragged_collective.py tests/test_fp8_collectives.py tests/test_groups.py
  tests/test_transform.py tests/test_transform_sites.py tests/test_tracer_leaks.py tests/test_ppermute_arguments.py
  tests/test_pieces.py tests/test_hierarchical.py tests/test_levels_one_axis.py tests/test_psum_algorithms.py
  tests/test_decode_into.py tests/test_compat.py tests/test_jax_suite.py tests/test_refactor_snapshot.py
  tests/test_info.py tests/test_multiprocess.py tests/test_examples.py tests/test_moe_nnx.py tests/test_dropless.py
  tests/test_hardening.py tests/test_auto_vs_lax.py tests/test_strategy.py tests/test_model.py
  tests/test_model_record.py
)
run_pair "$PYENV_ROOT/versions/3.13.0/bin/python" .venv-py313 0.12.0.1 "${JAX_SUITES[@]}" || status=1

run_pair "$PYENV_ROOT/versions/3.12.1/bin/python" .venv-py312 0.11.2 \
  tests/test_collectives.py tests/test_dropin.py tests/test_ragged.py tests/test_fp8_collectives.py \
  tests/test_transform.py tests/test_tracer_leaks.py tests/test_model.py tests/test_model_record.py tests/test_roofline.py \
  tests/test_ppermute_arguments.py || status=1

exit $status
