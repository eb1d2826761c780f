"""The lowered HLO, collectives, explain() table and stats of every collective match the golden.

tests/snapshot_api.py records them (see its docstring for the cases and what is normalised);
tests/data/refactor_snapshot.json is the baseline recorded from the code before the issue-14
refactor. Re-record only for an intended change, and say which lines changed and why.
"""

import json

import snapshot_api


def test_lowering_and_explain_match_golden():
  want = json.loads(snapshot_api.GOLDEN.read_text())
  got = snapshot_api.record()
  assert sorted(got) == sorted(want)
  diff = snapshot_api.compare(got, want)
  assert not diff, "lowering/explain changed:\n" + diff
