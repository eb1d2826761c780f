"""The README's two fresh-machine commands stay true: CI runs the test one verbatim."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _commands():
  text = (REPO / "README.md").read_text()
  blocks = text.split("```")
  # The first fenced block (after its language tag) holds the demo and test commands.
  lines = [l.strip() for l in blocks[1].splitlines()[1:] if l.strip() and not l.strip().startswith("#")]
  return lines


def test_readme_opens_with_demo_and_test_commands():
  lines = _commands()
  assert len(lines) >= 2, lines
  demo, tests = lines[0], lines[1]
  assert "pip install" in demo and "examples/moe_flax/train.py" in demo
  assert "pip install" in tests and "pytest" in tests


def test_ci_runs_the_readme_test_command():
  tests = _commands()[1]
  ci = (REPO / ".ci" / "run").read_text()
  assert tests in ci, f"README test command not found verbatim in .ci/run:\n{tests}"
