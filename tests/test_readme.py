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


def test_every_code_block_is_closed_and_names_its_language():
  # A stray fence turns the prose after it into a code block (a hand-resolved merge did this to the
  # Development section): every opening fence names a language, and every block is closed.
  for doc in ("README.md", "examples/moe_flax/README.md", "examples/dense_fsdp/README.md"):
    fences = [(i + 1, l.strip()) for i, l in enumerate((REPO / doc).read_text().splitlines())
              if l.lstrip().startswith("```")]
    assert len(fences) % 2 == 0, f"{doc}: an unclosed code block (fences at {fences})"
    openers = fences[0::2]
    assert all(tag != "```" for _, tag in openers), f"{doc}: an opening fence without a language: {openers}"
    assert all(tag == "```" for _, tag in fences[1::2]), f"{doc}: a closing fence with text: {fences}"
