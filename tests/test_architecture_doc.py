"""docs/ARCHITECTURE.md's module table matches the package: one row per module, each row's
"imports" column is exactly the package modules that module imports (by their dotted path inside the
package: ``strategy.profile``) (lazy imports included, as
tests/test_architecture.py counts them), and the rows run top to bottom (imports point down)."""

from __future__ import annotations

import re

from test_architecture import EXTENSION, ROOT, _graph

DOC = ROOT / "docs" / "ARCHITECTURE.md"
ROW = re.compile(r"^\| `([\w/]+)\.py` \| [^|]* \| ([^|]*) \|$", re.M)


def _table() -> list[tuple[str, str]]:
  """(dotted module name, imports column) per row, in the table's order."""
  rows = [(".".join(["zipccl_jax", *path.split("/")]).removesuffix(".__init__"), imports.strip())
          for path, imports in ROW.findall(DOC.read_text())]
  assert rows, f"no module table found in {DOC}"
  return rows


def _short(module: str) -> str:
  """A module as the imports column names it: its dotted path inside the package."""
  return module.removeprefix("zipccl_jax.")


def test_table_lists_every_module_once():
  names = [m for m, _ in _table()]
  assert len(names) == len(set(names)), f"modules listed twice: {names}"
  assert set(names) == set(_graph()) - {EXTENSION}


def test_table_imports_are_the_actual_imports():
  graph = _graph()
  wrong = []
  for module, column in _table():
    actual = {_short(d) for d in graph[module] if d != EXTENSION}
    if module == "zipccl_jax":
      continue  # "everything below": checked by the order test
    declared = set() if column.startswith("—") else {s.strip() for s in column.split(",")}
    if declared != actual:
      wrong.append(f"{module}: table {sorted(declared)}, code {sorted(actual)}")
  assert not wrong, "docs/ARCHITECTURE.md's imports column is stale:\n" + "\n".join(wrong)


def test_table_order_points_imports_down():
  order = {m: i for i, (m, _) in enumerate(_table())}
  up = [f"{m} -> {d}" for m, deps in _graph().items() if m in order
        for d in deps if d in order and order[d] <= order[m]]
  assert not up, f"rows above the modules that import them: {up}"
