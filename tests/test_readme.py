"""The README a newcomer reads: its two fresh-machine commands stay true (CI runs the test one verbatim), its
first screen holds what, why, the commands and the one-line adoption, it stays short, and its commands run."""

import os
import re
import shlex
import subprocess
import sys
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
  docs = ["README.md", "benchmarks/README.md", "examples/moe_flax/README.md", "examples/dense_fsdp/README.md",
          "examples/moe_nnx/README.md", *(str(p.relative_to(REPO)) for p in sorted((REPO / "docs").glob("*.md")))]
  for doc in docs:
    fences = [(i + 1, l.strip()) for i, l in enumerate((REPO / doc).read_text().splitlines())
              if l.lstrip().startswith("```")]
    assert len(fences) % 2 == 0, f"{doc}: an unclosed code block (fences at {fences})"
    openers = fences[0::2]
    assert all(tag != "```" for _, tag in openers), f"{doc}: an opening fence without a language: {openers}"
    assert all(tag == "```" for _, tag in fences[1::2]), f"{doc}: a closing fence with text: {fences}"


def test_readme_is_short_and_its_first_screen_says_what_why_how():
  lines = (REPO / "README.md").read_text().splitlines()
  assert len(lines) <= 300, f"README.md has {len(lines)} lines (at most 300: long narratives go to docs/)"
  first = "\n".join(lines[:40])
  assert "examples/moe_flax/train.py" in first and "pytest -q" in first  # the two commands
  assert "zipccl_jax.compress_collectives(" in first  # the one-line adoption
  assert "bit-identical" in first and "| measured" in first and "predicted" in first  # what, why: the figures
  assert re.search(r"^\| .*\|$", first, re.M), "the headline table is on the first screen"


def test_user_docs_speak_of_the_library_not_of_its_making():
  """README.md and docs/ never mention the project's sessions, issues or bars."""
  words = re.compile(r"\b(sessions?|issues?|bars?)\b|session", re.I)
  for path in [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md")), *sorted((REPO / "docs").rglob("*.rst"))]:
    for i, line in enumerate(path.read_text().splitlines(), 1):
      assert not words.search(line), f"{path.relative_to(REPO)}:{i}: {line}"


def _module_commands():
  """The README's `python -m zipccl_jax.*` commands (continuation lines joined)."""
  text = (REPO / "README.md").read_text().replace("\\\n", " ")
  return [shlex.split(m) for m in re.findall(r"^(?:.*&& )?(python -m zipccl_jax\.[a-z]+[^\n&#]*)", text, re.M)]


def test_readme_module_commands_run_as_written(tmp_path):
  """`python -m zipccl_jax.info` and `python -m zipccl_jax.model ... --json out.json --png out.png`, as written,
  from a scratch directory (the installed package) and, for info, from the repository root (the source tree)."""
  import zipccl_jax
  where = str(Path(zipccl_jax.__file__).parents[1])
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=os.pathsep.join(filter(None, [where, os.environ.get("PYTHONPATH")])))
  cmds = _module_commands()
  assert {c[2] for c in cmds} >= {"zipccl_jax.info", "zipccl_jax.model"}, cmds
  for cmd in cmds:
    for cwd in ([tmp_path, REPO] if cmd[2] == "zipccl_jax.info" else [tmp_path]):
      r = subprocess.run([sys.executable, *cmd[1:]], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
      assert r.returncode == 0, (cmd, cwd, r.stderr[-2000:])
  assert (tmp_path / "out.json").exists() and (tmp_path / "out.png").exists()
