"""The lowered HLO, collectives, explain() table and stats of every collective match the golden.

tests/snapshot_api.py records them (see its docstring for the cases and what is normalised);
tests/data/refactor_snapshot.json is the baseline recorded from the code before the issue-14
refactor (jax 0.10); refactor_snapshot.jax-0.11.json and .jax-0.12.json hold the StableHLO of later jax. Re-record only for an intended change, and say which lines changed and why.
"""

import json

import jax

import snapshot_api


def test_lowering_and_explain_match_golden():
  """Against the golden of the running jax's minor release (snapshot_api.golden_path); and what does not
  depend on jax (the compiled collectives and their bytes, explain(), stats(), which cases raise) against
  jax 0.10's, the baseline every release's golden was checked against."""
  want = json.loads(snapshot_api.GOLDEN.read_text())
  got = snapshot_api.record()
  assert sorted(got) == sorted(want)
  diff = snapshot_api.compare(got, want)
  assert not diff, f"lowering/explain changed ({snapshot_api.GOLDEN.name}):\n" + diff
  base = json.loads(snapshot_api.BASELINE.read_text())
  diff = snapshot_api.compare(snapshot_api.jax_independent(got), snapshot_api.jax_independent(base))
  assert not diff, f"jax {jax.__version__} differs from jax 0.10 beyond the StableHLO text:\n" + diff


def test_every_release_golden_agrees_with_baseline_beyond_stablehlo():
  """Every release's golden, whichever jax runs: re-recording jax 0.10's for an intended change (explain's
  words, a new case) must re-record the others' too, or the newest jax's CI run is the first to notice."""
  base = snapshot_api.jax_independent(json.loads(snapshot_api.BASELINE.read_text()))
  others = sorted(snapshot_api.GOLDEN_DIR.glob("refactor_snapshot.jax-*.json"))
  assert others, "no per-release goldens found"
  for path in others:
    got = snapshot_api.jax_independent(json.loads(path.read_text()))
    assert sorted(got) == sorted(base), f"{path.name}: other cases than jax 0.10's golden"
    diff = snapshot_api.compare(got, base)
    assert not diff, f"{path.name} differs from jax 0.10's golden beyond the StableHLO text:\n" + diff
