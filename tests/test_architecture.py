"""The layout rules of docs/ARCHITECTURE.md, checked on the source tree.

* no import cycle among zipccl_jax's modules (subpackages' included), counting imports inside
  functions (lazy ones);
* no Python module over 700 lines, no function body over 80 lines;
* no C++ file basename used twice under xla_ffi/ (an FFI handler and a codec driver must not
  share a name).
"""

from __future__ import annotations

import ast
import collections
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "zipccl_jax"
MAX_MODULE_LINES = 700
MAX_BODY_LINES = 80
EXTENSION = "zipccl_jax._zipccl"  # the compiled module: a leaf, it imports no Python module
CXX_SUFFIXES = {".c", ".cc", ".cpp", ".cu", ".h", ".hpp", ".cuh", ".inc"}


def _modules() -> dict[str, pathlib.Path]:
  """Dotted name -> file, for every .py module of the package and its subpackages (a package's
  ``__init__.py`` under the package's own name)."""
  mods = {}
  for path in sorted(PACKAGE.rglob("*.py")):
    parts = path.relative_to(ROOT).with_suffix("").parts
    mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
  return mods


def _imports(path: pathlib.Path, modules) -> set[str]:
  """The package modules `path` imports anywhere in its body (top level or inside functions)."""
  found = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import):
      names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
      # `from zipccl_jax import codec` imports the module zipccl_jax.codec (a name that is no
      # module comes from the package root); `from zipccl_jax.codec import x`, zipccl_jax.codec
      subs = [f"{node.module}.{a.name}" for a in node.names]
      names = [n if n in modules or n == EXTENSION else node.module for n in subs]
    else:
      continue
    found.update(n for n in names if n in modules or n == EXTENSION)
  return found


def _graph():
  modules = _modules()
  graph = {name: _imports(path, modules) - {name} for name, path in modules.items()}
  graph[EXTENSION] = set()
  return graph


def test_import_graph_is_acyclic_lazy_imports_included():
  graph = _graph()
  state: dict[str, int] = {}  # 1: on the stack, 2: done
  cycles = []

  def visit(node, stack):
    state[node] = 1
    for dep in sorted(graph[node]):
      if state.get(dep) == 1:
        cycles.append(stack[stack.index(dep):] + [dep])
      elif dep not in state:
        visit(dep, stack + [dep])
    state[node] = 2

  for node in sorted(graph):
    if node not in state:
      visit(node, [node])
  assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_only_the_package_root_imports_everything():
  # A submodule that imports the package root would close a cycle through __init__'s re-exports.
  graph = _graph()
  importers = sorted(n for n, deps in graph.items() if "zipccl_jax" in deps)
  assert not importers, f"modules importing the package root: {importers}"
  assert graph["zipccl_jax"], "the package root re-exports nothing?"


def test_module_length():
  long = {p.name: n for p in _modules().values()
          if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
  assert not long, f"modules over {MAX_MODULE_LINES} lines: {long}"


def _body_lines(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
  """Lines of a function's body, docstring excluded."""
  body = fn.body
  if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None),
                                                           ast.Constant) \
      and isinstance(body[0].value.value, str):
    body = body[1:]
  if not body:
    return 0
  return body[-1].end_lineno - body[0].lineno + 1


def test_function_length():
  long = []
  for path in _modules().values():
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        n = _body_lines(node)
        if n > MAX_BODY_LINES:
          long.append(f"{path.name}:{node.lineno} {node.name} ({n} lines)")
  assert not long, f"function bodies over {MAX_BODY_LINES} lines: {long}"


def test_body_length_counts_what_it_should():
  fn = ast.parse('def f():\n  """doc\n  more"""\n  a = 1\n\n  return a\n').body[0]
  assert _body_lines(fn) == 3


def test_no_cxx_basename_twice_under_xla_ffi():
  files = [p for p in (ROOT / "xla_ffi").rglob("*") if p.is_file() and p.suffix in CXX_SUFFIXES]
  assert files, "no C++ sources found under xla_ffi/"
  by_name = collections.defaultdict(list)
  for p in files:
    by_name[p.name].append(str(p.relative_to(ROOT)))
  dupes = {k: v for k, v in by_name.items() if len(v) > 1}
  assert not dupes, f"C++ basenames used twice under xla_ffi/: {dupes}"
